/* data.c: deterministic, counter-based data: hash of (seed, name, index), then Box-Muller.
 *
 * A tensor's key is mixed from the seed and the name hash.  Pair j of
 * normals (elements 2j and 2j+1) takes two 32-bit hashes (lowbias32 of the
 * low word of j plus two subkeys derived from the key and the high word of j)
 * as u1 in (0, 1] and u2 in [0, 1), and gives r cos t, r sin t with
 * r = sqrt(-2 ln u1), t = 2 pi u2.  The logarithm, square root, sine and
 * cosine are polynomials and Newton steps on 4-lane vectors (GCC/Clang
 * vector extensions) using only IEEE add/mul and integer ops, so every
 * machine and every shard gives the same bits, and 1M normals take a few
 * milliseconds.  Tails stop at |x| = 5.77 (u1 >= 2^-24). */
#include "data.h"

#include "../spmd/ops.h"

#include <math.h>
#include <string.h>

typedef uint32_t u32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));
typedef float f32x4 __attribute__((vector_size(16)));

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t data_mix64(uint64_t z)
{
	return mix64(z);
}

static uint32_t hash32(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	return x ^ (x >> 16);
}

static u32x4 hash32x4(u32x4 x)
{
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	return x ^ (x >> 16);
}

uint64_t data_name_hash(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x100000001b3ull;
	return mix64(h);
}

/* A tensor's stream: its key, and the subkeys of the last high word used. */
typedef struct {
	uint64_t key;
	uint64_t hi;
	uint32_t k1, k2;
} Stream;

static void stream_init(Stream *s, uint64_t seed, const char *name)
{
	s->key = mix64(seed * 0x9e3779b97f4a7c15ull ^ data_name_hash(name));
	s->hi = 0;
	uint64_t h = mix64(s->key);
	s->k1 = (uint32_t)h, s->k2 = (uint32_t)(h >> 32);
}

/* Subkeys for counters whose high word is hi. */
static void stream_keys(Stream *s, uint64_t hi, uint32_t *k1, uint32_t *k2)
{
	if (hi != s->hi) {
		uint64_t h = mix64(s->key ^ mix64(hi));
		s->hi = hi, s->k1 = (uint32_t)h, s->k2 = (uint32_t)(h >> 32);
	}
	*k1 = s->k1, *k2 = s->k2;
}

static f32x4 splat(float x) { return (f32x4){x, x, x, x}; }
static f32x4 as_f(i32x4 x) { return (f32x4)x; }
static i32x4 as_i(f32x4 x) { return (i32x4)x; }

/* ln x for x in (0, 1] (Cephes logf: mantissa in [sqrt(1/2), sqrt(2)), degree-8 polynomial). */
static f32x4 log4(f32x4 x)
{
	i32x4 xi = as_i(x);
	i32x4 e = ((xi >> 23) & 0xff) - 127;
	f32x4 m = as_f((xi & 0x7fffff) | 0x3f800000);
	i32x4 big = m > splat(1.41421356f);
	m = as_f((as_i(m * splat(0.5f)) & big) | (as_i(m) & ~big));
	e -= big;
	f32x4 fe = __builtin_convertvector(e, f32x4), z = (m - 1.0f) * (m - 1.0f), y, t = m - 1.0f;
	y = splat(7.0376836292e-2f);
	y = y * t - 1.1514610310e-1f;
	y = y * t + 1.1676998740e-1f;
	y = y * t - 1.2420140846e-1f;
	y = y * t + 1.4249322787e-1f;
	y = y * t - 1.6668057665e-1f;
	y = y * t + 2.0000714765e-1f;
	y = y * t - 2.4999993993e-1f;
	y = y * t + 3.3333331174e-1f;
	y = t * (z * y) - 2.12194440e-4f * fe - 0.5f * z;
	return t + y + 0.693359375f * fe;
}

/* sqrt x for x >= 0: x * rsqrt(x), rsqrt from the bit trick and three Newton steps. */
static f32x4 sqrt4(f32x4 x)
{
	f32x4 y = as_f(0x5f375a86 - (as_i(x) >> 1)), h = 0.5f * x;
	y = y * (1.5f - h * y * y);
	y = y * (1.5f - h * y * y);
	y = y * (1.5f - h * y * y);
	return x * y;
}

