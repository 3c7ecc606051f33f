/* pipe_program.c: the pipelined training step — microbatches, stages in the schedule's order, sends between stages.
 *
 * 1. Microbatches.  The model's ops are copied once per microbatch on
 *    slices of the inputs' dim 0 (ops that read no input once); the loss is
 *    the mean (reduce_sum: the sum) of the microbatches' losses.  The step
 *    is then built on that model as on any other (train_build): autodiff
 *    sums each param's gradient over the microbatches — the accumulation —
 *    before the one (sharded) update.
 * 2. Partitioning.  The step is propagated, its weight update sharded and
 *    partitioned exactly as an unpipelined one, on the mesh with the stage
 *    axis of size 1: tensor and data parallelism per stage, no collective
 *    over the stage axis.
 * 3. Order.  Each op belongs to a stage (spmd/pipeline_section.h, by
 *    position), a microbatch (the most late of what it reads) and a
 *    direction (forward, or the step's backward and update).  The schedule
 *    (cost_model/pipeline_cost.h) is simulated with unit times and its
 *    microbatch steps merged by start time into one order that every
 *    device's own order is a subsequence of; the ops are sorted by the step
 *    they belong to, stably (ops of no microbatch first).  An op of no
 *    microbatch step that reads a step's values (the update, the clip
 *    scale) comes after the latest of those steps.
 * 4. Sends.  A value read on another stage's devices reaches them by a
 *    collective_permute from its stage's devices to the reader's, placed
 *    where the step that makes it ends in the schedule (emit_ordered).
 *    Every device runs the projection of one
 *    order onto its own ops, so no collective waits for one that comes
 *    later on some member: the program cannot deadlock (spmd verify checks
 *    it again by simulation).
 * Each step is one pass over the program: linear. */
#include "pipe_program.h"

#include <limits.h>
#include <string.h>

#include "../cost_model/pipeline_cost.h"
#include "../spmd/ops.h"
#include "../spmd/pipeline_section.h"
#include "../train/train.h"
#include "partition.h"
#include "pipeline.h"

typedef struct {
	Graph *g;          /* the model with its built step */
	Graph *M;          /* the microbatched model, then its step */
	const Pipeline *pl;
	int m;
	Diag *d;
	int *cur;          /* per value of g's model and microbatch: M's value (v * m + i); unbatched: i = 0 */
	bool *batched;     /* per value of g: it depends on an input */
	int nfwd;          /* M's ops before the step's */
	int64_t D;         /* shards of the batch: microbatches are cut within each (slice_input) */
	Spec flat;         /* D > 1: the spec of a batched value reshaped to [D, rest] */
	int *tied;         /* per param of g and stage coordinate: its copy sent there (v * p + c), or -1 */
} Micro;

static int fail(Diag *d, Pos p, const char *what, const char *found)
{
	diag_error(d, p, "expected %s, found %s", what, found);
	return -1;
}

/* A copy of g's value v in M, named name. */
static int copy_value(Micro *u, int v, const char *name, const Shape *s)
{
	const Value *a = &u->g->values.a[v];
	int id = graph_value(u->M, name, a->dtype, s, a->kind, a->pos);
	Value *b = &u->M->values.a[id];
	a = &u->g->values.a[v];
	b->has_spec = a->has_spec, b->spec = a->spec, b->spec_pos = a->spec_pos, b->priority = a->priority;
	b->shard_as = a->shard_as, b->shard_as_pos = a->shard_as_pos;
	b->init = a->init, b->wus = a->wus, b->gather = a->gather, b->cval = a->cval;
	return id;
}

/* M's value for operand v of microbatch i: constants are made on first use. */
static int operand(Micro *u, int v, int i)
{
	int k = u->batched[v] ? v * u->m + i : v * u->m;
	if (u->cur[k] < 0 && u->g->values.a[v].kind == VK_CONST)
		u->cur[k] = copy_value(u, v, u->g->values.a[v].name, &u->g->values.a[v].shape);
	return u->cur[k];
}

/* Param v of g as model op k reads it.  A param read on several stage
 * coordinates (a tied embedding and output layer) belongs to the stage of
 * its first reader; the others read a copy made there, at the param's
 * position, which the sends carry to them once a step.  The copy's
 * gradient comes back the same way, summed over the microbatches on the
 * reader's stage first, and the one update runs on the param's stage. */
static int param_operand(Micro *u, int v, int k)
{
	const Value *x = &u->g->values.a[v];
	int p = u->pl->ndev_stages, own = pipeline_stage_at(u->pl, x->pos), c = u->pl->op_stage[k] % p;
	if (x->kind != VK_PARAM || x->producer >= 0 || own < 0 || own % p == c)
		return operand(u, v, 0);
	if (!u->tied) {
		u->tied = xmalloc(sizeof(int) * ((size_t)u->g->values.n * (size_t)p + 1));
		for (int i = 0; i < u->g->values.n * p; i++)
			u->tied[i] = -1;
	}
	int *w = &u->tied[v * p + c];
	if (*w < 0) {
		char name[512];
		snprintf(name, sizeof name, "%s%%to_stage%d", x->name, c);
		*w = graph_value(u->M, name, x->dtype, &x->shape, VK_INTER, x->pos);
		int in = operand(u, v, 0);
		graph_op(u->M, OP_COPY, &in, 1, *w, x->pos);
	}
	return *w;
}

/* Does op keep the rows of its batched operands apart (dim 0 stays dim 0
 * and no row reads another)?  The shape check after the copy catches the
 * rest. */
static bool keeps_rows(const Micro *u, const Op *op)
{
	const Attr *a = op->attr;
	const Value *x = &u->g->values.a[op->in[0]];
	switch (op->kind) {
	case OP_TRANSPOSE: return a->axes[0] == 0;
	case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM: return a->axes[0] != 0;
	case OP_REDUCE_SUM: case OP_REDUCE_MAX: case OP_REDUCE_MEAN: return a->naxes == 0 || a->axes[0] != 0;
	case OP_CONCAT: return a->axis != 0;
	case OP_SLICE: return a->start[0] == 0 && a->limit[0] == x->shape.dim[0] && a->stride[0] == 1;
	case OP_PAD: return a->start[0] == 0 && a->limit[0] == 0;
	case OP_EINSUM:
		for (int k = 0; k < op->nin; k++)
			if (u->batched[op->in[k]] && (a->nlet[k] == 0 || a->nlet[2] == 0 || a->let[k][0] != a->let[2][0]))
				return false;
		return true;
	default: return true;
	}
}

