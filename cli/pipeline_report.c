/* pipeline_report.c: the pipeline part of `spmd cost`, as text and JSON. */
#include "pipeline_report.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* The most microbatch-stages any device holds at once. */
static int max_in_flight(const PipeSim *s)
{
	int n = 0;
	for (int d = 0; d < s->p; d++)
		n = s->in_flight[d] > n ? s->in_flight[d] : n;
	return n;
}

void pipeline_summary(const Graph *model)
{
	const Pipeline *pl = model->pipeline;
	printf("  pipeline    axis %s: %d devices x %d stage%s, %lld microbatches, %s%s", model->mesh.name[pl->axis],
	       pl->ndev_stages, pl->virtual_stages, pl->virtual_stages > 1 ? "s" : "", (long long)pl->microbatches,
	       pipe_schedule_names[pl->schedule], pl->recompute ? ", recompute" : "");
	if (pl->auto_stages) {
		printf(", stages: auto (spmd cost balances them)\n");
		return;
	}
	printf("; ops per stage:");
	for (int s = 0; s < pl->nstages; s++) {
		int n = 0;
		for (int i = 0; i < pl->nops; i++)
			n += pl->op_stage[i] == s;
		printf(" %d", n);
	}
	printf("\n");
}

static void print_stages(const Pipeline *pl, const PipeCost *pc)
{
	char a[32], b[32], c[32], e[32], f[32];
	printf("  %-6s %-10s %-10s %-12s %-10s %s\n", "stage", "forward", "backward", "sends", "send time", "kept per microbatch");
	for (int s = 0; s < pl->nstages; s++)
		printf("  %-6d %-10s %-10s %-12s %-10s %s\n", s, fmt_seconds(pc->fwd[s], a, sizeof a), fmt_seconds(pc->bwd[s], b, sizeof b),
		       fmt_size(pc->send_bytes[s], c, sizeof c), fmt_seconds(pc->send[s], e, sizeof e),
		       fmt_size(pc->act[s], f, sizeof f));
}

/* Device d's steps in order: F3 (forward of microbatch 3), B3; interleaved F3.1 (its chunk 1). */
static void print_timeline(const Pipeline *pl, const PipeSim *s, int d)
{
	printf("    steps");
	for (int k = 0; k < s->ntask[d]; k++) {
		const PipeTask *t = &s->task[d][k];
		printf(" %c%d", t->bwd ? 'B' : 'F', t->mb);
		if (pl->virtual_stages > 1)
			printf(".%d", t->stage / pl->ndev_stages);
	}
	printf("\n");
}

static void print_devices(const Graph *model, const Pipeline *pl, const PipeCost *pc)
{
	const PipeSim *s = &pc->sim;
	char a[32], b[32], c[32], e[32], f[32];
	for (int d = 0; d < s->p; d++) {
		printf("  device %s=%d: busy %s, idle %s, then %s of sync and update; %d microbatches in flight (%s), params %s\n",
		       model->mesh.name[pl->axis], d, fmt_seconds(s->busy[d], a, sizeof a), fmt_seconds(s->makespan - s->busy[d], b, sizeof b),
		       fmt_seconds(pc->tail[d], c, sizeof c), s->in_flight[d], fmt_size(s->act_peak[d], e, sizeof e),
		       fmt_size(pc->param_bytes[d], f, sizeof f));
		if (pc->tied_bytes[d] > 0)
			printf("    reads %s of tied params of other stages (a copy sent each step, its gradient sent back)\n",
			       fmt_size(pc->tied_bytes[d], f, sizeof f));
		print_timeline(pl, s, d);
	}
}

void pipeline_print(const Graph *model, const CostEstimate *e, const PipeCost *pc)
{
	const Pipeline *pl = model->pipeline;
	char a[32], b[32];
	printf("\npipeline         axis %s: %d devices x %d stage%s, %lld microbatches, %s%s%s\n", model->mesh.name[pl->axis],
	       pl->ndev_stages, pl->virtual_stages, pl->virtual_stages > 1 ? "s" : "", (long long)pl->microbatches,
	       pipe_schedule_names[pl->schedule], pl->recompute ? ", recompute" : "", pl->auto_stages ? ", stages: auto" : "");
	printf("  step           %s (microbatch steps %s, then the longest sync and update)\n", fmt_seconds(pc->step_s, a, sizeof a),
	       fmt_seconds(pc->sim.makespan, b, sizeof b));
	printf("  bubble         %.2f%% of the microbatch steps (balanced stages without sends: %.2f%%)\n",
	       100 * pc->sim.bubble_fraction, 100 * pc->formula);
	printf("  in flight      at most %d microbatch-stages on a device\n", max_in_flight(&pc->sim));
	printf("  memory         at most %s a device: its stages' params, gradients and optimizer state, the inputs, "
	       "the activations in flight\n", fmt_size((double)cost_pipeline_peak(e, pc), a, sizeof a));
	print_stages(pl, pc);
	print_devices(model, pl, pc);
	printf("  (the stage axis is priced from the program with every stage on every device; see docs/pipeline.md)\n");
}

