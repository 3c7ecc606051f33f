/* cmd_reshard.c: `spmd reshard` — print the plan from one sharding to another, optionally run and check it. */
#include "cli.h"
#include "commands.h"
#include "../spmd/ir.h"
#include "../base/yaml.h"
#include "../runtime/threads.h"
#include "../sharding_spec/reshard.h"
#include "reshard_svg.h"

#include <errno.h>
#include <jansson.h>
#include <string.h>

enum { O_MESH, O_DEVICES, O_TO_DEVICES, O_SHAPE, O_DTYPE, O_FROM, O_TO, O_CHECK, O_JSON, O_SVG, O_COUNT };

static const CliOpt opts[O_COUNT] = {
	[O_MESH] = {"mesh", "AXES", "the mesh: NAME=SIZE,... major to minor (e.g. data=2,model=4)"},
	[O_DEVICES] = {"devices", "IDS", "device ids in mesh order, comma-separated (default 0,1,...)"},
	[O_TO_DEVICES] = {"to-devices", "IDS", "another device order for the target layout"},
	[O_SHAPE] = {"shape", "DIMS", "the global shape, comma-separated (e.g. 8,16)"},
	[O_DTYPE] = {"dtype", "TYPE", "element type for byte counts: f32 (default), bf16, f16, f64, i32"},
	[O_FROM] = {"from", "SPEC", "the source sharding, e.g. '[data, null]' or '{dims: [null, null], partial: [model]}'"},
	[O_TO] = {"to", "SPEC", "the target sharding"},
	[O_CHECK] = {"check", NULL, "run the plan on the thread backend and compare with the target layout"},
	[O_JSON] = {"json", NULL, "print the plan as JSON on stdout"},
	[O_SVG] = {"svg", "FILE", "also draw the layouts before and after each step as an SVG (docs/pictures.md)"},
};

enum { CHECK_MAX_ELEMS = 1 << 26 }; /* elements over all devices' buffers for --check */

typedef struct {
	Arena arena;
	Diag d;
	Mesh mesh, mesh_to;
	int rank;
	int64_t dims[MAX_RANK];
	DType dtype;
	Spec from, to;
} Args;

/* A comma-separated list of integers in [lo, hi]; count, or -1 after an error. */
static int parse_ints(Args *A, const char *what, const char *s, int64_t lo, int64_t hi, int64_t *out, int max)
{
	int n = 0;
	if (!*s)
		return 0;
	for (const char *p = s;; p++) {
		char *end;
		errno = 0;
		long long v = strtoll(p, &end, 10);
		if (end == p || errno || v < lo || v > hi || (*end && *end != ',')) {
			size_t len = strcspn(p, ",");
			diag_usage(&A->d, "expected %s (integers from %lld to %lld, comma-separated), found '%.*s'", what,
			           (long long)lo, (long long)hi, (int)len, p);
			return -1;
		}
		if (n == max) {
			diag_usage(&A->d, "expected at most %d %s, found more", max, what);
			return -1;
		}
		out[n++] = v;
		p = end;
		if (!*p)
			return n;
	}
}

static int parse_mesh(Args *A, const char *s) { return mesh_parse_text(&A->mesh, &A->arena, s, &A->d); }

/* Finish a copy of the mesh with the device order in ids (NULL: identity). */
static int finish_mesh(Args *A, Mesh *m, const char *opt, const char *ids)
{
	int64_t v[THREADS_MAX_DEVICES];
	int *dev = NULL, n = 0;
	mesh_finish(m, &A->arena, NULL);
	if (!ids)
		return 0;
	if (m->ndev > THREADS_MAX_DEVICES) {
		diag_usage(&A->d, "expected at most %d devices with --%s, found %d", THREADS_MAX_DEVICES, opt, m->ndev);
		return -1;
	}
	if ((n = parse_ints(A, "device ids", ids, 0, m->ndev - 1, v, THREADS_MAX_DEVICES)) < 0)
		return -1;
	dev = arena_alloc(&A->arena, sizeof(int) * (size_t)(n ? n : 1));
	for (int i = 0; i < n; i++)
		dev[i] = (int)v[i];
	if (n != m->ndev || mesh_finish(m, &A->arena, dev) != 0) {
		diag_usage(&A->d, "expected --%s to list each device 0..%d once, found '%s'", opt, m->ndev - 1, ids);
		return -1;
	}
	return 0;
}

