/* autodiff.c: reverse-mode differentiation — one gradient rule per op kind, written with ops of the op table.
 *
 * The method is the textbook one (Griewank & Walther, "Evaluating
 * Derivatives", ch. 3; as in JAX's transpose rules and TensorFlow's
 * gradient registry):
 *   1. mark the values a gradient must reach: float values that depend on
 *      a param through differentiable edges and that the loss depends on;
 *   2. seed the loss with ones;
 *   3. walk the forward ops backwards; an op whose result has a gradient
 *      adds one term to each marked operand (its vector-Jacobian product,
 *      reduced back to the operand's shape where the op broadcast it);
 *      terms for one value are summed with `add`;
 *   4. name each param's gradient "d%NAME"; a param the loss does not reach
 *      gets a warning and zeros.
 * Every rule emits ordinary ops through ad_emit, which runs the op's shape
 * rule, so a rule that builds a wrong shape is caught as an internal error at
 * the forward op's position.  Forward values read by the rules (an op's
 * result for exp, tanh, softmax, ...) stay alive until the backward op that
 * reads them: the executors free values after their last reader. */
#include "autodiff.h"

#include "../spmd/ops.h"

#include <math.h>
#include <string.h>

typedef struct {
	Graph *g;
	Diag *d;
	int nfwd;      /* values before autodiff: the forward graph */
	int *grad;     /* per forward value: its gradient so far, or -1 */
	bool *need;    /* per forward value: a gradient must reach it */
	Pos pos;       /* position of the forward op being differentiated */
	bool failed;   /* an internal error was reported */
} Ad;

/* ---- emitting ops ---- */

/* A new op of kind k on in[0..nin) with attributes at (NULL: none); its
 * result's shape and dtype come from the op's shape rule.  The result id. */
static int ad_emit(Ad *A, OpKind k, const int *in, int nin, const Attr *at)
{
	Attr attr = {0};
	if (at)
		attr = *at;
	Op tmp = {.kind = k, .nin = nin, .in = (int *)in, .out = -1, .attr = &attr, .pos = A->pos};
	Shape s;
	DType t;
	if (A->failed || op_table[k].shape(A->g, &tmp, &s, &t, A->d) != 0) {
		A->failed = true;
		return in[0];
	}
	char name[32];
	snprintf(name, sizeof name, "%%g%d", A->g->values.n);
	int v = graph_value(A->g, name, t, &s, VK_INTER, A->pos);
	int id = graph_op(A->g, k, in, nin, v, A->pos);
	*A->g->ops.a[id].attr = attr;
	return v;
}

static Shape shape_of(const Ad *A, int v) { return A->g->values.a[v].shape; }
static DType dtype_of(const Ad *A, int v) { return A->g->values.a[v].dtype; }

/* A scalar f32 constant: an operand of binary ops, where it takes the other
 * operand's dtype. */
static int konst(Ad *A, double c)
{
	char name[32];
	snprintf(name, sizeof name, "%%gc%d", A->g->values.n);
	int v = graph_value(A->g, name, DT_F32, &(Shape){0}, VK_CONST, A->pos);
	A->g->values.a[v].cval = c;
	return v;
}

static int un(Ad *A, OpKind k, int x) { return ad_emit(A, k, &x, 1, NULL); }
static int bin(Ad *A, OpKind k, int a, int b) { return ad_emit(A, k, (int[]){a, b}, 2, NULL); }
static int mul(Ad *A, int a, int b) { return bin(A, OP_MUL, a, b); }
static int scale(Ad *A, int x, double c) { return bin(A, OP_MUL, x, konst(A, c)); }

/* A tensor of dtype t and shape s filled with c (broadcast of a constant). */
static int fill(Ad *A, double c, DType t, const Shape *s)
{
	int k = konst(A, c);
	A->g->values.a[k].dtype = t;
	Attr at = {.shape = *s};
	return ad_emit(A, OP_BROADCAST_TO, &k, 1, &at);
}

