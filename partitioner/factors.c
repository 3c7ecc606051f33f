/* factors.c: the factor rule of every op kind (see factors.h). */
#include "factors.h"

#include <assert.h>
#include <string.h>

#include "../spmd/ops.h"

static int add_factor(FactorRule *r, int64_t size, FactorKind k, char name)
{
	if (r->nf >= MAX_FACTORS) /* ranks are at most 8: cannot happen, must not write past */
		abort();
	r->size[r->nf] = size;
	r->kind[r->nf] = (uint8_t)k;
	r->name[r->nf] = name;
	return r->nf++;
}

__attribute__((noinline)) /* GCC 12 -O3 reports a false overflow when inlined */
static void put(FactorRule *r, int t, int d, int f)
{
	if (t < 0 || t >= FACTOR_TENSORS || d < 0 || d >= MAX_RANK || r->nfd[t][d] >= FACTOR_PER_DIM)
		abort(); /* the rules stay within the table: cannot happen, must not write past it */
	r->fd[t][d][r->nfd[t][d]++] = (uint8_t)f;
}

static const Shape *shape_of(const Graph *g, int v) { return &g->values.a[v].shape; }

/* One factor per result dim, shared with each operand dim of the same size,
 * aligned from the right (numpy broadcasting); size-1 operand dims get none. */
static void rule_broadcast(const Graph *g, const Op *op, FactorRule *r, int nops)
{
	const Shape *out = shape_of(g, op->out);
	for (int d = 0; d < out->rank; d++) {
		int f = add_factor(r, out->dim[d], out->dim[d] == 1 ? FK_REPLICATE : FK_PASS, 0);
		put(r, r->res, d, f);
		for (int i = 0; i < nops; i++) {
			const Shape *s = shape_of(g, op->in[i]);
			int od = d - (out->rank - s->rank);
			if (od >= 0 && s->dim[od] == out->dim[d])
				put(r, i, od, f);
		}
	}
}

static void rule_einsum(const Graph *g, const Op *op, FactorRule *r)
{
	const Attr *at = op->attr;
	int of[128];
	memset(of, -1, sizeof of);
	for (int t = 0; t < op->nin; t++) {
		const Shape *s = shape_of(g, op->in[t]);
		for (int d = 0; d < at->nlet[t]; d++) {
			unsigned char c = (unsigned char)at->let[t][d];
			if (of[c] < 0) {
				bool in_out = memchr(at->let[2], c, (size_t)at->nlet[2]) != NULL;
				of[c] = add_factor(r, s->dim[d], in_out ? FK_PASS : FK_REDUCE, (char)c);
			} else if (memchr(at->let[t], c, (size_t)d)) {
				r->kind[of[c]] = FK_REPLICATE; /* a diagonal */
			}
			put(r, t, d, of[c]);
		}
	}
	for (int d = 0; d < at->nlet[2]; d++)
		put(r, r->res, d, of[(unsigned char)at->let[2][d]]);
}

static void rule_reduce(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *s = shape_of(g, op->in[0]);
	const Attr *at = op->attr;
	int rd = 0;
	for (int d = 0; d < s->rank; d++) {
		bool reduced = false;
		for (int k = 0; k < at->naxes; k++)
			reduced |= at->axes[k] == d;
		int f = add_factor(r, s->dim[d], reduced ? FK_REDUCE : FK_PASS, 0);
		r->reduce[f] = op->kind == OP_REDUCE_MAX ? REDUCE_MAX : REDUCE_SUM;
		put(r, 0, d, f);
		if (!reduced)
			put(r, r->res, rd++, f);
		else if (at->keepdims)
			rd++;
	}
}

/* Same shape in and out, one factor per dim; `axis` (if >= 0) of kind k. */
static void rule_same(const Graph *g, const Op *op, FactorRule *r, int axis, FactorKind k)
{
	const Shape *s = shape_of(g, op->out);
	for (int d = 0; d < s->rank; d++) {
		int f = add_factor(r, s->dim[d], s->dim[d] == 1 ? FK_REPLICATE : d == axis ? k : FK_PASS, 0);
		put(r, 0, d, f);
		put(r, r->res, d, f);
	}
}

