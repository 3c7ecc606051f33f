/* fuzz_train.c: differential, for training steps.  The input bytes choose a
 * small model with a train: section — a mesh of up to 3x3 devices (uneven
 * splits included), an input, a chain of up to 6 differentiable ops with
 * params (einsum weights, biases) and random shardings, a mean-squared
 * loss — and the training settings: the optimizer, weight-update sharding
 * (off, on, auto; per param too), all_gather (the section's and each
 * param's own), prefetch, group_bytes and global-norm clipping.  Two steps
 * run partitioned on threads, one per device, and on the reference
 * executor, compared as `spmd run --check` compares them (the loss, the
 * params, the optimizer state, the gradients).  A mismatch, or a model
 * that builds but fails to partition or run, is a finding. */
#include "fuzz.h"

#include <stdarg.h>
#include <string.h>

#include "../../spmd/load.h"
#include "../../cli/cmd_train.h"

/* A param's own training keys: weight_update_sharding and all_gather, or none. */
static void param_keys(FuzzBytes *b, char *out, size_t n)
{
	static const char *const wus[] = {"", ", weight_update_sharding: on", ", weight_update_sharding: off",
	                                  ", weight_update_sharding: auto"};
	static const char *const ag[] = {"", ", all_gather: after_update", ", all_gather: before_use"};
	snprintf(out, n, "%s%s", wus[fuzz_pick(b, 4)], ag[fuzz_pick(b, 3)]);
}

/* One op on h (shape r x c) into h<i>; updates c. */
static void gen_op(FuzzBytes *b, FuzzText *params, FuzzText *ops, int i, int r, int *c)
{
	static const char *const unary[] = {"tanh", "sigmoid", "gelu", "square", "relu"};
	char sh[64] = "", psh[64] = "", keys[96];
	(void)r;
	if (fuzz_pick(b, 2))
		fuzz_sharding(b, 2, sh, sizeof sh);
	switch (fuzz_pick(b, 6)) {
	case 0:
		fuzz_put(ops, "  - {out: h%d, op: %s, in: [h%d]%s}\n", i, unary[fuzz_pick(b, 5)], i - 1, sh);
		break;
	case 1: { /* a bias over the columns */
		fuzz_sharding(b, 1, psh, sizeof psh);
		param_keys(b, keys, sizeof keys);
		fuzz_put(params, "  p%d: {shape: [%d]%s%s, init: {normal: 0.5}}\n", i, *c, psh, keys);
		fuzz_put(ops, "  - {out: h%d, op: add, in: [h%d, p%d]%s}\n", i, i - 1, i, sh);
		break;
	}
	case 2:
		fuzz_put(ops, "  - {out: h%d, op: softmax, in: [h%d], axis: 1%s}\n", i, i - 1, sh);
		break;
	case 3: /* over three columns or more: over two its result is +-1 whatever its operand, whose
	         * gradient is then rounding noise alone, which --check cannot bound (docs/testing.md) */
		if (*c > 2)
			fuzz_put(ops, "  - {out: h%d, op: layer_norm, in: [h%d], axis: 1%s}\n", i, i - 1, sh);
		else
			fuzz_put(ops, "  - {out: h%d, op: tanh, in: [h%d]%s}\n", i, i - 1, sh);
		break;
	default: { /* a weight */
		int k = 2 + fuzz_pick(b, 7); /* a width-1 bottleneck: see gen_model */
		fuzz_sharding(b, 2, psh, sizeof psh);
		param_keys(b, keys, sizeof keys);
		fuzz_put(params, "  p%d: {shape: [%d, %d]%s%s, init: {normal: 0.5}}\n", i, *c, k, psh, keys);
		fuzz_put(ops, "  - {out: h%d, op: einsum, eq: \"rc,ck->rk\", in: [h%d, p%d]%s}\n", i, i - 1, i, sh);
		*c = k;
	}
	}
}

