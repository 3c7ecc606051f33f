/* train.c: the training step — forward, autodiff, gradient casts and clipping, the optimizer as ops, carried state.
 *
 * train_build appends to the model's graph, so the step is one graph that
 * propagation and partitioning treat like any other:
 *   1. autodiff (autodiff.h) gives each param its gradient d%NAME; with
 *      recompute: true the backward then reads the forward's results
 *      (but the checkpoints) from copies made in the backward, with
 *      recompute: selective those cheap for their size;
 *   2. grad_dtype: the gradient is cast to that dtype (where a data-parallel
 *      run reduces it) and back to f32, in which every update is computed;
 *   3. clip_global_norm X: s = min(1, X / (sqrt(Σ over params of Σ g²) + 1e-6)),
 *      every gradient times s;
 *   4. the optimizer, per param, as elementwise ops and (LAMB) per-tensor
 *      norms; Adam-family bias corrections read a step counter carried as
 *      state (opt%step, 0 before the first step, so the step number t is
 *      opt%step + 1);
 *   5. outputs: the loss, then every next param and next state; each is
 *      carried to its leaf for the next step (Train.carry_*).
 * The formulas are in docs/training.md. */
#include "train.h"

#include "autodiff.h"
#include "../spmd/ops.h"
#include "../spmd/tensor.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	Graph *g;
	Diag *d;
	Train *t;
	Pos pos;     /* of the ops being made */
	bool failed;
	int bc1, bc2; /* Adam-family bias corrections 1 - beta^t, or -1 */
} Tb;

/* A new op (result named `name`, or a temporary) whose shape comes from its
 * shape rule; the result's id. */
static int emit(Tb *B, OpKind k, const int *in, int nin, const Attr *at, const char *name)
{
	Attr attr = {0};
	if (at)
		attr = *at;
	Op tmp = {.kind = k, .nin = nin, .in = (int *)in, .out = -1, .attr = &attr, .pos = B->pos};
	Shape s;
	DType t;
	if (B->failed || op_table[k].shape(B->g, &tmp, &s, &t, B->d) != 0) {
		B->failed = true;
		return in[0];
	}
	char buf[32];
	snprintf(buf, sizeof buf, "%%t%d", B->g->values.n);
	int v = graph_value(B->g, name ? name : buf, t, &s, VK_INTER, B->pos);
	int id = graph_op(B->g, k, in, nin, v, B->pos);
	*B->g->ops.a[id].attr = attr;
	return v;
}

static int konst(Tb *B, double c)
{
	char name[32];
	snprintf(name, sizeof name, "%%tc%d", B->g->values.n);
	int v = graph_value(B->g, name, DT_F32, &(Shape){0}, VK_CONST, B->pos);
	B->g->values.a[v].cval = c;
	return v;
}

static int bin(Tb *B, OpKind k, int a, int b) { return emit(B, k, (int[]){a, b}, 2, NULL, NULL); }
static int un(Tb *B, OpKind k, int x) { return emit(B, k, &x, 1, NULL, NULL); }
static int add(Tb *B, int a, int b) { return bin(B, OP_ADD, a, b); }
static int mul(Tb *B, int a, int b) { return bin(B, OP_MUL, a, b); }
static int scale(Tb *B, int x, double c) { return bin(B, OP_MUL, x, konst(B, c)); }

static int cast(Tb *B, int x, DType t)
{
	if (B->g->values.a[x].dtype == t)
		return x;
	Attr at = {.dtype = t};
	return emit(B, OP_CAST, &x, 1, &at, NULL);
}

/* The sum of every element of x: a scalar. */
static int sum_all(Tb *B, int x)
{
	Attr at = {0};
	for (int d = 0; d < B->g->values.a[x].shape.rank; d++)
		at.axes[at.naxes++] = d;
	return emit(B, OP_REDUCE_SUM, &x, 1, &at, NULL);
}

static int norm(Tb *B, int x) { return un(B, OP_SQRT, sum_all(B, un(B, OP_SQUARE, x))); }

