/* cmd_partition.c: `spmd partition MODEL.yaml` — the program every device runs, and why. */
#include <jansson.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "../spmd/emit.h"
#include "../spmd/load.h"
#include "../spmd/ops.h"
#include "../partitioner/partition.h"
#include "../partitioner/pipeline.h"
#include "../sharding_spec/reshard.h"

enum { O_JSON, O_OUT, O_PER_DEVICE, O_MESH, O_AXIS_RULES, NPART_OPTS };

static const CliOpt part_opts[NPART_OPTS] = {
	[O_JSON] = {"json", NULL, "print the report as JSON on stdout (values, collectives, bytes)"},
	[O_OUT] = {"o", "PROGRAM.yaml", "write the SPMD program in the model format"},
	[O_PER_DEVICE] = {"per-device", "DIR", "write one program per device into DIR (mpirun -np N spmd run DIR --backend mpi runs them, one per rank)"},
	[O_MESH] = CLI_MESH_OPT,
	[O_AXIS_RULES] = CLI_AXIS_RULES_OPT,
};

static const char part_desc[] =
	"Propagate shardings and partition the model into the program every device\n"
	"runs: local shapes, local ops, and the collectives that keep the result\n"
	"equal to the unpartitioned model.  Every collective says why it is there.\n"
	"A model with a train: section is written as its whole training step: the\n"
	"optimizer state, gradients, collectives, the update, and which result\n"
	"replaces which param or state at the next step (spmd run trains it);\n"
	"its gradients' reductions and updates run in the backward pass where\n"
	"the cost model on the mesh's hardware calls that faster (the listing's\n"
	"step order: line says, and the collectives it waits for issued sooner;\n"
	"docs/training.md).  Gathers and scatters next to einsums are split into\n"
	"blocks sent round the ring while the einsum runs, and an all_reduce of\n"
	"an einsum's sums into blocks reduced while the next is einsummed, where\n"
	"that cost model calls it faster (collective matmul), and a long\n"
	"collective that holds back one needed sooner is cut into chunks where\n"
	"faster (chunks; the listing says both, docs/partitioning.md).";

/* Bytes a device hands to collective op, and what it sends on a ring. */
static void op_bytes(const Graph *g, const Op *op, int64_t *bytes, int64_t *sent)
{
	const Value *in = &g->values.a[op->in[0]];
	*bytes = shape_numel(&in->shape) * dtype_size(in->dtype);
	int64_t n = 1;
	for (int i = 0; i < op->attr->ncax; i++)
		n *= g->mesh.size[op->attr->cax[i]];
	*sent = reshard_bytes_sent(op_reshard_kind(op->kind), *bytes, n);
}

static void axes_text(const Graph *g, const Op *op, char *buf, size_t n)
{
	mesh_axes_text(&g->mesh, op->attr->cax, op->attr->ncax, buf, n);
}

/* "einsum bd,df->bf" / "all_reduce [model] sum" / "all_gather [data] dim 0" */
static void op_text(const Graph *g, const Op *op, char *buf, size_t n)
{
	const Attr *at = op->attr;
	char axes[128];
	axes_text(g, op, axes, sizeof axes);
	switch (op->kind) {
	case OP_EINSUM: snprintf(buf, n, "einsum %s", at->eq); break;
	case OP_ALL_REDUCE: snprintf(buf, n, "all_reduce [%s] %s", axes, at->reduce ? "max" : "sum"); break;
	case OP_REDUCE_SCATTER:
		snprintf(buf, n, "reduce_scatter [%s] %s dim %d", axes, at->reduce ? "max" : "sum", at->dim);
		break;
	case OP_ALL_GATHER: snprintf(buf, n, "all_gather [%s] dim %d", axes, at->dim); break;
	case OP_ALL_TO_ALL: snprintf(buf, n, "all_to_all [%s] dims %d->%d", axes, at->dim, at->dim2); break;
	case OP_COLLECTIVE_PERMUTE: snprintf(buf, n, "collective_permute [%s]", axes); break;
	case OP_SHARD_ROLL: snprintf(buf, n, "shard_roll [%s] dim %d shift %lld", axes, at->dim, (long long)at->shift); break;
	default: snprintf(buf, n, "%s", op_table[op->kind].name);
	}
}

