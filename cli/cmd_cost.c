/* cmd_cost.c: `spmd cost MODEL.yaml` — estimated step time, communication and memory per device, and the error against a run. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "../spmd/ops.h"
#include "../cost_model/cost.h"
#include "measure.h"
#include "cost_trace.h"
#include "pipeline_report.h"


enum { O_HARDWARE, O_JSON, O_COMPARE, O_RUNS, O_SENS, O_MESH, O_AXIS_RULES, O_TRACE, O_SWEEP, NCOST_OPTS };

static const CliOpt cost_opts[NCOST_OPTS] = {
	[O_HARDWARE] = {"hardware", "NAME|FILE", "hardware profile: tpu-v3, tpu-v4, a100-nvlink, h100-nvlink or a FILE.yaml "
	                                         "(default: the model's mesh hardware, else tpu-v3)"},
	[O_JSON] = {"json", NULL, "print the report as JSON (schema: docs/cost_model.md)"},
	[O_COMPARE] = {"compare-run", NULL, "also run the program on the thread backend and compare per op kind"},
	[O_RUNS] = {"runs", "N", "runs for --compare-run; the fastest counts (default 5)"},
	[O_SENS] = {"sensitivity", NULL, "also the steady-state step with each figure of the profile doubled"},
	[O_MESH] = CLI_MESH_OPT,
	[O_AXIS_RULES] = CLI_AXIS_RULES_OPT,
	[O_TRACE] = {"trace", "FILE.json", "write the schedule (and with --compare-run what was measured) as a Chrome trace "
	                                   "(docs/pictures.md)"},
	[O_SWEEP] = {"pipeline-sweep", NULL, "a pipelined model: also every schedule and microbatch count priced (docs/pipeline.md)"},
};

static const char cost_desc[] =
	"Estimate what one step of the partitioned program costs on each device:\n"
	"step time (serial; the steady state of a long run, communication\n"
	"overlapped with the compute of the same and the next step where data\n"
	"dependencies allow; the first step), the phases of a training step and\n"
	"what limits each, where the steady step waits (the op, the collective it\n"
	"waits for and the one that held that one's links), compute against\n"
	"communication, time by op kind and by collective, bytes sent per mesh\n"
	"axis, peak memory against the device's capacity, which gathers,\n"
	"scatters and all_reduces the partitioner overlapped with the einsums\n"
	"next to them (collective matmul, docs/partitioning.md) and where a\n"
	"training step's gradient reductions and updates run (docs/training.md).\n"
	"The exit status is 0 whether or not the model fits; the report says.\n"
	"Formulas: docs/cost_model.md; profiles: docs/hardware.md.";

/* "12.3 us", "4.56 ms"; "3.5 KiB" (cli.h) */
static const char *fmt_time(double s, char *buf, size_t n) { return fmt_seconds(s, buf, n); }
static const char *fmt_bytes(double b, char *buf, size_t n) { return fmt_size(b, buf, n); }

/* One row of the by-collective table: a kind over a set of axes. */
typedef struct {
	OpKind kind;
	int ncax, cax[MESH_MAX_AXES];
	int count;
	double bytes, sent, seconds;
} CollRow;

static int coll_rows(const Graph *g, const CostEstimate *e, CollRow *rows)
{
	int n = 0;
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		if (!(op_table[op->kind].flags & OPF_COLLECTIVE))
			continue;
		int r = 0;
		while (r < n && !(rows[r].kind == op->kind && rows[r].ncax == op->attr->ncax &&
		                  memcmp(rows[r].cax, op->attr->cax, sizeof(int) * (size_t)op->attr->ncax) == 0))
			r++;
		if (r == n) {
			rows[n] = (CollRow){.kind = op->kind, .ncax = op->attr->ncax};
			memcpy(rows[n++].cax, op->attr->cax, sizeof rows[0].cax);
		}
		const Value *in = &g->values.a[op->in[0]];
		double b = (double)shape_numel(&in->shape) * dtype_size(in->dtype);
		int64_t ngroup = 1;
		for (int k = 0; k < op->attr->ncax; k++)
			ngroup *= g->mesh.size[op->attr->cax[k]];
		rows[r].count++, rows[r].bytes += b, rows[r].seconds += e->op[i].seconds;
		rows[r].sent += (double)reshard_bytes_sent(op_reshard_kind(op->kind), (int64_t)b, ngroup);
	}
	return n;
}

