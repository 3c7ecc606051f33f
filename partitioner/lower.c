/* lower.c: ops whose split needs more than their local op.
 *
 * - softmax, log_softmax and layer_norm along a split axis are computed from
 *   all_reduces of local statistics (max, then sum of exponentials; sum, then
 *   sum of squared deviations), never by gathering the axis.  Padding of an
 *   unevenly split axis is masked with the statistic's identity first.
 * - softmax_cross_entropy and softmax_cross_entropy_grad with their classes
 *   split do the same with ops of their own on each device's block of
 *   classes (softmax_cross_entropy_stats_shard: the sum of exponentials
 *   and the label's logit, from the device holding it;
 *   softmax_cross_entropy_grad_shard), the gradient reading the loss's
 *   statistics; one_hot with its classes split writes each device's block
 *   (one_hot_shard).
 * - conv2d with a split spatial dim exchanges halos with its neighbours by
 *   collective_permute and convolves the extended block without padding on
 *   that dim (GSPMD's windowed-op partitioning, docs/algorithms.md §3).
 *   The halo sizes must be the same on every device, which holds when the
 *   input block is stride times the output block (stride 1 with `same`
 *   padding, or a split that divides); choose_factors keeps such dims whole
 *   otherwise. */
#include <math.h>
#include <string.h>

#include "../spmd/ops.h"
#include "part.h"

/* ---- normalisations along a split axis ---- */

typedef struct {
	Part *P;
	const Op *op;
	Spec s;        /* the sharding of x and of every full-size temporary */
	int axis;
	unsigned axes; /* the mesh axes that split the axis */
	int64_t count; /* the axis's global size */
	bool uneven;
	const char *why;
} Norm;

static int norm_mask(Norm *n, int v, double fill)
{
	Attr at = {0};
	at.spec = n->s;
	at.global = n->P->dst->values.a[v].global;
	at.value = fill;
	return emit(n->P, OP_MASK, &v, 1, &at, &n->s, n->op->pos, n->why);
}

/* The sharding of an op whose first operand is v: x's, or for a statistic
 * (size 1 along the axis, all_reduced) x's with the axis whole. */
static const Spec *norm_spec(Norm *n, int v, Spec *buf)
{
	if (n->count == 1 || n->P->dst->values.a[v].global.dim[n->axis] != 1)
		return &n->s;
	*buf = n->s;
	buf->nax[n->axis] = 0;
	return buf;
}

static int norm_unary(Norm *n, OpKind k, int v)
{
	Spec buf;
	return emit(n->P, k, &v, 1, NULL, norm_spec(n, v, &buf), n->op->pos, NULL);
}

static int norm_binary(Norm *n, OpKind k, int a, int b)
{
	int ins[2] = {a, b};
	Spec buf;
	return emit(n->P, k, ins, 2, NULL, norm_spec(n, a, &buf), n->op->pos, NULL);
}

static int norm_const(Norm *n, int like, double x)
{
	Part *P = n->P;
	Shape scalar = {0};
	int c = graph_value(P->dst, fmt(P, "%%const%d", P->dst->values.n), P->dst->values.a[like].dtype, &scalar,
	                    VK_CONST, n->op->pos);
	P->dst->values.a[c].cval = x;
	P->dst->values.a[c].spec.rank = 0;
	return c;
}

/* The statistic of v along the axis, all_reduced: keepdims, replicated on the axis. */
static int norm_stat(Norm *n, OpKind k, int v)
{
	Part *P = n->P;
	Spec part = n->s;
	part.nax[n->axis] = 0;
	part.partial = (uint8_t)n->axes;
	part.reduce = k == OP_REDUCE_MAX ? REDUCE_MAX : REDUCE_SUM;
	Shape global = P->dst->values.a[v].global;
	global.dim[n->axis] = 1;
	const char *base = P->dst->values.a[v].name;
	int r = new_value(P, fmt(P, "%.*s%%stat%d", root_len(base), base, P->dst->values.n), P->dst->values.a[v].dtype,
	                  &global, &part, VK_INTER, n->op->pos);
	int id = graph_op(P->dst, k, &v, 1, r, n->op->pos);
	Attr *at = P->dst->ops.a[id].attr;
	at->naxes = 1, at->axes[0] = n->axis, at->keepdims = true;
	Spec whole = part;
	whole.partial = 0;
	return reshard(P, r, &whole, n->op->pos, n->why);
}

