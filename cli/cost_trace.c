/* cost_trace.c: predicted and measured schedules into one trace file. */
#include "cost_trace.h"

#include "trace.h"

int cost_trace_write(const char *path, const Graph *prog, const CostEstimate *e, const CostRun *r, Diag *d)
{
	Trace t;
	Schedule s;
	trace_init(&t);
	schedule_from_estimate(prog, e, &s);
	trace_add_schedule(&t, prog, &s, 0, "predicted");
	trace_add_memory(&t, prog, &s, 0);
	schedule_free(&s);
	if (r) {
		schedule_from_measured(prog, r->sec, r->ndev, &s);
		trace_add_schedule(&t, prog, &s, TRACE_MEASURED_PID, "measured");
		schedule_free(&s);
	}
	int rc = trace_write(&t, path, d);
	trace_free(&t);
	return rc;
}

int run_trace_write(const char *path, const Graph *prog, const double *sec, int ndev, Diag *d)
{
	Trace t;
	Schedule s;
	trace_init(&t);
	schedule_from_measured(prog, sec, ndev, &s);
	trace_add_schedule(&t, prog, &s, TRACE_MEASURED_PID, "measured");
	trace_add_memory(&t, prog, &s, TRACE_MEASURED_PID);
	schedule_free(&s);
	int rc = trace_write(&t, path, d);
	trace_free(&t);
	return rc;
}
