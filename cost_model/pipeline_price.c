/* pipeline_price.c: the figures pipe_simulate needs, from a program priced
 * with the stage axis replicated, and stages: auto.
 *
 * Every op of the program is placed on a stage by its position
 * (pipeline_stage_at): backward ops carry their forward op's, update ops
 * their param's.  Forward and backward ops make a stage's microbatch steps
 * (1/m of their time each); gradient sync, update and gathers run once after
 * the last microbatch (the tail of the device of their stage; ops of no
 * stage — shared scalars — on every device).  A value made by stage s and
 * read in the forward of a later stage t is sent (1/m of it per microbatch)
 * across every boundary from s to t; its gradient comes back the same way.
 * A stage keeps, per microbatch, its forward values the backward reads —
 * with recompute only what it receives (stage 0: the inputs), and its
 * backward then runs the forward once more. */
#include "pipeline_cost.h"

#include <string.h>

static double value_bytes(const Graph *g, int v)
{
	const Value *x = &g->values.a[v];
	return (double)shape_numel(&x->shape) * dtype_size(x->dtype);
}

/* The stage of prog op i: its position's, or (forward and backward ops of
 * no stage) the last; -1 for tail ops of no stage. */
static int op_stage(const Graph *prog, const CostEstimate *e, const Pipeline *pl, int i)
{
	int s = pipeline_stage_at(pl, prog->ops.a[i].pos);
	int ph = e->op[i].phase;
	return s >= 0 ? s : ph == PHASE_FORWARD || ph == PHASE_BACKWARD ? pl->nstages - 1 : -1;
}

/* The index of the model op at position p, or -1. */
static int model_op_at(const Pipeline *pl, Pos p)
{
	for (int i = 0; i < pl->nops; i++)
		if (pl->op_pos[i].line == p.line && pl->op_pos[i].col == p.col)
			return i;
	return -1;
}

/* Cut cost[0..n) into S contiguous runs with the least largest sum (each run
 * non-empty when n >= S); run of each op into stage[]. */
static void balance(const double *cost, int n, int S, int *stage)
{
	if (n <= S) {
		for (int i = 0; i < n; i++)
			stage[i] = i;
		return;
	}
	double *pre = xcalloc((size_t)n + 1, sizeof *pre), *best = xmalloc(sizeof *best * (size_t)(S + 1) * (size_t)(n + 1));
	int *cut = xcalloc((size_t)(S + 1) * (size_t)(n + 1), sizeof *cut);
	for (int i = 0; i < n; i++)
		pre[i + 1] = pre[i] + cost[i];
	/* best[k][j]: the first j ops in k runs */
	for (int j = 0; j <= n; j++)
		best[j] = j == 0 ? 0 : 1e300;
	for (int k = 1; k <= S; k++)
		for (int j = 0; j <= n; j++) {
			double b = 1e300;
			int c = 0;
			for (int i = k - 1; i < j; i++) {
				double prev = best[(size_t)(k - 1) * (size_t)(n + 1) + (size_t)i], run = pre[j] - pre[i];
				double v = prev > run ? prev : run;
				if (v < b)
					b = v, c = i;
			}
			best[(size_t)k * (size_t)(n + 1) + (size_t)j] = b;
			cut[(size_t)k * (size_t)(n + 1) + (size_t)j] = c;
		}
	for (int k = S, j = n; k >= 1; k--) {
		int i = cut[(size_t)k * (size_t)(n + 1) + (size_t)j];
		for (int t = i; t < j; t++)
			stage[t] = k - 1;
		j = i;
	}
	free(pre), free(best), free(cut);
}

/* stages: auto — each model op costs its forward and backward ops' time. */
static void balance_stages(const Graph *prog, const CostEstimate *e, Pipeline *pl)
{
	double *cost = xcalloc((size_t)pl->nops + 1, sizeof *cost);
	for (int i = 0; i < prog->ops.n; i++) {
		int k = e->op[i].phase <= PHASE_BACKWARD ? model_op_at(pl, prog->ops.a[i].pos) : -1;
		if (k >= 0)
			cost[k] += e->op[i].seconds;
	}
	balance(cost, pl->nops, pl->nstages, pl->op_stage);
	pipeline_place_params(pl);
	free(cost);
}

static void alloc_cost(PipeCost *pc, const Pipeline *pl)
{
	size_t n = (size_t)pl->nstages, p = (size_t)pl->ndev_stages;
	memset(pc, 0, sizeof *pc);
	pc->nstages = pl->nstages;
	pc->fwd = xcalloc(n, sizeof *pc->fwd), pc->bwd = xcalloc(n, sizeof *pc->bwd);
	pc->send_bytes = xcalloc(n, sizeof *pc->send_bytes), pc->send = xcalloc(n, sizeof *pc->send);
	pc->act = xcalloc(n, sizeof *pc->act);
	pc->tail = xcalloc(p, sizeof *pc->tail), pc->param_bytes = xcalloc(p, sizeof *pc->param_bytes);
}