/* softmax(x) = e / sum(e), e = exp(x - max(x)); log_softmax = (x - max) - log(sum(e)). */
static int lower_softmax(Norm *n, int x)
{
	int xm = n->uneven ? norm_mask(n, x, -INFINITY) : x;
	int m = norm_stat(n, OP_REDUCE_MAX, xm);
	if (m < 0)
		return -1;
	int sh = norm_binary(n, OP_SUB, x, m);
	int e = norm_unary(n, OP_EXP, sh);
	int em = n->uneven ? norm_mask(n, e, 0) : e;
	int s = norm_stat(n, OP_REDUCE_SUM, em);
	if (s < 0)
		return -1;
	if (n->op->kind == OP_SOFTMAX)
		return norm_binary(n, OP_DIV, e, s);
	return norm_binary(n, OP_SUB, sh, norm_unary(n, OP_LOG, s));
}

/* layer_norm(x) = d * rsqrt(mean(d^2) + eps), d = x - mean(x), means over the global axis. */
static int lower_layer_norm(Norm *n, int x, int64_t count)
{
	int xm = n->uneven ? norm_mask(n, x, 0) : x;
	int s1 = norm_stat(n, OP_REDUCE_SUM, xm);
	if (s1 < 0)
		return -1;
	int inv = norm_const(n, x, 1.0 / (double)count);
	int d = norm_binary(n, OP_SUB, x, norm_binary(n, OP_MUL, s1, inv));
	int dm = n->uneven ? norm_mask(n, d, 0) : d;
	int s2 = norm_stat(n, OP_REDUCE_SUM, norm_unary(n, OP_SQUARE, dm));
	if (s2 < 0)
		return -1;
	int eps = norm_const(n, x, n->op->attr->eps), ms = norm_binary(n, OP_MUL, s2, inv); /* in turn: the values' numbering */
	int var = norm_binary(n, OP_ADD, ms, eps);
	return norm_binary(n, OP_MUL, d, norm_unary(n, OP_RSQRT, var));
}

static int lower_normalize(Part *P, const Op *op, const Axes *a, int x, const Spec *res)
{
	const Value *sv = &P->src->values.a[op->in[0]];
	Norm n = {P, op, *res, op->attr->axes[0], 0, sv->shape.dim[op->attr->axes[0]], false, NULL};
	for (int k = 0; k < a->n; k++)
		n.axes |= 1u << a->ax[k];
	int64_t count = n.count;
	n.uneven = count % axes_prod(&P->src->mesh, a) != 0;
	n.why = WHY(P, "%s at %s along dim %d, split on %s: statistics all_reduced, the axis is never gathered",
	            op_table[op->kind].name, pos_str(P, op->pos), n.axis, spec_str(P, res));
	int v = op->kind == OP_LAYER_NORM ? lower_layer_norm(&n, x, count) : lower_softmax(&n, x);
	if (v >= 0)
		P->dst->values.a[v].name = fmt(P, "%s%%local", P->src->values.a[op->out].name);
	return v;
}

/* ---- one_hot and softmax_cross_entropy with their classes split ---- */

/* A value of dtype t, global shape `global`, sharded s, made by op kind k
 * on ins. */
static int emit_as(Part *P, OpKind k, const int *ins, int nin, const Attr *at, DType t, const Shape *global,
                   const Spec *s, Pos p, const char *why)
{
	const char *base = P->dst->values.a[ins[0]].name;
	int v = new_value(P, fmt(P, "%.*s%%%d", root_len(base), base, P->dst->values.n), t, global,
	                  s, VK_INTER, p);
	int id = graph_op(P->dst, k, ins, nin, v, p);
	if (at)
		*P->dst->ops.a[id].attr = *at;
	P->dst->ops.a[id].why = why;
	return v;
}

/* one_hot with its classes (the last dim) split by res: each device
 * writes the block it holds (one_hot_shard). */
