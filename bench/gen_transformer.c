/* gen_transformer.c: writes an N-layer transformer model (the example's block, repeated) as YAML.
 *
 *   gen_transformer LAYERS [DATAxMODEL [BATCHxHEADS]] > model.yaml
 *   gen_transformer 12 16x16 64x16 --dmodel 2048 --seq 1024 --vocab 32000 --train --plan batch,tp,wus
 *
 * (the command exists when compiled with GEN_TRANSFORMER_MAIN; bench_scale
 * links the generator itself).  `gen_transformer 1` is the block of
 * examples/transformer_block.yaml with its names prefixed by "l0.". */
#include "gen_transformer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "../base/base.h"

enum { OPS_PER_LAYER = 21 };

typedef struct {
	char *a;
	size_t n, cap;
} Buf;

static void put(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Append printf-formatted text to b. */
static void put(Buf *b, const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		va_start(ap, fmt);
		int k = vsnprintf(b->a + b->n, b->cap - b->n, fmt, ap);
		va_end(ap);
		if ((size_t)k < b->cap - b->n) {
			b->n += (size_t)k;
			return;
		}
		b->cap = 2 * b->cap + (size_t)k + 1;
		b->a = xrealloc(b->a, b->cap);
	}
}

GenOpts gen_opts_default(int nlayer)
{
	return (GenOpts){.nlayer = nlayer, .data = 2, .model = 2, .batch = 4, .seq = 16,
	                 .dmodel = 64, .heads = 4, .dhead = 16, .mlp = 256, .plan = GEN_EXAMPLE};
}

long gen_op_count(const GenOpts *o) { return (long)o->nlayer * OPS_PER_LAYER + (o->vocab > 0 ? 5 : 0); }

/* ", sharding: SPEC" when the plan has every bit of need, else "". */
static const char *sh(const GenOpts *o, int need, const char *spec)
{
	static char buf[4][96];
	static int k;
	if ((o->plan & need) != need)
		return "";
	k = (k + 1) % 4;
	snprintf(buf[k], sizeof buf[k], ", sharding: %s", spec);
	return buf[k];
}

/* The batch dim's entry: data when the plan splits the batch. */
static const char *bd(const GenOpts *o) { return o->plan & GEN_BATCH ? "data" : "null"; }

/* The residual stream's sharding ([data, null, null], or [data, model,
 * null] with sequence parallelism), when the plan pins it. */
static const char *resid(const GenOpts *o, char *buf, size_t n)
{
	if (!(o->plan & (GEN_TP | GEN_SP)))
		return "";
	snprintf(buf, n, ", sharding: [%s, %s, null]", bd(o), o->plan & GEN_SP ? "model" : "null");
	return buf;
}

/* Sequence parallelism's gather: the norm's result whole along the
 * sequence again before the tensor-parallel einsums read it. */
static const char *gathered(const GenOpts *o, char *buf, size_t n)
{
	snprintf(buf, n, ", sharding: [%s, null, null]", bd(o));
	return buf;
}

/* The params of layer l, as the example declares them. */
static void layer_params(Buf *b, const GenOpts *o, int l)
{
	int M = o->dmodel, H = o->heads, D = o->dhead, F = o->mlp;
	put(b, "  l%d.ln1_scale: {shape: [%d], init: ones}\n", l, M);
	put(b, "  l%d.ln1_bias: {shape: [%d], init: zeros}\n", l, M);
	for (const char *w = "qkv"; *w; w++)
		put(b, "  l%d.w%c: {shape: [%d, %d, %d]%s}\n", l, *w, M, H, D, sh(o, GEN_TP, "[null, model, null]"));
	put(b, "  l%d.wo: {shape: [%d, %d, %d]%s}\n", l, H, D, M, sh(o, GEN_TP, "[model, null, null]"));
	put(b, "  l%d.ln2_scale: {shape: [%d], init: ones}\n", l, M);
	put(b, "  l%d.ln2_bias: {shape: [%d], init: zeros}\n", l, M);
	put(b, "  l%d.w1: {shape: [%d, %d]%s}\n", l, M, F, sh(o, GEN_TP, "[null, model]"));
	put(b, "  l%d.b1: {shape: [%d]%s, init: zeros}\n", l, F, sh(o, GEN_TP, "[model]"));
	put(b, "  l%d.w2: {shape: [%d, %d]%s}\n", l, F, M, sh(o, GEN_TP, "[model, null]"));
	put(b, "  l%d.b2: {shape: [%d], init: zeros}\n", l, M);
}

