/* window.c: collective matmul — gathers and scatters next to einsums split
 * into blocks that pass round the ring while the einsum runs.
 *
 * Tensor parallelism with sequence parallelism gathers the residual
 * stream's sequence before the einsums of a block (y = einsum(x, w) with x
 * all_gathered over the model axis) and scatters the partial sums they make
 * after it (reduce_scatter(einsum(a, b))).  Each sits between ops that need
 * its result at once, so nothing hides it.  Split into n blocks over the
 * ring of n devices, the einsum of the block a device holds runs while the
 * next block is on its way: n - 1 collective_permutes move the same bytes
 * as the ring all_gather or reduce_scatter did, and each overlaps a 1/n
 * of the einsum (Wang et al., "Overlap communication with dependent
 * computation via decomposition", ASPLOS 2023, which XLA calls windowed
 * einsum).
 *
 * Gather.  Device c holds block c of x.  x_0 = x; x_s+1 = x_s passed one
 * step round the ring (c receives from c + 1), so x_s is block c + s
 * (mod n).  Each reader's einsum on x_s makes block c + s of its result
 * along the gathered dim; the n blocks concatenated start at block c, and
 * a shard_roll by c blocks puts them in place.  A gathered value other ops
 * read too (the backward pass's weight gradients) is made again the same
 * way from the blocks, after the readers' einsums, instead of gathered;
 * or, where the estimate saves more so, the first einsum reader alone
 * takes the blocks and the gather stays for the rest (find: its bytes
 * sent twice, the copies spared).
 *
 * Scatter.  Device c must end with block c of the sum over the ring.  a'
 * = a rolled back by c blocks (block j of a' is block c + j of a); at step
 * s device c einsums block n - 1 - s of a' (block c - s - 1 of a), adds
 * the partial sum its neighbour c - 1 passed it (made for the same block),
 * and passes the sum on; after n steps it holds block c, summed over
 * every device.
 *
 * All_reduce.  Without sequence parallelism the partial sums an einsum
 * makes (a bias's share perhaps added) are all_reduced whole: the einsum
 * is cut into 2 to REDUCE_BLOCKS blocks along a dim of its result whole on
 * the device that one operand alone carries, and each block's sums are
 * all_reduced while the next block is einsummed (reduce_cand,
 * emit_reduce); the ops after the all_reduce may take its blocks too
 * (reduce_chain, emit_chain).
 *
 * Both ways.  On a closed torus ring the ring collectives send both ways
 * round it and a permute one way; there the blocks (and the sums) go both
 * ways, one send each way at a time, n/2 steps instead of n - 1, as XLA's
 * bidirectional windowed einsum does (emit_sends, emit_scatter).
 *
 * Which to take is the cost model's call (saving, then the whole program
 * priced: window.h).
 *
 * New values keep the layout of the value they stand for, with the split
 * dim's global size cut to the block (the concatenation and the roll have
 * the full one): a program written out reads back.  What the blocks hold
 * depends on the device, as a shard_slice's does. */
#include "window.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../spmd/ops.h"
#include "../spmd/train_section.h"
#include "part.h"
#include "step.h"

/* The savings expected (see saving) must reach this share of the step for
 * the new program to be priced; it is kept when 0.1% faster. */
#define MIN_GAIN 0.002

/* An all_gather whose einsum readers can take its blocks, or a
 * reduce_scatter whose einsum can make them. */
typedef struct {
	int op;          /* the collective */
	int axis, n;     /* its mesh axis and ring size */
	bool keep;       /* a gather others read too (or an output) ... */
	bool rebuild;    /* ... made again from its blocks after the readers' (else it stays) */
	bool twice;      /* ... left for them, the first reader's blocks sent besides (find's choice) */
	int nrd, *rd;    /* gather: the readers taken (op ids, program order); scatter: the einsum */
	int *rdim;       /* gather: per reader, the gathered dim in its result */
	int dim;         /* gather: x's dim; scatter: the scattered operand's dim */
	int operand;     /* scatter: which of the einsum's operands holds that dim */
	bool together;   /* gather: every reader's blocks at the first reader */
	bool both;       /* blocks (gather) or sums (scatter) sent both ways round the ring (a closed torus ring) */
	int *blk;        /* gather: the blocks as they arrive (blk[s] is block c + s) */
	int mid;         /* all_reduce: the add between the einsum and it (a bias), or -1 */
	int nch, *ch;    /* all_reduce: the ops after it that take its blocks (program order; reduce_chain) */
	int *chd;        /* per chain op, its result's dim in blocks */
	double copies;   /* all_reduce: bytes its chain copies (slices of full operands, values read after it concatenated) */
} Cand;

typedef struct {
	Graph *g;
	int *start, *list; /* readers of each value (op ids, once per operand) */
	bool *out;          /* values that are outputs of the program */
} Uses;

static void uses_init(Uses *u, Graph *g)
{
	u->g = g;
	graph_readers(g, &u->start, &u->list);
	u->out = xcalloc((size_t)g->values.n + 1, sizeof(bool));
	for (int i = 0; i < g->outputs.n; i++)
		u->out[g->outputs.a[i]] = true;
	if (g->train)
		for (int i = 0; i < g->train->ncarry; i++)
			u->out[g->train->carry_from[i]] = true;
}

static void uses_free(Uses *u) { free(u->start), free(u->list), free(u->out); }

/* Where letter c occurs in operand or result k of an einsum: its dim, or
 * -1 when it is not there or more than once. */
static int letter_dim(const Attr *a, int k, char c)
{
	int at = -1;
	for (int i = 0; i < a->nlet[k]; i++)
		if (a->let[k][i] == c) {
			if (at >= 0)
				return -1;
			at = i;
		}
	return at;
}

static bool has_letter(const Attr *a, int k, char c)
{
	return memchr(a->let[k], c, (size_t)a->nlet[k]) != NULL;
}

/* A one-axis ring of 2 to WINDOW_MAX_RING devices: its size, else 0. */
static int ring(const Graph *g, const Op *op)
{
	if (op->attr->ncax != 1)
		return 0;
	int n = (int)g->mesh.size[op->attr->cax[0]];
	return n >= 2 && n <= WINDOW_MAX_RING ? n : 0;
}

/* Is dim d of v whole on each device (its local size its global one)? */
static bool whole(const Value *v, int d) { return v->shape.dim[d] == v->global.dim[d]; }

/* Can einsum e read all_gather result g (of x, gathered on dim d) in
 * blocks?  Its result's dim there, or -1. */
static int gather_reader(const Graph *g, const Op *e, int gv, int d)
{
	if (e->kind != OP_EINSUM)
		return -1;
	int j = e->in[0] == gv ? 0 : 1;
	if (e->in[j] != gv || (e->nin == 2 && e->in[1 - j] == gv))
		return -1;
	const Attr *a = e->attr;
	char c = a->let[j][d];
	if (letter_dim(a, j, c) != d || (e->nin == 2 && has_letter(a, 1 - j, c)))
		return -1;
	int dy = letter_dim(a, 2, c);
	const Value *y = &g->values.a[e->out];
	if (dy < 0 || !whole(y, dy) || y->shape.dim[dy] != g->values.a[gv].shape.dim[d])
		return -1;
	return dy;
}

