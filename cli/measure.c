/* measure.c: preparing a model's SPMD program for the cost model, and timing it on the thread backend. */
#include "measure.h"

#include <cblas.h>
#include <string.h>

#include "../partitioner/partition.h"
#include "../partitioner/pipeline.h"
#include "../partitioner/step.h"
#include "../cost_model/pipeline_cost.h"
#include "../spmd/pipeline_section.h"
#include "../runtime/data.h"
#include "../runtime/exec.h"
#include "../runtime/spmd_run.h"
#include "../runtime/threads.h"
#include "../spmd/ops.h"
#include "../spmd/load.h"
#include "../train/train.h"
#include "cli.h"

int cost_prepare(const char *path, const char *mesh, int wus, Graph *model, Graph *prog, Diag *d)
{
	return cost_prepare_step(path, mesh, wus, model, prog, NULL, d);
}

int cost_prepare_step(const char *path, const char *mesh, int wus, Graph *model, Graph *prog, CostStep *step,
                      Diag *d)
{
	LoadOpts o = {mesh, NULL};
	return cost_prepare_opts(path, &o, wus, model, prog, step, NULL, NULL, d);
}

int cost_prepare_opts(const char *path, const LoadOpts *o, int wus, Graph *model, Graph *prog, CostStep *step,
                      WusReport *passes, int64_t *floor, Diag *d)
{
	if (floor)
		*floor = -1;
	LoadKind kind = {0};
	graph_init(prog);
	if (step)
		memset(step, 0, sizeof *step);
	const char *mesh = o ? o->mesh : NULL;
	if (program_load_opts(model, path, &kind, o, d) != 0)
		return -1;
	if (kind.spmd) { /* already partitioned: estimate it as it is */
		Graph t = *model;
		*model = *prog, *prog = t;
		if (kind.device >= 0 || mesh) {
			diag_error(d, (Pos){path, 1, 1}, "expected a model or an SPMD program for every device%s, found %s",
			           mesh ? " (without --mesh)" : "", kind.device >= 0 ? "a per-device program" : "a program");
			return -1;
		}
		return 0;
	}
	if (model->train && wus >= 0)
		model->train->wus = (WusMode)wus;
	if (model->train && train_build(model, d) != 0)
		return -1;
	graph_free(prog);
	if (floor && !model->pipeline) /* of the model as built: partitioning adds to it */
		*floor = cost_step_floor(model, model->mesh.ndev);
	HwProfile hw;
	cli_pass_prices(model, &hw);
	int *map = NULL;
	int rc = pipeline_partition_replicated(model, &hw, NULL, prog, step ? &map : NULL, passes,
	                                       d); /* a pipeline: priced per stage */
	if (rc == 0 && step)
		step_describe(model, prog, map, step);
	free(map);
	return rc;
}

/* The id range of every i32 leaf of prog: that of the model's value of the
 * same name (programs keep the names of inputs and params). */
int64_t *cost_leaf_ranges(const Graph *model, const Graph *prog)
{
	int64_t *range = xcalloc((size_t)prog->values.n + 1, sizeof *range);
	for (int w = 0; w < prog->values.n; w++) {
		const Value *pv = &prog->values.a[w];
		int v = pv->producer < 0 && pv->dtype == DT_I32 ? graph_find(model, pv->name) : -1;
		range[w] = v >= 0 ? data_id_range(model, v) : 1000;
	}
	return range;
}

/* One device of a timed run: make its leaves, wait for every device, run
 * the program with every op timed, note when it began and ended, and wait
 * for every device again (so that none tears down while others are timed). */
typedef struct {
	const Graph *prog;
	const SpmdOpts *o;
	CostRun *r;
	Diag *diag; /* per device */
} TimedRun;

static int timed_device(int device, void *arg, Backend *b)
{
	TimedRun *t = arg;
	const Graph *g = t->prog;
	Tensor *vals = xcalloc((size_t)g->values.n + 1, sizeof *vals);
	Diag *d = &t->diag[device];
	int rc = 0;
	tensor_mem_reset();
	bool *used = exec_used_on(g, graph_stage_coord(g, device)); /* a pipeline's device: its stages' leaves */
	for (int v = 0; v < g->values.n && rc == 0; v++)
		if (g->values.a[v].producer < 0 && (!used || used[v]))
			rc = spmd_make_leaf(g, t->o, device, v, &vals[v], d);
	free(used);
	ExecOpts eo = {.seed = t->o->seed, .backend = b, .device = device, .profile = true,
	               .op_seconds = t->r->sec + (size_t)device * (size_t)g->ops.n,
	               .op_start = t->r->at + (size_t)device * (size_t)g->ops.n};
	if (rc == 0 && b->barrier(b, device) == 0) {
		t->r->start[device] = now_seconds();
		rc = exec_run(g, vals, NULL, &eo, d);
		t->r->end[device] = now_seconds();
		t->r->peak[device] = tensor_mem_peak();
		rc = rc == 0 ? b->barrier(b, device) : -1;
	} else
		rc = -1;
	exec_free_values(g, vals);
	free(vals);
	return rc;
}

