/* fuzz_autoshard.c: the search, end to end.  The input bytes choose a small
 * training model — fuzz_train's chain of ops, or two to five copies of one
 * random layer (names l<i>.*, so that the search finds repeated layers and
 * estimates on proxies), whose params may be annotated in every layer, in
 * the first only, or not at all, may be one sharding group (shard_as) over
 * the layers, and carry their own training keys, a third
 * of them pipelined on a third mesh axis (stages: auto; the microbatches,
 * schedule and recompute random) — and
 * the options: --devices 1 to 8 or a --mesh of the model's two axes, a
 * memory budget (the profile's capacity, or a few KiB to a few MiB, where
 * the search may find that nothing fits), --per-layer, --keep-train and the
 * profile.  Findings: autoshard fails on these valid options; it returns a
 * plan over the budget; on one thread and on two the answers differ; the
 * written model does not load, or `spmd cost` would price it to another
 * step time or peak than the answer's; two training steps of the written
 * model, partitioned on threads, differ from the reference (`spmd run
 * --check`). */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#include "../../spmd/load.h"
#include "../../train/train.h"
#include "../../partitioner/autoshard.h"
#include "../../cost_model/cost.h"
#include "../../cost_model/pipeline_cost.h"
#include "../../cli/cli.h"
#include "../../cli/cmd_train.h"
#include "../../cli/measure.h"

enum { MAX_LAYER_OPS = 4 };

/* Two to five copies of one layer of up to four ops on a [r, d] stream;
 * *pipe: a third mesh axis, s, and a pipeline section on it with stages:
 * auto (its microbatches, schedule and recompute random, written or not). */
static const char *layered_model(FuzzBytes *b, bool *pipe)
{
	static const char *const unary[] = {"tanh", "sigmoid", "gelu", "relu"};
	static char pbuf[8192], obuf[8192], mbuf[20000];
	FuzzText params = {pbuf, 0, sizeof pbuf}, ops = {obuf, 0, sizeof obuf}, m = {mbuf, 0, sizeof mbuf};
	int na = 1 + fuzz_pick(b, 3), nb = 1 + fuzz_pick(b, 3), r = 1 + fuzz_pick(b, 8), d = 2 + fuzz_pick(b, 7);
	int layers = 2 + fuzz_pick(b, 4), k = 1 + fuzz_pick(b, MAX_LAYER_OPS);
	int kind[MAX_LAYER_OPS], fn[MAX_LAYER_OPS], annot[MAX_LAYER_OPS], group[MAX_LAYER_OPS];
	char psh[MAX_LAYER_OPS][64], keys[MAX_LAYER_OPS][96], sh[64];
	for (int j = 0; j < k; j++) {
		kind[j] = j == 0 ? 0 : fuzz_pick(b, 5); /* every layer has a weight */
		fn[j] = fuzz_pick(b, 4);
		annot[j] = fuzz_pick(b, 3); /* 0 none, 1 every layer's, 2 the first layer's only */
		fuzz_sharding(b, kind[j] == 0 ? 2 : 1, psh[j], sizeof psh[j]);
		fuzz_param_keys(b, keys[j], sizeof keys[j]);
		group[j] = fuzz_pick(b, 4) == 0; /* every layer's in one sharding group (shard_as) */
	}
	fuzz_sharding(b, 2, sh, sizeof sh);
	*pipe = fuzz_pick(b, 3) == 0;
	if (*pipe) {
		static const char *const sched[] = {"", ", schedule: gpipe", ", schedule: 1f1b", ", schedule: interleaved"};
		static const char *const recomp[] = {"", ", recompute: true", ", recompute: false"};
		int ns = 1 + fuzz_pick(b, 3), mb = 1 + fuzz_pick(b, r);
		while (r % mb)
			mb--;
		fuzz_put(&m, "name: layered\nmesh: {a: %d, b: %d, s: %d}\npipeline: {axis: s, microbatches: %d%s%s, stages: auto}\n", na,
		         nb, ns, mb, sched[fuzz_pick(b, 4)], recomp[fuzz_pick(b, 3)]);
	} else
		fuzz_put(&m, "name: layered\nmesh: {a: %d, b: %d}\n", na, nb);
	fuzz_put(&m, "inputs:\n  x: {shape: [%d, %d]%s}\n", r, d, sh);
	fuzz_sharding(b, 2, sh, sizeof sh);
	fuzz_put(&m, "  target: {shape: [%d, %d]%s}\n", r, d, sh);
	char prev[32] = "x";
	for (int i = 0; i < layers; i++)
		for (int j = 0; j < k; j++) {
			const char *ps = annot[j] == 1 || (annot[j] == 2 && i == 0) ? psh[j] : "";
			char gs[32] = "";
			if (group[j])
				snprintf(gs, sizeof gs, ", shard_as: g%d", j);
			switch (kind[j]) {
			case 0:
				fuzz_put(&params, "  l%d.w%d: {shape: [%d, %d]%s%s%s, init: {normal: 0.5}}\n", i, j, d, d, ps, gs, keys[j]);
				fuzz_put(&ops, "  - {out: l%d.h%d, op: einsum, eq: \"rc,ck->rk\", in: [%s, l%d.w%d]}\n", i, j, prev, i, j);
				break;
			case 1:
				fuzz_put(&params, "  l%d.b%d: {shape: [%d]%s%s%s, init: {normal: 0.5}}\n", i, j, d, ps, gs, keys[j]);
				fuzz_put(&ops, "  - {out: l%d.h%d, op: add, in: [%s, l%d.b%d]}\n", i, j, prev, i, j);
				break;
			case 2: /* over three columns or more (fuzz_train_model says why) */
				if (d > 2) {
					fuzz_put(&ops, "  - {out: l%d.h%d, op: layer_norm, in: [%s], axis: 1}\n", i, j, prev);
					break;
				}
				/* fall through */
			case 3:
				fuzz_put(&ops, "  - {out: l%d.h%d, op: %s, in: [%s]}\n", i, j, unary[fn[j]], prev);
				break;
			default:
				fuzz_put(&ops, "  - {out: l%d.h%d, op: softmax, in: [%s], axis: 1}\n", i, j, prev);
			}
			snprintf(prev, sizeof prev, "l%d.h%d", i, j);
		}
	fuzz_put(&ops, "  - {out: loss, op: mse, in: [%s, target]}\n", prev);
	fuzz_put(&m, "params:\n%sops:\n%soutputs: [loss]\n", pbuf, obuf);
	fuzz_train_section(b, &m);
	return mbuf;
}

