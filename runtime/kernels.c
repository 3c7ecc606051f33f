/* kernels.c: the reference kernels of every op in the op table (numpy/ONNX semantics).
 *
 * Tensors hold 4-byte elements (float for every floating dtype, int32_t for
 * i32), row-major.  Most kernels are written over a "box": a rank-n iteration
 * space with, per tensor, a stride per dimension (0 for broadcast).  Boxes are
 * simplified (size-1 dims dropped, contiguous dims merged) and walked with an
 * odometer over all but the last dimension, which is the inner loop.
 *
 * einsum lowers to cblas_sgemm: letters are grouped into batch (both operands
 * and the result), M (first operand and result), N (second operand and
 * result) and K (both operands only); a letter in one operand only is summed
 * out first, a repeated letter (diagonal) becomes one letter whose stride is
 * the sum.  The planner then looks for the cheapest set of tensors that can
 * be used in place (a group is usable when its letters are adjacent in
 * memory; a matrix is usable when one of its two groups has unit stride,
 * giving the Trans flags), copies the others into [batch, rows, cols] scratch
 * and calls sgemm once per batch index. */
#include "exec.h"
#include "../spmd/ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* ---- boxes ---- */

enum { BOX_MAXT = 3, BOX_MAXD = 3 * MAX_RANK /* einsum letters */ };

typedef struct {
	int n, nt;                       /* dims, tensors */
	int64_t dim[BOX_MAXD];
	int64_t st[BOX_MAXT][BOX_MAXD];  /* element strides per tensor */
} Box;

static void strides_of(const Shape *s, int64_t *st)
{
	int64_t k = 1;
	for (int d = s->rank - 1; d >= 0; d--) {
		st[d] = k;
		k *= s->dim[d];
	}
}

/* Drop size-1 dims and merge dims d, d+1 that are contiguous in every tensor;
 * leaves at least one dim. */
static void box_simplify(Box *b)
{
	int n = 0;
	for (int d = 0; d < b->n; d++) {
		if (b->dim[d] == 1)
			continue;
		bool merge = n > 0;
		for (int t = 0; t < b->nt && merge; t++)
			merge = b->st[t][n - 1] == b->st[t][d] * b->dim[d];
		if (merge) {
			b->dim[n - 1] *= b->dim[d];
			for (int t = 0; t < b->nt; t++)
				b->st[t][n - 1] = b->st[t][d];
			continue;
		}
		b->dim[n] = b->dim[d];
		for (int t = 0; t < b->nt; t++)
			b->st[t][n] = b->st[t][d];
		n++;
	}
	if (n == 0) {
		b->dim[0] = 1;
		for (int t = 0; t < b->nt; t++)
			b->st[t][0] = 0;
		n = 1;
	}
	b->n = n;
}

static int64_t box_numel(const Box *b)
{
	int64_t n = 1;
	for (int d = 0; d < b->n; d++)
		n *= b->dim[d];
	return n;
}

/* Step the odometer over dims [0, n-1), updating every tensor's offset.
 * false after the last row. */
static bool box_next(const Box *b, int64_t *idx, int64_t *off)
{
	for (int d = b->n - 2; d >= 0; d--) {
		for (int t = 0; t < b->nt; t++)
			off[t] += b->st[t][d];
		if (++idx[d] < b->dim[d])
			return true;
		for (int t = 0; t < b->nt; t++)
			off[t] -= b->st[t][d] * b->dim[d];
		idx[d] = 0;
	}
	return false;
}

/* dst[od + i.ds] = src[os + i.ss] for every i in dims[0..n) (4-byte elements). */
static void copy_strided(uint32_t *dst, const int64_t *ds, const uint32_t *src, const int64_t *ss,
                         const int64_t *dims, int n)
{
	Box b = {.n = n, .nt = 2};
	for (int d = 0; d < n; d++)
		b.dim[d] = dims[d], b.st[0][d] = ds[d], b.st[1][d] = ss[d];
	box_simplify(&b);
	if (box_numel(&b) == 0)
		return;
	int64_t idx[BOX_MAXD] = {0}, off[2] = {0, 0};
	int64_t m = b.dim[b.n - 1], sd = b.st[0][b.n - 1], sv = b.st[1][b.n - 1];
	do {
		uint32_t *o = dst + off[0];
		const uint32_t *s = src + off[1];
		if (sd == 1 && sv == 1)
			memcpy(o, s, (size_t)m * 4);
		else
			for (int64_t i = 0; i < m; i++)
				o[i * sd] = s[i * sv];
	} while (box_next(&b, idx, off));
}

/* ---- elementwise unary ---- */

static float gelu(float x)
{
	const float c = 0.7978845608028654f; /* sqrt(2/pi) */
	return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static float sigmoid(float x)
{
	if (x >= 0)
		return 1.0f / (1.0f + expf(-x));
	float e = expf(x);
	return e / (1.0f + e);
}

/* x > 0 ? x : +0 (NaN: 0), without a branch: a compare-and-branch on data
 * of both signs mispredicts every other element (5 ns an element against
 * 0.8 here). */
static void relu_f32(float *y, const float *x, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &x[i], sizeof u);
		u &= 0u - (uint32_t)(x[i] > 0);
		memcpy(&y[i], &u, sizeof u);
	}
}

static void unary_f32(OpKind k, float *y, const float *x, int64_t n)
{
	switch (k) {
	case OP_NEG: for (int64_t i = 0; i < n; i++) y[i] = -x[i]; break;
	case OP_ABS: for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]); break;
	case OP_EXP: for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]); break;
	case OP_LOG: for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]); break;
	case OP_SQRT: for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]); break;
	case OP_RSQRT: for (int64_t i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]); break;
	case OP_TANH: for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]); break;
	case OP_SIGMOID: for (int64_t i = 0; i < n; i++) y[i] = sigmoid(x[i]); break;
	case OP_RELU: relu_f32(y, x, n); break;
	case OP_GELU: for (int64_t i = 0; i < n; i++) y[i] = gelu(x[i]); break;
	case OP_SQUARE: for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i]; break;
	case OP_RECIPROCAL: for (int64_t i = 0; i < n; i++) y[i] = 1.0f / x[i]; break;
	default: break;
	}
}