static bool gather_cand(const Uses *u, int i, Cand *c)
{
	const Graph *g = u->g;
	const Op *op = &g->ops.a[i];
	int n = ring(g, op), d = op->attr->dim, gv = op->out;
	const Value *x = &g->values.a[op->in[0]], *y = &g->values.a[gv];
	if (!n || !whole(y, d) || x->shape.dim[d] * n != y->shape.dim[d] || x->dtype != y->dtype)
		return false;
	int cnt = u->start[gv + 1] - u->start[gv];
	*c = (Cand){.op = i, .axis = op->attr->cax[0], .n = n, .dim = d, .keep = u->out[gv], .mid = -1};
	c->rd = xmalloc(sizeof(int) * ((size_t)cnt + 1)), c->rdim = xmalloc(sizeof(int) * ((size_t)cnt + 1));
	for (int k = u->start[gv]; k < u->start[gv + 1]; k++) {
		int e = u->list[k], dy = gather_reader(g, &g->ops.a[e], gv, d);
		if (dy < 0) {
			c->keep = true;
		} else if (!c->nrd || c->rd[c->nrd - 1] != e) {
			c->rd[c->nrd] = e, c->rdim[c->nrd++] = dy;
		}
	}
	if (!c->nrd) {
		free(c->rd), free(c->rdim);
		return false;
	}
	c->rebuild = c->keep && !u->out[gv]; /* every other reader after the first einsum's blocks */
	for (int k = u->start[gv]; k < u->start[gv + 1]; k++)
		c->rebuild &= u->list[k] >= c->rd[0];
	return true;
}

/* The operand of einsum e that alone carries dim d of its result, whole
 * there and as long (its dim into *dj), or -1. */
static int operand_with(const Graph *g, const Op *e, int d, int *dj)
{
	const Attr *a = e->attr;
	char ch = a->let[2][d];
	for (int j = 0; j < e->nin; j++) {
		*dj = letter_dim(a, j, ch);
		if (*dj < 0 || (e->nin == 2 && has_letter(a, 1 - j, ch)))
			continue;
		const Value *x = &g->values.a[e->in[j]];
		if (whole(x, *dj) && x->shape.dim[*dj] == g->values.a[e->out].shape.dim[d])
			return j;
	}
	return -1;
}

static bool scatter_cand(const Uses *u, int i, Cand *c)
{
	const Graph *g = u->g;
	const Op *op = &g->ops.a[i];
	int n = ring(g, op), d = op->attr->dim, pv = op->in[0];
	const Value *p = &g->values.a[pv], *r = &g->values.a[op->out];
	int pe = p->producer;
	if (!n || op->attr->reduce != REDUCE_SUM || pe < 0 || u->out[pv] || u->start[pv + 1] - u->start[pv] != 1)
		return false;
	const Op *e = &g->ops.a[pe];
	if (e->kind != OP_EINSUM || !whole(p, d) || p->shape.dim[d] != r->shape.dim[d] * n || p->dtype != r->dtype)
		return false;
	const Attr *a = e->attr;
	char ch = a->let[2][d];
	if (letter_dim(a, 2, ch) != d)
		return false;
	if (e->nin == 2 && e->in[0] == e->in[1])
		return false;
	int dj, j = operand_with(g, e, d, &dj);
	if (j < 0)
		return false;
	*c = (Cand){.op = i, .axis = op->attr->cax[0], .n = n, .dim = dj, .operand = j, .nrd = 1, .mid = -1};
	c->rd = xmalloc(sizeof(int) * 2), c->rdim = xmalloc(sizeof(int) * 2);
	c->rd[0] = pe, c->rdim[0] = d;
	return true;
}

/* An all_reduce of the partial sums an einsum makes (Megatron's row-
 * parallel projection): the einsum split into 2 to REDUCE_BLOCKS blocks
 * along a dim of its result that one operand alone carries, whole on
 * each device (the sequence), each block's sums all_reduced as soon as it
 * is made; the blocks concatenated into the all_reduce's result.  Block
 * k's all_reduce runs while block k + 1 is computed.  How many blocks is
 * find's choice: more hide more of the all_reduce, each costs its kernels
 * and the all_reduce's latency again. */
enum { REDUCE_BLOCKS = 4 };

/* The only reader of value v, or -1. */
static int only_reader(const Uses *u, int v)
{
	return !u->out[v] && u->start[v + 1] - u->start[v] == 1 ? u->list[u->start[v]] : -1;
}

/* Is v (an operand of an add beside a block of dim d of its rank-`rank`
 * result) the same for every block: without that dim, or of size 1 there? */
static bool same_per_block(const Value *v, int rank, int d)
{
	int k = d - (rank - v->shape.rank);
	return k < 0 || v->shape.dim[k] == 1;
}

static bool reduce_cand(const Uses *u, int i, Cand *c)
{
	const Graph *g = u->g;
	const Op *op = &g->ops.a[i];
	int pv = op->in[0], pe = g->values.a[pv].producer, mid = -1;
	const Value *r = &g->values.a[op->out];
	if (op->attr->reduce != REDUCE_SUM || op->attr->ncax < 1 || pe < 0 || only_reader(u, pv) != i ||
	    g->values.a[pv].dtype != r->dtype || !shape_eq(&g->values.a[pv].shape, &r->shape))
		return false;
	if (g->ops.a[pe].kind == OP_ADD) { /* a bias added to the partial sums (a share of it on each device) */
		const Op *ad = &g->ops.a[pe];
		int j = -1;
		for (int k = 0; k < 2 && j < 0; k++) {
			int x = ad->in[k], px = g->values.a[x].producer;
			if (px >= 0 && g->ops.a[px].kind == OP_EINSUM && only_reader(u, x) == pe && ad->in[1 - k] != x &&
			    shape_eq(&g->values.a[x].shape, &r->shape))
				j = k;
		}
		if (j < 0)
			return false;
		mid = pe, pe = g->values.a[ad->in[j]].producer;
	}
	int ev = g->ops.a[pe].out;
	const Value *p = &g->values.a[ev];
	const Op *e = &g->ops.a[pe];
	if (e->kind != OP_EINSUM || (e->nin == 2 && e->in[0] == e->in[1]))
		return false;
	const Attr *a = e->attr;
	for (int d = 0; d < p->shape.rank; d++) {
		char ch = a->let[2][d];
		if (letter_dim(a, 2, ch) != d || !whole(p, d) || !whole(r, d) || p->shape.dim[d] < 2)
			continue;
		if (mid >= 0) {
			const Op *ad = &g->ops.a[mid];
			int other = ad->in[0] == ev ? ad->in[1] : ad->in[0];
			if (!same_per_block(&g->values.a[other], p->shape.rank, d))
				continue;
		}
		int dj, j = operand_with(g, e, d, &dj);
		if (j < 0)
			continue;
		*c = (Cand){.op = i, .axis = -1, .n = (int)(p->shape.dim[d] < REDUCE_BLOCKS ? p->shape.dim[d] : REDUCE_BLOCKS),
		            .dim = dj, .operand = j, .nrd = 1, .mid = mid};
		c->rd = xmalloc(sizeof(int) * 2), c->rdim = xmalloc(sizeof(int) * 2);
		c->rd[0] = pe, c->rdim[0] = d;
		return true;
	}
	return false;
}

static double value_bytes(const Graph *g, int v)
{
	const Value *x = &g->values.a[v];
	return (double)shape_numel(&x->shape) * dtype_size(x->dtype);
}

/* The ops after all_reduce c that take its blocks (reduce_chain): at
 * most CHAIN_MAX, found among the CHAIN_SCAN ops after it. */
enum { CHAIN_SCAN = 64, CHAIN_MAX = 32 };

/* Which of c's values is v: -1 the all_reduce's result, j chain op j's
 * (j < nch), -2 neither. */
static int chain_at(const Graph *g, const Cand *c, int nch, int v)
{
	if (v == g->ops.a[c->op].out)
		return -1;
	for (int j = 0; j < nch; j++)
		if (g->ops.a[c->ch[j]].out == v)
			return j;
	return -2;
}

/* How value v comes out of c's first nch chain ops: the dim its blocks
 * split (the all_reduce's result or a chain op's), -1 not made by them. */
static int chain_value(const Graph *g, const Cand *c, int nch, int v)
{
	int j = chain_at(g, c, nch, v);
	return j == -2 ? -1 : j < 0 ? c->rdim[0] : c->chd[j];
}

