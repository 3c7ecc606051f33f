/* kernels.h: the op table's kernel column — what runs each op on one device.
 *
 *   KernCtx kc = {.mesh = &g->mesh, .device = 0};
 *   KernFn k = op_kernels[op->kind];          // NULL for collectives
 *   if (k && k(&kc, op, in, &out) != 0) report(kc.err);
 *
 * The kernels are named in spmd/ops.def's last column; the core expands the
 * rows without it, so only the runtime sees kernels. */
#ifndef SPMD_KERNELS_H
#define SPMD_KERNELS_H

#include "../spmd/ops.h"
#include "../spmd/tensor.h"

/* What a kernel may need besides its operands. */
typedef struct {
	char err[256];    /* set when a kernel returns -1 */
	const Mesh *mesh; /* device-dependent ops (OPF_DEVICE): the mesh ... */
	int device;       /* ... and the device running the op */
} KernCtx;

/* Shape s as [outer, n, inner] around axis `axis` (n = 1 for rank 0). */
void kern_axis_split(const Shape *s, int axis, int64_t *outer, int64_t *n, int64_t *inner);

/* one_hot of ids into out's rows of depth classes, class lo first, the
 * first `valid` of them real: 1 at id - lo, zeros elsewhere (an id outside
 * [lo, lo + valid): a row of zeros). */
void kern_one_hot_rows(const Tensor *ids, int64_t lo, int64_t valid, int64_t depth, Tensor *out);

/* "[1, 2]": the multi-index of flat position i in s, into buf. */
void kern_index_format(const Shape *s, int64_t i, char *buf, size_t n);

/* Set the message of a kernel error (the kernel then returns -1). */
void kern_fail(KernCtx *kc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Compute out from in (shapes already checked).  0, or -1 with kc->err set
 * (data-dependent failures, such as an id out of range). */
typedef int (*KernFn)(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out);

/* The kernel of every op kind, from ops.def; NULL for collectives. */
extern const KernFn op_kernels[OP_COUNT];

/* kernels (runtime/kernels.c) */
#define KERN(k) int k(KernCtx *, const Op *, const Tensor *const *, Tensor *);
KERN(kern_unary) KERN(kern_binary) KERN(kern_einsum) KERN(kern_reduce)
KERN(kern_softmax) KERN(kern_log_softmax) KERN(kern_layer_norm)
KERN(kern_transpose) KERN(kern_copy) KERN(kern_broadcast_to) KERN(kern_slice)
KERN(kern_concat) KERN(kern_pad) KERN(kern_conv2d) KERN(kern_take)
KERN(kern_one_hot) KERN(kern_cast)
KERN(kern_shard_slice) KERN(kern_shard_roll) KERN(kern_mask) KERN(kern_take_shard) KERN(kern_take_grad_shard)
KERN(kern_one_hot_shard)
KERN(kern_xent_stats_shard)
KERN(kern_xent_grad_shard)
/* gradients and losses (runtime/grad_kernels.c) */
KERN(kern_greater) KERN(kern_softmax_cross_entropy) KERN(kern_mse) KERN(kern_take_grad)
KERN(kern_softmax_cross_entropy_grad)
KERN(kern_conv2d_grad_input) KERN(kern_conv2d_grad_filter)
#undef KERN

#endif