/* i32: neg, abs, relu and square (wrapping like numpy); the rest need floats. */
static int unary_i32(KernCtx *kc, OpKind k, int32_t *y, const int32_t *x, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)x[i];
		switch (k) {
		case OP_NEG: y[i] = (int32_t)(0u - u); break;
		case OP_ABS: y[i] = x[i] < 0 ? (int32_t)(0u - u) : x[i]; break;
		case OP_RELU: y[i] = x[i] > 0 ? x[i] : 0; break;
		case OP_SQUARE: y[i] = (int32_t)(u * u); break;
		default: kern_fail(kc, "expected a float operand for %s, found i32", op_table[k].name); return -1;
		}
	}
	return 0;
}

int kern_unary(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	int64_t n = shape_numel(&out->shape);
	if (in[0]->dtype == DT_I32)
		return unary_i32(kc, op->kind, tensor_i32(out), tensor_i32(in[0]), n);
	unary_f32(op->kind, tensor_f32(out), tensor_f32(in[0]), n);
	return 0;
}

/* ---- elementwise binary with broadcasting ---- */

/* y[i] = a[i*sa] OP b[i*sb] for i < n. */
static void binary_row_f32(OpKind k, float *y, const float *a, int64_t sa, const float *b, int64_t sb, int64_t n)
{
#define LOOP(expr) for (int64_t i = 0; i < n; i++) { float x = a[i * sa], z = b[i * sb]; y[i] = (expr); } break
	switch (k) {
	case OP_ADD: LOOP(x + z);
	case OP_SUB: LOOP(x - z);
	case OP_MUL: LOOP(x * z);
	case OP_DIV: LOOP(x / z);
	case OP_MAX: LOOP(isnan(x) || x > z ? x : z);
	case OP_MIN: LOOP(isnan(x) || x < z ? x : z);
	case OP_POW: LOOP(powf(x, z));
	default: break;
	}
#undef LOOP
}

/* Integer power by squaring, wrapping; negative exponents give 0 except for bases 1 and -1. */
static int32_t ipow(int32_t x, int32_t e)
{
	if (e < 0)
		return x == 1 ? 1 : x == -1 ? (e % 2 ? -1 : 1) : 0;
	uint32_t r = 1, b = (uint32_t)x;
	for (; e; e >>= 1, b *= b)
		if (e & 1)
			r *= b;
	return (int32_t)r;
}

/* i32 ops wrap like numpy; division truncates toward zero (ONNX Div). */
static int binary_row_i32(KernCtx *kc, OpKind k, int32_t *y, const int32_t *a, int64_t sa, const int32_t *b,
                          int64_t sb, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		int32_t x = a[i * sa], z = b[i * sb];
		switch (k) {
		case OP_ADD: y[i] = (int32_t)((uint32_t)x + (uint32_t)z); break;
		case OP_SUB: y[i] = (int32_t)((uint32_t)x - (uint32_t)z); break;
		case OP_MUL: y[i] = (int32_t)((uint32_t)x * (uint32_t)z); break;
		case OP_MAX: y[i] = x > z ? x : z; break;
		case OP_MIN: y[i] = x < z ? x : z; break;
		case OP_POW: y[i] = ipow(x, z); break;
		case OP_DIV:
			if (z == 0) {
				kern_fail(kc, "expected a non-zero divisor, found 0 (integer division)");
				return -1;
			}
			y[i] = (x == INT32_MIN && z == -1) ? INT32_MIN : x / z;
			break;
		default: return -1;
		}
	}
	return 0;
}

/* Strides of operand s in the broadcast result of rank r: right-aligned, 0 on
 * broadcast (size-1 or missing) dims. */
static void broadcast_strides(const Shape *s, const Shape *out, int64_t *st)
{
	int64_t own[MAX_RANK];
	strides_of(s, own);
	int r = out->rank, lead = r - s->rank;
	for (int d = 0; d < r; d++) {
		int e = d - lead;
		st[d] = (e < 0 || s->dim[e] == 1) ? 0 : own[e];
	}
}

/* A scalar constant (f32) takes the dtype of the other operand (docs/format.md):
 * with a bf16 or f16 result, use it rounded to that dtype. */
static const Tensor *const_operand(const Tensor *x, const Tensor *out, Tensor *tmp, float *cell)
{
	if (x->dtype == out->dtype || (out->dtype != DT_BF16 && out->dtype != DT_F16) || shape_numel(&x->shape) != 1)
		return x;
	*cell = tensor_f32(x)[0];
	*tmp = (Tensor){out->dtype, x->shape, cell};
	tensor_round(tmp);
	return tmp;
}

int kern_binary(KernCtx *kc, const Op *op, const Tensor *const *operands, Tensor *out)
{
	Tensor tmp[2];
	float cell[2];
	const Tensor *in[2] = {const_operand(operands[0], out, &tmp[0], &cell[0]),
	                       const_operand(operands[1], out, &tmp[1], &cell[1])};
	Box b = {.n = out->shape.rank, .nt = 3};
	memcpy(b.dim, out->shape.dim, sizeof out->shape.dim);
	strides_of(&out->shape, b.st[0]);
	broadcast_strides(&in[0]->shape, &out->shape, b.st[1]);
	broadcast_strides(&in[1]->shape, &out->shape, b.st[2]);
	box_simplify(&b);
	if (box_numel(&b) == 0)
		return 0;
	bool isint = in[0]->dtype == DT_I32;
	int64_t idx[BOX_MAXD] = {0}, off[3] = {0, 0, 0}, m = b.dim[b.n - 1];
	int64_t sa = b.st[1][b.n - 1], sb = b.st[2][b.n - 1];
	do {
		if (isint) {
			if (binary_row_i32(kc, op->kind, tensor_i32(out) + off[0], tensor_i32(in[0]) + off[1], sa,
			                   tensor_i32(in[1]) + off[2], sb, m) != 0)
				return -1;
		} else
			binary_row_f32(op->kind, tensor_f32(out) + off[0], tensor_f32(in[0]) + off[1], sa,
			               tensor_f32(in[1]) + off[2], sb, m);
	} while (box_next(&b, idx, off));
	return 0;
}

