/* partition.c: the partitioner — every op becomes its local op, plus the collectives it needs.
 *
 * The method is GSPMD's (Xu et al., 2021) driven by Shardy's factors
 * (docs/algorithms.md §1, §3).  Propagation has given every value a
 * sharding.  For each op, in order:
 *   1. choose the mesh axes of each factor: pass-through factors from the
 *      result's sharding, reduction factors from the operands (the larger
 *      operand first), never one axis for two factors;
 *   2. reshard each operand to the projection of those factor axes
 *      (the reshard planner picks the collectives; an operand moved the
 *      same way for one of the ops just before is read as moved:
 *      reshard_again), and mask the padding of unevenly split reduction
 *      dims with the reduction's identity;
 *   3. emit the op on local shapes; split reduction factors leave the result
 *      partial over their axes;
 *   4. reshard the result to its propagated sharding (a pending sum becomes
 *      an all_reduce, or a reduce_scatter where the result is wanted split).
 * Pending sums meet before they are reduced: a result whose only pending
 * part is a sum, read only by ops linear in it (add and sub; neg, copy,
 * transpose and narrowing float casts when it has one reader), is left
 * pending.  add and sub of operands pending over the same axes stay pending
 * (linear_partial), so the contributions to a gradient, or the branches of
 * a parallel block, are reduced once, as their total, by the first reader
 * that needs the value whole (settle; the reduced value is reused by the
 * later readers).
 * The program is the same for every device: device-dependent ops
 * (shard_slice, mask) read the device's mesh coordinates when they run, so
 * neither the time to partition nor the program grows with the device
 * count. */
#include "partition.h"

#include <math.h>
#include <string.h>

#include "../sharding_spec/reshard.h"
#include "../spmd/ops.h"
#include "factors.h"
#include "part.h"
#include "../cost_model/cost.h"


void spec_local_shape(const Spec *s, const Mesh *m, const Shape *g, Shape *out)
{
	out->rank = g->rank;
	spec_shard_shape(s, m, g->dim, out->dim);
}

const char *fmt(Part *P, const char *f, ...)
{
	va_list ap;
	va_start(ap, f);
	const char *s = arena_vprintf(&P->dst->arena, f, ap);
	va_end(ap);
	return s;
}

/* Names of the program's values, made for every op, so without printf:
 * the first len bytes of name, then '%' and n, or "%local" when n < 0;
 * in buf (cap bytes), or by fmt() when that is too small (the same text). */
static const char *local_name(Part *P, const char *name, int len, int n, char *buf, size_t cap)
{
	if ((size_t)len + 16 > cap)
		return n >= 0 ? fmt(P, "%.*s%%%d", len, name, n) : fmt(P, "%.*s%%local", len, name);
	memcpy(buf, name, (size_t)len);
	char *q = buf + len;
	*q++ = '%';
	if (n < 0) {
		memcpy(q, "local", 6);
		return buf;
	}
	char d[12];
	int m = 0;
	do
		d[m++] = (char)('0' + n % 10);
	while (n /= 10);
	while (m)
		*q++ = d[--m];
	*q = 0;
	return buf;
}

const char *pos_str(Part *P, Pos p) { return fmt(P, "%s:%d:%d", p.file ? p.file : "?", p.line, p.col); }

const char *spec_str(Part *P, const Spec *s)
{
	char buf[256];
	spec_format(s, &P->dst->mesh, buf, sizeof buf);
	return arena_strdup(&P->dst->arena, buf);
}

/* A new dst value: a shard of shape `local` of a tensor of shape `global`. */
int new_value_local(Part *P, const char *name, DType t, const Shape *global, const Shape *local, const Spec *s,
                           ValueKind k, Pos p)
{
	Spec spec = *s; /* the arguments may point into the values graph_value moves */
	Shape g = *global;
	int v = graph_value(P->dst, name, t, local, k, p);
	Value *val = &P->dst->values.a[v];
	val->spec = spec;
	val->global = g;
	return v;
}

/* The same with the spec's own (ceil-divided) shard shape. */
int new_value(Part *P, const char *name, DType t, const Shape *global, const Spec *s, ValueKind k, Pos p)
{
	Shape local;
	spec_local_shape(s, &P->dst->mesh, global, &local);
	return new_value_local(P, name, t, global, &local, s, k, p);
}

/* Emit op kind on ins with result shape `local`, sharded `s`; returns its dst id. */
int emit_local(Part *P, OpKind k, const int *ins, int nin, const Attr *at, const Spec *s, const Shape *local,
                      Pos p, const char *why)
{
	const Value *base = &P->dst->values.a[ins[0]];
	char buf[256];
	const char *name = local_name(P, base->name, root_len(base->name), P->dst->values.n, buf, sizeof buf);
	Shape global = base->global;
	int v = new_value_local(P, name, base->dtype, &global, local, s, VK_INTER, p);
	int id = graph_op(P->dst, k, ins, nin, v, p);
	Op *op = &P->dst->ops.a[id];
	if (at)
		*op->attr = *at;
	op->why = why;
	return v;
}

/* The same with the spec's own shard shape. */
int emit(Part *P, OpKind k, const int *ins, int nin, const Attr *at, const Spec *s, Pos p, const char *why)
{
	Shape local;
	spec_local_shape(s, &P->dst->mesh, &P->dst->values.a[ins[0]].global, &local);
	return emit_local(P, k, ins, nin, at, s, &local, p, why);
}

