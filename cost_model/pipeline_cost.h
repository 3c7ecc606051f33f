/* pipeline_cost.h: pricing a pipeline: section — the schedule's timeline per
 * device, its bubble, the sends on the stage axis and the activations in
 * flight (docs/pipeline.md).
 *
 *   CostEstimate e;  cost_estimate_step(&prog, &hw, &step, &e);
 *   PipeCost pc;
 *   if (cost_pipeline(&prog, &hw, &e, model.pipeline, &pc) == 0)
 *           printf("bubble %.1f%%\n", 100 * pc.sim.bubble_fraction);
 *   cost_pipeline_free(&pc);
 *
 * The program priced is the model partitioned over every mesh axis but the
 * stage axis (each stage's ops exactly as a stage's devices would run them,
 * on the whole batch); a microbatch's step of stage s costs 1/m of the
 * stage's ops of that phase.  The schedule is then simulated as a list
 * schedule (pipe_simulate): each device runs its microbatch steps in the
 * schedule's order, a step starts when its device is free and its input has
 * arrived, and a send runs on the sender's link while its compute goes on. */
#ifndef SPMD_PIPELINE_COST_H
#define SPMD_PIPELINE_COST_H

#include "cost.h"
#include "../spmd/pipeline_section.h"

/* One microbatch step of a device: the forward or backward of microbatch mb
 * through (virtual) stage `stage`, at [start, end). */
typedef struct {
	int mb, stage;
	bool bwd;
	double start, end;
} PipeTask;

typedef struct {
	PipeSchedule schedule;
	int p, V;               /* devices on the stage axis, stages per device */
	int m;                  /* microbatches */
	const double *fwd, *bwd; /* per stage (p * V): seconds of one microbatch's forward, backward */
	const double *send;     /* per stage: seconds to send one microbatch's activations (and back its gradient)
	                         * to the next stage; NULL: 0 */
	const double *act;      /* per stage: bytes one microbatch keeps from its forward to its backward; NULL: 0 */
	bool forward_only;      /* no training step: every forward first (no backward to interleave them with),
	                         * backward steps take no time and send nothing */
	bool sync_sends;        /* a send holds its sender until it is over (threads, MPI: a meeting of both
	                         * ends), else the sender's link carries it while the sender goes on */
} PipeSimIn;

typedef struct {
	int p;
	int *ntask;             /* per device: its steps (2 m V) */
	PipeTask **task;        /* per device: its steps in the order it runs them */
	double makespan;        /* from the first step's start to the last step's end */
	double *busy;           /* per device: seconds of its steps */
	int *in_flight;         /* per device: the most microbatch-stages whose activations it held at once */
	double *act_peak;       /* per device: the most activation bytes it held at once */
	double bubble_fraction; /* 1 - sum(busy) / (p * makespan) */
} PipeSim;

/* The order in which device d runs its steps under in->schedule (n: 2 m V
 * of them) into order[0..n).  Interleaving needs m a multiple of p. */
void pipe_order(const PipeSimIn *in, int d, PipeTask *order);
/* Simulate the schedule.  0, or -1 when it cannot finish (a step waits for
 * one its device runs later: not for the built-in orders). */
int pipe_simulate(const PipeSimIn *in, PipeSim *out);
void pipe_sim_free(PipeSim *s);

/* The bubble of the textbook analysis on balanced stages without sends:
 * (p - 1) / (V m + p - 1). */
double pipe_bubble_formula(int p, int V, int m);

typedef struct {
	int nstages;            /* p * V */
	double *fwd, *bwd;      /* per stage: a microbatch's forward, backward (recompute: with its second forward) */
	double *send_bytes, *send; /* per stage: the activations it sends to the next per microbatch, and their time */
	double *act;            /* per stage: bytes kept per microbatch (recompute: its input only) */
	double *tail;           /* per device: gradient sync, update, gathers after its last microbatch */
	double *param_bytes;    /* per device: the params of its stages */
	double *tied_bytes;     /* per device: params of another device's stages it reads (tied weights) */
	PipeSim sim;
	double step_s;          /* the microbatch steps, then the longest tail */
	double formula;         /* pipe_bubble_formula */
} PipeCost;