/* The dim of v, an operand of chain op j not made by the chain, that the
 * op's blocks slice, or -1 when every block reads v whole (an einsum's
 * other operand, or an operand without the dim or of size 1 there). */
static int sliced_dim(const Graph *g, const Cand *c, int j, int v)
{
	const Op *op = &g->ops.a[c->ch[j]];
	const Value *x = &g->values.a[v];
	int dx = c->chd[j] - (g->values.a[op->out].shape.rank - x->shape.rank);
	return op->kind == OP_EINSUM || dx < 0 || x->shape.dim[dx] == 1 ? -1 : dx;
}

/* Can op i take c's blocks, block by block, given the first nch chain
 * ops (len: the blocked dims' length)?  Its result's dim in blocks, or -1.
 * Elementwise ops, reductions and normalizations along other dims, and
 * an einsum one operand of which is in blocks along a letter the other
 * lacks; a full operand of an elementwise op with the blocked dim is
 * sliced per block, one without it (or of size 1 there) read whole. */
static int chain_join(const Graph *g, const Cand *c, int nch, int i, int64_t len)
{
	const Op *op = &g->ops.a[i];
	unsigned fl = op_table[op->kind].flags;
	const Value *y = &g->values.a[op->out];
	int dy = -1, din[2] = {-1, -1};
	if (op->nin > 2 || (fl & (OPF_COLLECTIVE | OPF_DEVICE)))
		return -1;
	for (int k = 0; k < op->nin; k++)
		din[k] = chain_value(g, c, nch, op->in[k]);
	if (op->kind == OP_EINSUM) {
		if (op->nin == 2 && (op->in[0] == op->in[1] || (din[0] >= 0) == (din[1] >= 0)))
			return -1;
		int j = din[0] >= 0 ? 0 : 1;
		const Attr *a = op->attr;
		char ch = a->let[j][din[j]];
		if (letter_dim(a, j, ch) != din[j] || (op->nin == 2 && has_letter(a, 1 - j, ch)))
			return -1;
		dy = letter_dim(a, 2, ch);
	} else if (fl & OPF_BINARY) {
		for (int k = 0; k < 2; k++) {
			int at = din[k] < 0 ? -1 : din[k] + y->shape.rank - g->values.a[op->in[k]].shape.rank;
			if (din[k] >= 0 && dy >= 0 && at != dy)
				return -1;
			if (din[k] >= 0)
				dy = at;
		}
		for (int k = 0; k < 2 && dy >= 0; k++) { /* the other: read whole, or sliced where it has the dim */
			const Value *x = &g->values.a[op->in[k]];
			int dx = dy - (y->shape.rank - x->shape.rank);
			if (din[k] < 0 && dx >= 0 && x->shape.dim[dx] != 1 && (x->shape.dim[dx] != len || !whole(x, dx)))
				return -1;
		}
	} else if ((fl & OPF_UNARY) || op->kind == OP_COPY || op->kind == OP_CAST) {
		dy = din[0];
	} else if (op->kind == OP_LAYER_NORM || op->kind == OP_SOFTMAX || op->kind == OP_LOG_SOFTMAX) {
		int ax = op->attr->axes[0] < 0 ? op->attr->axes[0] + y->shape.rank : op->attr->axes[0];
		dy = ax == din[0] ? -1 : din[0];
	} else if (fl & OPF_REDUCE) {
		dy = din[0];
		for (int k = 0; k < op->attr->naxes && dy >= 0; k++)
			if (op->attr->axes[k] == din[0])
				dy = -1;
			else if (op->attr->axes[k] < din[0] && !op->attr->keepdims)
				dy--;
	}
	if (dy < 0 || y->shape.dim[dy] != len || !whole(y, dy))
		return -1;
	return dy;
}

/* Is einsum i the einsum of an all_reduce candidate (its result, a bias
 * perhaps added, all_reduced)?  A chain stops there: that candidate's
 * blocks read the chain's. */
static bool reduce_einsum(const Uses *u, int i)
{
	const Graph *g = u->g;
	if (g->ops.a[i].kind != OP_EINSUM)
		return false;
	int j = only_reader(u, g->ops.a[i].out);
	if (j >= 0 && g->ops.a[j].kind == OP_ADD)
		j = only_reader(u, g->ops.a[j].out);
	Cand c;
	if (j < 0 || g->ops.a[j].kind != OP_ALL_REDUCE || !reduce_cand(u, j, &c))
		return false;
	free(c.rd), free(c.rdim);
	return true;
}

/* The chain of all_reduce c: the ops after it, in program order, that
 * read its blocks or a chain op's (claim: the ops other candidates take)
 * and can take them block by block (chain_join).  The scan stops at an
 * op that reads the chain's values and cannot, at another candidate's op,
 * or at the einsum of another all_reduce (which then reads the chain's
 * blocks as its own); what it skips reads nothing the chain makes, and
 * the chain goes after it.  Unless it ends at such an einsum, the chain
 * ends at its last einsum.  Emitted block by block, each block's ops (the
 * projections that read the normalized residual stream among them) run
 * while the next block is all_reduced, where the ops after an all_reduce
 * would wait for its last block (emit_chain).  No einsum: no chain. */
static void reduce_chain(const Uses *u, Cand *c, const bool *claim)
{
	const Graph *g = u->g;
	int64_t len = g->values.a[g->ops.a[c->op].out].shape.dim[c->rdim[0]];
	c->nch = 0;
	c->ch = xmalloc(sizeof(int) * CHAIN_MAX), c->chd = xmalloc(sizeof(int) * CHAIN_MAX);
	int last = 0; /* chain ops up to the last einsum */
	bool feeds = false;
	for (int i = c->op + 1; i < g->ops.n && i <= c->op + CHAIN_SCAN && c->nch < CHAIN_MAX; i++) {
		const Op *op = &g->ops.a[i];
		bool reads = false;
		for (int k = 0; k < op->nin; k++)
			reads |= chain_value(g, c, c->nch, op->in[k]) != -1;
		if (claim[i])
			break;
		if (!reads)
			continue;
		if (reduce_einsum(u, i)) {
			feeds = true;
			break;
		}
		int dy = chain_join(g, c, c->nch, i, len);
		if (dy < 0)
			break;
		c->ch[c->nch] = i, c->chd[c->nch++] = dy;
		if (op->kind == OP_EINSUM)
			last = c->nch;
	}
	if (!last)
		c->nch = 0;
	else if (!feeds)
		c->nch = last;
	/* the bytes copied: full operands sliced, and values read after the
	 * chain concatenated (each read and written once) */
	c->copies = 0;
	for (int j = -1; j < c->nch; j++) {
		int v = j < 0 ? g->ops.a[c->op].out : g->ops.a[c->ch[j]].out;
		bool after = u->out[v];
		for (int k = u->start[v]; k < u->start[v + 1] && !after; k++) {
			after = true;
			for (int x = 0; x < c->nch && after; x++)
				after = c->ch[x] != u->list[k];
		}
		if (after)
			c->copies += 2 * value_bytes(g, v);
		if (j < 0)
			continue;
		const Op *op = &g->ops.a[c->ch[j]];
		for (int k = 0; k < op->nin; k++)
			if (chain_value(g, c, j, op->in[k]) < 0 && sliced_dim(g, c, j, op->in[k]) >= 0)
				c->copies += 2 * value_bytes(g, op->in[k]);
	}
}

/* ---- the rewrite ---- */