/* ---- einsum ---- */

enum { EIN_MAXL = 3 * MAX_RANK };

/* Letters of an einsum: t = 0 first operand, 1 second, 2 result. */
typedef struct {
	int nl;
	char ch[EIN_MAXL];
	int64_t dim[EIN_MAXL];
	bool has[3][EIN_MAXL];
	int64_t st[3][EIN_MAXL]; /* stride per letter (a repeated letter: the sum), 0 when absent */
} Ein;

static int ein_letter(Ein *e, char c)
{
	for (int l = 0; l < e->nl; l++)
		if (e->ch[l] == c)
			return l;
	e->ch[e->nl] = c;
	e->dim[e->nl] = -1;
	return e->nl++;
}

/* Add tensor t with letters let[0..n); contiguous strides. -1 on a letter size mismatch. */
static int ein_add(KernCtx *kc, Ein *e, int t, const char *let, int n, const Shape *s)
{
	int64_t st[MAX_RANK];
	if (n != s->rank) {
		kern_fail(kc, "einsum: expected %d letters for a rank-%d tensor, found %d", s->rank, s->rank, n);
		return -1;
	}
	strides_of(s, st);
	for (int i = 0; i < n; i++) {
		int l = ein_letter(e, let[i]);
		if (e->dim[l] >= 0 && e->dim[l] != s->dim[i]) {
			kern_fail(kc, "einsum: expected size %lld for letter '%c', found %lld", (long long)e->dim[l], let[i],
			     (long long)s->dim[i]);
			return -1;
		}
		if (t == 2 && e->has[2][l]) {
			kern_fail(kc, "einsum: expected distinct result letters, found '%c' twice", let[i]);
			return -1;
		}
		e->dim[l] = s->dim[i];
		e->has[t][l] = true;
		e->st[t][l] += st[i];
	}
	return 0;
}

/* The box over letters list[0..n) with the strides of tensors ts[0..nt). */
static void ein_box(const Ein *e, const int *list, int n, const int *ts, int nt, Box *b)
{
	b->n = n, b->nt = nt;
	for (int i = 0; i < n; i++) {
		b->dim[i] = e->dim[list[i]];
		for (int t = 0; t < nt; t++)
			b->st[t][i] = e->st[ts[t]][list[i]];
	}
	box_simplify(b);
}

/* Sum over box s (tensor 0: a, tensor 1: b, or b NULL for 1) in double. */
static double ein_sum(const Box *s, const float *a, const float *b)
{
	int64_t idx[BOX_MAXD] = {0}, off[2] = {0, 0}, m = s->dim[s->n - 1];
	int64_t sa = s->st[0][s->n - 1], sb = s->st[1][s->n - 1];
	double acc = 0;
	do {
		const float *x = a + off[0];
		if (b) {
			const float *y = b + off[1];
			for (int64_t i = 0; i < m; i++)
				acc += (double)x[i * sa] * y[i * sb];
		} else
			for (int64_t i = 0; i < m; i++)
				acc += x[i * sa];
	} while (box_next(s, idx, off));
	return acc;
}

/* The general path: every result element is a sum over the letters not in
 * the result.  Used for one operand, and for products too small for sgemm. */
static void ein_naive(const Ein *e, const float *a, const float *b, float *y)
{
	int ol[EIN_MAXL], sl[EIN_MAXL], no = 0, ns = 0;
	for (int l = 0; l < e->nl; l++) {
		if (e->has[2][l])
			ol[no++] = l;
		else
			sl[ns++] = l;
	}
	if (ns == 0 && !b) { /* a transpose or a diagonal: just moves */
		int64_t dims[EIN_MAXL], ds[EIN_MAXL], ss[EIN_MAXL];
		for (int i = 0; i < no; i++)
			dims[i] = e->dim[ol[i]], ds[i] = e->st[2][ol[i]], ss[i] = e->st[0][ol[i]];
		copy_strided((uint32_t *)y, ds, (const uint32_t *)a, ss, dims, no);
		return;
	}
	Box o, s;
	ein_box(e, ol, no, (int[]){2, 0, 1}, 3, &o);
	ein_box(e, sl, ns, (int[]){0, 1}, 2, &s);
	if (box_numel(&o) == 0)
		return;
	bool empty = box_numel(&s) == 0;
	int64_t idx[BOX_MAXD] = {0}, off[3] = {0, 0, 0}, m = o.dim[o.n - 1];
	do {
		for (int64_t i = 0; i < m; i++) {
			const float *pb = b ? b + off[2] + i * o.st[2][o.n - 1] : NULL;
			double v = empty ? 0 : ein_sum(&s, a + off[1] + i * o.st[1][o.n - 1], pb);
			y[off[0] + i * o.st[0][o.n - 1]] = (float)v;
		}
	} while (box_next(&o, idx, off));
}

/* Operand t of a two-operand einsum reduced to the letters it shares with
 * the other operand or the result (first-appearance order, each once): sums
 * out letters of its own and takes diagonals.  Returns a new buffer and
 * writes its letters, or NULL when the operand is fine as it is. */
