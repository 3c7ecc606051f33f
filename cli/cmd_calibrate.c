/* cmd_calibrate.c: `spmd calibrate -o local.yaml` — measure this machine (executor and thread backend) into a hardware profile. */
#include <cblas.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "../base/progress.h"
#include "commands.h"
#include "../spmd/load.h"
#include "../spmd/ops.h"
#include "../cost_model/cost.h"
#include "measure.h"
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
	"profile (docs/hardware.md).  Rates of one core while every core runs the\n"
	"same op: GEMM FLOP/s (einsum), the elementwise rate, memory bandwidth, the\n"
	"transcendental rate, every elementwise, reduction and normalization kind\n"
	"(op_rates), and conv2d's im2col copies and narrow GEMMs.  Fixed costs\n"
	"inside programs run on the thread backend with twice as many devices as\n"
	"cores, as spmd cost --compare-run runs them: every op kind's kernel\n"
	"overhead on tiny operands (op_overheads), the einsums' time per element\n"
	"of their operands and result (matrix_element), the executor's time\n"
	"between kernels (dispatch_overhead, dispatch_bandwidth), and the\n"
	"collectives' barrier latency and copy bandwidth.  The devices of the\n"
	"thread backend share this machine's cores (host_cores): the cost model\n"
	"runs each device's ops at one core's rate, in turns.  Use it with\n"
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

/* ---- inside programs on the thread backend ---- */

/* A timed run of the SPMD program `text` (the fastest of `runs`, cost_run)
 * into g and r; free both whatever the result.  0, or -1. */
static int run_program(const char *text, int runs, Graph *g, CostRun *r)
{
	Diag d;
	diag_init(&d);
	d.quiet = true;
	*r = (CostRun){0};
	if (program_load_string(g, text, "calibrate", NULL, &d) != 0)
		return -1;
	Graph none;
	graph_init(&none);
	int rc = cost_run(&none, g, runs, r, &d);
	graph_free(&none);
	return rc;
}

/* Per device, its local ops' seconds plus its time between kernels
 * (everything but its collectives), averaged over the devices. */
static double local_seconds(const Graph *g, const CostRun *r)
{
	double sum = 0;
	for (int dev = 0; dev < r->ndev; dev++) {
		double coll = 0;
		for (int i = 0; i < r->nops; i++)
			if (op_table[g->ops.a[i].kind].flags & OPF_COLLECTIVE)
				coll += r->sec[(size_t)dev * (size_t)r->nops + (size_t)i];
		sum += r->end[dev] - r->start[dev] - coll;
	}
	return sum / r->ndev;
}

/* The time between kernels per op, averaged over the devices. */
static double between_seconds(const CostRun *r)
{
	double sum = 0;
	for (int dev = 0; dev < r->ndev; dev++) {
		sum += r->end[dev] - r->start[dev];
		for (int i = 0; i < r->nops; i++)
			sum -= r->sec[(size_t)dev * (size_t)r->nops + (size_t)i];
	}
	return sum / r->ndev / (r->nops ? r->nops : 1);
}

/* An op of kind k on operands a and b (p: positive), as a YAML flow
 * mapping without `out`, or "" for the kinds not measured on their own
 * (every elementwise, reduction and normalization kind is). */
static const char *kind_op(int k, char *buf, size_t n)
{
	unsigned fl = op_table[k].flags;
	/* positive operands where negative ones take a slow path (NaN) */
	bool pos = k == OP_LOG || k == OP_SQRT || k == OP_RSQRT || k == OP_POW || k == OP_DIV || k == OP_RECIPROCAL;
	if (fl & OPF_UNARY)
		snprintf(buf, n, "op: %s, in: [%s]", op_table[k].name, pos ? "p" : "a");
	else if (fl & OPF_BINARY)
		snprintf(buf, n, "op: %s, in: [%s]", op_table[k].name, pos ? "p, p" : "a, b");
	else if (fl & OPF_REDUCE)
		snprintf(buf, n, "op: %s, in: [a], axes: [1]", op_table[k].name);
	else if (k == OP_SOFTMAX || k == OP_LOG_SOFTMAX || k == OP_LAYER_NORM)
		snprintf(buf, n, "op: %s, in: [a]", op_table[k].name);
	else
		buf[0] = 0;
	return buf;
}