static void name_value(Tb *B, int v, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Name value v (a fresh op result) by a printf format. */
static void name_value(Tb *B, int v, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (!B->failed)
		B->g->values.a[v].name = arena_strdup(&B->g->arena, buf);
}

/* A new optimizer state of param p's shape, f32, zeros (sharded like p:
 * train_shard_states, once the step is built). */
static int new_state(Tb *B, int p, const char *prefix)
{
	char buf[512];
	const Value *pv = &B->g->values.a[p];
	snprintf(buf, sizeof buf, "%s%%%s", prefix, pv->name);
	Shape s = pv->shape;
	return graph_value(B->g, buf, DT_F32, &s, VK_STATE, pv->pos);
}

/* ---- the optimizers ---- */

/* state = beta·state + coef·x, named "PREFIX%NAME%next"; recorded as state i of tp. */
static int moment(Tb *B, TrainParam *tp, int i, const char *prefix, double beta, double coef, int x)
{
	int s = new_state(B, tp->param, prefix);
	int cx = coef == 1 ? x : scale(B, x, coef), bs = scale(B, s, beta), next = add(B, bs, cx);
	name_value(B, next, "%s%%%s%%next", prefix, B->g->values.a[tp->param].name);
	tp->state[i] = s, tp->next_state[i] = next;
	tp->nstate = i + 1;
	return next;
}

/* Adam's step direction (m̂ / (sqrt(v̂) + eps)) from the gradient gg. */
static int adam_direction(Tb *B, TrainParam *tp, int gg)
{
	Train *t = B->t;
	int m = moment(B, tp, 0, "adam_m", t->beta1, 1 - t->beta1, gg);
	int v = moment(B, tp, 1, "adam_v", t->beta2, 1 - t->beta2, mul(B, gg, gg));
	int mhat = bin(B, OP_DIV, m, B->bc1), vhat = bin(B, OP_DIV, v, B->bc2);
	int eps = konst(B, t->eps), root = un(B, OP_SQRT, vhat);
	return bin(B, OP_DIV, mhat, add(B, root, eps));
}

/* LAMB's trust ratio ||w|| / ||u||, 1 when either norm is 0:
 * ok·nw / (nu + 1 − ok) + (1 − ok) with ok = (nw > 0)·(nu > 0). */
static int trust_ratio(Tb *B, int w, int u)
{
	int nw = norm(B, w), nu = norm(B, u);
	int z = konst(B, 0), pu = bin(B, OP_GREATER, nu, z), z2 = konst(B, 0), pw = bin(B, OP_GREATER, nw, z2);
	int ok = mul(B, pw, pu);
	int off = bin(B, OP_SUB, konst(B, 1), ok);
	int den = add(B, nu, off), num = mul(B, ok, nw);
	return add(B, bin(B, OP_DIV, num, den), off);
}

/* The f32 update step of one param: w - lr * direction. */
static int update(Tb *B, TrainParam *tp, int w, int g)
{
	Train *t = B->t;
	double wd = t->weight_decay;
	bool coupled = t->opt == OPT_SGD || t->opt == OPT_MOMENTUM || t->opt == OPT_ADAM;
	int gg = coupled && wd > 0 ? add(B, g, scale(B, w, wd)) : g, dir;
	switch (t->opt) {
	case OPT_SGD: dir = gg; break;
	case OPT_MOMENTUM: dir = moment(B, tp, 0, "momentum", t->beta1, 1, gg); break;
	case OPT_ADAM: dir = adam_direction(B, tp, gg); break;
	default: /* adamw, lamb: decoupled weight decay */
		dir = adam_direction(B, tp, gg);
		if (wd > 0)
			dir = add(B, dir, scale(B, w, wd));
		if (t->opt == OPT_LAMB)
			dir = mul(B, dir, trust_ratio(B, w, dir));
		break;
	}
	return bin(B, OP_SUB, w, scale(B, dir, t->lr));
}

/* The update ops of tp, reading gradient g (f32). */
static void update_param(Tb *B, TrainParam *tp, int g)
{
	Graph *gr = B->g;
	B->pos = gr->values.a[tp->param].pos;
	tp->grad_in = g;
	tp->first_op = gr->ops.n;
	DType dt = gr->values.a[tp->param].dtype;
	int next = cast(B, update(B, tp, cast(B, tp->param, DT_F32), g), dt);
	name_value(B, next, "%s%%next", gr->values.a[tp->param].name);
	tp->next = next;
	tp->nops = gr->ops.n - tp->first_op;
}

/* ---- the step ---- */

/* Each gradient in grad_dtype ("NAME%grad": a cast, or a copy when the
 * dtype is already right — the place where the gradient's reduction across
 * replicas belongs), then back to f32 for the update. */
static void cast_grads(Tb *B, const int *order, int *gin)
{
	for (int j = 0; j < B->t->nparams; j++) {
		int i = order[j];
		TrainParam *tp = &B->t->params[i];
		const Value *g = &B->g->values.a[tp->grad];
		B->pos = B->g->values.a[tp->param].pos;
		int r = g->dtype == B->t->grad_dtype ? un(B, OP_COPY, tp->grad) : cast(B, tp->grad, B->t->grad_dtype);
		name_value(B, r, "%s%%grad", B->g->values.a[tp->param].name);
		tp->reduced = r;
		gin[i] = cast(B, r, DT_F32);
	}
}

/* clip_global_norm: every gradient times min(1, clip / (global norm + 1e-6)). */
static void clip_grads(Tb *B, int *gin)
{
	Train *t = B->t;
	B->pos = t->pos;
	int ss = -1;
	for (int i = 0; i < t->nparams; i++) {
		int s = sum_all(B, un(B, OP_SQUARE, gin[i]));
		ss = ss < 0 ? s : add(B, ss, s);
	}
	int tiny = konst(B, 1e-6), root = un(B, OP_SQRT, ss), nrm = add(B, root, tiny);
	int clip = konst(B, t->clip), q = bin(B, OP_DIV, clip, nrm), one = konst(B, 1);
	t->clip_scale = bin(B, OP_MIN, one, q);
	name_value(B, t->clip_scale, "opt%%clip_scale");
	for (int i = 0; i < t->nparams; i++)
		gin[i] = mul(B, gin[i], t->clip_scale);
}

/* The step counter and the bias corrections 1 - beta1^t, 1 - beta2^t. */
static void step_counter(Tb *B)
{
	Train *t = B->t;
	B->pos = t->pos;
	t->step = graph_value(B->g, "opt%step", DT_F32, &(Shape){0}, VK_STATE, t->pos);
	t->next_step = add(B, t->step, konst(B, 1));
	name_value(B, t->next_step, "opt%%step%%next");
	/* one statement per value made: C leaves the order of a call's arguments
	 * open, and the values' numbering (names, ties in the step's order) must
	 * not depend on the compiler */
	int b1 = konst(B, t->beta1), p1 = bin(B, OP_POW, b1, t->next_step), one1 = konst(B, 1);
	B->bc1 = bin(B, OP_SUB, one1, p1);
	int b2 = konst(B, t->beta2), p2 = bin(B, OP_POW, b2, t->next_step), one2 = konst(B, 1);
	B->bc2 = bin(B, OP_SUB, one2, p2);
}

/* Value `from` becomes leaf `to` for the next step; it is an output of the step. */
static void carry(Tb *B, int from, int to)
{
	Train *t = B->t;
	t->carry_from[t->ncarry] = from;
	t->carry_to[t->ncarry++] = to;
	vec_push(&B->g->outputs, from);
}

/* The step's outputs and carries: loss, next params, next states, next step. */
static void set_outputs(Tb *B)
{
	Graph *g = B->g;
	Train *t = B->t;
	int n = 3 * t->nparams + 1;
	t->carry_from = arena_alloc(&g->arena, sizeof(int) * (size_t)n);
	t->carry_to = arena_alloc(&g->arena, sizeof(int) * (size_t)n);
	g->outputs.n = 0;
	vec_push(&g->outputs, t->loss);
	for (int i = 0; i < t->nparams; i++)
		carry(B, t->params[i].next, t->params[i].param);
	for (int i = 0; i < t->nparams; i++)
		for (int k = 0; k < t->params[i].nstate; k++)
			carry(B, t->params[i].next_state[k], t->params[i].state[k]);
	if (t->step >= 0)
		carry(B, t->next_step, t->step);
}

typedef struct {
	int producer, param;
} GradAt;

static int by_producer(const void *x, const void *y)
{
	const GradAt *a = x, *b = y;
	return a->producer != b->producer ? (a->producer > b->producer) - (a->producer < b->producer) : a->param - b->param;
}

/* The params in the order the backward pass makes their gradients (by
 * the index of the gradient's op; ties and gradients that are leaves in
 * value order): the step casts and updates them in that order, so a
 * device's update of one param never waits behind that of a param whose
 * gradient (and its reduction across replicas) comes later. */
static int *grad_order(const Tb *B)
{
	const Train *t = B->t;
	int n = t->nparams, *order = xmalloc(sizeof(int) * (size_t)(n + 1));
	GradAt *at = xmalloc(sizeof(GradAt) * (size_t)(n + 1));
	for (int i = 0; i < n; i++)
		at[i] = (GradAt){B->g->values.a[t->params[i].grad].producer, i};
	qsort(at, (size_t)n, sizeof *at, by_producer);
	for (int i = 0; i < n; i++)
		order[i] = at[i].param;
	free(at);
	return order;
}

/* The params of g in value order, with their gradients. */
static void collect_params(Tb *B, const int *grad)
{
	Train *t = B->t;
	for (int v = 0; v < B->g->values.n; v++)
		t->nparams += B->g->values.a[v].kind == VK_PARAM;
	t->params = arena_alloc(&B->g->arena, sizeof(TrainParam) * (size_t)(t->nparams + 1));
	int i = 0;
	for (int v = 0; v < B->g->values.n && i < t->nparams; v++)
		if (B->g->values.a[v].kind == VK_PARAM)
			t->params[i++] = (TrainParam){.param = v, .grad = grad[v], .state = {-1, -1}, .next_state = {-1, -1}};
}

/* Value v as a backward op reads it: v itself unless a forward op (one of
 * the model's, id < nmodel in old) made it and it is no checkpoint; else
 * its copy, made now with the copies of what it reads (depth first, on an
 * explicit stack: a forward may be long). */
typedef struct {
	Graph *g;
	const Op *old;
	const int *prod; /* per value: its producer in old, or -1 */
	const bool *keep;
	int *copy;       /* per value: its recomputed copy, or -1 */
	int *stack;
} Recompute;

static bool recomputes(const Recompute *R, int v) { return R->prod[v] >= 0 && !R->keep[v] && R->copy[v] < 0; }

static void push_copy(Recompute *R, int k)
{
	Graph *g = R->g;
	Op op = R->old[k];
	int *in = arena_alloc(&g->arena, sizeof(int) * ((size_t)op.nin + 1));
	for (int j = 0; j < op.nin; j++) {
		in[j] = R->copy[op.in[j]] >= 0 ? R->copy[op.in[j]] : op.in[j];
		g->values.a[in[j]].nuses++;
	}
	Value x = g->values.a[op.out]; /* graph_value may move the array */
	char name[512];
	snprintf(name, sizeof name, "%s%%re", x.name);
	int w = graph_value(g, name, x.dtype, &x.shape, VK_INTER, x.pos);
	Value *c = &g->values.a[w]; /* the annotation too, so the copy is split as the value was */
	c->has_spec = x.has_spec, c->spec = x.spec, c->spec_pos = x.spec_pos, c->priority = x.priority;
	c->shard_as = x.shard_as, c->shard_as_pos = x.shard_as_pos;
	Attr *a = arena_alloc(&g->arena, sizeof *a);
	*a = *op.attr;
	op.in = in, op.out = w, op.attr = a;
	vec_push(&g->ops, op);
	c->producer = g->ops.n - 1;
	R->copy[R->old[k].out] = w;
}

static int recomputed(Recompute *R, int v)
{
	if (R->copy[v] >= 0 || !recomputes(R, v))
		return R->copy[v] >= 0 ? R->copy[v] : v;
	int n = 0;
	R->stack[n++] = R->prod[v];
	while (n > 0) {
		int top = R->stack[n - 1], pushed = 0;
		if (R->copy[R->old[top].out] >= 0) {
			n--;
			continue;
		}
		for (int j = 0; j < R->old[top].nin; j++)
			if (recomputes(R, R->old[top].in[j]))
				R->stack[n++] = R->prod[R->old[top].in[j]], pushed = 1;
		if (!pushed)
			push_copy(R, top), n--;
	}
	return R->copy[v];
}

/* recompute: selective.  A forward result the backward reads is kept
 * when it is a checkpoint or costs much for its size to make again: its
 * work — its op's FLOPs (graph_op_flops) and one per element written,
 * plus the work of each operand not kept, back to the kept values and
 * the leaves — is over SELECT_WORK per element of it.  The rest is made
 * again in the backward: on a transformer the attention's probabilities
 * (from the kept q and k: about 2 x head width per element), the norms'
 * results and the MLP's activation (a few per element), not the
 * projections (2 x d_model per element).  One pass over the forward. */
enum { SELECT_WORK = 512 };

static void select_kept(const Graph *g, int nmodel, bool *keep)
{
	int nv = g->values.n;
	bool *read = xcalloc((size_t)nv + 1, sizeof *read);
	double *work = xcalloc((size_t)nv + 1, sizeof *work);
	for (int i = nmodel; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++)
			read[g->ops.a[i].in[k]] = true;
	for (int i = 0; i < nmodel; i++) {
		const Op *op = &g->ops.a[i];
		double n = (double)shape_numel(&g->values.a[op->out].shape), w = graph_op_flops(g, op) + n;
		for (int k = 0; k < op->nin; k++)
			w += keep[op->in[k]] ? 0 : work[op->in[k]];
		work[op->out] = fmin(w, 1e300);
		keep[op->out] |= read[op->out] && w > SELECT_WORK * n;
	}
	free(read), free(work);
}

/* recompute: true.  Every backward op (ops from nmodel on, as autodiff
 * left them) reads the forward values it needs from copies of the forward
 * ops made in the backward, each just before its first reader there, but
 * for the checkpoints: the leaves and the residual stream (the operands
 * of the forward's layer_norm ops that an op made), which live from the
 * forward to the backward, as activation checkpointing keeps each layer's
 * input.  The forward's other results then die with the forward pass; a
 * copy lives over its readers in the backward.  Each forward op is copied
 * at most once: linear.  With selective, the values select_kept keeps are
 * read as they are too. */
static void recompute_forward(Graph *g, int nmodel, bool selective)
{
	int n = g->ops.n, nv = g->values.n, ne = 0;
	Op *old = xmalloc(sizeof(Op) * ((size_t)n + 1));
	memcpy(old, g->ops.a, sizeof(Op) * (size_t)n);
	int *prod = xmalloc(sizeof(int) * ((size_t)nv + 1)), *copy = xmalloc(sizeof(int) * ((size_t)nv + 1));
	bool *keep = xcalloc((size_t)nv + 1, sizeof(bool));
	for (int v = 0; v < nv; v++)
		prod[v] = g->values.a[v].producer < nmodel ? g->values.a[v].producer : -1, copy[v] = -1;
	for (int i = 0; i < n; i++) {
		if (i < nmodel && old[i].kind == OP_LAYER_NORM)
			keep[old[i].in[0]] = true;
		ne += old[i].nin;
	}
	if (selective)
		select_kept(g, nmodel, keep);
	Recompute R = {g, old, prod, keep, copy, xmalloc(sizeof(int) * ((size_t)ne + 1))};
	g->ops.n = 0;
	for (int k = 0; k < n; k++) {
		Op op = old[k];
		if (k >= nmodel) {
			int *in = arena_alloc(&g->arena, sizeof(int) * ((size_t)op.nin + 1));
			for (int j = 0; j < op.nin; j++) {
				in[j] = recomputed(&R, op.in[j]);
				if (in[j] != op.in[j])
					g->values.a[op.in[j]].nuses--, g->values.a[in[j]].nuses++;
			}
			op.in = in;
		}
		vec_push(&g->ops, op);
		g->values.a[op.out].producer = g->ops.n - 1;
	}
	free(R.stack), free(old), free(prod), free(copy), free(keep);
}

int train_build(Graph *g, Diag *d)
{
	Train *t = g->train;
	if (!t || t->built)
		return t ? 0 : -1;
	if (t->recompute && g->pipeline) {
		diag_error(d, t->recompute_pos,
		           "expected recompute in the pipeline: section of a pipelined model (its stages recompute), found it in train:");
		return -1;
	}
	Tb B = {.g = g, .d = d, .t = t, .pos = t->pos, .bc1 = -1, .bc2 = -1};
	int *grad = xmalloc(sizeof(int) * (size_t)(g->values.n + 1)), nmodel = g->ops.n;
	int rc = autodiff(g, t->loss, grad, d);
	if (rc == 0 && t->recompute)
		recompute_forward(g, nmodel, t->recompute == RECOMPUTE_SELECTIVE);
	if (rc == 0)
		collect_params(&B, grad);
	free(grad);
	if (rc != 0)
		return -1;
	int *gin = xmalloc(sizeof(int) * (size_t)(t->nparams + 1)), *order = grad_order(&B);
	cast_grads(&B, order, gin);
	if (t->clip > 0)
		clip_grads(&B, gin);
	if (t->opt == OPT_ADAM || t->opt == OPT_ADAMW || t->opt == OPT_LAMB)
		step_counter(&B);
	for (int j = 0; j < t->nparams; j++)
		update_param(&B, &t->params[order[j]], gin[order[j]]);
	free(gin), free(order);
	set_outputs(&B);
	t->built = true;
	train_shard_states(g);
	if (B.failed || graph_verify(g, d) != 0) {
		diag_error(d, t->pos, "internal: the training step of this model could not be built");
		return -1;
	}
	return 0;
}

void train_shard_states(Graph *g)
{
	const Train *t = g->train;
	for (int i = 0; t && i < t->nparams; i++) {
		const Value *p = &g->values.a[t->params[i].param];
		for (int j = 0; j < t->params[i].nstate; j++) {
			Value *sv = &g->values.a[t->params[i].state[j]];
			sv->has_spec = p->has_spec, sv->spec = p->spec, sv->spec_pos = p->spec_pos, sv->priority = p->priority;
		}
	}
}

void train_tie_specs(Graph *g)
{
	const Train *t = g->train;
	for (int i = 0; t && i < t->ncarry; i++)
		g->values.a[t->carry_from[i]].spec = g->values.a[t->carry_to[i]].spec;
}

static int mapped(const int *map, int v) { return v < 0 ? -1 : map[v]; }

void train_map(const Graph *g, const int *map, Graph *prog)
{
	const Train *t = g->train;
	Train *p = arena_alloc(&prog->arena, sizeof *p);
	*p = *t;
	p->loss = mapped(map, t->loss);
	p->step = mapped(map, t->step), p->next_step = mapped(map, t->next_step);
	p->clip_scale = mapped(map, t->clip_scale);
	p->params = arena_alloc(&prog->arena, sizeof(TrainParam) * (size_t)(t->nparams + 1));
	for (int i = 0; i < t->nparams; i++) {
		const TrainParam *a = &t->params[i];
		p->params[i] = (TrainParam){.param = map[a->param], .grad = -1, .reduced = -1, .grad_in = -1,
		                            .first_op = -1, .next = map[a->next], .nstate = a->nstate};
		for (int k = 0; k < 2; k++)
			p->params[i].state[k] = mapped(map, a->state[k]), p->params[i].next_state[k] = mapped(map, a->next_state[k]);
	}
	p->carry_from = arena_alloc(&prog->arena, sizeof(int) * (size_t)(t->ncarry + 1));
	p->carry_to = arena_alloc(&prog->arena, sizeof(int) * (size_t)(t->ncarry + 1));
	for (int i = 0; i < t->ncarry; i++)
		p->carry_from[i] = map[t->carry_from[i]], p->carry_to[i] = map[t->carry_to[i]];
	prog->train = p;
}

void train_carry(const Graph *g, Tensor *vals)
{
	const Train *t = g->train;
	for (int i = 0; t && i < t->ncarry; i++) {
		Tensor *from = &vals[t->carry_from[i]], *to = &vals[t->carry_to[i]];
		tensor_free(to);
		*to = *from;
		*from = (Tensor){0};
	}
}
