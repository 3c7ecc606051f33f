/* exec.h: the reference executor — a graph run on one device, op by op.
 *
 *   Tensor *vals = xcalloc(g->values.n, sizeof *vals);
 *   ExecOpts o = {.seed = 1};
 *   if (exec_run(g, vals, NULL, &o, &d) == 0)
 *           use(vals[g->outputs.a[0]]);
 *   exec_free_values(g, vals);
 *   free(vals);
 */
#ifndef SPMD_EXEC_H
#define SPMD_EXEC_H

#include "kernels.h"

struct Backend;

/* Bytes held by a run, when ExecOpts.stats is set. */
typedef struct {
	int64_t leaves; /* inputs, params, state and constants */
	int64_t peak;   /* the most held at once, leaves included */
	int peak_op;    /* the op at which the peak occurs (-1: before any) */
} ExecStats;

typedef struct {
	uint64_t seed;      /* for data_fill */
	bool profile;       /* time each op into op_seconds */
	double *op_seconds; /* g->ops.n entries, when profile */
	double *op_start;   /* when profile and not NULL: g->ops.n entries, each op's start (now_seconds) */
	struct Backend *backend; /* partitioned programs: runs collectives (NULL: none) */
	int device;         /* this device's id, for collectives and device-dependent ops */
	ExecStats *stats;   /* memory accounting, or NULL */
	/* When > 0: every f32, bf16 or f16 op result is multiplied elementwise by
	 * 1 + delta, delta uniform in +-jitter units of roundoff of its dtype
	 * (2^-24 f32, 2^-8 bf16, 2^-11 f16) from jitter_seed, then rounded — a run
	 * that differs from the plain one only by rounding noise of that size
	 * (--check's noise runs, cli/check.h); a log_softmax's result also gets
	 * +-jitter units of roundoff added (the log of a sum whose largest term
	 * is 1 errs by that much whatever the result's size), and the result of a
	 * sum of products (einsum, reduce_sum, reduce_mean, conv2d and its
	 * gradients, take_grad) +-jitter units of roundoff of the sum of its
	 * terms' magnitudes (a reordered sum rounds its partial sums). */
	double jitter;
	/* > 0: also add to each element +-jitter_abs units of roundoff of the
	 * result's largest finite magnitude, or a reduce_sum's or reduce_mean's
	 * operand's when larger (the rounding of an op that cancels:
	 * fuzz_diff's noise runs) */
	double jitter_abs;
	uint64_t jitter_seed;
} ExecOpts;

/* Run g on one device.  vals has g->values.n entries; entries of inputs,
 * params and state whose data is NULL are made with data_fill (the whole
 * tensor), constants are made from cval (rank-0 or the value's shape);
 * every op result is computed in op order and rounded to its dtype (bf16,
 * f16), and intermediates are freed after their last use unless keep[v]
 * (keep may be NULL: keep the graph's outputs only).  o may be NULL (seed 0).
 * A device of a pipelined program (Graph.stage_axis, with a backend) runs
 * only the ops of its stages and makes only the leaves they read.
 * Returns 0, or -1 after reporting a kernel error at the op's position
 * (collectives are such an error: they need a multi-device backend). */
int exec_run(const Graph *g, Tensor *vals, const bool *keep, const ExecOpts *o, Diag *d);
/* Run op's kernel (op_table) on in into out, allocated with the result's
 * shape and dtype, then round bf16/f16 results.  0, or -1 with kc->err set.
 * (In runtime/kernels.c; backends call it for every local op.) */
int kern_call(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out);
/* Pipelined programs: per value, whether an op the device at stage
 * coordinate c runs reads it (a new array, to free); NULL when c < 0
 * (every device runs every op). */
bool *exec_used_on(const Graph *g, int c);
/* Free every tensor in vals (the array itself is the caller's). */
void exec_free_values(const Graph *g, Tensor *vals);

#endif
