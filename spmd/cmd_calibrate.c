/* cmd_calibrate.c: `spmd calibrate -o local.yaml` — measure this machine (executor and thread backend) into a hardware profile. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "load.h"
#include "ops.h"
#include "../cost_model/cost.h"
#include "../runtime/exec.h"
#include "../runtime/threads.h"

enum { O_OUT, O_NAME, O_QUICK, NCAL_OPTS };

static const CliOpt cal_opts[NCAL_OPTS] = {
	[O_OUT] = {"o", "PROFILE.yaml", "write the profile here (required)"},
	[O_NAME] = {"name", "NAME", "the profile's name (default: local)"},
	[O_QUICK] = {"quick", NULL, "small sizes and few repetitions (seconds less, figures rougher; for tests)"},
};

static const char cal_desc[] =
	"Measure this machine as the cost model sees it and write a hardware\n"
	"profile (docs/hardware.md): the reference executor's per-op overhead\n"
	"(small ops and einsums of several kinds in turn),\n"
	"GEMM FLOP/s (einsum), elementwise rate, memory bandwidth and\n"
	"transcendental rate of one core while every core runs the same op; the\n"
	"thread backend's collective latency\n"
	"and bandwidth (all_reduce and all_gather on 2 and 4 device threads after\n"
	"some local work, fitted to the backend's barrier model).  The devices of the thread backend share this machine's cores:\n"
	"the profile says how many (host_cores), and the cost model gives each of N\n"
	"devices min(1, cores / N) of every rate.  Use it with\n"
	"  spmd cost MODEL.yaml --hardware PROFILE.yaml --compare-run";

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *x, int n)
{
	qsort(x, (size_t)n, sizeof *x, cmp_double);
	return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

typedef struct {
	const Graph *g;
	double *sec; /* per thread, per op */
} OpBench;

static int op_body(int device, void *arg, Backend *b)
{
	OpBench *ob = arg;
	Tensor *vals = xcalloc((size_t)ob->g->values.n + 1, sizeof *vals);
	ExecOpts o = {.seed = 1, .profile = true, .op_seconds = ob->sec + (size_t)device * (size_t)ob->g->ops.n};
	Diag d;
	diag_init(&d);
	d.quiet = true;
	int rc = b->barrier(b, device) == 0 && exec_run(ob->g, vals, NULL, &o, &d) == 0 ? 0 : -1;
	exec_free_values(ob->g, vals);
	free(vals);
	return rc;
}

/* Median time of an op in the reference executor while every core runs it
 * (the thread backend's devices share the cores): a model with inputs
 * `inputs` (YAML) and `reps` ops, each reading the inputs (or p, a positive
 * 128x128 param), run on `cores` threads at once; an op's time is the mean
 * over the threads.  `op` is a YAML flow mapping without `out`, or several
 * separated by '|', taken in turn (a program runs different kernels one
 * after another: no kernel finds its code and branches warm). */
static double time_op(const char *inputs, const char *op, int reps, int cores)
{
	size_t cap = 256 + (size_t)reps * (strlen(op) + 32);
	char *text = xmalloc(cap);
	size_t k = (size_t)snprintf(text, cap,
	                            "inputs: %s\nparams: {p: {shape: [128, 128], init: {uniform: [0.5, 2.0]}}}\nops:\n",
	                            inputs);
	const char *at = op;
	for (int i = 0; i < reps; i++) {
		const char *bar = strchr(at, '|');
		int len = bar ? (int)(bar - at) : (int)strlen(at);
		k += (size_t)snprintf(text + k, cap - k, "  - {out: y%d, %.*s}\n", i, len, at);
		at = bar ? bar + 1 : op;
	}
	snprintf(text + k, cap - k, "outputs: [y0]\n");
	Graph g;
	Diag d;
	diag_init(&d);
	double t = -1;
	if (model_load_string(&g, text, "calibrate", &d) == 0) {
		Mesh m = {.naxes = 1, .name = {"cores"}, .size = {cores}, .ndev = cores};
		OpBench ob = {&g, xcalloc((size_t)cores * (size_t)g.ops.n + 1, sizeof(double))};
		if (threads_run(&m, op_body, &ob) == 0) {
			for (int i = 0; i < g.ops.n; i++)
				for (int c = 1; c < cores; c++)
					ob.sec[i] += ob.sec[(size_t)c * (size_t)g.ops.n + (size_t)i];
			for (int i = 0; i < g.ops.n; i++)
				ob.sec[i] /= cores;
			t = median(ob.sec + 1, g.ops.n - 1); /* the first one warms up */
		}
		free(ob.sec);
	}
	graph_free(&g);
	free(text);
	return t;
}