/* Steps, tails and params per stage. */
static void stage_times(const Graph *prog, const CostEstimate *e, const Pipeline *pl, const int *st, PipeCost *pc)
{
	double m = (double)pl->microbatches;
	for (int i = 0; i < prog->ops.n; i++) {
		int ph = e->op[i].phase, s = st[i];
		if (ph == PHASE_FORWARD)
			pc->fwd[s] += e->op[i].seconds / m;
		else if (ph == PHASE_BACKWARD)
			pc->bwd[s] += e->op[i].seconds / m;
		for (int d = 0; ph > PHASE_BACKWARD && d < pl->ndev_stages; d++)
			if (s < 0 || pipeline_stage_device(pl, s) == d)
				pc->tail[d] += e->op[i].seconds;
	}
	for (int v = 0; v < prog->values.n; v++) {
		int s = prog->values.a[v].kind == VK_PARAM ? pipeline_stage_at(pl, prog->values.a[v].pos) : -1;
		if (s >= 0)
			pc->param_bytes[pipeline_stage_device(pl, s)] += value_bytes(prog, v);
	}
}

/* Sends between stages and the activations kept, per microbatch. */
static void stage_traffic(const Graph *prog, const CostEstimate *e, const Pipeline *pl, const int *st, PipeCost *pc)
{
	double m = (double)pl->microbatches;
	int *last = xmalloc(sizeof *last * ((size_t)prog->values.n + 1)); /* latest forward reader's stage */
	bool *kept = xcalloc((size_t)prog->values.n + 1, sizeof *kept);
	for (int v = 0; v < prog->values.n; v++)
		last[v] = -1;
	for (int i = 0; i < prog->ops.n; i++)
		for (int k = 0; k < prog->ops.a[i].nin; k++) {
			int v = prog->ops.a[i].in[k];
			if (e->op[i].phase == PHASE_FORWARD && st[i] > last[v])
				last[v] = st[i];
			kept[v] |= e->op[i].phase == PHASE_BACKWARD;
		}
	for (int v = 0; v < prog->values.n; v++) {
		int p = prog->values.a[v].producer;
		double b = value_bytes(prog, v) / m;
		if (p < 0 || e->op[p].phase != PHASE_FORWARD) {
			if (prog->values.a[v].kind == VK_INPUT && pl->recompute)
				pc->act[0] += b;
			continue;
		}
		for (int s = st[p]; s < last[v]; s++)
			pc->send_bytes[s] += b;
		if (kept[v] && !pl->recompute)
			pc->act[st[p]] += b;
	}
	for (int s = 0; pl->recompute && s + 1 < pl->nstages; s++)
		pc->act[s + 1] += pc->send_bytes[s];
	free(last), free(kept);
}

int cost_pipeline(const Graph *prog, const HwProfile *hw, const CostEstimate *e, Pipeline *pl, PipeCost *pc)
{
	if (pl->auto_stages && pl->nops > 0 && pl->op_stage[0] < 0)
		balance_stages(prog, e, pl);
	alloc_cost(pc, pl);
	int *st = xcalloc((size_t)prog->ops.n + 1, sizeof *st);
	for (int i = 0; i < prog->ops.n; i++)
		st[i] = op_stage(prog, e, pl, i);
	stage_times(prog, e, pl, st, pc);
	stage_traffic(prog, e, pl, st, pc);
	free(st);
	for (int s = 0; s < pl->nstages; s++) {
		if (pl->recompute)
			pc->bwd[s] += pc->fwd[s];
		pc->send[s] = pc->send_bytes[s] > 0 ? cost_collective_seconds(hw, &prog->mesh, RS_PERMUTE, &pl->axis, 1,
		                                                              pc->send_bytes[s], NULL, 1)
		                                    : 0;
	}
	PipeSimIn in = {pl->schedule, pl->ndev_stages, pl->virtual_stages, (int)pl->microbatches, pc->fwd, pc->bwd, pc->send, pc->act};
	int rc = pipe_simulate(&in, &pc->sim);
	double tail = 0;
	for (int d = 0; d < pl->ndev_stages; d++)
		tail = pc->tail[d] > tail ? pc->tail[d] : tail;
	pc->step_s = pc->sim.makespan + tail;
	pc->formula = pipe_bubble_formula(pl->ndev_stages, pl->virtual_stages, (int)pl->microbatches);
	return rc;
}

void cost_pipeline_free(PipeCost *pc)
{
	free(pc->fwd), free(pc->bwd), free(pc->send_bytes), free(pc->send), free(pc->act), free(pc->tail);
	free(pc->param_bytes);
	pipe_sim_free(&pc->sim);
	memset(pc, 0, sizeof *pc);
}