/* The written model at path priced as `spmd cost` prices it
 * (cost_prepare_opts, cost_estimate_step): the steady step and the peak,
 * or a pipeline's scheduled step and its peak with the activations in
 * flight.  The loaded model goes into *model (freed by the caller). */
static bool price(const char *path, const HwProfile *hw, Graph *model, double *t, int64_t *peak)
{
	Graph prog;
	CostStep step;
	Diag d;
	fuzz_diag(&d);
	if (cost_prepare_opts(path, NULL, -1, model, &prog, &step, NULL, NULL, &d) != 0) {
		graph_free(&prog);
		return false;
	}
	CostEstimate e;
	cost_estimate_step(&prog, hw, &step, &e);
	*t = e.overlapped_s, *peak = e.mem.peak;
	bool ok = true;
	if (model->pipeline) { /* the scheduled step */
		PipeCost pc;
		ok = cost_pipeline(&prog, hw, &e, model->pipeline, &pc) == 0;
		*t = pc.step_s, *peak = cost_pipeline_peak(&e, &pc);
		cost_pipeline_free(&pc);
	}
	cost_step_free(&step);
	cost_estimate_free(&e);
	graph_free(&prog);
	return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FuzzBytes b = {data, size};
	bool pipe = false;
	const char *model = fuzz_pick(&b, 2) ? layered_model(&b, &pipe) : fuzz_train_model(&b);
	static const char *const profiles[] = {"tpu-v4", "h100-nvlink", "tpu-v3"};
	HwProfile hw;
	hw_profile_builtin(&hw, profiles[fuzz_pick(&b, 3)]);
	Graph g;
	Diag d;
	fuzz_diag(&d);
	if (model_load_string(&g, model, "auto.yaml", &d) != 0 || (g.train && train_build(&g, &d) != 0)) {
		graph_free(&g);
		if (pipe) /* a pipeline the model cannot have (interleaved on a count that is no multiple of the stages,
		           * recompute in train: rather than in pipeline:, ...) */
			return 0;
		FUZZ_FINDING("a generated model does not load: %s\n%s", d.last, model);
	}
	graph_free(&g);
	char mesh[48];
	int ma = 1 + fuzz_pick(&b, 3), mb = 1 + fuzz_pick(&b, 3), ms = 1 + fuzz_pick(&b, 3);
	if (pipe)
		snprintf(mesh, sizeof mesh, "a=%d,b=%d,s=%d", ma, mb, ms);
	else
		snprintf(mesh, sizeof mesh, "a=%d,b=%d", ma, mb);
	int ndev = fuzz_pick(&b, 2) ? 1 + fuzz_pick(&b, 8) : 0;
	int small = fuzz_pick(&b, 3) == 0;
	/* as spmd autoshard --hardware: the passes priced on it, and the plan naming it */
	AutoOpts o = {.hw = &hw, .pass_hw = &hw, .hardware = hw.name, .budget = small ? (double)(4096 << fuzz_pick(&b, 11)) : hw.mem_capacity,
	              .mesh = ndev ? NULL : mesh, .ndev = ndev, .per_layer = fuzz_pick(&b, 4) == 0,
	              .keep_train = fuzz_pick(&b, 3) == 0, .jobs = 1};
	o.per_layer &= !pipe; /* a pipeline is priced whole: per layer, a minute an input in the sanitizer build */
	if (getenv("SPMD_FUZZ_SHOW")) /* what an input is, to reproduce it with spmd autoshard */
		fprintf(stderr, "%s--- %s %s --hardware %s --memory %.0f%s%s\n", model, ndev ? "--devices" : "--mesh",
		        ndev ? (snprintf(mesh, sizeof mesh, "%d", ndev), mesh) : mesh, hw.name, o.budget,
		        o.per_layer ? " --per-layer" : "", o.keep_train ? " --keep-train" : "");
	AutoResult r, r2;
	int arc = autoshard(model, "auto.yaml", &o, &r, &d);
	if (arc != 0 && pipe && strstr(d.last, "stages on the pipeline's axis")) {
		autoshard_free(&r); /* more stages than the layers fill: a usage error */
		return 0;
	}
	if (arc != 0 && pipe && !ndev) { /* a pipeline the --mesh given cannot have (its microbatches no multiple of
	                                   * the stages, ...): said as spmd partition --mesh says it, a usage error */
		Graph h;
		Diag hd;
		fuzz_diag(&hd);
		LoadOpts lo = {mesh, NULL};
		bool loads = model_load_string_opts(&h, model, "auto.yaml", &lo, &hd) == 0 && (!h.train || train_build(&h, &hd) == 0);
		graph_free(&h);
		if (!loads) {
			autoshard_free(&r);
			return 0;
		}
	}
	if (arc != 0)
		FUZZ_FINDING("autoshard fails (budget %.0f, %s %d): %s\n%s", o.budget, ndev ? "devices" : mesh, ndev, d.last, model);
	o.jobs = 2;
	if (autoshard(model, "auto.yaml", &o, &r2, &d) != 0)
		FUZZ_FINDING("autoshard on two threads fails: %s\n%s", d.last, model);
	if (r.found != r2.found || (r.found && (strcmp(r.text, r2.text) != 0 || r.step_s != r2.step_s)))
		FUZZ_FINDING("one thread and two give other answers:\n%s\n----\n%s\n----\n%s", r.found ? r.text : "none",
		             r2.found ? r2.text : "none", model);
	autoshard_free(&r2);
	if (r.found) {
		if ((double)r.peak > o.budget)
			FUZZ_FINDING("a plan over the budget: peak %lld, budget %.0f\n%s", (long long)r.peak, o.budget, r.text);
		const char *path = fuzz_path("plan.yaml");
		fuzz_write(path, r.text, strlen(r.text));
		double t;
		int64_t peak;
		if (!price(path, &hw, &g, &t, &peak))
			FUZZ_FINDING("the written plan does not load, partition or schedule\n%s", r.text);
		graph_free(&g);
		if (t != r.step_s || peak != r.peak)
			FUZZ_FINDING("the written plan prices to %.17g s, %lld bytes; the answer said %.17g s, %lld bytes\n%s", t,
			             (long long)peak, r.step_s, (long long)r.peak, r.text);
		/* loaded as spmd run loads it: stages: auto cut as spmd cost cuts them */
		if (model_load_string(&g, r.text, path, &d) != 0 || cost_pipeline_cut(&g, path, NULL, &d) != 0)
			FUZZ_FINDING("the written plan does not load: %s\n%s", d.last, r.text);
		TrainCmd to = {.steps = "2", .check = true, .seed = 7};
		int rc = cmd_run_train(&g, &to, &d);
		fflush(stdout);
		if (rc == 1)
			FUZZ_FINDING("the written plan's training steps differ from the reference: %s\n%s", d.last, r.text);
		if (rc != 0)
			FUZZ_FINDING("the written plan's training steps fail: %s\n%s", d.last, r.text);
		graph_free(&g);
	}
	autoshard_free(&r);
	return 0;
}
