/* tensor.c: tensor buffers (64-byte aligned, zeroed) and rounding them to bf16 and f16. */
#include "tensor.h"

#include <string.h>

enum { TENSOR_ALIGN = 64 };

/* The calling thread's tensor buffers: bytes held now and the most held
 * since tensor_mem_reset (a device of the thread backend is one thread). */
static _Thread_local int64_t mem_held, mem_peak;

void tensor_mem_reset(void) { mem_peak = mem_held; }
int64_t tensor_mem_peak(void) { return mem_peak; }

/* The buffer comes from xcalloc (so the allocation hook and lazy zero pages
 * apply); the pointer malloc gave is kept just before the aligned data. */
void tensor_alloc(Tensor *t, DType dt, const Shape *s)
{
	size_t n = (size_t)shape_numel(s) * sizeof(float);
	char *raw = xcalloc(n + TENSOR_ALIGN + sizeof(void *), 1);
	uintptr_t p = ((uintptr_t)raw + sizeof(void *) + TENSOR_ALIGN - 1) & ~(uintptr_t)(TENSOR_ALIGN - 1);
	memcpy((char *)p - sizeof(void *), &raw, sizeof raw);
	t->dtype = dt;
	t->shape = *s;
	t->data = (void *)p;
	mem_held += (int64_t)n;
	mem_peak = mem_held > mem_peak ? mem_held : mem_peak;
}

void tensor_free(Tensor *t)
{
	if (!t->data)
		return;
	void *raw;
	memcpy(&raw, (char *)t->data - sizeof(void *), sizeof raw);
	free(raw);
	mem_held -= shape_numel(&t->shape) * (int64_t)sizeof(float);
	t->data = NULL;
}

void tensor_round(Tensor *t)
{
	int64_t n = shape_numel(&t->shape);
	float *x = tensor_f32(t);
	if (t->dtype == DT_BF16)
		for (int64_t i = 0; i < n; i++)
			x[i] = round_bf16(x[i]);
	else if (t->dtype == DT_F16)
		for (int64_t i = 0; i < n; i++)
			x[i] = round_f16(x[i]);
}