/* A pipelined program: per stage coordinate, its ops and sends in the
 * order it runs them (the listing below is that order, all devices merged). */
static void print_stages(const Graph *g, FILE *out)
{
	int p = g->mesh.size[g->stage_axis];
	fprintf(out, "pipelined over %s: device coordinate c on it runs the ops of stages c, c + %d, ... in listing order\n",
	        g->mesh.name[g->stage_axis], p);
	for (int c = 0; c < p; c++) {
		int nops = 0, nsend = 0, nrecv = 0;
		for (int i = 0; i < g->ops.n; i++) {
			const Op *op = &g->ops.a[i];
			if (!op_runs_on(g, op, c))
				continue;
			nops++;
			if (op->stage_to >= 0 && op->stage % p == c)
				nsend++;
			else if (op->stage_to >= 0)
				nrecv++;
		}
		fprintf(out, "  %s %d: %d ops, %d sends, %d receives\n", g->mesh.name[g->stage_axis], c, nops, nsend, nrecv);
	}
}

static void print_listing(const Graph *g, FILE *out)
{
	char mesh[128], shape[64], spec[128], text[256];
	mesh_format(&g->mesh, mesh, sizeof mesh);
	fprintf(out, "program %s on mesh %s (%d devices); shapes are per device\n", g->name ? g->name : "(unnamed)",
	        g->mesh.naxes ? mesh : "none", g->mesh.ndev);
	if (g->stage_axis >= 0)
		print_stages(g, out);
	for (int v = 0; v < g->values.n; v++) {
		const Value *val = &g->values.a[v];
		if (val->producer >= 0 || val->kind == VK_CONST)
			continue;
		shape_format(&val->shape, shape, sizeof shape);
		spec_format(&val->spec, &g->mesh, spec, sizeof spec);
		fprintf(out, "  %-6s %-14s %-4s %-16s %s\n", val->kind == VK_PARAM ? "param" : "input", val->name,
		        dtype_names[val->dtype], shape, spec);
	}
	int64_t total = 0;
	int ncoll = 0;
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		const Value *val = &g->values.a[op->out];
		op_text(g, op, text, sizeof text);
		size_t k = strlen(text);
		for (int j = 0; j < op->nin && k < sizeof text; j++) {
			const Value *in = &g->values.a[op->in[j]];
			char num[32];
			snprintf(num, sizeof num, "%g", in->cval);
			k += (size_t)snprintf(text + k, sizeof text - k, "%s%s", j ? ", " : " (",
			                      in->kind == VK_CONST ? num : in->name);
		}
		if (k < sizeof text)
			snprintf(text + k, sizeof text - k, ")");
		shape_format(&val->shape, shape, sizeof shape);
		spec_format(&val->spec, &g->mesh, spec, sizeof spec);
		char stage[48] = "";
		if (op->stage >= 0 && op->stage_to >= 0)
			snprintf(stage, sizeof stage, "  stage %d -> %d", op->stage, op->stage_to);
		else if (op->stage >= 0)
			snprintf(stage, sizeof stage, "  stage %d", op->stage);
		fprintf(out, "  %-16s = %-44s %-16s %s%s\n", val->name, text, shape, spec, stage);
		if (op_table[op->kind].flags & OPF_COLLECTIVE) {
			int64_t bytes, sent;
			op_bytes(g, op, &bytes, &sent);
			total += bytes, ncoll++;
			fprintf(out, "  %18s %lld bytes per device: %s\n", "#", (long long)bytes, op->why ? op->why : "");
		}
	}
	fprintf(out, "outputs:");
	for (int i = 0; i < g->outputs.n; i++)
		fprintf(out, " %s", g->values.a[g->outputs.a[i]].name);
	fprintf(out, "\n%d collective%s, %lld bytes per device\n", ncoll, ncoll == 1 ? "" : "s", (long long)total);
}

