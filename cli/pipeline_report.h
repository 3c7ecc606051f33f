/* pipeline_report.h: the pipeline part of `spmd cost` — the schedule's
 * timeline per device, its bubble, sends and activations in flight, as text
 * and as the report's "pipeline" object (docs/pipeline.md). */
#ifndef SPMD_PIPELINE_REPORT_H
#define SPMD_PIPELINE_REPORT_H

#include <jansson.h>

#include "../cost_model/pipeline_cost.h"

/* The pipeline line of `spmd check`'s summary: axis, schedule, ops per stage. */
void pipeline_summary(const Graph *model);
/* Print pc, the price of model's pipeline, after the cost report. */
void pipeline_print(const Graph *model, const PipeCost *pc);
/* The same as the "pipeline" object of `spmd cost --json`. */
json_t *pipeline_json(const Graph *model, const PipeCost *pc);

/* --pipeline-sweep: the model's pipeline priced again for every schedule
 * its stages allow (gpipe and 1f1b; interleaved when the section says it,
 * with its V) and every microbatch count from 1 to 64 that the section
 * allows: step, bubble, microbatches and activation bytes in flight.  As
 * text, or (json not NULL) as its "pipeline_sweep" array.  0, or -1 when a
 * schedule cannot be simulated. */
int pipeline_sweep(const Graph *model, const Graph *prog, const HwProfile *hw, const CostEstimate *e, json_t *json);


#endif