static void axes_text(const Graph *g, const int *cax, int n, char *buf, size_t len)
{
	mesh_axes_text(&g->mesh, cax, n, buf, len);
}

/* Op kinds with ops, largest time first. */
static int kinds_sorted(const CostEstimate *e, int *order)
{
	int n = 0;
	for (int k = 0; k < OP_COUNT; k++)
		if (e->kind_n[k])
			order[n++] = k;
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && e->kind_s[order[j]] > e->kind_s[order[j - 1]]; j--) {
			int t = order[j];
			order[j] = order[j - 1], order[j - 1] = t;
		}
	return n;
}

static void print_memory(const Graph *g, const HwProfile *hw, const CostEstimate *e)
{
	const MemoryEstimate *m = &e->mem;
	char a[32], b[32], c[32], dd[32], f[32];
	printf("\nmemory per device\n");
	printf("  params %s, optimizer state %s, inputs %s\n", fmt_bytes((double)m->params, a, sizeof a),
	       fmt_bytes((double)m->state, b, sizeof b), fmt_bytes((double)m->inputs, c, sizeof c));
	printf("  peak %s", fmt_bytes((double)m->peak, a, sizeof a));
	if (m->peak_op >= 0)
		printf(" at op %d (%s = %s): activations %s, of which collective buffers %s", m->peak_op,
		       g->values.a[g->ops.a[m->peak_op].out].name, op_table[g->ops.a[m->peak_op].kind].name,
		       fmt_bytes((double)m->peak_activations, dd, sizeof dd), fmt_bytes((double)m->peak_collective, f, sizeof f));
	printf("\n  capacity %s: %s\n", fmt_bytes(hw->mem_capacity, a, sizeof a),
	       e->fits ? "fits" : "DOES NOT FIT");
}

/* The phases with ops: serial time, hidden by overlap, what limits them. */
static void print_phases(const Graph *g, const CostEstimate *e)
{
	char a[32], b[32], lim[64];
	printf("\n%-22s %12s %12s  %s\n", "phase", "serial", "hidden", "limited by");
	for (int p = 0; p < PHASE_COUNT; p++) {
		if (e->phase_s[p] <= 0)
			continue;
		printf("%-22s %12s %12s  %s\n", cost_phase_names[p], fmt_time(e->phase_s[p], a, sizeof a),
		       fmt_time(e->phase_hidden_s[p], b, sizeof b),
		       cost_limit_name(&g->mesh, cost_limit_top(e->phase_limit_s[p]), lim, sizeof lim));
	}
}

/* The compute ops of the steady step that wait, longest first (ties:
 * program order): the first WAITS_SHOWN into order, their count.
 * *total: every wait. */
enum { WAITS_SHOWN = 5 };
static int waits_sorted(const CostEstimate *e, int *order, double *total)
{
	int n = 0;
	*total = 0;
	for (int i = 0; i < e->nops; i++) {
		if (e->op[i].comm || e->op[i].wait <= 0)
			continue;
		*total += e->op[i].wait;
		int j = n < WAITS_SHOWN ? n++ : WAITS_SHOWN; /* j: where it goes, WAITS_SHOWN: not among them */
		for (; j > 0 && e->op[order[j - 1]].wait < e->op[i].wait; j--)
			if (j < WAITS_SHOWN)
				order[j] = order[j - 1];
		if (j < WAITS_SHOWN)
			order[j] = i;
	}
	return n;
}

static const char *op_name(const Graph *g, int i) { return g->values.a[g->ops.a[i].out].name; }