typedef struct {
	Graph *g;
	int *seq, nseq; /* the new program's op ids, in order */
	const char *why_gather, *why_scatter, *why_reduce, *why_chain;
	const int *target[MESH_MAX_AXES][2]; /* per axis, the sends' targets (shift -1, +1), made once */
	/* blocks shared between candidates: an all_reduce's chain reads the
	 * blocks an earlier chain made of the residual stream, an all_reduce's
	 * einsum those of its operand (the values in blocks are the ones of
	 * the program before the rewrite) */
	const Cand *cand;
	int *chain_of, *red_of; /* per op: the candidate whose chain it is in, or whose einsum it is (-1: none) */
	int *vcand, *vdim;      /* per value: the candidate that makes it in blocks, and their dim (-1: none) */
	int **vblk;             /* per value: its blocks, once made */
	int nv;                 /* values before the rewrite */
	int **chains, nchains;  /* the chains' blocks, freed after */
} Out;

static int like(Out *o, int v, int d, int64_t size) { return value_like(o->g, v, d, size); }

/* Append op k (attributes *at, or zero) reading in[] into value out. */
static Op *put(Out *o, OpKind k, const int *in, int nin, int out, const Attr *at, const Op *from, const char *why)
{
	int id = graph_op(o->g, k, in, nin, out, from->pos);
	Op *op = &o->g->ops.a[id];
	if (at)
		*op->attr = *at;
	op->src_op = from->src_op;
	op->why = why;
	o->seq[o->nseq++] = id;
	return op;
}

static const int *targets(Out *o, int axis, int shift)
{
	const int **t = &o->target[axis][shift > 0];
	if (!*t) {
		int *a = arena_alloc(&o->g->arena, sizeof(int) * (size_t)o->g->mesh.ndev);
		mesh_shift_targets(&o->g->mesh, axis, shift, a);
		*t = a;
	}
	return *t;
}

/* x passed `shift` round the ring of axis: a new value like x. */
static int pass_on(Out *o, int x, int axis, int shift, const Op *from, const char *why)
{
	Attr a = {.ncax = 1, .shift = shift};
	a.cax[0] = axis;
	a.target = targets(o, axis, shift);
	int y = like(o, x, 0, -1);
	put(o, OP_COLLECTIVE_PERMUTE, (int[]){x}, 1, y, &a, from, from->why ? why : NULL);
	return y;
}

/* A roll of x by `shift` times the device's ring position in blocks of dim d, into out. */
static void roll(Out *o, int x, int out, int axis, int d, int shift, const Op *from)
{
	Attr a = {.ncax = 1, .dim = d, .shift = shift};
	a.cax[0] = axis;
	put(o, OP_SHARD_ROLL, (int[]){x}, 1, out, &a, from, NULL);
}

/* The k-th block to arrive (as an index s: block c + s): one way, c + k;
 * both ways, c + 1, c - 1, c + 2, c - 2, ... (s = 1, n - 1, 2, n - 2, ...),
 * blocks 1 .. n/2 from c + 1 and the rest from c - 1. */
static int arrival(const Cand *c, int k)
{
	if (!c->both || k == 0)
		return k;
	return k % 2 ? (k + 1) / 2 : c->n - k / 2;
}

/* The gather's place: the gather itself when others read it, and its
 * blocks passed round the ring (c->blk[s]: block c + s).  Sent one way,
 * c receives from c + 1 at every step; both ways, it also receives from c
 * - 1, so the n - 1 blocks take n/2 steps. */
static void emit_sends(Out *o, Cand *c)
{
	const Op ag = o->g->ops.a[c->op];
	int n = c->n;
	if (c->keep && !c->rebuild)
		o->seq[o->nseq++] = c->op;
	c->blk[0] = ag.in[0];
	for (int k = 1; k < n; k++) {
		int s = arrival(c, k);
		bool back = c->both && s > n / 2; /* block c - (n - s), from c - 1 */
		c->blk[s] = pass_on(o, back ? c->blk[(s + 1) % n] : c->blk[s - 1], c->axis, back ? 1 : -1, &ag, o->why_gather);
	}
}

/* Readers rd[r0..r1) of a gather einsummed on each block, block by block
 * (each block's einsums as soon as it is here), then put together. */
static void emit_blocks(Out *o, const Cand *c, int r0, int r1)
{
	Graph *g = o->g;
	int n = c->n, gv = g->ops.a[c->op].out;
	int64_t b = g->values.a[c->blk[0]].shape.dim[c->dim];
	int *part = xmalloc(sizeof(int) * (size_t)n * (size_t)(r1 - r0));
	for (int k = 0; k < n; k++)
		for (int r = r0, s = arrival(c, k); r < r1; r++) {
			const Op e = g->ops.a[c->rd[r]];
			int in[2] = {e.in[0], e.nin > 1 ? e.in[1] : -1};
			in[e.in[0] == gv ? 0 : 1] = c->blk[s];
			int y = like(o, e.out, c->rdim[r], b);
			part[(r - r0) * n + s] = y;
			put(o, OP_EINSUM, in, e.nin, y, e.attr, &e, NULL);
		}
	for (int r = r0; r < r1; r++) {
		const Op e = g->ops.a[c->rd[r]];
		int cat = like(o, e.out, 0, -1);
		Attr a = {.axis = c->rdim[r]};
		put(o, OP_CONCAT, part + (r - r0) * n, n, cat, &a, &e, NULL);
		roll(o, cat, e.out, c->axis, c->rdim[r], 1, &e);
	}
	free(part);
	if (r0 == 0 && c->rebuild) { /* the gathered value for its other readers, from the blocks */
		const Op ag = g->ops.a[c->op];
		int cat = like(o, ag.out, 0, -1);
		Attr a = {.axis = c->dim};
		put(o, OP_CONCAT, c->blk, n, cat, &a, &ag, NULL);
		roll(o, cat, ag.out, c->axis, c->dim, 1, &ag);
	}
}

/* The einsum of block j of the scatter's rolled operand ar (block c + j of
 * its operand): the einsum's partial sums for block c + j of the result. */
static int scatter_block(Out *o, const Cand *c, int ar, int j)
{
	Graph *g = o->g;
	const Op e = g->ops.a[c->rd[0]];
	int n = c->n, dj = c->dim, d = c->rdim[0], a = e.in[c->operand];
	int64_t b = g->values.a[a].shape.dim[dj] / n, bp = g->values.a[e.out].shape.dim[d] / n;
	Attr sl = {0};
	const Value *av = &g->values.a[a];
	for (int k = 0; k < av->shape.rank; k++)
		sl.start[k] = 0, sl.limit[k] = av->shape.dim[k], sl.stride[k] = 1;
	sl.start[dj] = j * b, sl.limit[dj] = (j + 1) * b;
	int piece = like(o, a, dj, b);
	put(o, OP_SLICE, (int[]){ar}, 1, piece, &sl, &e, NULL);
	int in[2] = {e.in[0], e.nin > 1 ? e.in[1] : -1};
	in[c->operand] = piece;
	int y = like(o, e.out, d, bp);
	put(o, OP_EINSUM, in, e.nin, y, e.attr, &e, NULL);
	return y;
}

/* acc passed `shift` round the ring and y added to it: the sum, into out
 * (-1: a new value like y). */
static int pass_add(Out *o, const Cand *c, int acc, int y, int shift, int out)
{
	const Op rs = o->g->ops.a[c->op], e = o->g->ops.a[c->rd[0]];
	int got = pass_on(o, acc, c->axis, shift, &rs, o->why_scatter);
	int sum = out >= 0 ? out : like(o, y, 0, -1);
	put(o, OP_ADD, (int[]){got, y}, 2, sum, NULL, &e, NULL);
	return sum;
}

/* The scatter: blocks of the einsum added to the sum passed round the
 * ring.  One way: at step s device c einsums block c - s - 1 and adds it
 * to what c - 1 passed for that block.  Both ways (c->both): the sums for
 * block t start at t - n/2 and at t + (n - 1 - n/2) and meet at t, one
 * step of each way at a time: at step k device c adds its block c + n/2 -
 * k to what c - 1 passed, and its block c - (n - 1 - n/2) + k to what c +
 * 1 passed; the second way's last sum goes on to c - 1, which adds it to
 * its own. */