static int lower_one_hot(Part *P, const Op *op, const int *in, const Spec *res)
{
	const Value *out = &P->src->values.a[op->out];
	Shape local;
	spec_local_shape(res, &P->dst->mesh, &out->shape, &local);
	Attr at = {0};
	at.depth = local.dim[local.rank - 1];
	at.spec = *res;
	at.spec.partial = 0;
	at.global = out->shape;
	int v = emit_as(P, OP_ONE_HOT_SHARD, in, 1, &at, DT_F32, &out->shape, &at.spec, op->pos,
	                WHY(P, "one_hot at %s, classes split on %s: each device writes its block of classes",
	                    pos_str(P, op->pos), spec_str(P, res)));
	P->dst->values.a[v].name = fmt(P, "%s%%local", P->src->values.a[op->out].name);
	return v;
}

/* The split loss's Norm on logits x (classes last, split over a). */
static void xent_norm(Norm *n, Part *P, const Op *op, const Axes *a, int x, const char *what)
{
	const Value *xv = &P->dst->values.a[x];
	int rank = xv->global.rank;
	*n = (Norm){P, op, xv->spec, rank - 1, 0, xv->global.dim[rank - 1], false, NULL};
	for (int k = 0; k < a->n; k++)
		n->axes |= 1u << a->ax[k];
	n->uneven = n->count % axes_prod(&P->src->mesh, a) != 0;
	n->why = WHY(P, "%s at %s, classes split on %s: %s, the classes never gathered", op_table[op->kind].name,
	             pos_str(P, op->pos), spec_str(P, &n->s), what);
}

/* The split loss's statistics on logits in[0] and labels in[1] (n set up
 * for them): into *mx the all_reduced max, into *s the all_reduced sum of
 * exp(logits - max), and into *t (when not NULL) the label's logit, from
 * one softmax_cross_entropy_stats_shard per device (no block of classes
 * made: each device sums its block and picks the label's logit if it
 * holds it) and one all_reduce of the two.  -1 on failure. */
static int xent_stats(Norm *n, const int *in, int *mx, int *s, int *t)
{
	Part *P = n->P;
	const Value xv = P->dst->values.a[in[0]]; /* a copy: the values move as they grow */
	int x = in[0], rank = xv.global.rank;
	*mx = norm_stat(n, OP_REDUCE_MAX, n->uneven ? norm_mask(n, x, -INFINITY) : x);
	if (*mx < 0)
		return -1;
	Spec part = n->s; /* per position, pending sums over the class axes */
	part.nax[rank - 1] = 0;
	part.partial = (uint8_t)n->axes;
	part.reduce = REDUCE_SUM;
	Shape global = xv.global;
	global.dim[rank - 1] = 2;
	Attr at = {0};
	at.spec = xv.spec, at.global = xv.global;
	int ins[3] = {x, *mx, in[1]};
	int st = new_value(P, fmt(P, "%.*s%%stat%d", root_len(xv.name), xv.name, P->dst->values.n), xv.dtype, &global,
	                   &part, VK_INTER, n->op->pos);
	int id = graph_op(P->dst, OP_XENT_STATS_SHARD, ins, 3, st, n->op->pos);
	*P->dst->ops.a[id].attr = at;
	P->dst->ops.a[id].why = n->why;
	Spec whole = part;
	whole.partial = 0;
	if ((st = reshard(P, st, &whole, n->op->pos, n->why)) < 0)
		return -1;
	Shape one = global;
	one.dim[rank - 1] = 1;
	for (int k = 0; k < (t ? 2 : 1); k++) { /* [..., k:k+1] of the local statistics */
		Attr sl = {0};
		for (int d = 0; d < rank; d++)
			sl.start[d] = 0, sl.limit[d] = P->dst->values.a[st].shape.dim[d], sl.stride[d] = 1;
		sl.start[rank - 1] = k, sl.limit[rank - 1] = k + 1;
		int v = emit_as(P, OP_SLICE, &st, 1, &sl, xv.dtype, &one, &whole, n->op->pos, n->why);
		if (k == 0)
			*s = v;
		else
			*t = v;
	}
	return 0;
}

/* softmax_cross_entropy with its classes split: per position logsumexp
 * (max + log of the sum of exponentials) less the label's logit, from
 * all_reduced statistics (xent_stats: the max, then the sum and the
 * label's logit in one all_reduce); the sum over the positions this
 * device holds, divided by the global count, is the whole op's local
 * result (a pending sum over the axes splitting the positions).  Padded
 * classes are skipped and padded positions masked.  Its statistics are
 * kept for the gradient. */