static float *ein_prepare(const Op *op, int t, const Tensor *x, char *let, int *nlet, Shape *s)
{
	const Attr *at = op->attr;
	int n = 0;
	bool change = false;
	for (int i = 0; i < at->nlet[t]; i++) {
		char c = at->let[t][i];
		bool keep = memchr(at->let[1 - t], c, (size_t)at->nlet[1 - t]) || memchr(at->let[2], c, (size_t)at->nlet[2]);
		bool dup = memchr(let, c, (size_t)n) != NULL;
		if (keep && !dup) {
			s->dim[n] = x->shape.dim[i];
			let[n++] = c;
		}
		change |= !keep || dup;
	}
	*nlet = n;
	s->rank = n;
	if (!change)
		return NULL;
	Ein e = {0};
	KernCtx kc;
	ein_add(&kc, &e, 0, at->let[t], at->nlet[t], &x->shape);
	ein_add(&kc, &e, 2, let, n, s);
	float *y = xmalloc((size_t)shape_numel(s) * sizeof(float) + 1);
	ein_naive(&e, tensor_f32(x), NULL, y);
	return y;
}

/* The GEMM view: letter groups, their orders, and per tensor whether it is
 * used in place.  Tensors 0 (A), 1 (B), 2 (C, the result). */
typedef struct {
	int ng[4];              /* G_BATCH, G_M, G_N, G_K */
	int g[4][EIN_MAXL];     /* letter ids, in the chosen order */
	int64_t size[4];
	int64_t cst[3][EIN_MAXL]; /* strides used for the GEMM (actual, or of the scratch copy) */
	bool inplace[3];
	bool trans[2];          /* A, B: CblasTrans */
	bool swap;              /* C is [N, M]: compute C^T = B^T A^T */
	int64_t ld[3];
} Plan;

enum { G_BATCH, G_M, G_N, G_K };

/* Sort group letters by decreasing stride in tensor t (insertion sort; tiny). */
static void group_sort(Plan *p, int grp, const Ein *e, int t)
{
	int *g = p->g[grp];
	for (int i = 1; i < p->ng[grp]; i++)
		for (int j = i; j > 0 && e->st[t][g[j - 1]] < e->st[t][g[j]]; j--) {
			int x = g[j];
			g[j] = g[j - 1], g[j - 1] = x;
		}
}

/* Whether group grp's letters are adjacent, in order, in tensor t; *st gets
 * the stride of the group (of its last letter; 0 when empty). */
static bool group_flat(const Plan *p, int grp, const Ein *e, int t, int64_t *st)
{
	const int *g = p->g[grp];
	int n = p->ng[grp];
	for (int i = 0; i + 1 < n; i++)
		if (e->st[t][g[i]] != e->st[t][g[i + 1]] * e->dim[g[i + 1]])
			return false;
	*st = n ? e->st[t][g[n - 1]] : 0;
	return true;
}

/* A matrix [rows, cols] with these group strides as a BLAS operand: NoTrans
 * needs unit-stride cols, Trans unit-stride rows.  false if neither. */
static bool blas_operand(int64_t rows, int64_t rs, int64_t cols, int64_t cs, bool *trans, int64_t *ld)
{
	if (cols == 1 || cs == 1) {
		*trans = false;
		*ld = rows == 1 ? (cols > 1 ? cols : 1) : rs;
		return *ld >= (cols > 1 ? cols : 1) && *ld <= INT32_MAX;
	}
	if (rows == 1 || rs == 1) { /* here cols > 1 */
		*trans = true;
		*ld = cs;
		return *ld >= (rows > 1 ? rows : 1) && *ld <= INT32_MAX;
	}
	return false;
}

/* Row and column groups of tensor t: A [M, K], B [K, N], C [M, N]. */
static const int plan_rows[3] = {G_M, G_K, G_M}, plan_cols[3] = {G_K, G_N, G_N};

/* Can tensor t be used in place with the current group orders? */
static bool plan_fits(Plan *p, const Ein *e, int t)
{
	int r = plan_rows[t], c = plan_cols[t];
	int64_t rs, cs;
	if (!group_flat(p, r, e, t, &rs) || !group_flat(p, c, e, t, &cs))
		return false;
	if (t < 2)
		return blas_operand(p->size[r], rs, p->size[c], cs, &p->trans[t], &p->ld[t]);
	bool tr;
	if (!blas_operand(p->size[r], rs, p->size[c], cs, &tr, &p->ld[2]))
		return false;
	p->swap = tr;
	return true;
}

/* Try the set of in-place tensors `mask`; true if every one of them fits. */
static bool plan_try(Plan *p, const Ein *e, unsigned mask)
{
	static const int owner[4][2] = {{2, 2}, {0, 2}, {1, 2}, {0, 1}}; /* who may order each group */
	for (int grp = G_M; grp <= G_K; grp++)
		for (int i = 0; i < 2; i++)
			if (mask & (1u << owner[grp][i])) {
				group_sort(p, grp, e, owner[grp][i]);
				break;
			}
	p->swap = false;
	for (int t = 0; t < 3; t++) {
		p->inplace[t] = mask & (1u << t);
		if (p->inplace[t] && !plan_fits(p, e, t))
			return false;
	}
	return true;
}

/* Strides of the scratch copy of tensor t: [batch, rows, cols], contiguous. */
static void plan_scratch(Plan *p, const Ein *e, int t)
{
	int order[3] = {G_BATCH, plan_rows[t], plan_cols[t]};
	int64_t k = 1;
	memset(p->cst[t], 0, sizeof p->cst[t]);
	for (int i = 2; i >= 0; i--)
		for (int j = p->ng[order[i]] - 1; j >= 0; j--) {
			int l = p->g[order[i]][j];
			p->cst[t][l] = k;
			k *= e->dim[l];
		}
	if (t < 2) {
		p->trans[t] = false;
		p->ld[t] = p->size[plan_cols[t]];
	} else
		p->ld[2] = p->size[G_N];
}

/* Group the letters and choose the in-place set that copies the fewest
 * elements. */