/* The attention sub-block of layer l reading value x (12 ops). */
static void layer_attention(Buf *b, const GenOpts *o, int l, const char *x)
{
	char bshd[64], r[64];
	snprintf(bshd, sizeof bshd, "[%s, null, model, null]", bd(o));
	char g[64];
	const char *n = o->plan & GEN_SP ? resid(o, r, sizeof r) : "", *h = o->plan & GEN_SP ? gathered(o, g, sizeof g) : "";
	put(b, "  - {out: l%d.n1, op: layer_norm, in: [%s], eps: 1e-5%s}\n", l, x, n);
	put(b, "  - {out: l%d.n1s, op: mul, in: [l%d.n1, l%d.ln1_scale]}\n", l, l, l);
	put(b, "  - {out: l%d.h1, op: add, in: [l%d.n1s, l%d.ln1_bias]%s}\n", l, l, l, h);
	for (const char *w = "qkv"; *w; w++)
		put(b, "  - {out: l%d.%c, op: einsum, in: [l%d.h1, l%d.w%c], eq: \"bsm,mhd->bshd\"%s}\n", l, *w, l, l, *w,
		    sh(o, GEN_TP, bshd));
	put(b, "  - {out: l%d.scores, op: einsum, in: [l%d.q, l%d.k], eq: \"bqhd,bkhd->bhqk\"}\n", l, l, l);
	put(b, "  - {out: l%d.scaled, op: mul, in: [l%d.scores, %.17g]}\n", l, l, 1 / sqrt(o->dhead));
	put(b, "  - {out: l%d.probs, op: softmax, in: [l%d.scaled], axis: -1}\n", l, l);
	put(b, "  - {out: l%d.ctx, op: einsum, in: [l%d.probs, l%d.v], eq: \"bhqk,bkhd->bqhd\"%s}\n", l, l, l,
	    sh(o, GEN_TP, bshd));
	put(b, "  - {out: l%d.attn, op: einsum, in: [l%d.ctx, l%d.wo], eq: \"bqhd,hdm->bqm\"}\n", l, l, l);
	put(b, "  - {out: l%d.y, op: add, in: [%s, l%d.attn]%s}\n", l, x, l, resid(o, r, sizeof r));
}

/* The MLP sub-block of layer l (9 ops). */
static void layer_mlp(Buf *b, const GenOpts *o, int l)
{
	char bsf[64], r[64];
	snprintf(bsf, sizeof bsf, "[%s, null, model]", bd(o));
	char g[64];
	const char *n = o->plan & GEN_SP ? resid(o, r, sizeof r) : "", *h = o->plan & GEN_SP ? gathered(o, g, sizeof g) : "";
	put(b, "  - {out: l%d.n2, op: layer_norm, in: [l%d.y]%s}\n", l, l, n);
	put(b, "  - {out: l%d.n2s, op: mul, in: [l%d.n2, l%d.ln2_scale]}\n", l, l, l);
	put(b, "  - {out: l%d.h2, op: add, in: [l%d.n2s, l%d.ln2_bias]%s}\n", l, l, l, h);
	put(b, "  - {out: l%d.f1, op: einsum, in: [l%d.h2, l%d.w1], eq: \"bsm,mf->bsf\"%s}\n", l, l, l, sh(o, GEN_TP, bsf));
	put(b, "  - {out: l%d.f1b, op: add, in: [l%d.f1, l%d.b1]}\n", l, l, l);
	put(b, "  - {out: l%d.g, op: gelu, in: [l%d.f1b]}\n", l, l);
	put(b, "  - {out: l%d.f2, op: einsum, in: [l%d.g, l%d.w2], eq: \"bsf,fm->bsm\"}\n", l, l, l);
	put(b, "  - {out: l%d.f2b, op: add, in: [l%d.f2, l%d.b2]}\n", l, l, l);
	put(b, "  - {out: l%d.z, op: add, in: [l%d.y, l%d.f2b]%s}\n", l, l, l, resid(o, r, sizeof r));
}

