/* trace.c: schedules as Chrome trace events — slices per device and stream, a memory counter. */
#include "trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../spmd/ops.h"

void schedule_free(Schedule *s)
{
	free(s->s);
	*s = (Schedule){0};
}

static int trace_devices(const Graph *prog)
{
	return prog->mesh.ndev < TRACE_MAX_DEVICES ? prog->mesh.ndev : TRACE_MAX_DEVICES;
}

static bool is_comm(const Graph *prog, int i) { return op_table[prog->ops.a[i].kind].flags & OPF_COLLECTIVE; }

void schedule_from_estimate(const Graph *prog, const CostEstimate *e, Schedule *s)
{
	int nd = trace_devices(prog), nops = prog->ops.n;
	*s = (Schedule){.ndev = nd, .n = nd * nops, .s = xcalloc((size_t)(nd * nops) + 1, sizeof(ScheduleSlice))};
	s->nlanes = e->nlanes < 1 ? 1 : e->nlanes < SCHEDULE_MAX_LANES ? e->nlanes : SCHEDULE_MAX_LANES;
	for (int i = 0; i < nops; i++) {
		int l = e->op[i].lane;
		if (!e->op[i].comm || l >= s->nlanes)
			continue;
		for (int k = 0; k < prog->ops.a[i].attr->ncax; k++)
			s->lane_axes[l] |= 1u << prog->ops.a[i].attr->cax[k];
		s->lane_way[l] = cost_links_way(e->op[i].links);
	}
	for (int dev = 0; dev < nd; dev++)
		for (int i = 0; i < nops; i++) {
			int lane = e->op[i].lane < s->nlanes ? e->op[i].lane : 0;
			s->s[dev * nops + i] = (ScheduleSlice){dev, e->op[i].comm ? STREAM_COMM + lane : STREAM_COMPUTE, i,
			                                       e->op[i].start, e->op[i].end};
			s->span = e->op[i].end > s->span ? e->op[i].end : s->span;
		}
}

void schedule_from_measured(const Graph *prog, const double *sec, int ndev, Schedule *s)
{
	int nd = ndev < TRACE_MAX_DEVICES ? ndev : TRACE_MAX_DEVICES, nops = prog->ops.n;
	*s = (Schedule){.ndev = nd, .n = nd * nops, .s = xcalloc((size_t)(nd * nops) + 1, sizeof(ScheduleSlice)),
	                .nlanes = 1};
	for (int dev = 0; dev < nd; dev++) {
		double t = 0;
		for (int i = 0; i < nops; i++) {
			double d = sec[(size_t)dev * (size_t)nops + (size_t)i];
			s->s[dev * nops + i] = (ScheduleSlice){dev, is_comm(prog, i) ? STREAM_COMM : STREAM_COMPUTE, i, t, t + d};
			t += d;
		}
		s->span = t > s->span ? t : s->span;
	}
}

void trace_init(Trace *t) { t->events = json_array(); }

void trace_free(Trace *t)
{
	json_decref(t->events);
	t->events = NULL;
}

static void meta(Trace *t, const char *what, int pid, int tid, const char *key, json_t *value)
{
	json_t *e = json_pack("{s:s, s:s, s:i, s:i, s:{s:o}}", "name", what, "ph", "M", "pid", pid, "tid", tid, "args",
	                      key, value);
	json_array_append_new(t->events, e);
}

/* "predicted device 3 (data=1, model=1)" */
static void device_name(const Graph *prog, const char *label, int dev, char *buf, size_t n)
{
	int c[MESH_MAX_AXES];
	size_t k = (size_t)snprintf(buf, n, "%s device %d", label, dev);
	if (prog->mesh.naxes == 0)
		return;
	mesh_device_coords(&prog->mesh, dev, c);
	for (int a = 0; a < prog->mesh.naxes && k < n; a++)
		k += (size_t)snprintf(buf + k, n - k, "%s%s=%d", a ? ", " : " (", prog->mesh.name[a], c[a]);
	if (k < n)
		snprintf(buf + k, n - k, ")");
}