/* Four pairs of normals j0..j0+3 into out[0..8): out[2l] = r cos, out[2l+1] = r sin. */
static void normal_block(Stream *s, uint64_t j0, float *out)
{
	u32x4 k1, k2, lo;
	uint32_t a, b;
	if ((j0 >> 32) == ((j0 + 3) >> 32)) {
		stream_keys(s, j0 >> 32, &a, &b);
		k1 = (u32x4){a, a, a, a}, k2 = (u32x4){b, b, b, b};
	} else
		for (int l = 0; l < 4; l++) {
			stream_keys(s, (j0 + (uint64_t)l) >> 32, &a, &b);
			k1[l] = a, k2[l] = b;
		}
	uint32_t j = (uint32_t)j0;
	lo = (u32x4){j, j + 1, j + 2, j + 3};
	i32x4 h1 = (i32x4)(hash32x4(lo + k1) >> 8), h2 = (i32x4)(hash32x4(lo + k2) >> 8);
	f32x4 u1 = __builtin_convertvector(h1 + 1, f32x4) * (1.0f / 16777216.0f);
	f32x4 hh = (__builtin_convertvector(h2, f32x4) * (1.0f / 16777216.0f) - 0.5f) * 3.14159265f;
	f32x4 v = -2.0f * log4(u1);
	v = as_f(as_i(v) & (v > 0.0f)); /* exactly 0 for u1 == 1 */
	f32x4 r = sqrt4(v), q = hh * hh;
	f32x4 sn = hh * (1.0f + q * (-1.0f / 6 + q * (1.0f / 120 + q * (-1.0f / 5040 + q * (1.0f / 362880 + q * (-1.0f / 39916800))))));
	f32x4 cs = 1.0f + q * (-0.5f + q * (1.0f / 24 + q * (-1.0f / 720 + q * (1.0f / 40320 + q * (-1.0f / 3628800 + q * (1.0f / 479001600))))));
	f32x4 c2 = r * (cs * cs - sn * sn), s2 = r * (2.0f * sn * cs);
	for (int l = 0; l < 4; l++)
		out[2 * l] = c2[l], out[2 * l + 1] = s2[l];
}

/* dst[k] = mean + std * normal(i0 + k), k < n. */
static void fill_normal(Stream *s, float *dst, uint64_t i0, int64_t n, float mean, float std)
{
	float tmp[8];
	for (int64_t k = 0; k < n;) {
		uint64_t i = i0 + (uint64_t)k, j0 = (i >> 1) & ~(uint64_t)3;
		int64_t from = (int64_t)(i - 2 * j0), cnt = 8 - from < n - k ? 8 - from : n - k;
		normal_block(s, j0, tmp);
		for (int64_t m = 0; m < cnt; m++)
			dst[k + m] = mean + std * tmp[from + m];
		k += cnt;
	}
}

/* 32 random bits for element i. */
static uint32_t elem_bits(Stream *s, uint64_t i)
{
	uint32_t k1, k2;
	stream_keys(s, i >> 32, &k1, &k2);
	return hash32((uint32_t)i + k1) ^ k2;
}

typedef enum { DIST_CONST, DIST_NORMAL, DIST_UNIFORM, DIST_INTS } DistKind;

typedef struct {
	DistKind kind;
	float a, b;    /* const: a; normal: mean a, std b; uniform: [a, b) */
	int64_t range; /* ints: [0, range) */
} Dist;

/* The distribution of value v's elements. */
static Dist dist_of(const Value *v, int64_t id_range)
{
	Init in = v->init;
	if (v->kind == VK_CONST)
		return (Dist){DIST_CONST, (float)v->cval, 0, 0};
	if (v->kind == VK_STATE && in.kind == INIT_DEFAULT)
		in.kind = INIT_ZEROS;
	if (in.kind == INIT_ZEROS || in.kind == INIT_ONES)
		return (Dist){DIST_CONST, in.kind == INIT_ONES ? 1.0f : 0.0f, 0, 0};
	if (v->dtype == DT_I32)
		return (Dist){DIST_INTS, 0, 0, id_range};
	if (in.kind == INIT_NORMAL)
		return (Dist){DIST_NORMAL, 0, (float)in.a, 0};
	if (in.kind == INIT_UNIFORM)
		return (Dist){DIST_UNIFORM, (float)in.a, (float)in.b, 0};
	return (Dist){DIST_NORMAL, 0, v->kind == VK_PARAM ? 0.02f : 1.0f, 0};
}

/* n elements from global flat index i0 into dst. */
static void fill_run(Stream *s, const Dist *d, bool isint, void *dst, uint64_t i0, int64_t n)
{
	float *f = dst;
	int32_t *q = dst;
	int64_t range = d->range < 0 ? 0 : d->range > INT32_MAX ? INT32_MAX : d->range;
	switch (d->kind) {
	case DIST_CONST:
		for (int64_t k = 0; k < n; k++)
			if (isint)
				q[k] = (int32_t)d->a;
			else
				f[k] = d->a;
		break;
	case DIST_NORMAL: fill_normal(s, f, i0, n, d->a, d->b); break;
	case DIST_UNIFORM:
		for (int64_t k = 0; k < n; k++)
			f[k] = d->a + (d->b - d->a) * (float)(elem_bits(s, i0 + (uint64_t)k) >> 8) * (1.0f / 16777216.0f);
		break;
	case DIST_INTS:
		for (int64_t k = 0; k < n; k++)
			q[k] = (int32_t)(((uint64_t)elem_bits(s, i0 + (uint64_t)k) * (uint64_t)range) >> 32);
		break;
	}
}