static void plan_make(Plan *p, const Ein *e, const int64_t *numel)
{
	memset(p, 0, sizeof *p);
	for (int grp = 0; grp < 4; grp++)
		p->size[grp] = 1;
	for (int l = 0; l < e->nl; l++) {
		bool a = e->has[0][l], b = e->has[1][l], c = e->has[2][l];
		int grp = a && b ? (c ? G_BATCH : G_K) : a ? G_M : G_N;
		if (e->dim[l] == 1)
			continue;
		p->g[grp][p->ng[grp]++] = l;
		p->size[grp] *= e->dim[l];
	}
	int64_t best = -1;
	unsigned bestmask = 0;
	for (unsigned mask = 0; mask < 8; mask++) {
		int64_t cost = 0;
		for (int t = 0; t < 3; t++)
			cost += mask & (1u << t) ? 0 : numel[t];
		if ((best < 0 || cost < best) && plan_try(p, e, mask))
			best = cost, bestmask = mask;
	}
	plan_try(p, e, bestmask);
	for (int t = 0; t < 3; t++) {
		if (p->inplace[t])
			memcpy(p->cst[t], e->st[t], sizeof p->cst[t]);
		else
			plan_scratch(p, e, t);
	}
}

/* Copy tensor t between its real layout and the plan's scratch layout. */
static void plan_copy(const Plan *p, const Ein *e, int t, float *dst, const float *src, bool to_scratch)
{
	int64_t dims[EIN_MAXL], ds[EIN_MAXL], ss[EIN_MAXL];
	int n = 0;
	for (int l = 0; l < e->nl; l++) {
		if (!e->has[t][l] || e->dim[l] == 1)
			continue;
		dims[n] = e->dim[l];
		ds[n] = to_scratch ? p->cst[t][l] : e->st[t][l];
		ss[n] = to_scratch ? e->st[t][l] : p->cst[t][l];
		n++;
	}
	copy_strided((uint32_t *)dst, ds, (const uint32_t *)src, ss, dims, n);
}

/* One sgemm per batch index: C[b] = A[b] B[b]. */
static void plan_run(const Plan *p, const Ein *e, const float *a, const float *b, float *c)
{
	Box q = {.n = p->ng[G_BATCH], .nt = 3};
	for (int i = 0; i < q.n; i++) {
		int l = p->g[G_BATCH][i];
		q.dim[i] = e->dim[l];
		for (int t = 0; t < 3; t++)
			q.st[t][i] = p->cst[t][l];
	}
	box_simplify(&q);
	int64_t idx[BOX_MAXD] = {0}, off[3] = {0, 0, 0};
	int64_t M = p->size[G_M], N = p->size[G_N], K = p->size[G_K], m = q.dim[q.n - 1];
	CBLAS_TRANSPOSE ta = p->trans[0] ? CblasTrans : CblasNoTrans, tb = p->trans[1] ? CblasTrans : CblasNoTrans;
	do {
		for (int64_t i = 0; i < m; i++) {
			const float *pa = a + off[0] + i * q.st[0][q.n - 1], *pb = b + off[1] + i * q.st[1][q.n - 1];
			float *pc = c + off[2] + i * q.st[2][q.n - 1];
			if (p->swap) /* C^T [N, M] = B^T A^T */
				cblas_sgemm(CblasRowMajor, tb == CblasTrans ? CblasNoTrans : CblasTrans,
				            ta == CblasTrans ? CblasNoTrans : CblasTrans, (int)N, (int)M, (int)K, 1.0f, pb,
				            (int)p->ld[1], pa, (int)p->ld[0], 0.0f, pc, (int)p->ld[2]);
			else
				cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, 1.0f, pa, (int)p->ld[0], pb,
				            (int)p->ld[1], 0.0f, pc, (int)p->ld[2]);
		}
	} while (box_next(&q, idx, off));
}

/* Two prepared operands (no letters of their own, no diagonals). */
static void ein_two(const Ein *e, const float *a, const float *b, float *y, const int64_t *numel)
{
	Plan p;
	plan_make(&p, e, numel);
	int64_t M = p.size[G_M], N = p.size[G_N], K = p.size[G_K];
	if (K == 0) {
		memset(y, 0, (size_t)numel[2] * sizeof(float));
		return;
	}
	if (M * N * K < 64 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) {
		ein_naive(e, a, b, y);
		return;
	}
	const float *src[2] = {a, b};
	float *buf[3] = {NULL, NULL, NULL};
	for (int t = 0; t < 3; t++)
		if (!p.inplace[t])
			buf[t] = xmalloc((size_t)numel[t] * sizeof(float) + 1);
	for (int t = 0; t < 2; t++)
		if (buf[t])
			plan_copy(&p, e, t, buf[t], src[t], true);
	plan_run(&p, e, buf[0] ? buf[0] : a, buf[1] ? buf[1] : b, buf[2] ? buf[2] : y);
	if (buf[2])
		plan_copy(&p, e, 2, y, buf[2], false);
	for (int t = 0; t < 3; t++)
		free(buf[t]);
}

/* Check the letters against the shapes; every result letter must come from an operand. */
static int ein_check(KernCtx *kc, const Op *op, const Tensor *const *in, const Tensor *out)
{
	const Attr *at = op->attr;
	Ein e = {0};
	for (int t = 0; t < op->nin; t++)
		if (ein_add(kc, &e, t, at->let[t], at->nlet[t], &in[t]->shape) != 0)
			return -1;
	if (ein_add(kc, &e, 2, at->let[2], at->nlet[2], &out->shape) != 0)
		return -1;
	for (int l = 0; l < e.nl; l++)
		if (e.has[2][l] && !e.has[0][l] && !e.has[1][l]) {
			kern_fail(kc, "einsum: expected result letter '%c' in an operand, found it only in the result", e.ch[l]);
			return -1;
		}
	for (int t = 0; t < op->nin; t++)
		if (in[t]->dtype == DT_I32) {
			kern_fail(kc, "einsum: expected float operands, found i32");
			return -1;
		}
	return 0;
}

