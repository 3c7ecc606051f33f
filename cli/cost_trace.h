/* cost_trace.h: the trace files of `spmd cost --trace` and `spmd run --profile --trace`. */
#ifndef SPMD_COST_TRACE_H
#define SPMD_COST_TRACE_H

#include "measure.h"

/* The cost model's schedule of prog (e) with its memory counter, as
 * processes "predicted device D"; with r (a --compare-run), also what was
 * measured, as processes "measured device D" (pids from 1000).  Slices of
 * both are named after the op's value, so they line up.  0, or -1 after
 * reporting. */
int cost_trace_write(const char *path, const Graph *prog, const CostEstimate *e, const CostRun *r, Diag *d);
/* A measured run alone: sec is ndev * prog->ops.n, device-major. */
int run_trace_write(const char *path, const Graph *prog, const double *sec, int ndev, Diag *d);

enum { TRACE_MEASURED_PID = 1000 };

#endif
