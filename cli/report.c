/* report.c: the HTML report — sections of tables and inline SVG charts. */
#include "report.h"

#include <string.h>

#include "cli.h"
#include "svg.h"
#include "tilemap.h"
#include "trace.h"
#include "../spmd/ops.h"

static const char css[] =
	"body{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222;"
	"padding:0 16px}h1{font-size:24px}h2{font-size:19px;border-bottom:1px solid #ccc;padding-bottom:4px;"
	"margin-top:32px}table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ddd;"
	"padding:3px 8px;text-align:left;vertical-align:top}th{background:#f2f2f2}td.n{text-align:right}"
	".tm{display:inline-block;vertical-align:top;margin:8px 24px 20px 0;max-width:100%;overflow-x:auto}.note{color:#555;font-size:13px}svg{display:block}";

static void esc(FILE *out, const char *s) { xml_escape(out, s ? s : ""); }

/* <svg> opening for inline use (the <defs> are in the page once). */
static void svg_open(FILE *out, double w, double h)
{
	fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">\n",
	        w, h, w, h);
}

/* ---- summary and mesh ---- */

static void summary(const Report *r, FILE *out)
{
	const Graph *g = r->model;
	char mesh[128] = "none", a[32], b[32];
	if (g->mesh.naxes)
		mesh_format(&g->mesh, mesh, sizeof mesh);
	fprintf(out, "<h1>");
	esc(out, g->name ? g->name : r->path);
	fprintf(out, "</h1>\n<table><tr><th>model file</th><td>");
	esc(out, r->path);
	fprintf(out, "</td></tr><tr><th>mesh</th><td>%s (%d device%s)</td></tr>", mesh, g->mesh.ndev,
	        g->mesh.ndev == 1 ? "" : "s");
	fprintf(out, "<tr><th>values / ops</th><td>%d / %d in the model, %d / %d in the partitioned program</td></tr>",
	        g->values.n, g->ops.n, r->prog->values.n, r->prog->ops.n);
	fprintf(out, "<tr><th>parameters</th><td>%lld</td></tr><tr><th>FLOPs of one evaluation</th><td>%.4g</td></tr>",
	        (long long)graph_param_count(g), graph_flops(g));
	fprintf(out, "<tr><th>hardware</th><td>");
	esc(out, r->hw->name);
	fprintf(out, "</td></tr><tr><th>step time per device</th><td>%s serial, %s overlapped</td></tr>",
	        fmt_seconds(r->est->serial_s, a, sizeof a), fmt_seconds(r->est->overlapped_s, b, sizeof b));
	fprintf(out, "<tr><th>peak memory per device</th><td>%s of %s: %s</td></tr></table>\n",
	        fmt_size((double)r->est->mem.peak, a, sizeof a), fmt_size(r->hw->mem_capacity, b, sizeof b),
	        r->est->fits ? "fits" : "does not fit");
}

enum { MESH_CELL = 128, MESH_CAP = 16 };

/* Devices on a grid: the last axis across, the others (row-major) down. */
static void mesh_picture(const Graph *g, FILE *out)
{
	const Mesh *m = &g->mesh;
	int ncol = m->naxes ? m->size[m->naxes - 1] : 1, nrow = m->ndev / ncol;
	int sc = ncol < MESH_CAP ? ncol : MESH_CAP, sr = nrow < MESH_CAP ? nrow : MESH_CAP;
	fprintf(out, "<h2>Mesh</h2>\n<p class=\"note\">Each box is a device: its id and its coordinate on every axis%s.</p>\n",
	        m->naxes > 1 ? "; the last axis runs across, the others down" : "");
	svg_open(out, sc * MESH_CELL + 40.0, sr * 56.0 + 20);
	for (int rr = 0; rr < sr; rr++)
		for (int cc = 0; cc < sc; cc++) {
			int coord[MESH_MAX_AXES], pos = rr * ncol + cc, rest = rr;
			for (int a = m->naxes - 2; a >= 0; a--)
				coord[a] = rest % m->size[a], rest /= m->size[a];
			if (m->naxes)
				coord[m->naxes - 1] = cc;
			int dev = m->naxes ? mesh_coords_device(m, coord) : pos;
			double x = 4 + cc * MESH_CELL, y = 4 + rr * 56.0;
			fprintf(out, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%d\" height=\"50\" fill=\"#eef3f8\" stroke=\"#446\"/>\n", x,
			        y, MESH_CELL - 6);
			svg_text(out, x + 6, y + 18, 13, "start", "device %d", dev);
			char c[96];
			size_t k = 0;
			c[0] = 0;
			for (int a = 0; a < m->naxes && k < sizeof c; a++)
				k += (size_t)snprintf(c + k, sizeof c - k, "%s%s=%d", a ? " " : "", m->name[a], coord[a]);
			svg_text(out, x + 6, y + 38, 10, "start", "%s", c);
		}
	if (sc < ncol || sr < nrow)
		svg_text(out, sc * MESH_CELL + 8.0, 30, 18, "start", "\xe2\x80\xa6");
	fprintf(out, "</svg>\n");
}

