/* wus.c: cross-replica weight-update sharding, as annotations.
 *
 * In data-parallel training every replica applies the same update to the
 * whole of every weight.  Sharding the update (Xu et al. 2020, "Automatic
 * cross-replica sharding of weight update"; DeepSpeed ZeRO) reduce-scatters
 * the gradient instead of all-reducing it, updates 1/N of the weight and
 * of the optimizer state on each replica, and all-gathers the new weight:
 * the same bytes as the all-reduce, N times less update work and optimizer
 * memory (docs/algorithms.md §4).
 *
 * Here the pass only writes shardings.  For a param w sharded S and
 * replicated over the axes D, it picks one dim k and annotates, with S plus
 * D on dim k (S'): the gradient, the optimizer state and the update's
 * result, which it renames w%shard and follows by `w%next = copy(w%shard)`
 * annotated S.  Propagation carries S' through the element-wise update; the
 * partitioner turns the gradient's pending sum into a reduce_scatter (S' is
 * split where the sum is pending), runs the update on shards, and gathers
 * w%next.  Norms over the update (global-norm clipping, LAMB's trust ratio)
 * stay exact: their local sums of squares are partial and all-reduced as
 * scalars.  Uneven sizes are padded; the padding is masked wherever a
 * reduction could read it. */
#include "wus.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../spmd/ops.h"
#include "../train/train.h"
#include "factors.h"
#include "partition.h"
#include "../cost_model/cost.h"

/* Whether param w's sharded update leaves it sharded between steps, to be
 * gathered before each use or its first (its own all_gather, else the
 * section's). */
static bool before_use(const Graph *g, int w)
{
	int8_t k = g->values.a[w].gather;
	return k ? k != AG_AFTER_UPDATE : g->train->gather_before_use;
}

/* Whether w, so gathered, is gathered once a step (all_gather: first_use):
 * the forward's copy is held for the backward. */
static bool first_use(const Graph *g, int w)
{
	int8_t k = g->values.a[w].gather;
	return k ? k == AG_FIRST_USE : g->train->gather_first_use;
}

/* The axes of the split reduction factors of op on its operands'
 * propagated shardings. */
static unsigned reduced_axes(const Graph *g, const Op *op)
{
	FactorRule r;
	if (factor_rule(g, op, &r) != 0)
		return 0;
	unsigned mask = 0;
	for (int t = 0; t < r.res && t < op->nin; t++) {
		const Value *in = &g->values.a[op->in[t]];
		for (int d = 0; d < in->shape.rank; d++) {
			Axes fa[MAX_FACTORS];
			memset(fa, 0, sizeof fa);
			factor_project_dim(&g->mesh, &r, t, d, &in->spec, fa);
			for (int i = 0; i < r.nfd[t][d]; i++) {
				int f = r.fd[t][d][i];
				for (int k = 0; (r.kind[f] == FK_REDUCE || r.kind[f] == FK_GATHER) && k < fa[f].n; k++)
					mask |= 1u << fa[f].ax[k];
			}
		}
	}
	return mask;
}

/* Per value, the mesh axes it is a pending sum over when the program runs on
 * the propagated shardings: the axes of split reduction factors, carried
 * through the ops linear in their operands as the partitioner carries them
 * (linear_partial: a reader sees a sum pending only where the partitioner
 * leaves it so, partition_deferrable).  One pass in op order; free the array. */
static unsigned *pending_axes(const Graph *g)
{
	unsigned *p = xcalloc((size_t)g->values.n + 1, sizeof *p);
	uint8_t *defer = xcalloc((size_t)g->values.n + 1, 1);
	partition_deferrable(g, defer);
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		int x = op->in[0], y = op->nin > 1 ? op->in[1] : -1;
		unsigned a = defer[x] ? p[x] : 0, b = y >= 0 && defer[y] ? p[y] : 0;
		switch (op->kind) {
		case OP_NEG:
		case OP_COPY:
		case OP_TRANSPOSE:
		case OP_CAST: p[op->out] = a; break;
		case OP_ADD:
		case OP_SUB: p[op->out] = partition_add_pending(g, op, a, b, defer); break;
		case OP_MUL: p[op->out] = a && b ? 0 : a | b; break;
		case OP_DIV: p[op->out] = b ? 0 : a; break;
		default: p[op->out] = reduced_axes(g, op); break;
		}
	}
	free(defer);
	return p;
}