static json_t *slice_args(const Graph *prog, int i)
{
	const Op *op = &prog->ops.a[i];
	const Value *out = &prog->values.a[op->out];
	char shape[96];
	shape_format(&out->shape, shape, sizeof shape);
	json_t *a = json_pack("{s:s, s:s}", "op", op_table[op->kind].name, "local_shape", shape);
	if (is_comm(prog, i)) {
		const Value *in = &prog->values.a[op->in[0]];
		json_object_set_new(a, "bytes", json_integer(shape_numel(&in->shape) * dtype_size(in->dtype)));
	}
	if (op->why)
		json_object_set_new(a, "reason", json_string(op->why));
	return a;
}

/* Microseconds, the unit of ts and dur. */
static json_t *usec(double s) { return json_real(s * 1e6); }

void schedule_lane_axes(const Graph *prog, const Schedule *s, int lane, char *buf, size_t n)
{
	size_t k = 0;
	buf[0] = 0;
	if (s->nlanes < 2 || lane >= s->nlanes)
		return;
	for (int a = 0; a < prog->mesh.naxes && k < n; a++)
		if (s->lane_axes[lane] >> a & 1)
			k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", prog->mesh.name[a]);
	if (s->lane_way[lane] && k < n)
		snprintf(buf + k, n - k, "%sto c %s 1", k ? ", " : "", s->lane_way[lane] > 0 ? "+" : "-");
}

void schedule_lane_name(const Graph *prog, const Schedule *s, int lane, char *buf, size_t n)
{
	char axes[128];
	schedule_lane_axes(prog, s, lane, axes, sizeof axes);
	snprintf(buf, n, "communication%s%s", axes[0] ? ": " : "", axes);
}

void trace_add_schedule(Trace *t, const Graph *prog, const Schedule *s, int pid_base, const char *label)
{
	char name[256];
	for (int dev = 0; dev < s->ndev; dev++) {
		device_name(prog, label, dev, name, sizeof name);
		meta(t, "process_name", pid_base + dev, 0, "name", json_string(name));
		meta(t, "process_sort_index", pid_base + dev, 0, "sort_index", json_integer(pid_base + dev));
		meta(t, "thread_name", pid_base + dev, STREAM_COMPUTE, "name", json_string("compute"));
		for (int l = 0; l < s->nlanes; l++) {
			char lane[160];
			schedule_lane_name(prog, s, l, lane, sizeof lane);
			meta(t, "thread_name", pid_base + dev, STREAM_COMM + l, "name", json_string(lane));
		}
	}
	for (int k = 0; k < s->n; k++) {
		const ScheduleSlice *sl = &s->s[k];
		const Op *op = &prog->ops.a[sl->op];
		json_t *e = json_pack("{s:s, s:s, s:s, s:i, s:i}", "name", prog->values.a[op->out].name, "cat",
		                      sl->stream >= STREAM_COMM ? "collective" : op_table[op->kind].name, "ph", "X", "pid",
		                      pid_base + sl->device, "tid", sl->stream);
		json_object_set_new(e, "ts", usec(sl->start));
		json_object_set_new(e, "dur", usec(sl->end - sl->start));
		json_object_set_new(e, "args", slice_args(prog, sl->op));
		json_array_append_new(t->events, e);
	}
}

void trace_add_memory(Trace *t, const Graph *prog, const Schedule *s, int pid_base)
{
	int64_t *held = xcalloc((size_t)prog->ops.n + 1, sizeof *held);
	cost_memory_timeline(prog, held);
	for (int k = 0; k < s->n; k++) {
		const ScheduleSlice *sl = &s->s[k];
		json_t *e = json_pack("{s:s, s:s, s:i, s:i, s:{s:I}}", "name", "memory", "ph", "C", "pid",
		                      pid_base + sl->device, "tid", 0, "args", "bytes", (json_int_t)held[sl->op]);
		json_object_set_new(e, "ts", usec(sl->start));
		json_array_append_new(t->events, e);
	}
	free(held);
}

int trace_write(const Trace *t, const char *path, Diag *d)
{
	json_t *root = json_pack("{s:O, s:s}", "traceEvents", t->events, "displayTimeUnit", "ns");
	char *text = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	int rc = text && file_write_atomic(path, text, strlen(text)) == 0 ? 0 : -1;
	if (rc != 0)
		diag_usage(d, "expected a writable file %s for the trace, found %s", path, text ? strerror(errno) : "no memory");
	free(text);
	return rc;
}
