/* ops.h: the op table's row type and the functions its rows name.
 * The rows' kernel column is expanded only by the runtime (runtime/kernels.h). */
#ifndef SPMD_OPS_H
#define SPMD_OPS_H

#include "ir.h"
#include "../sharding_spec/reshard.h"

enum {
	OPF_UNARY = 1 << 0,      /* elementwise, one operand */
	OPF_BINARY = 1 << 1,     /* elementwise, two operands, numpy broadcasting */
	OPF_REDUCE = 1 << 2,     /* reduces `axes` */
	OPF_MOVE = 1 << 3,       /* moves or copies elements; any dtype */
	OPF_COLLECTIVE = 1 << 4, /* communicates between devices */
	OPF_DEVICE = 1 << 5,     /* depends on the device's mesh coordinates */
};

struct YNode;   /* a YAML node of the loader (base/yaml.h) */
struct LoadCtx; /* the loader's state (spmd/load.c) */

/* Parse the op's attributes from its YAML mapping into op->attr; unknown keys
 * are the loader's business.  0, or -1 after reporting an error. */
typedef int (*AttrFn)(struct LoadCtx *lc, const struct YNode *node, Op *op);
/* Check the operands and attributes and give the result's shape and dtype.
 * 0, or -1 after reporting an error at op->pos. */
typedef int (*ShapeFn)(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d);

typedef struct {
	const char *name;
	int nmin, nmax; /* nmax -1: any number */
	unsigned flags;
	AttrFn attr;
	ShapeFn shape;
} OpInfo;

extern const OpInfo op_table[OP_COUNT];
/* The reshard step kind of a collective op; RS_SLICE for any other op. */
ReshardKind op_reshard_kind(int op_kind);
int op_find(const char *name); /* OpKind or -1 */
/* shard_roll on an operand of shape x: its dim, non-negative, and the
 * element shift on device, in [0, S): shift * c * (S / n) mod S, S the dim's
 * size (divisible by n, the size of the op's axes), c the device's index
 * over the axes (mesh_group_index).  The kernel and the per-device fact
 * `roll` alike. */
int op_roll_dim(const Attr *a, const Shape *x);
int64_t op_roll_elems(const Mesh *m, const Attr *a, const Shape *x, int device);

#define OP(id, name, nmin, nmax, flags, attr, shape, kern) \
	int attr(struct LoadCtx *, const struct YNode *, Op *); \
	int shape(const Graph *, const Op *, Shape *, DType *, Diag *);
#include "ops.def"
#undef OP

#endif