static void rule_transpose(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *s = shape_of(g, op->in[0]);
	int f0 = r->nf;
	for (int d = 0; d < s->rank; d++)
		put(r, 0, d, add_factor(r, s->dim[d], FK_PASS, 0));
	for (int d = 0; d < s->rank; d++)
		put(r, r->res, d, f0 + op->attr->axes[d]);
}

/* Reshape: the common refinement of the two shapes.  Where neither side's
 * remainder divides the other's, the dims involved share one factor that may
 * not be split. */
static void rule_reshape(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *a = shape_of(g, op->in[0]), *b = shape_of(g, op->out);
	int i = 0, j = 0;
	int64_t ra = 0, rb = 0;
	while (true) {
		while (i < a->rank && (ra == 1 || ra == 0))
			ra = a->dim[i] == 1 ? (i++, 0) : a->dim[i];
		while (j < b->rank && (rb == 1 || rb == 0))
			rb = b->dim[j] == 1 ? (j++, 0) : b->dim[j];
		if (i >= a->rank || j >= b->rank)
			break;
		if (ra % rb == 0 || rb % ra == 0) {
			int64_t n = ra < rb ? ra : rb;
			int f = add_factor(r, n, FK_PASS, 0);
			put(r, 0, i, f), put(r, r->res, j, f);
			ra /= n, rb /= n;
			if (ra == 1)
				i++, ra = 0;
			if (rb == 1)
				j++, rb = 0;
			continue;
		}
		int f = add_factor(r, ra * rb, FK_REPLICATE, 0);
		put(r, 0, i, f), put(r, r->res, j, f);
		int64_t pa = ra, pb = rb;
		while (pa != pb) {
			if (pa < pb)
				pa *= a->dim[++i], put(r, 0, i, f);
			else
				pb *= b->dim[++j], put(r, r->res, j, f);
		}
		i++, j++, ra = rb = 0;
	}
}

/* slice and pad: dims left whole pass through; others may not be split. */
static void rule_window(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *s = shape_of(g, op->in[0]), *o = shape_of(g, op->out);
	const Attr *at = op->attr;
	for (int d = 0; d < s->rank; d++) {
		bool whole = op->kind == OP_SLICE ? at->start[d] == 0 && at->limit[d] == s->dim[d] && at->stride[d] <= 1
		                                  : at->start[d] == 0 && at->limit[d] == 0;
		int f = add_factor(r, o->dim[d], whole ? FK_PASS : FK_REPLICATE, 0);
		put(r, 0, d, f);
		put(r, r->res, d, f);
	}
}

static void rule_conv2d(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *x = shape_of(g, op->in[0]), *k = shape_of(g, op->in[1]), *o = shape_of(g, op->out);
	int n = add_factor(r, x->dim[0], FK_PASS, 'n');
	put(r, 0, 0, n), put(r, r->res, 0, n);
	for (int d = 1; d <= 2; d++) {
		int fo = add_factor(r, o->dim[d], FK_WINDOW, d == 1 ? 'h' : 'w');
		put(r, 0, d, fo), put(r, r->res, d, fo);
		put(r, 1, d - 1, add_factor(r, k->dim[d - 1], FK_REPLICATE, 0));
	}
	int c = add_factor(r, x->dim[3], FK_REDUCE, 'c');
	put(r, 0, 3, c), put(r, 1, 2, c);
	int f = add_factor(r, k->dim[3], FK_PASS, 'o');
	put(r, 1, 3, f), put(r, r->res, 3, f);
}

static void rule_take(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *t = shape_of(g, op->in[0]), *ids = shape_of(g, op->in[1]);
	put(r, 0, 0, add_factor(r, t->dim[0], FK_GATHER, 0));
	for (int d = 0; d < ids->rank; d++) {
		int f = add_factor(r, ids->dim[d], FK_PASS, 0);
		put(r, 1, d, f), put(r, r->res, d, f);
	}
	for (int d = 1; d < t->rank; d++) {
		int f = add_factor(r, t->dim[d], FK_PASS, 0);
		put(r, 0, d, f), put(r, r->res, ids->rank + d - 1, f);
	}
}

