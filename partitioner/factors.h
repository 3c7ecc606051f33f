/* factors.h: an op instance described by factors, the basis of propagation and partitioning.
 *
 * Every dimension of every operand and of the result is made of zero or more
 * factors (major to minor); a factor shared by several tensors carries the
 * same mesh axes in all of them.  This is Shardy's "sharding rule" (see
 * docs/algorithms.md §1): einsum letters, elementwise dims, reshape's
 * common refinement of two shapes. */
#ifndef SPMD_FACTORS_H
#define SPMD_FACTORS_H

#include "../spmd/ir.h"

enum { MAX_FACTORS = 24, FACTOR_TENSORS = 3, FACTOR_PER_DIM = MAX_RANK }; /* a dim holds at most one factor per dim of the other side of a reshape */

typedef enum {
	FK_PASS,      /* in operands and result: split freely */
	FK_REDUCE,    /* in operands only: a split makes the result partial */
	FK_REPLICATE, /* may not be split (concat axis, sliced dims, ...) */
	FK_WINDOW,    /* a windowed dim (conv2d spatial): split with halos */
	FK_GATHER,    /* rows of take's table: a split gives masked partial sums */
	FK_STAT,      /* the axis of softmax and layer_norm: split, with all_reduced statistics */
} FactorKind;

typedef struct {
	int nf;
	int64_t size[MAX_FACTORS];
	uint8_t kind[MAX_FACTORS];
	uint8_t reduce[MAX_FACTORS]; /* FK_REDUCE, FK_GATHER: REDUCE_SUM or REDUCE_MAX */
	char name[MAX_FACTORS];      /* einsum letter, or 0 */
	/* Tensors: operands 0 .. FACTOR_TENSORS-2 and the result at index `res`.
	 * Operands past FACTOR_TENSORS-2 (concat) use operand 0's mapping. */
	int res;
	uint8_t nfd[FACTOR_TENSORS][MAX_RANK];
	uint8_t fd[FACTOR_TENSORS][MAX_RANK][FACTOR_PER_DIM];
} FactorRule;

/* Mesh axes, major to minor: the split of one factor. */
typedef struct {
	uint8_t n;
	uint8_t ax[MESH_MAX_AXES];
} Axes;

/* Project the axes that split dim d of tensor t (sharded s) onto the dim's
 * factors, major to minor: fa[f] for each factor f of the dim.  Axes move on
 * to the next factor only once the previous one is split whole; only a dim's
 * first factor, when it is also its last, may take axes that do not divide
 * it (padding). */
/* May factor i of dim d of tensor t take n shards (the factors before it
 * split whole)?  When n divides it; else only the dim's first factor, and
 * only when the dim's blocks pad like the factor's (the dim's only factor,
 * or the factors after it whole in blocks: [10, 6] -> [5, 2, 6] over 3). */
bool factor_split_ok(const FactorRule *r, int t, int d, int i, int64_t n);
void factor_project_dim(const Mesh *m, const FactorRule *r, int t, int d, const Spec *s, Axes *fa);
/* Where the projection stops at an axis that does not divide the factor
 * it reaches, but a part of it would (a reshape splitting [32] over 8 into
 * [4, 8]: 8 does not divide 4, its major 4 does): that axis, and how many
 * of its coordinates the factor could take (mesh_cut); at == 0 when none. */
typedef struct {
	int axis, at;
} FactorCut;
void factor_project_dim_cut(const Mesh *m, const FactorRule *r, int t, int d, const Spec *s, Axes *fa, FactorCut *cut);

/* Describe op's factors.  Returns 0, or -1 if the op has no factor rule
 * (collectives), in which case every dim is treated as replicated. */
int factor_rule(const Graph *g, const Op *op, FactorRule *r);
/* Tensor index of operand i in the rule (operands past the table share 0). */
static inline int factor_tensor(const FactorRule *r, int operand)
{
	return operand < r->res ? operand : 0;
}
const char *factor_kind_name(FactorKind k);

/* The factor rules of graph g's ops, made once and read, on any thread, by
 * the passes over g's forks (graph_fork): a search propagates and
 * partitions hundreds of variants of one model whose ops are g's, moved,
 * rewired to copies of their operands and joined by weight-update
 * sharding's.  By result value; g must outlive the table. */
typedef struct {
	const Graph *g;
	int n;            /* values covered: g's */
	int *op;          /* per value: the op of g making it, or -1 */
	FactorRule *rule; /* per value: that op's rule */
	int8_t *state;    /* per value: 1 a rule, -1 none (as factor_rule's -1) */
} FactorRules;
void factor_rules_make(FactorRules *t, const Graph *g);
void factor_rules_free(FactorRules *t);
/* op's factor rule: t's when op is an op of t's graph as it was there
 * (the same kind, attributes and operand shapes: all the rule reads), else
 * made into *scratch (factor_rule).  NULL when the op has none (factor_rule's
 * -1).  t may be NULL.  A pointer, not a copy: the table is large and
 * copying a rule out of it costs more than making one. */
const FactorRule *factor_rule_memo(const FactorRules *t, const Graph *g, const Op *op, FactorRule *scratch);

#endif
