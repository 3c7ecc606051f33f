/* pipeline_price.c: the figures pipe_simulate needs, from a program priced
 * with the stage axis replicated, and stages: auto.
 *
 * Every op of the program is placed on a stage by its position
 * (pipeline_stage_at): backward ops carry their forward op's, update ops
 * their param's.  Forward and backward ops make a stage's microbatch steps
 * (mb_seconds: every microbatch pays an op's fixed costs, 1/m of the
 * rest); gradient sync, update and gathers run once after
 * the last microbatch (the tail of the device of their stage; ops of no
 * stage — shared scalars — on every device).  A value made by stage s and
 * read in the forward of a later stage t is sent (1/m of it per microbatch)
 * across every boundary from s to t; its gradient comes back the same way.
 * A stage keeps, per microbatch, its forward values the backward reads —
 * with recompute only what it receives (stage 0: the inputs), and its
 * backward then runs the forward once more.  A param read on another
 * device's stage too (tied weights) is sent there once a step and its
 * gradient sent back: two sends in the tail of the param's device, and a
 * copy and its gradient held by the reader.  clip_global_norm's running
 * total hops along the stages and its scale comes back: one hop a stage in
 * every device's tail. */
#include "pipeline_cost.h"

#include <math.h>
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

/* Ops of cost[0..n) in order into runs of at most `cap` each (an op above
 * cap alone); the runs needed, and each op's run into stage[] when not NULL. */
static int runs(const double *cost, int n, double cap, int *stage)
{
	int k = 0;
	double sum = 0;
	for (int i = 0; i < n; i++) {
		if (i > 0 && sum + cost[i] > cap)
			k++, sum = 0;
		sum += cost[i];
		if (stage)
			stage[i] = k;
	}
	return n ? k + 1 : 0;
}

/* Cut cost[0..n) into at most S contiguous runs with the least largest sum:
 * bisect on that sum (60 halvings: below a 1e-18 share of the total), each
 * candidate checked greedily.  O(60 n). */
static void balance(const double *cost, int n, int S, int *stage)
{
	double lo = 0, hi = 0;
	for (int i = 0; i < n; i++)
		hi += cost[i], lo = cost[i] > lo ? cost[i] : lo;
	for (int it = 0; it < 60 && lo < hi; it++) {
		double mid = lo + (hi - lo) / 2;
		if (runs(cost, n, mid, NULL) <= S)
			hi = mid;
		else
			lo = mid;
	}
	runs(cost, n, hi, stage);
}

/* Op i's time on one of m microbatches.  Its work (compute, memory
 * traffic, bytes on links) is 1/m of the whole batch's; its fixed costs —
 * kernel launch and dispatch, a collective's per-step latency: the
 * estimate's LIMIT_LATENCY share — are paid again by every microbatch, as
 * the pipelined program launches every op once per microbatch. */
static double mb_seconds(const CostEstimate *e, int i, double m)
{
	double lat = e->op[i].limit_s[LIMIT_LATENCY];
	lat = lat < e->op[i].seconds ? lat : e->op[i].seconds;
	return lat + (e->op[i].seconds - lat) / m;
}

/* stages: auto — each model op costs its forward and backward ops' time
 * per microbatch. */