static void emit_scatter(Out *o, const Cand *c)
{
	Graph *g = o->g;
	const Op rs = g->ops.a[c->op];
	int n = c->n, a = g->ops.a[c->rd[0]].in[c->operand];
	int ar = like(o, a, 0, -1);
	roll(o, a, ar, rs.attr->cax[0], c->dim, -1, &rs);
	if (!c->both) {
		int acc = scatter_block(o, c, ar, n - 1);
		for (int s = 1; s < n; s++)
			acc = pass_add(o, c, acc, scatter_block(o, c, ar, n - 1 - s), 1, s == n - 1 ? rs.out : -1);
		return;
	}
	int ha = n / 2, hb = n - 1 - ha, up = -1, down = -1;
	for (int k = 0; k <= ha; k++) {
		int y = scatter_block(o, c, ar, ha - k);
		up = k ? pass_add(o, c, up, y, 1, -1) : y;
		if (k < hb) {
			y = scatter_block(o, c, ar, n - hb + k);
			down = k ? pass_add(o, c, down, y, -1, -1) : y;
		}
	}
	pass_add(o, c, down, up, -1, rs.out);
}

/* Block k of n of a length-len dim: [*start, *limit), the first len % n blocks one longer. */
static void block_of(int64_t len, int n, int k, int64_t *start, int64_t *limit)
{
	int64_t q = len / n, rem = len % n;
	*start = k * q + (k < rem ? k : rem);
	*limit = *start + q + (k < rem);
}

/* Block [b0, b1) of dim d of v, sliced (from: the op it is for). */
static int slice_block(Out *o, int v, int d, int64_t b0, int64_t b1, const Op *from)
{
	const Value *x = &o->g->values.a[v];
	Attr sl = {0};
	for (int a = 0; a < x->shape.rank; a++)
		sl.start[a] = 0, sl.limit[a] = x->shape.dim[a], sl.stride[a] = 1;
	sl.start[d] = b0, sl.limit[d] = b1;
	int piece = like(o, v, d, b1 - b0);
	put(o, OP_SLICE, (int[]){v}, 1, piece, &sl, from, NULL);
	return piece;
}

/* The n blocks of dim d of v an earlier chain made, or NULL. */
static const int *blocks_of(const Out *o, int v, int d, int n)
{
	return v < o->nv && o->vblk[v] && o->vdim[v] == d && o->cand[o->vcand[v]].n == n ? o->vblk[v] : NULL;
}

/* Will op x, when emitted, read value v (in blocks along dim d, made by
 * a chain emitted before x's place) in those blocks?  Only a candidate
 * with as many blocks does. */
static bool takes_blocks(const Out *o, int x, int v, int d)
{
	const Graph *g = o->g;
	int k = o->vcand[v];
	if (k < 0 || o->cand[k].ch[o->cand[k].nch - 1] >= x) /* made in blocks by no chain, or not before x */
		return k >= 0 && o->chain_of[x] == k;
	int y = o->chain_of[x] >= 0 ? o->chain_of[x] : o->red_of[x];
	if (y >= 0 && o->cand[y].n != o->cand[k].n)
		return false;
	if (o->chain_of[x] >= 0) {
		const Cand *c = &o->cand[o->chain_of[x]];
		int j = 0;
		while (c->ch[j] != x)
			j++;
		return sliced_dim(g, c, j, v) == d;
	}
	if (o->red_of[x] >= 0) {
		const Cand *c = &o->cand[o->red_of[x]];
		return g->ops.a[x].in[c->operand] == v && c->dim == d;
	}
	return false;
}

/* The all_reduce split: per block, operand c->operand sliced, einsummed,
 * all_reduced; the blocks concatenated into the all_reduce's result. */
static void emit_reduce(Out *o, const Cand *c)
{
	Graph *g = o->g;
	const Op ar = g->ops.a[c->op], e = g->ops.a[c->rd[0]];
	int n = c->n, dj = c->dim, d = c->rdim[0], a = e.in[c->operand];
	int part[REDUCE_BLOCKS];
	const int *have = blocks_of(o, a, dj, n);
	for (int k = 0; k < n; k++) {
		const Value *av = &g->values.a[a];
		int64_t b0, b1;
		block_of(av->shape.dim[dj], n, k, &b0, &b1);
		int piece = have ? have[k] : slice_block(o, a, dj, b0, b1, &e);
		int in[2] = {e.in[0], e.nin > 1 ? e.in[1] : -1};
		in[c->operand] = piece;
		int y = like(o, e.out, d, b1 - b0);
		put(o, OP_EINSUM, in, e.nin, y, e.attr, &e, NULL);
		if (c->mid >= 0) { /* the bias, the same for every block */
			const Op ad = g->ops.a[c->mid];
			int sum = like(o, ad.out, d, b1 - b0), x[2] = {ad.in[0], ad.in[1]};
			x[ad.in[0] == e.out ? 0 : 1] = y;
			put(o, OP_ADD, x, 2, sum, ad.attr, &ad, NULL);
			y = sum;
		}
		part[k] = like(o, ar.out, d, b1 - b0);
		put(o, OP_ALL_REDUCE, (int[]){y}, 1, part[k], ar.attr, &ar, ar.why ? o->why_reduce : NULL);
	}
	if (c->nch) { /* the chain reads the blocks; emit_chain concatenates them */
		memcpy(c->blk, part, sizeof(int) * (size_t)n);
		return;
	}
	Attr cat = {.axis = d};
	put(o, OP_CONCAT, part, n, ar.out, &cat, &ar, NULL);
}

/* Does a value the chain makes (v, or the all_reduce's result, in
 * blocks along dim d) need its blocks concatenated: an output, or read by
 * an op that does not take the blocks (takes_blocks)? */
static bool read_after(const Uses *u, const Out *o, int v, int d)
{
	if (u->out[v])
		return true;
	for (int k = u->start[v]; k < u->start[v + 1]; k++)
		if (!takes_blocks(o, u->list[k], v, d))
			return true;
	return false;
}

/* c's chain (reduce_chain) block by block, each block's ops reading the
 * blocks of the all_reduce and of the chain ops before (a full operand
 * sliced, one without the dim read whole); then the blocks of each value
 * read after the chain concatenated into it. */
static void emit_chain(Out *o, const Uses *u, const Cand *c)
{
	Graph *g = o->g;
	int n = c->n, r = g->ops.a[c->op].out, d = c->rdim[0];
	int64_t len = g->values.a[r].shape.dim[d];
	int *blk = xmalloc(sizeof(int) * (size_t)c->nch * (size_t)n + 1);
	for (int k = 0; k < n; k++) {
		int64_t b0, b1;
		block_of(len, n, k, &b0, &b1);
		for (int j = 0; j < c->nch; j++) {
			const Op op = g->ops.a[c->ch[j]];
			int in[2] = {-1, -1};
			for (int m = 0; m < op.nin; m++) {
				int v = op.in[m], at = chain_at(g, c, j, v);
				if (at != -2) { /* in blocks */
					in[m] = at < 0 ? c->blk[k] : blk[at * n + k];
					continue;
				}
				int dx = sliced_dim(g, c, j, v);
				const int *have = dx >= 0 ? blocks_of(o, v, dx, n) : NULL;
				if (dx < 0) /* the same for every block */
					in[m] = v;
				else if (have && takes_blocks(o, c->ch[j], v, dx)) /* an earlier chain's */
					in[m] = have[k];
				else
					in[m] = slice_block(o, v, dx, b0, b1, &op);
			}
			blk[j * n + k] = like(o, op.out, c->chd[j], b1 - b0);
			put(o, op.kind, in, op.nin, blk[j * n + k], op.attr, &op, op.why ? op.why : o->why_chain);
		}
	}
	int *part = xmalloc(sizeof(int) * (size_t)n);
	for (int j = -1; j < c->nch; j++) {
		int v = j < 0 ? r : g->ops.a[c->ch[j]].out, dv = j < 0 ? d : c->chd[j];
		int *mine = j < 0 ? c->blk : blk + (size_t)j * n;
		o->vblk[v] = mine; /* for the candidates after */
		if (!read_after(u, o, v, dv))
			continue;
		memcpy(part, mine, sizeof(int) * (size_t)n);
		Attr cat = {.axis = dv};
		const Op from = g->ops.a[j < 0 ? c->op : c->ch[j]];
		put(o, OP_CONCAT, part, n, v, &cat, &from, NULL);
	}
	free(part);
	o->chains[o->nchains++] = blk;
}

