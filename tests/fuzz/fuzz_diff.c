/* fuzz_diff.c: differential.  The input bytes choose a small model — a
 * mesh of up to 3x3 devices (uneven splits included), on the default
 * profile or on one where collective matmul pays, an input and a chain
 * of up to 8 ops (elementwise, einsum with a sharded param, softmax,
 * log_softmax, layer_norm, reductions, transpose) with random shardings —
 * which is partitioned and run on threads, one per device, and by the
 * reference executor on the whole model.  Outputs that differ (beyond
 * rounding, or NaN in different places) are a finding; "rounding" is
 * measured by jittered runs of the reference, as --check does.  Models whose
 * reference run holds a value whose square overflows f32 are left out
 * (beyond_f32_square). */
#include "fuzz.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "../../spmd/load.h"
#include "../../partitioner/pipeline.h"
#include "../../runtime/exec.h"
#include "../../runtime/spmd_run.h"
#include "../../cli/cli.h"

/* One op on h (shape r x c) into h<i>; updates r and c. */
static void gen_op(FuzzBytes *b, FuzzText *params, FuzzText *ops, int i, int *r, int *c)
{
	/* sqrt and log make NaN in the same places on both sides: legal, not a mismatch */
	static const char *const unary[] = {"neg", "abs", "tanh", "sigmoid", "relu", "gelu", "square", "exp", "sqrt", "log"};
	static const char *const binary[] = {"add", "sub", "mul", "max", "min"};
	static const char *const reduce[] = {"reduce_sum", "reduce_max", "reduce_mean"};
	char sh[64] = "";
	if (fuzz_pick(b, 2))
		fuzz_sharding(b, 2, sh, sizeof sh);
	switch (fuzz_pick(b, 7)) {
	case 0:
		fuzz_put(ops, "  - {out: h%d, op: %s, in: [h%d]%s}\n", i, unary[fuzz_pick(b, 10)], i - 1, sh);
		break;
	case 1:
		fuzz_put(ops, "  - {out: h%d, op: %s, in: [h%d, h%d]%s}\n", i, binary[fuzz_pick(b, 5)], i - 1, i - 1, sh);
		break;
	case 2: {
		int k = 1 + fuzz_pick(b, 8);
		char psh[64] = "";
		fuzz_sharding(b, 2, psh, sizeof psh);
		fuzz_put(params, "  w%d: {shape: [%d, %d]%s, init: {normal: 0.5}}\n", i, *c, k, psh);
		fuzz_put(ops, "  - {out: h%d, op: einsum, eq: \"rc,ck->rk\", in: [h%d, w%d]%s}\n", i, i - 1, i, sh);
		*c = k;
		break;
	}
	case 3:
		fuzz_put(ops, "  - {out: h%d, op: %s, in: [h%d], axis: %d%s}\n", i, fuzz_pick(b, 2) ? "softmax" : "log_softmax", i - 1,
		    fuzz_pick(b, 2), sh);
		break;
	case 4:
		fuzz_put(ops, "  - {out: h%d, op: layer_norm, in: [h%d], axis: %d%s}\n", i, i - 1, fuzz_pick(b, 2), sh);
		break;
	case 5: {
		int ax = fuzz_pick(b, 2);
		fuzz_put(ops, "  - {out: h%d, op: %s, in: [h%d], axes: [%d], keepdims: true%s}\n", i, reduce[fuzz_pick(b, 3)], i - 1, ax,
		    sh);
		*(ax ? c : r) = 1;
		break;
	}
	default: {
		fuzz_put(ops, "  - {out: h%d, op: einsum, eq: \"rc->cr\", in: [h%d]%s}\n", i, i - 1, sh);
		int t = *r;
		*r = *c, *c = t;
	}
	}
}

/* A profile of slow einsums and fast links, on which the partitioner's
 * collective matmul (partitioner/window.h) takes the gathers and scatters
 * next to einsums even on these small models: its file's path.  On a
 * switch; ring: on a closed ring, where a gather's blocks go both ways. */
static const char *einsum_bound_profile(int ring)
{
	static const char *path[2];
	static const char head[] = "name: einsum_bound\ncompute: {f32: 1e9}\nvector: 1e13\ntranscendentals: 1e13\n"
	                           "kernel_overhead: 1e-12\nmemory: {bandwidth: 1e13, capacity: 1e12}\n";
	static const char *const ic[2] = {
		"interconnect: {topology: switch, dims: [64], link_bandwidth: 1e10, latency: 1e-12}\n",
		"interconnect: {topology: ring, dims: [64], link_bandwidth: 1e10, latency: 1e-12}\n"};
	if (!path[ring]) {
		char text[512];
		int n = snprintf(text, sizeof text, "%s%s", head, ic[ring]);
		path[ring] = fuzz_path(ring ? "einsum_bound_ring.yaml" : "einsum_bound.yaml");
		fuzz_write(path[ring], text, (size_t)n);
	}
	return path[ring];
}

