/* test_partition.c: property tests of the partitioner — random small models partitioned, run on threads, compared with the reference.
 *
 * A deterministic generator (fixed seeds, its own PRNG) writes small models
 * as YAML text: a random mesh of 1 to 3 axes of sizes 1 to 3 (sometimes
 * with its devices in a random order), a few inputs
 * of random shapes (dims 1 to 6, so most splits are uneven), and a chain of
 * ops with random annotations (axes, lists of axes, `null`, `_`) on inputs,
 * params and results.  Each model is loaded, propagated and partitioned; the
 * program must verify (graph_verify), give every collective a reason and
 * have none on a one-device mesh; spmd_run's outputs must equal exec_run's
 * on the unpartitioned model with the same seed, within 1e-4 of the largest
 * |reference| element.
 *
 * The op groups are separate tests: core (einsum, elementwise, reductions,
 * transpose, reshape), data movement (slice, pad, concat, broadcast_to),
 * normalisations along any axis (softmax, log_softmax, layer_norm), and
 * conv2d with its spatial dims split.  A failing model is printed whole, so
 * it can be saved as a .yaml file and run with `spmd run --check`; with
 * PARTITION_TEST_TRACE set in the environment every model is printed to
 * stderr before it runs (to find the model behind a crash). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "../partitioner/partition.h"
#include "../partitioner/propagate.h"
#include "../runtime/exec.h"
#include "../runtime/spmd_run.h"
#include "../partitioner/pipeline.h"
#include "../spmd/emit.h"
#include "../spmd/load.h"
#include "../spmd/train_section.h"
#include "../train/train.h"

enum { MAX_VALS = 48, TEXT_CAP = 16384, MAX_NUMEL = 240, PRINT_FAILURES = 3 };

/* Op groups a generated model may use. */
enum { G_CORE = 1, G_MOVE = 2, G_NORM = 4, G_CONV = 8 };

typedef struct {
	char a[TEXT_CAP];
	size_t n;
} Text;

/* A float tensor the generator can use as an operand. */
typedef struct {
	char name[16];
	int rank;
	int dim[MAX_RANK];
} GVal;

typedef struct {
	uint64_t rng;
	unsigned groups;
	int naxes;
	int size[3];
	GVal val[MAX_VALS];
	int nval, nin, nparam, nres;
	Text inputs, params, ops;
} Gen;

static const char *const axis_name[3] = {"data", "model", "pipe"};

/* ---- randomness ---- */