/* ---- resharding: planner steps become ops ---- */

static const OpKind step_op[RS_KIND_COUNT] = {
	[RS_SLICE] = OP_SHARD_SLICE, [RS_ALL_REDUCE] = OP_ALL_REDUCE, [RS_REDUCE_SCATTER] = OP_REDUCE_SCATTER,
	[RS_ALL_GATHER] = OP_ALL_GATHER, [RS_ALL_TO_ALL] = OP_ALL_TO_ALL, [RS_PERMUTE] = OP_COLLECTIVE_PERMUTE,
};

static int emit_step(Part *P, int v, const ReshardPlan *plan, const ReshardStep *st, Pos p, const char *why)
{
	const Value *val = &P->dst->values.a[v];
	int rank = val->shape.rank;
	Attr at = {0};
	at.ncax = st->nax;
	memcpy(at.cax, st->axes, sizeof at.cax);
	at.reduce = st->reduce;
	at.dim = st->dim;
	at.dim2 = st->dim2;
	at.global = val->global;
	reshard_layout_spec(&st->before, rank, val->spec.reduce, &at.spec_from);
	reshard_layout_spec(&st->after, rank, val->spec.reduce, &at.spec);
	at.shape.rank = rank;
	memcpy(at.shape.dim, st->after.block, sizeof(int64_t) * (size_t)rank);
	if (st->kind == RS_PERMUTE) {
		int *t = arena_alloc(&P->dst->arena, sizeof(int) * (size_t)plan->ndev);
		memcpy(t, st->target, sizeof(int) * (size_t)plan->ndev);
		at.target = t;
	}
	if (st->fallback) /* the partition report says so, like `spmd reshard` */
		why = WHY(P, "%s (fallback: gathers data a later slice drops)", why);
	return emit_local(P, step_op[st->kind], &v, 1, &at, &at.spec, &at.shape, p, why);
}

/* The plan from `from` to `to` for value val: remembered, or made and
 * remembered; NULL when the planner refuses (its message in d). */
static const ReshardPlan *plan_for(Part *P, const Value *val, const Spec *to, Diag *d)
{
	return reshard_cache_plan(P->plans, &val->spec, to, &P->dst->mesh, val->global.dim, dtype_size(val->dtype), d);
}

/* Reshard dst value v to spec `to`, emitting the planner's steps. */
int reshard(Part *P, int v, const Spec *to, Pos p, const char *why)
{
	Diag quiet;
	diag_init(&quiet);
	quiet.quiet = true;
	const ReshardPlan *plan = plan_for(P, &P->dst->values.a[v], to, &quiet);
	if (!plan) { /* an invariant of the passes broken: said at the op */
		diag_error(P->d, p, "internal: expected a reshard of '%s' the planner can make, found: %s",
		           P->dst->values.a[v].name, quiet.last);
		return -1;
	}
	for (int i = 0; i < plan->nsteps; i++)
		v = emit_step(P, v, plan, &plan->steps[i], p, why);
	P->moved += plan->bytes_sent_per_device;
	return v;
}

/* ---- choosing factor axes ---- */


int64_t axes_prod(const Mesh *m, const Axes *a)
{
	int64_t n = 1;
	for (int k = 0; k < a->n; k++)
		n *= m->size[a->ax[k]];
	return n;
}

/* Offer the factor axes seen on tensor t (spec s) for factors still free. */
static void offer(const Graph *g, const FactorRule *r, int t, int rank, const Spec *s, bool reductions,
                  Axes *fa, unsigned *used)
{
	for (int d = 0; d < rank; d++) {
		if (!s->nax[d]) /* a whole dim offers nothing */
			continue;
		Axes cand[MAX_FACTORS]; /* only the dim's factors are read */
		for (int i = 0; i < r->nfd[t][d]; i++)
			cand[r->fd[t][d][i]].n = 0;
		factor_project_dim(&g->mesh, r, t, d, s, cand);
		for (int i = 0; i < r->nfd[t][d]; i++) {
			int f = r->fd[t][d][i];
			FactorKind kind = r->kind[f];
			bool ok = kind == FK_PASS || kind == FK_STAT || kind == FK_WINDOW ||
			          (reductions && (kind == FK_REDUCE || kind == FK_GATHER));
			if (!ok || fa[f].n || !cand[f].n)
				continue;
			for (int k = 0; k < cand[f].n && !(*used >> cand[f].ax[k] & 1); k++) {
				if (g->mesh.size[cand[f].ax[k]] == 1)
					continue; /* splits nothing */
				fa[f].ax[fa[f].n++] = cand[f].ax[k];
				*used |= 1u << cand[f].ax[k];
			}
		}
	}
}

/* A dim can be split on a factor only if every factor before it in the dim
 * is split whole; drop the axes of factors that break this (step 1). */
static bool drop_unsplittable(const Graph *g, const FactorRule *r, int ntensors, Axes *fa)
{
	bool changed = false;
	for (int t = 0; t < ntensors; t++)
		for (int d = 0; d < MAX_RANK; d++) {
			bool whole = true;
			for (int i = 0; i < r->nfd[t][d]; i++) {
				int f = r->fd[t][d][i];
				int64_t n = axes_prod(&g->mesh, &fa[f]);
				if (fa[f].n && (!whole || !factor_split_ok(r, t, d, i, n))) {
					fa[f].n = 0, changed = true;
					n = 1;
				}
				whole = whole && n == r->size[f];
			}
		}
	return changed;
}