/* The YAML of --from or --to (name "--from": positions point at it); on
 * failure doc is freed. */
static int read_spec_doc(Args *A, YDoc *doc, const char *name, const char *text)
{
	int rc = ydoc_parse_string(doc, text, name, &A->d);
	if (rc == 0 && !doc->root) {
		diag_usage(&A->d, "expected a sharding after %s, found nothing", name);
		rc = -1;
	}
	if (rc != 0)
		ydoc_free(doc);
	return rc;
}

/* --from and --to into A->from, A->to; the mesh is cut first for the
 * sub-axes either names (both specs live on one mesh). */
static int parse_specs(Args *A, const CliParse *p)
{
	YDoc from, to;
	int rc = read_spec_doc(A, &from, "--from", cli_get(p, O_FROM));
	if (rc == 0 && (rc = read_spec_doc(A, &to, "--to", cli_get(p, O_TO))) != 0)
		ydoc_free(&from);
	if (rc != 0)
		return -1;
	spec_cut_mesh(&A->mesh, &A->arena, from.root);
	spec_cut_mesh(&A->mesh, &A->arena, to.root);
	A->mesh_to = A->mesh;
	if (finish_mesh(A, &A->mesh, "devices", cli_get(p, O_DEVICES)) != 0)
		rc = -1;
	A->mesh_to = A->mesh;
	const char *to_ids = cli_get(p, O_TO_DEVICES);
	if (rc == 0 && to_ids && finish_mesh(A, &A->mesh_to, "to-devices", to_ids) != 0)
		rc = -1;
	if (rc == 0)
		rc = spec_parse(&A->from, from.root, &A->mesh, A->rank, &A->d);
	if (rc == 0)
		rc = spec_parse(&A->to, to.root, &A->mesh_to, A->rank, &A->d);
	ydoc_free(&from);
	ydoc_free(&to);
	return rc;
}

static int parse_args(Args *A, const CliParse *p)
{
	static const int required[] = {O_MESH, O_SHAPE, O_FROM, O_TO};
	for (int i = 0; i < 4; i++)
		if (!cli_get(p, required[i])) {
			diag_usage(&A->d, "expected --%s, found none (see spmd reshard --help)", opts[required[i]].name);
			return -1;
		}
	for (int k = 0; k < p->args.n; k++)
		if (p->args.a[k].opt < 0) {
			diag_usage(&A->d, "expected options only, found '%s'", p->args.a[k].value);
			return -1;
		}
	const char *dt = cli_get(p, O_DTYPE);
	A->dtype = DT_F32;
	if (dt && dtype_parse(dt) < 0) {
		diag_usage(&A->d, "expected a dtype (f32, bf16, f16, f64, i32), found '%s'", dt);
		return -1;
	}
	if (dt)
		A->dtype = (DType)dtype_parse(dt);
	if (parse_mesh(A, cli_get(p, O_MESH)) != 0)
		return -1;
	if ((A->rank = parse_ints(A, "dimensions", cli_get(p, O_SHAPE), 0, SHAPE_MAX_NUMEL, A->dims, MAX_RANK)) < 0)
		return -1;
	double numel = 1;
	for (int d = 0; d < A->rank; d++)
		numel *= (double)A->dims[d];
	if (numel > (double)SHAPE_MAX_NUMEL) {
		diag_usage(&A->d, "expected at most %lld elements, found %.0f", (long long)SHAPE_MAX_NUMEL, numel);
		return -1;
	}
	return parse_specs(A, p);
}

/* ---- output ---- */