/* ---- values ---- */

static void tile_map(const Graph *prog, int v, FILE *out)
{
	const Value *val = &prog->values.a[v];
	TileMap t;
	double w, h;
	tilemap_init(&t, val->name, val->dtype, &val->global, &val->spec, &prog->mesh);
	tilemap_svg_size(&t, &w, &h);
	fprintf(out, "<div class=\"tm\">");
	svg_open(out, w + 8, h + 8);
	tilemap_svg(&t, out, 4, 4);
	fprintf(out, "</svg></div>\n");
	tilemap_free(&t);
}

/* Every param, then every other annotated value, with its tile map. */
static void values(const Report *r, FILE *out)
{
	fprintf(out, "<h2>Params and annotated values</h2>\n<p class=\"note\">Tiles of the global tensor and the devices "
	             "holding them; hatching is padding of an uneven split, a dashed border a partial sum.  "
	             "<code>spmd show MODEL VALUE</code> draws any other value.</p>\n");
	for (int pass = 0; pass < 2; pass++)
		for (int v = 0; v < r->model->values.n; v++) {
			const Value *mv = &r->model->values.a[v];
			bool param = mv->kind == VK_PARAM;
			if (mv->kind == VK_CONST || (pass == 0 ? !param : param || !mv->has_spec) || r->map[v] < 0)
				continue;
			tile_map(r->prog, r->map[v], out);
		}
}

/* "all_reduce [model]" */
static void coll_label(const Graph *g, const Op *op, char *buf, size_t n)
{
	size_t k = (size_t)snprintf(buf, n, "%s [", op_table[op->kind].name);
	if (k < n)
		mesh_axes_text(&g->mesh, op->attr->cax, op->attr->ncax, buf + k, n - k);
	k = strlen(buf);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

static int64_t coll_bytes(const Graph *g, const Op *op)
{
	const Value *in = &g->values.a[op->in[0]];
	return shape_numel(&in->shape) * dtype_size(in->dtype);
}

static void collectives(const Report *r, FILE *out)
{
	const Graph *g = r->prog;
	char label[256], a[32], b[32];
	fprintf(out, "<h2>Collectives</h2>\n<table><tr><th>value</th><th>collective</th><th>bytes per device</th>"
	             "<th>time</th><th>why</th></tr>\n");
	int n = 0;
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		if (!(op_table[op->kind].flags & OPF_COLLECTIVE))
			continue;
		coll_label(g, op, label, sizeof label);
		fprintf(out, "<tr><td>");
		esc(out, g->values.a[op->out].name);
		fprintf(out, "</td><td>");
		esc(out, label);
		fprintf(out, "</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td>",
		        fmt_size((double)coll_bytes(g, op), a, sizeof a), fmt_seconds(r->est->op[i].seconds, b, sizeof b));
		esc(out, op->why);
		fprintf(out, "</td></tr>\n");
		n++;
	}
	fprintf(out, "</table>\n");
	if (n == 0)
		fprintf(out, "<p class=\"note\">None: every device computes its part alone.</p>\n");
}

/* ---- charts ---- */

typedef struct {
	char label[96];
	double value;
} Bar;