static uint64_t next(Gen *g)
{
	uint64_t z = (g->rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static int rnd(Gen *g, int lo, int hi) { return lo + (int)(next(g) % (uint64_t)(hi - lo + 1)); }
static bool chance(Gen *g, int percent) { return rnd(g, 1, 100) <= percent; }

static void shuffle(Gen *g, int *a, int n)
{
	for (int i = n - 1; i > 0; i--) {
		int j = rnd(g, 0, i), t = a[i];
		a[i] = a[j], a[j] = t;
	}
}

/* ---- text ---- */

static void put(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Text *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(t->a + t->n, sizeof t->a - t->n, fmt, ap);
	va_end(ap);
	assert_true(k >= 0 && (size_t)k < sizeof t->a - t->n);
	t->n += (size_t)k;
}

static void put_dims(Text *t, const int *dim, int rank)
{
	put(t, "[");
	for (int d = 0; d < rank; d++)
		put(t, "%s%d", d ? ", " : "", dim[d]);
	put(t, "]");
}

/* A random sharding annotation for a tensor of this rank (every axis at most
 * once): per dim null, `_`, one axis or a list of two; "" for none. */
static void put_sharding(Gen *g, Text *t, int rank)
{
	if (!g->naxes || chance(g, 35))
		return;
	int order[3] = {0, 1, 2}, k = 0;
	shuffle(g, order, g->naxes);
	put(t, ", sharding: [");
	for (int d = 0; d < rank; d++) {
		int r = rnd(g, 0, 9);
		const char *sep = d ? ", " : "";
		if (r < 3 || k == g->naxes)
			put(t, "%s%s", sep, r < 1 ? "_" : "null");
		else if (r == 9 && k + 1 < g->naxes) {
			put(t, "%s[%s, %s]", sep, axis_name[order[k]], axis_name[order[k + 1]]);
			k += 2;
		} else
			put(t, "%s%s", sep, axis_name[order[k++]]);
	}
	put(t, "]");
}

static int numel(const int *dim, int rank)
{
	int n = 1;
	for (int d = 0; d < rank; d++)
		n *= dim[d];
	return n;
}

/* ---- values ---- */

static GVal *add_val(Gen *g, const char *prefix, int idx, const int *dim, int rank)
{
	assert_true(g->nval < MAX_VALS);
	GVal *v = &g->val[g->nval++];
	snprintf(v->name, sizeof v->name, "%s%d", prefix, idx);
	v->rank = rank;
	memcpy(v->dim, dim, sizeof(int) * (size_t)rank);
	return v;
}

static const GVal *new_input(Gen *g, const int *dim, int rank)
{
	const GVal *v = add_val(g, "x", g->nin++, dim, rank);
	put(&g->inputs, "  %s: {shape: ", v->name);
	put_dims(&g->inputs, dim, rank);
	put_sharding(g, &g->inputs, rank);
	put(&g->inputs, "}\n");
	return v;
}

/* A param (not an operand of later ops: it is not added to the pool). */
static void new_param(Gen *g, char *name, size_t n, const int *dim, int rank)
{
	snprintf(name, n, "p%d", g->nparam++);
	put(&g->params, "  %s: {shape: ", name);
	put_dims(&g->params, dim, rank);
	put(&g->params, ", init: {normal: 0.5}");
	put_sharding(g, &g->params, rank);
	put(&g->params, "}\n");
}

/* Start an op line: "  - {out: vN, op: KIND, in: [" ; the caller finishes it
 * with end_op, which adds the result to the pool. */
static void begin_op(Gen *g, const char *kind)
{
	put(&g->ops, "  - {out: v%d, op: %s, in: [", g->nres, kind);
}

static const GVal *end_op(Gen *g, const int *dim, int rank)
{
	put_sharding(g, &g->ops, rank);
	put(&g->ops, "}\n");
	return add_val(g, "v", g->nres++, dim, rank);
}

/* An operand: usually the newest value (a chain), sometimes an older one. */
static const GVal *pick(Gen *g)
{
	return chance(g, 70) ? &g->val[g->nval - 1] : &g->val[rnd(g, 0, g->nval - 1)];
}

/* ---- core ops ---- */

static const char *const unary_ops[] = {"relu", "tanh", "neg", "gelu", "sigmoid", "abs", "square"};
static const char *const binary_ops[] = {"add", "sub", "mul", "max", "min"};

static void gen_unary(Gen *g, const GVal *x)
{
	begin_op(g, unary_ops[rnd(g, 0, 6)]);
	put(&g->ops, "%s]", x->name);
	end_op(g, x->dim, x->rank);
}

/* The second operand: a same-shaped value of the pool, a param broadcast to
 * x's shape (a suffix of it with some dims 1), or a constant. */
static void second_operand(Gen *g, const GVal *x, char *name, size_t n)
{
	for (int i = g->nval - 1; i >= 0 && chance(g, 50); i--)
		if (&g->val[i] != x && g->val[i].rank == x->rank &&
		    memcmp(g->val[i].dim, x->dim, sizeof(int) * (size_t)x->rank) == 0) {
			snprintf(name, n, "%s", g->val[i].name);
			return;
		}
	if (chance(g, 20)) {
		snprintf(name, n, "%d.%d", rnd(g, 0, 2), rnd(g, 0, 9));
		return;
	}
	int rank = rnd(g, 0, x->rank), dim[MAX_RANK];
	for (int d = 0; d < rank; d++)
		dim[d] = chance(g, 25) ? 1 : x->dim[x->rank - rank + d];
	new_param(g, name, n, dim, rank);
}

static void gen_binary(Gen *g, const GVal *x)
{
	char other[32];
	second_operand(g, x, other, sizeof other);
	begin_op(g, binary_ops[rnd(g, 0, 4)]);
	if (chance(g, 50))
		put(&g->ops, "%s, %s]", x->name, other);
	else
		put(&g->ops, "%s, %s]", other, x->name);
	end_op(g, x->dim, x->rank);
}

/* einsum of x with a new param: x's letters are a, b, ...; the param takes
 * some of them (batch or contracted) and up to two new ones; the result
 * keeps a random shuffled subset (the rest are summed out). */
static void gen_einsum(Gen *g, const GVal *x)
{
	char xl[MAX_RANK], pl[MAX_RANK], rl[MAX_RANK];
	int size[26], np = 0, nr = 0, pdim[MAX_RANK], rdim[MAX_RANK];
	for (int d = 0; d < x->rank; d++) {
		xl[d] = (char)('a' + d), size[d] = x->dim[d];
		bool in_p = chance(g, 50), keep = in_p ? chance(g, 40) : chance(g, 85);
		if (in_p)
			pl[np] = xl[d], pdim[np++] = x->dim[d];
		if (keep && nr < 4)
			rl[nr] = xl[d], rdim[nr++] = x->dim[d];
	}
	for (int k = rnd(g, np ? 0 : 1, 2), c = x->rank; k > 0; k--, c++) {
		size[c] = rnd(g, 1, 5);
		pl[np] = (char)('a' + c), pdim[np++] = size[c];
		if (chance(g, 90) && nr < 4)
			rl[nr] = (char)('a' + c), rdim[nr++] = size[c];
	}
	int perm[MAX_RANK] = {0, 1, 2, 3, 4, 5, 6, 7};
	shuffle(g, perm, nr);
	char rs[MAX_RANK + 1];
	int rd[MAX_RANK];
	for (int i = 0; i < nr; i++)
		rs[i] = rl[perm[i]], rd[i] = rdim[perm[i]];
	rs[nr] = 0;
	if (numel(rd, nr) > MAX_NUMEL || numel(pdim, np) > MAX_NUMEL) {
		gen_unary(g, x);
		return;
	}
	char pname[16];
	new_param(g, pname, sizeof pname, pdim, np);
	begin_op(g, "einsum");
	put(&g->ops, "%s, %s], eq: \"%.*s,%.*s->%s\"", x->name, pname, x->rank, xl, np, pl, rs);
	end_op(g, rd, nr);
}

static void gen_reduce(Gen *g, const GVal *x)
{
	static const char *const kind[] = {"reduce_sum", "reduce_max", "reduce_mean"};
	bool keep = chance(g, 30);
	int dim[MAX_RANK], rank = 0;
	begin_op(g, kind[rnd(g, 0, 2)]);
	put(&g->ops, "%s], axes: [", x->name);
	int n = 0;
	for (int d = 0; d < x->rank; d++) {
		bool red = chance(g, 45) || (d == x->rank - 1 && n == 0);
		if (red)
			put(&g->ops, "%s%d", n++ ? ", " : "", chance(g, 30) ? d - x->rank : d);
		if (!red || keep)
			dim[rank++] = red ? 1 : x->dim[d];
	}
	put(&g->ops, "]%s", keep ? ", keepdims: true" : "");
	end_op(g, dim, rank);
}

static void gen_transpose(Gen *g, const GVal *x)
{
	int perm[MAX_RANK] = {0, 1, 2, 3, 4, 5, 6, 7}, dim[MAX_RANK];
	shuffle(g, perm, x->rank);
	begin_op(g, "transpose");
	put(&g->ops, "%s], perm: [", x->name);
	for (int d = 0; d < x->rank; d++) {
		put(&g->ops, "%s%d", d ? ", " : "", perm[d]);
		dim[d] = x->dim[perm[d]];
	}
	put(&g->ops, "]");
	end_op(g, dim, x->rank);
}

/* reshape to a random grouping of the prime factors of x's element count. */
static void gen_reshape(Gen *g, const GVal *x)
{
	int n = numel(x->dim, x->rank), f[32], nf = 0;
	for (int p = 2; n > 1; p++)
		while (n % p == 0)
			f[nf++] = p, n /= p;
	shuffle(g, f, nf);
	int rank = nf ? rnd(g, 1, nf < 4 ? nf : 4) : 1, dim[MAX_RANK];
	for (int d = 0; d < rank; d++)
		dim[d] = 1;
	for (int i = 0; i < nf; i++)
		dim[i < rank ? i : rnd(g, 0, rank - 1)] *= f[i];
	int minus = chance(g, 30) ? rnd(g, 0, rank - 1) : -1;
	begin_op(g, "reshape");
	put(&g->ops, "%s], shape: [", x->name);
	for (int d = 0; d < rank; d++)
		put(&g->ops, "%s%d", d ? ", " : "", d == minus ? -1 : dim[d]);
	put(&g->ops, "]");
	end_op(g, dim, rank);
}

/* ---- data movement ---- */

static void gen_slice(Gen *g, const GVal *x)
{
	int start[MAX_RANK], limit[MAX_RANK], stride[MAX_RANK], dim[MAX_RANK];
	for (int d = 0; d < x->rank; d++) {
		start[d] = rnd(g, 0, x->dim[d] - 1);
		limit[d] = rnd(g, start[d] + 1, x->dim[d]);
		stride[d] = rnd(g, 1, 3);
		dim[d] = (limit[d] - start[d] + stride[d] - 1) / stride[d];
	}
	begin_op(g, "slice");
	put(&g->ops, "%s], start: ", x->name);
	put_dims(&g->ops, start, x->rank);
	put(&g->ops, ", limit: ");
	put_dims(&g->ops, limit, x->rank);
	put(&g->ops, ", stride: ");
	put_dims(&g->ops, stride, x->rank);
	end_op(g, dim, x->rank);
}

static void gen_pad(Gen *g, const GVal *x)
{
	int low[MAX_RANK], high[MAX_RANK], dim[MAX_RANK];
	for (int d = 0; d < x->rank; d++) {
		low[d] = rnd(g, 0, 2), high[d] = rnd(g, 0, 2);
		dim[d] = low[d] + x->dim[d] + high[d];
	}
	if (numel(dim, x->rank) > MAX_NUMEL) {
		gen_unary(g, x);
		return;
	}
	begin_op(g, "pad");
	put(&g->ops, "%s], low: ", x->name);
	put_dims(&g->ops, low, x->rank);
	put(&g->ops, ", high: ");
	put_dims(&g->ops, high, x->rank);
	put(&g->ops, ", value: %d.5", rnd(g, -2, 2));
	end_op(g, dim, x->rank);
}

/* concat of x with itself or with a param of another size along the axis. */
static void gen_concat(Gen *g, const GVal *x)
{
	int axis = rnd(g, 0, x->rank - 1), pdim[MAX_RANK], dim[MAX_RANK];
	memcpy(pdim, x->dim, sizeof pdim);
	pdim[axis] = rnd(g, 1, 4);
	memcpy(dim, x->dim, sizeof dim);
	char pname[16];
	bool self = chance(g, 30);
	dim[axis] += self ? x->dim[axis] : pdim[axis];
	if (numel(dim, x->rank) > MAX_NUMEL) {
		gen_unary(g, x);
		return;
	}
	if (!self)
		new_param(g, pname, sizeof pname, pdim, x->rank);
	begin_op(g, "concat");
	if (self)
		put(&g->ops, "%s, %s], axis: %d", x->name, x->name, axis);
	else if (chance(g, 50))
		put(&g->ops, "%s, %s], axis: %d", x->name, pname, axis);
	else
		put(&g->ops, "%s, %s], axis: %d", pname, x->name, axis - x->rank);
	end_op(g, dim, x->rank);
}

/* broadcast_to: up to one new leading dim, and size-1 dims widened. */
static void gen_broadcast(Gen *g, const GVal *x)
{
	int lead = x->rank < 4 ? rnd(g, 0, 1) : 0, dim[MAX_RANK];
	for (int d = 0; d < lead; d++)
		dim[d] = rnd(g, 1, 3);
	for (int d = 0; d < x->rank; d++)
		dim[lead + d] = x->dim[d] == 1 ? rnd(g, 1, 4) : x->dim[d];
	if (numel(dim, lead + x->rank) > MAX_NUMEL) {
		gen_unary(g, x);
		return;
	}
	begin_op(g, "broadcast_to");
	put(&g->ops, "%s], shape: ", x->name);
	put_dims(&g->ops, dim, lead + x->rank);
	end_op(g, dim, lead + x->rank);
}

/* ---- normalisations and convolution ---- */

static void gen_norm(Gen *g, const GVal *x)
{
	static const char *const kind[] = {"softmax", "log_softmax", "layer_norm"};
	int axis = rnd(g, 0, x->rank - 1);
	begin_op(g, kind[rnd(g, 0, 2)]);
	put(&g->ops, "%s], axis: %d", x->name, chance(g, 30) ? axis - x->rank : axis);
	end_op(g, x->dim, x->rank);
}

/* conv2d output size along one spatial dim. */
static int conv_out(int h, int k, int s, int mode, int lo, int hi)
{
	if (mode == 0) /* same */
		return (h + s - 1) / s;
	if (mode == 1) /* valid */
		return h >= k ? (h - k) / s + 1 : 0;
	return h + lo + hi >= k ? (h + lo + hi - k) / s + 1 : 0;
}

/* conv2d on a rank-4 value (NHWC) with a random kernel, strides and padding. */
static void gen_conv(Gen *g, const GVal *x)
{
	int kh = rnd(g, 1, 3), kw = rnd(g, 1, 3), sh = rnd(g, 1, 2), sw = rnd(g, 1, 2), mode = rnd(g, 0, 2);
	int pad[4] = {rnd(g, 0, 2), rnd(g, 0, 2), rnd(g, 0, 2), rnd(g, 0, 2)};
	int o = rnd(g, 1, 4), kdim[4] = {kh, kw, x->dim[3], o};
	int dim[4] = {x->dim[0], conv_out(x->dim[1], kh, sh, mode, pad[0], pad[1]),
	              conv_out(x->dim[2], kw, sw, mode, pad[2], pad[3]), o};
	if (dim[1] < 1 || dim[2] < 1 || numel(dim, 4) > MAX_NUMEL) {
		gen_unary(g, x);
		return;
	}
	char pname[16];
	new_param(g, pname, sizeof pname, kdim, 4);
	begin_op(g, "conv2d");
	put(&g->ops, "%s, %s], strides: [%d, %d], padding: ", x->name, pname, sh, sw);
	if (mode == 2)
		put(&g->ops, "[[%d, %d], [%d, %d]]", pad[0], pad[1], pad[2], pad[3]);
	else
		put(&g->ops, "%s", mode ? "valid" : "same");
	end_op(g, dim, 4);
}

/* ---- a whole model ---- */

typedef void GenFn(Gen *g, const GVal *x);

/* An op generator of an allowed group that fits x's rank. */
static GenFn *choose_op(Gen *g, const GVal *x)
{
	static GenFn *const move[] = {gen_slice, gen_pad, gen_concat, gen_broadcast};
	unsigned groups = g->groups;
	for (;;) {
		int r = rnd(g, 0, 11);
		if (groups & G_CORE) {
			if (r < 2)
				return gen_unary;
			if (r < 4)
				return gen_binary;
			if (r < 6 && x->rank > 0)
				return gen_einsum;
			if (r == 6 && x->rank > 0)
				return gen_reduce;
			if (r == 7 && x->rank > 1)
				return gen_transpose;
			if (r == 8 && x->rank > 0)
				return gen_reshape;
		}
		if ((groups & G_MOVE) && r >= 9 && x->rank > 0)
			return move[rnd(g, 0, 3)];
		if ((groups & G_NORM) && r >= 9 && x->rank > 0)
			return gen_norm;
		if ((groups & G_CONV) && r >= 8 && x->rank == 4)
			return gen_conv;
		if (!(groups & G_CORE) && r < 3)
			return gen_unary;
	}
}

/* The mesh, in the short form or (one model in five) the long form with
 * the devices in a random order. */
static void gen_mesh(Gen *g, Text *t)
{
	g->naxes = rnd(g, 1, 3);
	bool order = chance(g, 20);
	int ndev = 1;
	put(t, "mesh: {%s", order ? "axes: {" : "");
	for (int a = 0; a < g->naxes; a++) {
		g->size[a] = rnd(g, 1, 3);
		ndev *= g->size[a];
		put(t, "%s%s: %d", a ? ", " : "", axis_name[a], g->size[a]);
	}
	if (order) {
		int dev[27];
		for (int i = 0; i < ndev; i++)
			dev[i] = i;
		shuffle(g, dev, ndev);
		put(t, "}, devices: [");
		for (int i = 0; i < ndev; i++)
			put(t, "%s%d", i ? ", " : "", dev[i]);
		put(t, "]");
	}
	put(t, "}\n");
}

static void gen_inputs(Gen *g)
{
	int n = rnd(g, 1, 2);
	for (int i = 0; i < n; i++) {
		int rank = (g->groups & G_CONV) ? 4 : rnd(g, 1, 3), dim[MAX_RANK];
		for (int d = 0; d < rank; d++)
			dim[d] = rnd(g, 1, 6);
		if (g->groups & G_CONV)
			dim[0] = rnd(g, 1, 2), dim[3] = rnd(g, 1, 3);
		new_input(g, dim, rank);
	}
}

/* Write the model for seed into out. */
static void gen_model(uint64_t seed, unsigned groups, Text *out)
{
	Gen *g = calloc(1, sizeof *g);
	assert_non_null(g);
	g->rng = seed * 0x2545f4914f6cdd1dull + groups;
	g->groups = groups;
	out->n = 0;
	put(out, "name: random%llu\n", (unsigned long long)seed);
	gen_mesh(g, out);
	gen_inputs(g);
	int nops = rnd(g, 2, 7);
	for (int i = 0; i < nops; i++) {
		const GVal *x = pick(g);
		choose_op(g, x)(g, x);
	}
	put(out, "inputs:\n%sparams:%s\n%sops:\n%soutputs: [", g->inputs.a, g->params.n ? "" : " {}", g->params.a,
	    g->ops.a);
	int nout = g->nres < 2 ? g->nres : rnd(g, 1, 2);
	for (int i = 0; i < nout; i++)
		put(out, "%sv%d", i ? ", " : "", g->nres - 1 - i * rnd(g, 1, g->nres - 1));
	put(out, "]\n");
	free(g);
}

/* ---- checking one model ---- */

/* |got - want| <= 1e-4 * max |want| everywhere (NaN fails). */
static bool close_enough(const Tensor *got, const Tensor *want, char *why, size_t n)
{
	if (!shape_eq(&got->shape, &want->shape)) {
		snprintf(why, n, "shape differs");
		return false;
	}
	int64_t count = shape_numel(&want->shape), at = 0;
	double scale = 0, worst = 0;
	for (int64_t i = 0; i < count; i++)
		scale = fmax(scale, fabs(tensor_f32(want)[i]));
	for (int64_t i = 0; i < count; i++) {
		double e = fabs((double)tensor_f32(got)[i] - tensor_f32(want)[i]);
		if (!(e <= worst))
			worst = e, at = i;
	}
	if (worst <= 1e-4 * (scale > 0 ? scale : 1))
		return true;
	snprintf(why, n, "element %lld: got %.9g, want %.9g (max |want| %g)", (long long)at, tensor_f32(got)[at],
	         tensor_f32(want)[at], scale);
	return false;
}

/* Every collective of the program says why it is there, and a one-device
 * program has none; NULL, or what is wrong. */
static const char *collectives_wrong(const Graph *prog)
{
	for (int i = 0; i < prog->ops.n; i++) {
		const Op *op = &prog->ops.a[i];
		if (!(op_table[op->kind].flags & OPF_COLLECTIVE))
			continue;
		if (!op->why || !op->why[0])
			return "a collective without a why";
		if (prog->mesh.ndev == 1)
			return "a collective on a one-device mesh";
	}
	return NULL;
}

/* Run the reference and the partitioned program; compare every output. */
static bool compare_runs(Graph *g, const Graph *prog, uint64_t seed, char *why, size_t n, Diag *d)
{
	int nout = g->outputs.n;
	Tensor *got = calloc((size_t)nout, sizeof *got);
	Tensor *vals = calloc((size_t)g->values.n, sizeof *vals);
	SpmdOpts so = {.seed = seed};
	ExecOpts eo = {.seed = seed};
	bool ok = true;
	if (spmd_run(prog, &so, got, NULL, d) != 0)
		snprintf(why, n, "spmd_run failed: %s", d->last), ok = false;
	else if (exec_run(g, vals, NULL, &eo, d) != 0)
		snprintf(why, n, "exec_run failed: %s", d->last), ok = false;
	for (int i = 0; i < nout && ok; i++)
		if (!close_enough(&got[i], &vals[g->outputs.a[i]], why, n)) {
			char tail[256];
			snprintf(tail, sizeof tail, " in output %s", g->values.a[g->outputs.a[i]].name);
			strncat(why, tail, n - strlen(why) - 1);
			ok = false;
		}
	for (int i = 0; i < nout; i++)
		tensor_free(&got[i]);
	exec_free_values(g, vals);
	free(got), free(vals);
	return ok;
}

/* Load, propagate, partition, verify and run the model text; true if all is well. */
static bool check_model(const char *text, uint64_t seed, char *why, size_t n)
{
	Graph g, prog;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	Propagation p = {0};
	graph_init(&prog); /* partition initialises it again: graph_init allocates nothing */
	bool ok = false;
	const char *wrong;
	if (model_load_string(&g, text, "random.yaml", &d) != 0)
		snprintf(why, n, "the generated model does not load: %s", d.last);
	else if (propagate(&g, NULL, &p, &d) != 0)
		snprintf(why, n, "propagate failed: %s", d.last);
	else if (partition(&g, &prog, NULL, NULL, &d) != 0)
		snprintf(why, n, "partition failed: %s", d.last);
	else if (graph_verify(&prog, &d) != 0)
		snprintf(why, n, "the program does not verify: %s", d.last);
	else if ((wrong = collectives_wrong(&prog)))
		snprintf(why, n, "%s", wrong);
	else
		ok = compare_runs(&g, &prog, seed, why, n, &d);
	propagation_free(&p);
	graph_free(&prog);
	graph_free(&g);
	return ok;
}

/* Generate and check count models of the groups; print the first failures. */
static int check_many(unsigned groups, int count, uint64_t first_seed)
{
	Text *t = calloc(1, sizeof *t);
	int failures = 0;
	for (int i = 0; i < count; i++) {
		uint64_t seed = first_seed + (uint64_t)i;
		char why[768];
		gen_model(seed, groups, t);
		if (getenv("PARTITION_TEST_TRACE")) /* see which model a crash comes from */
			fprintf(stderr, "--- model %llu\n%s", (unsigned long long)seed, t->a);
		if (check_model(t->a, seed, why, sizeof why))
			continue;
		if (failures++ < PRINT_FAILURES)
			print_message("model %llu (spmd run MODEL.yaml --check --seed %llu): %s\n%s\n",
			              (unsigned long long)seed, (unsigned long long)seed, why, t->a);
	}
	if (failures)
		print_message("%d of %d random models failed\n", failures, count);
	free(t);
	return failures;
}

static void test_random_core(void **state)
{
	(void)state;
	assert_int_equal(check_many(G_CORE, 300, 1000), 0);
}

static void test_random_move(void **state)
{
	(void)state;
	assert_int_equal(check_many(G_CORE | G_MOVE, 120, 5000), 0);
}

/* softmax, log_softmax and layer_norm along an axis that may be split. */
static void test_random_norm(void **state)
{
	(void)state;
	assert_int_equal(check_many(G_CORE | G_NORM, 120, 9000), 0);
}

/* conv2d with N, H, W, C split at random (halos where H or W is split). */
static void test_random_conv(void **state)
{
	(void)state;
	assert_int_equal(check_many(G_CONV, 100, 13000), 0);
}

/* graph_fork: a fork of a built training step partitions as the model
 * loaded afresh does (the same program text, and run on threads it gives
 * what the reference gives), whatever its shardings, and leaves its source
 * as it was (weight-update sharding rewrites the fork's operand lists and
 * update ranges, before_use adds gathered copies). */
#define FORK_MODEL(W1, W2) \
	"mesh: {data: 2, model: 2}\n" \
	"inputs:\n  x: {shape: [8, 12]}\n  y: {shape: [8, 4]}\n" \
	"params:\n  w1: {shape: [12, 16]" W1 "}\n  b1: {shape: [16]}\n  w2: {shape: [16, 4]" W2 "}\n" \
	"ops:\n  - {out: h, op: einsum, in: [x, w1], eq: \"bd,df->bf\"}\n  - {out: hb, op: add, in: [h, b1]}\n" \
	"  - {out: a, op: gelu, in: [hb]}\n  - {out: z, op: einsum, in: [a, w2], eq: \"bf,fc->bc\"}\n" \
	"  - {out: loss, op: mse, in: [z, y]}\n" \
	"outputs: [loss]\n" \
	"train: {loss: loss, optimizer: {type: adam, lr: 0.01}, weight_update_sharding: on, all_gather: before_use}\n"
static const char fork_model[] = FORK_MODEL("", "");
/* w1's columns and w2's rows split over model */
static const char fork_split[] = FORK_MODEL(", sharding: [null, model]", ", sharding: [model, null]");

static void load_built(Graph *g, const char *text)
{
	Diag d;
	diag_init(&d);
	assert_int_equal(model_load_string(g, text, "fork.yaml", &d), 0);
	assert_int_equal(train_build(g, &d), 0);
}

/* The partitioned program of g (consumed) as `spmd partition -o` writes it;
 * run on threads, it must give what the reference executor gives on the
 * model text ref, freshly loaded and built. */
static char *program_of(Graph *g, const char *ref)
{
	Graph prog, model;
	Diag d;
	diag_init(&d);
	assert_int_equal(pipeline_partition(g, NULL, &prog, NULL, NULL, &d), 0);
	size_t n;
	char *text = emit_text(&prog, -1, &n), why[512] = "";
	load_built(&model, ref);
	if (!compare_runs(&model, &prog, 7, why, sizeof why, &d))
		fail_msg("the forked program differs from the reference: %s", why);
	graph_free(&model);
	graph_free(&prog);
	graph_free(g);
	return text;
}

static void test_graph_fork(void **state)
{
	(void)state;
	Graph tmpl, fresh, fork;
	load_built(&tmpl, fork_model);
	int nv = tmpl.values.n, no = tmpl.ops.n, first = tmpl.train->params[0].first_op;
	int *ins = xmalloc(sizeof(int) * (size_t)(4 * no + 1)), nin = 0;
	for (int i = 0; i < no; i++)
		for (int k = 0; k < tmpl.ops.a[i].nin; k++)
			ins[nin++] = tmpl.ops.a[i].in[k];
	for (int round = 0; round < 2; round++) { /* twice: the first fork left the source as it was */
		graph_fork(&tmpl, &fork);
		load_built(&fresh, fork_model);
		char *a = program_of(&fork, fork_model), *b = program_of(&fresh, fork_model);
		assert_string_equal(a, b);
		free(a), free(b);
	}
	/* the fork with the shardings set as a loader sets them */
	graph_fork(&tmpl, &fork);
	int w1 = graph_find(&fork, "w1"), w2 = graph_find(&fork, "w2");
	Spec s1 = {.rank = 2}, s2 = {.rank = 2};
	s1.nax[1] = 1, s1.ax[1][0] = 1, s2.nax[0] = 1, s2.ax[0][0] = 1;
	fork.values.a[w1].has_spec = fork.values.a[w2].has_spec = true;
	fork.values.a[w1].spec = s1, fork.values.a[w2].spec = s2;
	train_shard_states(&fork);
	load_built(&fresh, fork_split);
	char *a = program_of(&fork, fork_split), *b = program_of(&fresh, fork_split);
	assert_string_equal(a, b);
	free(a), free(b);
	/* the source is as loaded */
	assert_int_equal(tmpl.values.n, nv);
	assert_int_equal(tmpl.ops.n, no);
	assert_int_equal(tmpl.train->params[0].first_op, first);
	nin = 0;
	for (int i = 0; i < no; i++)
		for (int k = 0; k < tmpl.ops.a[i].nin; k++)
			assert_int_equal(tmpl.ops.a[i].in[k], ins[nin++]);
	assert_false(tmpl.values.a[graph_find(&tmpl, "w1")].has_spec);
	free(ins);
	graph_free(&tmpl);
}

/* What a search's partitions share (PassShare): forks of one built model
 * partitioned with the template's factor rules and one reshard cache give
 * the program a fresh load gives, every time; the rules a fork reads are
 * factor_rule's for every op, rewired ones included, and an op that is no
 * longer the template's (another operand shape, other attributes) gets
 * its own. */
static void test_shared_passes(void **state)
{
	(void)state;
	Graph tmpl, fork, fresh, prog;
	load_built(&tmpl, fork_split);
	FactorRules rules;
	factor_rules_make(&rules, &tmpl);
	PassShare share = {.plans = reshard_cache_new(), .rules = &rules};
	Diag d;
	diag_init(&d);
	load_built(&fresh, fork_split);
	char *want = program_of(&fresh, fork_split);
	Spec *first = NULL;
	for (int round = 0; round < 3; round++) { /* the second from the cache, the third with the first's first run */
		graph_fork(&tmpl, &fork);
		int nv = fork.values.n, *map = NULL;
		share.keep_first = round == 0 ? &first : NULL;
		share.first = round == 2 ? first : NULL;
		assert_int_equal(pipeline_partition_replicated(&fork, NULL, &share, &prog, &map, NULL, &d), 0);
		if (round == 0) { /* what the first run left: w1 as annotated */
			assert_non_null(first);
			assert_true(spec_eq(&first[graph_find(&fork, "w1")], &tmpl.values.a[graph_find(&tmpl, "w1")].spec));
			assert_true(nv < fork.values.n); /* weight-update sharding added values after it */
		}
		int shared = 0;
		for (int i = 0; i < fork.ops.n; i++) { /* wus rewired and added ops: every rule is factor_rule's */
			FactorRule a, b;
			const FactorRule *m = factor_rule_memo(&rules, &fork, &fork.ops.a[i], &a);
			int rb = factor_rule(&fork, &fork.ops.a[i], &b);
			assert_int_equal(m != NULL, rb == 0);
			if (m)
				assert_memory_equal(m, &b, sizeof b);
			shared += m && m != &a;
		}
		assert_true(shared > fork.ops.n / 2); /* most from the table */
		size_t n;
		char *got = emit_text(&prog, -1, &n);
		assert_string_equal(got, want);
		free(got), free(map);
		graph_free(&prog);
		graph_free(&fork);
	}
	/* h = einsum(x, w1) with x rewired to a [4, 12] value: batch factor 4, not the template's 8 */
	free(first);
	graph_fork(&tmpl, &fork);
	int x4 = graph_value(&fork, "x4", DT_F32, &(Shape){2, {4, 12}}, VK_INPUT, (Pos){0});
	FactorRule a, b;
	Op *op = &fork.ops.a[fork.values.a[graph_find(&fork, "h")].producer];
	op->in[0] = x4;
	assert_ptr_equal(factor_rule_memo(&rules, &fork, op, &a), &a);
	assert_int_equal(factor_rule(&fork, op, &b), 0);
	assert_memory_equal(&a, &b, sizeof a);
	assert_int_equal(a.size[a.fd[0][0][0]], 4);
	/* another attribute block (a pass's copy): the op's own rule, equal here */
	Attr at = *op->attr;
	op->attr = &at;
	op->in[0] = graph_find(&fork, "x");
	assert_ptr_equal(factor_rule_memo(&rules, &fork, op, &a), &a);
	assert_int_equal(factor_rule(&fork, op, &b), 0);
	assert_memory_equal(&a, &b, sizeof a);
	assert_int_equal(a.size[a.fd[0][0][0]], 8);
	graph_free(&fork);
	free(want);
	reshard_cache_free(share.plans);
	factor_rules_free(&rules);
	graph_free(&tmpl);
}

/* The generator is deterministic and writes models that load. */
static void test_generator(void **state)
{
	(void)state;
	Text *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
	for (uint64_t s = 0; s < 50; s++) {
		unsigned groups[] = {G_CORE, G_CORE | G_MOVE, G_CORE | G_NORM, G_CONV};
		gen_model(s, groups[s % 4], a);
		gen_model(s, groups[s % 4], b);
		assert_string_equal(a->a, b->a);
		Graph g;
		Diag d;
		diag_init(&d);
		d.quiet = true;
		int rc = model_load_string(&g, a->a, "random.yaml", &d);
		if (rc != 0)
			print_message("%s\n%s\n", d.last, a->a);
		assert_int_equal(rc, 0);
		graph_free(&g);
	}
	free(a), free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_generator),
		cmocka_unit_test(test_graph_fork),
		cmocka_unit_test(test_shared_passes),
		cmocka_unit_test(test_random_core),
		cmocka_unit_test(test_random_move),
		cmocka_unit_test(test_random_norm),
		cmocka_unit_test(test_random_conv),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