static int reshape(Ad *A, int x, const Shape *s)
{
	if (shape_eq(&A->g->values.a[x].shape, s))
		return x;
	Attr at = {.shape = *s};
	return ad_emit(A, OP_RESHAPE, &x, 1, &at);
}

static int broadcast(Ad *A, int x, const Shape *s)
{
	if (shape_eq(&A->g->values.a[x].shape, s))
		return x;
	Attr at = {.shape = *s};
	return ad_emit(A, OP_BROADCAST_TO, &x, 1, &at);
}

/* reduce_sum of x over the axes set in mask. */
static int sum_axes(Ad *A, int x, unsigned mask, bool keepdims)
{
	Attr at = {.keepdims = keepdims};
	for (int d = 0; d < MAX_RANK; d++)
		if (mask >> d & 1)
			at.axes[at.naxes++] = d;
	return ad_emit(A, OP_REDUCE_SUM, &x, 1, &at);
}

static int sum_axis(Ad *A, int x, int axis) { return sum_axes(A, x, 1u << axis, true); }

static int slice(Ad *A, int x, const int64_t *start, const int64_t *limit, const int64_t *stride)
{
	Attr at = {0};
	int r = shape_of(A, x).rank;
	memcpy(at.start, start, sizeof(int64_t) * (size_t)r);
	memcpy(at.limit, limit, sizeof(int64_t) * (size_t)r);
	for (int d = 0; d < r; d++)
		at.stride[d] = stride ? stride[d] : 1;
	return ad_emit(A, OP_SLICE, &x, 1, &at);
}

static int pad(Ad *A, int x, const int64_t *low, const int64_t *high)
{
	Attr at = {0};
	int r = shape_of(A, x).rank;
	memcpy(at.start, low, sizeof(int64_t) * (size_t)r);
	memcpy(at.limit, high, sizeof(int64_t) * (size_t)r);
	return ad_emit(A, OP_PAD, &x, 1, &at);
}

/* The gradient c (of the op's result shape) summed down to shape t, the
 * shape of an operand the op broadcast (numpy rules, right-aligned). */
static int unbroadcast(Ad *A, int c, const Shape *t)
{
	Shape o = shape_of(A, c);
	unsigned mask = 0;
	for (int d = 0; d < o.rank; d++) {
		int e = d - (o.rank - t->rank);
		if (e < 0 || (t->dim[e] == 1 && o.dim[d] != 1))
			mask |= 1u << d;
	}
	if (mask)
		c = sum_axes(A, c, mask, false);
	return reshape(A, c, t);
}

/* ---- elementwise ops ---- */

/* gelu'(x) of the tanh form: with u = x², t = tanh(k·x·(1 + a·u)),
 * 0.5·(1 + t) + 0.5·k·x·(1 − t²)·(1 + 3a·u). */
static int gelu_slope(Ad *A, int x)
{
	const double k = 0.7978845608028654, a = 0.044715;
	int u = mul(A, x, x);
	int one = konst(A, 1), ua = scale(A, u, a), inner = bin(A, OP_ADD, ua, one), xk = scale(A, x, k);
	int t = un(A, OP_TANH, mul(A, xk, inner));
	int left = scale(A, bin(A, OP_ADD, t, konst(A, 1)), 0.5);
	int tt = mul(A, t, t), one2 = konst(A, 1), s = bin(A, OP_SUB, one2, tt);
	int one3 = konst(A, 1), u3 = scale(A, u, 3 * a), poly = bin(A, OP_ADD, u3, one3);
	int xs = mul(A, scale(A, x, 0.5 * k), s);
	int right = mul(A, xs, poly);
	return bin(A, OP_ADD, left, right);
}