/* The language model's leaves: ids and labels, the embedding table (vocab-parallel under TP). */
static void lm_leaves(Buf *b, const GenOpts *o)
{
	char ids[48];
	snprintf(ids, sizeof ids, "[%s, null]", bd(o));
	put(b, "  ids: {shape: [%d, %d], dtype: i32%s}\n", o->batch, o->seq, sh(o, GEN_BATCH, ids));
	if (o->train)
		put(b, "  labels: {shape: [%d, %d], dtype: i32%s}\n", o->batch, o->seq, sh(o, GEN_BATCH, ids));
	put(b, "params:\n  embed: {shape: [%d, %d]%s, init: {normal: 0.02}}\n", o->vocab, o->dmodel,
	    sh(o, GEN_TP, "[model, null]"));
	put(b, "  lnf_scale: {shape: [%d], init: ones}\n  lnf_bias: {shape: [%d], init: zeros}\n", o->dmodel, o->dmodel);
	put(b, "  unembed: {shape: [%d, %d]%s, init: {normal: 0.02}}\n", o->dmodel, o->vocab,
	    sh(o, GEN_TP, "[null, model]"));
}

/* The language model's head after the last layer's z: final norm, logits, loss. */
static void lm_head(Buf *b, const GenOpts *o, int last)
{
	char r[64];
	put(b, "  - {out: nf, op: layer_norm, in: [l%d.z]%s}\n", last, o->plan & GEN_SP ? resid(o, r, sizeof r) : "");
	put(b, "  - {out: nfs, op: mul, in: [nf, lnf_scale]}\n  - {out: hf, op: add, in: [nfs, lnf_bias]}\n");
	put(b, "  - {out: logits, op: einsum, in: [hf, unembed], eq: \"bsm,mv->bsv\"}\n");
	if (o->train)
		put(b, "  - {out: loss, op: softmax_cross_entropy, in: [logits, labels]}\noutputs: [loss]\n"
		       "train:\n  loss: loss\n  optimizer: {type: adam, lr: 0.0001}\n  weight_update_sharding: %s\n",
		    o->plan & GEN_WUS ? "on" : "off");
	else
		put(b, "outputs: [logits]\n");
}

char *gen_transformer(const GenOpts *o, size_t *len)
{
	Buf b = {xmalloc(4096), 0, 4096};
	if (o->vocab > 0)
		put(&b, "# a decoder-only language model of %d pre-LN blocks (d_model %d, %d heads, MLP %d, vocab %d), "
		        "made by bench/gen_transformer.c\n",
		    o->nlayer, o->dmodel, o->heads, o->mlp, o->vocab);
	else
		put(&b, "# %d pre-LN transformer blocks (examples/transformer_block.yaml), made by bench/gen_transformer.c\n",
		    o->nlayer);
	put(&b, "name: transformer_%d\nmesh: {data: %d, model: %d}\ninputs:\n", o->nlayer, o->data, o->model);
	char x[48];
	snprintf(x, sizeof x, "[%s, null, null]", bd(o));
	if (o->vocab > 0)
		lm_leaves(&b, o);
	else
		put(&b, "  x: {shape: [%d, %d, %d]%s}\nparams:\n", o->batch, o->seq, o->dmodel, sh(o, GEN_BATCH, x));
	for (int l = 0; l < o->nlayer; l++)
		layer_params(&b, o, l);
	put(&b, "ops:\n");
	if (o->vocab > 0)
		put(&b, "  - {out: x, op: take, in: [embed, ids]}\n");
	for (int l = 0; l < o->nlayer; l++) {
		char in[32];
		snprintf(in, sizeof in, l == 0 ? "x" : "l%d.z", l - 1);
		layer_attention(&b, o, l, in);
		layer_mlp(&b, o, l);
	}
	if (o->vocab > 0)
		lm_head(&b, o, o->nlayer - 1);
	else
		put(&b, "outputs: [l%d.z]\n", o->nlayer - 1);
	*len = b.n;
	return b.a;
}