/* Einsums of 2-element dims: a matmul, two with batch letters, a weight gradient. */
static const char *const tiny_einsums[] = {
	"op: einsum, eq: \"ik,kj->ij\", in: [a, b]", "op: einsum, eq: \"bsm,mhd->bshd\", in: [c, e]",
	"op: einsum, eq: \"bqhd,bkhd->bhqk\", in: [f, h]", "op: einsum, eq: \"bsm,bsf->mf\", in: [c, e]"};
enum { NTINY_EINSUMS = sizeof tiny_einsums / sizeof tiny_einsums[0] };

/* The program of ops of every measured kind in turn on tiny operands,
 * `rounds` times, with a small all_reduce after every 8 ops, as a training
 * step's collectives come between short runs of local ops. */
static char *fixed_program(int ndev, int rounds)
{
	char *text = NULL, op[128];
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	fprintf(f, "spmd: true\nmesh: {x: %d}\ninputs: {a: {shape: [2, 2]}, b: {shape: [2, 2]}, c: {shape: [2, 2, 2]}, "
	           "e: {shape: [2, 2, 2]}, f: {shape: [2, 2, 2, 2]}, h: {shape: [2, 2, 2, 2]}}\n"
	           "params: {p: {shape: [2, 2], init: {uniform: [0.5, 2.0]}}}\nops:\n", ndev);
	int n = 0, nr = 0;
	for (int round = 0; round < rounds; round++)
		for (int k = 0; k < OP_COUNT + NTINY_EINSUMS; k++) {
			const char *body = k < OP_COUNT ? kind_op(k, op, sizeof op) : tiny_einsums[k - OP_COUNT];
			if (!body[0])
				continue;
			fprintf(f, "  - {out: t%d, %s}\n", n, body);
			if (++n % 8 != 0)
				continue;
			fprintf(f, "  - {out: l%d, op: mul, in: [a, 0.5], sharding: {dims: [null, null], partial: [x]}}\n"
			           "  - {out: r%d, op: all_reduce, in: [l%d], axes: [x], reduce: sum}\n", nr, nr, nr);
			nr++;
		}
	fprintf(f, "outputs: [t%d]\n", n - 1);
	fclose(f);
	return text;
}

/* Median of the seconds of every op of kind k after the program's first
 * collective (the ops before it find cold caches), on every device; -1
 * when there is none. */
static double kind_median(const Graph *g, const CostRun *r, int k, double *tmp)
{
	int n = 0, start = 0;
	while (start < g->ops.n && !(op_table[g->ops.a[start].kind].flags & OPF_COLLECTIVE))
		start++;
	for (int dev = 0; dev < r->ndev; dev++)
		for (int i = start; i < g->ops.n; i++)
			if ((int)g->ops.a[i].kind == k)
				tmp[n++] = r->sec[(size_t)dev * (size_t)g->ops.n + (size_t)i];
	return n ? median(tmp, n) : -1;
}

/* Every kind's kernel overhead inside a program (op_overheads; the
 * einsums' also as matrix_overhead, the median kind's as kernel_overhead).
 * 0, or -1. */
static int measure_fixed(HwProfile *hw, bool quick)
{
	Graph g;
	CostRun r;
	char *text = fixed_program(2 * hw->host_cores, quick ? 2 : 6);
	int rc = run_program(text, quick ? 2 : 5, &g, &r);
	double *tmp = xcalloc((size_t)r.ndev * (size_t)g.ops.n + 1, sizeof *tmp), kinds[OP_COUNT];
	int nk = 0;
	for (int k = 0; k < OP_COUNT && rc == 0; k++) {
		double t = kind_median(&g, &r, k, tmp);
		if (t <= 0 || (op_table[k].flags & OPF_COLLECTIVE))
			continue;
		hw->op_overhead[k] = t;
		if (k != OP_EINSUM)
			kinds[nk++] = t;
	}
	if (rc == 0 && nk > 0 && hw->op_overhead[OP_EINSUM] > 0) {
		hw->kernel_overhead = median(kinds, nk);
		hw->matrix_overhead = hw->op_overhead[OP_EINSUM];
	}
	free(tmp), free(text);
	cost_run_free(&r);
	graph_free(&g);
	return rc == 0 && nk > 0 ? 0 : -1;
}

/* The einsums' time per element of their operands and result beyond
 * their overhead and FLOPs (matrix_element: small GEMMs run far below the
 * peak, and the executor copies operands whose letters are not in GEMM
 * order): six einsums inside a program, the four equations of
 * measure_fixed on 8- and 16-element dims (a few hundred elements each),
 * a 32x64 by 64x128 and a 16x512 by 512x512 matmul, fitted by least
 * squares on their relative error (each equation's median over its runs). */