static json_t *shape_json(const Shape *s)
{
	json_t *a = json_array();
	for (int d = 0; d < s->rank; d++)
		json_array_append_new(a, json_integer(s->dim[d]));
	return a;
}

static json_t *spec_dims_json(const Graph *g, const Spec *s)
{
	json_t *a = json_array();
	for (int d = 0; d < s->rank; d++) {
		int ax[MESH_MAX_AXES];
		for (int k = 0; k < s->nax[d]; k++)
			ax[k] = s->ax[d][k];
		json_t *l = cli_jaxes(&g->mesh, ax, s->nax[d]);
		if (json_array_size(l) == 0)
			json_array_append_new(a, json_null()), json_decref(l);
		else if (json_array_size(l) == 1)
			json_array_append(a, json_array_get(l, 0)), json_decref(l);
		else
			json_array_append_new(a, l);
	}
	return a;
}

static json_t *value_json(const Graph *g, const Value *v)
{
	int ax[MESH_MAX_AXES], n = 0;
	for (int a = 0; a < g->mesh.naxes; a++)
		if (v->spec.partial >> a & 1)
			ax[n++] = a;
	json_t *o = json_object(), *partial = cli_jaxes(&g->mesh, ax, n);
	json_object_set_new(o, "sharding", spec_dims_json(g, &v->spec));
	json_object_set_new(o, "partial", partial);
	json_object_set_new(o, "local_shape", shape_json(&v->shape));
	json_object_set_new(o, "global_shape", shape_json(&v->global));
	return o;
}

static json_t *collective_json(const Graph *g, const Op *op, int64_t *total, int64_t *total_sent)
{
	json_t *o = json_object(), *axes = cli_jaxes(&g->mesh, op->attr->cax, op->attr->ncax);
	int64_t bytes, sent;
	op_bytes(g, op, &bytes, &sent);
	*total += bytes, *total_sent += sent;
	json_object_set_new(o, "op", json_string(op_table[op->kind].name));
	json_object_set_new(o, "axes", axes);
	json_object_set_new(o, "bytes_per_device", json_integer(bytes));
	json_object_set_new(o, "bytes_sent_per_device", json_integer(sent));
	json_object_set_new(o, "value", json_string(g->values.a[op->out].name));
	json_object_set_new(o, "reason", json_string(op->why ? op->why : ""));
	if (op->stage >= 0) /* a pipeline: the stage that runs it, and a send's receiving stage */
		json_object_set_new(o, "stage", json_integer(op->stage));
	if (op->stage_to >= 0)
		json_object_set_new(o, "stage_to", json_integer(op->stage_to));
	return o;
}

/* The report: every model value under its YAML name, every collective. */
static json_t *report_json(const Graph *model, const Graph *g, const int *map)
{
	json_t *root = json_object(), *values = json_object(), *colls = json_array();
	for (int v = 0; v < model->values.n; v++)
		if (model->values.a[v].kind != VK_CONST && map[v] >= 0) /* < 0: a pipeline's value, per microbatch */
			json_object_set_new(values, model->values.a[v].name, value_json(g, &g->values.a[map[v]]));
	int64_t total = 0, sent = 0;
	for (int i = 0; i < g->ops.n; i++)
		if (op_table[g->ops.a[i].kind].flags & OPF_COLLECTIVE)
			json_array_append_new(colls, collective_json(g, &g->ops.a[i], &total, &sent));
	json_object_set_new(root, "values", values);
	json_object_set_new(root, "collectives", colls);
	json_object_set_new(root, "total_bytes_per_device", json_integer(total));
	json_object_set_new(root, "total_bytes_sent_per_device", json_integer(sent));
	return root;
}

/* -o PROGRAM.yaml and --per-device DIR.  0, or 2 after reporting. */
static int write_program(const CliParse *p, const Graph *prog, Diag *d)
{
	const char *out = cli_get(p, O_OUT), *dir = cli_get(p, O_PER_DEVICE);
	if (out && emit_program(prog, out, d) != 0)
		return 2;
	if (dir && emit_devices(prog, dir, d) != 0)
		return 2;
	return 0;
}