static void run_alloc(CostRun *r, int ndev, int nops)
{
	*r = (CostRun){ndev, nops, xcalloc((size_t)ndev * (size_t)nops + 1, sizeof(double)),
	               xcalloc((size_t)ndev * (size_t)nops + 1, sizeof(double)), xcalloc((size_t)ndev, sizeof(double)),
	               xcalloc((size_t)ndev, sizeof(double)), 0, xcalloc((size_t)ndev, sizeof(int64_t))};
}

void cost_run_free(CostRun *r)
{
	free(r->sec), free(r->at), free(r->start), free(r->end), free(r->peak);
	*r = (CostRun){0};
}

/* Report the first device that failed (not one that another's failure aborted). */
static void report_failure(const Graph *prog, const Diag *diag, Diag *d)
{
	for (int dev = 0; dev < prog->mesh.ndev; dev++)
		if (diag[dev].nerr && !strstr(diag[dev].last, "aborted")) {
			diag_error(d, diag[dev].last_pos, "device %d: %s", dev, diag[dev].last);
			return;
		}
	diag_error(d, (Pos){prog->file, 0, 0}, "the timed run on threads failed");
}

/* One run into r; 0, or -1 after reporting. */
static int run_once(const Graph *prog, const SpmdOpts *o, CostRun *r, Diag *d)
{
	int ndev = prog->mesh.ndev;
	TimedRun t = {prog, o, r, xcalloc((size_t)ndev, sizeof(Diag))};
	for (int dev = 0; dev < ndev; dev++)
		diag_init(&t.diag[dev]), t.diag[dev].quiet = true;
	int rc = threads_run(&prog->mesh, timed_device, &t);
	if (rc != 0)
		report_failure(prog, t.diag, d);
	double first = r->start[0], last = r->end[0];
	for (int dev = 1; dev < ndev; dev++) {
		first = r->start[dev] < first ? r->start[dev] : first;
		last = r->end[dev] > last ? r->end[dev] : last;
	}
	r->step = last - first;
	free(t.diag);
	return rc;
}

int cost_run(const Graph *model, const Graph *prog, int runs, CostRun *r, Diag *d)
{
	int ndev = prog->mesh.ndev, nops = prog->ops.n, rc = 0;
	int64_t *range = cost_leaf_ranges(model->values.n ? model : prog, prog);
	SpmdOpts o = {.seed = 0, .id_range = range};
	CostRun cur;
	run_alloc(r, ndev, nops), run_alloc(&cur, ndev, nops);
	int blas = openblas_get_num_threads();
	openblas_set_num_threads(1); /* a device is one thread, as calibrate measures it */
	for (int i = 0; i < runs && rc == 0; i++) {
		rc = run_once(prog, &o, &cur, d);
		if (rc == 0 && (i == 0 || cur.step < r->step)) {
			CostRun t = *r;
			*r = cur, cur = t;
		}
	}
	openblas_set_num_threads(blas);
	cost_run_free(&cur);
	free(range);
	return rc;
}

void cost_run_attribute(const Graph *prog, const CostRun *r, double *sec)
{
	int dev = 0, n = r->nops, first = -1;
	for (int k = 1; k < r->ndev; k++)
		dev = r->end[k] > r->end[dev] ? k : dev;
	double begin = r->start[0], timed = 0;
	for (int k = 1; k < r->ndev; k++)
		begin = r->start[k] < begin ? r->start[k] : begin;
	for (int i = 0; i < n; i++) {
		sec[i] = r->sec[(size_t)dev * (size_t)n + (size_t)i], timed += sec[i];
		if (first < 0 && (op_table[prog->ops.a[i].kind].flags & OPF_COLLECTIVE))
			first = i;
	}
	double between = r->end[dev] - r->start[dev] - timed;
	for (int i = 0; i < n; i++)
		sec[i] += between / n;
	if (n > 0)
		sec[first >= 0 ? first : 0] += r->start[dev] - begin;
}

int cost_measure(const Graph *model, const Graph *prog, int runs, double *sec, Diag *d)
{
	CostRun r;
	int rc = cost_run(model, prog, runs, &r, d);
	if (rc == 0)
		cost_run_attribute(prog, &r, sec);
	cost_run_free(&r);
	return rc;
}

int cost_prepare_pipelined(const char *path, const LoadOpts *o, const Pipeline *cut, Graph *model, Graph *prog,
                           Diag *d)
{
	LoadKind kind = {0};
	graph_init(prog);
	if (program_load_opts(model, path, &kind, o, d) != 0)
		return -1;
	if (!model->pipeline || kind.spmd) {
		diag_error(d, (Pos){path, 1, 1}, "expected a model with a pipeline: section, found %s",
		           kind.spmd ? "a program" : "none");
		return -1;
	}
	if (model->train && train_build(model, d) != 0)
		return -1;
	pipeline_take_cut(model->pipeline, cut);
	HwProfile hw;
	cli_pass_prices(model, &hw);
	return pipeline_partition(model, &hw, prog, NULL, NULL, d);
}