/* The axes the spec neither splits a dim by nor holds partial: the replicas. */
static unsigned replica_axes(const Mesh *m, const Spec *s)
{
	unsigned mask = 0;
	for (int a = 0; a < m->naxes; a++)
		if (m->size[a] > 1 && spec_replicated_over(s, a))
			mask |= 1u << a;
	return mask;
}

/* The dim to split the update on: one that divides, the largest; else the
 * one with the least padding.  *padding gets the padded elements. */
static int pick_dim(const Mesh *m, const Value *w, unsigned axes, int64_t *padding)
{
	int best = -1;
	int64_t best_pad = 0, n = mesh_axes_size(m, axes), numel = shape_numel(&w->shape);
	for (int d = 0; d < w->shape.rank; d++) {
		int64_t have = spec_dim_shards(&w->spec, m, d), size = w->shape.dim[d];
		int64_t block = (size + have * n - 1) / (have * n);
		if (block * have * n < size || size < have * n)
			continue;
		int64_t pad = (block * have * n - size) * (numel / size);
		if (best < 0 || pad < best_pad || (pad == best_pad && size > w->shape.dim[best]))
			best = d, best_pad = pad;
	}
	*padding = best_pad;
	return best;
}

/* w's sharding with the replica axes appended to dim k. */
static Spec widened(const Spec *s, const Mesh *m, int k, unsigned axes)
{
	Spec t = *s;
	t.partial = 0, t.open = 0;
	for (int a = 0; a < m->naxes; a++)
		if (axes >> a & 1)
			t.ax[k][t.nax[k]++] = (uint8_t)a;
	return t;
}

/* An annotation written by the pass: no source position, so it is never
 * reported as a user's. */
static void annotate(Graph *g, int v, const Spec *s, Pos p)
{
	Value *val = &g->values.a[v];
	val->spec = *s;
	val->has_spec = true;
	val->spec_pos = (Pos){p.file, 0, 0};
}

/* Rename the update's result to w%shard (sharded s2) and append
 * w%next = copy(w%shard), sharded like w. */
static void split_next(Graph *g, TrainParam *tp, const Spec *s2, Pos p)
{
	const Value *w = &g->values.a[tp->param];
	int next = tp->next, op = g->values.a[next].producer;
	char name[512];
	snprintf(name, sizeof name, "%s%%shard", w->name);
	int shard = graph_value(g, name, g->values.a[next].dtype, &g->values.a[next].shape, VK_INTER, p);
	annotate(g, shard, s2, p);
	g->ops.a[op].out = shard;
	g->values.a[shard].producer = op;
	int id = graph_op(g, OP_COPY, &shard, 1, next, p);
	(void)id;
	annotate(g, next, &g->values.a[tp->param].spec, p);
}

/* weight_update_sharding: auto — price both choices on the hardware profile
 * the command chose (else tpu-v3): off, an all_reduce of the gradient
 * and the whole update on every replica; on, a reduce_scatter, the update on
 * 1/N and an all_gather of the weight.  The update reads and writes the
 * weight, gradient and state: (3 + 2 * states) times the weight's bytes of
 * memory traffic.  As in the steady state of a long run (cost_estimate_step):
 * with all_gather: before_use the gather overlaps the next step's forward
 * pass, so it is not counted.  True to shard; else sets wp->why. */
static bool auto_shards(Graph *g, const HwProfile *hw, const TrainParam *tp, unsigned axes, WusParam *wp)
{
	HwProfile def;
	if (!hw) {
		hw_profile_builtin(&def, "tpu-v3");
		hw = &def;
	}
	int ax[MESH_MAX_AXES], nax = 0;
	for (int a = 0; a < g->mesh.naxes; a++)
		if (axes >> a & 1)
			ax[nax++] = a;
	const Mesh *m = &g->mesh;
	double n = mesh_axes_size(m, axes), b = (double)wp->bytes;
	double update = (3 + 2 * tp->nstate) * b / hw->mem_bw;
	double off = cost_collective_seconds(hw, m, RS_ALL_REDUCE, ax, nax, b, NULL, 0) + update;
	double gather = cost_collective_seconds(hw, m, RS_ALL_GATHER, ax, nax, b / n, NULL, 0);
	gather = before_use(g, tp->param) ? 0 : gather;
	double on = cost_collective_seconds(hw, m, RS_REDUCE_SCATTER, ax, nax, b, NULL, 0) + gather + update / n;
	if (on < off)
		return true;
	wp->why = arena_printf(&g->arena, "auto on %s: %.3g s sharded against %.3g s whole", hw->name, on, off);
	return false;
}