/* Which params' updates are sharded, how and why. */
static json_t *wus_json(const Graph *g, const WusReport *w)
{
	json_t *a = json_array();
	for (int i = 0; i < w->n; i++) {
		const WusParam *wp = &w->p[i];
		json_t *o = json_object(), *axes = json_array();
		for (int k = 0; k < g->mesh.naxes; k++)
			if (wp->axes >> k & 1)
				json_array_append_new(axes, json_string(g->mesh.name[k]));
		json_object_set_new(o, "param", json_string(g->values.a[wp->param].name));
		json_object_set_new(o, "sharded", json_boolean(wp->sharded));
		json_object_set_new(o, "how", json_string(wp->sharded ? "dimension" : "none"));
		json_object_set_new(o, "dim", wp->sharded ? json_integer(wp->dim) : json_null());
		json_object_set_new(o, "axes", axes);
		json_object_set_new(o, "padding", json_integer(wp->padding));
		json_object_set_new(o, "bytes", json_integer(wp->bytes));
		json_object_set_new(o, "reason", json_string(wp->why ? wp->why : ""));
		json_array_append_new(a, o);
	}
	return a;
}

static void print_wus(const Graph *g, const WusReport *w, FILE *out)
{
	if (w->n)
		fprintf(out, "weight-update sharding:\n");
	for (int i = 0; i < w->n; i++)
		fprintf(out, "  %-14s %-9s %s\n", g->values.a[w->p[i].param].name, w->p[i].sharded ? "sharded" : "whole",
		        w->p[i].why ? w->p[i].why : "");
	char why[1024];
	if (w->window.hw[0])
		fprintf(out, "collective matmul: %s\n", cli_window_why(&w->window, why, sizeof why));
	if (w->order.hw[0])
		fprintf(out, "step order: %s\n", cli_order_why(&w->order, why, sizeof why));
	if (w->chunk.hw[0])
		fprintf(out, "chunks: %s\n", cli_chunk_why(&w->chunk, why, sizeof why));
}

static int partition_model(const CliParse *p, const char *path)
{
	Graph g, prog;
	Diag d;
	diag_init(&d);
	WusReport wus;
	int rc = 0;
	LoadOpts lo = {cli_get(p, O_MESH), cli_get(p, O_AXIS_RULES)};
	if (cli_load_model(&g, path, &lo, true, &d) != 0) {
		graph_free(&g);
		return 2;
	}
	int *map = NULL;
	HwProfile hw;
	cli_pass_prices(&g, &hw);
	rc = pipeline_partition(&g, &hw, &prog, &map, &wus, &d) == 0 ? 0 : 2;
	if (rc == 0) /* the files first: a failure prints no listing */
		rc = write_program(p, &prog, &d);
	if (rc == 0 && cli_flag(p, O_JSON)) {
		json_t *j = report_json(&g, &prog, map);
		json_object_set_new(j, "weight_update_sharding", wus_json(&g, &wus));
		if (wus.window.hw[0])
			json_object_set_new(j, "collective_matmul", cli_window_json(&wus.window));
		if (wus.order.hw[0])
			json_object_set_new(j, "step_order", cli_order_json(&wus.order));
		if (wus.chunk.hw[0])
			json_object_set_new(j, "chunks", cli_chunk_json(&wus.chunk));
		json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		fputc('\n', stdout);
		json_decref(j);
	} else if (rc == 0) {
		print_listing(&prog, stdout);
		print_wus(&g, &wus, stdout);
	}
	free(map);
	graph_free(&prog);
	graph_free(&g);
	return rc;
}

int cmd_partition(int argc, char **argv)
{
	static const CliCommand c = {"partition", "MODEL.yaml", "MODEL.yaml [--json] [-o PROGRAM.yaml] [--per-device DIR]",
	                             part_desc, part_opts, NPART_OPTS, partition_model};
	return cli_main(&c, argc, argv);
}
