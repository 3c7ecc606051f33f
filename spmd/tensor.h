/* tensor.h: a dense tensor in memory (kernels run on them: runtime/kernels.h). */
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

/* Allocate a tensor's buffer (zeroed); tensor_free releases it. */
void tensor_alloc(Tensor *t, DType dt, const Shape *s);
void tensor_free(Tensor *t);
/* Allocator statistics of the calling thread's tensor buffers (every
 * element is held as 4 bytes, whatever the dtype): tensor_mem_peak is the
 * most bytes held at once since tensor_mem_reset.  A tensor freed on another
 * thread than the one that allocated it is counted where it is freed. */
void tensor_mem_reset(void);
int64_t tensor_mem_peak(void);
/* Round every element to the precision of t->dtype (bf16, f16); no-op otherwise. */
void tensor_round(Tensor *t);

#endif