/* Decide for one param and annotate its update when it is sharded. */
static void decide(Graph *g, const HwProfile *hw, TrainParam *tp, WusParam *wp, const unsigned *pending)
{
	const Train *t = g->train;
	const Mesh *m = &g->mesh;
	Value *w = &g->values.a[tp->param];
	wp->param = tp->param, wp->dim = -1;
	wp->bytes = shape_numel(&w->shape) * dtype_size(w->dtype);
	unsigned axes = replica_axes(m, &w->spec);
	int k = axes ? pick_dim(m, w, axes, &wp->padding) : -1;
	WusMode mode = w->wus ? (WusMode)(w->wus - 1) : t->wus; /* the param's own, else the section's */
	if (mode == WUS_OFF)
		wp->why = "weight_update_sharding is off";
	else if (!axes)
		wp->why = arena_printf(&g->arena, "%s is split over every mesh axis: no replicas to share its update", w->name);
	else if (k < 0)
		wp->why = arena_printf(&g->arena, "no dim of %s is as large as its shard count", w->name);
	else if (mode == WUS_AUTO && !auto_shards(g, hw, tp, axes, wp))
		return;
	if (wp->why)
		return;
	Spec s2 = widened(&w->spec, m, k, axes);
	wp->sharded = true, wp->dim = k, wp->axes = axes;
	char sp[128];
	spec_format(&s2, m, sp, sizeof sp);
	wp->why = arena_printf(&g->arena, "%s: replicated over %d devices, update split on dim %d as %s%s%s", w->name,
	               mesh_axes_size(m, axes), k, sp, wp->padding ? " (padded)" : "",
	               mode == WUS_AUTO ? "; auto: cheaper on the cost model" : "");
	w->has_spec = true; /* keep w as propagated while the update is re-propagated */
	/* the gradient keeps w's sharding, a pending sum until its reduce_scatter
	 * (and, fixed so, keeps the widened split from leaking back into the
	 * backward and forward passes) */
	Spec gs = w->spec;
	gs.partial = (uint8_t)(pending[tp->grad] & axes), gs.reduce = REDUCE_SUM;
	annotate(g, tp->grad, &gs, t->pos);
	annotate(g, tp->reduced, &s2, t->pos);
	for (int i = 0; i < tp->nstate; i++) {
		annotate(g, tp->state[i], &s2, t->pos);
		annotate(g, tp->next_state[i], &s2, t->pos);
	}
	if (before_use(g, tp->param)) /* the weight lives sharded; before_use gathers it */
		annotate(g, tp->next, &s2, t->pos);
	else
		split_next(g, tp, &s2, t->pos);
}

/* w%SUFFIX = copy(w), annotated whole: a gathered copy of w. */
static int full_copy(Graph *g, int w, const char *suffix, const Spec *whole, Pos pos)
{
	char name[512];
	snprintf(name, sizeof name, "%s%s", g->values.a[w].name, suffix);
	int f = graph_value(g, name, g->values.a[w].dtype, &g->values.a[w].shape, VK_INTER, g->values.a[w].pos);
	graph_op(g, OP_COPY, &w, 1, f, g->values.a[w].pos);
	annotate(g, f, whole, pos);
	return f;
}

/* A gathered copy of w small enough for the combining pass (its
 * per-device bytes, with a margin for padding, under group_bytes): it
 * joins one prefetch of all small weights, which runs where its last
 * member's copy is, so such copies stay at the front of the step, and one
 * copy serves the forward and the backward. */