int kern_einsum(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Attr *at = op->attr;
	if (ein_check(kc, op, in, out) != 0)
		return -1;
	Ein e = {0};
	if (op->nin == 1) {
		ein_add(kc, &e, 0, at->let[0], at->nlet[0], &in[0]->shape);
		ein_add(kc, &e, 2, at->let[2], at->nlet[2], &out->shape);
		ein_naive(&e, tensor_f32(in[0]), NULL, tensor_f32(out));
		return 0;
	}
	char let[2][MAX_RANK];
	int nlet[2];
	Shape s[2];
	float *own[2];
	const float *x[2];
	for (int t = 0; t < 2; t++) {
		own[t] = ein_prepare(op, t, in[t], let[t], &nlet[t], &s[t]);
		x[t] = own[t] ? own[t] : tensor_f32(in[t]);
		ein_add(kc, &e, t, let[t], nlet[t], &s[t]);
	}
	ein_add(kc, &e, 2, at->let[2], at->nlet[2], &out->shape);
	int64_t numel[3] = {shape_numel(&s[0]), shape_numel(&s[1]), shape_numel(&out->shape)};
	if (numel[2] > 0)
		ein_two(&e, x[0], x[1], tensor_f32(out), numel);
	free(own[0]);
	free(own[1]);
	return 0;
}

/* ---- reductions ---- */

/* acc[o] (+)= x over the box (tensor 0: acc, 1: x); max when `max`. */
static void reduce_box(const Box *b, double *acc, const void *x, bool isint, bool max)
{
	int64_t idx[BOX_MAXD] = {0}, off[2] = {0, 0}, m = b->dim[b->n - 1];
	int64_t so = b->st[0][b->n - 1], si = b->st[1][b->n - 1];
	do {
		double *o = acc + off[0];
		for (int64_t i = 0; i < m; i++) {
			double v = isint ? ((const int32_t *)x)[off[1] + i * si] : ((const float *)x)[off[1] + i * si];
			double *p = o + i * so;
			if (!max)
				*p += v;
			else if (v > *p || isnan(v))
				*p = v;
		}
	} while (box_next(b, idx, off));
}

/* reduce_sum, reduce_max, reduce_mean over attr->axes, in double. */
int kern_reduce(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Attr *at = op->attr;
	const Tensor *x = in[0];
	Box b = {.n = x->shape.rank, .nt = 2};
	memcpy(b.dim, x->shape.dim, sizeof x->shape.dim);
	strides_of(&x->shape, b.st[1]);
	int64_t k = 1, count = 1;
	for (int d = x->shape.rank - 1; d >= 0; d--) {
		bool red = false;
		for (int i = 0; i < at->naxes; i++)
			red |= at->axes[i] == d;
		b.st[0][d] = red ? 0 : k;
		k *= red ? 1 : x->shape.dim[d];
		count *= red ? x->shape.dim[d] : 1;
	}
	int64_t n = shape_numel(&out->shape);
	bool isint = x->dtype == DT_I32, max = op->kind == OP_REDUCE_MAX;
	double *acc = xmalloc((size_t)n * sizeof(double) + 1);
	for (int64_t i = 0; i < n; i++)
		acc[i] = max ? -INFINITY : 0;
	box_simplify(&b);
	if (box_numel(&b) > 0)
		reduce_box(&b, acc, x->data, isint, max);
	for (int64_t i = 0; i < n; i++) {
		double v = op->kind == OP_REDUCE_MEAN ? acc[i] / (double)count : acc[i];
		if (out->dtype == DT_I32) /* wraps like numpy's int32 */
			tensor_i32(out)[i] = isinf(v) ? INT32_MIN : (int32_t)(uint32_t)(int64_t)v;
		else
			tensor_f32(out)[i] = (float)v;
	}
	free(acc);
	return 0;
}

/* ---- softmax, log_softmax, layer_norm along one axis ---- */

void kern_axis_split(const Shape *s, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
	*outer = *inner = 1;
	for (int d = 0; d < s->rank; d++) {
		if (d < axis)
			*outer *= s->dim[d];
		else if (d > axis)
			*inner *= s->dim[d];
	}
	*n = s->rank ? s->dim[axis] : 1;
}

enum { NORM_SOFTMAX, NORM_LOG_SOFTMAX, NORM_LAYER };

/* One [n, inner] slab: per column i, the two statistics in s0, s1 (double). */
static void norm_slab(int kind, double eps, const float *x, float *y, int64_t n, int64_t inner, double *s0, double *s1)
{
	for (int64_t i = 0; i < inner; i++)
		s0[i] = kind == NORM_LAYER ? 0 : -INFINITY, s1[i] = 0;
	for (int64_t k = 0; k < n; k++) /* max, or sum for the mean */
		for (int64_t i = 0; i < inner; i++) {
			double v = x[k * inner + i];
			s0[i] = kind == NORM_LAYER ? s0[i] + v : (v > s0[i] ? v : s0[i]);
		}
	for (int64_t i = 0; i < inner; i++)
		if (kind == NORM_LAYER)
			s0[i] /= (double)n;
		else if (isinf(s0[i])) /* all -inf (or +inf): keep exp finite */
			s0[i] = s0[i] > 0 ? s0[i] : 0;
	for (int64_t k = 0; k < n; k++) /* sum of exp(x - max), or of squares */
		for (int64_t i = 0; i < inner; i++) {
			double v = x[k * inner + i] - s0[i];
			s1[i] += kind == NORM_LAYER ? v * v : exp(v);
		}
	for (int64_t k = 0; k < n; k++)
		for (int64_t i = 0; i < inner; i++) {
			double v = x[k * inner + i] - s0[i], r;
			if (kind == NORM_SOFTMAX)
				r = exp(v) / s1[i];
			else if (kind == NORM_LOG_SOFTMAX)
				r = v - log(s1[i]);
			else
				r = v / sqrt(s1[i] / (double)n + eps);
			y[k * inner + i] = (float)r;
		}
}

static int norm_run(int kind, const Op *op, const Tensor *x, Tensor *y)
{
	int64_t outer, n, inner;
	kern_axis_split(&x->shape, op->attr->axes[0], &outer, &n, &inner);
	double *s = xmalloc((size_t)inner * 2 * sizeof(double) + 1);
	for (int64_t o = 0; o < outer; o++)
		norm_slab(kind, op->attr->eps, tensor_f32(x) + o * n * inner, tensor_f32(y) + o * n * inner, n, inner, s,
		          s + inner);
	free(s);
	return 0;
}