static json_t *stages_json(const Pipeline *pl, const PipeCost *pc)
{
	json_t *arr = json_array();
	for (int s = 0; s < pl->nstages; s++) {
		json_t *o = json_object();
		json_object_set_new(o, "stage", json_integer(s));
		json_object_set_new(o, "device", json_integer(pipeline_stage_device(pl, s)));
		json_object_set_new(o, "forward_s", cli_jnum(pc->fwd[s]));
		json_object_set_new(o, "backward_s", cli_jnum(pc->bwd[s]));
		json_object_set_new(o, "send_bytes", cli_jnum(pc->send_bytes[s]));
		json_object_set_new(o, "send_s", cli_jnum(pc->send[s]));
		json_object_set_new(o, "kept_bytes_per_microbatch", cli_jnum(pc->act[s]));
		json_array_append_new(arr, o);
	}
	return arr;
}

static json_t *timeline_json(const PipeSim *s, int d)
{
	json_t *arr = json_array();
	for (int k = 0; k < s->ntask[d]; k++) {
		const PipeTask *t = &s->task[d][k];
		json_t *o = json_object();
		json_object_set_new(o, "step", json_string(t->bwd ? "backward" : "forward"));
		json_object_set_new(o, "microbatch", json_integer(t->mb));
		json_object_set_new(o, "stage", json_integer(t->stage));
		json_object_set_new(o, "start_s", cli_jnum(t->start));
		json_object_set_new(o, "end_s", cli_jnum(t->end));
		json_array_append_new(arr, o);
	}
	return arr;
}

static json_t *devices_json(const PipeCost *pc)
{
	const PipeSim *s = &pc->sim;
	json_t *arr = json_array();
	for (int d = 0; d < s->p; d++) {
		json_t *o = json_object();
		json_object_set_new(o, "coordinate", json_integer(d));
		json_object_set_new(o, "busy_s", cli_jnum(s->busy[d]));
		json_object_set_new(o, "bubble_s", cli_jnum(s->makespan - s->busy[d]));
		json_object_set_new(o, "tail_s", cli_jnum(pc->tail[d]));
		json_object_set_new(o, "microbatches_in_flight", json_integer(s->in_flight[d]));
		json_object_set_new(o, "activations_in_flight_bytes", cli_jnum(s->act_peak[d]));
		json_object_set_new(o, "params_bytes", cli_jnum(pc->param_bytes[d]));
		json_object_set_new(o, "tied_params_bytes", cli_jnum(pc->tied_bytes[d]));
		json_object_set_new(o, "timeline", timeline_json(s, d));
		json_array_append_new(arr, o);
	}
	return arr;
}

/* Every model op's stage (stages: auto shows the balancer's cut). */
static json_t *op_stages_json(const Graph *model, const Pipeline *pl)
{
	json_t *o = json_object();
	for (int i = 0; i < pl->nops && i < model->ops.n; i++)
		json_object_set_new(o, model->values.a[model->ops.a[i].out].name, json_integer(pl->op_stage[i]));
	return o;
}

json_t *pipeline_json(const Graph *model, const CostEstimate *e, const PipeCost *pc)
{
	const Pipeline *pl = model->pipeline;
	json_t *o = json_object();
	json_object_set_new(o, "axis", json_string(model->mesh.name[pl->axis]));
	json_object_set_new(o, "schedule", json_string(pipe_schedule_names[pl->schedule]));
	json_object_set_new(o, "stages", json_integer(pl->ndev_stages));
	json_object_set_new(o, "virtual_stages", json_integer(pl->virtual_stages));
	json_object_set_new(o, "microbatches", json_integer(pl->microbatches));
	json_object_set_new(o, "recompute", json_boolean(pl->recompute));
	json_object_set_new(o, "stages_auto", json_boolean(pl->auto_stages));
	json_object_set_new(o, "bubble_fraction", cli_jnum(pc->sim.bubble_fraction));
	json_object_set_new(o, "bubble_formula", cli_jnum(pc->formula));
	json_object_set_new(o, "step_time_s", cli_jnum(pc->step_s));
	json_object_set_new(o, "microbatch_steps_s", cli_jnum(pc->sim.makespan));
	json_object_set_new(o, "microbatches_in_flight", json_integer(max_in_flight(&pc->sim)));
	json_object_set_new(o, "peak_bytes", json_integer(cost_pipeline_peak(e, pc)));
	json_object_set_new(o, "per_stage", stages_json(pl, pc));
	json_object_set_new(o, "devices", devices_json(pc));
	json_object_set_new(o, "op_stages", op_stages_json(model, pl));
	return o;
}