static int lower_xent(Part *P, const Op *op, const Axes *a, const int *in, const Spec *res)
{
	Norm n;
	xent_norm(&n, P, op, a, in[0], "statistics and the labels' logits all_reduced");
	int m, s, t;
	if (xent_stats(&n, in, &m, &s, &t) != 0)
		return -1;
	P->xent_have = true, P->xent_x = in[0], P->xent_labels = in[1], P->xent_max = m, P->xent_sum = s;
	DType dt = P->dst->values.a[in[0]].dtype;
	int rank = P->dst->values.a[in[0]].global.rank;
	int lse = norm_binary(&n, OP_ADD, norm_unary(&n, OP_LOG, s), m);
	int lp = norm_binary(&n, OP_SUB, lse, t); /* [positions..., 1] */
	const Value *lv = &P->dst->values.a[lp];
	Spec ls = lv->spec;
	bool padded = false;
	for (int d = 0; d < rank - 1; d++)
		padded |= lv->global.dim[d] % spec_dim_shards(&ls, &P->dst->mesh, d) != 0;
	if (padded) {
		Attr mk = {0};
		mk.spec = ls, mk.global = lv->global, mk.value = 0;
		lp = emit(P, OP_MASK, &lp, 1, &mk, &ls, op->pos, n.why);
	}
	Attr sum = {0};
	sum.naxes = rank;
	for (int d = 0; d < rank; d++)
		sum.axes[d] = d;
	Shape scalar = {0};
	int tot = emit_as(P, OP_REDUCE_SUM, &lp, 1, &sum, dt, &scalar, res, op->pos, n.why);
	int ins[2] = {tot, norm_const(&n, tot, 1.0 / op->attr->value)};
	int v = emit(P, OP_MUL, ins, 2, NULL, res, op->pos, n.why);
	P->dst->values.a[v].name = fmt(P, "%s%%local", P->src->values.a[op->out].name);
	return v;
}

/* softmax_cross_entropy_grad with its classes split: one
 * softmax_cross_entropy_grad_shard per device, (exp(logits - max) / sum -
 * one_hot(labels)) * g / count on its block of classes, as split as the
 * logits; the statistics the loss on the same logits and labels
 * all_reduced (the forward's, kept: two values per position), else made
 * again.  No block of classes beside the logits and the result. */
static int lower_xent_grad(Part *P, const Op *op, const Axes *a, const int *in, const Spec *res)
{
	Norm n;
	xent_norm(&n, P, op, a, in[0], "the loss's all_reduced softmax statistics");
	int m, s;
	if (P->xent_have && P->xent_x == in[0] && P->xent_labels == in[1])
		m = P->xent_max, s = P->xent_sum;
	else if (xent_stats(&n, in, &m, &s, NULL) != 0)
		return -1;
	Attr at = {0};
	at.spec = P->dst->values.a[in[0]].spec, at.global = P->dst->values.a[in[0]].global, at.value = op->attr->value;
	int ins[5] = {in[0], m, s, in[1], in[2]};
	int v = emit(P, OP_XENT_GRAD_SHARD, ins, 5, &at, res, op->pos, n.why);
	P->dst->values.a[v].name = fmt(P, "%s%%local", P->src->values.a[op->out].name);
	return v;
}

/* ---- conv2d halos ---- */

/* Device d's neighbour `step` blocks along the axes of one dim, or -1. */
static int neighbour(const Mesh *m, const Axes *a, int device, int step)
{
	int coord[MESH_MAX_AXES];
	mesh_device_coords(m, device, coord);
	int64_t idx = 0, n = axes_prod(m, a);
	for (int k = 0; k < a->n; k++)
		idx = idx * m->size[a->ax[k]] + coord[a->ax[k]];
	idx += step;
	if (idx < 0 || idx >= n)
		return -1;
	for (int k = a->n - 1; k >= 0; k--) {
		coord[a->ax[k]] = (int)(idx % m->size[a->ax[k]]);
		idx /= m->size[a->ax[k]];
	}
	return mesh_coords_device(m, coord);
}