static bool is_loss_reduction(const Op *op)
{
	return op->kind == OP_SOFTMAX_CROSS_ENTROPY || op->kind == OP_MSE ||
	       ((op->kind == OP_REDUCE_MEAN || op->kind == OP_REDUCE_SUM) && op->attr->naxes > 0 && op->attr->axes[0] == 0);
}

/* Copy model op k for microbatch i (batched) or once (i = -1). */
static int copy_op(Micro *u, int k, int i)
{
	const Op *op = &u->g->ops.a[k];
	const Value *out = &u->g->values.a[op->out];
	int in[64];
	if (op->nin > 64)
		return fail(u->d, op->pos, "at most 64 operands in a pipelined model", "more");
	for (int j = 0; j < op->nin; j++)
		in[j] = u->g->values.a[op->in[j]].kind == VK_PARAM ? param_operand(u, op->in[j], k)
		                                                    : operand(u, op->in[j], i < 0 ? 0 : i);
	Attr at = *op->attr;
	bool loss = u->g->train && op->out == u->g->train->loss;
	if (i >= 0 && (op->kind == OP_RESHAPE || op->kind == OP_BROADCAST_TO)) {
		if (at.shape.rank == 0 || at.shape.dim[0] % u->m)
			return fail(u->d, op->pos, "a reshape whose dim 0 divides into the microbatches",
			            "one that does not (docs/pipeline.md)");
		at.shape.dim[0] /= u->m;
	}
	if (i >= 0 && (op->kind == OP_SOFTMAX_CROSS_ENTROPY || op->kind == OP_SOFTMAX_CROSS_ENTROPY_GRAD || op->kind == OP_MSE))
		at.value /= u->m; /* the mean over the microbatch's positions */
	if (i >= 0 && !(loss && is_loss_reduction(op)) && !keeps_rows(u, op)) {
		diag_error(u->d, op->pos, "expected ops that keep the rows of the batch (dim 0 of the inputs) apart, so that "
		           "microbatches run on their own, found %s mixing them", op_table[op->kind].name);
		return -1;
	}
	Op tmp = {.kind = op->kind, .nin = op->nin, .in = in, .out = -1, .attr = &at, .pos = op->pos};
	Shape s;
	DType t;
	if (op_table[op->kind].shape(u->M, &tmp, &s, &t, u->d) != 0)
		return -1;
	bool rows = s.rank > 0 && s.dim[0] * u->m == out->shape.dim[0];
	for (int j = 1; rows && j < s.rank; j++)
		rows = s.dim[j] == out->shape.dim[j];
	if (i >= 0 && !loss && !rows) {
		diag_error(u->d, op->pos, "expected ops that keep the rows of the batch (dim 0 of the inputs) apart, so that "
		           "microbatches run on their own, found %s whose result does not follow them", op_table[op->kind].name);
		return -1;
	}
	if (i >= 0 && loss && !is_loss_reduction(op)) {
		diag_error(u->d, op->pos, "expected a loss that reduces the batch itself (softmax_cross_entropy, mse, or "
		           "reduce_mean or reduce_sum over dim 0), found %s", op_table[op->kind].name);
		return -1;
	}
	char name[512];
	if (i >= 0)
		snprintf(name, sizeof name, "%s%%mb%d", out->name, i);
	else
		snprintf(name, sizeof name, "%s", out->name);
	int v = copy_value(u, op->out, name, &s);
	int id = graph_op(u->M, op->kind, in, op->nin, v, op->pos);
	*u->M->ops.a[id].attr = at;
	u->cur[op->out * u->m + (i < 0 ? 0 : i)] = v;
	return 0;
}

/* A new op of M on in[0..nin) with attributes at, its result named name,
 * of shape s, annotated spec (NULL: not), at pos; the result. */
static int micro_op(Micro *u, OpKind k, const int *in, int nin, const Attr *at, const char *name, DType t,
                    const Shape *s, const Spec *spec, Pos pos)
{
	int v = graph_value(u->M, name, t, s, VK_INTER, pos);
	if (spec) {
		u->M->values.a[v].has_spec = true;
		u->M->values.a[v].spec = *spec;
		u->M->values.a[v].spec_pos = pos;
	}
	int id = graph_op(u->M, k, in, nin, v, pos);
	*u->M->ops.a[id].attr = *at;
	return v;
}

/* M's inputs' microbatches.  With the batch split D ways (u->D, the same
 * for every input so that their rows stay together), microbatch i takes
 * rows [i b, (i+1) b) of every shard (b = B / (D m)): reshape to
 * [D, rest], slice, reshape back — all local to a shard.  Without a
 * split, it is rows [i B/m, (i+1) B/m). */
static void slice_input(Micro *u, int v, int leaf)
{
	const Value *x = &u->g->values.a[v];
	Shape xs = x->shape;
	Spec xspec = x->spec;
	bool annotated = x->has_spec;
	Pos pos = x->pos;
	int64_t D = u->D, b = xs.dim[0] / (D * u->m), R = shape_numel(&xs) / xs.dim[0];
	char name[512];
	int src = leaf;
	Spec flat = {.rank = 2};
	flat.nax[0] = xspec.nax[0];
	memcpy(flat.ax[0], xspec.ax[0], sizeof flat.ax[0]);
	if (D > 1) {
		Attr at = {.shape = {2, {D, xs.dim[0] / D * R}}};
		snprintf(name, sizeof name, "%s%%shards", x->name);
		src = micro_op(u, OP_RESHAPE, &leaf, 1, &at, name, x->dtype, &at.shape, &flat, pos);
	}
	for (int i = 0; i < u->m; i++) {
		Attr at = {0};
		Shape s = xs;
		s.dim[0] = b * D;
		snprintf(name, sizeof name, "%s%%mb%d", x->name, i);
		if (D > 1) {
			Shape cut = {2, {D, b * R}};
			at.start[1] = i * b * R, at.limit[0] = D, at.limit[1] = (i + 1) * b * R, at.stride[0] = at.stride[1] = 1;
			char cname[512];
			snprintf(cname, sizeof cname, "%s%%cut%d", x->name, i);
			int c = micro_op(u, OP_SLICE, &src, 1, &at, cname, x->dtype, &cut, &flat, pos);
			Attr back = {.shape = s};
			u->cur[v * u->m + i] = micro_op(u, OP_RESHAPE, &c, 1, &back, name, x->dtype, &s, annotated ? &xspec : NULL,
			                                pos);
		} else {
			for (int j = 0; j < xs.rank; j++)
				at.limit[j] = xs.dim[j], at.stride[j] = 1;
			at.start[0] = i * b, at.limit[0] = (i + 1) * b;
			u->cur[v * u->m + i] = micro_op(u, OP_SLICE, &src, 1, &at, name, x->dtype, &s, annotated ? &xspec : NULL, pos);
		}
		x = &u->g->values.a[v];
	}
}