/* Price pipeline pl of the model whose program prog (partitioned with the
 * stage axis replicated) e estimated.  With stages: auto the stages are
 * first balanced: contiguous runs of the model's ops with the least
 * largest forward and backward time (pl's op_stage is filled).  0, or -1
 * when the schedule cannot be simulated. */
int cost_pipeline(const Graph *prog, const HwProfile *hw, const CostEstimate *e, Pipeline *pl, PipeCost *pc);
void cost_pipeline_free(PipeCost *pc);

/* The most bytes a device on the stage axis holds through the step: the
 * share of the params, their accumulated gradients and the optimizer
 * state (e's figures for the replicated program) that its stages' params
 * make of all, the inputs, and its activations in flight.  The working
 * set of one microbatch step is not counted (docs/pipeline.md). */
int64_t cost_pipeline_peak(const CostEstimate *e, const PipeCost *pc);

/* Whether m microbatches suit pipeline pl of model under schedule sch:
 * at most PIPE_MAX_STEPS steps a stage, every input's dim 0 divisible by
 * m, a multiple of p when interleaved (the loader's rules). */
bool cost_pipeline_count_fits(const Graph *model, const Pipeline *pl, PipeSchedule sch, int64_t m);

/* The best microbatch count from 1 to 64 that the section's schedule and
 * the batch allow: the least step whose peak is within budget, else the
 * least peak; and the runner-up count by the same order.  With choose, a
 * schedule the section does not write is chosen too — gpipe, 1f1b, and
 * where the section's stages are auto and the stage axis longer than one,
 * interleaved with 2 and 4 virtual stages (as many as p x V <= most_stages
 * allows), cut again by the cost model; an interleaved section is kept,
 * its stages are the virtual ones — and of a training step, recompute
 * when the section does not write it: the best (schedule, recompute,
 * count) by that order, ties to the earlier of gpipe, 1f1b, interleaved
 * with 2 and with 4, and without recompute before with; the runner-up is
 * the best other count under the chosen schedule and recompute, and the
 * runner-up schedule the best (schedule, recompute) other than the chosen
 * one, with its own best count. */
typedef struct {
	int64_t microbatches;   /* 0: none allowed */
	double step_s, bubble_fraction, peak;
	int64_t runner;         /* the next best count, 0: none */
	double runner_step_s, runner_peak;
	PipeSchedule schedule;  /* the schedule and recompute of the best */
	bool recompute;
	int virtual_stages;     /* its virtual stages per device (1 but for interleaved) */
	bool other;             /* with choose: another (schedule, recompute) was priced: the best of them */
	PipeSchedule other_schedule;
	int other_virtual_stages;
	bool other_recompute;
	int64_t other_microbatches;
	double other_step_s, other_peak;
} PipeBest;
/* 0, or -1 when no count is allowed or a schedule cannot be simulated. */
int cost_pipeline_best(const Graph *model, const Graph *prog, const HwProfile *hw, const CostEstimate *e,
                       double budget, bool choose, int most_stages, PipeBest *best);

/* The virtual stage counts an open schedule on stages: auto is also tried
 * (and swept) with: interleaved with 2 and with 4. */
enum { PIPE_NVIRTUAL = 2 };
extern const int PIPE_VIRTUAL[PIPE_NVIRTUAL];
/* q: section pl interleaved with V virtual stages, its stages: auto cut
 * afresh (by the first cost_pipeline) on arrays of its own, which
 * pipeline_interleaved_free releases; pl's cut is left as it is. */
void pipeline_interleaved(const Pipeline *pl, int V, Pipeline *q);
void pipeline_interleaved_free(Pipeline *q);

#endif