/* A horizontal bar chart, bars in the given order; fmt formats a value. */
static void bar_chart(FILE *out, const char *title, const Bar *bar, int n,
                      const char *(*fmt)(double, char *, size_t))
{
	double max = 0;
	for (int i = 0; i < n; i++)
		max = bar[i].value > max ? bar[i].value : max;
	fprintf(out, "<h3>");
	esc(out, title);
	fprintf(out, "</h3>\n");
	if (n == 0 || max <= 0) {
		fprintf(out, "<p class=\"note\">nothing to show</p>\n");
		return;
	}
	svg_open(out, 760, n * 24.0 + 8);
	for (int i = 0; i < n; i++) {
		char v[32];
		double y = 4 + i * 24.0, w = 420 * bar[i].value / max;
		svg_text(out, 200, y + 15, 12, "end", "%s", bar[i].label);
		fprintf(out, "<rect x=\"208\" y=\"%.0f\" width=\"%.1f\" height=\"18\" fill=\"%s\"/>\n", y, w > 1 ? w : 1,
		        palette_fill(i));
		svg_text(out, 214 + w, y + 15, 12, "start", "%s", fmt(bar[i].value, v, sizeof v));
	}
	fprintf(out, "</svg>\n");
}

/* Sort bars by value, largest first. */
static void bars_sort(Bar *bar, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && bar[j].value > bar[j - 1].value; j--) {
			Bar t = bar[j];
			bar[j] = bar[j - 1], bar[j - 1] = t;
		}
}

static void cost_charts(const Report *r, FILE *out)
{
	const Graph *g = r->prog;
	const CostEstimate *e = r->est;
	Bar *bar = xcalloc((size_t)(g->ops.n + OP_COUNT + MESH_MAX_AXES) + 1, sizeof *bar);
	int n = 0;
	fprintf(out, "<h2>Cost breakdown (per device, %s)</h2>\n", r->hw->name);
	for (int k = 0; k < OP_COUNT; k++)
		if (e->kind_n[k]) {
			snprintf(bar[n].label, sizeof bar[n].label, "%s (%d)", op_table[k].name, e->kind_n[k]);
			bar[n++].value = e->kind_s[k];
		}
	bars_sort(bar, n);
	bar_chart(out, "time by op kind", bar, n, fmt_seconds);
	n = 0;
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		if (!(op_table[op->kind].flags & OPF_COLLECTIVE))
			continue;
		char label[96];
		coll_label(g, op, label, sizeof label);
		int j = 0;
		while (j < n && strcmp(bar[j].label, label) != 0)
			j++;
		if (j == n)
			snprintf(bar[n++].label, sizeof bar[0].label, "%s", label);
		bar[j].value += e->op[i].seconds;
	}
	bars_sort(bar, n);
	bar_chart(out, "time by collective (kind and mesh axes)", bar, n, fmt_seconds);
	n = 0;
	for (int a = 0; a < g->mesh.naxes; a++) {
		snprintf(bar[n].label, sizeof bar[n].label, "%s", g->mesh.name[a]);
		bar[n++].value = e->axis_bytes[a];
	}
	bar_chart(out, "bytes sent per device by mesh axis", bar, n, fmt_size);
	free(bar);
}

/* ---- memory and timeline ---- */

enum { PLOT_W = 1000, PLOT_H = 220, PLOT_L = 110, LIVE_CAP = 16 };

static int64_t value_size(const Graph *g, int v)
{
	return shape_numel(&g->values.a[v].shape) * dtype_size(g->values.a[v].dtype);
}