static const char *const layout_eqs[] = {
	"op: einsum, eq: \"ik,kj->ij\", in: [a, b]", "op: einsum, eq: \"bsm,mhd->bshd\", in: [c, e]",
	"op: einsum, eq: \"bqhd,bkhd->bhqk\", in: [f, f]", "op: einsum, eq: \"bsm,bsf->mf\", in: [c, c]",
	"op: einsum, eq: \"ik,kj->ij\", in: [g, h]", "op: einsum, eq: \"ik,kj->ij\", in: [u, w]"};
enum { NLAYOUT = sizeof layout_eqs / sizeof layout_eqs[0] };

/* The program of those einsums in turn, `per` times each, with a small
 * all_reduce after every six. */
static char *layout_program(int ndev, int per)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	fprintf(f, "spmd: true\nmesh: {x: %d}\ninputs: {a: {shape: [16, 32]}, b: {shape: [32, 16]}, c: {shape: [2, 8, 16]}, "
	           "e: {shape: [16, 2, 8]}, f: {shape: [2, 8, 2, 8]}, g: {shape: [32, 64]}, h: {shape: [64, 128]}, "
	           "u: {shape: [16, 512]}, w: {shape: [512, 512]}}\nops:\n", ndev);
	for (int i = 0; i < per * NLAYOUT; i++) {
		fprintf(f, "  - {out: t%d, %s}\n", i, layout_eqs[i % NLAYOUT]);
		if (i % 6 == 5)
			fprintf(f, "  - {out: l%d, op: mul, in: [a, 0.5], sharding: {dims: [null, null], partial: [x]}}\n"
			           "  - {out: r%d, op: all_reduce, in: [l%d], axes: [x], reduce: sum}\n", i, i, i);
	}
	fprintf(f, "outputs: [t%d]\n", per * NLAYOUT - 1);
	fclose(f);
	return text;
}

/* matrix_element (above); 0, or -1. */
static int measure_layout(HwProfile *hw, bool quick)
{
	int per = quick ? 2 : 6, nt[NLAYOUT] = {0};
	char *text = layout_program(2 * hw->host_cores, per);
	Graph g;
	CostRun r;
	int rc = run_program(text, quick ? 2 : 3, &g, &r);
	double *t = xcalloc((size_t)NLAYOUT * (size_t)r.ndev * (size_t)per + 1, sizeof *t), base[NLAYOUT], lay[NLAYOUT];
	for (int i = 0, k = 0; i < g.ops.n && rc == 0; i++) {
		if (g.ops.a[i].kind != OP_EINSUM)
			continue;
		int q = k++ % NLAYOUT;
		OpWork w;
		cost_op_work(&g, i, &w);
		base[q] = cost_kernel_seconds(hw, cost_compute_seconds(hw, DT_F32, &w), 0, true, OP_EINSUM), lay[q] = w.layout;
		for (int dev = 0; dev < r.ndev; dev++)
			t[(size_t)q * (size_t)r.ndev * (size_t)per + (size_t)nt[q]++] = r.sec[(size_t)dev * (size_t)g.ops.n + (size_t)i];
	}
	double sxx = 0, sxy = 0;
	for (int q = 0; q < NLAYOUT && rc == 0; q++) {
		double m = median(t + (size_t)q * (size_t)r.ndev * (size_t)per, nt[q]), x = lay[q] / m;
		sxx += x * x, sxy += x * (m - base[q]) / m;
	}
	hw->matrix_element = rc == 0 && sxx > 0 && sxy > 0 ? sxy / sxx : 0;
	free(t), free(text);
	cost_run_free(&r);
	graph_free(&g);
	return rc;
}

/* The executor's time between kernels per op in a program of `count`
 * elementwise ops with n x n results (and an all_reduce after every 8). */