/* Where the compute stream of the steady step waits, and for what. */
static void print_waits(const Graph *g, const CostEstimate *e)
{
	int order[WAITS_SHOWN];
	double total;
	int n = waits_sorted(e, order, &total);
	char a[32], b[32], c[32];
	if (n == 0 || e->overlapped_s <= 0)
		return;
	printf("\nthe compute stream waits %s of the %s steady step (%.1f%%); the longest waits:\n",
	       fmt_time(total, a, sizeof a), fmt_time(e->overlapped_s, b, sizeof b), 100 * total / e->overlapped_s);
	for (int k = 0; k < n; k++) {
		const OpEstimate *o = &e->op[order[k]];
		const Op *op = &g->ops.a[order[k]];
		printf("  %9s before %s = %s", fmt_time(o->wait, a, sizeof a), op_name(g, order[k]), op_table[op->kind].name);
		if (op->pos.line)
			printf(" (%s:%d)", op->pos.file ? op->pos.file : "?", op->pos.line);
		if (o->wait_on >= 0) {
			const OpEstimate *w = &e->op[o->wait_on];
			printf(", for %s %s", op_table[g->ops.a[o->wait_on].kind].name, op_name(g, o->wait_on));
			if (w->behind >= 0 && w->delay > 0)
				printf(", which waited %s for its links behind %s %s", fmt_time(w->delay, c, sizeof c),
				       op_table[g->ops.a[w->behind].kind].name, op_name(g, w->behind));
		}
		printf("\n");
	}
}

static void print_report(const Graph *g, const HwProfile *hw, const CostEstimate *e, const char *hw_note)
{
	char mesh[128] = "none", a[32], b[32], axes[128];
	if (g->mesh.naxes)
		mesh_format(&g->mesh, mesh, sizeof mesh);
	printf("cost of %s on mesh %s (%d device%s), hardware %s%s\n", g->name ? g->name : "(unnamed)", mesh,
	       g->mesh.ndev, g->mesh.ndev == 1 ? "" : "s", hw->name, hw_note);
	char c[32];
	printf("step time      %s serial, %s in the steady state (communication overlapped), first step %s\n",
	       fmt_time(e->serial_s, a, sizeof a), fmt_time(e->overlapped_s, b, sizeof b),
	       fmt_time(e->first_step_s, c, sizeof c));
	double tot = e->serial_s > 0 ? e->serial_s : 1;
	printf("compute        %s (%.1f%%)\n", fmt_time(e->compute_s, a, sizeof a), 100 * (e->compute_s / tot));
	printf("communication  %s (%.1f%%)", fmt_time(e->comm_s, a, sizeof a), 100 * (e->comm_s / tot));
	if (e->nlanes > 1) /* collectives on disjoint links run at once (docs/cost_model.md) */
		printf(" on %d streams, one per set of links; the busiest link %s", e->nlanes,
		       fmt_time(e->link_busy_s, b, sizeof b));
	printf("\n");
	if (e->wait_s > 0)
		printf("waiting        %s of it for the devices that share the host's %d cores\n",
		       fmt_time(e->wait_s, a, sizeof a), hw->host_cores);
	if (e->dispatch_s > 0)
		printf("between ops    %s of it in the executor between kernels\n", fmt_time(e->dispatch_s, a, sizeof a));
	printf("kernels        %d for %d ops (elementwise fusion %s); %.4g FLOPs per device\n", e->nkernels, e->nops,
	       hw->fusion ? "on" : "off", e->flops);
	print_phases(g, e);
	print_waits(g, e);
	int order[OP_COUNT], nk = kinds_sorted(e, order);
	printf("\n%-22s %6s %12s %7s\n", "op kind", "count", "time", "share");
	for (int i = 0; i < nk; i++)
		printf("%-22s %6d %12s %6.1f%%\n", op_table[order[i]].name, e->kind_n[order[i]],
		       fmt_time(e->kind_s[order[i]], a, sizeof a), 100 * (e->kind_s[order[i]] / tot));
	CollRow *rows = xcalloc((size_t)g->ops.n + 1, sizeof *rows);
	int nr = coll_rows(g, e, rows);
	if (nr)
		printf("\n%-22s %-16s %6s %14s %14s %12s\n", "collective", "axes", "count", "bytes/device", "sent/device", "time");
	for (int i = 0; i < nr; i++) {
		axes_text(g, rows[i].cax, rows[i].ncax, axes, sizeof axes);

		printf("%-22s %-16s %6d %14s %14s %12s\n", op_table[rows[i].kind].name, axes, rows[i].count,
		       fmt_bytes(rows[i].bytes, a, sizeof a), fmt_bytes(rows[i].sent, b, sizeof b),
		       fmt_time(rows[i].seconds, c, sizeof c));
	}
	free(rows);
	if (g->mesh.naxes)
		printf("\nbytes sent per device by mesh axis:");
	for (int x = 0; x < g->mesh.naxes; x++)
		printf(" %s %s%s", g->mesh.name[x], fmt_bytes(e->axis_bytes[x], a, sizeof a), x + 1 < g->mesh.naxes ? "," : "\n");
	print_memory(g, hw, e);
}