/* The split of the batch: the shards of dim 0 of the first input annotated
 * with one, when every input's batch divides into shards x microbatches. */
static int64_t batch_shards(Micro *u)
{
	const Graph *g = u->g;
	int64_t D = 1;
	for (int v = 0; v < g->values.n && D == 1; v++) {
		const Value *x = &g->values.a[v];
		if (!(x->kind == VK_INPUT && x->producer < 0 && x->has_spec && x->spec.rank > 0))
			continue;
		for (int k = 0; k < x->spec.nax[0]; k++)
			D *= u->M->mesh.size[x->spec.ax[0][k]];
		u->flat = (Spec){.rank = 2}; /* the split, for outputs joined back (join_rows) */
		u->flat.nax[0] = x->spec.nax[0];
		memcpy(u->flat.ax[0], x->spec.ax[0], sizeof u->flat.ax[0]);
	}
	for (int v = 0; v < g->values.n; v++) {
		const Value *x = &g->values.a[v];
		if (x->kind == VK_INPUT && x->producer < 0 && (x->shape.rank == 0 || x->shape.dim[0] % (D * u->m)))
			return 1;
	}
	return D;
}

/* The loss: the microbatches' losses summed, over m for a mean. */
static int combine_loss(Micro *u)
{
	int L = u->g->train->loss;
	const Value *lv = &u->g->values.a[L];
	const Op *lop = &u->g->ops.a[lv->producer];
	Pos pos = lop->pos;
	int acc = u->cur[L * u->m];
	for (int i = 1; i < u->m; i++) {
		char name[512];
		snprintf(name, sizeof name, "%s%%sum%d", lv->name, i);
		int v = graph_value(u->M, name, lv->dtype, &lv->shape, VK_INTER, pos);
		graph_op(u->M, OP_ADD, (int[]){acc, u->cur[L * u->m + i]}, 2, v, pos);
		acc = v;
	}
	if (lop->kind == OP_REDUCE_SUM || u->m == 1) {
		u->M->values.a[acc].name = arena_strdup(&u->M->arena, lv->name);
		return acc;
	}
	int c = graph_value(u->M, "%mean", DT_F32, &(Shape){0}, VK_CONST, pos);
	u->M->values.a[c].cval = 1.0 / u->m;
	int v = graph_value(u->M, lv->name, lv->dtype, &lv->shape, VK_INTER, pos);
	graph_op(u->M, OP_MUL, (int[]){acc, c}, 2, v, pos);
	return v;
}

/* Output v of g, batched: its microbatches joined back into the model's
 * rows, the inverse of slice_input (with the batch split D ways, each
 * shard's rows are its microbatches' in order: reshape each to [D, rest],
 * concat on dim 1, reshape back). */
static int join_rows(Micro *u, int v)
{
	const Value *x = &u->g->values.a[v];
	Shape xs = x->shape;
	DType t = x->dtype;
	Pos pos = x->pos;
	const char *name = x->name;
	int64_t D = u->D, R = xs.rank ? shape_numel(&xs) / xs.dim[0] : 1;
	int *part = xmalloc(sizeof(int) * (size_t)u->m);
	char buf[512];
	for (int i = 0; i < u->m; i++) {
		part[i] = u->cur[v * u->m + i];
		if (D > 1) {
			Attr at = {.shape = {2, {D, xs.dim[0] / (D * u->m) * R}}};
			snprintf(buf, sizeof buf, "%s%%shard%d", name, i);
			part[i] = micro_op(u, OP_RESHAPE, &part[i], 1, &at, buf, t, &at.shape, &u->flat, pos);
		}
	}
	Attr cat = {.axis = D > 1 ? 1 : 0};
	Shape cs = D > 1 ? (Shape){2, {D, xs.dim[0] / D * R}} : xs;
	snprintf(buf, sizeof buf, "%s%%joined", name);
	int w = micro_op(u, OP_CONCAT, part, u->m, &cat, D > 1 ? buf : name, t, &cs, D > 1 ? &u->flat : NULL, pos);
	if (D > 1) {
		Attr back = {.shape = xs};
		w = micro_op(u, OP_RESHAPE, &w, 1, &back, name, t, &xs, NULL, pos);
	}
	free(part);
	return w;
}

/* A model without train: pipelines its forward alone: the outputs, each
 * from its microbatches when it depends on the inputs. */
static int join_outputs(Micro *u)
{
	const Graph *g = u->g;
	for (int k = 0; k < g->outputs.n; k++) {
		int v = g->outputs.a[k];
		if (u->batched[v] && g->values.a[v].producer < 0)
			return fail(u->d, g->values.a[v].pos, "outputs made by ops in a pipelined model", "an input");
		vec_push(&u->M->outputs, u->batched[v] ? join_rows(u, v) : u->cur[v * u->m]);
	}
	u->nfwd = u->M->ops.n;
	return 0;
}

/* Build u->M: the leaves, the inputs' slices, the model's ops per
 * microbatch, the combined loss, and its training step. */