static void rule_one_hot(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *ids = shape_of(g, op->in[0]);
	for (int d = 0; d < ids->rank; d++) {
		int f = add_factor(r, ids->dim[d], FK_PASS, 0);
		put(r, 0, d, f), put(r, r->res, d, f);
	}
	/* the classes may split: each device writes its block (one_hot_shard) */
	put(r, r->res, ids->rank, add_factor(r, op->attr->depth, op->attr->depth == 1 ? FK_REPLICATE : FK_PASS, 0));
}

static void rule_concat(const Graph *g, const Op *op, FactorRule *r)
{
	rule_same(g, op, r, op->attr->axis, FK_REPLICATE);
}

/* ---- the ops of training ---- */

/* A new factor of kind k (size-1 dims: replicated) at dim d of tensors ta and tb (tb < 0: none). */
static int put2(FactorRule *r, int64_t size, FactorKind k, int ta, int da, int tb, int db)
{
	int f = add_factor(r, size, size == 1 ? FK_REPLICATE : k, 0);
	r->reduce[f] = REDUCE_SUM;
	put(r, ta, da, f);
	if (tb >= 0)
		put(r, tb, db, f);
	return f;
}

/* mse: every dim is summed (the kernel divides by the global count). */
static void rule_mse(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *s = shape_of(g, op->in[0]);
	for (int d = 0; d < s->rank; d++)
		put2(r, s->dim[d], FK_REDUCE, 0, d, 1, d);
}

/* softmax_cross_entropy: the positions are summed (the kernel divides by
 * the global count; the partitioned loss skips the padded positions of its
 * labels' shard); the classes split as softmax's axis, with all_reduced
 * statistics (partitioner/lower.c). */
static void rule_softmax_xent(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *s = shape_of(g, op->in[0]);
	for (int d = 0; d < s->rank; d++)
		put2(r, s->dim[d], d < s->rank - 1 ? FK_REDUCE : FK_STAT, 0, d, d < s->rank - 1 ? 1 : -1, d);
}

/* softmax_cross_entropy_grad [logits, labels, g] -> the logits' shape: the
 * positions pass (logits, labels, result), the classes split as the loss's
 * (logits and result), g is a scalar. */
static void rule_softmax_xent_grad(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *s = shape_of(g, op->in[0]);
	for (int d = 0; d < s->rank - 1; d++) {
		int f = put2(r, s->dim[d], FK_PASS, 0, d, 1, d);
		put(r, r->res, d, f);
	}
	put(r, r->res, s->rank - 1, put2(r, s->dim[s->rank - 1], FK_STAT, 0, s->rank - 1, -1, 0));
}

/* take_grad [ids..., row...], ids -> [rows, row...]: the ids' dims are
 * summed; the result's rows split too (each device sums the gradients of
 * the ids in its rows: partitioner/lower.c, take_grad_shard). */
static void rule_take_grad(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *x = shape_of(g, op->in[0]), *ids = shape_of(g, op->in[1]);
	for (int d = 0; d < ids->rank; d++)
		put2(r, ids->dim[d], FK_REDUCE, 0, d, 1, d);
	put2(r, op->attr->depth, FK_PASS, r->res, 0, -1, 0);
	for (int d = ids->rank; d < x->rank; d++)
		put2(r, x->dim[d], FK_PASS, 0, d, r->res, d - ids->rank + 1);
}

/* conv2d_grad_input [dy, w] -> dx: N and C pass, O summed, windows whole. */
static void rule_conv_grad_input(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *dy = shape_of(g, op->in[0]), *w = shape_of(g, op->in[1]), *x = shape_of(g, op->out);
	put2(r, dy->dim[0], FK_PASS, 0, 0, r->res, 0);
	for (int d = 1; d <= 2; d++) {
		put2(r, dy->dim[d], FK_REPLICATE, 0, d, -1, 0);
		put2(r, x->dim[d], FK_REPLICATE, r->res, d, -1, 0);
		put2(r, w->dim[d - 1], FK_REPLICATE, 1, d - 1, -1, 0);
	}
	put2(r, w->dim[2], FK_PASS, 1, 2, r->res, 3);
	put2(r, dy->dim[3], FK_REDUCE, 0, 3, 1, 3);
}

