/* cmd_run.c: `spmd run MODEL.yaml` — run a model and print (or save) its outputs. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "load.h"
#include "npy.h"
#include "ops.h"
#include "../runtime/exec.h"

enum { O_SEED, O_INPUT, O_SAVE, O_BACKEND, O_PROFILE, NRUN_OPTS };

static const CliOpt run_opts[NRUN_OPTS] = {
	[O_SEED] = {"seed", "N", "seed of the deterministic data (default 0)"},
	[O_INPUT] = {"input", "NAME=FILE.npy", "take input or param NAME from a .npy file (repeatable)"},
	[O_SAVE] = {"save", "DIR", "write each output to DIR/NAME.npy (DIR is created if needed)"},
	[O_BACKEND] = {"backend", "ref", "where to run: ref (the reference executor, one device)"},
	[O_PROFILE] = {"profile", NULL, "time every op and print a table by op kind"},
};

static const char run_desc[] =
	"Run a model.  Inputs and params not given with --input are made from the\n"
	"seed: element i of a tensor depends only on (seed, name, i).  Prints each\n"
	"output's shape and statistics.";

/* Does the file's dtype fit the value's?  bf16 and f16 values take f32 files too. */
static bool npy_dtype_fits(DType want, DType got)
{
	if (want == got)
		return true;
	return (want == DT_BF16 || want == DT_F16) && (got == DT_F32 || got == DT_F16);
}

/* Read one --input NAME=FILE into vals; 0 or 2 after an error. */
static int read_input(const Graph *g, const char *arg, Tensor *vals, Diag *d)
{
	const char *eq = strchr(arg, '=');
	if (!eq || eq == arg || !eq[1]) {
		diag_usage(d, "expected --input NAME=FILE.npy, found '%s'", arg);
		return 2;
	}
	char name[256];
	snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
	int v = graph_find(g, name);
	if (v < 0 || (g->values.a[v].kind != VK_INPUT && g->values.a[v].kind != VK_PARAM)) {
		diag_usage(d, "expected the name of an input or param in --input, found '%s'", name);
		return 2;
	}
	const Value *val = &g->values.a[v];
	Tensor t = {0};
	if (npy_read(eq + 1, &t, d) != 0)
		return 2;
	if (!shape_eq(&t.shape, &val->shape) || !npy_dtype_fits(val->dtype, t.dtype)) {
		char want[128], got[128];
		shape_format(&val->shape, want, sizeof want);
		shape_format(&t.shape, got, sizeof got);
		diag_error(d, val->pos, "expected %s %s for '%s' in %s, found %s %s", dtype_names[val->dtype], want,
		           val->name, eq + 1, dtype_names[t.dtype], got);
		tensor_free(&t);
		return 2;
	}
	t.dtype = val->dtype;
	tensor_round(&t);
	tensor_free(&vals[v]);
	vals[v] = t;
	return 0;
}

static void print_stats(const Value *v, const Tensor *t)
{
	int64_t n = shape_numel(&t->shape);
	double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
	for (int64_t i = 0; i < n; i++) {
		double x = t->dtype == DT_I32 ? tensor_i32(t)[i] : tensor_f32(t)[i];
		sum += x, sq += x * x;
		lo = x < lo ? x : lo;
		hi = x > hi ? x : hi;
	}
	double mean = sum / (double)n, var = sq / (double)n - mean * mean;
	char shape[128];
	shape_format(&t->shape, shape, sizeof shape);
	printf("%-12s %-4s %-16s mean %-12.6g std %-12.6g min %-12.6g max %.6g\n", v->name, dtype_names[v->dtype],
	       shape, mean, sqrt(var > 0 ? var : 0), lo, hi);
}