/* Operand indices, larger operands first (stable). */
static int operand_order(const Graph *g, const Op *op, int *order, int max)
{
	int n = op->nin < max ? op->nin : max;
	for (int i = 0; i < n; i++)
		order[i] = i;
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0; j--) {
			const Value *a = &g->values.a[op->in[order[j]]], *b = &g->values.a[op->in[order[j - 1]]];
			if (shape_numel(&a->shape) <= shape_numel(&b->shape))
				break;
			int tmp = order[j];
			order[j] = order[j - 1], order[j - 1] = tmp;
		}
	return n;
}

/* A result annotated as a pending reduction gets each partial axis on the
 * reduction factor an operand already splits on it, else on the largest. */
static void offer_partial(const Graph *g, const Op *op, const FactorRule *r, Axes *fa, unsigned *used)
{
	const Spec *s = &g->values.a[op->out].spec;
	int best = -1, on[MESH_MAX_AXES];
	for (int f = 0; f < r->nf; f++)
		if ((r->kind[f] == FK_REDUCE || r->kind[f] == FK_GATHER) && (best < 0 || r->size[f] > r->size[best]))
			best = f;
	if (!s->partial || best < 0)
		return;
	for (int a = 0; a < MESH_MAX_AXES; a++)
		on[a] = best;
	for (int t = 0; t < r->res && t < op->nin; t++) {
		const Value *in = &g->values.a[op->in[t]];
		for (int d = 0; d < in->shape.rank; d++) {
			Axes cand[MAX_FACTORS];
			memset(cand, 0, sizeof cand);
			factor_project_dim(&g->mesh, r, t, d, &in->spec, cand);
			for (int i = 0; i < r->nfd[t][d]; i++) {
				int f = r->fd[t][d][i];
				for (int k = 0; (r->kind[f] == FK_REDUCE || r->kind[f] == FK_GATHER) && k < cand[f].n; k++)
					on[cand[f].ax[k]] = f;
			}
		}
	}
	for (int a = 0; a < g->mesh.naxes; a++)
		if (s->partial >> a & 1 && !(*used >> a & 1))
			fa[on[a]].ax[fa[on[a]].n++] = (uint8_t)a, *used |= 1u << a;
}

/* Step 1: the axes of every factor.  With result_first, pass-through factors
 * follow the result's sharding before the operands are heard; otherwise the
 * operands (reductions included) come first. */
static void choose_factors(Part *P, const Op *op, const FactorRule *r, Axes *fa, bool result_first)
{
	const Graph *g = P->src;
	unsigned used = 0;
	memset(fa, 0, sizeof(Axes) * MAX_FACTORS);
	const Value *out = &g->values.a[op->out];
	offer_partial(g, op, r, fa, &used);
	if (result_first)
		offer(g, r, r->res, out->shape.rank, &out->spec, false, fa, &used);
	int order[MAX_RANK * 4], n = operand_order(g, op, order, MAX_RANK * 4);
	for (int i = 0; i < n; i++) {
		const Value *v = &g->values.a[op->in[order[i]]];
		if (order[i] < r->res)
			offer(g, r, factor_tensor(r, order[i]), v->shape.rank, &v->spec, true, fa, &used);
	}
	if (!result_first)
		offer(g, r, r->res, out->shape.rank, &out->spec, false, fa, &used);
	for (int d = 1; op->kind == OP_CONV2D && d <= 2; d++) {
		Axes *a = &fa[r->fd[0][d][0]];
		if (a->n && !conv_halo_ok(g, op, d, a))
			a->n = 0;
	}
	while (used && drop_unsplittable(g, r, r->res + 1, fa)) /* used 0: no factor took an axis */
		;
}

/* The spec of tensor t under the chosen factor axes. */
void factors_spec(const Graph *g, const FactorRule *r, int t, int rank, const Axes *fa, Spec *s)
{
	memset(s, 0, sizeof *s);
	s->rank = (uint8_t)rank;
	for (int d = 0; d < rank; d++)
		for (int i = 0; i < r->nfd[t][d]; i++) {
			const Axes *a = &fa[r->fd[t][d][i]];
			for (int k = 0; k < a->n && s->nax[d] < MESH_MAX_AXES; k++)
				s->ax[d][s->nax[d]++] = a->ax[k];
		}
	(void)g;
}

/* ---- one op ---- */

/* v has a user's annotation (a pass's has no position) that can be a
 * party to a conflict: any, with whole_ok (the tensor moved, or the op's
 * result, whose layout the operands are brought to); else only one split
 * or pending somewhere (a whole operand is sliced to any layout for free,
 * so it moves nothing: a norm's [null] bias is no party to the gather
 * after it). */
static bool user_pin(const Value *v, bool whole_ok)
{
	return v->has_spec && v->spec_pos.line && (whole_ok || spec_dim_axes(&v->spec) || v->spec.partial);
}

/* Two user annotations an op cannot reconcile without moving data: say so,
 * with both positions and the cost. */
