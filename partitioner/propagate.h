/* propagate.h: sharding propagation — a sharding for every value, and why. */
#ifndef SPMD_PROPAGATE_H
#define SPMD_PROPAGATE_H

#include "../spmd/ir.h"
#include "../cost_model/cost.h"
#include "factors.h"

/* Where one dim's sharding came from. */
typedef struct {
	int src;     /* value whose sharding it was taken from, -1: the user's annotation or none */
	int op;      /* op through which it came, -1 for an annotation */
	char factor; /* einsum letter of the factor, or 0 */
	int dim;     /* dim of src */
	uint8_t prio; /* the priority round that decided it (annotations: theirs) */
} Origin;

/* A conflict: two candidates for one factor of an op; the loser is named. */
typedef struct {
	int op;
	int winner, loser;       /* values whose shardings competed */
	int value;               /* the value that got the winner's sharding */
	uint8_t win_axes[MESH_MAX_AXES], lose_axes[MESH_MAX_AXES];
	int nwin, nlose;
	char factor;
	int64_t win_bytes, lose_bytes;
	int next;                /* the op's previous conflict, or -1 */
	int win_dim;             /* the dim of the winner holding the factor */
	uint8_t rule;            /* which rule decided: CONFLICT_* */
} Conflict;

enum { CONFLICT_USER, CONFLICT_BYTES, CONFLICT_AXES, CONFLICT_ORDER };

typedef struct {
	Origin (*origin)[MAX_RANK]; /* per value, per dim */
	uint8_t *closed;            /* per value: bit d set when the user fixed dim d */
	VEC(Conflict) conflicts;
	int *op_conflict;           /* per op: its last conflict, or -1 */
	int rounds;                 /* sweeps until the fixed point */
	int max_priority;           /* the last priority round run (0: no priorities) */
} Propagation;

/* Infer a sharding for every value of g into g->values.a[v].spec (user
 * annotations are kept as written; one of priority k > 0 leaves its value
 * unsplit until round k sets it).  0, or -1 after reporting annotations
 * that cannot hold together.  hw prices conflicts (NULL: the built-in tpu-v3 profile);
 * the pass reads no files.  Priorities are consumed: afterwards every
 * annotation holds its propagated sharding at priority 0, so a second run
 * (weight-update sharding) keeps the first's result. */
int propagate(Graph *g, const HwProfile *hw, Propagation *p, Diag *d);
/* The same, taking the rules of ops it knows from rules (factors.h; NULL:
 * none): g is a fork of the graph they were made for. */
int propagate_shared(Graph *g, const HwProfile *hw, const FactorRules *rules, Propagation *p, Diag *d);
/* Remember g's ops in the order propagation visits them (by their
 * results' names), for g and its forks (graph_fork) to start from:
 * propagation then sorts only what changed since (autoshard's proxies). */
void propagate_remember_order(Graph *g);
void propagation_free(Propagation *p);

/* Print every value with its sharding and origin (`spmd propagate`). */
void propagation_print(const Graph *g, const Propagation *p, FILE *out);
/* Print the chain from value v back to the user's annotations, and the
 * conflicts it took part in. */
void propagation_explain(const Graph *g, const Propagation *p, int v, FILE *out);

#endif