/* Write every output to DIR/NAME.npy; 0 or 2. */
static int save_outputs(const Graph *g, const Tensor *vals, const char *dir, Diag *d)
{
	if (dir_make(dir) != 0) {
		diag_usage(d, "expected a directory for --save, found '%s' (%s)", dir, strerror(errno));
		return 2;
	}
	for (int i = 0; i < g->outputs.n; i++) {
		const Value *v = &g->values.a[g->outputs.a[i]];
		char path[4096];
		snprintf(path, sizeof path, "%s/%s.npy", dir, v->name);
		if (npy_write(path, &vals[g->outputs.a[i]]) != 0) {
			diag_usage(d, "cannot write %s: %s", path, strerror(errno));
			return 2;
		}
	}
	return 0;
}

/* Print the time per op kind, largest first. */
static void print_profile(const Graph *g, const double *sec)
{
	double by_kind[OP_COUNT] = {0}, total = 0;
	int count[OP_COUNT] = {0};
	for (int i = 0; i < g->ops.n; i++) {
		by_kind[g->ops.a[i].kind] += sec[i];
		count[g->ops.a[i].kind]++;
		total += sec[i];
	}
	printf("\n%-20s %6s %12s %7s\n", "op kind", "count", "seconds", "share");
	for (;;) {
		int best = -1;
		for (int k = 0; k < OP_COUNT; k++)
			if (count[k] && (best < 0 || by_kind[k] > by_kind[best]))
				best = k;
		if (best < 0)
			break;
		printf("%-20s %6d %12.6f %6.1f%%\n", op_table[best].name, count[best], by_kind[best],
		       total > 0 ? 100 * by_kind[best] / total : 0);
		count[best] = 0;
	}
	printf("%-20s %6d %12.6f\n", "total", g->ops.n, total);
}

static int run_model(const CliParse *p, const char *path)
{
	Graph g;
	Diag d;
	diag_init(&d);
	uint64_t seed = 0;
	const char *backend = cli_get(p, O_BACKEND);
	if (backend && strcmp(backend, "ref") != 0) {
		fprintf(stderr, "spmd run: error: expected a backend (ref), found '%s'\n", backend);
		return 2;
	}
	if (cli_get(p, O_SEED) && cli_uint("run", "seed", cli_get(p, O_SEED), &seed) != 0)
		return 2;
	if (model_load(&g, path, &d) != 0) {
		graph_free(&g);
		return 2;
	}
	Tensor *vals = xcalloc((size_t)g.values.n, sizeof *vals);
	int rc = 0;
	for (int i = 0; i < p->args.n && rc == 0; i++)
		if (p->args.a[i].opt == O_INPUT)
			rc = read_input(&g, p->args.a[i].value, vals, &d);
	double *sec = cli_flag(p, O_PROFILE) ? xcalloc((size_t)g.ops.n + 1, sizeof *sec) : NULL;
	ExecOpts o = {.seed = seed, .profile = sec != NULL, .op_seconds = sec};
	if (rc == 0 && exec_run(&g, vals, NULL, &o, &d) != 0)
		rc = 2;
	if (rc == 0) {
		for (int i = 0; i < g.outputs.n; i++)
			print_stats(&g.values.a[g.outputs.a[i]], &vals[g.outputs.a[i]]);
		if (sec)
			print_profile(&g, sec);
		if (cli_get(p, O_SAVE))
			rc = save_outputs(&g, vals, cli_get(p, O_SAVE), &d);
	}
	free(sec);
	exec_free_values(&g, vals);
	free(vals);
	graph_free(&g);
	return rc;
}

int cmd_run(int argc, char **argv)
{
	CliParse p;
	if (cli_parse("run", argc, argv, run_opts, NRUN_OPTS, &p) != 0)
		return 2;
	int rc = 0, npos = 0;
	const char *path = NULL;
	for (int i = 0; i < p.args.n; i++)
		if (p.args.a[i].opt == -1)
			path = p.args.a[i].value, npos++;
	if (p.help)
		cli_help(stdout, "run", "MODEL.yaml [options]", run_desc, run_opts, NRUN_OPTS);
	else if (npos != 1) {
		fprintf(stderr, "spmd run: error: expected one MODEL.yaml, found %d (see spmd run --help)\n", npos);
		rc = 2;
	} else
		rc = run_model(&p, path);
	cli_free(&p);
	return rc;
}