static void warn_conflict(Part *P, const Op *op, const Value *sv, const Spec *want, int64_t bytes)
{
	const Value *out = &P->src->values.a[op->out], *other = NULL;
	if (out != sv && out->has_spec && !out->spec_pos.line)
		return; /* a pass chose the result's layout: its choice, not a conflict */
	if (out != sv && user_pin(out, true))
		other = out;
	for (int i = 0; i < op->nin && !other; i++)
		if (&P->src->values.a[op->in[i]] != sv && user_pin(&P->src->values.a[op->in[i]], false))
			other = &P->src->values.a[op->in[i]];
	if (!other || !user_pin(sv, true) || bytes == 0)
		return;
	bool result = sv == &P->src->values.a[op->out];
	diag_warn(P->d, op->pos,
	          "%s (annotated %s at %s) and %s (annotated %s at %s) disagree through %s: %s %s %s, "
	          "%lld bytes sent per device",
	          sv->name, spec_str(P, &sv->spec), pos_str(P, sv->spec_pos), other->name, spec_str(P, &other->spec),
	          pos_str(P, other->spec_pos), op_table[op->kind].name, sv->name,
	          result ? "comes out" : "is resharded to", spec_str(P, want), (long long)bytes);
}

/* Can op, reading src value v, take v as a pending sum (linear_partial)? */
static bool reads_linearly(const Graph *g, const Op *op, const Value *v)
{
	switch (op->kind) {
	case OP_ADD:
	case OP_SUB: return true;
	case OP_NEG:
	case OP_COPY:
	case OP_TRANSPOSE: return v->nuses == 1;
	case OP_CAST:
		return v->nuses == 1 && dtype_is_float(op->attr->dtype) && dtype_is_float(v->dtype) &&
		       dtype_size(op->attr->dtype) <= dtype_size(v->dtype);
	default: return false;
	}
	(void)g;
}

void partition_deferrable(const Graph *g, uint8_t *d)
{
	for (int v = 0; v < g->values.n; v++) {
		const Value *val = &g->values.a[v];
		d[v] = val->producer >= 0 && val->nuses > 0 && !(val->has_spec && val->spec_pos.line) && !val->spec.partial;
	}
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++) {
			int v = g->ops.a[i].in[k];
			if (!reads_linearly(g, &g->ops.a[i], &g->values.a[v]))
				d[v] = 0;
		}
	for (int i = 0; i < g->outputs.n; i++)
		d[g->outputs.a[i]] = 0;
}

unsigned partition_add_pending(const Graph *g, const Op *op, unsigned pa, unsigned pb, const uint8_t *defer)
{
	if (pa == pb)
		return pa;
	if (pa && pb)
		return 0;
	const Value *whole = &g->values.a[op->in[pa ? 1 : 0]], *pend = &g->values.a[op->in[pa ? 0 : 1]];
	const Value *out = &g->values.a[op->out];
	int64_t n = mesh_axes_size(&g->mesh, pa | pb);
	bool exact = out->dtype == DT_F32 || (n & (n - 1)) == 0;
	bool stays = defer[op->out] || (out->spec.partial && out->spec.reduce == REDUCE_SUM); /* or annotated so */
	if (!stays || whole->kind == VK_CONST || !dtype_is_float(out->dtype) || !exact ||
	    shape_numel(&pend->shape) != shape_numel(&out->shape))
		return 0;
	return pa | pb;
}

/* A whole operand v of an add or sub that keeps the sum pending over the
 * axes `keep`: v divided by their replica count, a pending sum over them. */
static int spread_over_replicas(Part *P, const Op *op, int v, unsigned keep)
{
	Spec s = P->dst->values.a[v].spec;
	s.partial = (uint8_t)keep, s.reduce = REDUCE_SUM;
	Shape scalar = {0};
	int n = mesh_axes_size(&P->dst->mesh, keep);
	int c = graph_value(P->dst, fmt(P, "%%const%d", P->dst->values.n), P->dst->values.a[v].dtype, &scalar,
	                    VK_CONST, op->pos);
	P->dst->values.a[c].cval = 1.0 / n;
	int ins[2] = {v, c};
	const char *why = WHY(P, "%s at %s adds a pending sum: its whole operand divided by the %d replicas the sum runs "
	                      "over, so the total is reduced once", op_table[op->kind].name, pos_str(P, op->pos), n);
	return emit(P, OP_MUL, ins, 2, NULL, &s, op->pos, why);
}

/* Src value sv (held by dst value v, a sum left pending) reduced to its
 * propagated sharding, once: later readers get the reduced value. */
static int settle(Part *P, int src, int v, const Op *op)
{
	const Value *sv = &P->src->values.a[src];
	const char *why = WHY(P, "%s was left a pending sum for its readers; %s at %s needs it whole", sv->name,
	                      op_table[op->kind].name, pos_str(P, op->pos));
	if ((v = reshard(P, v, &sv->spec, op->pos, why)) < 0)
		return -1;
	P->dst->values.a[v].name = arena_strdup(&P->dst->arena, sv->name);
	P->cur[src] = v;
	return v;
}

/* The pending sums op can carry through instead of reducing its operands
 * first: it is linear in them (add and sub of operands partial alike, or
 * of a pending and a whole one (partition_add_pending); neg,
 * copy, float casts; mul or div by a value that is not partial).  Sums moved
 * past such ops are reduced once, later, and in the result's dtype (so a
 * gradient cast to bf16 is reduced in bf16).  The mask kept, or 0. */