static void shape_text(const int64_t *block, int rank, char *buf, size_t n)
{
	size_t k = (size_t)snprintf(buf, n, "[");
	for (int d = 0; d < rank && k < n; d++)
		k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)block[d]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

static void print_text(const Args *A, const ReshardPlan *p, const char *check)
{
	char sa[512], sb[512], mesh[256], shape[128], before[128], after[128], step[256];
	spec_format(&A->from, &A->mesh, sa, sizeof sa);
	spec_format(&A->to, &A->mesh, sb, sizeof sb);
	mesh_format(&A->mesh, mesh, sizeof mesh);
	shape_text(A->dims, A->rank, shape, sizeof shape);
	printf("reshard %s %s on %s: %s -> %s\n", shape, dtype_names[A->dtype], mesh, sa, sb);
	for (int i = 0; i < p->nsteps; i++) {
		const ReshardStep *s = &p->steps[i];
		reshard_step_format(s, &A->mesh, step, sizeof step);
		shape_text(s->before.block, p->rank, before, sizeof before);
		shape_text(s->after.block, p->rank, after, sizeof after);
		printf("  %d. %-40s local %s -> %s", i + 1, step, before, after);
		if (s->kind != RS_SLICE)
			printf(", %lld B/device, sends %lld B", (long long)s->bytes_per_device,
			       (long long)s->bytes_sent_per_device);
		else
			printf(", no communication");
		printf("%s\n", s->fallback ? " (fallback: gathers data a later slice drops)" : "");
	}
	if (p->nsteps == 0)
		printf("  nothing to do: the layouts are the same\n");
	printf("total: %d step%s, %lld B/device handed to collectives, %lld B sent per device\n", p->nsteps,
	       p->nsteps == 1 ? "" : "s", (long long)p->bytes_per_device, (long long)p->bytes_sent_per_device);
	printf("check: %s\n", check);
}

static json_t *int_list(const int64_t *v, int n)
{
	json_t *a = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(a, json_integer(v[i]));
	return a;
}

static json_t *step_json(const Args *A, const ReshardPlan *p, const ReshardStep *s)
{
	json_t *o = json_object(), *axes = cli_jaxes(&A->mesh, s->axes, s->nax);
	json_object_set_new(o, "op", json_string(reshard_kind_names[s->kind]));
	json_object_set_new(o, "axes", axes);
	json_object_set_new(o, "bytes_per_device", json_integer(s->bytes_per_device));
	json_object_set_new(o, "bytes_sent_per_device", json_integer(s->bytes_sent_per_device));
	if (s->kind == RS_ALL_GATHER || s->kind == RS_REDUCE_SCATTER)
		json_object_set_new(o, "dim", json_integer(s->dim));
	if (s->kind == RS_ALL_TO_ALL) {
		json_object_set_new(o, "split_dim", json_integer(s->dim));
		json_object_set_new(o, "concat_dim", json_integer(s->dim2));
	}
	if (s->kind == RS_ALL_REDUCE || s->kind == RS_REDUCE_SCATTER)
		json_object_set_new(o, "reduce", json_string(s->reduce == REDUCE_MAX ? "max" : "sum"));
	if (s->kind == RS_PERMUTE) {
		json_t *pairs = json_array();
		for (int dev = 0; dev < p->ndev; dev++)
			if (s->target[dev] != dev)
				json_array_append_new(pairs, json_pack("[ii]", dev, s->target[dev]));
		json_object_set_new(o, "pairs", pairs);
	}
	json_object_set_new(o, "local_shape_before", int_list(s->before.block, p->rank));
	json_object_set_new(o, "local_shape_after", int_list(s->after.block, p->rank));
	json_object_set_new(o, "fallback", json_boolean(s->fallback));
	return o;
}