static void memory_plot(const Report *r, FILE *out)
{
	const Graph *g = r->prog;
	int n = g->ops.n;
	int64_t *held = xcalloc((size_t)n + 1, sizeof *held), max = 1;
	cost_memory_timeline(g, held);
	for (int i = 0; i < n; i++)
		max = held[i] > max ? held[i] : max;
	char a[32];
	fprintf(out, "<h2>Memory over the step (per device)</h2>\n<p class=\"note\">Bytes held after each op's result is "
	             "made, in program order: params, state and inputs throughout, each result until its last reader.</p>\n");
	svg_open(out, PLOT_W + 20, PLOT_H + 50);
	fprintf(out, "<polyline fill=\"#56B4E9\" fill-opacity=\"0.5\" stroke=\"#0072B2\" stroke-width=\"2\" points=\"%d,%d",
	        PLOT_L, PLOT_H + 10);
	for (int i = 0; i < n; i++) { /* a step per op */
		double x = PLOT_L + (double)(PLOT_W - PLOT_L) * i / n, y = PLOT_H + 10 - (double)PLOT_H * held[i] / max;
		fprintf(out, " %.1f,%.1f %.1f,%.1f", x, y, x + (double)(PLOT_W - PLOT_L) / n, y);
	}
	fprintf(out, " %d,%d\"/>\n", PLOT_W, PLOT_H + 10);
	fprintf(out, "<line x1=\"%d\" y1=\"10\" x2=\"%d\" y2=\"%d\" stroke=\"#222\"/><line x1=\"%d\" y1=\"%d\" x2=\"%d\" "
	             "y2=\"%d\" stroke=\"#222\"/>\n",
	        PLOT_L, PLOT_L, PLOT_H + 10, PLOT_L, PLOT_H + 10, PLOT_W, PLOT_H + 10);
	svg_text(out, PLOT_L - 6, 20, 11, "end", "%s", fmt_size((double)max, a, sizeof a));
	svg_text(out, PLOT_L - 6, PLOT_H + 10, 11, "end", "0");
	svg_text(out, (PLOT_L + PLOT_W) / 2.0, PLOT_H + 40, 12, "middle", "op (program order, %d ops)", n);
	int p = r->est->mem.peak_op;
	if (p >= 0) {
		double x = PLOT_L + (double)(PLOT_W - PLOT_L) * (p + 0.5) / n;
		fprintf(out, "<line x1=\"%.1f\" y1=\"10\" x2=\"%.1f\" y2=\"%d\" stroke=\"#D55E00\" stroke-dasharray=\"4 3\"/>\n",
		        x, x, PLOT_H + 10);
		bool right = x > PLOT_W - 200; /* the label on the side with room */
		svg_text(out, right ? x - 4 : x + 4, 24, 12, right ? "end" : "start", "peak %s at %s",
		         fmt_size((double)r->est->mem.peak, a, sizeof a), g->values.a[g->ops.a[p].out].name);
	}
	fprintf(out, "</svg>\n");
	free(held);
	if (p < 0)
		return;
	int *live = xcalloc((size_t)g->values.n + 1, sizeof *live), nl = cost_live_values(g, p, live);
	for (int i = 1; i < nl; i++) /* largest first */
		for (int j = i; j > 0 && value_size(g, live[j]) > value_size(g, live[j - 1]); j--) {
			int t = live[j];
			live[j] = live[j - 1], live[j - 1] = t;
		}
	fprintf(out, "<p>Live at the peak, besides params, state and inputs (largest first):</p>\n<table><tr><th>value</th>"
	             "<th>local shape</th><th>bytes</th></tr>\n");
	for (int i = 0; i < nl && i < LIVE_CAP; i++) {
		const Value *v = &g->values.a[live[i]];
		char shape[96];
		shape_format(&v->shape, shape, sizeof shape);
		fprintf(out, "<tr><td>");
		esc(out, v->name);
		fprintf(out, "</td><td>%s</td><td class=\"n\">%s</td></tr>\n", shape,
		        fmt_size((double)value_size(g, live[i]), a, sizeof a));
	}
	int64_t rest = 0;
	for (int i = LIVE_CAP; i < nl; i++)
		rest += value_size(g, live[i]);
	if (nl > LIVE_CAP)
		fprintf(out, "<tr><td>\xe2\x80\xa6 %d more</td><td></td><td class=\"n\">%s</td></tr>\n", nl - LIVE_CAP,
		        fmt_size((double)rest, a, sizeof a));
	fprintf(out, "</table>\n");
	free(live);
}

