/* train_run.h: several steps of a training graph or program, with values carried from step to step.
 *
 *   StepOpts s = {.steps = 3, .ncarry = t->ncarry, .from = t->carry_from, .to = t->carry_to,
 *                 .on_step = print_loss, .arg = NULL};
 *   train_run_ref(g, vals, seed, &s, outputs, &d);          // the reference executor
 *   train_run_threads(prog, &spmd_opts, &s, outputs, &d);   // a partitioned program on threads
 *
 * After every step, each carried value's tensor becomes its leaf's for the
 * next step (on every device, shard for shard: a carried value must be laid
 * out as its leaf), and on_step sees the step's outputs (gathered into their
 * global shapes on threads). */
#ifndef SPMD_TRAIN_RUN_H
#define SPMD_TRAIN_RUN_H

#include "spmd_run.h"

/* Called after step `step` (0-based) with the step's outputs, one per graph output. */
typedef void (*StepFn)(void *arg, int step, const Tensor *outputs);

typedef struct {
	int steps;             /* >= 1 */
	int ncarry;            /* after a step, value from[i] becomes leaf to[i] */
	const int *from, *to;  /* value ids of the graph or program run */
	StepFn on_step;        /* may be NULL */
	void *arg;
	DeviceMemory *mem;     /* threads: per device, its persistent and peak bytes (may be NULL) */
	double jitter;         /* reference: ExecOpts.jitter of every step (0: none), seeded per step */
	uint64_t jitter_seed;
} StepOpts;

/* Run g on the reference executor s->steps times.  vals (g->values.n
 * entries) holds given leaves; the others are made from seed.  outputs[i]
 * gets output i of the last step.  vals keeps the leaves as they are after
 * the last carry.  0, or -1 after reporting. */
int train_run_ref(const Graph *g, Tensor *vals, uint64_t seed, const StepOpts *s, Tensor *outputs, Diag *d);

/* Run program prog (partition's output) with one thread per device
 * s->steps times, each device making its shards of the leaves once.
 * outputs[i] gets output i of the last step, gathered.  0,
 * SPMD_RUN_DISAGREE (replicas of an output differ), or -1 after reporting. */
int train_run_threads(const Graph *prog, const SpmdOpts *o, const StepOpts *s, Tensor *outputs, Diag *d);

#endif