static int build_micro(Micro *u, int *leaf)
{
	Graph *g = u->g, *M = u->M;
	const Pipeline *pl = u->pl;
	int nv = g->values.n;
	u->cur = xmalloc(sizeof(int) * ((size_t)nv * (size_t)u->m + 1));
	u->batched = xcalloc((size_t)nv + 1, sizeof(bool));
	for (int k = 0; k < nv * u->m; k++)
		u->cur[k] = -1;
	for (int v = 0; v < nv; v++) {
		const Value *val = &g->values.a[v];
		leaf[v] = -1;
		if (val->producer >= 0 || (val->kind != VK_INPUT && val->kind != VK_PARAM))
			continue;
		leaf[v] = u->cur[v * u->m] = copy_value(u, v, val->name, &val->shape);
		u->batched[v] = val->kind == VK_INPUT;
	}
	u->D = batch_shards(u);
	for (int v = 0; v < nv; v++)
		if (leaf[v] >= 0 && u->batched[v])
			slice_input(u, v, leaf[v]);
	int rc = 0;
	for (int k = 0; k < pl->nops && rc == 0; k++) {
		const Op *op = &g->ops.a[k];
		for (int j = 0; j < op->nin; j++)
			u->batched[op->out] |= u->batched[op->in[j]];
		if (!u->batched[op->out])
			rc = copy_op(u, k, -1);
		for (int i = 0; i < u->m && rc == 0 && u->batched[op->out]; i++)
			rc = copy_op(u, k, i);
	}
	if (rc != 0)
		return -1;
	if (!g->train)
		return join_outputs(u);
	if (!u->batched[g->train->loss])
		return fail(u->d, g->train->pos, "a loss computed from the inputs (their batch is cut into microbatches)",
		            "one that reads no input");
	Train *t = arena_alloc(&M->arena, sizeof *t);
	*t = *g->train;
	t->built = false, t->nparams = 0, t->params = NULL, t->ncarry = 0;
	t->loss = combine_loss(u);
	M->train = t;
	vec_push(&M->outputs, t->loss);
	u->nfwd = M->ops.n;
	return train_build(M, u->d);
}

/* ---- order ---- */

typedef struct {
	int *mb;    /* per value of M: its microbatch (the latest it depends on), or -1 */
	bool *bwd;  /* per value of M: made by the step's backward or update */
	int *stage; /* per value of M: the stage of its op (by position; else the latest of its operands'), or -1 */
	int n;      /* values tagged */
	int cap;    /* values the arrays hold */
} Tags;

static void tags_grow(Tags *T, int n)
{
	T->mb = xrealloc(T->mb, sizeof(int) * ((size_t)n + 1));
	T->bwd = xrealloc(T->bwd, sizeof(bool) * ((size_t)n + 1));
	T->stage = xrealloc(T->stage, sizeof(int) * ((size_t)n + 1));
	for (int v = T->cap; v < n; v++)
		T->mb[v] = -1, T->bwd[v] = false, T->stage[v] = -1;
	T->cap = n;
}

/* Tag the values of M not yet tagged (from T->n on; the inputs' slices
 * come seeded with their microbatch); ops of index >= nfwd (-1: none) are
 * the step's.  An op made where no model op is (the step's own, as the
 * copy weight-update sharding adds) takes the latest stage it reads. */
static void tag_values(const Graph *M, const Pipeline *pl, Tags *T, int nfwd)
{
	/* The clip scale, made on the last stage from every stage's gradients,
	 * is sent to each stage: a gradient scaled by it stays on its own. */
	int clip = M->train ? M->train->clip_scale : -1;
	tags_grow(T, M->values.n);
	for (int v = T->n; v < M->values.n; v++) {
		const Value *x = &M->values.a[v];
		if (x->producer < 0 && x->kind != VK_CONST)
			T->stage[v] = pipeline_stage_at(pl, x->pos);
	}
	for (int i = 0; i < M->ops.n; i++) {
		const Op *op = &M->ops.a[i];
		if (op->out < T->n)
			continue;
		int s = pipeline_stage_at(pl, op->pos);
		for (int k = 0; k < op->nin; k++) {
			T->mb[op->out] = T->mb[op->in[k]] > T->mb[op->out] ? T->mb[op->in[k]] : T->mb[op->out];
			T->bwd[op->out] |= T->bwd[op->in[k]];
			if (pipeline_stage_at(pl, op->pos) < 0 && T->stage[op->in[k]] > s && op->in[k] != clip)
				s = T->stage[op->in[k]];
		}
		T->stage[op->out] = s;
		if (nfwd >= 0 && i >= nfwd)
			T->bwd[op->out] = true;
	}
	T->n = M->values.n;
}

/* The merged order of the schedule's steps: rank[(stage * m + mb) * 2 + bwd];
 * and in *slot, at the same index, where a step's sends go: the rank of
 * the first step that starts when it ends.  Every step that starts while
 * it runs comes before its sends, so no device waits at the send for a
 * step the schedule runs beside it: with the sends right after the step,
 * a receiver that came later in a tie took the value only after the
 * sender's next step, one step late at every boundary. */
static int *step_ranks(const Pipeline *pl, int m, bool fwd_only, int **slot, Diag *d)
{
	int p = pl->ndev_stages, V = pl->virtual_stages, S = pl->nstages;
	double *f = xmalloc(sizeof(double) * (size_t)S), *b = xmalloc(sizeof(double) * (size_t)S);
	for (int s = 0; s < S; s++)
		f[s] = 1, b[s] = 2;
	PipeSimIn in = {.schedule = pl->schedule, .p = p, .V = V, .m = m, .fwd = f, .bwd = b, .forward_only = fwd_only};
	PipeSim sim;
	int *rank = NULL;
	if (pipe_simulate(&in, &sim) != 0) {
		diag_error(d, pl->pos, "expected a schedule that can finish, found one that waits on itself");
	} else {
		int n = 0;
		for (int dev = 0; dev < p; dev++)
			n += sim.ntask[dev];
		/* start times are multiples of 1/2 below 3 n: a counting sort, device order within a time */
		int nslot = 6 * n + 2, *count = xcalloc((size_t)nslot + 1, sizeof(int));
		for (int dev = 0; dev < p; dev++)
			for (int k = 0; k < sim.ntask[dev]; k++)
				count[(int)(sim.task[dev][k].start * 2) + 1]++;
		for (int s = 1; s <= nslot; s++)
			count[s] += count[s - 1];
		rank = xmalloc(sizeof(int) * ((size_t)S * (size_t)m * 2 + 1));
		*slot = xmalloc(sizeof(int) * ((size_t)S * (size_t)m * 2 + 1));
		for (int dev = 0; dev < p; dev++) /* count[x]: the steps that start before x / 2 */
			for (int k = 0; k < sim.ntask[dev]; k++) {
				const PipeTask *tk = &sim.task[dev][k];
				(*slot)[(tk->stage * m + tk->mb) * 2 + tk->bwd] = count[(int)(tk->end * 2)];
			}
		for (int dev = 0; dev < p; dev++)
			for (int k = 0; k < sim.ntask[dev]; k++) {
				const PipeTask *tk = &sim.task[dev][k];
				int i = (tk->stage * m + tk->mb) * 2 + tk->bwd;
				rank[i] = count[(int)(tk->start * 2)]++;
				(*slot)[i] = (*slot)[i] > rank[i] ? (*slot)[i] : rank[i] + 1; /* a step of no time: right after it */
			}
		free(count);
		pipe_sim_free(&sim);
	}
	free(f), free(b);
	return rank;
}