/* Rows [lo, lo + len) of dim d of v (static slice). */
static int slice_dim(Part *P, int v, int d, int64_t lo, int64_t len, const Spec *s, Pos p, const char *why)
{
	const Value *val = &P->dst->values.a[v];
	Attr at = {0};
	for (int k = 0; k < val->shape.rank; k++)
		at.start[k] = 0, at.limit[k] = val->shape.dim[k], at.stride[k] = 1;
	at.start[d] = lo, at.limit[d] = lo + len;
	Shape local = val->shape;
	local.dim[d] = len;
	return emit_local(P, OP_SLICE, &v, 1, &at, s, &local, p, why);
}

/* One halo: `len` rows of every device's block sent `step` blocks away. */
static int halo(Part *P, int v, int d, const Axes *a, int64_t lo, int64_t len, int step, const Spec *s, Pos p,
                const char *why)
{
	const Mesh *m = &P->dst->mesh;
	int piece = slice_dim(P, v, d, lo, len, s, p, why);
	int *target = arena_alloc(&P->dst->arena, sizeof(int) * (size_t)m->ndev);
	for (int dev = 0; dev < m->ndev; dev++)
		target[dev] = neighbour(m, a, dev, step);
	Attr at = {0};
	at.ncax = a->n;
	for (int k = 0; k < a->n; k++)
		at.cax[k] = a->ax[k];
	at.target = target;
	return emit_local(P, OP_COLLECTIVE_PERMUTE, &piece, 1, &at, s, &P->dst->values.a[piece].shape, p, why);
}

/* Extend dim d (1: H, 2: W) of conv input x with its halos; at's padding on d becomes 0. */
static int conv_halo_dim(Part *P, const Op *op, int x, int d, const Axes *a, Attr *at)
{
	const Value *xv = &P->dst->values.a[x];
	const Shape *k = &P->src->values.a[op->in[1]].shape;
	int64_t c = xv->shape.dim[d], s = at->strides[d - 1], kh = k->dim[d - 1];
	int64_t lo = at->padding[d - 1][0], hi = kh - s - lo;
	Spec sp = xv->spec;
	Shape local = xv->shape; /* xv moves when values are added */
	const char *why = WHY(P, "conv2d at %s: dim %d split on %s, halos of %lld and %lld rows from the neighbours",
	                      pos_str(P, op->pos), d, spec_str(P, &sp), (long long)lo, (long long)(hi > 0 ? hi : 0));
	int parts[3], np = 0;
	if (lo > 0)
		parts[np++] = halo(P, x, d, a, c - lo, lo, +1, &sp, op->pos, why);
	if (hi >= 0)
		parts[np++] = x;
	else if (c + hi > 0)
		parts[np++] = slice_dim(P, x, d, 0, c + hi, &sp, op->pos, why);
	if (hi > 0)
		parts[np++] = halo(P, x, d, a, 0, hi, -1, &sp, op->pos, why);
	at->padding[d - 1][0] = at->padding[d - 1][1] = 0;
	at->pad_mode = CONV_PAD_EXPLICIT;
	if (np == 1)
		return parts[0];
	Attr cat = {0};
	cat.axis = d;
	local.dim[d] = c + lo + hi;
	return emit_local(P, OP_CONCAT, parts, np, &cat, &sp, &local, op->pos, why);
}

static int lower_conv(Part *P, const Op *op, const FactorRule *r, const Axes *fa, const int *in, const Spec *res)
{
	int x = in[0];
	const Value *xv = &P->dst->values.a[x];
	Attr at = *op->attr;
	bool uneven = false;
	for (int d = 1; d <= 2; d++) {
		const Axes *a = &fa[r->fd[0][d][0]];
		uneven |= a->n && P->src->values.a[op->in[0]].shape.dim[d] != xv->shape.dim[d] * axes_prod(&P->src->mesh, a);
	}
	if (uneven) { /* rows past the global edge must read as zero padding */
		Attr m = {0};
		m.spec = xv->spec, m.global = xv->global;
		x = emit(P, OP_MASK, &x, 1, &m, &xv->spec, op->pos,
		         WHY(P, "conv2d at %s: padding of an uneven spatial split is zero", pos_str(P, op->pos)));
	}
	for (int d = 1; d <= 2; d++)
		if (fa[r->fd[0][d][0]].n)
			x = conv_halo_dim(P, op, x, d, &fa[r->fd[0][d][0]], &at);
	int ins[2] = {x, in[1]};
	return emit_local_op(P, op, ins, res, false, &at);
}