static uint8_t linear_partial(const Part *P, const Op *op, const Axes *fa, int nf)
{
	const Spec *s[2] = {NULL, NULL};
	for (int i = 0; i < op->nin && i < 2; i++)
		if (P->src->values.a[op->in[i]].kind != VK_CONST)
			s[i] = &P->dst->values.a[P->cur[op->in[i]]].spec;
	unsigned p0 = s[0] && s[0]->reduce == REDUCE_SUM ? s[0]->partial : 0;
	unsigned p1 = s[1] && s[1]->reduce == REDUCE_SUM ? s[1]->partial : 0;
	unsigned keep = 0;
	switch (op->kind) {
	case OP_NEG:
	case OP_COPY:
	case OP_TRANSPOSE: keep = p0; break;
	case OP_CAST: keep = dtype_is_float(op->attr->dtype) && dtype_is_float(P->src->values.a[op->in[0]].dtype) ? p0 : 0; break;
	case OP_ADD:
	case OP_SUB:
		if (s[0] && s[1] && (s[0]->partial == p0) && (s[1]->partial == p1)) /* no pending max */
			keep = partition_add_pending(P->src, op, p0, p1, P->defer);
		break;
	case OP_MUL: keep = s[1] && s[1]->partial ? (s[0] && s[0]->partial ? 0 : p1) : p0; break;
	case OP_DIV: keep = s[1] && s[1]->partial ? 0 : p0; break;
	default: break;
	}
	for (int f = 0; f < nf; f++) /* an axis that splits a dim cannot also be pending */
		for (int k = 0; k < fa[f].n; k++)
			keep &= ~(1u << fa[f].ax[k]);
	return (uint8_t)keep;
}

/* An operand is resharded once for ops close together: dst value v moved
 * to spec `to` for one of the last REUSE_SPAN src ops (counted from its
 * last reuse) is taken as moved (three einsums reading one gathered
 * activation gather it once); the moved value lives until its last such
 * reader, so farther readers move it again rather than keep it alive
 * across the step.  The moves of a value are chained, the one read
 * latest first. */
enum { REUSE_SPAN = 16 };

static int reshard_again(Part *P, int v, const Spec *to)
{
	int *link = v < P->moved_head.n ? &P->moved_head.a[v] : NULL; /* the link to move k */
	for (int k = link ? *link : -1; k >= 0; link = &P->moves.a[k].next, k = *link) {
		Moved *m = &P->moves.a[k];
		if (P->op_at - m->op > REUSE_SPAN)
			break; /* the chain runs latest read first: the rest are older */
		if (spec_eq(&m->spec, to)) { /* read again now: to the chain's front */
			*link = m->next, m->next = P->moved_head.a[v], P->moved_head.a[v] = k;
			m->op = P->op_at;
			return m->to;
		}
	}
	return -1;
}

static void remember_move(Part *P, int v, const Spec *to, int moved)
{
	while (P->moved_head.n <= v)
		vec_push(&P->moved_head, -1);
	Moved m = {moved, P->moved_head.a[v], P->op_at, *to};
	vec_push(&P->moves, m);
	P->moved_head.a[v] = P->moves.n - 1;
}

/* Operand i of op, resharded to what the factors need and masked where an
 * unevenly split reduction would read its padding. */
static int prepare_operand(Part *P, const Op *op, int i, const FactorRule *r, const Axes *fa, uint8_t keep)
{
	const Value *sv = &P->src->values.a[op->in[i]];
	int v = P->cur[op->in[i]];
	if (sv->kind == VK_CONST)
		return v;
	int t = factor_tensor(r, i);
	Spec want;
	factors_spec(P->src, r, t, sv->shape.rank, fa, &want);
	if (!keep && P->dst->values.a[v].spec.partial && !sv->spec.partial &&
	    (v = settle(P, op->in[i], v, op)) < 0)
		return -1;
	const Value *dv = &P->dst->values.a[v];
	if (keep && dv->spec.partial)
		want.partial = keep, want.reduce = REDUCE_SUM;
	if (!spec_eq(&dv->spec, &want)) {
		const char *why = WHY(P, "operand %d (%s) of %s at %s is %s; the op needs %s", i, sv->name,
		                      op_table[op->kind].name, pos_str(P, op->pos), spec_str(P, &dv->spec),
		                      spec_str(P, &want));
		int again = reshard_again(P, v, &want);
		if (again >= 0) {
			v = again;
		} else {
			int64_t before = P->moved;
			int from = v;
			if ((v = reshard(P, v, &want, op->pos, why)) < 0)
				return -1;
			remember_move(P, from, &want, v);
			warn_conflict(P, op, sv, &want, P->moved - before);
		}
	}
	if (keep && !P->dst->values.a[v].spec.partial && (op->kind == OP_ADD || op->kind == OP_SUB))
		return spread_over_replicas(P, op, v, keep);
	for (int d = 0; d < sv->shape.rank; d++)
		for (int k = 0; k < r->nfd[t][d]; k++) {
			int f = r->fd[t][d][k];
			if (r->kind[f] != FK_REDUCE || !fa[f].n || r->size[f] % axes_prod(&P->src->mesh, &fa[f]) == 0)
				continue;
			Attr at = {0};
			at.spec = want;
			at.global = sv->shape;
			at.value = r->reduce[f] == REDUCE_MAX ? -INFINITY : 0;
			const char *why = WHY(P, "%s is split unevenly over a reduced dim of %s at %s: padding set to %g",
			                      sv->name, op_table[op->kind].name, pos_str(P, op->pos), at.value);
			return emit(P, OP_MASK, &v, 1, &at, &want, op->pos, why);
		}
	return v;
}