/* ---- recompute ---- */

/* Tags of prog op i, through the op of M it was made for. */
static int op_mb(const Graph *P, const Graph *M, const Tags *T, int i) { return T->mb[M->ops.a[P->ops.a[i].src_op].out]; }
static int op_st(const Graph *P, const Graph *M, const Tags *T, int i) { return T->stage[M->ops.a[P->ops.a[i].src_op].out]; }
static bool op_bwd(const Graph *P, const Graph *M, const Tags *T, int i) { return T->bwd[M->ops.a[P->ops.a[i].src_op].out]; }

typedef struct {
	Graph *P;
	const Op *old;   /* prog's ops before */
	const int *prod; /* per value: its producer in old, or -1 */
	int *copy;       /* per value: its recomputed copy, or -1 */
	bool *fwd;       /* per old op: a forward op of a microbatch (what is recomputed) */
	int *stack;
} Recompute;

/* Push a copy of old op k made for the backward op `reader` (its step and
 * src_op, so the copy runs in that step); its operands are already copied. */
static void push_copy(Recompute *R, int k, const Op *reader)
{
	Graph *P = R->P;
	Op op = R->old[k];
	int *in = arena_alloc(&P->arena, sizeof(int) * ((size_t)op.nin + 1));
	for (int j = 0; j < op.nin; j++)
		in[j] = R->copy[op.in[j]] >= 0 ? R->copy[op.in[j]] : op.in[j];
	const Value *x = &P->values.a[op.out];
	char name[512];
	snprintf(name, sizeof name, "%s%%re", x->name);
	Shape local = x->shape, global = x->global;
	Spec spec = x->spec;
	int w = graph_value(P, name, x->dtype, &local, VK_INTER, reader->pos);
	P->values.a[w].spec = spec, P->values.a[w].global = global;
	Attr *a = arena_alloc(&P->arena, sizeof *a);
	*a = *op.attr;
	op.in = in, op.out = w, op.attr = a, op.src_op = reader->src_op, op.pos = reader->pos;
	op.why = "recomputes the forward before the backward (recompute: true)";
	vec_push(&P->ops, op);
	P->values.a[w].producer = P->ops.n - 1;
	R->copy[R->old[k].out] = w;
}

/* Value v as `reader` reads it: a copy when a forward op of the reader's
 * step's stage and microbatch made it, made now with what it reads
 * (depth first, on an explicit stack: a stage may be long). */
static int recomputed(Recompute *R, int v, const Op *reader, int stage, int mb, const int *st, const int *mbs)
{
	int k = R->prod[v], n = 0;
	if (k < 0 || !R->fwd[k] || st[k] != stage || mbs[k] != mb)
		return v;
	R->stack[n++] = k;
	while (n > 0) {
		int top = R->stack[n - 1], pushed = 0;
		if (R->copy[R->old[top].out] >= 0) {
			n--;
			continue;
		}
		for (int j = 0; j < R->old[top].nin; j++) {
			int u = R->old[top].in[j], q = R->prod[u];
			if (q >= 0 && R->fwd[q] && st[q] == stage && mbs[q] == mb && R->copy[u] < 0)
				R->stack[n++] = q, pushed = 1;
		}
		if (!pushed)
			push_copy(R, top, reader), n--;
	}
	return R->copy[v];
}

/* recompute: true.  Every backward op reads its stage's forward values of
 * its microbatch from copies of the forward ops made in the backward step
 * itself, so that the forward's results die with the forward (the executor
 * frees a value after its last reader) and only what the stage received
 * stays, from the forward to the backward.  Linear: each forward op is
 * copied at most once. */
static void recompute_forward(Graph *P, const Graph *M, const Tags *T)
{
	int n = P->ops.n, nv = P->values.n, ne = 0;
	Op *old = xmalloc(sizeof(Op) * ((size_t)n + 1));
	memcpy(old, P->ops.a, sizeof(Op) * (size_t)n);
	int *prod = xmalloc(sizeof(int) * ((size_t)nv + 1)), *copy = xmalloc(sizeof(int) * ((size_t)nv + 1));
	int *st = xmalloc(sizeof(int) * ((size_t)n + 1)), *mbs = xmalloc(sizeof(int) * ((size_t)n + 1));
	bool *fwd = xcalloc((size_t)n + 1, sizeof(bool)), *bwd = xcalloc((size_t)n + 1, sizeof(bool));
	for (int v = 0; v < nv; v++)
		prod[v] = P->values.a[v].producer, copy[v] = -1;
	for (int i = 0; i < n; i++) {
		st[i] = op_st(P, M, T, i), mbs[i] = op_mb(P, M, T, i);
		fwd[i] = st[i] >= 0 && mbs[i] >= 0 && !op_bwd(P, M, T, i);
		bwd[i] = st[i] >= 0 && mbs[i] >= 0 && !fwd[i];
		ne += old[i].nin;
	}
	Recompute R = {P, old, prod, copy, fwd, xmalloc(sizeof(int) * ((size_t)ne + 1))};
	P->ops.n = 0;
	for (int k = 0; k < n; k++) {
		Op op = old[k];
		if (bwd[k]) {
			int *in = arena_alloc(&P->arena, sizeof(int) * ((size_t)op.nin + 1));
			for (int j = 0; j < op.nin; j++)
				in[j] = recomputed(&R, op.in[j], &old[k], st[k], mbs[k], st, mbs);
			op.in = in;
		}
		vec_push(&P->ops, op);
		P->values.a[op.out].producer = P->ops.n - 1;
	}
	free(R.stack), free(old), free(prod), free(copy), free(st), free(mbs), free(fwd), free(bwd);
}

/* ---- lifting to the whole mesh, sends ---- */

