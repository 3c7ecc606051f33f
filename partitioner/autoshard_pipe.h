/* autoshard_pipe.h: autoshard on a model with a pipeline: section — the
 * stage axis and the microbatch count searched with the shardings, plans
 * ranked by the pipeline's scheduled step (docs/autoshard.md, "Pipelined
 * models").  autoshard.c's helper. */
#ifndef SPMD_AUTOSHARD_PIPE_H
#define SPMD_AUTOSHARD_PIPE_H

#include "../cost_model/pipeline_cost.h"

enum { AUTOPIPE_MAX_COUNTS = 64 };

/* The best plan priced on one stage count. */
typedef struct {
	int p;
	int64_t m;
	double t, peak;
	bool fits;
} AutoPipeCount;

typedef struct {
	int axis;          /* the stage axis, -1: the model has no pipeline */
	int user_p;        /* the stage count the model's stage: keys were written for */
	bool user_auto;    /* the model says stages: auto */
	int limit;         /* the most stages (p x virtual stages) the model's layers allow */
	int ncounts;
	AutoPipeCount count[AUTOPIPE_MAX_COUNTS]; /* per stage count tried: its best estimate */
} AutoPipe;

/* What autoshard reports of a pipelined model's answer. */
typedef struct {
	int stages;             /* 0: the model has no pipeline */
	int64_t microbatches;
	PipeSchedule schedule;  /* the schedule and recompute written (chosen where the section leaves them open) */
	int virtual_stages;     /* per device: 1 but for interleaved */
	bool recompute;
	bool stages_auto;       /* written with stages: auto (the stage count is not the model's) */
	double peak;            /* the plan's peak with the activations in flight (also AutoResult.peak) */
	int64_t runner_m;       /* the next best microbatch count on the same plan, 0: none */
	double runner_m_s, runner_m_peak;
	bool runner_s;          /* the best other (schedule, recompute) the search chose from, on this plan */
	PipeSchedule runner_s_schedule;
	int runner_s_virtual;
	bool runner_s_recompute;
	int64_t runner_s_m;
	double runner_s_s, runner_s_peak;
	int runner_p;           /* the stage count of the best estimate on another one, 0: none */
	int64_t runner_p_m;
	double runner_p_s, runner_p_peak;
	bool runner_p_fits;
} AutoPipeResult;

/* base: the model as loaded; layers: its repeated layers (0: none). */
void autopipe_init(AutoPipe *ap, const Graph *base, long layers);
/* Mesh m may be tried: its stage axis holds at most as many stages as the layers allow. */
bool autopipe_mesh_ok(const AutoPipe *ap, const Graph *base, const Mesh *m);
/* A plan on mesh m is written with stages: auto (and no stage: keys on ops). */
bool autopipe_stages_auto(const AutoPipe *ap, const Mesh *m);
/* The microbatch count a plan on mesh m is first written with: the
 * model's when the schedule allows it on m, else the least allowed. */
int64_t autopipe_default_m(const AutoPipe *ap, const Graph *base, const Mesh *m);
/* Rank a priced pipelined plan: the best microbatch count for it (the
 * fastest whose peak is within budget, else the least peak) into *b, and
 * the schedule and recompute where the section leaves them open
 * (interleaved: as many virtual stages as the layers fill).  model: the
 * loaded plan, prog and e its program and estimate. */
bool autopipe_price(const AutoPipe *ap, const Graph *model, const Graph *prog, const HwProfile *hw,
                    const CostEstimate *e, double budget, PipeBest *b);
/* Keep the best estimate per stage count (for the runner-up). */
void autopipe_note(AutoPipe *ap, const Mesh *m, const PipeBest *b, double budget);
/* The answer's report: on mesh m, priced b (exactly); the runner-up stage
 * count is the best estimate on another one. */
void autopipe_result(const AutoPipe *ap, const Mesh *m, const PipeBest *b, AutoPipeResult *r);

#endif