typedef struct {
	int64_t n;      /* elements per device */
	int reps;
	bool gather;    /* all_gather, else all_reduce */
	double gap;     /* seconds of local work before each collective */
	double *t;      /* per rep, per device */
} CollBench;

/* Collectives as a program's devices run them: some local work, then the
 * collective, each device arriving when it is done. */
static int coll_body(int device, void *arg, Backend *b)
{
	CollBench *cb = arg;
	int ndev = b->mesh->ndev;
	float *in = xcalloc((size_t)cb->n, sizeof *in), *out = xcalloc((size_t)cb->n * (size_t)ndev, sizeof *out);
	Coll c = {.nax = 1, .axes = {0}, .dtype = DT_F32, .rank = 1, .shape = {cb->n}, .reduce = REDUCE_SUM};
	int rc = b->barrier(b, device);
	for (int r = 0; r < cb->reps && rc == 0; r++) {
		for (double t0 = now_seconds(); now_seconds() - t0 < cb->gap;)
			;
		double t0 = now_seconds();
		rc = cb->gather ? b->all_gather(b, device, &c, in, out) : b->all_reduce(b, device, &c, in, out);
		cb->t[(size_t)r * (size_t)ndev + (size_t)device] = now_seconds() - t0;
	}
	free(in), free(out);
	return rc;
}

/* Seconds of an all_reduce (all_gather) of n floats per device over ndev
 * device threads after `gap` seconds of local work, less the wait for the
 * devices that share the cores (cost_model.md): the mean over the devices,
 * the median over the reps. */
static double time_collective(const HwProfile *hw, int ndev, int64_t n, bool gather, int reps)
{
	Mesh m = {.naxes = 1, .name = {"x"}, .size = {ndev}, .ndev = ndev};
	CollBench cb = {n, reps, gather, 50e-6, xcalloc((size_t)reps * (size_t)ndev, sizeof(double))};
	double t = -1;
	if (threads_run(&m, coll_body, &cb) == 0) {
		for (int r = 0; r < reps; r++) {
			double s = 0;
			for (int d = 0; d < ndev; d++)
				s += cb.t[(size_t)r * (size_t)ndev + (size_t)d];
			cb.t[r] = s / ndev - (1 / hw_share(hw, ndev) - 1) * cb.gap;
		}
		t = median(cb.t, reps);
	}
	free(cb.t);
	return t;
}

/* Fit the barrier latency and the copy bandwidth, by least squares, to
 * all_reduce and all_gather on 2 and 4 device threads: the thread backend's
 * model, 3a + 2(n-1)/n B/bw and 2a + (n-1) B/bw, each divided by share(n). */
static void fit_collectives(HwProfile *hw, bool quick)
{
	int reps = quick ? 5 : 41;
	int64_t big = quick ? 1 << 14 : 1 << 18;
	double sa = 0, xa = 0, sb = 0, xb = 0;
	for (int ndev = 2; ndev <= 4; ndev *= 2)
		for (int gather = 0; gather < 2; gather++) {
			double share = hw_share(hw, ndev);
			double steps = cost_thread_barriers(gather ? RS_ALL_GATHER : RS_ALL_REDUCE) / share;
			double small = time_collective(hw, ndev, 1, gather, reps);
			double large = time_collective(hw, ndev, big, gather, reps);
			double vol = (gather ? (double)(ndev - 1) : 2.0 * (ndev - 1) / ndev) * (double)big * 4 / share;
			sa += small * steps, xa += steps * steps;
			sb += (large - small) * vol, xb += vol * vol;
		}
	hw->latency = sa / xa > 0 ? sa / xa : 1e-6;
	double beta = sb / xb; /* seconds per byte */
	hw->link_bw = beta > 0 ? 1 / beta : 1e9;
	hw->dcn_bw = hw->link_bw, hw->dcn_latency = hw->latency;
}