/* One row of the sweep. */
static void sweep_row(const Pipeline *q, const PipeCost *pc, json_t *json)
{
	double act = 0;
	for (int d = 0; d < pc->sim.p; d++)
		act = pc->sim.act_peak[d] > act ? pc->sim.act_peak[d] : act;
	char name[32]; /* interleaved/V */
	snprintf(name, sizeof name, q->schedule == PIPE_INTERLEAVED ? "%s/%d" : "%s", pipe_schedule_names[q->schedule],
	         q->virtual_stages);
	if (!json) {
		char a[32], b[32];
		printf("  %-14s %-13lld %-10s %-8.2f %-10d %s\n", name, (long long)q->microbatches,
		       fmt_seconds(pc->step_s, a, sizeof a), 100 * pc->sim.bubble_fraction, max_in_flight(&pc->sim),
		       fmt_size(act, b, sizeof b));
		return;
	}
	json_t *o = json_object();
	json_object_set_new(o, "schedule", json_string(pipe_schedule_names[q->schedule]));
	json_object_set_new(o, "virtual_stages", json_integer(q->virtual_stages));
	json_object_set_new(o, "microbatches", json_integer(q->microbatches));
	json_object_set_new(o, "step_time_s", cli_jnum(pc->step_s));
	json_object_set_new(o, "bubble_fraction", cli_jnum(pc->sim.bubble_fraction));
	json_object_set_new(o, "microbatches_in_flight", json_integer(max_in_flight(&pc->sim)));
	json_object_set_new(o, "activations_in_flight_bytes", cli_jnum(act));
	json_array_append_new(json, o);
}

/* Every count the batch and q's schedule allow, a row each. */
static int sweep_counts(const Graph *model, const Graph *prog, const HwProfile *hw, const CostEstimate *e, Pipeline *q,
                        json_t *arr)
{
	int rc = 0;
	for (int64_t m = 1; m <= 64 && rc == 0; m++) {
		q->microbatches = m;
		if (!cost_pipeline_count_fits(model, q, q->schedule, m))
			continue;
		PipeCost pc;
		rc = cost_pipeline(prog, hw, e, q, &pc);
		if (rc == 0)
			sweep_row(q, &pc, arr);
		cost_pipeline_free(&pc);
	}
	return rc;
}

int pipeline_sweep(const Graph *model, const Graph *prog, const HwProfile *hw, const CostEstimate *e, json_t *json)
{
	const Pipeline *pl = model->pipeline;
	json_t *arr = json ? json_array() : NULL;
	if (!json)
		printf("\npipeline sweep\n  %-14s %-13s %-10s %-8s %-10s %s\n", "schedule", "microbatches", "step", "bubble%",
		       "in flight", "activations in flight");
	int rc = 0;
	for (int sch = 0; sch < PIPE_COUNT && rc == 0; sch++) {
		if ((sch == PIPE_INTERLEAVED) != (pl->schedule == PIPE_INTERLEAVED))
			continue; /* V is the section's: interleaved only when it says so, the others only when it does not */
		Pipeline q = *pl; /* the same stages; another schedule and count */
		q.schedule = (PipeSchedule)sch;
		rc = sweep_counts(model, prog, hw, e, &q, arr);
	}
	/* stages: auto and another schedule: interleaved too, each V its own cut (as autoshard tries them) */
	for (int i = 0; i < PIPE_NVIRTUAL && rc == 0 && pl->auto_stages && pl->schedule != PIPE_INTERLEAVED &&
	                pl->ndev_stages > 1 && pl->ndev_stages * PIPE_VIRTUAL[i] <= pl->nops;
	     i++) {
		Pipeline q;
		pipeline_interleaved(pl, PIPE_VIRTUAL[i], &q);
		rc = sweep_counts(model, prog, hw, e, &q, arr);
		pipeline_interleaved_free(&q);
	}
	if (json)
		json_object_set_new(json, "pipeline_sweep", arr);
	return rc;
}

/* ---- --compare-run ---- */

int pipeline_compare_run(const char *path, const LoadOpts *lo, const Graph *model, int runs, PipeCompare *c, Diag *d)
{
	memset(c, 0, sizeof *c);
	c->runs = runs;
	if (cost_prepare_pipelined(path, lo, model->pipeline, &c->model, &c->prog, d) != 0 ||
	    cost_run(&c->model, &c->prog, runs, &c->run, d) != 0) {
		graph_free(&c->prog), graph_init(&c->prog); /* nothing to report */
		return -1;
	}
	cost_run_pipeline(&c->prog, &c->run, &c->meas);
	return 0;
}