static bool small_copy(const Graph *g, int w, const Spec *whole)
{
	int64_t shards = 1;
	for (int d = 0; d < whole->rank; d++)
		for (int j = 0; j < whole->nax[d]; j++)
			shards *= g->mesh.size[whole->ax[d][j]];
	int64_t bytes = shape_numel(&g->values.a[w].shape) * dtype_size(g->values.a[w].dtype) / shards;
	return bytes < 2 * g->train->group_bytes;
}

/* Put the ops in the order of their keys, stably; producers and the
 * train's update ranges follow.  The keys must keep every op after the
 * producers of its operands. */
static void reorder_ops(Graph *g, const int *key, int nkeys)
{
	int n = g->ops.n;
	int *start = xcalloc((size_t)nkeys + 2, sizeof(int)), *where = xmalloc(sizeof(int) * (size_t)(n + 1));
	for (int i = 0; i < n; i++)
		start[key[i] + 1]++;
	for (int k = 0; k < nkeys; k++)
		start[k + 1] += start[k];
	Op *ops = xmalloc(sizeof(Op) * (size_t)(n + 1));
	for (int i = 0; i < n; i++)
		where[i] = start[key[i]]++, ops[where[i]] = g->ops.a[i];
	memcpy(g->ops.a, ops, sizeof(Op) * (size_t)n);
	for (int v = 0; v < g->values.n; v++)
		if (g->values.a[v].producer >= 0)
			g->values.a[v].producer = where[g->values.a[v].producer];
	Train *t = g->train;
	for (int i = 0; i < t->nparams; i++) /* an update moves as a whole: no op lands inside one */
		if (t->params[i].nops > 0)
			t->params[i].first_op = where[t->params[i].first_op];
	free(start), free(where), free(ops);
}

typedef struct {
	int at, op; /* a position in the program (the first reader, the producer), and the op placed by it
	             * (-1 - w: a kept weight w's first backward reader, no op; see gather_before_use) */
} Placed;

static int by_at(const void *a, const void *b)
{
	const Placed *x = a, *y = b;
	return x->at != y->at ? (x->at > y->at) - (x->at < y->at) : (x->op > y->op) - (x->op < y->op);
}

/* Prefetch: each large gathered copy (key 2r, r its first reader) moves to
 * just before the first reader of the copy `depth` places before it (the
 * copies sharing a first reader are one place), so its gather runs while
 * the compute stream works on those weights; the price is `depth` more
 * gathered weights alive, as ZeRO-3 and FSDP prefetch ahead.  A copy
 * moves no further back than a copy of its own weight (the backward's
 * first, of the forward's last, keeps its place): two gathers of one
 * weight are not alive at once.  Each copy moves by the places as they
 * were; one pass over the places, the last place of each weight kept. */
static void prefetch_copies(const Graph *g, int first, int depth, int *key, const Placed *kept, int nkept)
{
	Placed *c = xmalloc(sizeof *c * (size_t)(g->ops.n - first + nkept + 1));
	int n = 0;
	for (int j = first; j < g->ops.n; j++)
		if (key[j] > 0 && key[j] < 2 * first)
			c[n++] = (Placed){key[j] / 2, j};
	for (int k = 0; k < nkept; k++)
		c[n++] = kept[k];
	qsort(c, (size_t)n, sizeof *c, by_at);
	int *at = xmalloc(sizeof(int) * (size_t)(n + 1));  /* per place: its first reader */
	int *last = xmalloc(sizeof(int) * (size_t)(g->values.n + 1)); /* per weight: its latest place so far */
	for (int v = 0; v < g->values.n; v++)
		last[v] = -1;
	for (int k = 0, p = -1; k < n;) {
		at[++p] = c[k].at;
		int end = k;
		while (end < n && c[end].at == c[k].at)
			end++;
		for (int j = k; j < end; j++) {
			if (c[j].op < 0) /* a kept weight's backward use: a place, no copy to move */
				continue;
			int to = p - depth > last[g->ops.a[c[j].op].in[0]] + 1 ? p - depth : last[g->ops.a[c[j].op].in[0]] + 1;
			if (to < 0)
				to = 0;
			if (to < p)
				key[c[j].op] = 2 * at[to];
		}
		for (int j = k; j < end; j++)
			last[c[j].op < 0 ? -1 - c[j].op : g->ops.a[c[j].op].in[0]] = p;
		k = end;
	}
	free(at), free(last);
	free(c);
}