int kern_softmax(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	return norm_run(NORM_SOFTMAX, op, in[0], out);
}

int kern_log_softmax(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	return norm_run(NORM_LOG_SOFTMAX, op, in[0], out);
}

/* (x - mean) / sqrt(var + eps) with the biased variance; no scale or bias. */
int kern_layer_norm(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	return norm_run(NORM_LAYER, op, in[0], out);
}

/* ---- data movement (any dtype: 4-byte elements moved as bits) ---- */

static uint32_t *bits(const Tensor *t) { return (uint32_t *)t->data; }

/* out[i] = in[perm applied]: out dim d is in dim perm[d]. */
int kern_transpose(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	int64_t ist[MAX_RANK], ost[MAX_RANK], ss[MAX_RANK];
	strides_of(&in[0]->shape, ist);
	strides_of(&out->shape, ost);
	for (int d = 0; d < out->shape.rank; d++)
		ss[d] = ist[op->attr->axes[d]];
	copy_strided(bits(out), ost, bits(in[0]), ss, out->shape.dim, out->shape.rank);
	return 0;
}

/* copy and reshape: the same elements in C order. */
int kern_copy(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	memmove(out->data, in[0]->data, (size_t)shape_numel(&out->shape) * 4);
	return 0;
}

int kern_broadcast_to(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	int64_t ost[MAX_RANK], ss[MAX_RANK];
	strides_of(&out->shape, ost);
	broadcast_strides(&in[0]->shape, &out->shape, ss);
	copy_strided(bits(out), ost, bits(in[0]), ss, out->shape.dim, out->shape.rank);
	return 0;
}

/* out[i] = in[start + i*stride] per dim. */
int kern_slice(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Attr *at = op->attr;
	int64_t ist[MAX_RANK], ost[MAX_RANK], ss[MAX_RANK], base = 0;
	strides_of(&in[0]->shape, ist);
	strides_of(&out->shape, ost);
	for (int d = 0; d < out->shape.rank; d++) {
		base += at->start[d] * ist[d];
		ss[d] = (at->stride[d] ? at->stride[d] : 1) * ist[d];
	}
	if (shape_numel(&out->shape) == 0)
		return 0;
	copy_strided(bits(out), ost, bits(in[0]) + base, ss, out->shape.dim, out->shape.rank);
	return 0;
}

/* Operands one after the other along attr->axis. */
int kern_concat(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	int ax = op->attr->axis;
	int64_t ost[MAX_RANK], ist[MAX_RANK], at = 0;
	strides_of(&out->shape, ost);
	for (int i = 0; i < op->nin; i++) {
		strides_of(&in[i]->shape, ist);
		copy_strided(bits(out) + at * ost[ax], ost, bits(in[i]), ist, in[i]->shape.dim, in[i]->shape.rank);
		at += in[i]->shape.dim[ax];
	}
	return 0;
}

/* float -> i32 truncates toward zero (numpy astype); NaN and values outside
 * the i32 range give INT32_MIN, as numpy does on x86. */
static int32_t float_to_i32(float x)
{
	if (!(x > -2147483904.0f && x < 2147483648.0f))
		return INT32_MIN;
	return (int32_t)x;
}

/* Fill with attr->value, then place the operand at offset low (start[]);
 * negative padding crops, as in ONNX. */
int kern_pad(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Attr *at = op->attr;
	int64_t n = shape_numel(&out->shape);
	if (out->dtype == DT_I32)
		for (int64_t i = 0; i < n; i++)
			tensor_i32(out)[i] = float_to_i32((float)at->value);
	else
		for (int64_t i = 0; i < n; i++)
			tensor_f32(out)[i] = (float)at->value;
	int64_t ist[MAX_RANK], ost[MAX_RANK], dims[MAX_RANK], ioff = 0, ooff = 0;
	strides_of(&in[0]->shape, ist);
	strides_of(&out->shape, ost);
	for (int d = 0; d < out->shape.rank; d++) {
		int64_t lo = at->start[d] < 0 ? -at->start[d] : 0; /* first input index kept */
		int64_t hi = in[0]->shape.dim[d];
		if (hi > out->shape.dim[d] - at->start[d])
			hi = out->shape.dim[d] - at->start[d];
		dims[d] = hi > lo ? hi - lo : 0;
		ioff += lo * ist[d];
		ooff += (lo + at->start[d]) * ost[d];
	}
	Shape s = {.rank = out->shape.rank};
	memcpy(s.dim, dims, sizeof dims);
	if (shape_numel(&s) > 0)
		copy_strided(bits(out) + ooff, ost, bits(in[0]) + ioff, ist, dims, out->shape.rank);
	return 0;
}

/* ---- conv2d: NHWC input, HWIO kernel, im2col + sgemm ---- */

typedef struct {
	int64_t n, h, w, c, kh, kw, o, oh, ow, sh, sw, pt, pl;
} Conv;

/* Clamp v to [lo, hi]. */
static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The im2col row of output position (oy, ox) of image img: KH*KW*C floats
 * in HWC order.  The window's KW pixels of one input row are adjacent in
 * NHWC, so each kernel row is one copy of KW*C floats, less the pixels in
 * the padding (zeros). */
static void conv_row(const Conv *cv, const float *img, int64_t oy, int64_t ox, float *row)
{
	int64_t c = cv->c, run = cv->kw * c, x0 = ox * cv->sw - cv->pl;
	int64_t lo = clamp64(-x0, 0, cv->kw), hi = clamp64(cv->w - x0, lo, cv->kw); /* window pixels inside */
	for (int64_t ky = 0; ky < cv->kh; ky++, row += run) {
		int64_t y = oy * cv->sh + ky - cv->pt;
		if (y < 0 || y >= cv->h || hi == lo) {
			memset(row, 0, (size_t)run * sizeof(float));
			continue;
		}
		if (lo > 0)
			memset(row, 0, (size_t)(lo * c) * sizeof(float));
		memcpy(row + lo * c, img + (y * cv->w + x0 + lo) * c, (size_t)((hi - lo) * c) * sizeof(float));
		if (hi < cv->kw)
			memset(row + hi * c, 0, (size_t)((cv->kw - hi) * c) * sizeof(float));
	}
}

