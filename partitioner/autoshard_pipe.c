/* autoshard_pipe.c: the pipeline part of autoshard.
 *
 * On a model with a pipeline: section the stage axis is one more axis of
 * the mesh (with --devices, every size whose stages the layers can fill),
 * never split by a sharding: the pipelined program partitions every stage
 * with the stage axis of size 1.  A plan is priced as `spmd cost` prices
 * the pipeline: the program with the stage axis replicated is estimated
 * once, then the schedule is simulated for every microbatch count the batch
 * and the schedule allow, and the plan takes the count with the least
 * scheduled step whose peak (params, gradients and optimizer state of a
 * device's stages, the inputs, its activations in flight) is within the
 * budget.  So the count is searched with every plan at the price of a few
 * list schedules.  A plan on another stage count than the model's is
 * written with stages: auto: the cost model balances its stages, as `spmd
 * cost` and `spmd run` will. */
#include "autoshard_pipe.h"

#include <math.h>

void autopipe_init(AutoPipe *ap, const Graph *base, long layers)
{
	const Pipeline *pl = base->pipeline;
	*ap = (AutoPipe){.axis = -1};
	if (!pl)
		return;
	ap->axis = pl->axis, ap->user_p = pl->ndev_stages, ap->user_auto = pl->auto_stages;
	ap->limit = layers > 0 ? (int)layers : pl->nops;
}

bool autopipe_mesh_ok(const AutoPipe *ap, const Graph *base, const Mesh *m)
{
	if (ap->axis < 0)
		return true;
	int p = m->size[ap->axis];
	return p == ap->user_p || (int64_t)p * base->pipeline->virtual_stages <= ap->limit;
}

bool autopipe_stages_auto(const AutoPipe *ap, const Mesh *m)
{
	return ap->axis >= 0 && (ap->user_auto || m->size[ap->axis] != ap->user_p);
}

int64_t autopipe_default_m(const AutoPipe *ap, const Graph *base, const Mesh *m)
{
	if (ap->axis < 0)
		return 0;
	Pipeline q = *base->pipeline;
	q.ndev_stages = m->size[ap->axis];
	if (cost_pipeline_count_fits(base, &q, q.schedule, q.microbatches))
		return q.microbatches;
	for (int64_t k = 1; k <= 64; k++)
		if (cost_pipeline_count_fits(base, &q, q.schedule, k))
			return k;
	return q.microbatches; /* none: the loader says why */
}

bool autopipe_price(const AutoPipe *ap, const Graph *model, const Graph *prog, const HwProfile *hw,
                    const CostEstimate *e, double budget, PipeBest *b)
{
	return cost_pipeline_best(model, prog, hw, e, budget, true, ap->limit, b) == 0 && isfinite(b->step_s) && isfinite(b->peak);
}

/* a before b: fits where b does not, or as fits and faster. */
static bool count_better(const AutoPipeCount *a, const AutoPipeCount *b)
{
	return a->fits != b->fits ? a->fits : a->t < b->t;
}

void autopipe_note(AutoPipe *ap, const Mesh *m, const PipeBest *b, double budget)
{
	if (ap->axis < 0 || !b->microbatches)
		return;
	AutoPipeCount c = {m->size[ap->axis], b->microbatches, b->step_s, b->peak, b->peak <= budget};
	int i = 0;
	while (i < ap->ncounts && ap->count[i].p != c.p)
		i++;
	if (i == ap->ncounts && i < AUTOPIPE_MAX_COUNTS)
		ap->count[ap->ncounts++] = c;
	else if (i < ap->ncounts && count_better(&c, &ap->count[i]))
		ap->count[i] = c;
}

void autopipe_result(const AutoPipe *ap, const Mesh *m, const PipeBest *b, AutoPipeResult *r)
{
	int p = m->size[ap->axis];
	*r = (AutoPipeResult){.stages = p, .microbatches = b->microbatches, .schedule = b->schedule,
	                      .virtual_stages = b->virtual_stages,
	                      .recompute = b->recompute, .stages_auto = autopipe_stages_auto(ap, m),
	                      .peak = b->peak, .runner_m = b->runner, .runner_m_s = b->runner_step_s,
	                      .runner_m_peak = b->runner_peak, .runner_s = b->other, .runner_s_schedule = b->other_schedule,
	                      .runner_s_virtual = b->other_virtual_stages,
	                      .runner_s_recompute = b->other_recompute, .runner_s_m = b->other_microbatches,
	                      .runner_s_s = b->other_step_s, .runner_s_peak = b->other_peak};
	const AutoPipeCount *best = NULL;
	for (int i = 0; i < ap->ncounts; i++)
		if (ap->count[i].p != p && (!best || count_better(&ap->count[i], best)))
			best = &ap->count[i];
	if (!best)
		return;
	r->runner_p = best->p, r->runner_p_m = best->m, r->runner_p_s = best->t, r->runner_p_peak = best->peak;
	r->runner_p_fits = best->fits;
}