/* Attributes of the local op: shapes that are global in the source become local. */
static void localize_attr(Part *P, const Op *op, Attr *at, const Shape *local_out, const Shape *local_in)
{
	*at = *op->attr;
	if (at->eq)
		at->eq = arena_strdup(&P->dst->arena, at->eq);
	if (op->kind == OP_RESHAPE || op->kind == OP_BROADCAST_TO)
		at->shape = *local_out;
	if (op->kind == OP_SLICE)
		for (int d = 0; d < local_in->rank; d++)
			if (at->start[d] == 0 && at->stride[d] <= 1 && at->limit[d] > local_in->dim[d])
				at->limit[d] = local_in->dim[d];
}

/* reduce_mean over split dims ran as a local sum: divide by the global count. */
static int scale_mean(Part *P, const Op *op, int v)
{
	const Shape *gs = &P->src->values.a[op->in[0]].shape;
	double count = 1;
	for (int k = 0; k < op->attr->naxes; k++)
		count *= (double)gs->dim[op->attr->axes[k]];
	Shape scalar = {0};
	Spec s = P->dst->values.a[v].spec; /* graph_value may move the values */
	int c = graph_value(P->dst, fmt(P, "%%const%d", P->dst->values.n), P->dst->values.a[v].dtype, &scalar,
	                    VK_CONST, op->pos);
	P->dst->values.a[c].cval = 1.0 / count;
	int ins[2] = {v, c};
	return emit(P, OP_MUL, ins, 2, NULL, &s, op->pos,
	            WHY(P, "reduce_mean at %s over split dims: local sums divided by the global count", pos_str(P, op->pos)));
}

/* The local op's shape rule must give the shape the spec says (an internal check). */
static int check_local(Part *P, int oid)
{
	const Op *op = &P->dst->ops.a[oid];
	const Value *v = &P->dst->values.a[op->out];
	Shape s;
	DType t;
	if (op_table[op->kind].shape(P->dst, op, &s, &t, P->d) != 0)
		return -1;
	if (!shape_eq(&s, &v->shape)) {
		char a[128], b[128];
		shape_format(&s, a, sizeof a), shape_format(&v->shape, b, sizeof b);
		diag_error(P->d, op->pos, "internal: local %s gives %s, its sharding says %s", op_table[op->kind].name, a, b);
		return -1;
	}
	return 0;
}

/* The local op itself on prepared operands; its result is sharded `res`. */
int emit_local_op(Part *P, const Op *op, const int *in, const Spec *res, bool mean_split, const Attr *extra)
{
	const Value *out = &P->src->values.a[op->out];
	Shape local;
	spec_local_shape(res, &P->src->mesh, &out->shape, &local);
	Attr at;
	localize_attr(P, op, &at, &local, &P->dst->values.a[in[0]].shape);
	if (extra)
		at = *extra;
	if (op->kind == OP_SOFTMAX_CROSS_ENTROPY || op->kind == OP_SOFTMAX_CROSS_ENTROPY_GRAD) {
		/* skips the labels' padded positions */
		at.reduce = 1;
		at.spec = P->dst->values.a[in[1]].spec;
		at.global = P->dst->values.a[in[1]].global;
	}
	OpKind kind = mean_split ? OP_REDUCE_SUM : op->kind;
	char buf[256];
	int v = new_value(P, local_name(P, out->name, (int)strlen(out->name), -1, buf, sizeof buf), out->dtype,
	                  &out->shape, res, VK_INTER, op->pos);
	int oid = graph_op(P->dst, kind, in, op->nin, v, op->pos);
	*P->dst->ops.a[oid].attr = at;
	if (mean_split)
		v = scale_mean(P, op, v);
	return check_local(P, oid) == 0 ? v : -1;
}

/* The local result's sharding under the factor axes: split reduction factors
 * make it partial. */
static void result_spec(const Part *P, const Op *op, const FactorRule *r, const Axes *fa, Spec *res, bool *mean_split)
{
	factors_spec(P->src, r, r->res, P->src->values.a[op->out].shape.rank, fa, res);
	*mean_split = false;
	for (int f = 0; f < r->nf; f++)
		if ((r->kind[f] == FK_REDUCE || r->kind[f] == FK_GATHER) && fa[f].n) {
			for (int k = 0; k < fa[f].n; k++)
				res->partial |= (uint8_t)(1u << fa[f].ax[k]);
			res->reduce = r->reduce[f];
			*mean_split |= op->kind == OP_REDUCE_MEAN;
		}
}

/* Seconds to move a tensor like v from `from` to `to`: the reshard plan
 * priced on the mesh's hardware profile (cost_model/). */
static double move_seconds(Part *P, const Value *v, const Spec *from, const Spec *to)
{
	if (spec_eq(from, to))
		return 0;
	Value tmp = *v;
	tmp.spec = *from;
	Diag quiet; /* a move the planner refuses is priced out, not reported */
	diag_init(&quiet);
	quiet.quiet = true;
	const ReshardPlan *plan = plan_for(P, &tmp, to, &quiet);
	return plan ? cost_reshard_seconds(&P->hw, &P->dst->mesh, plan) : 1e30;
}

/* What an op costs under factor axes fa: the time to reshard its operands
 * (*operands) and, in all, with its result's reshard to its sharding. */