/* Device 0's two streams of the cost model's schedule. */
static void timeline(const Report *r, FILE *out)
{
	Schedule s;
	schedule_from_estimate(r->prog, r->est, &s);
	char a[32];
	fprintf(out, "<h2>Timeline (device 0, the cost model's schedule)</h2>\n<p class=\"note\">Compute, and "
	             "communication on a stream per set of links (collectives on disjoint links run at once); an op "
	             "starts when its operands are ready and its stream is free.  "
	             "<code>spmd cost MODEL --trace FILE.json</code> writes every device's for Perfetto.</p>\n");
	double span = s.span > 0 ? s.span : 1, w = PLOT_W - PLOT_L;
	int rows = 1 + s.nlanes, bottom = 40 * rows + 24;
	svg_open(out, PLOT_W + 20, bottom + 16);
	svg_text(out, PLOT_L - 6, 30, 12, "end", "compute");
	for (int l = 0; l < s.nlanes; l++) {
		char axes[128];
		schedule_lane_axes(r->prog, &s, l, axes, sizeof axes);
		svg_text(out, PLOT_L - 6, 70 + 40 * l, 12, "end", "%s", axes[0] ? axes : "communication");
	}
	for (int k = 0; k < s.n && s.s[k].device == 0; k++) {
		const ScheduleSlice *sl = &s.s[k];
		double x = PLOT_L + w * sl->start / span, sw = w * (sl->end - sl->start) / span, y = 14 + 40 * sl->stream;
		const char *name = r->prog->values.a[r->prog->ops.a[sl->op].out].name;
		fprintf(out, "<g><title>");
		esc(out, name);
		fprintf(out, " (%s): %s</title><rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"26\" fill=\"%s\" "
		             "stroke=\"#fff\" stroke-width=\"0.5\"/>",
		        op_table[r->prog->ops.a[sl->op].kind].name, fmt_seconds(sl->end - sl->start, a, sizeof a), x, y,
		        sw > 0.5 ? sw : 0.5, palette_fill(sl->stream ? 5 : (int)r->prog->ops.a[sl->op].kind % 5));
		if (sw > 7.0 * (double)strlen(name))
			svg_text(out, x + 3, y + 17, 11, "start", "%s", name);
		fprintf(out, "</g>\n");
	}
	svg_text(out, PLOT_L, bottom, 11, "start", "0");
	svg_text(out, PLOT_W, bottom, 11, "end", "%s", fmt_seconds(span, a, sizeof a));
	fprintf(out, "</svg>\n");
	schedule_free(&s);
}

static void weight_update(const Report *r, FILE *out)
{
	char why[1024];
	if (r->wus && r->wus->window.hw[0]) { /* collectives overlapped with their einsums (docs/partitioning.md) */
		fprintf(out, "<h2>Collective matmul</h2>\n<p>");
		esc(out, cli_window_why(&r->wus->window, why, sizeof why));
		fprintf(out, "</p>\n");
	}
	if (r->wus && r->wus->order.hw[0]) { /* where the step's reductions and updates run (docs/training.md) */
		fprintf(out, "<h2>Step order</h2>\n<p>");
		esc(out, cli_order_why(&r->wus->order, why, sizeof why));
		fprintf(out, "</p>\n");
	}
	if (r->wus && r->wus->chunk.hw[0]) { /* long collectives in chunks (docs/partitioning.md) */
		fprintf(out, "<h2>Chunks</h2>\n<p>");
		esc(out, cli_chunk_why(&r->wus->chunk, why, sizeof why));
		fprintf(out, "</p>\n");
	}
	if (!r->wus || r->wus->n == 0)
		return;
	fprintf(out, "<h2>Weight-update sharding</h2>\n<table><tr><th>param</th><th>update</th><th>dim</th><th>over "
	             "axes</th><th>why</th></tr>\n");
	for (int i = 0; i < r->wus->n; i++) {
		const WusParam *w = &r->wus->p[i];
		fprintf(out, "<tr><td>");
		esc(out, r->model->values.a[w->param].name);
		fprintf(out, "</td><td>%s</td><td>", w->sharded ? "sharded" : "whole");
		if (w->sharded)
			fprintf(out, "%d", w->dim);
		fprintf(out, "</td><td>");
		for (int a = 0, first = 1; a < r->model->mesh.naxes; a++)
			if (w->axes >> a & 1) {
				fprintf(out, "%s", first ? "" : ", ");
				esc(out, r->model->mesh.name[a]);
				first = 0;
			}
		fprintf(out, "</td><td>");
		esc(out, w->why);
		fprintf(out, "</td></tr>\n");
	}
	fprintf(out, "</table>\n");
}

void report_html(const Report *r, FILE *out)
{
	fprintf(out, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>spmd report: ");
	esc(out, r->model->name ? r->model->name : r->path);
	fprintf(out, "</title><style>%s</style></head><body>\n", css);
	fprintf(out, "<svg width=\"0\" height=\"0\" style=\"position:absolute\">");
	svg_defs(out);
	fprintf(out, "</svg>\n");
	summary(r, out);
	mesh_picture(r->model, out);
	values(r, out);
	collectives(r, out);
	cost_charts(r, out);
	memory_plot(r, out);
	timeline(r, out);
	weight_update(r, out);
	fprintf(out, "<p class=\"note\">Written by spmd report.  Pictures: docs/pictures.md.</p>\n</body></html>\n");
}