/* The local tensor is walked in runs: dims after `p` are whole (local ==
 * global, offset 0), so for each index of dims [0, p) the part of dim p
 * inside the global tensor, with everything after it, is one global run. */
void data_fill(Tensor *t, const Value *v, const Shape *global, const int64_t *offset, uint64_t seed,
               int64_t id_range)
{
	static const int64_t zero[MAX_RANK];
	const Shape *ls = &t->shape;
	int r = ls->rank;
	offset = offset ? offset : zero;
	Stream s;
	stream_init(&s, seed, v->name);
	Dist dist = dist_of(v, id_range);
	bool isint = t->dtype == DT_I32;
	uint32_t *out = t->data;
	if (shape_numel(ls) == 0)
		return;
	if (r == 0) {
		fill_run(&s, &dist, isint, out, 0, 1);
		tensor_round(t);
		return;
	}
	int p = r - 1;
	while (p > 0 && ls->dim[p] == global->dim[p] && offset[p] == 0)
		p--;
	int64_t gst[MAX_RANK], inner = 1, idx[MAX_RANK] = {0};
	for (int d = r - 1; d >= 0; d--) {
		gst[d] = inner;
		inner *= global->dim[d];
	}
	int64_t tail = 1; /* elements per index of dim p */
	for (int d = p + 1; d < r; d++)
		tail *= ls->dim[d];
	int64_t row = ls->dim[p] * tail; /* local elements per run slot */
	int64_t have = global->dim[p] - offset[p];
	have = have < 0 ? 0 : have > ls->dim[p] ? ls->dim[p] : have;
	for (int64_t base = 0;; base += row) {
		bool inside = true;
		int64_t g0 = offset[p] * gst[p];
		for (int d = 0; d < p; d++) {
			int64_t gi = offset[d] + idx[d];
			inside &= gi < global->dim[d];
			g0 += gi * gst[d];
		}
		int64_t n = inside ? have * tail : 0;
		if (n > 0)
			fill_run(&s, &dist, isint, out + base, (uint64_t)g0, n);
		memset(out + base + n, 0, (size_t)(row - n) * 4);
		int d = p - 1;
		for (; d >= 0 && ++idx[d] == ls->dim[d]; d--)
			idx[d] = 0;
		if (d < 0)
			break;
	}
	tensor_round(t);
}

/* The range one reader puts on its operand k; range[] already holds the
 * ranges of values read later. */
static int64_t reader_range(const Graph *g, const Op *op, int k, const int64_t *range)
{
	if (op->kind == OP_TAKE && k == 1) {
		const Shape *tab = &g->values.a[op->in[0]].shape;
		return tab->rank ? tab->dim[0] : 1;
	}
	if (op->kind == OP_ONE_HOT)
		return op->attr->depth;
	if (op->kind == OP_TAKE_GRAD && k == 1)
		return op->attr->depth;
	if ((op->kind == OP_SOFTMAX_CROSS_ENTROPY || op->kind == OP_SOFTMAX_CROSS_ENTROPY_GRAD) && k == 1) {
		const Shape *x = &g->values.a[op->in[0]].shape;
		return x->rank ? x->dim[x->rank - 1] : 1;
	}
	if ((op_table[op->kind].flags & OPF_MOVE) && op->kind != OP_CAST && g->values.a[op->out].dtype == DT_I32)
		return range[op->out] >= 0 ? range[op->out] : 1000;
	return 1000;
}

/* One backward pass over the ops (topological order: readers come later). */
int64_t data_id_range(const Graph *g, int value)
{
	int64_t *range = xmalloc(sizeof(int64_t) * (size_t)(g->values.n + 1));
	for (int i = 0; i < g->values.n; i++)
		range[i] = -1;
	for (int i = g->ops.n - 1; i >= 0; i--) {
		const Op *op = &g->ops.a[i];
		for (int k = 0; k < op->nin; k++) {
			int64_t r = reader_range(g, op, k, range), *p = &range[op->in[k]];
			*p = *p < 0 || r < *p ? r : *p;
		}
	}
	int64_t r = range[value] >= 0 ? range[value] : 1000;
	free(range);
	return r;
}