/* ---- JSON ---- */

static json_t *axes_json(const Graph *g, const int *cax, int n)
{
	return cli_jaxes(&g->mesh, cax, n);
}

static json_t *memory_json(const Graph *g, const HwProfile *hw, const CostEstimate *e)
{
	const MemoryEstimate *m = &e->mem;
	json_t *o = json_object();
	json_object_set_new(o, "params_bytes", json_integer(m->params));
	json_object_set_new(o, "state_bytes", json_integer(m->state));
	json_object_set_new(o, "inputs_bytes", json_integer(m->inputs));
	json_object_set_new(o, "peak_bytes", json_integer(m->peak));
	json_object_set_new(o, "peak_op_index", json_integer(m->peak_op));
	json_object_set_new(o, "peak_op", m->peak_op >= 0 ? json_string(g->values.a[g->ops.a[m->peak_op].out].name)
	                                                  : json_null());
	json_object_set_new(o, "activations_at_peak_bytes", json_integer(m->peak_activations));
	json_object_set_new(o, "collective_buffers_at_peak_bytes", json_integer(m->peak_collective));
	json_object_set_new(o, "capacity_bytes", json_integer((json_int_t)hw->mem_capacity));
	json_object_set_new(o, "fits", json_boolean(e->fits));
	return o;
}

static json_t *phases_json(const Graph *g, const CostEstimate *e)
{
	json_t *a = json_array();
	char lim[64];
	for (int p = 0; p < PHASE_COUNT; p++) {
		json_t *o = json_object();
		int top = cost_limit_top(e->phase_limit_s[p]);
		json_object_set_new(o, "phase", json_string(cost_phase_names[p]));
		json_object_set_new(o, "serial_s", cli_jnum(e->phase_s[p]));
		json_object_set_new(o, "hidden_s", cli_jnum(e->phase_hidden_s[p]));
		json_object_set_new(o, "limited_by", top >= 0 ? json_string(cost_limit_name(&g->mesh, top, lim, sizeof lim))
		                                               : json_null());
		json_array_append_new(a, o);
	}
	return a;
}

/* print_waits as JSON: {total_s, longest: [...]} */
static json_t *waits_json(const Graph *g, const CostEstimate *e)
{
	int order[WAITS_SHOWN];
	double total;
	int n = waits_sorted(e, order, &total);
	json_t *o = json_object(), *a = json_array();
	json_object_set_new(o, "total_s", cli_jnum(total));
	for (int k = 0; k < n; k++) {
		const OpEstimate *w = &e->op[order[k]];
		const Op *op = &g->ops.a[order[k]];
		json_t *x = json_object();
		json_object_set_new(x, "seconds", cli_jnum(w->wait));
		json_object_set_new(x, "op", json_string(op_name(g, order[k])));
		json_object_set_new(x, "op_kind", json_string(op_table[op->kind].name));
		json_object_set_new(x, "line", op->pos.line ? json_integer(op->pos.line) : json_null());
		json_object_set_new(x, "collective", w->wait_on >= 0 ? json_string(op_name(g, w->wait_on)) : json_null());
		json_object_set_new(x, "collective_kind",
		                    w->wait_on >= 0 ? json_string(op_table[g->ops.a[w->wait_on].kind].name) : json_null());
		const OpEstimate *c = w->wait_on >= 0 ? &e->op[w->wait_on] : NULL;
		bool held = c && c->behind >= 0 && c->delay > 0;
		json_object_set_new(x, "collective_delay_s", cli_jnum(c ? c->delay : 0));
		json_object_set_new(x, "behind", held ? json_string(op_name(g, c->behind)) : json_null());
		json_object_set_new(x, "behind_kind", held ? json_string(op_table[g->ops.a[c->behind].kind].name) : json_null());
		json_array_append_new(a, x);
	}
	json_object_set_new(o, "longest", a);
	return o;
}