static int grad_unary(Ad *A, const Op *op, int gy)
{
	int x = op->in[0], y = op->out;
	switch (op->kind) {
	case OP_NEG: return un(A, OP_NEG, gy);
	case OP_ABS: {
		int z = konst(A, 0), below = bin(A, OP_GREATER, z, x), z2 = konst(A, 0), above = bin(A, OP_GREATER, x, z2);
		return mul(A, gy, bin(A, OP_SUB, above, below));
	}
	case OP_EXP: return mul(A, gy, y);
	case OP_LOG: return bin(A, OP_DIV, gy, x);
	case OP_SQRT: return bin(A, OP_DIV, scale(A, gy, 0.5), y);
	case OP_RSQRT: return mul(A, gy, scale(A, bin(A, OP_DIV, y, x), -0.5));
	case OP_TANH: {
		int yy = mul(A, y, y), one = konst(A, 1);
		return mul(A, gy, bin(A, OP_SUB, one, yy));
	}
	case OP_SIGMOID: return mul(A, gy, mul(A, y, bin(A, OP_SUB, konst(A, 1), y)));
	case OP_RELU: return mul(A, gy, bin(A, OP_GREATER, x, konst(A, 0)));
	case OP_GELU: return mul(A, gy, gelu_slope(A, x));
	case OP_SQUARE: return mul(A, gy, scale(A, x, 2));
	case OP_RECIPROCAL: return un(A, OP_NEG, mul(A, gy, mul(A, y, y)));
	default: return gy;
	}
}

/* b - 1, or log(a), folded when the operand is a constant. */
static int minus_one(Ad *A, int b)
{
	const Value *v = &A->g->values.a[b];
	return v->kind == VK_CONST ? konst(A, v->cval - 1) : bin(A, OP_SUB, b, konst(A, 1));
}

static int log_of(Ad *A, int a)
{
	const Value *v = &A->g->values.a[a];
	return v->kind == VK_CONST ? konst(A, log(v->cval)) : un(A, OP_LOG, a);
}

/* Term for operand k of a broadcasting binary op (max and min send the
 * gradient to the first operand on ties). */
static int grad_binary(Ad *A, const Op *op, int k, int gy)
{
	int a = op->in[0], b = op->in[1], y = op->out, c = gy;
	switch (op->kind) {
	case OP_ADD: break;
	case OP_SUB: c = k == 0 ? gy : un(A, OP_NEG, gy); break;
	case OP_MUL: c = mul(A, gy, k == 0 ? b : a); break;
	case OP_DIV: c = k == 0 ? bin(A, OP_DIV, gy, b) : un(A, OP_NEG, bin(A, OP_DIV, mul(A, gy, y), b)); break;
	case OP_MAX:
	case OP_MIN: {
		int other_wins = op->kind == OP_MAX ? bin(A, OP_GREATER, b, a) : bin(A, OP_GREATER, a, b);
		c = mul(A, gy, k == 0 ? bin(A, OP_SUB, konst(A, 1), other_wins) : other_wins);
		break;
	}
	case OP_POW:
		c = k == 0 ? mul(A, gy, mul(A, b, bin(A, OP_POW, a, minus_one(A, b)))) : mul(A, gy, mul(A, y, log_of(A, a)));
		break;
	default: break;
	}
	Shape t = shape_of(A, op->in[k]);
	return unbroadcast(A, c, &t);
}

/* ---- einsum ---- */

typedef struct {
	int n;
	char c[64];
} Letters;

static bool has(const Letters *l, char c) { return memchr(l->c, c, (size_t)l->n) != NULL; }

static void add_letters(Letters *l, const char *c, int n)
{
	for (int i = 0; i < n; i++)
		if (!has(l, c[i]))
			l->c[l->n++] = c[i];
}