/* Delay: each sharded gradient's reduction (key 2p + 2, after its
 * producer p) moves to just after the producer of the gradient reduced
 * `depth` after it, or before its own first reader if that is sooner:
 * the reduce_scatter starts when the gradient is made either way, and the
 * local copy after it, on the compute stream, then waits for it only
 * once those gradients are made.  The price: `depth` more whole gradients
 * alive, as DDP and ZeRO reduce buckets while the next fill. */
static void delay_reductions(const Graph *g, int first, int depth, Placed *red, int n, int *key)
{
	int *reader = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1)); /* per op: its result's first reader */
	for (int i = 0; i < g->ops.n; i++)
		reader[i] = INT_MAX;
	for (int i = first - 1; i >= 0; i--)
		for (int k = 0; k < g->ops.a[i].nin; k++) {
			int p = g->values.a[g->ops.a[i].in[k]].producer;
			if (p >= 0)
				reader[p] = i;
		}
	qsort(red, (size_t)n, sizeof *red, by_at);
	for (int k = 0; k + 1 < n; k++) {
		int j = k + depth < n ? k + depth : n - 1;
		int after = red[j].at < reader[red[k].op] - 1 ? red[j].at : reader[red[k].op] - 1;
		if (after > red[k].at)
			key[red[k].op] = 2 * after + 2;
	}
	free(reader);
}

/* after_update: the copies w%next = copy(w%shard), whose all_gathers end
 * the step, go in the order the next step first reads the weights (key
 * 2 * first + 1 + r, r the first reader): the collectives run in the order
 * they become ready, so in the order of the params they would start with
 * the last layer's or the unembedding's, which the next step needs last,
 * while its first layer waits. */
static void order_gathers(const Graph *g, const WusReport *rep, int first, int *key)
{
	const Train *t = g->train;
	int *reader = xmalloc(sizeof(int) * (size_t)(g->values.n + 1)); /* per value: its first reader */
	for (int v = 0; v < g->values.n; v++)
		reader[v] = first;
	for (int i = first - 1; i >= 0; i--)
		for (int k = 0; k < g->ops.a[i].nin; k++)
			reader[g->ops.a[i].in[k]] = i;
	for (int i = 0; i < rep->n; i++) {
		int c = g->values.a[t->params[i].next].producer;
		if (rep->p[i].sharded && !before_use(g, t->params[i].param) && c >= 0) /* made by split_next, after every op of the step: read by none */
			key[c] = 2 * first + 1 + reader[t->params[i].param];
	}
	free(reader);
}

/* Where the ops of a sharded update go.  Ops before `first` keep their
 * order (key 2i + 1); the gathered copies of before_use (ops from `first`
 * on) go just before their first reader (key 2j), small ones (small_copy)
 * to the front: the partitioner gathers a copy where the copy is, so a
 * large weight is gathered when first needed, not at the front of the
 * step; then each moves `prefetch` weights earlier (prefetch_copies).  With
 * before_use, the reduction of a sharded param's gradient (its NAME%grad)
 * goes just after the gradient is made (key 2p + 2), so the gradient's
 * reduce_scatter frees the whole gradient there, as ZeRO-3 reduces as the
 * backward pass goes; at the end of the backward pass every whole
 * gradient would be alive at once.  The local copy after the
 * reduce_scatter then waits in the backward pass, on the compute stream,
 * for the collective: delay_reductions moves it past the next gradients.
 * after_update, which keeps whole weights and so saves less memory
 * anyway, keeps the reductions at the end, where nothing waits for them. */