typedef struct {
	Graph *prog;
	const Pipeline *pl;
	Diag *d;
	int *sent;   /* per value: the first send's value, chained by next[] */
	int *next;
} Sends;

/* A device's partner with stage coordinate c (the same coordinates on the other axes). */
static int with_stage(const Mesh *m, int axis, int dev, int c)
{
	int coord[MESH_MAX_AXES];
	mesh_device_coords(m, dev, coord);
	coord[axis] = c;
	return mesh_coords_device(m, coord);
}

/* Value v (of stage `from`) on the devices of stage `to`: a permute, made once per device coordinate. */
static int send(Sends *S, int v, int from, int to, const Op *reader)
{
	Graph *P = S->prog;
	int p = S->pl->ndev_stages, ax = S->pl->axis;
	for (int w = S->sent[v]; w >= 0; w = S->next[w])
		if (P->ops.a[P->values.a[w].producer].stage_to % p == to % p)
			return w;
	const Value *x = &P->values.a[v];
	char name[512];
	const char *pct = strchr(x->name + 1, '%');
	snprintf(name, sizeof name, "%.*s%%%d", pct ? (int)(pct - x->name) : (int)strlen(x->name), x->name, P->values.n);
	Spec spec = x->spec;
	Shape global = x->global, local = x->shape;
	int w = graph_value(P, name, x->dtype, &local, VK_INTER, reader->pos);
	P->values.a[w].spec = spec;
	P->values.a[w].global = global;
	int *target = arena_alloc(&P->arena, sizeof(int) * (size_t)P->mesh.ndev);
	for (int dev = 0; dev < P->mesh.ndev; dev++)
		target[dev] = graph_stage_coord(P, dev) == from % p ? with_stage(&P->mesh, ax, dev, to % p) : -1;
	int id = graph_op(P, OP_COLLECTIVE_PERMUTE, &v, 1, w, reader->pos);
	Op *op = &P->ops.a[id];
	op->attr->ncax = 1;
	op->attr->cax[0] = ax;
	op->attr->target = target;
	op->stage = from, op->stage_to = to;
	op->src_op = reader->src_op;
	op->why = arena_printf(&P->arena, "sends %s from stage %d to stage %d, which reads it", P->values.a[v].name,
	                       from, to);
	S->next = xrealloc(S->next, sizeof(int) * ((size_t)P->values.n + 1));
	S->next[w] = S->sent[v];
	S->sent[v] = w;
	return w;
}

/* Readers on other stage coordinates: per value, its first reader on each
 * (old op indices), chained. */
typedef struct {
	int *first;            /* per value: its first entry, or -1 */
	int *op, *next, n;     /* entries */
} Readers;

static void find_readers(const Graph *P, const Op *old, const int *order, int n, Readers *R)
{
	int p = P->mesh.size[P->stage_axis], ne = 0;
	for (int i = 0; i < n; i++)
		ne += old[i].nin;
	R->first = xmalloc(sizeof(int) * ((size_t)P->values.n + 1));
	R->op = xmalloc(sizeof(int) * ((size_t)ne + 1)), R->next = xmalloc(sizeof(int) * ((size_t)ne + 1)), R->n = 0;
	for (int v = 0; v < P->values.n; v++)
		R->first[v] = -1;
	for (int k = 0; k < n; k++) {
		const Op *op = &old[order[k]];
		for (int j = 0; j < op->nin && op->stage >= 0; j++) {
			int v = op->in[j], pr = P->values.a[v].producer, e = R->first[v];
			if (pr < 0 || old[pr].stage < 0 || old[pr].stage % p == op->stage % p)
				continue;
			while (e >= 0 && old[R->op[e]].stage % p != op->stage % p)
				e = R->next[e];
			if (e < 0)
				R->op[R->n] = order[k], R->next[R->n] = R->first[v], R->first[v] = R->n++;
		}
	}
}

/* The sends of the ops order[first..last]: each value to the stages that read it. */
static void send_run(Sends *S, const Op *old, const Readers *R, const int *order, int first, int last)
{
	for (int k = first; k <= last; k++)
		for (int e = R->first[old[order[k]].out]; e >= 0; e = R->next[e])
			send(S, old[order[k]].out, old[order[k]].stage, old[R->op[e]].stage, &old[R->op[e]]);
}

/* Steps whose sends wait for their slot. */
typedef struct {
	int *first, *last, *slot, n;
} Pending;

/* Send what the pending steps made whose slot is at most key (all: INT_MAX), in the order they ended. */
static void flush(Sends *S, const Op *old, const Readers *R, const int *order, Pending *q, int key)
{
	int kept = 0;
	for (int i = 0; i < q->n; i++)
		if (q->slot[i] <= key)
			send_run(S, old, R, order, q->first[i], q->last[i]);
		else
			q->first[kept] = q->first[i], q->last[kept] = q->last[i], q->slot[kept++] = q->slot[i];
	q->n = kept;
}

/* Re-emit prog's ops in order[0..n) (indices into old), with the sends.
 * A value goes to another stage's devices once the microbatch step that
 * makes it ends (ops of one step share their key), before the first step
 * that starts at that time (slot[key], a key): the receiver can start
 * when it arrives, the sender goes on to its next step, and no step the
 * schedule runs beside it waits for it.  Pending steps are at most those
 * running at once, one a device: linear in the ops for a fixed mesh. */
