/* tensor.c: tensor buffers (64-byte aligned, zeroed) and rounding to bf16 and f16. */
#include "tensor.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

enum { TENSOR_ALIGN = 64 };

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
}

void tensor_free(Tensor *t)
{
	if (!t->data)
		return;
	void *raw;
	memcpy(&raw, (char *)t->data - sizeof(void *), sizeof raw);
	free(raw);
	t->data = NULL;
}

static uint32_t float_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof u);
	return u;
}

static float bits_float(uint32_t u)
{
	float x;
	memcpy(&x, &u, sizeof x);
	return x;
}

/* Round to 8 significant bits, to nearest even; NaN stays a (quiet) NaN and
 * values past the largest bf16 become infinities. */
float round_bf16(float x)
{
	uint32_t u = float_bits(x);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return bits_float((u | 0x00400000u) & 0xffff0000u);
	u += 0x7fffu + ((u >> 16) & 1);
	return bits_float(u & 0xffff0000u);
}

/* Round to IEEE binary16, to nearest even: 11 significant bits down to
 * 2^-14, multiples of 2^-24 below (subnormals), infinity from 65520 up. */
float round_f16(float x)
{
	uint32_t u = float_bits(x);
	uint32_t mag = u & 0x7fffffffu, sign = u & 0x80000000u;
	if (mag >= 0x7f800000u)
		return x; /* inf and NaN */
	if (mag < 0x38800000u) { /* below 2^-14: round to a multiple of 2^-24 */
		float t = bits_float(mag) * 16777216.0f; /* exact: < 1024 */
		t = (t + 8388608.0f) - 8388608.0f;       /* to an integer, ties to even */
		return bits_float(sign | float_bits(t * (1.0f / 16777216.0f)));
	}
	mag += 0xfffu + ((mag >> 13) & 1);
	mag &= ~0x1fffu;
	if (mag > 0x477fe000u) /* past 65504 */
		mag = 0x7f800000u;
	return bits_float(sign | mag);
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

void kern_fail(KernCtx *kc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(kc->err, sizeof kc->err, fmt, ap);
	va_end(ap);
}
