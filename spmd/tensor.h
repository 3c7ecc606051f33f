/* tensor.h: a dense tensor in memory, and the context kernels run in. */
#ifndef SPMD_TENSOR_H
#define SPMD_TENSOR_H

#include "ir.h"

/* Elements are 4 bytes: float for every floating dtype (bf16 and f16 values
 * are kept rounded to their precision, f64 is computed in f32), int32_t for
 * i32.  Row-major (C order). */
typedef struct {
	DType dtype;
	Shape shape;
	void *data;
} Tensor;

static inline float *tensor_f32(const Tensor *t) { return (float *)t->data; }
static inline int32_t *tensor_i32(const Tensor *t) { return (int32_t *)t->data; }

/* What a kernel may need besides its operands. */
typedef struct {
	char err[256];    /* set when a kernel returns -1 */
	const Mesh *mesh; /* device-dependent ops (OPF_DEVICE): the mesh ... */
	int device;       /* ... and the device running the op */
} KernCtx;

/* Set the message of a kernel error (the kernel then returns -1). */
void kern_fail(KernCtx *kc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Allocate a tensor's buffer (zeroed); tensor_free releases it. */
void tensor_alloc(Tensor *t, DType dt, const Shape *s);
void tensor_free(Tensor *t);
/* Round every element to the precision of t->dtype (bf16, f16); no-op otherwise. */
void tensor_round(Tensor *t);
float round_bf16(float x);
float round_f16(float x);

#endif
