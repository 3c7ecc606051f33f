/* ops.h: the op table's row type and the functions its rows name. */
#ifndef SPMD_OPS_H
#define SPMD_OPS_H

#include "ir.h"
#include "tensor.h"

enum {
	OPF_UNARY = 1 << 0,      /* elementwise, one operand */
	OPF_BINARY = 1 << 1,     /* elementwise, two operands, numpy broadcasting */
	OPF_REDUCE = 1 << 2,     /* reduces `axes` */
	OPF_MOVE = 1 << 3,       /* moves or copies elements; any dtype */
	OPF_COLLECTIVE = 1 << 4, /* communicates between devices */
	OPF_DEVICE = 1 << 5,     /* depends on the device's mesh coordinates */
};

struct YNode;   /* a YAML node of the loader (spmd/yaml.h) */
struct LoadCtx; /* the loader's state (spmd/load.c) */

/* Parse the op's attributes from its YAML mapping into op->attr; unknown keys
 * are the loader's business.  0, or -1 after reporting an error. */
typedef int (*AttrFn)(struct LoadCtx *lc, const struct YNode *node, Op *op);
/* Check the operands and attributes and give the result's shape and dtype.
 * 0, or -1 after reporting an error at op->pos. */
typedef int (*ShapeFn)(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d);
/* Compute out from in (shapes already checked).  0, or -1 with kc->err set
 * (data-dependent failures, such as an id out of range). */
typedef int (*KernFn)(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out);

typedef struct {
	const char *name;
	int nmin, nmax; /* nmax -1: any number */
	unsigned flags;
	AttrFn attr;
	ShapeFn shape;
	KernFn kern;    /* NULL for collectives */
} OpInfo;

extern const OpInfo op_table[OP_COUNT];
int op_find(const char *name); /* OpKind or -1 */

#define OP(id, name, nmin, nmax, flags, attr, shape, kern) \
	int attr(struct LoadCtx *, const struct YNode *, Op *); \
	int shape(const Graph *, const Op *, Shape *, DType *, Diag *);
#include "ops.def"
#undef OP
/* kernels (runtime/kernels.c) */
#define KERN(k) int k(KernCtx *, const Op *, const Tensor *const *, Tensor *);
KERN(kern_unary) KERN(kern_binary) KERN(kern_einsum) KERN(kern_reduce)
KERN(kern_softmax) KERN(kern_log_softmax) KERN(kern_layer_norm)
KERN(kern_transpose) KERN(kern_copy) KERN(kern_broadcast_to) KERN(kern_slice)
KERN(kern_concat) KERN(kern_pad) KERN(kern_conv2d) KERN(kern_take)
KERN(kern_one_hot) KERN(kern_cast)
KERN(kern_shard_slice) KERN(kern_mask) KERN(kern_take_shard)
/* gradients and losses (runtime/grad_kernels.c) */
KERN(kern_greater) KERN(kern_softmax_cross_entropy) KERN(kern_mse) KERN(kern_take_grad)
KERN(kern_conv2d_grad_input) KERN(kern_conv2d_grad_filter)
#undef KERN

#endif