static json_t *report_json(const Graph *g, const HwProfile *hw, const CostEstimate *e)
{
	json_t *o = json_object(), *mesh = json_object(), *kinds = json_array(), *colls = json_array(), *axb = json_object();
	for (int x = 0; x < g->mesh.naxes; x++) {
		json_object_set_new(mesh, g->mesh.name[x], json_integer(g->mesh.size[x]));
		json_object_set_new(axb, g->mesh.name[x], cli_jnum(e->axis_bytes[x]));
	}
	json_object_set_new(o, "model", json_string(g->name ? g->name : ""));
	json_object_set_new(o, "mesh", mesh);
	json_object_set_new(o, "devices", json_integer(g->mesh.ndev));
	json_object_set_new(o, "hardware", json_string(hw->name));
	json_object_set_new(o, "step_time_s", cli_jnum(e->serial_s));
	json_object_set_new(o, "step_time_overlapped_s", cli_jnum(e->overlapped_s));
	json_object_set_new(o, "first_step_time_s", cli_jnum(e->first_step_s));
	json_object_set_new(o, "phases", phases_json(g, e));
	json_object_set_new(o, "waits", waits_json(g, e));
	json_object_set_new(o, "compute_s", cli_jnum(e->compute_s));
	json_object_set_new(o, "communication_s", cli_jnum(e->comm_s));
	json_object_set_new(o, "communication_streams", json_integer(e->nlanes));
	json_object_set_new(o, "busiest_link_s", cli_jnum(e->link_busy_s));
	json_object_set_new(o, "host_wait_s", cli_jnum(e->wait_s));
	json_object_set_new(o, "dispatch_s", cli_jnum(e->dispatch_s));
	json_object_set_new(o, "flops_per_device", cli_jnum(e->flops));
	json_object_set_new(o, "kernels", json_integer(e->nkernels));
	int order[OP_COUNT], nk = kinds_sorted(e, order);
	for (int i = 0; i < nk; i++) {
		json_t *k = json_object();
		json_object_set_new(k, "op", json_string(op_table[order[i]].name));
		json_object_set_new(k, "count", json_integer(e->kind_n[order[i]]));
		json_object_set_new(k, "seconds", cli_jnum(e->kind_s[order[i]]));
		json_array_append_new(kinds, k);
	}
	CollRow *rows = xcalloc((size_t)g->ops.n + 1, sizeof *rows);
	int nr = coll_rows(g, e, rows);
	for (int i = 0; i < nr; i++) {
		json_t *c = json_object();
		json_object_set_new(c, "op", json_string(op_table[rows[i].kind].name));
		json_object_set_new(c, "axes", axes_json(g, rows[i].cax, rows[i].ncax));
		json_object_set_new(c, "count", json_integer(rows[i].count));
		json_object_set_new(c, "bytes_per_device", cli_jnum(rows[i].bytes));
		json_object_set_new(c, "bytes_sent_per_device", cli_jnum(rows[i].sent));
		json_object_set_new(c, "seconds", cli_jnum(rows[i].seconds));
		json_array_append_new(colls, c);
	}
	free(rows);
	json_object_set_new(o, "by_op_kind", kinds);
	json_object_set_new(o, "collectives", colls);
	json_object_set_new(o, "bytes_sent_per_axis", axb);
	json_object_set_new(o, "memory", memory_json(g, hw, e));
	return o;
}