static double option_seconds(Part *P, const Op *op, const FactorRule *r, const Axes *fa, double *operands)
{
	double total = 0;
	for (int i = 0; i < op->nin; i++) {
		const Value *sv = &P->src->values.a[op->in[i]];
		if (sv->kind == VK_CONST)
			continue;
		Spec want;
		factors_spec(P->src, r, factor_tensor(r, i), sv->shape.rank, fa, &want);
		const Value *dv = &P->dst->values.a[P->cur[op->in[i]]];
		total += move_seconds(P, dv, &dv->spec, &want);
	}
	*operands = total;
	const Value *out = &P->src->values.a[op->out];
	Spec res;
	bool mean;
	result_spec(P, op, r, fa, &res, &mean);
	return total + move_seconds(P, out, &res, &out->spec);
}

/* Does s split no dim and sum over no axis? */
static bool spec_whole(const Spec *s) { return !(spec_dim_axes(s) | s->partial); }

/* Step 1 by cost: the result's split first, or the operands' first —
 * whichever takes less time on the hardware profile; on a tie, the one that
 * leaves the operands where they are (a pending sum reduce-scattered rather
 * than its operands gathered); then the result's. */
static void choose_cheapest(Part *P, const Op *op, const FactorRule *r, Axes *fa)
{
	Axes other[MAX_FACTORS];
	choose_factors(P, op, r, fa, true);
	bool ins_whole = true;
	for (int i = 0; i < op->nin && ins_whole; i++)
		ins_whole = spec_whole(&P->src->values.a[op->in[i]].spec);
	if (ins_whole || spec_whole(&P->src->values.a[op->out].spec))
		return; /* one side offers nothing: both orders choose alike */
	choose_factors(P, op, r, other, false);
	if (memcmp(fa, other, sizeof other) == 0)
		return;
	double in_a, in_b, a = option_seconds(P, op, r, fa, &in_a), b = option_seconds(P, op, r, other, &in_b);
	if (b < a * (1 - 1e-9) || (b <= a * (1 + 1e-9) && in_b < in_a))
		memcpy(fa, other, sizeof other);
}

/* s without the mesh axes of size 1, which split and sum nothing. */
static Spec without_unit_axes(const Spec *s, const Mesh *m)
{
	Spec t = *s;
	t.open = 0;
	for (int d = 0; d < t.rank; d++) {
		int n = 0;
		for (int k = 0; k < s->nax[d]; k++)
			if (m->size[s->ax[d][k]] > 1)
				t.ax[d][n++] = s->ax[d][k];
		t.nax[d] = (uint8_t)n;
	}
	for (int a = 0; a < m->naxes; a++)
		if (m->size[a] == 1)
			t.partial &= (uint8_t)~(1u << a);
	if (!t.partial)
		t.reduce = 0;
	return t;
}

/* Leave dst value v, holding src value `src`, a pending sum: it may be
 * (P->defer) and only the sum is pending (its splits are the propagated ones). */
static bool left_pending(const Part *P, int src, int v)
{
	if (!P->defer[src])
		return false;
	const Mesh *m = &P->src->mesh;
	Spec have = without_unit_axes(&P->dst->values.a[v].spec, m);
	if (!have.partial || have.reduce != REDUCE_SUM)
		return false;
	Spec want = without_unit_axes(&P->src->values.a[src].spec, m);
	have.partial = 0, have.reduce = 0;
	return spec_eq(&have, &want);
}

static int partition_op(Part *P, int id)
{
	const Op *op = &P->src->ops.a[id];
	const Value *out = &P->src->values.a[op->out];
	FactorRule buf;
	const FactorRule *r = factor_rule_memo(P->rules, P->src, op, &buf);
	if (!r) {
		diag_error(P->d, op->pos, "expected an op of the model, found the collective %s", op_table[op->kind].name);
		return -1;
	}
	Axes fa[MAX_FACTORS];
	choose_cheapest(P, op, r, fa);
	Spec res;
	bool mean_split;
	result_spec(P, op, r, fa, &res, &mean_split);
	uint8_t keep = linear_partial(P, op, fa, r->nf);
	if (keep)
		res.partial |= keep, res.reduce = REDUCE_SUM;
	if (out->spec.partial & ~res.partial) {
		if (!out->spec_pos.line) /* a pass's annotation: the pass mispredicted */
			diag_error(P->d, op->pos, "internal: expected %s to leave %s the pending sum weight-update sharding "
			           "annotated, found it whole", op_table[op->kind].name, out->name);
		else
			diag_error(P->d, out->spec_pos, "expected a sharding %s can produce, found partial axes but it sums "
			           "over no dim split on them", op_table[op->kind].name);
		return -1;
	}
	int ins[64], nin = op->nin;
	int *in = nin <= 64 ? ins : xmalloc(sizeof(int) * (size_t)nin);
	for (int i = 0; i < nin; i++)
		if ((in[i] = prepare_operand(P, op, i, r, fa, keep)) < 0) {
			if (in != ins)
				free(in);
			return -1;
		}
	int v = lower_op(P, op, r, fa, in, &res, mean_split);
	if (in != ins)
		free(in);
	if (v < 0)
		return -1;
	bool pending = left_pending(P, op->out, v);
	if (!spec_eq(&P->dst->values.a[v].spec, &out->spec) && !pending) {
		const char *why = WHY(P, "%s from %s at %s comes out %s; %s %s", out->name, op_table[op->kind].name,
		                      pos_str(P, op->pos), spec_str(P, &P->dst->values.a[v].spec),
		                      out->has_spec ? "it is annotated" : "propagation chose", spec_str(P, &out->spec));
		Spec local = P->dst->values.a[v].spec;
		int64_t before = P->moved;
		if ((v = reshard(P, v, &out->spec, op->pos, why)) < 0)
			return -1;
		local.partial = 0; /* a pending sum reduced is the op's nature, not a conflict */
		Spec want = out->spec;
		want.partial = 0;
		if (!spec_eq(&local, &want))
			warn_conflict(P, op, out, &local, P->moved - before);
	}
	if (!pending) /* a sum left pending keeps its %local name: settle names the reduced value */
		P->dst->values.a[v].name = arena_strdup(&P->dst->arena, out->name);
	P->cur[op->out] = v;
	return 0;
}

