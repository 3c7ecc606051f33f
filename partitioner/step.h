/* step.h: a partitioned training step as the cost model sees it — each op's phase, the values carried between steps. */
#ifndef SPMD_STEP_H
#define SPMD_STEP_H

#include "../cost_model/cost.h"

/* Fill s for prog, partitioned from model (map: pipeline_partition's value
 * map).  Phases: local ops take their model op's — forward up to the loss,
 * backward for the ops the params' gradients need (in grad_dtype), the
 * weight update for the rest (clipping, the optimizer), the weight gather for
 * weight-update sharding's copy of the updated shard; an op the
 * partitioner added takes the phase of the op it serves: the next model
 * op when one up to there reads its result, else the op before it.  A collective that gathers a
 * carried shard or an update's result is the weight gather; one that reads
 * the update's values is the update's; a reduction of a backward value
 * whose result no forward or backward op needs is the gradient
 * synchronization; the others are their
 * model op's.  A model without a train: section is all forward, with no
 * carries.  Free with cost_step_free. */
void step_describe(const Graph *model, const Graph *prog, const int *map, CostStep *s);

/* The steady-step estimate of prog as one step of a long run (phases and
 * carries by step_describe, steady_only), as the passes price their
 * choices, into e (cost_estimate_free). */
void step_price(const Graph *model, const Graph *prog, const int *map, const HwProfile *hw, CostEstimate *e);

/* The passes' rule for keeping a rewritten program (collective matmul,
 * the step's order, chunks): its steady step e at least 0.1% faster than
 * before_s, its peak at most 1% above peak. */
bool step_kept(const CostEstimate *e, double before_s, int64_t peak);

#endif
