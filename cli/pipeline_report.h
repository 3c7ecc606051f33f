/* pipeline_report.h: the pipeline part of `spmd cost` — the schedule's
 * timeline per device, its bubble, sends and activations in flight, as text
 * and as the report's "pipeline" object (docs/pipeline.md). */
#ifndef SPMD_PIPELINE_REPORT_H
#define SPMD_PIPELINE_REPORT_H

#include <jansson.h>

#include "../cost_model/pipeline_cost.h"
#include "measure.h"

/* The pipeline line of `spmd check`'s summary: axis, schedule, ops per stage. */
void pipeline_summary(const Graph *model);
/* Print pc, the price of model's pipeline, after the cost report. */
void pipeline_print(const Graph *model, const CostEstimate *e, const PipeCost *pc);
/* The same as the "pipeline" object of `spmd cost --json`. */
json_t *pipeline_json(const Graph *model, const CostEstimate *e, const PipeCost *pc);

/* --pipeline-sweep: the model's pipeline priced again for every schedule
 * its stages allow (gpipe and 1f1b; interleaved when the section says it,
 * with its V) and every microbatch count from 1 to 64 that the section
 * allows: step, bubble, microbatches and activation bytes in flight.  As
 * text, or (json not NULL) as its "pipeline_sweep" array.  0, or -1 when a
 * schedule cannot be simulated. */
int pipeline_sweep(const Graph *model, const Graph *prog, const HwProfile *hw, const CostEstimate *e, json_t *json);

/* --compare-run of a pipelined model: the program spmd run builds, timed
 * on threads, by microbatch step (cli/measure.h). */
typedef struct {
	Graph model, prog; /* the model loaded again, and its pipelined program */
	CostRun run;       /* the fastest of `runs` */
	PipeMeasured meas;
	int runs;
} PipeCompare;

/* Build model's pipelined program from path (lo: the command's --mesh,
 * --axis-rules; the stages of model's section, balanced when auto) and
 * time it `runs` times into c (free it with pipeline_compare_free whatever
 * the result).  0, or -1 after reporting. */
int pipeline_compare_run(const char *path, const LoadOpts *lo, const Graph *model, int runs, PipeCompare *c,
                         Diag *d);
/* The estimate pc against the measured c: step, microbatch steps, bubble,
 * and per device busy and idle.  Printed, or (json not NULL) as its
 * "compare_run" object. */
void pipeline_compare(const Graph *model, const PipeCost *pc, const PipeCompare *c, json_t *json);
void pipeline_compare_free(PipeCompare *c);

#endif
