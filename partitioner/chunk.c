/* chunk.c: a long collective that holds the links a more urgent one waits
 * for, split into chunks the urgent one can run between.
 *
 * A communication stream runs one collective at a time on its links, to
 * the end: a collective whose operands are ready a moment after a long
 * one started (the backward pass's first weight gather, just after the
 * output projection's gradient reduction) waits for all of it, and the
 * compute stream waits for both.  The cost model's schedule says which
 * (OpEstimate.wait_on, behind: docs/cost_model.md, "Where the step
 * waits").  Cut into chunks along a dim the collective does not touch,
 * the long one becomes k collectives of the same bytes, and the stream
 * runs the one needed sooner between two of them; a concat rebuilds the
 * result where it is first read.  Each chunk pays the collective's
 * latency again, and the slices and the concat copy its bytes once more
 * on the compute stream: the cost model prices the program both ways. */
#include "chunk.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../spmd/ops.h"
#include "part.h"
#include "step.h"

/* The waits the chunks may save must reach this share of the step for the
 * chunked program to be priced; it is kept when 0.1% faster. */
#define MIN_GAIN 0.002

typedef struct {
	int k;      /* chunks (0: not split) */
	int dim;    /* along this dim of the operand and the result */
	int first;  /* the first op reading the result (ops.n: none in the step) */
} Split;

static bool chunkable(OpKind k) { return k == OP_ALL_GATHER || k == OP_REDUCE_SCATTER || k == OP_ALL_REDUCE; }

/* The dim of collective op's operand and result to cut into k chunks: not
 * split over any mesh axis in either, not the gathered or scattered dim,
 * at least k long; the longest (ties: the first).  -1: none. */
static int chunk_dim(const Graph *g, const Op *op, int k)
{
	const Value *x = &g->values.a[op->in[0]], *y = &g->values.a[op->out];
	int best = -1;
	for (int d = 0; d < x->shape.rank && x->shape.rank == y->shape.rank; d++) {
		bool whole = x->shape.dim[d] == x->global.dim[d] && y->shape.dim[d] == y->global.dim[d] &&
		             x->shape.dim[d] == y->shape.dim[d] && !x->spec.nax[d] && !y->spec.nax[d];
		if (!whole || (op->kind != OP_ALL_REDUCE && d == op->attr->dim) || x->shape.dim[d] < k)
			continue;
		if (best < 0 || x->shape.dim[d] > x->shape.dim[best])
			best = d;
	}
	return best;
}

/* The collectives to split (sp, per op), from the waits in e: one that
 * held the links while a collective a compute op waits for was ready,
 * whose own result is read late enough that the waiting one can run
 * between its chunks without its reader waiting instead (the slack from
 * its end to its first reader at least the waiting one's seconds).  The
 * waits they may save, in all. */
static double find(const Graph *g, const CostEstimate *e, Split *sp)
{
	int n = g->ops.n;
	double saves = 0;
	int *first = xmalloc(sizeof(int) * ((size_t)n + 1)); /* per op: the first op reading its result (n: none) */
	for (int i = 0; i < n; i++)
		first[i] = n;
	for (int i = n - 1; i >= 0; i--)
		for (int j = 0; j < g->ops.a[i].nin; j++) {
			int p = g->values.a[g->ops.a[i].in[j]].producer;
			if (p >= 0)
				first[p] = i;
		}
	for (int i = 0; i < n; i++) {
		const OpEstimate *o = &e->op[i];
		if (o->comm || o->wait <= 0 || o->wait_on < 0)
			continue;
		const OpEstimate *c = &e->op[o->wait_on];
		int b = c->behind;
		if (b < 0 || c->delay <= 0 || !chunkable(g->ops.a[b].kind) || e->op[b].seconds <= c->seconds)
			continue;
		if (first[b] < n && e->op[first[b]].start - e->op[b].end < c->seconds)
			continue;
		int k = (int)ceil(e->op[b].seconds / fmax(c->seconds, e->op[b].seconds / CHUNK_MAX));
		k = k < 2 ? 2 : k > CHUNK_MAX ? CHUNK_MAX : k;
		if (k <= sp[b].k)
			k = sp[b].k;
		int d = chunk_dim(g, &g->ops.a[b], k);
		if (d < 0)
			continue;
		sp[b].k = k, sp[b].dim = d, sp[b].first = first[b];
		saves += fmin(o->wait, c->delay);
	}
	free(first);
	return saves;
}

/* Append op k (attributes *at) reading in[] into value out to seq, made for the op `from`. */
static void put(Graph *g, int *seq, int *nseq, OpKind k, const int *in, int nin, int out, const Attr *at, const Op *from,
                const char *why)
{
	Op copy = *from; /* graph_op may move the op array */
	int id = graph_op(g, k, in, nin, out, copy.pos);
	Op *op = &g->ops.a[id];
	*op->attr = *at;
	op->src_op = copy.src_op;
	op->why = why;
	seq[(*nseq)++] = id;
}

/* Collective i cut into chunks: the slices and the chunks' collectives
 * into seq; their results into parts[0..k). */