static void place_ops(Graph *g, const WusReport *rep, int first, const Placed *kept, int nkept)
{
	int n = g->ops.n;
	int *key = xmalloc(sizeof(int) * (size_t)(n + 1));
	for (int i = 0; i < n; i++)
		key[i] = i < first ? 2 * i + 1 : 2 * first;
	for (int i = first - 1; i >= 0; i--)
		for (int k = 0; k < g->ops.a[i].nin; k++) {
			int p = g->values.a[g->ops.a[i].in[k]].producer;
			if (p >= first)
				key[p] = 2 * i;
		}
	for (int j = first; j < n; j++)
		if (small_copy(g, g->ops.a[j].in[0], &g->values.a[g->ops.a[j].out].spec))
			key[j] = 0;
	const Train *t = g->train;
	if (t->prefetch > 0)
		prefetch_copies(g, first, t->prefetch, key, kept, nkept);
	Placed *red = xmalloc(sizeof *red * (size_t)(rep->n + 1));
	int nred = 0;
	for (int i = 0; i < rep->n; i++) {
		const TrainParam *tp = &t->params[i];
		int r = tp->reduced >= 0 ? g->values.a[tp->reduced].producer : -1;
		int p = tp->grad >= 0 ? g->values.a[tp->grad].producer : -1;
		if (before_use(g, tp->param) && rep->p[i].sharded && r >= 0 && r < first && p >= 0 && p < r)
			key[r] = 2 * p + 2, red[nred++] = (Placed){p, r};
	}
	if (t->prefetch > 0)
		delay_reductions(g, first, t->prefetch, red, nred, key);
	free(red);
	order_gathers(g, rep, first, key);
	reorder_ops(g, key, 3 * first + 3);
	free(key);
}

/* The weights whose gathered copy the backward shares with the forward
 * (bwd[w] = KEPT, and a place in kept: the backward's first reader, -1 -
 * w; the count returned): those gathered at their first use
 * (all_gather: first_use), held from the forward's first reader to the
 * backward's last, and the following.  A large weight's backward copy moves
 * `prefetch` places ahead of its first reader but no earlier than the
 * place after its forward copy's (prefetch_copies).  Where that bound
 * stops it and it still moves (the weights the forward reads last but
 * one or two, which the backward reads soon), the weight would be
 * gathered again a place after it was freed: the forward copy stays alive
 * instead, one gather less, held only over the rest of its place's ops
 * more.  The forward's last weight, whose backward copy is in the next
 * place and does not move, is gathered again: kept, it would be held
 * over the loss, where the peak usually is (unless its all_gather says
 * first_use: FSDP's root, whose weights the forward reads last).  The
 * places count a kept copy as if it were there (prefetch_copies takes the
 * kept places), so the copies after it move as before. */
enum { KEPT = -2 };
static int keep_weights(const Graph *g, const WusReport *rep, int first, int lossop, const int *owner, const uint8_t *reads,
                        int *bwd, Placed *kept)
{
	int depth = g->train->prefetch, nvals = g->values.n, n = 0;
	if (lossop < 0)
		return 0;
	int *fr = xmalloc(sizeof(int) * 2 * (size_t)(nvals + 1)); /* per weight: its first forward and backward readers */
	int *rank = xcalloc((size_t)first + 1, sizeof(int));        /* per op: 1 if a copy's first reader, then its place */
	for (int v = 0; v < 2 * nvals; v++)
		fr[v] = -1;
	bool *large = xcalloc((size_t)nvals + 1, sizeof(bool));
	for (int i = 0; i < rep->n; i++) {
		int w = rep->p[i].param;
		large[w] = rep->p[i].sharded && before_use(g, w) && !small_copy(g, w, &g->values.a[w].spec);
	}
	for (int i = first - 1; i >= 0; i--)
		for (int k = 0; k < g->ops.a[i].nin; k++) {
			int w = g->ops.a[i].in[k];
			if (large[w] && owner[i] != w)
				fr[2 * w + (i > lossop)] = i;
		}
	for (int v = 0; v < 2 * nvals; v++)
		if (fr[v] >= 0)
			rank[fr[v]] = 1;
	for (int i = 0, p = -1; i < first; i++)
		p += rank[i], rank[i] = p;
	for (int w = 0; w < nvals; w++)
		if (large[w] && reads[w] == 3 &&
		    (first_use(g, w) || (depth > 0 && rank[fr[2 * w + 1]] - depth <= rank[fr[2 * w]] + 1 &&
		                         rank[fr[2 * w + 1]] > rank[fr[2 * w]] + 1)))
			bwd[w] = KEPT, kept[n++] = (Placed){fr[2 * w + 1], -1 - w};
	free(fr), free(rank), free(large);
	return n;
}