/* The ops of a microbatch step: (stage, pipe_step) as one index. */
static int step_index(const Op *op, int nstep) { return op->stage * nstep + op->pipe_step; }

/* Device dev's microbatch steps into pm: the span of its step ops, and the time in sends within it. */
static void device_steps(const Graph *prog, const CostRun *r, int dev, bool *seen, int nstep, PipeMeasured *pm)
{
	int c = graph_stage_coord(prog, dev);
	const double *at = r->at + (size_t)dev * (size_t)r->nops, *sec = r->sec + (size_t)dev * (size_t)r->nops;
	double first = 0, last = 0, wait = 0;
	bool any = false;
	for (int i = 0; i < prog->ops.n; i++) {
		const Op *op = &prog->ops.a[i];
		if (op->pipe_step <= 0 || op->stage < 0 || !op_runs_on(prog, op, c))
			continue;
		first = !any || at[i] < first ? at[i] : first;
		last = !any || at[i] + sec[i] > last ? at[i] + sec[i] : last;
		any = true;
		if (!seen[step_index(op, nstep)])
			seen[step_index(op, nstep)] = true, pm->steps[dev]++;
	}
	for (int i = 0; i < prog->ops.n; i++) { /* a send waits for its other end: idle */
		const Op *op = &prog->ops.a[i];
		if (op->stage_to >= 0 && op_runs_on(prog, op, c) && at[i] >= first && at[i] < last)
			wait += sec[i];
	}
	pm->first[dev] = first, pm->last[dev] = last, pm->idle[dev] = wait;
}

void cost_run_pipeline(const Graph *prog, const CostRun *r, PipeMeasured *pm)
{
	int n = r->ndev, nstage = 1, nstep = 1;
	for (int i = 0; i < prog->ops.n; i++) {
		nstage = prog->ops.a[i].stage >= nstage ? prog->ops.a[i].stage + 1 : nstage;
		nstep = prog->ops.a[i].pipe_step >= nstep ? prog->ops.a[i].pipe_step + 1 : nstep;
	}
	*pm = (PipeMeasured){n, 0, 0, xcalloc((size_t)n, sizeof(double)), xcalloc((size_t)n, sizeof(double)),
	                     xcalloc((size_t)n, sizeof(double)), xcalloc((size_t)n, sizeof(double)),
	                     xcalloc((size_t)n, sizeof(int))};
	bool *seen = xcalloc((size_t)nstage * (size_t)nstep + 1, sizeof *seen);
	double begin = 0, end = 0, idle = 0;
	for (int dev = 0; dev < n; dev++) {
		memset(seen, 0, (size_t)nstage * (size_t)nstep * sizeof *seen);
		device_steps(prog, r, dev, seen, nstep, pm);
		begin = dev == 0 || pm->first[dev] < begin ? pm->first[dev] : begin;
		end = dev == 0 || pm->last[dev] > end ? pm->last[dev] : end;
	}
	free(seen);
	pm->makespan = end - begin;
	for (int dev = 0; dev < n; dev++) { /* before its first step and after its last: idle too */
		pm->idle[dev] += pm->first[dev] - begin + end - pm->last[dev];
		pm->busy[dev] = pm->makespan - pm->idle[dev];
		idle += pm->idle[dev];
	}
	pm->bubble_fraction = pm->makespan > 0 ? idle / (n * pm->makespan) : 0;
}

void pipe_measured_free(PipeMeasured *pm)
{
	free(pm->busy), free(pm->idle), free(pm->first), free(pm->last), free(pm->steps);
	*pm = (PipeMeasured){0};
}

int cost_pipeline_cut(Graph *g, const char *path, const LoadOpts *o, Diag *d)
{
	Pipeline *pl = g->pipeline;
	if (!pl || !pl->auto_stages || pl->nops == 0 || pl->op_stage[0] >= 0)
		return 0;
	Graph model, prog;
	CostStep step;
	HwProfile hw;
	const char *note;
	CostEstimate e = {0};
	PipeCost pc = {0};
	int rc = cost_prepare_opts(path, o, -1, &model, &prog, &step, NULL, NULL, d) == 0 && model.pipeline &&
	                 cli_hardware(&model, NULL, &hw, &note, d) == 0 ? 0 : -1;
	if (rc == 0) {
		cost_estimate_step(&prog, &hw, &step, &e);
		rc = cost_pipeline(&prog, &hw, &e, model.pipeline, &pc);
		if (rc != 0)
			diag_error(d, pl->pos, "expected a schedule that can finish, found one that waits on itself");
	}
	if (rc == 0)
		pipeline_take_cut(pl, model.pipeline);
	cost_pipeline_free(&pc);
	cost_estimate_free(&e);
	cost_step_free(&step);
	graph_free(&prog), graph_free(&model);
	return rc;
}