/* Executor figures of one core while every core works. */
static int measure_executor(HwProfile *hw, bool quick)
{
	int cores = hw->host_cores;
	int reps = quick ? 5 : 31;
	char in[256];
	/* fixed costs: small ops of several kinds in turn */
	hw->kernel_overhead = time_op("{a: {shape: [2, 2]}, b: {shape: [2, 2]}}",
	                              "op: add, in: [a, b]|op: mul, in: [a, b]|op: exp, in: [a]|op: relu, in: [a]|"
	                              "op: reduce_sum, in: [a], axes: [1]|op: sub, in: [a, b]|op: neg, in: [a]|"
	                              "op: max, in: [a, b]",
	                              reps * 2, cores);
	hw->matrix_overhead = time_op("{a: {shape: [2, 2]}, b: {shape: [2, 2]}, c: {shape: [2, 2, 2]}, "
	                              "e: {shape: [2, 2, 2]}, f: {shape: [2, 2, 2, 2]}, h: {shape: [2, 2, 2, 2]}}",
	                              "op: einsum, eq: \"ik,kj->ij\", in: [a, b]|"
	                              "op: einsum, eq: \"bsm,mhd->bshd\", in: [c, e]|"
	                              "op: einsum, eq: \"bqhd,bkhd->bhqk\", in: [f, h]|"
	                              "op: einsum, eq: \"bsm,bsf->mf\", in: [c, e]",
	                              reps * 2, cores);
	int64_t nv = 1 << 14, nb = quick ? 1 << 16 : 1 << 20, m = quick ? 64 : 256, k = quick ? 128 : 512;
	double ov = hw->kernel_overhead;
	snprintf(in, sizeof in, "{a: {shape: [%lld]}, b: {shape: [%lld]}}", (long long)nv, (long long)nv);
	double tv = time_op(in, "op: max, in: [a, b]", reps, cores);
	snprintf(in, sizeof in, "{a: {shape: [%lld]}, b: {shape: [%lld]}}", (long long)nb, (long long)nb);
	double tb = time_op(in, "op: add, in: [a, b]", reps, cores);
	snprintf(in, sizeof in, "{a: {shape: [%lld]}}", (long long)nv);
	double tt = time_op(in, "op: exp, in: [a]", reps, cores);
	snprintf(in, sizeof in, "{a: {shape: [%lld, %lld]}, b: {shape: [%lld, %lld]}}", (long long)m, (long long)k,
	         (long long)k, (long long)k);
	double tg = time_op(in, "op: einsum, eq: \"ik,kj->ij\", in: [a, b]", quick ? 3 : 41, cores);
	if (ov < 0 || hw->matrix_overhead < 0 || tv < 0 || tb < 0 || tt < 0 || tg < 0)
		return -1;
	double mo = hw->matrix_overhead;
	double gemm = 2.0 * (double)m * (double)k * (double)k / (tg > 2 * mo ? tg - mo : tg / 2);
	hw->vector_flops = (double)nv / (tv > 2 * ov ? tv - ov : tv / 2);
	hw->mem_bw = 12.0 * (double)nb / (tb > 2 * ov ? tb - ov : tb / 2);
	double tr = tt - ov - (double)nv / hw->vector_flops;
	hw->transcendentals = (double)nv / (tr > 0.1 * tt ? tr : 0.1 * tt);
	for (int t = 0; t < DT_COUNT; t++)
		hw->flops[t] = t == DT_I32 ? hw->vector_flops : gemm;
	return 0;
}

/* The executor's own rate of every elementwise, reduction and
 * normalization kind: elements per second on a 128x128 operand. */