static void print_json(const Args *A, const ReshardPlan *p, const char *check)
{
	json_t *root = json_object(), *steps = json_array();
	for (int i = 0; i < p->nsteps; i++)
		json_array_append_new(steps, step_json(A, p, &p->steps[i]));
	json_object_set_new(root, "steps", steps);
	json_object_set_new(root, "bytes_per_device", json_integer(p->bytes_per_device));
	json_object_set_new(root, "bytes_sent_per_device", json_integer(p->bytes_sent_per_device));
	json_object_set_new(root, "check", json_string(check));
	char *text = json_dumps(root, JSON_PRESERVE_ORDER);
	printf("%s\n", text ? text : "{}");
	free(text);
	json_decref(root);
}

/* ---- the command ---- */

/* Run the plan on threads; 0 ok, 1 mismatch, 2 refused (too large). */
static int run_check(Args *A, const ReshardPlan *p, char *msg, size_t n)
{
	int64_t elems = 0;
	for (int i = 0; i < p->nsteps; i++)
		elems += coll_layout_numel(&p->steps[i].after, p->rank);
	elems = (elems + coll_layout_numel(&p->from, p->rank)) * p->ndev;
	if (p->ndev > THREADS_MAX_DEVICES || elems > CHECK_MAX_ELEMS) {
		diag_usage(&A->d, "expected at most %d devices and %d elements over all buffers for --check, found %d and %lld",
		           THREADS_MAX_DEVICES, CHECK_MAX_ELEMS, p->ndev, (long long)elems);
		return 2;
	}
	int rc = threads_check_plan(p, &A->from, &A->to, A->dtype, msg, n);
	if (rc == THREADS_NOT_STARTED || rc == THREADS_FAILED) { /* no comparison was made */
		fprintf(stderr, "spmd reshard: error: --check: %s\n", msg);
		return 2;
	}
	return rc == 0 ? 0 : 1;
}

static int reshard_main(Args *A, const CliParse *cp)
{
	if (parse_args(A, cp) != 0)
		return 2;
	ReshardPlan p;
	int esize = dtype_size(A->dtype);
	if (reshard_plan_meshes(&p, &A->from, &A->mesh, &A->to, &A->mesh_to, A->dims, esize, &A->d) != 0)
		return 2;
	char msg[512] = "skipped";
	int rc = 0;
	if (cli_get(cp, O_SVG) && reshard_svg_write(cli_get(cp, O_SVG), &p, A->dtype, &A->d) != 0) {
		reshard_plan_free(&p);
		return 2;
	}
	if (cli_flag(cp, O_CHECK) && (rc = run_check(A, &p, msg, sizeof msg)) == 2) {
		reshard_plan_free(&p);
		return 2;
	}
	if (p.fallback)
		diag_warn(&A->d, (Pos){0}, "the plan gathers data that a later slice drops again (a fallback: no cheaper plan found)");
	if (rc == 1)
		fprintf(stderr, "spmd: check failed: %s\n", msg);
	const char *check = !cli_flag(cp, O_CHECK) ? "skipped" : rc ? "mismatch" : "ok";
	if (cli_flag(cp, O_JSON))
		print_json(A, &p, check);
	else
		print_text(A, &p, check);
	reshard_plan_free(&p);
	return rc;
}

int cmd_reshard(int argc, char **argv)
{
	CliParse cp;
	if (cli_parse("reshard", argc, argv, opts, O_COUNT, &cp) != 0)
		return 2;
	if (cp.help) {
		cli_help(stdout, "reshard", "--mesh AXES --shape DIMS --from SPEC --to SPEC [--check] [--json] [--svg FILE]",
		         "Print the collectives that turn a tensor sharded by --from into --to, with the bytes each\n"
		         "device hands to each collective and sends on a ring.  --check runs the plan with one\n"
		         "thread per device on deterministic data and compares every shard with the target layout\n"
		         "(exit status 1 on a mismatch).  Sharding syntax: docs/sharding.md.",
		         opts, O_COUNT);
		cli_free(&cp);
		return 0;
	}
	Args A;
	memset(&A, 0, sizeof A);
	arena_init(&A.arena);
	diag_init(&A.d);
	int rc = reshard_main(&A, &cp);
	arena_free(&A.arena);
	cli_free(&cp);
	return rc;
}