void pipeline_compare_free(PipeCompare *c)
{
	cost_run_free(&c->run);
	pipe_measured_free(&c->meas);
	graph_free(&c->prog), graph_free(&c->model);
}

static double rel_err(double pred, double meas) { return meas > 0 ? (pred - meas) / meas : 0; }

static json_t *compare_device_json(const PipeCost *pc, const PipeCompare *c, int dev, int coord)
{
	json_t *o = json_object();
	const PipeMeasured *m = &c->meas;
	json_object_set_new(o, "device", json_integer(dev));
	json_object_set_new(o, "coordinate", json_integer(coord));
	json_object_set_new(o, "steps", json_integer(m->steps[dev]));
	json_object_set_new(o, "predicted_steps", json_integer(pc->sim.ntask[coord]));
	json_object_set_new(o, "busy_s", cli_jnum(m->busy[dev]));
	json_object_set_new(o, "idle_s", cli_jnum(m->idle[dev]));
	json_object_set_new(o, "predicted_busy_s", cli_jnum(pc->sim.busy[coord]));
	json_object_set_new(o, "predicted_idle_s", cli_jnum(pc->sim.makespan - pc->sim.busy[coord]));
	return o;
}

static void compare_json(const PipeCost *pc, const PipeCompare *c, json_t *json)
{
	const PipeMeasured *m = &c->meas;
	const char *blas = getenv("OPENBLAS_NUM_THREADS");
	json_t *o = json_object(), *devs = json_array();
	json_object_set_new(o, "runs", json_integer(c->runs));
	json_object_set_new(o, "blas_one_thread", json_boolean(blas && strcmp(blas, "1") == 0));
	json_object_set_new(o, "pipelined", json_true());
	json_object_set_new(o, "predicted_s", cli_jnum(pc->step_s));
	json_object_set_new(o, "measured_s", cli_jnum(c->run.step));
	json_object_set_new(o, "error", cli_jnum(rel_err(pc->step_s, c->run.step)));
	json_object_set_new(o, "microbatch_steps_predicted_s", cli_jnum(pc->sim.makespan));
	json_object_set_new(o, "microbatch_steps_measured_s", cli_jnum(m->makespan));
	json_object_set_new(o, "microbatch_steps_error", cli_jnum(rel_err(pc->sim.makespan, m->makespan)));
	json_object_set_new(o, "bubble_fraction_predicted", cli_jnum(pc->sim.bubble_fraction));
	json_object_set_new(o, "bubble_fraction_measured", cli_jnum(m->bubble_fraction));
	for (int dev = 0; dev < m->ndev; dev++)
		json_array_append_new(devs, compare_device_json(pc, c, dev, graph_stage_coord(&c->prog, dev)));
	json_object_set_new(o, "devices", devs);
	json_object_set_new(json, "compare_run", o);
}

void pipeline_compare(const Graph *model, const PipeCost *pc, const PipeCompare *c, json_t *json)
{
	if (json) {
		compare_json(pc, c, json);
		return;
	}
	const PipeMeasured *m = &c->meas;
	char a[32], b[32], e[32], f[32];
	printf("\ncompare with the thread backend: the pipelined program as spmd run builds it (the fastest of %d runs)\n",
	       c->runs);
	printf("  %-18s %12s %12s %9s\n", "", "predicted", "measured", "error");
	printf("  %-18s %12s %12s %+8.1f%%\n", "step", fmt_seconds(pc->step_s, a, sizeof a),
	       fmt_seconds(c->run.step, b, sizeof b), 100 * rel_err(pc->step_s, c->run.step));
	printf("  %-18s %12s %12s %+8.1f%%\n", "microbatch steps", fmt_seconds(pc->sim.makespan, a, sizeof a),
	       fmt_seconds(m->makespan, b, sizeof b), 100 * rel_err(pc->sim.makespan, m->makespan));
	printf("  %-18s %11.2f%% %11.2f%%\n", "bubble", 100 * pc->sim.bubble_fraction, 100 * m->bubble_fraction);
	printf("  %-8s %-6s %-6s %12s %12s %12s %12s\n", "device", model->mesh.name[model->pipeline->axis], "steps",
	       "busy", "measured", "idle", "measured");
	for (int dev = 0; dev < m->ndev; dev++) {
		int s = graph_stage_coord(&c->prog, dev);
		printf("  %-8d %-6d %-6d %12s %12s %12s %12s\n", dev, s, m->steps[dev],
		       fmt_seconds(pc->sim.busy[s], a, sizeof a), fmt_seconds(m->busy[dev], b, sizeof b),
		       fmt_seconds(pc->sim.makespan - pc->sim.busy[s], e, sizeof e), fmt_seconds(m->idle[dev], f, sizeof f));
	}
}