/* all_gather: before_use.  Each sharded weight w lives sharded between steps:
 * w is annotated like its update, and the forward reads w%full = copy(w),
 * the backward w%full%bwd = copy(w), both annotated as w was, which the
 * partitioner gathers at their first uses.  Two copies, as ZeRO-3 and FSDP
 * gather twice: one would keep every gathered weight alive from the forward
 * to the backward, all of them at once at the peak, and save no memory.
 * place_ops puts each copy just before its first reader. */
static int gather_before_use(Graph *g, WusReport *rep, Placed *kept)
{
	Train *t = g->train;
	int first = g->ops.n, nvals = g->values.n;
	int lossop = g->values.a[t->loss].producer; /* ops after it are the backward (and the updates) */
	int *full = xmalloc(sizeof(int) * (size_t)(nvals + 1)), *bwd = xmalloc(sizeof(int) * (size_t)(nvals + 1));
	for (int v = 0; v < nvals; v++)
		full[v] = bwd[v] = -1;
	int *owner = xmalloc(sizeof(int) * (size_t)(first + 1)); /* per op: the param it updates, or -1 */
	for (int i = 0; i < first; i++)
		owner[i] = -1;
	for (int p = 0; p < t->nparams; p++)
		for (int i = t->params[p].first_op; i < t->params[p].first_op + t->params[p].nops; i++)
			owner[i] = t->params[p].param;
	uint8_t *reads = xcalloc((size_t)nvals + 1, 1); /* per param: 1 read by the forward, 2 by the backward */
	for (int i = 0; i < first; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++)
			if (owner[i] != g->ops.a[i].in[k])
				reads[g->ops.a[i].in[k]] |= lossop >= 0 && i > lossop ? 2 : 1;
	int nkept = keep_weights(g, rep, first, lossop, owner, reads, bwd, kept);
	for (int i = 0; i < rep->n; i++) {
		if (!rep->p[i].sharded || !before_use(g, rep->p[i].param))
			continue;
		int w = rep->p[i].param;
		Spec whole = g->values.a[w].spec, shard = g->values.a[t->params[i].next].spec;
		bool small = small_copy(g, w, &whole);
		if (reads[w] & 1 || (reads[w] && small))
			full[w] = full_copy(g, w, "%full", &whole, t->pos);
		if (reads[w] & 2 && !small && bwd[w] != KEPT)
			bwd[w] = full_copy(g, w, "%full%bwd", &whole, t->pos);
		else
			bwd[w] = full[w];
		annotate(g, w, &shard, t->pos);
	}
	free(reads);
	for (int i = 0; i < first; i++) {
		Op *op = &g->ops.a[i];
		for (int k = 0; k < op->nin; k++) {
			int v = op->in[k];
			int f = v >= nvals || owner[i] == v ? -1 : lossop >= 0 && i > lossop ? bwd[v] : full[v];
			if (f < 0)
				continue;
			op->in[k] = f;
			g->values.a[v].nuses--, g->values.a[f].nuses++;
		}
	}
	free(full);
	free(bwd);
	free(owner);
	return nkept;
}

int wus_apply(Graph *g, const HwProfile *hw, WusReport *rep, Diag *d)
{
	const Train *t = g->train;
	memset(rep, 0, sizeof *rep);
	if (!t || !t->built)
		return 0;
	rep->n = t->nparams;
	rep->p = arena_alloc(&g->arena, sizeof(WusParam) * (size_t)(t->nparams ? t->nparams : 1));
	unsigned *pending = pending_axes(g); /* before the decisions add values */
	for (int i = 0; i < t->nparams; i++)
		decide(g, hw, &t->params[i], &rep->p[i], pending);
	free(pending);
	int first = g->ops.n;
	bool any = false;
	for (int i = 0; i < rep->n; i++)
		any |= rep->p[i].sharded && before_use(g, rep->p[i].param);
	Placed *kept = xmalloc(sizeof *kept * (size_t)(t->nparams + 1));
	int nkept = any ? gather_before_use(g, rep, kept) : 0;
	place_ops(g, rep, first, kept, nkept);
	free(kept);
	(void)d;
	return 0;
}