static void copy_mesh(const Mesh *from, Graph *dst)
{
	Mesh *m = &dst->mesh;
	*m = *from;
	for (int a = 0; a < m->naxes; a++) {
		m->name[a] = arena_strdup(&dst->arena, from->name[a]);
		if (from->pre[a])
			m->base[a] = arena_strdup(&dst->arena, from->base[a]);
	}
	if (from->hardware)
		m->hardware = arena_strdup(&dst->arena, from->hardware);
	if (from->devices)
		mesh_finish(m, &dst->arena, from->devices);
}

/* Inputs, params and constants: their local shards, named as in the source. */
static void partition_leaves(Part *P)
{
	const Graph *g = P->src;
	for (int v = 0; v < g->values.n; v++) {
		const Value *sv = &g->values.a[v];
		if (sv->producer >= 0)
			continue;
		int id = new_value(P, sv->name, sv->dtype, &sv->shape, &sv->spec, sv->kind, sv->pos);
		Value *dv = &P->dst->values.a[id];
		dv->has_spec = sv->has_spec;
		dv->spec_pos = sv->spec_pos;
		dv->init = sv->init;
		dv->cval = sv->cval;
		P->cur[v] = id;
	}
}

/* Positions in dst name the source file through dst's own copy of its name,
 * so the program outlives the model. */
static void own_positions(const Graph *src, Graph *dst)
{
	for (int v = 0; v < dst->values.n; v++) {
		Value *val = &dst->values.a[v];
		if (val->pos.file == src->file)
			val->pos.file = dst->file;
		if (val->spec_pos.file == src->file)
			val->spec_pos.file = dst->file;
	}
	for (int i = 0; i < dst->ops.n; i++)
		if (dst->ops.a[i].pos.file == src->file)
			dst->ops.a[i].pos.file = dst->file;
}

int partition(const Graph *src, Graph *dst, int *map, const HwProfile *hw, Diag *d)
{
	return partition_shared(src, dst, map, hw, NULL, d);
}

int partition_shared(const Graph *src, Graph *dst, int *map, const HwProfile *hw, const PassShare *share, Diag *d)
{
	graph_init(dst);
	dst->name = src->name ? arena_strdup(&dst->arena, src->name) : NULL;
	dst->file = src->file ? arena_strdup(&dst->arena, src->file) : NULL;
	copy_mesh(&src->mesh, dst);
	vec_reserve(&dst->values, 2 * src->values.n + 16); /* about what a partition makes: no moves */
	vec_reserve(&dst->ops, 2 * src->ops.n + 16);
	Part P = {.src = src, .dst = dst, .cur = xcalloc((size_t)src->values.n + 1, sizeof(int)), .d = d,
	          .defer = xcalloc((size_t)src->values.n + 1, 1), .terse = d->terse,
	          .plans = share && share->plans ? share->plans : reshard_cache_new(), .rules = share ? share->rules : NULL};
	partition_deferrable(src, P.defer);
	if (hw)
		P.hw = *hw;
	else
		hw_profile_builtin(&P.hw, "tpu-v3");
	partition_leaves(&P);
	int rc = 0;
	for (int i = 0; i < src->ops.n && rc == 0; i++) {
		int first = dst->ops.n;
		P.op_at = i;
		rc = partition_op(&P, i);
		for (int k = first; k < dst->ops.n; k++)
			dst->ops.a[k].src_op = i;
	}
	for (int i = 0; i < src->outputs.n && rc == 0; i++)
		vec_push(&dst->outputs, P.cur[src->outputs.a[i]]);
	if (map)
		memcpy(map, P.cur, sizeof(int) * (size_t)src->values.n);
	own_positions(src, dst);
	if (!share || P.plans != share->plans)
		reshard_cache_free(P.plans);
	free(P.cur);
	free(P.defer);
	vec_free(&P.moved_head), vec_free(&P.moves);
	return rc;
}

int value_like(Graph *g, int v, int d, int64_t size)
{
	const Value *s = &g->values.a[v];
	Shape local = s->shape, global = s->global;
	Spec spec = s->spec;
	DType t = s->dtype;
	if (size >= 0)
		local.dim[d] = global.dim[d] = size;
	char *name = arena_printf(&g->arena, "%.*s%%%d", root_len(s->name), s->name, g->values.n);
	Pos p = s->pos;
	int nv = graph_value(g, name, t, &local, VK_INTER, p);
	g->values.a[nv].spec = spec, g->values.a[nv].global = global;
	return nv;
}