static int emit_ordered(Sends *S, const Op *old, const int *order, const int *key, const int *slot, int n)
{
	Graph *P = S->prog;
	int p = S->pl->ndev_stages;
	Readers R;
	find_readers(P, old, order, n, &R);
	S->sent = xmalloc(sizeof(int) * ((size_t)P->values.n + 1));
	S->next = xmalloc(sizeof(int) * ((size_t)P->values.n + 1));
	for (int v = 0; v < P->values.n; v++)
		S->sent[v] = -1, P->values.a[v].nuses = 0;
	P->ops.n = 0;
	Pending q = {xmalloc(sizeof(int) * ((size_t)n + 1)), xmalloc(sizeof(int) * ((size_t)n + 1)),
	             xmalloc(sizeof(int) * ((size_t)n + 1)), 0};
	int rc = 0, run = 0; /* the first op of the current step */
	for (int k = 0; k < n && rc == 0; k++) {
		Op op = old[order[k]];
		if (k == run)
			flush(S, old, &R, order, &q, key[order[k]]);
		for (int j = 0; j < op.nin && rc == 0; j++) {
			int v = op.in[j], pr = P->values.a[v].producer;
			int from = pr >= 0 ? P->ops.a[pr].stage : -1;
			if (from >= 0 && op.stage < 0) {
				diag_error(S->d, op.pos, "expected the ops that every device runs to read no stage's values, "
				           "found %s reading '%s' of stage %d",
				           op_table[op.kind].name, P->values.a[v].name, from);
				rc = -1;
			} else if (from >= 0 && from % p != op.stage % p)
				op.in[j] = send(S, v, from, op.stage, &op);
		}
		vec_push(&P->ops, op);
		P->values.a[op.out].producer = P->ops.n - 1;
		for (int j = 0; j < op.nin; j++)
			P->values.a[op.in[j]].nuses++;
		if (k + 1 < n && key[order[k + 1]] == key[order[k]])
			continue;
		q.first[q.n] = run, q.last[q.n] = k, q.slot[q.n++] = slot[key[order[k]]]; /* the step ended */
		run = k + 1;
	}
	if (rc == 0)
		flush(S, old, &R, order, &q, INT_MAX);
	free(q.first), free(q.last), free(q.slot);
	free(R.first), free(R.op), free(R.next);
	return rc;
}

/* Each param is read on one stage coordinate (its copies on the others):
 * its update runs there. */
static int check_params(const Graph *P, Diag *d)
{
	int *seen = xmalloc(sizeof(int) * ((size_t)P->values.n + 1)), rc = 0;
	for (int v = 0; v < P->values.n; v++)
		seen[v] = -1;
	int p = P->mesh.size[P->stage_axis];
	for (int i = 0; i < P->ops.n && rc == 0; i++) {
		const Op *op = &P->ops.a[i];
		for (int j = 0; j < op->nin && rc == 0; j++) {
			const Value *x = &P->values.a[op->in[j]];
			if (x->kind != VK_PARAM || op->stage < 0)
				continue;
			int c = op->stage % p;
			if (seen[op->in[j]] >= 0 && seen[op->in[j]] != c) {
				diag_error(d, x->pos, "internal: expected each param read by the devices of one stage (a tied "
				           "param's other stages read its copy), found '%s' read on stage coordinates %d and %d",
				           x->name, seen[op->in[j]], c);
				rc = -1;
			}
			seen[op->in[j]] = c;
		}
	}
	free(seen);
	return rc;
}

/* prog's mesh: the model's (the stage axis back to its size); permutes' explicit maps lifted to it. */
static void lift_mesh(Graph *P, const Mesh *full, int axis)
{
	Mesh sub = P->mesh;
	Mesh *m = &P->mesh;
	*m = *full;
	for (int a = 0; a < m->naxes; a++)
		m->name[a] = arena_strdup(&P->arena, full->name[a]);
	if (full->hardware)
		m->hardware = arena_strdup(&P->arena, full->hardware);
	m->devices = m->position = NULL;
	if (full->devices)
		mesh_finish(m, &P->arena, full->devices);
	for (int i = 0; i < P->ops.n; i++) {
		Attr *a = P->ops.a[i].attr;
		if (a->eq)
			a->eq = arena_strdup(&P->arena, a->eq);
		if (!a->target)
			continue;
		int *t = arena_alloc(&P->arena, sizeof(int) * (size_t)m->ndev);
		for (int dev = 0; dev < m->ndev; dev++) {
			int coord[MESH_MAX_AXES];
			mesh_device_coords(m, dev, coord);
			int c = coord[axis];
			coord[axis] = 0;
			int to = a->target[mesh_coords_device(&sub, coord)];
			if (to < 0) {
				t[dev] = -1;
				continue;
			}
			mesh_device_coords(&sub, to, coord);
			coord[axis] = c;
			t[dev] = mesh_coords_device(m, coord);
		}
		a->target = t;
	}
}

/* Order prog's ops by the schedule, give each its stage, insert the sends. */
static int stage_program(Graph *P, const Graph *M, const Tags *T, const Pipeline *pl, int m, Diag *d)
{
	int *slot = NULL, *rank = step_ranks(pl, m, !M->train, &slot, d); /* no train: a forward-only pipeline */
	if (!rank)
		return -1;
	int n = P->ops.n, nsteps = pl->nstages * m * 2;
	int *kslot = xcalloc((size_t)nsteps + 2, sizeof(int)); /* per key (rank + 1; 0: no step): its sends' key */
	for (int i = 0; i < nsteps; i++)
		kslot[rank[i] + 1] = slot[i] + 1;
	int *key = xmalloc(sizeof(int) * ((size_t)n + 1)), *count = xcalloc((size_t)nsteps + 2, sizeof(int));
	for (int i = 0; i < n; i++) {
		Op *op = &P->ops.a[i];
		const Op *src = &M->ops.a[op->src_op];
		int s = T->stage[src->out], mb = T->mb[src->out];
		op->stage = s;
		key[i] = s < 0 || mb < 0 ? 0 : rank[(s * m + mb) * 2 + T->bwd[src->out]] + 1;
		/* a model op's forward or backward is a microbatch step; the update, made at its param, is not */
		op->pipe_step = key[i] && pipeline_op_at(pl, src->pos) >= 0 ? 1 + 2 * mb + T->bwd[src->out] : 0;
		/* an op of no microbatch step (the update, the clip scale) comes
		 * after every step whose values it reads: the clip scale after
		 * each stage's last backward, not only its own stage's */
		for (int j = 0; j < op->nin && !op->pipe_step && key[i]; j++) {
			int pr = P->values.a[op->in[j]].producer;
			if (pr >= 0 && pr < i && key[pr] > key[i])
				key[i] = key[pr];
		}
		count[key[i] + 1]++;
	}
	for (int k = 1; k <= nsteps + 1; k++)
		count[k] += count[k - 1];
	int *order = xmalloc(sizeof(int) * ((size_t)n + 1));
	for (int i = 0; i < n; i++)
		order[count[key[i]]++] = i;
	int rc = 0;
	/* the order must still be topological: a reader after its producers */
	int *pos = xmalloc(sizeof(int) * ((size_t)n + 1));
	for (int k = 0; k < n; k++)
		pos[order[k]] = k;
	for (int i = 0; i < n && rc == 0; i++)
		for (int j = 0; j < P->ops.a[i].nin && rc == 0; j++) {
			int pr = P->values.a[P->ops.a[i].in[j]].producer;
			if (pr >= 0 && pos[pr] > pos[i]) {
				diag_error(d, P->ops.a[i].pos, "internal: the schedule puts %s before '%s', which it reads",
				           op_table[P->ops.a[i].kind].name, P->values.a[P->ops.a[i].in[j]].name);
				rc = -1;
			}
		}
	Op *old = xmalloc(sizeof(Op) * ((size_t)n + 1));
	memcpy(old, P->ops.a, sizeof(Op) * (size_t)n);
	Sends S = {P, pl, d, NULL, NULL};
	if (rc == 0)
		rc = emit_ordered(&S, old, order, key, kslot, n);
	free(S.sent), free(S.next), free(old), free(pos), free(order), free(key), free(count), free(rank);
	free(slot), free(kslot);
	return rc;
}

