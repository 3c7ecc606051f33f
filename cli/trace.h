/* trace.h: timelines in Chrome's trace event format (the JSON Perfetto and chrome://tracing open).
 *
 * The pictures take a schedule as a plain list of slices — per device, per
 * stream, start and end, the value's name and its op's reason and bytes —
 * so any schedule can feed them: the cost model's (schedule_from_estimate),
 * or a measured run (schedule_from_measured).
 *
 *   Schedule s;
 *   schedule_from_estimate(&prog, &est, &s);
 *   Trace t;
 *   trace_init(&t);
 *   trace_add_schedule(&t, &prog, &s, 0, "predicted");
 *   trace_add_memory(&t, &prog, &s, 0);
 *   trace_write(&t, "step.json", &d);
 *   trace_free(&t), schedule_free(&s);
 *
 * The file's format and what each track holds: docs/pictures.md. */
#ifndef SPMD_TRACE_H
#define SPMD_TRACE_H

#include <jansson.h>

#include "../cost_model/cost.h"

/* Streams: compute, then one per communication lane (the cost model runs
 * collectives on disjoint links at once, docs/cost_model.md). */
enum { STREAM_COMPUTE = 0, STREAM_COMM = 1, SCHEDULE_MAX_LANES = 32 };
enum { TRACE_MAX_DEVICES = 64 }; /* devices written to a trace; the rest run the same program */

/* One op on one device's stream. */
typedef struct {
	int device;
	int stream;          /* STREAM_COMPUTE, or STREAM_COMM + its communication lane */
	int op;              /* the program's op index */
	double start, end;   /* seconds from the step's start */
} ScheduleSlice;

typedef struct {
	int ndev;            /* devices with slices: 0 .. ndev-1 */
	int n;
	ScheduleSlice *s;
	double span;         /* the last end */
	int nlanes;          /* communication streams (1 for a measured run) */
	unsigned lane_axes[SCHEDULE_MAX_LANES]; /* per lane: the mesh axes (bits) its collectives run over */
	int lane_way[SCHEDULE_MAX_LANES];       /* per lane: +1 or -1 when its sends go one way round closed rings
	                                         * (to c + 1, to c - 1), else 0 */
} Schedule;

void schedule_free(Schedule *s);
/* Today's cost model: every device runs the overlapped schedule of
 * cost_estimate (OpEstimate start and end), up to TRACE_MAX_DEVICES. */
void schedule_from_estimate(const Graph *prog, const CostEstimate *e, Schedule *s);
/* A measured run: sec (ndev * prog->ops.n, device-major) laid end to end
 * in program order on each device, as the executor runs them; collectives
 * on the communication stream. */
void schedule_from_measured(const Graph *prog, const double *sec, int ndev, Schedule *s);

typedef struct {
	json_t *events;      /* the traceEvents array */
} Trace;

void trace_init(Trace *t);
void trace_free(Trace *t);
/* A communication lane's track name: "communication", or with several
 * lanes "communication: " and schedule_lane_axes. */
void schedule_lane_name(const Graph *prog, const Schedule *s, int lane, char *buf, size_t n);
/* With several lanes, the mesh axes a lane's collectives run over and,
 * for one-way sends round closed rings, their way ("model, to c + 1");
 * else "". */
void schedule_lane_axes(const Graph *prog, const Schedule *s, int lane, char *buf, size_t n);
/* Each device of s as a process pid_base + device named "LABEL device D
 * (axis=c, ...)", with a "compute" thread and a communication thread per
 * lane (schedule_lane_name); each
 * slice an "X" event named after the op's value, args: op, reason (the
 * partitioner's why, collectives), bytes (collectives: handed in per
 * device), shape. */
void trace_add_schedule(Trace *t, const Graph *prog, const Schedule *s, int pid_base, const char *label);
/* The bytes each device holds over the step (cost_memory_timeline) as a
 * "memory" counter, stepped at each op's start in s. */
void trace_add_memory(Trace *t, const Graph *prog, const Schedule *s, int pid_base);
/* Write {"traceEvents": [...], "displayTimeUnit": "ns"} atomically.
 * 0, or -1 after reporting. */
int trace_write(const Trace *t, const char *path, Diag *d);

#endif
