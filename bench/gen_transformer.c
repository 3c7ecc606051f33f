/* gen_transformer.c: writes an N-layer transformer model (the example's block, repeated) as YAML.
 *
 *   gen_transformer LAYERS [DATAxMODEL [BATCHxHEADS]] > model.yaml
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
	                 .dmodel = 64, .heads = 4, .dhead = 16, .mlp = 256};
}

long gen_op_count(const GenOpts *o) { return (long)o->nlayer * OPS_PER_LAYER; }

/* The params of layer l, as the example declares them. */
static void layer_params(Buf *b, const GenOpts *o, int l)
{
	int M = o->dmodel, H = o->heads, D = o->dhead, F = o->mlp;
	put(b, "  l%d.ln1_scale: {shape: [%d], init: ones}\n", l, M);
	put(b, "  l%d.ln1_bias: {shape: [%d], init: zeros}\n", l, M);
	for (const char *w = "qkv"; *w; w++)
		put(b, "  l%d.w%c: {shape: [%d, %d, %d], sharding: [null, model, null]}\n", l, *w, M, H, D);
	put(b, "  l%d.wo: {shape: [%d, %d, %d], sharding: [model, null, null]}\n", l, H, D, M);
	put(b, "  l%d.ln2_scale: {shape: [%d], init: ones}\n", l, M);
	put(b, "  l%d.ln2_bias: {shape: [%d], init: zeros}\n", l, M);
	put(b, "  l%d.w1: {shape: [%d, %d], sharding: [null, model]}\n", l, M, F);
	put(b, "  l%d.b1: {shape: [%d], sharding: [model], init: zeros}\n", l, F);
	put(b, "  l%d.w2: {shape: [%d, %d], sharding: [model, null]}\n", l, F, M);
	put(b, "  l%d.b2: {shape: [%d], init: zeros}\n", l, M);
}

/* The attention sub-block of layer l reading value x (12 ops). */
static void layer_attention(Buf *b, const GenOpts *o, int l, const char *x)
{
	const char *bshd = "sharding: [data, null, model, null]";
	put(b, "  - {out: l%d.n1, op: layer_norm, in: [%s], eps: 1e-5}\n", l, x);
	put(b, "  - {out: l%d.n1s, op: mul, in: [l%d.n1, l%d.ln1_scale]}\n", l, l, l);
	put(b, "  - {out: l%d.h1, op: add, in: [l%d.n1s, l%d.ln1_bias]}\n", l, l, l);
	for (const char *w = "qkv"; *w; w++)
		put(b, "  - {out: l%d.%c, op: einsum, in: [l%d.h1, l%d.w%c], eq: \"bsm,mhd->bshd\", %s}\n", l, *w, l, l,
		    *w, bshd);
	put(b, "  - {out: l%d.scores, op: einsum, in: [l%d.q, l%d.k], eq: \"bqhd,bkhd->bhqk\"}\n", l, l, l);
	put(b, "  - {out: l%d.scaled, op: mul, in: [l%d.scores, %.17g]}\n", l, l, 1 / sqrt(o->dhead));
	put(b, "  - {out: l%d.probs, op: softmax, in: [l%d.scaled], axis: -1}\n", l, l);
	put(b, "  - {out: l%d.ctx, op: einsum, in: [l%d.probs, l%d.v], eq: \"bhqk,bkhd->bqhd\", %s}\n", l, l, l, bshd);
	put(b, "  - {out: l%d.attn, op: einsum, in: [l%d.ctx, l%d.wo], eq: \"bqhd,hdm->bqm\"}\n", l, l, l);
	put(b, "  - {out: l%d.y, op: add, in: [%s, l%d.attn], sharding: [data, null, null]}\n", l, x, l);
}

/* The MLP sub-block of layer l (9 ops). */
static void layer_mlp(Buf *b, int l)
{
	put(b, "  - {out: l%d.n2, op: layer_norm, in: [l%d.y]}\n", l, l);
	put(b, "  - {out: l%d.n2s, op: mul, in: [l%d.n2, l%d.ln2_scale]}\n", l, l, l);
	put(b, "  - {out: l%d.h2, op: add, in: [l%d.n2s, l%d.ln2_bias]}\n", l, l, l);
	put(b, "  - {out: l%d.f1, op: einsum, in: [l%d.h2, l%d.w1], eq: \"bsm,mf->bsf\", sharding: [data, null, model]}\n",
	    l, l, l);
	put(b, "  - {out: l%d.f1b, op: add, in: [l%d.f1, l%d.b1]}\n", l, l, l);
	put(b, "  - {out: l%d.g, op: gelu, in: [l%d.f1b]}\n", l, l);
	put(b, "  - {out: l%d.f2, op: einsum, in: [l%d.g, l%d.w2], eq: \"bsf,fm->bsm\"}\n", l, l, l);
	put(b, "  - {out: l%d.f2b, op: add, in: [l%d.f2, l%d.b2]}\n", l, l, l);
	put(b, "  - {out: l%d.z, op: add, in: [l%d.y, l%d.f2b], sharding: [data, null, null]}\n", l, l, l);
}

char *gen_transformer(const GenOpts *o, size_t *len)
{
	Buf b = {xmalloc(4096), 0, 4096};
	put(&b, "# %d pre-LN transformer blocks (examples/transformer_block.yaml), made by bench/gen_transformer.c\n",
	    o->nlayer);
	put(&b, "name: transformer_%d\nmesh: {data: %d, model: %d}\ninputs:\n", o->nlayer, o->data, o->model);
	put(&b, "  x: {shape: [%d, %d, %d], sharding: [data, null, null]}\nparams:\n", o->batch, o->seq, o->dmodel);
	for (int l = 0; l < o->nlayer; l++)
		layer_params(&b, o, l);
	put(&b, "ops:\n");
	for (int l = 0; l < o->nlayer; l++) {
		char x[32];
		snprintf(x, sizeof x, l == 0 ? "x" : "l%d.z", l - 1);
		layer_attention(&b, o, l, x);
		layer_mlp(&b, l);
	}
	put(&b, "outputs: [l%d.z]\n", o->nlayer - 1);
	*len = b.n;
	return b.a;
}

#ifdef GEN_TRANSFORMER_MAIN
/* Parse "AxB" into two positive ints; 0 or -1. */
static int parse_pair(const char *s, int *a, int *b)
{
	char end;
	return sscanf(s, "%dx%d%c", a, b, &end) == 2 && *a >= 1 && *b >= 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
	GenOpts o = gen_opts_default(argc > 1 ? atoi(argv[1]) : 0);
	if (argc < 2 || argc > 4 || o.nlayer < 1 || o.nlayer > 1000000 ||
	    (argc > 2 && parse_pair(argv[2], &o.data, &o.model) != 0) ||
	    (argc > 3 && parse_pair(argv[3], &o.batch, &o.heads) != 0)) {
		fprintf(stderr, "usage: gen_transformer LAYERS [DATAxMODEL [BATCHxHEADS]] > model.yaml\n"
		                "  defaults: mesh 2x2, batch 4, heads 4 (examples/transformer_block.yaml)\n");
		return 2;
	}
	size_t n;
	char *text = gen_transformer(&o, &n);
	int rc = fwrite(text, 1, n, stdout) == n && fflush(stdout) == 0 ? 0 : 1;
	free(text);
	return rc;
}
#endif