/* conv2d_grad_filter [x, dy] -> dw: N summed, C and O pass, windows whole. */
static void rule_conv_grad_filter(const Graph *g, const Op *op, FactorRule *r)
{
	const Shape *x = shape_of(g, op->in[0]), *dy = shape_of(g, op->in[1]), *w = shape_of(g, op->out);
	put2(r, x->dim[0], FK_REDUCE, 0, 0, 1, 0);
	for (int d = 1; d <= 2; d++) {
		put2(r, x->dim[d], FK_REPLICATE, 0, d, -1, 0);
		put2(r, dy->dim[d], FK_REPLICATE, 1, d, -1, 0);
		put2(r, w->dim[d - 1], FK_REPLICATE, r->res, d - 1, -1, 0);
	}
	put2(r, x->dim[3], FK_PASS, 0, 3, r->res, 2);
	put2(r, dy->dim[3], FK_PASS, 1, 3, r->res, 3);
}

int factor_rule(const Graph *g, const Op *op, FactorRule *r)
{
	memset(r, 0, sizeof *r);
	r->res = op->nin < FACTOR_TENSORS - 1 ? op->nin : FACTOR_TENSORS - 1;
	unsigned fl = op_table[op->kind].flags;
	if (fl & OPF_COLLECTIVE)
		return -1;
	if (fl & (OPF_UNARY | OPF_BINARY) || op->kind == OP_BROADCAST_TO) {
		rule_broadcast(g, op, r, op->nin);
		return 0;
	}
	switch (op->kind) {
	case OP_EINSUM: rule_einsum(g, op, r); break;
	case OP_REDUCE_SUM:
	case OP_REDUCE_MAX:
	case OP_REDUCE_MEAN: rule_reduce(g, op, r); break;
	case OP_SOFTMAX:
	case OP_LOG_SOFTMAX:
	case OP_LAYER_NORM: rule_same(g, op, r, op->attr->axes[0], FK_STAT); break;
	case OP_TRANSPOSE: rule_transpose(g, op, r); break;
	case OP_RESHAPE: rule_reshape(g, op, r); break;
	case OP_SLICE:
	case OP_PAD: rule_window(g, op, r); break;
	case OP_CONCAT: r->res = 1, rule_concat(g, op, r); break;
	case OP_CONV2D: rule_conv2d(g, op, r); break;
	case OP_TAKE: rule_take(g, op, r); break;
	case OP_ONE_HOT: rule_one_hot(g, op, r); break;
	case OP_CAST:
	case OP_COPY: rule_same(g, op, r, -1, FK_PASS); break;
	case OP_MSE: rule_mse(g, op, r); break;
	case OP_SOFTMAX_CROSS_ENTROPY: rule_softmax_xent(g, op, r); break;
	case OP_SOFTMAX_CROSS_ENTROPY_GRAD: rule_softmax_xent_grad(g, op, r); break;
	case OP_TAKE_GRAD: rule_take_grad(g, op, r); break;
	case OP_CONV2D_GRAD_INPUT: rule_conv_grad_input(g, op, r); break;
	case OP_CONV2D_GRAD_FILTER: rule_conv_grad_filter(g, op, r); break;
	default: return -1;
	}
	return 0;
}

void factor_rules_make(FactorRules *t, const Graph *g)
{
	t->g = g, t->n = g->values.n;
	t->op = xmalloc(sizeof(int) * ((size_t)t->n + 1));
	t->rule = xmalloc(sizeof *t->rule * ((size_t)t->n + 1));
	t->state = xcalloc((size_t)t->n + 1, 1);
	for (int v = 0; v < t->n; v++)
		t->op[v] = -1;
	for (int i = 0; i < g->ops.n; i++) {
		int v = g->ops.a[i].out;
		t->op[v] = i;
		t->state[v] = factor_rule(g, &g->ops.a[i], &t->rule[v]) == 0 ? 1 : -1;
	}
}

void factor_rules_free(FactorRules *t)
{
	free(t->op), free(t->rule), free(t->state);
	memset(t, 0, sizeof *t);
}

/* Is op (of g, a fork of t's graph) the op that made its result in t's
 * graph, as it was there?  A value of both graphs has one shape (the
 * passes add values and change none), so only operands rewired to other
 * values are compared by shape. */