static double between_program(int ndev, int n, int count, int runs)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	fprintf(f, "spmd: true\nmesh: {x: %d}\ninputs: {a: {shape: [%d, %d]}, b: {shape: [%d, %d]}}\nops:\n", ndev, n,
	        n, n, n);
	for (int i = 0; i < count; i++) {
		fprintf(f, "  - {out: t%d, op: %s}\n", i, i % 2 ? "neg, in: [a]" : "add, in: [a, b]");
		if (i % 8 == 7)
			fprintf(f, "  - {out: l%d, op: mul, in: [a, 0.5], sharding: {dims: [null, null], partial: [x]}}\n"
			           "  - {out: r%d, op: all_reduce, in: [l%d], axes: [x], reduce: sum}\n", i, i, i);
	}
	fprintf(f, "outputs: [t%d]\n", count - 1);
	fclose(f);
	Graph g;
	CostRun r;
	double t = run_program(text, runs, &g, &r) == 0 ? between_seconds(&r) : -1;
	free(text);
	cost_run_free(&r);
	graph_free(&g);
	return t;
}

/* The executor's time between kernels: a fixed part (tiny results) and
 * the rate at which it allocates results (64x64, 16 KB). */
static int measure_between(HwProfile *hw, bool quick)
{
	int ndev = 2 * hw->host_cores, runs = quick ? 2 : 5;
	double tiny = between_program(ndev, 2, quick ? 16 : 64, runs);
	double mid = between_program(ndev, 64, quick ? 16 : 64, runs);
	if (tiny < 0 || mid < 0)
		return -1;
	hw->dispatch_overhead = tiny > 0 ? tiny : 1e-9;
	hw->dispatch_bw = mid > tiny ? 64.0 * 64 * 4 / (mid - tiny) : hw->mem_bw;
	return 0;
}

/* Collectives inside a program: `count` all_reduces and all_gathers of n
 * floats per device on ndev devices, in turn, each after one local op. */
static char *coll_program(int ndev, int64_t n, int count)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	fprintf(f, "spmd: true\nmesh: {x: %d}\ninputs: {a: {shape: [%lld]}, g: {shape: [%lld], sharding: [x]}}\nops:\n",
	        ndev, (long long)n, (long long)n);
	for (int i = 0; i < count; i++)
		if (i % 2 == 0)
			fprintf(f, "  - {out: l%d, op: mul, in: [a, 0.5], sharding: {dims: [null], partial: [x]}}\n"
			           "  - {out: c%d, op: all_reduce, in: [l%d], axes: [x], reduce: sum}\n", i, i, i);
		else
			fprintf(f, "  - {out: l%d, op: neg, in: [g], sharding: [x]}\n"
			           "  - {out: c%d, op: all_gather, in: [l%d], axes: [x], dim: 0}\n", i, i, i);
	fprintf(f, "outputs: [c%d]\n", count - 1);
	fclose(f);
	return text;
}

/* A collectives program's own collective time, by the cost model's account
 * of devices taking turns on the cores: its step less its devices' local
 * work times D / C; and the coefficients of alpha and 1/bw in the model's
 * time of those collectives (barriers and volume over share). */
static int coll_residual(const HwProfile *hw, int ndev, int64_t n, int count, double *res, double *ka, double *kb)
{
	Graph g;
	CostRun r;
	char *text = coll_program(ndev, n, count);
	int rc = run_program(text, 3, &g, &r);
	double share = hw_share(hw, ndev), bytes = 4.0 * (double)n;
	*ka = *kb = *res = 0;
	if (rc == 0) {
		*res = r.step - local_seconds(&g, &r) / share;
		for (int i = 0; i < count; i++) {
			bool gather = i % 2;
			*ka += cost_thread_barriers(gather ? RS_ALL_GATHER : RS_ALL_REDUCE) / share;
			*kb += (gather ? (ndev - 1) * bytes : 2.0 * (ndev - 1) / ndev * bytes) / share;
		}
	}
	free(text);
	cost_run_free(&r);
	graph_free(&g);
	return rc;
}

/* Fit the barrier latency and the copy bandwidth, by least squares, to
 * collectives of 1 and of many floats inside programs on C and 2C device
 * threads: the thread backend's model, 3a + 2(n-1)/n B/bw for an
 * all_reduce, 2a + (n-1) B/bw for an all_gather, each divided by share(n). */