/* The model the bytes choose (a static buffer).  One in two partitions on
 * the default profile, one in two on einsum_bound_profile (on a switch, or
 * a byte after: on a ring). */
static const char *gen_model(FuzzBytes *b)
{
	static char pbuf[4096], obuf[4096], mbuf[10000];
	FuzzText params = {pbuf, 0, sizeof pbuf}, ops = {obuf, 0, sizeof obuf}, m = {mbuf, 0, sizeof mbuf};
	int na = 1 + fuzz_pick(b, 3), nb = 1 + fuzz_pick(b, 3), r = 1 + fuzz_pick(b, 8), c = 1 + fuzz_pick(b, 8), nops = 1 + fuzz_pick(b, 8);
	char sh[64];
	fuzz_sharding(b, 2, sh, sizeof sh);
	pbuf[0] = 0;
	fuzz_put(&ops, "ops:\n  - {out: h0, op: copy, in: [x]}\n");
	int c0 = c, r0 = r;
	for (int i = 1; i <= nops; i++)
		gen_op(b, &params, &ops, i, &r, &c);
	/* chosen last: an input made before reads as it did (its bytes end first) */
	if (fuzz_pick(b, 2)) {
		int ring = fuzz_pick(b, 2);
		fuzz_put(&m, "name: diff\nmesh: {axes: {a: %d, b: %d}, hardware: %s}\n", na, nb, einsum_bound_profile(ring));
	}
	else
		fuzz_put(&m, "name: diff\nmesh: {a: %d, b: %d}\n", na, nb);
	fuzz_put(&m, "inputs:\n  x: {shape: [%d, %d], dtype: f32%s}\n", r0, c0, sh);
	fuzz_put(&m, "%s%s%soutputs: [h%d]\n", params.len ? "params:\n" : "", pbuf, obuf, nops);
	return mbuf;
}

/* Reference runs with each op's result jittered by a few units of
 * roundoff (ExecOpts.jitter), or (odd seeds) with the results of sums
 * that cancel to within rounding made exactly 0: where they disagree with
 * the reference, the outcome is rounding's choice (the sqrt of a sum that
 * is zero up to rounding is NaN or small by the sign of the noise, -0 when
 * it cancels exactly).  As spmd run --check does (cli/check.h), when
 * special values differ where NOISE_RUNS runs do not explain it, MORE_RUNS
 * more say whether rounding decides them: whether the sign of a sum that
 * cancels comes out one way or the other can take more than eight draws. */
enum { NOISE_RUNS = 8, MORE_RUNS = 14 };

static bool special(float x) { return !isfinite(x); }

/* Some value of the reference run is beyond sqrt(FLT_MAX), where its square
 * overflows f32.  The reference computes a layer_norm's statistics in double;
 * split along its axis they come from f32 ops (square, then sums), which
 * overflow there as numpy's f32 layer_norm does: a difference of range, not
 * of partitioning (docs/partitioning.md, "How --check judges"). */
static bool beyond_f32_square(const Graph *g, const Tensor *vals)
{
	for (int v = 0; v < g->values.n; v++) {
		const Tensor *t = &vals[v];
		if (!t->data || t->dtype == DT_I32)
			continue;
		const float *x = tensor_f32(t);
		for (int64_t i = 0, n = shape_numel(&t->shape); i < n; i++)
			if (isfinite(x[i]) && fabsf(x[i]) > 1.8446744e19f) /* 2^64 */
				return true;
	}
	return false;
}

/* got agrees with want: the same special values (NaN, inf) in the same
 * places, the rest within rounding of want's largest magnitude plus 4 times
 * the noise runs' own difference at that element; where a noise run's
 * special values differ from want's, either outcome is accepted. */