/* Seconds of a memory-bound kernel moving `bytes`. */
static double copy_seconds(const HwProfile *hw, double bytes)
{
	return cost_kernel_seconds(hw, 0, bytes, false, -1);
}

/* Seconds of einsum i run as n blocks, each on a 1/n of operand j
 * (reading the other operand whole each time). */
static double blocks_seconds(const Graph *g, int i, int j, int n, const HwProfile *hw)
{
	const Op *op = &g->ops.a[i];
	OpWork w;
	cost_op_work(g, i, &w);
	double other = op->nin > 1 ? value_bytes(g, op->in[1 - j]) : 0;
	w.flops /= n, w.layout /= n, w.elems /= n;
	w.bytes = other + (w.bytes - other) / n;
	return n * cost_roofline(hw, g->values.a[op->out].dtype, &w, 0);
}

/* The time of one send round the ring (cost_collective_seconds walks
 * every device's path: a search on 256 devices asks for the same few sizes
 * thousands of times), remembered for the last few axes, shifts and sizes. */
typedef struct {
	int axis, shift;
	double bytes, t;
} SendTime;
enum { NSEND = 8 };
typedef struct {
	SendTime a[NSEND];
	int n, next;
} SendCache;

static double send_seconds(SendCache *sc, const Graph *g, const HwProfile *hw, int axis, int shift, double bytes)
{
	for (int i = 0; i < sc->n; i++)
		if (sc->a[i].axis == axis && sc->a[i].shift == shift && sc->a[i].bytes == bytes)
			return sc->a[i].t;
	double t = cost_collective_seconds(hw, &g->mesh, RS_PERMUTE, &axis, 1, bytes, NULL, shift);
	sc->a[sc->next] = (SendTime){axis, shift, bytes, t};
	sc->next = (sc->next + 1) % NSEND;
	sc->n += sc->n < NSEND;
	return t;
}

/* Does a send along axis go one way round closed torus rings, whose
 * ring collectives send both ways (every ring of the axis wraps, on the
 * torus's own links)?  Then the blocks go both ways, as XLA's
 * bidirectional windowed einsum sends them: each way has its own links,
 * and the cost model runs the two sends at once (cost_collective_links). */
static bool two_way(const Graph *g, const HwProfile *hw, int axis)
{
	CostRing ring[2 * MESH_MAX_AXES + 2];
	int n = cost_rings(hw, &g->mesh, &axis, 1, ring);
	bool all = n > 0 && hw->comm_streams == COMM_LINKS;
	for (int k = 0; k < n; k++)
		all &= ring[k].wrap && !ring[k].sw && ring[k].link >= 0 && ring[k].link < HW_MAX_DIMS;
	return all;
}

/* What the cost model (e: the program as it is, on hw) expects c's blocks
 * to save, in seconds (<= 0: nothing).  The collective takes C, of which X
 * is not hidden; its einsums take E, and B as blocks (each block's kernel
 * has its overhead, and reads the other operand again).  The n - 1 sends
 * take P, one after another (sent both ways round a closed torus ring:
 * n/2 steps of two at once).  They must hide behind the blocks before the
 * last (P <= B (n - 1) / n) and keep the links about as busy as the
 * collective did (the sends' time on one way of the links, P, or (n - 1)/2
 * sends both ways, at most 5/4 C): other collectives share the links.  A
 * gather that stays saves no C, and P counts in full against the links.
 * The saving is X less what the blocks add: B - E, the concatenations and
 * rolls (a gather's), or the roll, slices and sums (a scatter's). */
/* What splitting all_reduce c saves (see reduce_cand; <= 0: nothing).  The
 * all_reduce takes C, of which X is not hidden; its einsum E, and B as n
 * blocks of b = B / n, each block's all_reduce a.  Block k's all_reduce
 * starts when block k is made and block k - 1's is done: the last ends
 * b + max(n a, (n - 1) b + a) after the first block starts, where E + X
 * ended before.  Less the slices and the concatenation. */
static double reduce_saving(const Graph *g, const Cand *c, const CostEstimate *e, const HwProfile *hw)
{
	const Op *op = &g->ops.a[c->op], *rd = &g->ops.a[c->rd[0]];
	int n = c->n;
	const OpEstimate *o = &e->op[c->op];
	double bytes = value_bytes(g, op->out);
	double a = cost_collective_seconds(hw, &g->mesh, RS_ALL_REDUCE, op->attr->cax, op->attr->ncax, bytes / n, NULL, 0);
	double B = blocks_seconds(g, c->rd[0], c->operand, n, hw), b = B / n, E = e->op[c->rd[0]].seconds;
	double X = o->seconds - o->hidden, after = b + fmax(n * a, (n - 1) * b + a);
	double added = n * copy_seconds(hw, 2 * value_bytes(g, rd->in[c->operand]) / n) + copy_seconds(hw, 2 * bytes);
	if (c->mid >= 0) /* the bias added per block: the add's time is in both, its blocks' overheads only after */
		added += n * copy_seconds(hw, 3 * bytes / n) - e->op[c->mid].seconds;
	if (c->nch) {
		/* the chain's ops (H in all) run after the last block's all_reduce
		 * as they are; in blocks of h, block k's start when block k is
		 * all_reduced and block k - 1's are done: the all_reduces end at
		 * b + a, b + 2a ... (the links busier than the einsum), or at
		 * k b + a.  Each block's kernels cost their overheads again; the
		 * values read after the chain are concatenated. */
		double H = 0, h = 0;
		for (int j = 0; j < c->nch; j++) {
			const Op *ch = &g->ops.a[c->ch[j]];
			H += e->op[c->ch[j]].seconds;
			if (ch->kind == OP_EINSUM) {
				int bj = ch->nin == 2 && chain_value(g, c, j, ch->in[1]) >= 0;
				h += blocks_seconds(g, c->ch[j], bj, n, hw) / n;
			} else {
				h += e->op[c->ch[j]].seconds / n + hw->kernel_overhead;
			}
		}
		added += copy_seconds(hw, c->copies) - copy_seconds(hw, 2 * bytes); /* not the all_reduce's concatenation */
		double t = n * b, done = 0;
		for (int k = 0; k < n; k++) {
			done = fmax((k + 1) * b, done) + a;
			t = fmax(t, done) + h;
		}
		return E + X + H - t - added;
	}
	return E + X - after - added;
}