/* ---- --compare-run ---- */

static double rel_error(double pred, double meas) { return meas > 0 ? (pred - meas) / meas : 0; }

/* Predicted against measured per op kind and in total; into j when not NULL,
 * else printed. */
static void compare(const Graph *g, const CostEstimate *e, const double *sec, int runs, json_t *j)
{
	double meas[OP_COUNT] = {0}, total = 0;
	for (int i = 0; i < g->ops.n; i++)
		meas[g->ops.a[i].kind] += sec[i], total += sec[i];
	int order[OP_COUNT], nk = kinds_sorted(e, order);
	json_t *kinds = json_array();
	char a[32], b[32];
	const char *blas = getenv("OPENBLAS_NUM_THREADS");
	bool one = blas && strcmp(blas, "1") == 0;
	if (!j && !one)
		printf("\nnote: OPENBLAS_NUM_THREADS is not 1: BLAS threads compete with the device threads and the\n"
		       "measured times include it (docs/cost_model.md, \"Measured error\")\n");
	if (!j)
		printf("\ncompare with the thread backend (the wall-clock step of the fastest of %d runs; by op kind:\n"
		       "the device that finished last, its time between kernels spread over its ops)\n%-22s %12s %12s %9s\n",
		       runs, "op kind", "predicted", "measured", "error");
	for (int i = 0; i < nk; i++) {
		int k = order[i];
		double err = rel_error(e->kind_s[k], meas[k]);
		if (!j)
			printf("%-22s %12s %12s %+8.1f%%\n", op_table[k].name, fmt_time(e->kind_s[k], a, sizeof a),
			       fmt_time(meas[k], b, sizeof b), 100 * err);
		json_t *o = json_object();
		json_object_set_new(o, "op", json_string(op_table[k].name));
		json_object_set_new(o, "predicted_s", cli_jnum(e->kind_s[k]));
		json_object_set_new(o, "measured_s", cli_jnum(meas[k]));
		json_object_set_new(o, "error", cli_jnum(err));
		json_array_append_new(kinds, o);
	}
	double err = rel_error(e->serial_s, total);
	if (!j) {
		printf("%-22s %12s %12s %+8.1f%%\n", "total", fmt_time(e->serial_s, a, sizeof a), fmt_time(total, b, sizeof b),
		       100 * err);
		json_decref(kinds);
		return;
	}
	json_t *c = json_object();
	json_object_set_new(c, "runs", json_integer(runs));
	json_object_set_new(c, "blas_one_thread", json_boolean(one));
	json_object_set_new(c, "by_op_kind", kinds);
	json_object_set_new(c, "predicted_s", cli_jnum(e->serial_s));
	json_object_set_new(c, "measured_s", cli_jnum(total));
	json_object_set_new(c, "error", cli_jnum(err));
	json_object_set_new(j, "compare_run", c);
}

/* ---- --sensitivity ---- */

enum { NFIGURES = 11 };
static const char *const figure_names[NFIGURES] = {
	"compute (matrix peak)", "vector_flops", "transcendentals", "memory bandwidth", "kernel_overhead",
	"matrix_overhead", "collective_overhead", "link_bandwidth", "latency", "dcn bandwidth", "dcn latency"};

/* Figure f of p (the matrix peak: its f32 entry), for doubling. */
static double *figure(HwProfile *p, int f)
{
	double *x[NFIGURES] = {&p->flops[DT_F32], &p->vector_flops,    &p->transcendentals,   &p->mem_bw,
	                       &p->kernel_overhead, &p->matrix_overhead, &p->collective_overhead, &p->link_bw,
	                       &p->latency,         &p->dcn_bw,          &p->dcn_latency};
	return x[f];
}

/* The steady-state step with each figure of hw that is set doubled (the
 * matrix peak: every dtype's); into j when not NULL, else printed. */