static int fit_collectives(HwProfile *hw, bool quick)
{
	int count = quick ? 8 : 24, rc = 0;
	int64_t big = quick ? 1 << 12 : 1 << 16;
	double s11 = 0, s12 = 0, s22 = 0, y1 = 0, y2 = 0;
	for (int ndev = hw->host_cores; ndev <= 2 * hw->host_cores && rc == 0; ndev += hw->host_cores)
		for (int64_t n = 1; n <= big && rc == 0; n *= big) {
			double res = 0, ka = 0, kb = 0;
			rc = coll_residual(hw, ndev, n, count, &res, &ka, &kb);
			s11 += ka * ka, s12 += ka * kb, s22 += kb * kb, y1 += ka * res, y2 += kb * res;
		}
	double det = s11 * s22 - s12 * s12, alpha = 1e-6, beta = 1e-9;
	if (rc == 0 && det > 0) {
		alpha = (y1 * s22 - y2 * s12) / det, beta = (y2 * s11 - y1 * s12) / det;
		alpha = alpha > 0 ? alpha : y1 / s11 > 0 ? y1 / s11 : 1e-6;
		beta = beta > 0 ? beta : 1e-11;
	}
	hw->latency = alpha, hw->link_bw = 1 / beta;
	hw->dcn_bw = hw->link_bw, hw->dcn_latency = hw->latency;
	return rc;
}

/* Executor figures of one core while every core works: the GEMM, vector,
 * memory and transcendental rates, less the kernel overheads of ops run
 * back to back, which go into ov and mo (for the rates measured later). */
static int measure_executor(HwProfile *hw, bool quick, double *ov, double *mo)
{
	int cores = hw->host_cores;
	int reps = quick ? 5 : 31;
	char in[256];
	*ov = time_op("{a: {shape: [2, 2]}, b: {shape: [2, 2]}}",
	              "op: add, in: [a, b]|op: mul, in: [a, b]|op: exp, in: [a]|op: relu, in: [a]|"
	              "op: reduce_sum, in: [a], axes: [1]|op: sub, in: [a, b]|op: neg, in: [a]|op: max, in: [a, b]",
	              reps * 2, cores);
	*mo = time_op("{a: {shape: [2, 2]}, b: {shape: [2, 2]}, c: {shape: [2, 2, 2]}, "
	              "e: {shape: [2, 2, 2]}, f: {shape: [2, 2, 2, 2]}, h: {shape: [2, 2, 2, 2]}}",
	              "op: einsum, eq: \"ik,kj->ij\", in: [a, b]|op: einsum, eq: \"bsm,mhd->bshd\", in: [c, e]|"
	              "op: einsum, eq: \"bqhd,bkhd->bhqk\", in: [f, h]|op: einsum, eq: \"bsm,bsf->mf\", in: [c, e]",
	              reps * 2, cores);
	int64_t nv = 1 << 14, nb = quick ? 1 << 16 : 1 << 20, m = quick ? 64 : 256, k = quick ? 128 : 512;
	snprintf(in, sizeof in, "{a: {shape: [%lld]}, b: {shape: [%lld]}}", (long long)nv, (long long)nv);
	double tv = time_op(in, "op: max, in: [a, b]", reps, cores);
	snprintf(in, sizeof in, "{a: {shape: [%lld]}, b: {shape: [%lld]}}", (long long)nb, (long long)nb);
	double tb = time_op(in, "op: add, in: [a, b]", reps, cores);
	snprintf(in, sizeof in, "{a: {shape: [%lld]}}", (long long)nv);
	double tt = time_op(in, "op: exp, in: [a]", reps, cores);
	snprintf(in, sizeof in, "{a: {shape: [%lld, %lld]}, b: {shape: [%lld, %lld]}}", (long long)m, (long long)k,
	         (long long)k, (long long)k);
	double tg = time_op(in, "op: einsum, eq: \"ik,kj->ij\", in: [a, b]", quick ? 3 : 41, cores);
	if (*ov < 0 || *mo < 0 || tv < 0 || tb < 0 || tt < 0 || tg < 0)
		return -1;
	double gemm = 2.0 * (double)m * (double)k * (double)k / (tg > 2 * *mo ? tg - *mo : tg / 2);
	hw->vector_flops = (double)nv / (tv > 2 * *ov ? tv - *ov : tv / 2);
	hw->mem_bw = 12.0 * (double)nb / (tb > 2 * *ov ? tb - *ov : tb / 2);
	double tr = tt - *ov - (double)nv / hw->vector_flops;
	hw->transcendentals = (double)nv / (tr > 0.1 * tt ? tr : 0.1 * tt);
	for (int t = 0; t < DT_COUNT; t++)
		hw->flops[t] = t == DT_I32 ? hw->vector_flops : gemm;
	return 0;
}

/* The executor's own rate of every elementwise, reduction and
 * normalization kind: elements per second on a 128x128 operand, less the
 * overhead ov of ops run back to back. */