/* The model the bytes choose (a static buffer).  Weights are two columns
 * wide or more: through one column every later row is a multiple of one
 * vector, which a layer_norm then all but ignores, so the gradients before
 * it are rounding noise amplified, beyond what --check's noise runs bound
 * (a 2 x 3 mesh, uneven splits: 7.2e-6 against 5.2e-6 on a gradient of
 * 0.08; docs/testing.md). */
static const char *gen_model(FuzzBytes *b)
{
	static const char *const opt[] = {"{type: sgd, lr: 0.05}", "{type: momentum, lr: 0.05}", "{type: adam, lr: 0.01}",
	                                  "{type: adamw, lr: 0.01}", "{type: lamb, lr: 0.01}"};
	static const char *const wus[] = {"off", "on", "auto"};
	static const char *const pre[] = {"", "  prefetch: off\n", "  prefetch: 1\n"};
	static char pbuf[4096], obuf[4096], mbuf[10000];
	FuzzText params = {pbuf, 0, sizeof pbuf}, ops = {obuf, 0, sizeof obuf}, m = {mbuf, 0, sizeof mbuf};
	int na = 1 + fuzz_pick(b, 3), nb = 1 + fuzz_pick(b, 3), r = 1 + fuzz_pick(b, 8), c = 1 + fuzz_pick(b, 8), nops = 1 + fuzz_pick(b, 6);
	char sh[64], keys[96];
	fuzz_sharding(b, 2, sh, sizeof sh);
	fuzz_put(&m, "name: train_diff\nmesh: {a: %d, b: %d}\ninputs:\n  x: {shape: [%d, %d]%s}\n", na, nb, r, c, sh);
	pbuf[0] = 0;
	fuzz_put(&ops, "ops:\n  - {out: h0, op: copy, in: [x]}\n");
	/* at least one param: the first op is a weight */
	int k = 2 + fuzz_pick(b, 7); /* a width-1 bottleneck: see gen_model */
	char psh[64];
	fuzz_sharding(b, 2, psh, sizeof psh);
	param_keys(b, keys, sizeof keys);
	fuzz_put(&params, "  p1: {shape: [%d, %d]%s%s, init: {normal: 0.5}}\n", c, k, psh, keys);
	fuzz_put(&ops, "  - {out: h1, op: einsum, eq: \"rc,ck->rk\", in: [h0, p1]}\n");
	c = k;
	for (int i = 2; i <= nops; i++)
		gen_op(b, &params, &ops, i, r, &c);
	fuzz_sharding(b, 2, sh, sizeof sh);
	fuzz_put(&m, "  target: {shape: [%d, %d]%s}\n", r, c, sh);
	fuzz_put(&ops, "  - {out: loss, op: mse, in: [h%d, target]}\n", nops);
	fuzz_put(&m, "params:\n%s%soutputs: [loss]\ntrain:\n  loss: loss\n  optimizer: %s\n  weight_update_sharding: %s\n",
	    pbuf, obuf, opt[fuzz_pick(b, 5)], wus[fuzz_pick(b, 3)]);
	if (fuzz_pick(b, 2))
		fuzz_put(&m, "  all_gather: before_use\n%s", pre[fuzz_pick(b, 3)]);
	if (fuzz_pick(b, 2))
		fuzz_put(&m, "  group_bytes: 0\n");
	if (fuzz_pick(b, 3) == 0)
		fuzz_put(&m, "  clip_global_norm: 0.5\n");
	return mbuf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FuzzBytes b = {data, size};
	const char *model = gen_model(&b);
	Graph g;
	Diag d;
	fuzz_diag(&d);
	if (model_load_string(&g, model, "train_diff.yaml", &d) != 0)
		FUZZ_FINDING("a generated model does not load: %s\n%s", d.last, model);
	TrainCmd o = {.steps = "2", .check = true, .seed = 7};
	int rc = cmd_run_train(&g, &o, &d);
	fflush(stdout); /* the check's lines, before an abort */
	if (rc == 1)
		FUZZ_FINDING("the partitioned training steps differ from the reference: %s\n%s", d.last, model);
	if (rc != 0)
		FUZZ_FINDING("the training steps fail: %s\n%s", d.last, model);
	graph_free(&g);
	return 0;
}