#ifdef GEN_TRANSFORMER_MAIN
#include <string.h>

/* Parse "AxB" into two positive ints; 0 or -1. */
static int parse_pair(const char *s, int *a, int *b)
{
	char end;
	return sscanf(s, "%dx%d%c", a, b, &end) == 2 && *a >= 1 && *b >= 1 ? 0 : -1;
}

/* A positive int, or -1. */
static int parse_int(const char *s)
{
	char end;
	int v;
	return s && sscanf(s, "%d%c", &v, &end) == 1 && v >= 1 ? v : -1;
}

/* "none" or a comma list of batch, tp, sp, wus into plan bits; 0 or -1. */
static int parse_plan(const char *s, int *plan)
{
	static const char *const name[] = {"batch", "tp", "sp", "wus"};
	*plan = 0;
	if (!strcmp(s, "none"))
		return 0;
	for (const char *p = s; *p;) {
		size_t n = strcspn(p, ",");
		int k = 0;
		while (k < 4 && (strlen(name[k]) != n || strncmp(p, name[k], n)))
			k++;
		if (k == 4)
			return -1;
		*plan |= 1 << k;
		p += n + (p[n] == ',');
	}
	return 0;
}

/* The options after the positional arguments; 0 or -1. */
static int parse_flags(int argc, char **argv, int i, GenOpts *o)
{
	for (; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--train"))
			o->train = true;
		else if (!strcmp(a, "--plan") && v && parse_plan(v, &o->plan) == 0)
			i++;
		else if (!strcmp(a, "--dmodel") && parse_int(v) > 0 && parse_int(v) % o->heads == 0)
			o->dmodel = parse_int(v), o->dhead = o->dmodel / o->heads, o->mlp = 4 * o->dmodel, i++;
		else if (!strcmp(a, "--seq") && parse_int(v) > 0)
			o->seq = parse_int(v), i++;
		else if (!strcmp(a, "--vocab") && parse_int(v) > 0)
			o->vocab = parse_int(v), i++;
		else
			return -1;
	}
	return o->train && o->vocab == 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
	GenOpts o = gen_opts_default(argc > 1 ? atoi(argv[1]) : 0);
	int pos = 2;
	while (pos < argc && pos < 4 && argv[pos][0] != '-')
		pos++;
	if (argc < 2 || o.nlayer < 1 || o.nlayer > 1000000 ||
	    (pos > 2 && parse_pair(argv[2], &o.data, &o.model) != 0) ||
	    (pos > 3 && parse_pair(argv[3], &o.batch, &o.heads) != 0) || parse_flags(argc, argv, pos, &o) != 0) {
		fprintf(stderr,
		        "usage: gen_transformer LAYERS [DATAxMODEL [BATCHxHEADS]] [--dmodel M] [--seq S] [--vocab V]\n"
		        "                      [--train] [--plan none|batch,tp,sp,wus] > model.yaml\n"
		        "  defaults: mesh 2x2, batch 4, heads 4, d_model 64, seq 16, the example's shardings\n"
		        "  (--plan batch,tp); --dmodel M: heads of M / HEADS, MLP 4M (give BATCHxHEADS first);\n"
		        "  --vocab: a decoder-only language model; --train: its Adam training step\n");
		return 2;
	}
	size_t n;
	char *text = gen_transformer(&o, &n);
	int rc = fwrite(text, 1, n, stdout) == n && fflush(stdout) == 0 ? 0 : 1;
	free(text);
	return rc;
}
#endif