/* An einsum of in[0..nin) with letters lets[t] to the letters out. */
static int einsum(Ad *A, const int *in, int nin, const Letters *lets, const Letters *out)
{
	Attr at = {0};
	char eq[64];
	size_t k = 0;
	for (int t = 0; t < nin; t++) {
		at.nlet[t] = lets[t].n;
		memcpy(at.let[t], lets[t].c, (size_t)lets[t].n);
		k += (size_t)snprintf(eq + k, sizeof eq - k, "%s%.*s", t ? "," : "", lets[t].n, lets[t].c);
	}
	at.nlet[2] = out->n;
	memcpy(at.let[2], out->c, (size_t)out->n);
	snprintf(eq + k, sizeof eq - k, "->%.*s", out->n, out->c);
	at.eq = arena_strdup(&A->g->arena, eq);
	return ad_emit(A, OP_EINSUM, in, nin, &at);
}

/* The n x n identity: ones [n, 1] padded to [n, n+1], whose first n*n
 * elements in C order are the identity. */
static int eye(Ad *A, int64_t n, DType t)
{
	Shape col = {2, {n, 1}}, flat = {1, {n * (n + 1)}}, sq = {2, {n, n}};
	int x = fill(A, 1, t, &col);
	if (n == 1)
		return x;
	x = pad(A, x, (int64_t[]){0, 0}, (int64_t[]){0, n});
	x = reshape(A, x, &flat);
	x = slice(A, x, (int64_t[]){0}, (int64_t[]){n * n}, NULL);
	return reshape(A, x, &sq);
}