static bool agree(const Tensor *got, const Tensor *want, Tensor *const *noise, int nruns)
{
	int64_t n = shape_numel(&want->shape);
	if (got->dtype != want->dtype || shape_numel(&got->shape) != n)
		return false;
	const float *g = tensor_f32(got), *w = tensor_f32(want);
	double scale = 1;
	for (int64_t i = 0; i < n; i++)
		if (isfinite(w[i]) && fabs(w[i]) > scale)
			scale = fabs(w[i]);
	for (int64_t i = 0; i < n; i++) {
		double spread = 0;
		bool undetermined = false;
		for (int r = 0; r < nruns; r++) {
			float x = tensor_f32(noise[r])[i];
			undetermined |= !same_special(x, w[i]);
			if (isfinite(x) && isfinite(w[i]) && fabs((double)x - w[i]) > spread)
				spread = fabs((double)x - w[i]);
		}
		if (undetermined)
			continue;
		if (special(w[i]) || special(g[i])) {
			if (!same_special(g[i], w[i]))
				return false;
		} else if (fabs((double)g[i] - w[i]) > 1e-3 * scale + 4 * spread)
			return false;
	}
	return true;
}

/* Noise run r of the reference (jitter seed r + 1) into noise[r]. */
static void noise_run(const Graph *g, Tensor **noise, int r, const char *model)
{
	Diag d;
	fuzz_diag(&d);
	noise[r] = xcalloc((size_t)g->values.n + 1, sizeof *noise[r]);
	ExecOpts jo = {.seed = 7, .jitter = 2, .jitter_abs = 2, .jitter_seed = (uint64_t)r + 1};
	if (exec_run(g, noise[r], NULL, &jo, &d) != 0)
		FUZZ_FINDING("a noise run of the reference fails: %s\n%s", d.last, model);
}

static void differ(const Graph *g, const char *model)
{
	Diag d;
	fuzz_diag(&d);
	Graph prog;
	int *map = NULL;
	HwProfile hw;
	cli_pass_prices(g, &hw);
	graph_init(&prog);
	graph_free(&prog);
	if (pipeline_partition((Graph *)g, &hw, &prog, &map, NULL, &d) != 0)
		FUZZ_FINDING("a model that loads does not partition: %s\n%s", d.last, model);
	Tensor *vals = xcalloc((size_t)g->values.n + 1, sizeof *vals), *outs = xcalloc((size_t)g->outputs.n + 1, sizeof *outs);
	ExecOpts eo = {.seed = 7};
	bool *keep = xcalloc((size_t)g->values.n + 1, sizeof *keep); /* every value, for beyond_f32_square */
	for (int v = 0; v < g->values.n; v++)
		keep[v] = true;
	int rc = exec_run(g, vals, keep, &eo, &d);
	free(keep);
	if (rc != 0)
		FUZZ_FINDING("the reference fails: %s\n%s", d.last, model);
	if (beyond_f32_square(g, vals)) {
		exec_free_values(g, vals);
		free(vals), free(outs), free(map);
		graph_free(&prog);
		return;
	}
	Tensor *noise[NOISE_RUNS + MORE_RUNS];
	int nruns = 0;
	for (; nruns < NOISE_RUNS; nruns++)
		noise_run(g, noise, nruns, model);
	Tensor *given;
	int64_t *range;
	spmd_leaf_opts(g, &prog, map, NULL, 0, &given, &range);
	SpmdOpts so = {.seed = 7, .given = given, .id_range = range};
	if (spmd_run(&prog, &so, outs, NULL, &d) != 0)
		FUZZ_FINDING("the partitioned run fails: %s\n%s", d.last, model);
	for (int i = 0; i < g->outputs.n; i++) {
		Tensor *nv[NOISE_RUNS + MORE_RUNS];
		for (int r = 0; r < nruns; r++)
			nv[r] = &noise[r][g->outputs.a[i]];
		if (!agree(&outs[i], &vals[g->outputs.a[i]], nv, nruns) && nruns == NOISE_RUNS) {
			for (; nruns < NOISE_RUNS + MORE_RUNS; nruns++) /* more draws of the rounding */
				noise_run(g, noise, nruns, model), nv[nruns] = &noise[nruns][g->outputs.a[i]];
		}
		if (!agree(&outs[i], &vals[g->outputs.a[i]], nv, nruns))
			FUZZ_FINDING("output %s differs from the reference\n%s", g->values.a[g->outputs.a[i]].name, model);
		tensor_free(&outs[i]);
	}
	for (int r = 0; r < nruns; r++) {
		exec_free_values(g, noise[r]);
		free(noise[r]);
	}
	exec_free_values(g, vals);
	free(vals), free(outs), free(given), free(range), free(map);
	graph_free(&prog);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FuzzBytes b = {data, size};
	const char *model = gen_model(&b);
	Graph g;
	Diag d;
	fuzz_diag(&d);
	if (model_load_string(&g, model, "diff.yaml", &d) == 0)
		differ(&g, model);
	graph_free(&g);
	return 0;
}