static void emit_chunks(Graph *g, int i, const Split *s, int *seq, int *nseq, int *parts)
{
	Op op = g->ops.a[i];
	Attr at = *op.attr;
	int x = op.in[0], y = op.out;
	int64_t len = g->values.a[x].shape.dim[s->dim];
	const char *why = arena_printf(&g->arena, "%s; in %d chunks, which the collectives needed sooner can run between",
	                               op.why ? op.why : op_table[op.kind].name, s->k);
	for (int c = 0; c < s->k; c++) {
		int64_t lo = len * c / s->k, hi = len * (c + 1) / s->k;
		Attr sl = {0};
		for (int d = 0; d < g->values.a[x].shape.rank; d++)
			sl.start[d] = 0, sl.limit[d] = g->values.a[x].shape.dim[d], sl.stride[d] = 1;
		sl.start[s->dim] = lo, sl.limit[s->dim] = hi;
		int xc = value_like(g, x, s->dim, hi - lo);
		put(g, seq, nseq, OP_SLICE, &x, 1, xc, &sl, &op, NULL);
		parts[c] = value_like(g, y, s->dim, hi - lo);
		put(g, seq, nseq, op.kind, &xc, 1, parts[c], &at, &op, why);
	}
}

/* Rewrite g with the splits sp, in a new op order. */
static void rewrite(Graph *g, const Split *sp)
{
	int n = g->ops.n, extra = 0;
	for (int i = 0; i < n; i++)
		extra += sp[i].k ? 2 * sp[i].k + 1 : 0;
	int *seq = xmalloc(sizeof(int) * ((size_t)(n + extra) + 1)), nseq = 0;
	int *off = xmalloc(sizeof(int) * ((size_t)n + 1)), np = 0; /* per op: its chunks' results at parts + off */
	for (int i = 0; i < n; i++)
		off[i] = np, np += sp[i].k;
	int *parts = xmalloc(sizeof(int) * ((size_t)np + 1));
	/* the concats, by the op they go before (n: the end) */
	int *at = xmalloc(sizeof(int) * ((size_t)n + 2)), *next = xmalloc(sizeof(int) * ((size_t)n + 1));
	for (int i = 0; i <= n; i++)
		at[i] = -1;
	for (int i = n - 1; i >= 0; i--)
		if (sp[i].k)
			next[i] = at[sp[i].first], at[sp[i].first] = i;
	for (int i = 0; i <= n; i++) {
		for (int c = at[i]; c >= 0; c = next[c]) {
			Op op = g->ops.a[c];
			Attr cat = {.axis = sp[c].dim};
			put(g, seq, &nseq, OP_CONCAT, &parts[off[c]], sp[c].k, op.out, &cat, &op, NULL);
		}
		if (i == n)
			break;
		if (sp[i].k)
			emit_chunks(g, i, &sp[i], seq, &nseq, &parts[off[i]]);
		else
			seq[nseq++] = i;
	}
	graph_order_ops(g, seq, nseq);
	free(seq), free(off), free(parts), free(at), free(next);
}

bool chunk_collectives(Graph *prog, const Graph *model, const int *map, const HwProfile *hw, CostEstimate *priced,
                       ChunkReport *rep)
{
	ChunkReport local;
	if (!rep)
		rep = &local;
	memset(rep, 0, sizeof *rep);
	CostEstimate before = *priced;
	memset(priced, 0, sizeof *priced);
	if (model->pipeline || prog->stage_axis >= 0 || hw->topo == TOPO_THREADS || !map || prog->ops.n == 0) {
		*priced = before;
		return false;
	}
	if (!before.op)
		step_price(model, prog, map, hw, &before);
	int n = prog->ops.n, nv = prog->values.n;
	Split *sp = xcalloc((size_t)n + 1, sizeof *sp);
	double saves = find(prog, &before, sp);
	for (int i = 0; i < n; i++)
		rep->collectives += sp[i].k > 0, rep->chunks += sp[i].k;
	if (rep->collectives) /* something to report */
		snprintf(rep->hw, sizeof rep->hw, "%s", hw->name);
	rep->before_s = before.overlapped_s, rep->before_peak = before.mem.peak;
	CostEstimate *left = &before, after;
	if (rep->collectives && saves >= before.overlapped_s * MIN_GAIN) {
		Op *ops = xmalloc(sizeof(Op) * ((size_t)n + 1));
		memcpy(ops, prog->ops.a, sizeof(Op) * (size_t)n);
		rewrite(prog, sp);
		step_price(model, prog, map, hw, &after);
		rep->tried = true, rep->after_s = after.overlapped_s, rep->after_peak = after.mem.peak;
		rep->kept = step_kept(&after, before.overlapped_s, before.mem.peak);
		if (rep->kept) {
			cost_estimate_free(&before);
			left = &after;
		} else { /* as it was */
			prog->values.n = nv;
			graph_set_ops(prog, ops, n);
			cost_estimate_free(&after);
		}
		free(ops);
	}
	free(sp);
	*priced = *left;
	return rep->kept;
}