static void sensitivity(const Graph *g, const HwProfile *hw, const CostStep *st, const CostEstimate *e, json_t *j)
{
	json_t *arr = json_array();
	char a[32];
	if (!j)
		printf("\n%-24s %12s %12s %9s\n", "figure doubled", "value", "steady step", "change");
	for (int f = 0; f < NFIGURES; f++) {
		HwProfile h = *hw;
		double v = *figure(&h, f);
		if (v <= 0)
			continue;
		*figure(&h, f) = 2 * v;
		for (int t = 0; f == 0 && t < DT_COUNT; t++)
			h.flops[t] = 2 * hw->flops[t];
		CostEstimate d;
		cost_estimate_step(g, &h, st, &d);
		double change = e->overlapped_s > 0 ? (d.overlapped_s - e->overlapped_s) / e->overlapped_s : 0;
		if (!j)
			printf("%-24s %12.4g %12s %+8.1f%%\n", figure_names[f], v, fmt_time(d.overlapped_s, a, sizeof a),
			       100 * change);
		json_t *o = json_object();
		json_object_set_new(o, "figure", json_string(figure_names[f]));
		json_object_set_new(o, "value", cli_jnum(v));
		json_object_set_new(o, "step_time_overlapped_s", cli_jnum(d.overlapped_s));
		json_object_set_new(o, "change", cli_jnum(change));
		json_array_append_new(arr, o);
		cost_estimate_free(&d);
	}
	if (j)
		json_object_set_new(j, "sensitivity", arr);
	else
		json_decref(arr);
}