static double saving(const Graph *g, const Cand *c, const CostEstimate *e, const HwProfile *hw, SendCache *sc)
{
	const Op *op = &g->ops.a[c->op];
	if (op->kind == OP_ALL_REDUCE)
		return reduce_saving(g, c, e, hw);
	bool gather = op->kind == OP_ALL_GATHER;
	int n = c->n;
	double sent = gather ? value_bytes(g, op->in[0]) : value_bytes(g, op->out);
	double t = send_seconds(sc, g, hw, c->axis, gather ? -1 : 1, sent);
	double P = (c->both ? n / 2 : n - 1) * t, links = c->both ? (n - 1) / 2.0 * t : P;
	const OpEstimate *o = &e->op[c->op];
	double C = gather && c->keep && !c->rebuild && !c->twice ? 0 : o->seconds, E = 0, B = 0, added;
	for (int r = 0; r < c->nrd; r++) {
		const Op *rd = &g->ops.a[c->rd[r]];
		int j = gather ? (rd->in[0] == op->out ? 0 : 1) : c->operand;
		E += e->op[c->rd[r]].seconds;
		B += blocks_seconds(g, c->rd[r], j, n, hw);
	}
	if (P > B * (n - 1) / n || links > 1.25 * C)
		return 0;
	if (gather) {
		added = c->rebuild ? 2 * copy_seconds(hw, 2 * value_bytes(g, op->out)) : 0;
		for (int r = 0; r < c->nrd; r++)
			added += 2 * copy_seconds(hw, 2 * value_bytes(g, g->ops.a[c->rd[r]].out));
	} else {
		const Op *rd = &g->ops.a[c->rd[0]];
		double a = value_bytes(g, rd->in[c->operand]), part = value_bytes(g, op->out);
		added = copy_seconds(hw, 2 * a) + n * copy_seconds(hw, 2 * a / n) + (n - 1) * copy_seconds(hw, 3 * part);
	}
	return o->seconds - o->hidden - (B - E) - added;
}

/* Find the candidates that save time by e on hw (their savings added to
 * *gain); claim[i] marks the ops they replace. */
static int find(const Uses *u, Cand *cand, bool *claim, WindowReport *rep, int64_t *extra, const CostEstimate *e,
                const HwProfile *hw, bool gathers_only, bool reduces, double *gain)
{
	const Graph *g = u->g;
	int ncand = 0;
	SendCache sc = {0};
	bool *span = xcalloc((size_t)g->ops.n + 1, sizeof(bool)); /* ops between an all_reduce and its chain's last */
	int *vn = xcalloc((size_t)g->values.n + 1, sizeof(int)); /* values a chain taken makes in blocks: how many (0: none) */
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		Cand *c = &cand[ncand];
		bool found = (op->kind == OP_ALL_GATHER && gather_cand(u, i, c)) ||
		             (op->kind == OP_REDUCE_SCATTER && !gathers_only && scatter_cand(u, i, c)) ||
		             (op->kind == OP_ALL_REDUCE && !gathers_only && reduces && reduce_cand(u, i, c));
		if (!found)
			continue;
		c->both = op->kind != OP_ALL_REDUCE && c->n > 2 && two_way(g, hw, c->axis);
		double save = saving(g, c, e, hw, &sc);
		if (op->kind == OP_ALL_REDUCE && !span[i] && !claim[c->rd[0]] && (c->mid < 0 || !claim[c->mid])) {
			/* the ops after it in blocks too, and as many blocks, as save the most */
			reduce_chain(u, c, claim);
			int nch = c->nch, most = c->n, best_n = c->n, best_nch = 0, fed = vn[g->ops.a[c->rd[0]].in[c->operand]];
			for (int k = fed ? fed : 2; k <= (fed ? fed : most); k++) { /* fed by a chain: its blocks */
				c->n = k, c->nch = 0;
				double alone = saving(g, c, e, hw, &sc);
				c->nch = nch;
				double chained = nch ? saving(g, c, e, hw, &sc) : -INFINITY;
				double more = fmax(alone, chained);
				if (k == (fed ? fed : 2) || more > save)
					save = more, best_n = k, best_nch = chained > alone ? nch : 0;
			}
			c->n = best_n, c->nch = best_nch;
		}
		if (op->kind == OP_ALL_GATHER && (c->rebuild || c->nrd > 1)) {
			/* a gather other ops read too is made again from the blocks (two
			 * copies), and each einsum reader's blocks cost copies of its
			 * result; the first reader's blocks alone with the gather left for
			 * the rest (sent twice: where the links have room that is free,
			 * and the copies are not) can save more */
			Cand one = *c;
			one.nrd = 1, one.keep = true, one.rebuild = false, one.twice = true;
			double save1 = saving(g, &one, e, hw, &sc);
			if (save1 > save)
				c->nrd = 1, c->keep = true, c->rebuild = false, c->twice = true, save = save1;
		}
		bool clash = save <= 0 || span[i] || claim[c->rd[0]] || (c->mid >= 0 && (claim[c->mid] || span[c->mid]));
		for (int r = 0; r < c->nrd; r++) /* an einsum reads two gathers: the first takes it */
			clash |= claim[c->rd[r]] || span[c->rd[r]];
		if (clash) {
			free(c->rd), free(c->rdim), free(c->ch), free(c->chd);
			continue;
		}
		if (op->kind == OP_ALL_GATHER) {
			/* the readers' blocks together at the first, if what they read is made by then */
			c->together = true;
			for (int r = 0; r < c->nrd; r++) {
				const Op *rd = &g->ops.a[c->rd[r]];
				claim[c->rd[r]] = true;
				for (int k = 0; k < rd->nin; k++)
					c->together &= rd->in[k] == op->out || g->values.a[rd->in[k]].producer < c->rd[0];
			}
			claim[i] = true;
			rep->gathers++, rep->einsums += c->nrd;
			*extra += (int64_t)c->n * (c->nrd + 1) + 2 * c->nrd + 1;
		} else {
			claim[c->rd[0]] = claim[i] = true;
			if (c->nch) { /* its ops taken; the others between the all_reduce and them left to it */
				vn[g->ops.a[i].out] = c->n;
				for (int j = 0; j < c->nch; j++)
					claim[c->ch[j]] = true, vn[g->ops.a[c->ch[j]].out] = c->n;
				for (int j = i + 1; j <= c->ch[c->nch - 1]; j++)
					span[j] = true;
				rep->chained += c->nch;
				*extra += (int64_t)c->n * c->nch * 3 + c->nch + 1;
			}
			if (op->kind == OP_ALL_REDUCE && c->mid >= 0)
				claim[c->mid] = true;
			if (op->kind == OP_ALL_REDUCE)
				rep->reduces++;
			else
				rep->scatters++;
			rep->einsums++;
			*extra += (int64_t)c->n * 4 + 2;
		}
		*gain += save;
		c->blk = xmalloc(sizeof(int) * (size_t)c->n);
		ncand++;
	}
	free(span), free(vn);
	return ncand;
}

/* Rewrite g's candidates (as find takes them), in a new op order; false
 * when there are none. */