/* A letter used nowhere in `used`. */
static char fresh_letter(Letters *used)
{
	static const char pool[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
	for (const char *p = pool; *p; p++)
		if (!has(used, *p)) {
			used->c[used->n++] = *p;
			return *p;
		}
	return 0;
}

/* x has the distinct letters of operand `a` in first-occurrence order;
 * give it operand a's layout: repeated letters become diagonals (times an
 * identity), then the dims are put in a's order. */
static int einsum_diagonals(Ad *A, int x, const char *a, int na, Letters cur, Letters *used)
{
	Letters want = {0};
	for (int p = 0; p < na; p++) {
		if (!memchr(a, a[p], (size_t)p)) {
			want.c[want.n++] = a[p];
			continue;
		}
		char f = fresh_letter(used);
		Letters ls[2] = {cur, {2, {a[p], f}}};
		Letters out = cur;
		out.c[out.n++] = f;
		int id = eye(A, shape_of(A, x).dim[(const char *)memchr(cur.c, a[p], (size_t)cur.n) - cur.c],
		             dtype_of(A, x));
		x = einsum(A, (int[]){x, id}, 2, ls, &out);
		cur = out;
		want.c[want.n++] = f;
	}
	if (memcmp(cur.c, want.c, (size_t)want.n) == 0)
		return x;
	return einsum(A, &x, 1, &cur, &want);
}

/* Term for operand k of einsum: the einsum of the result's gradient with the
 * other operand, giving k's distinct letters; letters only k has (summed
 * out) come back by broadcasting, repeated ones as diagonals. */
static int grad_einsum(Ad *A, const Op *op, int k, int gy)
{
	const Attr *at = op->attr;
	Letters lets[2] = {{0}, {0}}, used = {0}, uniq = {0}, kept = {0}, avail = {0};
	add_letters(&used, at->let[2], at->nlet[2]);
	for (int t = 0; t < op->nin; t++)
		add_letters(&used, at->let[t], at->nlet[t]);
	lets[0].n = at->nlet[2], memcpy(lets[0].c, at->let[2], (size_t)at->nlet[2]);
	add_letters(&avail, at->let[2], at->nlet[2]);
	int in[2] = {gy, -1}, nin = 1;
	if (op->nin == 2) {
		int o = 1 - k;
		lets[1].n = at->nlet[o], memcpy(lets[1].c, at->let[o], (size_t)at->nlet[o]);
		add_letters(&avail, at->let[o], at->nlet[o]);
		in[nin++] = op->in[o];
	}
	add_letters(&uniq, at->let[k], at->nlet[k]);
	Shape us = {.rank = uniq.n}, ks = {.rank = uniq.n};
	Shape xs = shape_of(A, op->in[k]);
	for (int i = 0; i < uniq.n; i++) {
		int p = (int)((const char *)memchr(at->let[k], uniq.c[i], (size_t)at->nlet[k]) - at->let[k]);
		us.dim[i] = xs.dim[p];
		ks.dim[i] = has(&avail, uniq.c[i]) ? xs.dim[p] : 1;
		if (has(&avail, uniq.c[i]))
			kept.c[kept.n++] = uniq.c[i];
	}
	int x = einsum(A, in, nin, lets, &kept);
	if (kept.n < uniq.n)
		x = broadcast(A, reshape(A, x, &ks), &us);
	return einsum_diagonals(A, x, at->let[k], at->nlet[k], uniq, &used);
}

/* ---- reductions and normalizations ---- */

/* The operand's shape with the reduced axes kept as 1. */
static Shape keep_shape(const Ad *A, const Op *op)
{
	Shape s = shape_of(A, op->in[0]);
	for (int i = 0; i < op->attr->naxes; i++)
		s.dim[op->attr->axes[i]] = 1;
	return s;
}

static int grad_reduce(Ad *A, const Op *op, int gy)
{
	int x = op->in[0];
	Shape xs = shape_of(A, x), ks = keep_shape(A, op);
	int gk = reshape(A, gy, &ks);
	if (op->kind == OP_REDUCE_SUM)
		return broadcast(A, gk, &xs);
	if (op->kind == OP_REDUCE_MEAN)
		return broadcast(A, scale(A, gk, (double)shape_numel(&ks) / (double)shape_numel(&xs)), &xs);
	/* reduce_max: shared equally among the elements equal to the max */
	int yk = reshape(A, op->out, &ks);
	int gt = bin(A, OP_GREATER, yk, x), one = konst(A, 1), hit = bin(A, OP_SUB, one, gt);
	unsigned mask = 0;
	for (int i = 0; i < op->attr->naxes; i++)
		mask |= 1u << op->attr->axes[i];
	int count = sum_axes(A, hit, mask, true);
	return mul(A, bin(A, OP_DIV, hit, count), gk);
}

/* softmax: y·(g − Σ g·y); log_softmax: g − exp(y)·Σ g;
 * layer_norm: (g − mean g − y·mean(g·y)) / sqrt(var + eps). */
static int grad_norm(Ad *A, const Op *op, int gy)
{
	int x = op->in[0], y = op->out, ax = op->attr->axes[0];
	if (op->kind == OP_SOFTMAX)
		return mul(A, y, bin(A, OP_SUB, gy, sum_axis(A, mul(A, gy, y), ax)));
	if (op->kind == OP_LOG_SOFTMAX) {
		int sg = sum_axis(A, gy, ax), ey = un(A, OP_EXP, y);
		return bin(A, OP_SUB, gy, mul(A, ey, sg));
	}
	double inv_n = 1.0 / (double)shape_of(A, x).dim[ax];
	int xc = bin(A, OP_SUB, x, scale(A, sum_axis(A, x, ax), inv_n));
	int var = scale(A, sum_axis(A, mul(A, xc, xc), ax), inv_n);
	int rstd = un(A, OP_RSQRT, bin(A, OP_ADD, var, konst(A, op->attr->eps)));
	int mg = scale(A, sum_axis(A, gy, ax), inv_n);
	int mgy = scale(A, sum_axis(A, mul(A, gy, y), ax), inv_n);
	int ym = mul(A, y, mgy), gm = bin(A, OP_SUB, gy, mg);
	return mul(A, rstd, bin(A, OP_SUB, gm, ym));
}

/* ---- data movement ---- */

static int grad_transpose(Ad *A, const Op *op, int gy)
{
	Attr at = {.naxes = op->attr->naxes};
	for (int i = 0; i < op->attr->naxes; i++)
		at.axes[op->attr->axes[i]] = i;
	return ad_emit(A, OP_TRANSPOSE, &gy, 1, &at);
}

/* Spread g along dim d with stride s: element i goes to i·s, zeros between
 * (pad of a [.., m, 1, ..] view to [.., m, s, ..], then the first (m-1)·s+1). */
static int dilate(Ad *A, int g, int d, int64_t s)
{
	Shape gs = shape_of(A, g);
	int64_t outer = 1, inner = 1, m = gs.dim[d];
	for (int i = 0; i < gs.rank; i++)
		outer *= i < d ? gs.dim[i] : 1, inner *= i > d ? gs.dim[i] : 1;
	Shape v4 = {4, {outer, m, 1, inner}}, v3 = {3, {outer, m * s, inner}}, back = gs;
	int x = pad(A, reshape(A, g, &v4), (int64_t[]){0, 0, 0, 0}, (int64_t[]){0, 0, s - 1, 0});
	x = reshape(A, x, &v3);
	x = slice(A, x, (int64_t[]){0, 0, 0}, (int64_t[]){outer, (m - 1) * s + 1, inner}, NULL);
	back.dim[d] = (m - 1) * s + 1;
	return reshape(A, x, &back);
}

/* slice: the gradient put back in place, zeros elsewhere. */
static int grad_slice(Ad *A, const Op *op, int gy)
{
	const Attr *at = op->attr;
	Shape xs = shape_of(A, op->in[0]);
	int x = gy;
	for (int d = 0; d < xs.rank; d++)
		if (at->stride[d] > 1 && shape_of(A, x).dim[d] > 1)
			x = dilate(A, x, d, at->stride[d]);
	int64_t low[MAX_RANK], high[MAX_RANK];
	Shape s = shape_of(A, x);
	for (int d = 0; d < xs.rank; d++)
		low[d] = at->start[d], high[d] = xs.dim[d] - at->start[d] - s.dim[d];
	return pad(A, x, low, high);
}

static int grad_concat(Ad *A, const Op *op, int k, int gy)
{
	Shape os = shape_of(A, op->out);
	int64_t start[MAX_RANK] = {0}, limit[MAX_RANK];
	memcpy(limit, os.dim, sizeof limit);
	int ax = op->attr->axis;
	for (int i = 0; i < k; i++)
		start[ax] += shape_of(A, op->in[i]).dim[ax];
	limit[ax] = start[ax] + shape_of(A, op->in[k]).dim[ax];
	return slice(A, gy, start, limit, NULL);
}

static int grad_pad(Ad *A, const Op *op, int gy)
{
	Shape xs = shape_of(A, op->in[0]);
	int64_t limit[MAX_RANK];
	for (int d = 0; d < xs.rank; d++)
		limit[d] = op->attr->start[d] + xs.dim[d];
	return slice(A, gy, op->attr->start, limit, NULL);
}

/* ---- convolution, lookups, casts, losses ---- */

static int grad_conv2d(Ad *A, const Op *op, int k, int gy)
{
	Attr at = *op->attr;
	Shape xs = shape_of(A, op->in[0]), ws = shape_of(A, op->in[1]);
	if (at.pad_mode == CONV_PAD_VALID)
		memset(at.padding, 0, sizeof at.padding);
	at.pad_mode = CONV_PAD_EXPLICIT;
	at.shape = k == 0 ? (Shape){2, {xs.dim[1], xs.dim[2]}} : (Shape){2, {ws.dim[0], ws.dim[1]}};
	if (k == 0)
		return ad_emit(A, OP_CONV2D_GRAD_INPUT, (int[]){gy, op->in[1]}, 2, &at);
	return ad_emit(A, OP_CONV2D_GRAD_FILTER, (int[]){op->in[0], gy}, 2, &at);
}

static int grad_take(Ad *A, const Op *op, int gy)
{
	Attr at = {.depth = shape_of(A, op->in[0]).dim[0]};
	return ad_emit(A, OP_TAKE_GRAD, (int[]){gy, op->in[1]}, 2, &at);
}

/* (softmax(logits) − one_hot(labels)) · g / positions: one op, whose
 * classes split as the loss's (the labels have none to disagree on). */
static int grad_xent(Ad *A, const Op *op, int gy)
{
	int in[3] = {op->in[0], op->in[1], gy};
	Attr at = {.value = op->attr->value};
	return ad_emit(A, OP_SOFTMAX_CROSS_ENTROPY_GRAD, in, 3, &at);
}

/* ±2·(p − t)·g / elements. */
static int grad_mse(Ad *A, const Op *op, int k, int gy)
{
	double n = (double)shape_numel(&A->g->values.a[op->in[0]].shape);
	int diff = k == 0 ? bin(A, OP_SUB, op->in[0], op->in[1]) : bin(A, OP_SUB, op->in[1], op->in[0]);
	return mul(A, diff, scale(A, gy, 2.0 / n));
}

bool autodiff_has_rule(OpKind k)
{
	unsigned fl = op_table[k].flags;
	if (k == OP_GREATER || (fl & (OPF_COLLECTIVE | OPF_DEVICE)))
		return false;
	if (fl & (OPF_UNARY | OPF_BINARY))
		return true;
	switch (k) {
	case OP_EINSUM: case OP_REDUCE_SUM: case OP_REDUCE_MAX: case OP_REDUCE_MEAN: case OP_SOFTMAX:
	case OP_LOG_SOFTMAX: case OP_LAYER_NORM: case OP_TRANSPOSE: case OP_RESHAPE: case OP_BROADCAST_TO:
	case OP_SLICE: case OP_CONCAT: case OP_PAD: case OP_CONV2D: case OP_TAKE: case OP_CAST: case OP_COPY:
	case OP_SOFTMAX_CROSS_ENTROPY: case OP_MSE:
		return true;
	default:
		return false;
	}
}

/* The term op adds to the gradient of its operand k, given gy for its result. */
static int grad_term(Ad *A, const Op *op, int k, int gy)
{
	unsigned fl = op_table[op->kind].flags;
	if (fl & OPF_UNARY)
		return grad_unary(A, op, gy);
	if (fl & OPF_BINARY)
		return grad_binary(A, op, k, gy);
	Shape xs = shape_of(A, op->in[k]);
	switch (op->kind) {
	case OP_EINSUM: return grad_einsum(A, op, k, gy);
	case OP_REDUCE_SUM: case OP_REDUCE_MAX: case OP_REDUCE_MEAN: return grad_reduce(A, op, gy);
	case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM: return grad_norm(A, op, gy);
	case OP_TRANSPOSE: return grad_transpose(A, op, gy);
	case OP_RESHAPE: return reshape(A, gy, &xs);
	case OP_BROADCAST_TO: return unbroadcast(A, gy, &xs);
	case OP_SLICE: return grad_slice(A, op, gy);
	case OP_CONCAT: return grad_concat(A, op, k, gy);
	case OP_PAD: return grad_pad(A, op, gy);
	case OP_CONV2D: return grad_conv2d(A, op, k, gy);
	case OP_TAKE: return grad_take(A, op, gy);
	case OP_CAST: {
		Attr at = {.dtype = dtype_of(A, op->in[0])};
		return at.dtype == dtype_of(A, gy) ? gy : ad_emit(A, OP_CAST, &gy, 1, &at);
	}
	case OP_SOFTMAX_CROSS_ENTROPY: return grad_xent(A, op, gy);
	case OP_MSE: return grad_mse(A, op, k, gy);
	default: return gy; /* copy */
	}
}

/* ---- the pass ---- */

/* Does a gradient flow from op's result to its operand k? */
static bool edge(const Graph *g, const Op *op, int k)
{
	return op->kind != OP_GREATER && dtype_is_float(g->values.a[op->in[k]].dtype) &&
	       dtype_is_float(g->values.a[op->out].dtype);
}

/* need[v]: v depends on a param and the loss depends on v, both through
 * edges gradients flow along.  Reports ops on such a path without a rule. */
static int mark(Ad *A, int loss)
{
	const Graph *g = A->g;
	bool *dep = xcalloc((size_t)A->nfwd + 1, 1), *reach = xcalloc((size_t)A->nfwd + 1, 1);
	for (int v = 0; v < A->nfwd; v++)
		dep[v] = g->values.a[v].kind == VK_PARAM;
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++)
			dep[g->ops.a[i].out] |= dep[g->ops.a[i].in[k]] && edge(g, &g->ops.a[i], k);
	reach[loss] = true;
	int rc = 0;
	for (int i = g->ops.n - 1; i >= 0; i--) {
		const Op *op = &g->ops.a[i];
		if (!reach[op->out] || !dep[op->out])
			continue;
		if (!autodiff_has_rule(op->kind)) {
			diag_error(A->d, op->pos, "expected an op with a gradient rule on the path to the loss, found '%s'",
			           op_table[op->kind].name);
			rc = -1;
		}
		for (int k = 0; k < op->nin; k++)
			reach[op->in[k]] |= edge(g, op, k);
	}
	for (int v = 0; v < A->nfwd; v++)
		A->need[v] = dep[v] && reach[v];
	free(dep), free(reach);
	return rc;
}