/* Can conv2d dim d (1: H, 2: W) be split with halos on axes a?  The halo
 * sizes must not depend on the device, and each fits in one neighbour. */
bool conv_halo_ok(const Graph *g, const Op *op, int d, const Axes *a)
{
	const Shape *x = &g->values.a[op->in[0]].shape, *o = &g->values.a[op->out].shape;
	const Shape *k = &g->values.a[op->in[1]].shape;
	int64_t n = axes_prod(&g->mesh, a), s = op->attr->strides[d - 1];
	int64_t c = (x->dim[d] + n - 1) / n, co = (o->dim[d] + n - 1) / n;
	int64_t lo = op->attr->padding[d - 1][0], hi = k->dim[d - 1] - s - lo;
	return c == co * s && lo <= c && hi <= c && c + hi >= 0 && lo + c + hi > 0;
}

/* take from a table split on rows: each device looks up the ids in its rows,
 * zeros elsewhere; the result is partial over the row axes. */
static int lower_take(Part *P, const Op *op, const int *in, const Spec *res)
{
	const Value *tab = &P->dst->values.a[in[0]];
	Attr at = {0};
	at.spec = tab->spec;
	at.global = tab->global;
	Op local = *op;
	local.kind = OP_TAKE_SHARD;
	return emit_local_op(P, &local, in, res, false, &at);
}

/* take_grad into rows split: each device sums the gradients of the ids in
 * its rows (take_grad_shard, num_rows its local rows). */
static int lower_take_grad(Part *P, const Op *op, const int *in, const Spec *res)
{
	Attr at = *op->attr;
	at.spec = *res; /* its rows' blocks: dim 0's axes */
	at.global = P->src->values.a[op->out].shape;
	Shape local;
	spec_local_shape(&at.spec, &P->dst->mesh, &at.global, &local);
	at.depth = local.dim[0];
	Op o = *op;
	o.kind = OP_TAKE_GRAD_SHARD;
	return emit_local_op(P, &o, in, res, false, &at);
}

int lower_op(Part *P, const Op *op, const FactorRule *r, const Axes *fa, const int *in, const Spec *res,
             bool mean_split)
{
	if (op->kind == OP_SOFTMAX || op->kind == OP_LOG_SOFTMAX || op->kind == OP_LAYER_NORM) {
		int f = r->nfd[0][op->attr->axes[0]] ? r->fd[0][op->attr->axes[0]][0] : -1;
		if (f >= 0 && fa[f].n)
			return lower_normalize(P, op, &fa[f], in[0], res);
	}
	if (op->kind == OP_SOFTMAX_CROSS_ENTROPY || op->kind == OP_SOFTMAX_CROSS_ENTROPY_GRAD) {
		int last = P->src->values.a[op->in[0]].shape.rank - 1, f = last >= 0 && r->nfd[0][last] ? r->fd[0][last][0] : -1;
		if (f >= 0 && fa[f].n)
			return op->kind == OP_SOFTMAX_CROSS_ENTROPY ? lower_xent(P, op, &fa[f], in, res)
			                                            : lower_xent_grad(P, op, &fa[f], in, res);
	}
	if (op->kind == OP_ONE_HOT) {
		int last = P->src->values.a[op->out].shape.rank - 1, f = r->nfd[r->res][last] ? r->fd[r->res][last][0] : -1;
		if (f >= 0 && fa[f].n)
			return lower_one_hot(P, op, in, res);
	}
	if (op->kind == OP_CONV2D && (fa[r->fd[0][1][0]].n || fa[r->fd[0][2][0]].n))
		return lower_conv(P, op, r, fa, in, res);
	if (op->kind == OP_TAKE && fa[r->fd[0][0][0]].n)
		return lower_take(P, op, in, res);
	if (op->kind == OP_TAKE_GRAD && fa[r->fd[r->res][0][0]].n)
		return lower_take_grad(P, op, in, res);
	return emit_local_op(P, op, in, res, mean_split, NULL);
}