static void balance_stages(const Graph *prog, const CostEstimate *e, Pipeline *pl)
{
	double *cost = xcalloc((size_t)pl->nops + 1, sizeof *cost);
	for (int i = 0; i < prog->ops.n; i++) {
		int k = e->op[i].phase <= PHASE_BACKWARD ? pipeline_op_at(pl, prog->ops.a[i].pos) : -1;
		if (k >= 0)
			cost[k] += mb_seconds(e, i, (double)pl->microbatches);
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
	pc->tied_bytes = xcalloc(p, sizeof *pc->tied_bytes);
}

static int by_key(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/* Tied params: each (param, reader device) once, the reader not the
 * param's device; the copy's bytes on the reader, its two sends in the
 * owner's tail. */
static void tied_params(const Graph *prog, const HwProfile *hw, const CostEstimate *e, const Pipeline *pl,
                        const int *st, PipeCost *pc)
{
	int p = pl->ndev_stages, n = 0, cap = 0;
	int64_t *key = NULL;
	for (int i = 0; i < prog->ops.n; i++)
		for (int k = 0; k < prog->ops.a[i].nin && st[i] >= 0 && e->op[i].phase == PHASE_FORWARD; k++) {
			int v = prog->ops.a[i].in[k], s = pipeline_stage_at(pl, prog->values.a[v].pos);
			if (prog->values.a[v].kind != VK_PARAM || s < 0 || s % p == st[i] % p)
				continue;
			if (n == cap)
				cap = cap ? 2 * cap : 16, key = xrealloc(key, sizeof *key * (size_t)cap);
			key[n++] = (int64_t)v * p + st[i] % p;
		}
	if (n)
		qsort(key, (size_t)n, sizeof *key, by_key);
	for (int j = 0; j < n; j++) {
		if (j && key[j] == key[j - 1])
			continue;
		int v = (int)(key[j] / p), d = (int)(key[j] % p), own = pipeline_stage_at(pl, prog->values.a[v].pos) % p;
		double b = value_bytes(prog, v);
		pc->tied_bytes[d] += b;
		if (p > 1)
			pc->tail[own] += 2 * cost_collective_seconds(hw, &prog->mesh, RS_PERMUTE, &pl->axis, 1, b, NULL, 1);
	}
	free(key);
}

/* Ops of no stage after the last microbatch that read a stage's values:
 * clip_global_norm's sums of squares, which the pipelined program makes
 * on each param's stage and adds up in a running total that moves along
 * the stage axis, a scalar a hop; the scale made of it is sent back to
 * every stage.  nstages hops of a scalar, one after the other, in every
 * device's tail. */
static void shared_totals(const Graph *prog, const HwProfile *hw, const CostEstimate *e, const Pipeline *pl,
                          const int *st, PipeCost *pc)
{
	bool reads = false;
	double b = 0;
	for (int i = 0; i < prog->ops.n; i++) {
		const Op *op = &prog->ops.a[i];
		if (st[i] >= 0 || e->op[i].phase <= PHASE_BACKWARD)
			continue;
		for (int k = 0; k < op->nin; k++) {
			int p = prog->values.a[op->in[k]].producer;
			reads |= p >= 0 && st[p] >= 0;
		}
		if (prog->values.a[op->out].shape.rank == 0 && value_bytes(prog, op->out) > b)
			b = value_bytes(prog, op->out);
	}
	if (!reads || b <= 0 || pl->ndev_stages < 2)
		return;
	double hop = cost_collective_seconds(hw, &prog->mesh, RS_PERMUTE, &pl->axis, 1, b, NULL, 1);
	for (int d = 0; d < pl->ndev_stages; d++)
		pc->tail[d] += pl->nstages * hop;
}

/* Steps, tails and params per stage. */
static void stage_times(const Graph *prog, const CostEstimate *e, const Pipeline *pl, const int *st, PipeCost *pc)
{
	double m = (double)pl->microbatches;
	for (int i = 0; i < prog->ops.n; i++) {
		int ph = e->op[i].phase, s = st[i];
		if (ph == PHASE_FORWARD)
			pc->fwd[s] += mb_seconds(e, i, m);
		else if (ph == PHASE_BACKWARD)
			pc->bwd[s] += mb_seconds(e, i, m);
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
	tied_params(prog, hw, e, pl, st, pc);
	shared_totals(prog, hw, e, pl, st, pc);
	free(st);
	for (int s = 0; s < pl->nstages; s++) {
		if (pl->recompute)
			pc->bwd[s] += pc->fwd[s];
		if (pl->ndev_stages == 1) /* one device holds every stage: nothing is sent */
			pc->send_bytes[s] = 0;
		pc->send[s] = pc->send_bytes[s] > 0 ? cost_collective_seconds(hw, &prog->mesh, RS_PERMUTE, &pl->axis, 1,
		                                                              pc->send_bytes[s], NULL, 1)
		                                    : 0;
	}
	bool fwd_only = true; /* a model without train: has no backward ops */
	for (int i = 0; i < prog->ops.n && fwd_only; i++)
		fwd_only = e->op[i].phase != PHASE_BACKWARD;
	PipeSimIn in = {pl->schedule, pl->ndev_stages, pl->virtual_stages, (int)pl->microbatches, pc->fwd, pc->bwd, pc->send, pc->act,
	                fwd_only, hw->topo == TOPO_THREADS};
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
	free(pc->param_bytes), free(pc->tied_bytes);
	pipe_sim_free(&pc->sim);
	memset(pc, 0, sizeof *pc);
}

int64_t cost_pipeline_peak(const CostEstimate *e, const PipeCost *pc)
{
	const PipeSim *s = &pc->sim;
	double all = 0, most = 0;
	for (int d = 0; d < s->p; d++)
		all += pc->param_bytes[d];
	double held = 2 * (double)e->mem.params + (double)e->mem.state; /* params, gradients, optimizer state */
	for (int d = 0; d < s->p; d++) {
		double share = all > 0 ? pc->param_bytes[d] / all : 1.0 / s->p;
		double x = held * share + (double)e->mem.inputs + s->act_peak[d] + 2 * pc->tied_bytes[d]; /* a tied copy, its gradient */
		most = x > most ? x : most;
	}
	return (int64_t)ceil(most); /* whole bytes, as every peak is reported */
}

bool cost_pipeline_count_fits(const Graph *model, const Pipeline *pl, PipeSchedule sch, int64_t m)
{
	if (m * pl->ndev_stages * pl->virtual_stages > PIPE_MAX_STEPS || (sch == PIPE_INTERLEAVED && m % pl->ndev_stages))
		return false;
	for (int v = 0; v < model->values.n; v++) {
		const Value *x = &model->values.a[v];
		if (x->kind == VK_INPUT && x->shape.rank > 0 && x->shape.dim[0] % m)
			return false;
	}
	return true;
}

/* Count a before b: it fits the budget where b does not, or as fits and
 * faster (fitting) or smaller (not); ties keep the smaller count. */
static bool count_before(double budget, double ta, double pa, double tb, double pb)
{
	bool fa = pa <= budget, fb = pb <= budget;
	return fa != fb ? fa : fa ? ta < tb : pa < pb;
}

/* The best count under pipeline pl's schedule and recompute. */
static int best_count(const Graph *model, const Pipeline *pl, const Graph *prog, const HwProfile *hw,
                      const CostEstimate *e, double budget, PipeBest *best)
{
	*best = (PipeBest){.schedule = pl->schedule, .recompute = pl->recompute, .virtual_stages = pl->virtual_stages};
	int rc = 0;
	for (int64_t m = 1; m <= 64 && rc == 0; m++) {
		Pipeline q = *pl; /* the same stages and schedule; another count */
		q.microbatches = m;
		if (!cost_pipeline_count_fits(model, &q, q.schedule, m))
			continue;
		PipeCost pc;
		rc = cost_pipeline(prog, hw, e, &q, &pc);
		double t = pc.step_s, peak = (double)cost_pipeline_peak(e, &pc);
		if (rc == 0 && (!best->microbatches || count_before(budget, t, peak, best->step_s, best->peak))) {
			best->runner = best->microbatches, best->runner_step_s = best->step_s, best->runner_peak = best->peak;
			best->microbatches = m, best->step_s = t, best->peak = peak, best->bubble_fraction = pc.sim.bubble_fraction;
		} else if (rc == 0 && (!best->runner || count_before(budget, t, peak, best->runner_step_s, best->runner_peak)))
			best->runner = m, best->runner_step_s = t, best->runner_peak = peak;
		cost_pipeline_free(&pc);
	}
	return best->microbatches ? rc : -1;
}

const int PIPE_VIRTUAL[PIPE_NVIRTUAL] = {2, 4};

void pipeline_interleaved(const Pipeline *pl, int V, Pipeline *q)
{
	*q = *pl;
	q->schedule = PIPE_INTERLEAVED, q->virtual_stages = V, q->nstages = pl->ndev_stages * V, q->auto_stages = true;
	q->op_stage = xmalloc(sizeof(int) * (size_t)(pl->nops + 1));
	q->param_stage = xmalloc(sizeof(int) * (size_t)(pl->nparams + 1));
	for (int k = 0; k < pl->nops; k++)
		q->op_stage[k] = -1;
}

void pipeline_interleaved_free(Pipeline *q)
{
	free(q->op_stage), free(q->param_stage);
	q->op_stage = q->param_stage = NULL;
}

static bool same_price(const PipeBest *a, const PipeBest *b)
{
	return a->step_s == b->step_s && a->peak == b->peak && a->microbatches == b->microbatches;
}

int cost_pipeline_best(const Graph *model, const Graph *prog, const HwProfile *hw, const CostEstimate *e,
                       double budget, bool choose, int most_stages, PipeBest *best)
{
	const Pipeline *pl = model->pipeline;
	bool sched = choose && !pl->schedule_given && pl->schedule != PIPE_INTERLEAVED;
	bool recomp = choose && !pl->recompute_given && model->train;
	/* interleaved too: its virtual stages are a cut of their own, the cost model's */
	int nv = sched && pl->auto_stages && pl->ndev_stages > 1 ? PIPE_NVIRTUAL : 0;
	while (nv > 0 && pl->ndev_stages * PIPE_VIRTUAL[nv - 1] > most_stages)
		nv--;
	/* every (schedule, recompute) with its best count, in the order ties go by */
	PipeBest c[(2 + PIPE_NVIRTUAL) * 2];
	int n = 0;
	for (int k = 0; k < (sched ? 2 + nv : 1); k++)
		for (int r = 0; r < (recomp ? 2 : 1); r++) {
			Pipeline q = *pl;
			if (k >= 2)
				pipeline_interleaved(pl, PIPE_VIRTUAL[k - 2], &q);
			else if (sched)
				q.schedule = k ? PIPE_1F1B : PIPE_GPIPE;
			if (recomp)
				q.recompute = r;
			n += best_count(model, &q, prog, hw, e, budget, &c[n]) == 0;
			if (k >= 2)
				pipeline_interleaved_free(&q);
		}
	*best = (PipeBest){0};
	if (n == 0)
		return -1;
	int b = 0, o = -1;
	for (int i = 1; i < n; i++)
		if (count_before(budget, c[i].step_s, c[i].peak, c[b].step_s, c[b].peak))
			b = i;
	for (int i = 0; i < n; i++) /* the runner-up: the best other that prices otherwise (at one microbatch 1F1B is GPipe) */
		if (i != b && !same_price(&c[i], &c[b]) &&
		    (o < 0 || count_before(budget, c[i].step_s, c[i].peak, c[o].step_s, c[o].peak)))
			o = i;
	*best = c[b];
	if (o >= 0)
		best->other = true, best->other_schedule = c[o].schedule, best->other_virtual_stages = c[o].virtual_stages,
		best->other_recompute = c[o].recompute, best->other_microbatches = c[o].microbatches,
		best->other_step_s = c[o].step_s, best->other_peak = c[o].peak;
	return 0;
}