static bool known_op(const FactorRules *t, const Graph *g, const Op *op)
{
	if (!t || op->out >= t->n || t->op[op->out] < 0)
		return false;
	const Op *o = &t->g->ops.a[t->op[op->out]];
	if (o->kind != op->kind || o->nin != op->nin || o->attr != op->attr)
		return false;
	for (int i = 0; i < op->nin; i++)
		if (o->in[i] != op->in[i] && !shape_eq(&t->g->values.a[o->in[i]].shape, &g->values.a[op->in[i]].shape))
			return false;
	return true;
}

const FactorRule *factor_rule_memo(const FactorRules *t, const Graph *g, const Op *op, FactorRule *scratch)
{
	if (!known_op(t, g, op))
		return factor_rule(g, op, scratch) == 0 ? scratch : NULL;
	return t->state[op->out] > 0 ? &t->rule[op->out] : NULL;
}

const char *factor_kind_name(FactorKind k)
{
	static const char *names[] = {"pass-through", "reduction", "replicated", "windowed", "gathered", "statistic"};
	return names[k];
}

/* Can n shards of dim d's first factor (size F, the dim D = F * inner)
 * pad: are the dim's blocks, ceil(D / n), whole blocks of the factor,
 * ceil(F / n) * inner?  Then both sides of a reshape hold the same rows
 * ([10, 6] -> [5, 2, 6] over 3: blocks of 4, 4, 2 rows either way). */
static bool blocks_align(const FactorRule *r, int t, int d, int64_t n)
{
	int64_t F = r->size[r->fd[t][d][0]], inner = 1;
	for (int i = 1; i < r->nfd[t][d]; i++) {
		if (r->kind[r->fd[t][d][i]] == FK_REPLICATE)
			return false; /* a compound factor spans other dims: its size is not this dim's */
		inner *= r->size[r->fd[t][d][i]];
	}
	return (F * inner + n - 1) / n == (F + n - 1) / n * inner;
}

bool factor_split_ok(const FactorRule *r, int t, int d, int i, int64_t n)
{
	int64_t size = r->size[r->fd[t][d][i]];
	if (size % n == 0 || (i == 0 && r->nfd[t][d] == 1))
		return true;
	return i == 0 && blocks_align(r, t, d, n);
}

static int64_t gcd(int64_t a, int64_t b) { return b ? gcd(b, a % b) : a; }

/* Axis sz stopped the projection at factor f, split prod ways so far:
 * the cut of it that would fill f further (Shardy's rule: the factor takes
 * the major part of the axis whose size divides what it lacks), or 0. */
static int wanted_cut(const FactorRule *r, int f, int64_t prod, int64_t sz)
{
	int64_t lack = r->size[f] % prod ? 1 : r->size[f] / prod, g = gcd(lack, sz);
	return r->kind[f] != FK_REPLICATE && g > 1 && g < sz ? (int)g : 0;
}

void factor_project_dim(const Mesh *m, const FactorRule *r, int t, int d, const Spec *s, Axes *fa)
{
	factor_project_dim_cut(m, r, t, d, s, fa, NULL);
}

void factor_project_dim_cut(const Mesh *m, const FactorRule *r, int t, int d, const Spec *s, Axes *fa, FactorCut *cut)
{
	int k = 0;
	for (int i = 0; i < r->nfd[t][d]; i++) {
		int f = r->fd[t][d][i];
		int64_t prod = 1;
		fa[f].n = 0;
		while (k < s->nax[d]) {
			int64_t sz = m->size[s->ax[d][k]];
			/* padding is only where the dim's own blocks put it: a split
			 * that does not divide ends the dim, and only when no factor
			 * before it is split, and the factors after it are whole in
			 * blocks that pad like the dim's own */
			if (!factor_split_ok(r, t, d, i, prod * sz)) {
				if (cut && prod != r->size[f] && (cut->at = wanted_cut(r, f, prod, sz)))
					cut->axis = s->ax[d][k];
				break;
			}
			fa[f].ax[fa[f].n++] = s->ax[d][k++];
			prod *= sz;
		}
		if (prod != r->size[f])
			return;
	}
}