/* ---- the entry ---- */

static int refuse(const Graph *g, Diag *d)
{
	const Pipeline *pl = g->pipeline;
	if (g->train && !g->train->built)
		return fail(d, pl->pos, "a training step built to pipeline", "none");
	if (pl->nops > 0 && pl->op_stage[0] < 0) /* the commands balance stages: auto first (cost_pipeline_cut) */
		return fail(d, pl->pos, "stages written on the ops, or balanced by the cost model, to partition or run a "
		            "pipeline", "stages: auto not balanced");
	return 0;
}

/* The model's values (leaves, state, outputs) in prog: map[v]. */
static void map_values(const Graph *g, const Graph *M, const int *leaf, const int *mmap, const Graph *P, int *map)
{
	const Train *a = g->train, *b = M->train;
	for (int v = 0; v < g->values.n; v++)
		map[v] = leaf[v] >= 0 ? mmap[leaf[v]] : -1;
	for (int i = 0; a && b && i < a->nparams && i < b->nparams; i++)
		for (int k = 0; k < a->params[i].nstate; k++)
			map[a->params[i].state[k]] = mmap[b->params[i].state[k]];
	if (a && b && a->step >= 0 && b->step >= 0)
		map[a->step] = mmap[b->step];
	for (int i = 0; i < g->outputs.n && i < P->outputs.n; i++)
		map[g->outputs.a[i]] = P->outputs.a[i];
}

/* The weight-update report, made on M, into g's arena and g's param ids. */
static void own_wus(Graph *g, const Graph *M, const int *leaf, WusReport *wus)
{
	int *back = xmalloc(sizeof(int) * ((size_t)M->values.n + 1));
	for (int v = 0; v < g->values.n; v++)
		if (leaf[v] >= 0)
			back[leaf[v]] = v;
	WusParam *p = arena_alloc(&g->arena, sizeof *p * (size_t)(wus->n + 1));
	for (int i = 0; i < wus->n; i++) {
		p[i] = wus->p[i];
		p[i].why = wus->p[i].why ? arena_strdup(&g->arena, wus->p[i].why) : NULL;
		p[i].param = back[wus->p[i].param]; /* params are leaves of both */
	}
	wus->p = p;
	free(back);
}

int pipe_partition(Graph *g, const HwProfile *hw, Graph *prog, int **map, WusReport *wus, Diag *d)
{
	graph_init(prog);
	if (map)
		*map = NULL;
	if (refuse(g, d) != 0)
		return -1;
	const Pipeline *pl = g->pipeline;
	Graph M;
	graph_init(&M);
	M.name = g->name, M.file = g->file, M.rules = g->rules, M.rules_written = g->rules_written;
	M.mesh = g->mesh;
	M.mesh.ndev /= M.mesh.size[pl->axis];
	M.mesh.size[pl->axis] = 1;
	M.mesh.devices = M.mesh.position = NULL;
	Micro u = {g, &M, pl, (int)pl->microbatches, d, NULL, NULL, 0, 1, {0}, NULL};
	int *leaf = xmalloc(sizeof(int) * ((size_t)g->values.n + 1));
	int rc = build_micro(&u, leaf);
	Tags T = {0};
	int nbase = g->train ? 1 + g->train->ncarry : g->outputs.n;
	for (int k = nbase; k < g->outputs.n && rc == 0; k++) /* --check's gradients (cli/check.h) */
		vec_push(&M.outputs, M.train->params[k - nbase].reduced);
	if (rc == 0) {
		tags_grow(&T, M.values.n);
		for (int v = 0; v < g->values.n; v++)
			for (int i = 0; i < u.m && leaf[v] >= 0 && u.batched[v]; i++)
				T.mb[u.cur[v * u.m + i]] = i;
		tag_values(&M, pl, &T, u.nfwd);
	}
	Propagation p;
	int *mmap = NULL;
	if (rc == 0) {
		rc = pipeline_propagate(&M, hw, &p, wus, d);
		propagation_free(&p);
	}
	if (rc == 0) {
		tag_values(&M, pl, &T, -1); /* what weight-update sharding added */
		mmap = xcalloc((size_t)M.values.n + 1, sizeof *mmap);
		rc = partition(&M, prog, mmap, hw, d);
	}
	if (rc == 0) {
		if (M.train)
			train_map(&M, mmap, prog);
		lift_mesh(prog, &g->mesh, pl->axis);
		prog->stage_axis = pl->axis;
		if (pl->recompute)
			recompute_forward(prog, &M, &T);
		rc = stage_program(prog, &M, &T, pl, u.m, d);
	}
	if (rc == 0)
		rc = check_params(prog, d);
	for (int i = 0; i < prog->ops.n; i++) /* src_op named ops of the microbatched model, which goes now */
		prog->ops.a[i].src_op = -1;
	if (rc == 0)
		graph_unshare_consts(prog);
	if (rc == 0 && map) {
		*map = xmalloc(sizeof(int) * ((size_t)g->values.n + 1));
		map_values(g, &M, leaf, mmap, prog, *map);
	}
	if (wus && wus->n)
		own_wus(g, &M, leaf, wus);
	free(T.mb), free(T.bwd), free(T.stage), free(mmap), free(leaf), free(u.cur), free(u.batched), free(u.tied);
	M.mesh = (Mesh){0};
	graph_free(&M);
	return rc;
}