static void measure_op_rates(HwProfile *hw, double ov, bool quick)
{
	const char *in = "{a: {shape: [128, 128]}, b: {shape: [128, 128]}}";
	for (int k = 0; k < OP_COUNT; k++) {
		char op[128];
		if (!kind_op(k, op, sizeof op)[0])
			continue;
		double t = time_op(in, op, quick ? 3 : 15, hw->host_cores);
		if (t > 0)
			hw->op_rate[k] = 128.0 * 128 / (t > 2 * ov ? t - ov : t / 2);
	}
}

/* conv2d's im2col copies and its GEMM's half width (cost_model.md): convs
 * of 2x16x16 images with 3x3 kernels, one copy-bound (1 channel in, 8
 * out) and two GEMM-bound (16 in, 4 and 32 out), fitted by least squares
 * on their relative error to t = mo + copies c + flops (1 + h / C_out) / peak. */
static void measure_conv(HwProfile *hw, double mo, bool quick)
{
	static const int chan[3][2] = {{1, 8}, {16, 4}, {16, 32}};
	double s11 = 0, s12 = 0, s22 = 0, y1 = 0, y2 = 0, peak = hw->flops[DT_F32];
	for (int i = 0; i < 3; i++) {
		int c = chan[i][0], o = chan[i][1];
		char in[160];
		snprintf(in, sizeof in, "{x: {shape: [2, 16, 16, %d]}, k: {shape: [3, 3, %d, %d]}}", c, c, o);
		double t = time_op(in, "op: conv2d, in: [x, k], padding: same", quick ? 3 : 21, hw->host_cores);
		double copies = 2.0 * 16 * 16 * 3, flops = 2.0 * 2 * 16 * 16 * 9 * c * o;
		if (t <= 0)
			return;
		double a = copies / t, b = flops / (peak * o) / t, y = (t - mo - flops / peak) / t;
		s11 += a * a, s12 += a * b, s22 += b * b, y1 += a * y, y2 += b * y;
	}
	double det = s11 * s22 - s12 * s12;
	if (det <= 0)
		return;
	double copy = (y1 * s22 - y2 * s12) / det, half = (y2 * s11 - y1 * s12) / det;
	hw->im2col_copy = copy > 0 ? copy : 0;
	hw->matrix_half_width = half > 0 ? half : 0;
}

static int calibrate(const CliParse *p)
{
	const char *out = cli_get(p, O_OUT), *name = cli_get(p, O_NAME);
	if (!out) {
		fprintf(stderr, "spmd calibrate: error: expected -o PROFILE.yaml, found none (see spmd calibrate --help)\n");
		return 2;
	}
	if (file_writable(out) != 0) { /* before the measurements, not after them */
		fprintf(stderr, "spmd calibrate: error: expected a file to write, found %s: %s\n", out, strerror(errno));
		return 2;
	}
	HwProfile hw = {.topo = TOPO_THREADS, .ndims = 1, .dims = {THREADS_MAX_DEVICES}, .fusion = false};
	snprintf(hw.name, sizeof hw.name, "%s", name ? name : "local");
	long cores = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	hw.host_cores = cores > 0 ? (int)cores : 1;
	hw.mem_capacity = pages > 0 && psize > 0 ? (double)pages * (double)psize : 1e9;
	bool quick = cli_flag(p, O_QUICK);
	double ov, mo;
	int threads = openblas_get_num_threads();
	openblas_set_num_threads(1); /* one device is one core */
	Progress bar;
	progress_begin(&bar, "calibrate", 7, "measurements");
	int rc = measure_executor(&hw, quick, &ov, &mo);
	if (rc == 0) {
		progress_set(&bar, 1);
		measure_op_rates(&hw, ov, quick);
		progress_set(&bar, 2);
		measure_conv(&hw, mo, quick);
		progress_set(&bar, 3);
		rc = measure_fixed(&hw, quick);
		progress_set(&bar, 4);
		rc = rc || measure_layout(&hw, quick);
		progress_set(&bar, 5);
		rc = rc || measure_between(&hw, quick);
		progress_set(&bar, 6);
		rc = rc || fit_collectives(&hw, quick) ? -1 : 0;
	}
	progress_end(&bar);
	openblas_set_num_threads(threads);
	if (rc != 0) {
		fprintf(stderr, "spmd calibrate: error: expected the measurements to run, found a failure\n");
		return 2;
	}
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