static void accumulate(Ad *A, int v, int term)
{
	A->grad[v] = A->grad[v] < 0 ? term : bin(A, OP_ADD, A->grad[v], term);
}

/* The backward ops of forward op i. */
static void backward_op(Ad *A, int i)
{
	Op op = A->g->ops.a[i]; /* a copy: emitting ops may move the array */
	int gy = A->grad[op.out];
	if (!A->need[op.out] || gy < 0)
		return;
	A->pos = op.pos;
	for (int k = 0; k < op.nin && !A->failed; k++)
		if (A->need[op.in[k]] && edge(A->g, &op, k))
			accumulate(A, op.in[k], grad_term(A, &op, k, gy));
}

/* Give param p its gradient value, named d%NAME: the value itself when it
 * is a fresh op result no other param has claimed, else a copy. */
static void name_grad(Ad *A, int p)
{
	Graph *g = A->g;
	char name[512];
	snprintf(name, sizeof name, "d%%%s", g->values.a[p].name);
	A->pos = g->values.a[p].pos;
	if (A->grad[p] < 0) {
		diag_warn(A->d, g->values.a[p].pos, "param '%s' does not reach the loss: its gradient is zero",
		          g->values.a[p].name);
		Shape s = g->values.a[p].shape;
		A->grad[p] = fill(A, 0, g->values.a[p].dtype, &s);
	} else {
		const Value *v = &g->values.a[A->grad[p]];
		if (A->grad[p] < A->nfwd || v->producer < 0 || strncmp(v->name, "d%", 2) == 0)
			A->grad[p] = un(A, OP_COPY, A->grad[p]);
	}
	if (!A->failed)
		g->values.a[A->grad[p]].name = arena_strdup(&g->arena, name);
}

int autodiff(Graph *g, int loss, int *grad, Diag *d)
{
	Ad A = {.g = g, .d = d, .nfwd = g->values.n, .grad = grad, .pos = g->values.a[loss].pos};
	A.need = xcalloc((size_t)A.nfwd + 1, 1);
	for (int v = 0; v < A.nfwd; v++)
		grad[v] = -1;
	int nops = g->ops.n, rc = mark(&A, loss);
	if (rc == 0 && A.need[loss]) {
		Shape s = g->values.a[loss].shape;
		grad[loss] = fill(&A, 1, g->values.a[loss].dtype, &s);
	}
	for (int i = nops - 1; i >= 0 && rc == 0 && !A.failed; i--)
		backward_op(&A, i);
	for (int v = 0; v < A.nfwd && rc == 0; v++)
		if (g->values.a[v].kind == VK_PARAM)
			name_grad(&A, v);
	free(A.need);
	return rc == 0 && !A.failed ? 0 : -1;
}