static bool rewrite(Graph *g, WindowReport *rep, const CostEstimate *e, const HwProfile *hw, bool gathers_only,
                    bool reduces)
{
	Uses u;
	uses_init(&u, g);
	int n = g->ops.n;
	Cand *cand = xmalloc(sizeof(Cand) * ((size_t)n + 1));
	bool *claim = xcalloc((size_t)n + 1, sizeof(bool));
	int64_t extra = 0;
	double gain = 0;
	int ncand = find(&u, cand, claim, rep, &extra, e, hw, gathers_only, reduces, &gain);
	if (ncand && gain < e->overlapped_s * MIN_GAIN) { /* not worth an estimate */
		for (int k = 0; k < ncand; k++)
			free(cand[k].rd), free(cand[k].rdim), free(cand[k].blk), free(cand[k].ch), free(cand[k].chd);
		ncand = rep->gathers = rep->scatters = rep->reduces = rep->einsums = rep->chained = 0;
	}
	if (ncand) {
		/* per op: the candidate placed there (gathers: their sends; readers
		 * and scatters' einsums: their blocks) and which reader */
		int *at = xmalloc(sizeof(int) * ((size_t)n + 1)), *which = xmalloc(sizeof(int) * ((size_t)n + 1));
		for (int i = 0; i < n; i++)
			at[i] = -1;
		for (int k = 0; k < ncand; k++) {
			const Cand *c = &cand[k];
			if (g->ops.a[c->op].kind == OP_ALL_GATHER)
				at[c->op] = k, which[c->op] = -1;
			if (c->nch) /* the chain at its last op: what it skips is made by then */
				at[c->ch[c->nch - 1]] = k, which[c->ch[c->nch - 1]] = -2;
			if (g->ops.a[c->op].kind == OP_ALL_REDUCE && c->mid >= 0) /* at the add: the bias is made by then */
				at[c->mid] = k, which[c->mid] = 0;
			else
				for (int r = 0; r < (c->together ? 1 : c->nrd); r++)
					at[c->rd[r]] = k, which[c->rd[r]] = r;
		}
		Out o = {.g = g};
		o.why_gather = "collective matmul: the gather's blocks pass round the ring while each is einsummed";
		o.why_scatter = "collective matmul: the partial sums pass round the ring while each block is einsummed";
		o.why_reduce = "collective matmul: each block's partial sums all_reduced while the next block is einsummed";
		o.why_chain = "collective matmul: after an all_reduce in blocks, run on each block while the next is all_reduced";
		o.seq = xmalloc(sizeof(int) * ((size_t)n + (size_t)extra + 1));
		o.cand = cand, o.nv = g->values.n;
		o.chain_of = xmalloc(sizeof(int) * ((size_t)n + 1)), o.red_of = xmalloc(sizeof(int) * ((size_t)n + 1));
		o.vcand = xmalloc(sizeof(int) * ((size_t)o.nv + 1)), o.vdim = xmalloc(sizeof(int) * ((size_t)o.nv + 1));
		o.vblk = xcalloc((size_t)o.nv + 1, sizeof(int *));
		o.chains = xmalloc(sizeof(int *) * ((size_t)ncand + 1));
		for (int i = 0; i < n; i++)
			o.chain_of[i] = o.red_of[i] = -1;
		for (int v = 0; v < o.nv; v++)
			o.vcand[v] = o.vdim[v] = -1;
		for (int k = 0; k < ncand; k++) {
			const Cand *c = &cand[k];
			if (g->ops.a[c->op].kind != OP_ALL_REDUCE)
				continue;
			o.red_of[c->rd[0]] = k;
			if (!c->nch)
				continue;
			o.vcand[g->ops.a[c->op].out] = k, o.vdim[g->ops.a[c->op].out] = c->rdim[0];
			for (int j = 0; j < c->nch; j++)
				o.chain_of[c->ch[j]] = k, o.vcand[g->ops.a[c->ch[j]].out] = k, o.vdim[g->ops.a[c->ch[j]].out] = c->chd[j];
		}
		for (int i = 0; i < n; i++) {
			Cand *c = at[i] >= 0 ? &cand[at[i]] : NULL;
			if (c && which[i] == -2)
				emit_chain(&o, &u, c);
			else if (c && g->ops.a[c->op].kind == OP_REDUCE_SCATTER)
				emit_scatter(&o, c);
			else if (c && g->ops.a[c->op].kind == OP_ALL_REDUCE)
				emit_reduce(&o, c);
			else if (c && which[i] < 0)
				emit_sends(&o, c);
			else if (c)
				emit_blocks(&o, c, which[i], c->together ? c->nrd : which[i] + 1);
			if (!claim[i])
				o.seq[o.nseq++] = i;
		}
		graph_order_ops(g, o.seq, o.nseq);
		for (int k = 0; k < o.nchains; k++)
			free(o.chains[k]);
		free(o.seq), free(at), free(which), free(o.chain_of), free(o.red_of), free(o.vcand), free(o.vdim), free(o.vblk),
			free(o.chains);
	}
	for (int k = 0; k < ncand; k++)
		free(cand[k].rd), free(cand[k].rdim), free(cand[k].blk), free(cand[k].ch), free(cand[k].chd);
	free(cand), free(claim);
	uses_free(&u);
	return ncand > 0;
}

/* ---- the pass ---- */

/* Has g a candidate at all (before any estimate is made)? */
static bool any_candidate(Graph *g, bool reduces)
{
	Uses u;
	uses_init(&u, g);
	Cand c;
	bool any = false;
	for (int i = 0; i < g->ops.n && !any; i++) {
		const Op *op = &g->ops.a[i];
		any = (op->kind == OP_ALL_GATHER && gather_cand(&u, i, &c)) ||
		      (op->kind == OP_REDUCE_SCATTER && scatter_cand(&u, i, &c)) ||
		      (op->kind == OP_ALL_REDUCE && reduces && reduce_cand(&u, i, &c));
		if (any)
			free(c.rd), free(c.rdim);
	}
	uses_free(&u);
	return any;
}

/* Is program estimate a to be kept over b: 0.1% faster or more, its peak at most 1% larger? */
static bool better(const CostEstimate *a, const CostEstimate *b)
{
	return step_kept(a, b->overlapped_s, b->mem.peak);
}

bool window_einsums(Graph *prog, const Graph *model, const int *map, const HwProfile *hw, bool reduces,
                    CostEstimate *priced, WindowReport *rep)
{
	WindowReport local;
	if (!rep)
		rep = &local;
	memset(rep, 0, sizeof *rep);
	if (priced)
		memset(priced, 0, sizeof *priced);
	if (model->pipeline || prog->stage_axis >= 0 || hw->topo == TOPO_THREADS || !map || !any_candidate(prog, reduces))
		return false;
	snprintf(rep->hw, sizeof rep->hw, "%s", hw->name);
	CostEstimate before, after;
	step_price(model, prog, map, hw, &before);
	rep->before_s = before.overlapped_s, rep->before_peak = before.mem.peak;
	/* the program as it is, to go back to */
	int n = prog->ops.n, nv = prog->values.n;
	Op *ops = xmalloc(sizeof(Op) * ((size_t)n + 1));
	memcpy(ops, prog->ops.a, sizeof(Op) * (size_t)n);
	CostEstimate *left = &before; /* the estimate of prog as left */
	if (rewrite(prog, rep, &before, hw, false, reduces)) {
		step_price(model, prog, map, hw, &after);
		rep->tried = true;
		rep->after_s = after.overlapped_s, rep->after_peak = after.mem.peak;
		rep->kept = better(&after, &before);
		if (rep->gathers && (rep->scatters || rep->reduces)) {
			/* the gathers alone may do better: the scatters' sends and sums can cost more than they hide */
			WindowReport alone = *rep;
			CostEstimate other;
			alone.gathers = alone.scatters = alone.reduces = alone.einsums = alone.chained = 0, alone.kept = false;
			prog->values.n = nv;
			graph_set_ops(prog, ops, n);
			if (rewrite(prog, &alone, &before, hw, true, reduces)) {
				step_price(model, prog, map, hw, &other);
				alone.kept = better(&other, rep->kept ? &after : &before);
				if (alone.kept) {
					alone.after_s = other.overlapped_s, alone.after_peak = other.mem.peak;
					*rep = alone;
					cost_estimate_free(&after);
					after = other;
				} else {
					cost_estimate_free(&other);
				}
			}
			if (rep->kept && !alone.kept) { /* the first again: the same program as priced */
				prog->values.n = nv;
				graph_set_ops(prog, ops, n);
				WindowReport again = *rep;
				rewrite(prog, &again, &before, hw, false, reduces);
			}
		}
		if (rep->kept) {
			cost_estimate_free(&before);
			left = &after;
		} else { /* as it was */
			prog->values.n = nv;
			graph_set_ops(prog, ops, n);
			cost_estimate_free(&after);
		}
	}
	free(ops);
	if (priced)
		*priced = *left;
	else
		cost_estimate_free(left);
	return rep->kept;
}