static void measure_op_rates(HwProfile *hw, bool quick)
{
	const char *in = "{a: {shape: [128, 128]}, b: {shape: [128, 128]}}";
	int reps = quick ? 3 : 15;
	for (int k = 0; k < OP_COUNT; k++) {
		unsigned fl = op_table[k].flags;
		char op[128];
		/* positive operands where negative ones take a slow path (NaN) */
		bool pos = k == OP_LOG || k == OP_SQRT || k == OP_RSQRT || k == OP_POW || k == OP_DIV || k == OP_RECIPROCAL;
		if (fl & OPF_UNARY)
			snprintf(op, sizeof op, "op: %s, in: [%s]", op_table[k].name, pos ? "p" : "a");
		else if (fl & OPF_BINARY)
			snprintf(op, sizeof op, "op: %s, in: [%s]", op_table[k].name, pos ? "p, p" : "a, b");
		else if (fl & OPF_REDUCE)
			snprintf(op, sizeof op, "op: %s, in: [a], axes: [1]", op_table[k].name);
		else if (k == OP_SOFTMAX || k == OP_LOG_SOFTMAX || k == OP_LAYER_NORM)
			snprintf(op, sizeof op, "op: %s, in: [a]", op_table[k].name);
		else
			continue;
		double t = time_op(in, op, reps, hw->host_cores), ov = hw->kernel_overhead;
		if (t > 0)
			hw->op_rate[k] = 128.0 * 128 / (t > 2 * ov ? t - ov : t / 2);
	}
}

static int calibrate(const CliParse *p)
{
	const char *out = cli_get(p, O_OUT), *name = cli_get(p, O_NAME);
	if (!out) {
		fprintf(stderr, "spmd calibrate: error: expected -o PROFILE.yaml, found none (see spmd calibrate --help)\n");
		return 2;
	}
	HwProfile hw = {.topo = TOPO_THREADS, .ndims = 1, .dims = {THREADS_MAX_DEVICES}, .fusion = false};
	snprintf(hw.name, sizeof hw.name, "%s", name ? name : "local");
	long cores = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	hw.host_cores = cores > 0 ? (int)cores : 1;
	hw.mem_capacity = pages > 0 && psize > 0 ? (double)pages * (double)psize : 1e9;
	int threads = openblas_get_num_threads();
	openblas_set_num_threads(1); /* one device is one core */
	int rc = measure_executor(&hw, cli_flag(p, O_QUICK));
	openblas_set_num_threads(threads);
	if (rc != 0) {
		fprintf(stderr, "spmd calibrate: error: expected the measurements to run, found a failure\n");
		return 2;
	}
	threads = openblas_get_num_threads();
	openblas_set_num_threads(1);
	measure_op_rates(&hw, cli_flag(p, O_QUICK));
	openblas_set_num_threads(threads);
	fit_collectives(&hw, cli_flag(p, O_QUICK));
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	fprintf(f, "# measured by spmd calibrate on this machine (docs/hardware.md)\n");
	hw_profile_write(&hw, f);
	fclose(f);
	rc = file_write_atomic(out, buf, len) == 0 ? 0 : 2;
	if (rc)
		fprintf(stderr, "spmd calibrate: error: cannot write %s\n", out);
	else
		fputs(buf, stdout);
	free(buf);
	return rc;
}

int cmd_calibrate(int argc, char **argv)
{
	CliParse p;
	if (cli_parse("calibrate", argc, argv, cal_opts, NCAL_OPTS, &p) != 0)
		return 2;
	int rc = 0;
	bool pos = false;
	for (int i = 0; i < p.args.n; i++)
		pos |= p.args.a[i].opt == -1;
	if (p.help)
		cli_help(stdout, "calibrate", "-o PROFILE.yaml [--name NAME] [--quick]", cal_desc, cal_opts, NCAL_OPTS);
	else if (pos) {
		fprintf(stderr, "spmd calibrate: error: expected options only, found an argument (see spmd calibrate --help)\n");
		rc = 2;
	} else
		rc = calibrate(&p);
	cli_free(&p);
	return rc;
}