static int cost_model_file(const CliParse *p, const char *path)
{
	Graph model, prog;
	Diag d;
	diag_init(&d);
	HwProfile hw;
	CostStep step = {0};
	WusReport passes = {0};
	const OrderReport *order = &passes.order;
	const WindowReport *window = &passes.window;
	const char *note;
	uint64_t runs = 5;
	int64_t floor = -1; /* what every partition of the model on its devices holds at once */
	LoadOpts lo = {cli_get(p, O_MESH), cli_get(p, O_AXIS_RULES)};
	int rc = cli_get(p, O_RUNS) ? cli_uint("cost", "runs", cli_get(p, O_RUNS), &runs) : 0;
	if (rc == 0 && (runs < 1 || runs > 1000)) {
		fprintf(stderr, "spmd cost: error: expected --runs from 1 to 1000, found %llu\n", (unsigned long long)runs);
		rc = 2;
	}
	if (rc == 0)
		rc = cost_prepare_opts(path, &lo, -1, &model, &prog, &step, &passes, &floor, &d) == 0 &&
		             cli_hardware(&model, cli_get(p, O_HARDWARE), &hw, &note, &d) == 0 ? 0 : 2;
	else
		graph_init(&model), graph_init(&prog);
	CostEstimate e = {0};
	double *sec = NULL;
	CostRun run = {0};
	PipeCost pc = {0};
	PipeCompare pcmp = {0};
	if (rc == 0)
		cost_estimate_step(&prog, &hw, &step, &e);
	if (rc == 0 && cli_flag(p, O_SWEEP) && !model.pipeline) {
		fprintf(stderr, "spmd cost: error: expected a model with a pipeline section for --pipeline-sweep, found none\n");
		rc = 2;
	}
	if (rc == 0 && model.pipeline && cost_pipeline(&prog, &hw, &e, model.pipeline, &pc) != 0) {
		diag_error(&d, model.pipeline->pos, "expected a schedule that can finish, found one that waits on itself");
		rc = 2;
	}
	if (rc == 0 && model.pipeline && cli_flag(p, O_COMPARE)) /* the pipelined program, not the priced one */
		rc = pipeline_compare_run(path, &lo, &model, (int)runs, &pcmp, &d) == 0 ? 0 : 2;
	else if (rc == 0) {
		if (cli_flag(p, O_COMPARE)) {
			sec = xcalloc((size_t)prog.ops.n + 1, sizeof *sec);
			rc = cost_run(&model, &prog, (int)runs, &run, &d) == 0 ? 0 : 2;
			if (rc == 0)
				cost_run_attribute(&prog, &run, sec);
		}
	}
	if (rc == 0 && cli_get(p, O_TRACE))
		rc = cost_trace_write(cli_get(p, O_TRACE), &prog, &e, sec ? &run : NULL, &d) == 0 ? 0 : 2;
	cost_run_free(&run);
	if (rc == 0 && cli_flag(p, O_JSON)) {
		json_t *j = report_json(&prog, &hw, &e);
		if (floor >= 0)
			json_object_set_new(json_object_get(j, "memory"), "floor_bytes", json_integer(floor));
		if (window->hw[0])
			json_object_set_new(j, "collective_matmul", cli_window_json(window));
		if (order->hw[0])
			json_object_set_new(j, "step_order", cli_order_json(order));
		if (passes.chunk.hw[0])
			json_object_set_new(j, "chunks", cli_chunk_json(&passes.chunk));
		if (model.pipeline)
			json_object_set_new(j, "pipeline", pipeline_json(&model, &e, &pc));
		if (model.pipeline && cli_flag(p, O_SWEEP))
			pipeline_sweep(&model, &prog, &hw, &e, j);
		if (sec)
			compare(&prog, &e, sec, (int)runs, j);
		if (pcmp.prog.ops.n)
			pipeline_compare(&model, &pc, &pcmp, j);
		if (cli_flag(p, O_SENS))
			sensitivity(&prog, &hw, &step, &e, j);
		json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
		fputc('\n', stdout);
		json_decref(j);
	} else if (rc == 0) {
		print_report(&prog, &hw, &e, note);
		char fb[32];
		if (floor >= 0)
			printf("  floor %s: every partition of this model on %d devices holds that much at once\n",
			       fmt_bytes((double)floor, fb, sizeof fb), prog.mesh.ndev);
		char why[1024];
		if (window->hw[0])
			printf("\ncollective matmul: %s\n", cli_window_why(window, why, sizeof why));
		if (order->hw[0])
			printf("%sstep order: %s\n", window->hw[0] ? "" : "\n", cli_order_why(order, why, sizeof why));
		if (passes.chunk.hw[0])
			printf("%schunks: %s\n", window->hw[0] || order->hw[0] ? "" : "\n",
			       cli_chunk_why(&passes.chunk, why, sizeof why));
		const char *chosen = order->hw[0] ? order->hw : window->hw;
		if (chosen[0] && strcmp(chosen, hw.name) != 0) /* the passes price on the mesh's hardware */
			printf("            (chosen on %s, the passes' profile: the mesh's hardware, else tpu-v3; write\n"
			       "            hardware: %s in the mesh to choose it for %s)\n",
			       chosen, hw.name, hw.name);
		if (model.pipeline)
			pipeline_print(&model, &e, &pc);
		if (model.pipeline && cli_flag(p, O_SWEEP))
			pipeline_sweep(&model, &prog, &hw, &e, NULL);
		if (cli_flag(p, O_SENS))
			sensitivity(&prog, &hw, &step, &e, NULL);
		if (sec)
			compare(&prog, &e, sec, (int)runs, NULL);
		if (pcmp.prog.ops.n)
			pipeline_compare(&model, &pc, &pcmp, NULL);
	}
	pipeline_compare_free(&pcmp);
	free(sec);
	cost_pipeline_free(&pc);
	cost_step_free(&step);
	cost_estimate_free(&e);
	graph_free(&prog);
	graph_free(&model);
	return rc;
}

int cmd_cost(int argc, char **argv)
{
	static const CliCommand c = {"cost", "MODEL.yaml",
	                             "MODEL.yaml [--hardware NAME|FILE] [--json] [--sensitivity] [--compare-run] "
	                             "[--trace FILE.json] [--pipeline-sweep]",
	                             cost_desc, cost_opts, NCOST_OPTS, cost_model_file};
	return cli_main(&c, argc, argv);
}