/* conv2d as one matrix product: the im2col matrix of every output position
 * of every image (rows in NHW order, in blocks of about 16 MB) times the
 * kernel as a KH*KW*C_in x C_out matrix. */
int kern_conv2d(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Shape *xs = &in[0]->shape, *ks = &in[1]->shape;
	const Attr *at = op->attr;
	Conv cv = {xs->dim[0], xs->dim[1], xs->dim[2], xs->dim[3], ks->dim[0], ks->dim[1], ks->dim[3],
	           out->shape.dim[1], out->shape.dim[2], at->strides[0] ? at->strides[0] : 1,
	           at->strides[1] ? at->strides[1] : 1, at->padding[0][0], at->padding[1][0]};
	int64_t kcols = cv.kh * cv.kw * cv.c, rows = cv.n * cv.oh * cv.ow;
	if (shape_numel(&out->shape) == 0)
		return 0;
	if (kcols == 0 || kcols > INT32_MAX || cv.o > INT32_MAX) {
		memset(out->data, 0, (size_t)shape_numel(&out->shape) * 4);
		return 0;
	}
	int64_t chunk = clamp64(((int64_t)1 << 22) / kcols, 1, rows);
	float *cols = xmalloc((size_t)(chunk * kcols) * sizeof(float));
	int64_t b = 0, oy = 0, ox = 0;
	for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
		int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
		for (int64_t r = 0; r < nr; r++) {
			conv_row(&cv, tensor_f32(in[0]) + b * cv.h * cv.w * cv.c, oy, ox, cols + r * kcols);
			if (++ox < cv.ow)
				continue;
			ox = 0;
			if (++oy == cv.oh)
				oy = 0, b++;
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)cv.o, (int)kcols, 1.0f, cols, (int)kcols,
		            tensor_f32(in[1]), (int)cv.o, 0.0f, tensor_f32(out) + r0 * cv.o, (int)cv.o);
	}
	free(cols);
	return 0;
}

/* ---- lookups and casts ---- */

/* "[1, 2]": the multi-index of flat position i in s. */
static void index_format(const Shape *s, int64_t i, char *buf, size_t n)
{
	Shape idx = {.rank = s->rank};
	for (int d = s->rank - 1; d >= 0; d--) {
		idx.dim[d] = s->dim[d] ? i % s->dim[d] : 0;
		i = s->dim[d] ? i / s->dim[d] : 0;
	}
	shape_format(&idx, buf, n);
}

/* Rows of table [V, ...] picked by i32 ids of any shape.  An id outside
 * [0, V), negative ones included, is an error (no wrap-around). */
int kern_take(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Tensor *tab = in[0], *ids = in[1];
	int64_t v = tab->shape.rank ? tab->shape.dim[0] : 1;
	int64_t row = v ? shape_numel(&tab->shape) / v : 0, n = shape_numel(&ids->shape);
	for (int64_t i = 0; i < n; i++) {
		int32_t id = tensor_i32(ids)[i];
		if (id < 0 || id >= v) {
			char at[128];
			index_format(&ids->shape, i, at, sizeof at);
			kern_fail(kc, "take: expected an id in [0, %lld), found %d at index %s", (long long)v, id, at);
			return -1;
		}
		memcpy(bits(out) + i * row, bits(tab) + id * row, (size_t)row * 4);
	}
	return 0;
}

void kern_one_hot_rows(const Tensor *ids, int64_t lo, int64_t valid, int64_t depth, Tensor *out)
{
	int64_t n = shape_numel(&ids->shape);
	bool isint = out->dtype == DT_I32;
	memset(out->data, 0, (size_t)shape_numel(&out->shape) * 4);
	for (int64_t i = 0; i < n; i++) {
		int64_t id = (int64_t)tensor_i32(ids)[i] - lo;
		if (id < 0 || id >= valid)
			continue;
		if (isint)
			tensor_i32(out)[i * depth + id] = 1;
		else
			tensor_f32(out)[i * depth + id] = 1.0f;
	}
}

/* ids -> [ids..., depth] with 1 at the id; an id outside [0, depth) gives a
 * row of zeros (as TensorFlow). */
int kern_one_hot(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	kern_one_hot_rows(in[0], 0, op->attr->depth, op->attr->depth, out);
	return 0;
}

int kern_cast(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	int64_t n = shape_numel(&out->shape);
	bool from_int = in[0]->dtype == DT_I32, to_int = out->dtype == DT_I32;
	const float *xf = tensor_f32(in[0]);
	const int32_t *xi = tensor_i32(in[0]);
	if (from_int == to_int)
		memmove(out->data, in[0]->data, (size_t)n * 4);
	else if (to_int)
		for (int64_t i = 0; i < n; i++)
			tensor_i32(out)[i] = float_to_i32(xf[i]);
	else
		for (int64_t i = 0; i < n; i++)
			tensor_f32(out)[i] = (float)xi[i];
	tensor_round(out);
	return 0;
}

/* ---- dispatch ---- */

#define OP(id, nm, lo, hi, fl, at, sh, ke) [OP_##id] = ke,
const KernFn op_kernels[OP_COUNT] = {
#include "../spmd/ops.def"
};
#undef OP

void kern_fail(KernCtx *kc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(kc->err, sizeof kc->err, fmt, ap);
	va_end(ap);
}


/* The op's kernel from the op table, then rounding to bf16/f16 (exec.h). */
int kern_call(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	KernFn k = op_kernels[op->kind];
	if (!k) {
		kern_fail(kc, "expected an op with a kernel, found '%s'", op_table[op->kind].name);
		return -1;
	}
	int rc = k(kc, op, in, out);
	if (rc == 0)
		tensor_round(out);
	return rc;
}
