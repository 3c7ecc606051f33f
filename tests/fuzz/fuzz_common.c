/* fuzz_common.c: helpers of the harnesses (fuzz.h). */
#include "fuzz.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int fuzz_pick(FuzzBytes *b, int k)
{
	if (!b->n)
		return 0;
	b->n--;
	return *b->p++ % k;
}

void fuzz_sharding(FuzzBytes *b, int rank, char *out, size_t n)
{
	static const char *const dims[] = {"null", "a", "b", "[a, b]", "[b, a]"};
	int d0 = fuzz_pick(b, 5), d1 = rank > 1 ? fuzz_pick(b, 5) : 0;
	if ((d0 >= 3 && d1 != 0) || (d1 >= 3 && d0 != 0) || (d0 == d1 && d0 != 0))
		d1 = 0;
	if (rank == 1)
		snprintf(out, n, ", sharding: [%s]", dims[d0]);
	else
		snprintf(out, n, ", sharding: [%s, %s]", dims[d0], dims[d1]);
}

void fuzz_put(FuzzText *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	t->len += (size_t)vsnprintf(t->t + t->len, t->cap - t->len, fmt, ap);
	va_end(ap);
	if (t->len >= t->cap)
		FUZZ_FINDING("the generated model is too long");
}

char *fuzz_text(const uint8_t *data, size_t size)
{
	char *t = xmalloc(size + 1);
	memcpy(t, data, size);
	t[size] = 0;
	return t;
}

void fuzz_diag(Diag *d)
{
	diag_init(d);
	d->quiet = true;
}

const char *fuzz_path(const char *name)
{
	static char buf[4096];
	const char *tmp = getenv("TMPDIR");
	snprintf(buf, sizeof buf, "%s/spmd-fuzz-%ld", tmp && *tmp ? tmp : "/tmp", (long)getpid());
	dir_make(buf);
	size_t n = strlen(buf);
	snprintf(buf + n, sizeof buf - n, "/%s", name);
	return buf;
}

void fuzz_write(const char *path, const void *data, size_t size)
{
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
		FUZZ_FINDING("cannot write %s", path);
}

/* A param's own training keys: weight_update_sharding and all_gather, or none. */
void fuzz_param_keys(FuzzBytes *b, char *out, size_t n)
{
	static const char *const wus[] = {"", ", weight_update_sharding: on", ", weight_update_sharding: off",
	                                  ", weight_update_sharding: auto"};
	static const char *const ag[] = {"", ", all_gather: after_update", ", all_gather: before_use",
	                                 ", all_gather: first_use"};
	snprintf(out, n, "%s%s", wus[fuzz_pick(b, 4)], ag[fuzz_pick(b, 4)]);
}

/* One op on h (shape r x c) into h<i>; updates c. */
static void train_op(FuzzBytes *b, FuzzText *params, FuzzText *ops, int i, int r, int *c)
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
		fuzz_param_keys(b, keys, sizeof keys);
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
		int k = 2 + fuzz_pick(b, 7); /* a width-1 bottleneck: see fuzz_train_model */
		fuzz_sharding(b, 2, psh, sizeof psh);
		fuzz_param_keys(b, keys, sizeof keys);
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
const char *fuzz_train_model(FuzzBytes *b)
{
	static char pbuf[4096], obuf[4096], mbuf[10000];
	FuzzText params = {pbuf, 0, sizeof pbuf}, ops = {obuf, 0, sizeof obuf}, m = {mbuf, 0, sizeof mbuf};
	int na = 1 + fuzz_pick(b, 3), nb = 1 + fuzz_pick(b, 3), r = 1 + fuzz_pick(b, 8), c = 1 + fuzz_pick(b, 8), nops = 1 + fuzz_pick(b, 6);
	char sh[64], keys[96];
	fuzz_sharding(b, 2, sh, sizeof sh);
	fuzz_put(&m, "name: train_diff\nmesh: {a: %d, b: %d}\ninputs:\n  x: {shape: [%d, %d]%s}\n", na, nb, r, c, sh);
	pbuf[0] = 0;
	fuzz_put(&ops, "ops:\n  - {out: h0, op: copy, in: [x]}\n");
	/* at least one param: the first op is a weight */
	int k = 2 + fuzz_pick(b, 7); /* a width-1 bottleneck: see fuzz_train_model */
	char psh[64];
	fuzz_sharding(b, 2, psh, sizeof psh);
	fuzz_param_keys(b, keys, sizeof keys);
	fuzz_put(&params, "  p1: {shape: [%d, %d]%s%s, init: {normal: 0.5}}\n", c, k, psh, keys);
	fuzz_put(&ops, "  - {out: h1, op: einsum, eq: \"rc,ck->rk\", in: [h0, p1]}\n");
	c = k;
	for (int i = 2; i <= nops; i++)
		train_op(b, &params, &ops, i, r, &c);
	fuzz_sharding(b, 2, sh, sizeof sh);
	fuzz_put(&m, "  target: {shape: [%d, %d]%s}\n", r, c, sh);
	fuzz_put(&ops, "  - {out: loss, op: mse, in: [h%d, target]}\n", nops);
	fuzz_put(&m, "params:\n%s%soutputs: [loss]\n", pbuf, obuf);
	fuzz_train_section(b, &m);
	return mbuf;
}

void fuzz_train_section(FuzzBytes *b, FuzzText *m)
{
	static const char *const opt[] = {"{type: sgd, lr: 0.05}", "{type: momentum, lr: 0.05}", "{type: adam, lr: 0.01}",
	                                  "{type: adamw, lr: 0.01}", "{type: lamb, lr: 0.01}"};
	static const char *const wus[] = {"off", "on", "auto"};
	static const char *const pre[] = {"", "  prefetch: off\n", "  prefetch: 1\n"};
	static const char *const ag[] = {"before_use", "first_use"};
	fuzz_put(m, "train:\n  loss: loss\n  optimizer: %s\n  weight_update_sharding: %s\n", opt[fuzz_pick(b, 5)],
	         wus[fuzz_pick(b, 3)]);
	if (fuzz_pick(b, 2))
		fuzz_put(m, "  all_gather: %s\n%s", ag[fuzz_pick(b, 2)], pre[fuzz_pick(b, 3)]);
	if (fuzz_pick(b, 2))
		fuzz_put(m, "  group_bytes: 0\n");
	if (fuzz_pick(b, 3) == 0)
		fuzz_put(m, "  clip_global_norm: 0.5\n");
	if (fuzz_pick(b, 3) == 0)
		fuzz_put(m, "  recompute: %s\n", fuzz_pick(b, 2) ? "selective" : "true");
}
