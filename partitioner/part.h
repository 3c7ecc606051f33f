/* part.h: the partitioner's internals shared by partition.c and lower.c. */
#ifndef SPMD_PART_H
#define SPMD_PART_H

#include <string.h>

#include "factors.h"
#include "partition.h"
#include "../sharding_spec/reshard.h"
#include "../cost_model/cost.h"

/* An operand moved for an op (partition.c): a dst value resharded to
 * spec, giving `to`, last read by src op `op`; next: that value's move
 * read before (Part.moved_head starts the chain). */
typedef struct {
	int to, next, op;
	Spec spec;
} Moved;

typedef struct {
	const Graph *src;
	Graph *dst;
	int *cur;      /* src value -> the dst value that holds it */
	uint8_t *defer; /* src value -> 1: left a pending sum for its consumers (partition.c) */
	Diag *d;
	int64_t moved; /* bytes per device handed to collectives so far */
	ReshardCache *plans; /* reshard plans: shared with other partitions, or this one's own */
	const FactorRules *rules; /* rules of src's ops made before, or NULL */
	HwProfile hw;  /* prices moves (the mesh's hardware, else tpu-v3) */
	bool terse;    /* write no reasons (Diag.terse): the program is only priced */
	/* the last split softmax_cross_entropy (lower.c): its logits and labels
	 * as it read them, and its all_reduced max and sum of exponentials,
	 * which its gradient on the same operands reads again (have: set) */
	bool xent_have;
	int xent_x, xent_labels, xent_max, xent_sum;
	/* operands resharded for the ops just partitioned (partition.c,
	 * reshard_again): per dst value, its chain of moves */
	VEC(int) moved_head; /* dst value -> its latest move, or -1 */
	VEC(Moved) moves;
	int op_at; /* the src op being partitioned */
} Part;

/* The length of a name's root: temporaries are NAME%N, named after NAME. */
static inline int root_len(const char *name)
{
	const char *pct = strchr(name + 1, '%');
	return pct ? (int)(pct - name) : (int)strlen(name);
}

/* Strings in the program's arena. */
const char *fmt(Part *P, const char *f, ...) __attribute__((format(printf, 2, 3)));
const char *pos_str(Part *P, Pos p);
const char *spec_str(Part *P, const Spec *s);
/* A new temporary of g standing for value v (named after it, its dtype
 * and layout), with dim d's local and global size set to size (-1: v's
 * own): the passes' rewrites make their pieces so. */
int value_like(Graph *g, int v, int d, int64_t size);
/* An op's reason (Op.why), or NULL when P is terse: the arguments are not evaluated then. */
#define WHY(P, ...) ((P)->terse ? NULL : fmt(P, __VA_ARGS__))

/* New dst values and ops.  emit* take the global shape of ins[0] and name the
 * result after it; `local` is the result's shard shape (emit: the spec's own). */
int new_value_local(Part *P, const char *name, DType t, const Shape *global, const Shape *local, const Spec *s,
                    ValueKind k, Pos p);
int new_value(Part *P, const char *name, DType t, const Shape *global, const Spec *s, ValueKind k, Pos p);
int emit_local(Part *P, OpKind k, const int *ins, int nin, const Attr *at, const Spec *s, const Shape *local, Pos p,
               const char *why);
int emit(Part *P, OpKind k, const int *ins, int nin, const Attr *at, const Spec *s, Pos p, const char *why);
/* Reshard dst value v to `to` with the planner's collectives; the new id or -1. */
int reshard(Part *P, int v, const Spec *to, Pos p, const char *why);
/* The op itself on prepared operands, result sharded `res` (extra: attributes
 * to use instead of the localized source ones).  The result's id or -1. */
int emit_local_op(Part *P, const Op *op, const int *in, const Spec *res, bool mean_split, const Attr *extra);

int64_t axes_prod(const Mesh *m, const Axes *a);
void factors_spec(const Graph *g, const FactorRule *r, int t, int rank, const Axes *fa, Spec *s);

/* lower.c: an op whose split needs more than its local op (split softmax and
 * layer_norm axes, conv2d halos); otherwise emit_local_op.  Result id or -1. */
/* Can conv2d dim d (1: H, 2: W) be split on axes a with halos? */
bool conv_halo_ok(const Graph *g, const Op *op, int d, const Axes *a);
int lower_op(Part *P, const Op *op, const FactorRule *r, const Axes *fa, const int *in, const Spec *res,
             bool mean_split);

#endif
