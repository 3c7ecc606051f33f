/* autoshard.h: choose the shardings of a model's inputs and params (and, for
 * a training step, the weight-update sharding of each param) that minimise
 * the cost model's overlapped step time within a memory budget.
 *
 *   AutoOpts o = {.hw = &hw, .pass_hw = &pass, .budget = 32e9, .mesh = "data=2,model=4"};
 *   AutoResult r;
 *   if (autoshard(text, "model.yaml", &o, &r, &d) == 0 && r.found)
 *       fwrite(r.text, 1, strlen(r.text), out);   // the annotated model
 *   autoshard_free(&r);
 *
 * The method (an integer program over per-tensor choices, estimated on
 * one, two and three of the model's repeated layers (two, three and four
 * on deep models), the best few priced
 * by running the real pipeline) is in docs/autoshard.md. */
#ifndef SPMD_AUTOSHARD_H
#define SPMD_AUTOSHARD_H

#include "../spmd/ir.h"
#include "../cost_model/cost.h"
#include "autoshard_pipe.h"

typedef struct {
	const HwProfile *hw;      /* prices the plans (cost_estimate) */
	const HwProfile *pass_hw; /* prices the passes' own choices, as `spmd cost` does (cli_pass_prices) */
	const char *hardware;     /* written as the plan's mesh hardware (the profile hw is: a name, a file's
	                           * path), so that the passes price the written model as pass_hw; NULL: the model's */
	double budget;            /* bytes per device a plan may peak at */
	double time_limit;        /* seconds; 0: none */
	const char *mesh;         /* "data=2,model=4": this mesh; NULL: the model's, or ndev */
	int ndev;                 /* > 0: every mesh shape of ndev devices over the model's axes (else data, model) */
	bool keep_train;          /* keep the train: section's weight_update_sharding and all_gather */
	bool per_layer;           /* one strategy per tensor instead of per layer kind */
	bool explain;             /* price the runner-up of every layer kind */
	bool progress;            /* count the plans priced on a progress bar (base/progress.h) */
	int jobs;                 /* threads that price plans (<= 0: one per processor); the answer does not depend on it */
	bool whole;               /* price every plan on the whole model, not estimate it on proxies of a few layers
	                           * (autoshard() sets it when the proxies estimated no plan) */
} AutoOpts;

/* One layer kind (tensors of the same name up to digits, kind and shape). */
typedef struct {
	const char *name;       /* the name with its digit runs as '#' (per_layer: the tensor's own), and the shape */
	int members;
	bool fixed;             /* annotated by the user: the sharding is kept */
	char chosen[160];       /* "[data, null] wus on" */
	char runner[160];       /* the best other choice, "" if none (explain) */
	double runner_ds;       /* its step time minus the plan's */
	double runner_dbytes;   /* its peak minus the plan's */
	bool runner_fits;       /* the runner-up is within the budget */
	bool runner_exact;      /* the two differences are of exact prices (a runner-up estimated faster
	                         * than the plan is priced exactly, as the plan is); else of estimates */
} AutoGroup;

typedef struct {
	bool found;             /* a plan within the budget */
	char *text;             /* the model with the plan written in (malloc), or NULL */
	int mesh_naxes;
	const char *mesh_name[MESH_MAX_AXES];
	int mesh_size[MESH_MAX_AXES];
	bool gather_before_use; /* all_gather: before_use chosen */
	int prefetch;           /* ... with its weights gathered this many ahead (0: prefetch off, each at its first use) */
	double step_s;          /* the plan's overlapped step time (cost_estimate) */
	double serial_s;        /* its serial step time: the sum of its ops' times */
	int64_t peak;           /* its peak bytes per device */
	double bound;           /* a lower bound on the overlapped step time of every plan (the compute bound) */
	double gap;             /* (step_s - bound) / step_s */
	double compute_s;       /* the plan's compute stream's busy seconds a step */
	double gap_compute;     /* of the gap: the compute stream's busy time above the bound, / step_s */
	double gap_exposed;     /* the rest: the step beyond its compute (collectives, latency not hidden), / step_s */
	bool proven;            /* the bound meets the plan: no plan is faster */
	bool bound_holds;       /* the compute bound is at most the plan's estimate (bound: the smaller) */
	bool programs_optimal;  /* every integer program was solved to optimality */
	bool enumerated;        /* the mesh and mode searched were small enough to price every plan of, and were */
	long layers;            /* the repeated layers found, 0: none */
	int proxy_layers;       /* estimates price proxy_layers, one more and two more of them */
	bool cut;               /* the time limit cut the search */
	int64_t smallest_peak;  /* when none fits: the smallest peak of any plan tried */
	bool recompute;         /* the plan's backward recomputes the forward (train: recompute: true, chosen
	                         * because no plan without it fits) */
	bool selective;         /* the plan's backward makes again the forward's results cheap for their size (train:
	                         * recompute: selective; search_selective and try_selective in autoshard.c) */
	bool recompute_needed;  /* recompute or selective: chosen because no plan without recompute was found that fits */
	bool recompute_tried;   /* none fits: plans with recompute were searched too */
	bool smallest_recompute; /* ... and smallest_peak is of one of them */
	int64_t memory_floor;   /* bytes per device every plan of the step searched holds at once (cost_step_floor; with
	                         * recompute: of the recomputing step's plans; none found: of either step's); -1: none
	                         * (a pipelined model) */
	bool recompute_forced;  /* the step's floor without recompute is over the budget: only plans with it were searched,
	                         * and the bound is of the recomputing step */
	int64_t plain_floor;    /* with recompute searched: the floor of the plans without it */
	int ndev;               /* the devices searched (every mesh shape has as many) */
	int evaluations;        /* plans estimated */
	int exact;              /* plans priced exactly on the whole model */
	int solves;             /* integer programs solved */
	int solver_failed;      /* of them, programs GLPK stopped on with an internal error */
	bool proxies;           /* plans were estimated on proxies of a few of the model's repeated layers */
	bool proxies_failed;    /* the proxies estimated no plan: every plan was priced on the whole model */
	int ngroups;
	AutoGroup *group;       /* malloc */
	AutoPipeResult pipe;    /* a pipelined model: stages and microbatches (step_s, peak: the scheduled step's) */
	Arena arena;            /* owns the names */
} AutoResult;

/* Search; text is the model file's contents, file its name (for messages
 * and relative profile paths).  0 (r->found says whether a plan fits), or
 * -1 after reporting an error in the model or the options. */
int autoshard(const char *text, const char *file, const AutoOpts *o, AutoResult *r, Diag *d);
void autoshard_free(AutoResult *r);

#endif
