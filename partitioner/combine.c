/* combine.c: the combining pass — groups of small independent collectives become one collective on a flat buffer.
 *
 * Every collective costs a fixed latency (α in the cost model) besides its
 * bytes, and a training step with weight-update sharding runs many tiny
 * ones: a reduce_scatter per gradient, an all_gather per weight, a scalar
 * all_reduce per param for the global norm and two for LAMB's trust ratios.
 * The pass follows XLA's all-reduce / reduce-scatter / all-gather combiners
 * and the flat buffers of PyTorch DDP and ZeRO: collectives that do not
 * depend on each other are packed into one buffer and run once.
 *
 * 1. Candidates.  An all_reduce of one element, or an all_reduce,
 *    reduce_scatter or all_gather whose per-device buffer (the larger of
 *    operand and result) is under CombineOpts.group_bytes.
 *
 * 2. Groups.  Candidates of one class — the same kind, mesh axes in order
 *    (hence the same replica groups in the same member order), reduction,
 *    dtype, pending axes of the result, and whether they are scalars (the
 *    norms of an optimizer are not mixed with activations) — are grouped when they have the
 *    same level: the most candidates of their class on any path from the
 *    result to the program's end.  A candidate that depends on another of
 *    its class has a lower level, so no group holds two that depend on each
 *    other.  Counting towards the end, not from the start, is what puts the
 *    global norm's sums together: they are read by the same chain of adds,
 *    however deep in the backward pass each gradient was made; and counting
 *    within the class lets gradients whose paths cross different numbers of
 *    other collectives still share one.
 *
 * 3. Order.  The ops are scanned in program order; a node (an op, or a
 *    whole group, reached at its first member) runs as soon as it has been
 *    reached and its operands exist, and the ops waiting on it run after it
 *    (first come, first run).  Nothing else moves.  Groups of different
 *    classes may wait for each other in a cycle (the backward pass's
 *    activations and the global norm's sums are all_reduces over `model`
 *    alike, with the gradients' all_reduce over `data` between them); the
 *    scan then ends with ops not run, the earliest of which is a member
 *    whose operands exist, and its group is split into the members whose
 *    operands exist and the rest, and the scan is run again.  Each round
 *    splits one group; after a few, levels over all candidates are the last
 *    resort: a candidate that depends on any other has a lower level, every
 *    path leaving a group of level l enters only groups of lower levels, and
 *    the graph with each group contracted to one node has no cycle.
 *
 * 4. Rewrite.  A group becomes: per member, its operand packed into a view
 *    (all_reduce: flat [numel]; reduce_scatter along dim k over n members:
 *    dim k brought to the front, then [n, rest], whose row j is block j;
 *    all_gather: [1, numel] of the block, dim k in front); one concat; the
 *    collective on dim 0; per member, its slice of the result, reshaped and
 *    transposed back into the member's own result value, which keeps its id
 *    and its sharding.  Member j of a replica group therefore receives block
 *    j of every tensor, as it did alone. */
#include "combine.h"

#include <string.h>

#include "../spmd/ops.h"

/* What must agree for collectives to run as one. */
typedef struct {
	int kind, ncax, cax[MESH_MAX_AXES], reduce, dtype, level;
	unsigned partial; /* pending axes of the result */
	int scalar;       /* an all_reduce of one element: norms and the like, not activations */
} Key;
_Static_assert(sizeof(Key) == sizeof(int) * (7 + MESH_MAX_AXES), "Key is hashed and compared as bytes: no padding");

typedef struct {
	Key key;
	int first, last, n; /* member op ids, linked through Comb.next in program order */
} Group;

typedef struct {
	Graph *g;
	const CombineOpts *o;
	int nops;        /* ops before the rewrite */
	int *after;      /* per value: scratch of count_levels */
	int *group;      /* per op: its group of two or more, or -1 */
	int *next;       /* per op: the next member of its group, or -1 */
	VEC(Group) groups;
	int *slots;      /* open addressing over groups by key, -1: empty */
	size_t nslots;   /* a power of two, more than twice groups.n */
	bool terse;      /* write no reasons (Diag.terse): the program is only priced */
} Comb;

/* ---- 1. candidates ---- */

static int64_t members_of(const Graph *g, const Attr *a)
{
	int64_t n = 1;
	for (int i = 0; i < a->ncax; i++)
		n *= g->mesh.size[a->cax[i]];
	return n;
}

/* Bytes of op's per-device buffer: the larger of operand and result. */
static int64_t buffer_bytes(const Graph *g, const Op *op)
{
	const Value *x = &g->values.a[op->in[0]], *y = &g->values.a[op->out];
	int64_t a = shape_numel(&x->shape), b = shape_numel(&y->shape);
	return (a > b ? a : b) * dtype_size(x->dtype);
}

static bool is_candidate(const Comb *C, const Op *op)
{
	const Value *x = &C->g->values.a[op->in[0]];
	bool small = buffer_bytes(C->g, op) < C->o->group_bytes;
	switch (op->kind) {
	case OP_ALL_REDUCE: return small || shape_numel(&x->shape) == 1;
	case OP_REDUCE_SCATTER:
		return small && x->shape.rank > 0 && x->shape.dim[op->attr->dim] % members_of(C->g, op->attr) == 0;
	case OP_ALL_GATHER: return small && x->shape.rank > 0;
	default: return false;
	}
}

/* ---- 2. groups ---- */

static void key_of(const Comb *C, int i, int level, Key *k)
{
	const Op *op = &C->g->ops.a[i];
	const Value *y = &C->g->values.a[op->out];
	memset(k, 0, sizeof *k); /* every byte is hashed and compared */
	k->kind = op->kind;
	k->ncax = op->attr->ncax;
	memcpy(k->cax, op->attr->cax, sizeof(int) * (size_t)op->attr->ncax);
	k->reduce = op->kind == OP_ALL_GATHER ? 0 : op->attr->reduce;
	k->dtype = y->dtype;
	k->level = level;
	k->partial = y->spec.partial;
	k->scalar = op->kind == OP_ALL_REDUCE && shape_numel(&y->shape) == 1;
}

static size_t key_hash(const Key *k) { return (size_t)hash_bytes(k, sizeof *k); }

static void slots_grow(Comb *C)
{
	size_t n = C->nslots ? 2 * C->nslots : 64;
	int *s = xmalloc(sizeof(int) * n);
	for (size_t i = 0; i < n; i++)
		s[i] = -1;
	for (int k = 0; k < C->groups.n; k++) {
		size_t i = key_hash(&C->groups.a[k].key) & (n - 1);
		while (s[i] >= 0)
			i = (i + 1) & (n - 1);
		s[i] = k;
	}
	free(C->slots);
	C->slots = s, C->nslots = n;
}

/* Put op i into the group of key k, made if new; the group's index. */
static int group_add(Comb *C, int i, const Key *k)
{
	if (2 * ((size_t)C->groups.n + 1) > C->nslots)
		slots_grow(C);
	size_t h = key_hash(k) & (C->nslots - 1);
	while (C->slots[h] >= 0 && memcmp(&C->groups.a[C->slots[h]].key, k, sizeof *k) != 0)
		h = (h + 1) & (C->nslots - 1);
	if (C->slots[h] < 0) {
		Group gr = {*k, i, i, 0};
		C->slots[h] = C->groups.n;
		vec_push(&C->groups, gr);
	}
	Group *gr = &C->groups.a[C->slots[h]];
	if (gr->n++)
		C->next[gr->last] = i, gr->last = i;
	return C->slots[h];
}

static void groups_clear(Comb *C)
{
	C->groups.n = 0;
	free(C->slots);
	C->slots = NULL, C->nslots = 0;
	for (int i = 0; i < C->nops; i++)
		C->group[i] = C->next[i] = -1;
}

/* level[i] of each candidate of class cls (every candidate when cls < 0):
 * the most candidates of that class on a path from its result to the end.
 * A reverse scan: each op's readers come first. */
static void count_levels(Comb *C, const int *cls, int which, int *level)
{
	const Graph *g = C->g;
	memset(C->after, 0, sizeof(int) * (size_t)g->values.n);
	for (int i = C->nops - 1; i >= 0; i--) {
		const Op *op = &g->ops.a[i];
		bool counts = cls[i] >= 0 && (which < 0 || cls[i] == which);
		if (counts)
			level[i] = C->after[op->out];
		int r = C->after[op->out] + counts;
		for (int j = 0; j < op->nin; j++)
			if (C->after[op->in[j]] < r)
				C->after[op->in[j]] = r;
	}
}

enum {
	MAX_CLASSES = 16, /* more classes than this: levels over all candidates (linear time) */
	MAX_SPLITS = 16,  /* rounds of splitting groups that wait for each other */
};

/* Group the candidates: by class and level, the level counted within the
 * class (per_class) or over all candidates.  group[] is left set only for
 * groups of two or more. */
static void make_groups(Comb *C, bool per_class)
{
	int *cls = xmalloc(sizeof(int) * (size_t)(C->nops + 1)), *level = xcalloc((size_t)C->nops + 1, sizeof(int));
	Key k;
	for (int i = 0; i < C->nops; i++) {
		cls[i] = -1;
		if (is_candidate(C, &C->g->ops.a[i]))
			key_of(C, i, 0, &k), cls[i] = group_add(C, i, &k);
	}
	int nclass = C->groups.n;
	groups_clear(C);
	if (per_class && nclass <= MAX_CLASSES)
		for (int c = 0; c < nclass; c++)
			count_levels(C, cls, c, level);
	else
		count_levels(C, cls, -1, level);
	for (int i = 0; i < C->nops; i++)
		if (cls[i] >= 0)
			key_of(C, i, level[i], &k), C->group[i] = group_add(C, i, &k);
	for (int g = 0; g < C->groups.n; g++)
		if (C->groups.a[g].n < 2)
			C->group[C->groups.a[g].first] = -1;
	free(cls), free(level);
}

/* ---- 3. order ---- */

/* The node of op i: itself, or nops + its group. */
static int node_of(const Comb *C, int i) { return C->group[i] >= 0 ? C->nops + C->group[i] : i; }

typedef struct {
	int *pending;  /* per node: operands not yet made */
	int *waiting;  /* per op: operands not yet made */
	bool *reached; /* per node: the scan has come to it */
	bool *done;    /* per node: in the order */
	int *cstart;   /* per value: the ops reading it, cop[cstart[v] .. cstart[v + 1]) */
	int *cop;
	int *queue, qh, qt;
} Sched;

/* Readers of every value, and every op's and node's count of operands made
 * by some op. */
static void sched_init(const Comb *C, Sched *S)
{
	const Graph *g = C->g;
	int nn = C->nops + C->groups.n, nv = g->values.n, nuse = 0;
	S->pending = xcalloc((size_t)nn, sizeof(int));
	S->waiting = xcalloc((size_t)C->nops + 1, sizeof(int));
	S->reached = xcalloc((size_t)nn, sizeof(bool));
	S->done = xcalloc((size_t)nn, sizeof(bool));
	S->queue = xmalloc(sizeof(int) * (size_t)nn);
	S->qh = S->qt = 0;
	S->cstart = xcalloc((size_t)nv + 2, sizeof(int));
	for (int i = 0; i < C->nops; i++)
		for (int j = 0; j < g->ops.a[i].nin; j++) {
			int v = g->ops.a[i].in[j], made = g->values.a[v].producer >= 0;
			S->cstart[v + 2]++, nuse++;
			S->waiting[i] += made;
			S->pending[node_of(C, i)] += made;
		}
	for (int v = 0; v < nv; v++)
		S->cstart[v + 2] += S->cstart[v + 1];
	S->cop = xmalloc(sizeof(int) * (size_t)(nuse + 1));
	for (int i = 0; i < C->nops; i++)
		for (int j = 0; j < g->ops.a[i].nin; j++)
			S->cop[S->cstart[g->ops.a[i].in[j] + 1]++] = i;
}

static void sched_free(Sched *S)
{
	free(S->pending), free(S->waiting), free(S->reached), free(S->done), free(S->cstart), free(S->cop);
	free(S->queue);
}

/* Value v exists: its readers that were reached and wait for nothing else may run. */
static void release(const Comb *C, Sched *S, int v)
{
	for (int k = S->cstart[v]; k < S->cstart[v + 1]; k++) {
		int op = S->cop[k], nd = node_of(C, op);
		S->waiting[op]--;
		if (--S->pending[nd] == 0 && S->reached[nd])
			S->queue[S->qt++] = nd;
	}
}

/* Run the queue: each node into the order, its results released. */
static void drain(const Comb *C, Sched *S, int *order, int *n)
{
	while (S->qh < S->qt) {
		int x = S->queue[S->qh++];
		order[(*n)++] = x;
		S->done[x] = true;
		if (x < C->nops)
			release(C, S, C->g->ops.a[x].out);
		else
			for (int m = C->groups.a[x - C->nops].first; m >= 0; m = C->next[m])
				release(C, S, C->g->ops.a[m].out);
	}
}

/* Move the members of group k that wait for nothing into a group of their
 * own; a part of one member is no group. */
static void split_ready(Comb *C, const Sched *S, int k)
{
	Group ready = C->groups.a[k];
	int heads[2] = {-1, -1}, tails[2] = {-1, -1}, count[2] = {0, 0};
	for (int m = ready.first, nx; m >= 0; m = nx) {
		int part = S->waiting[m] == 0;
		nx = C->next[m], C->next[m] = -1;
		if (tails[part] >= 0)
			C->next[tails[part]] = m;
		else
			heads[part] = m;
		tails[part] = m, count[part]++;
	}
	ready.first = heads[1], ready.last = tails[1], ready.n = count[1];
	Group *rest = &C->groups.a[k];
	rest->first = heads[0], rest->last = tails[0], rest->n = count[0];
	vec_push(&C->groups, ready);
	for (int part = 0; part < 2; part++)
		for (int m = heads[part]; m >= 0; m = C->next[m])
			C->group[m] = count[part] < 2 ? -1 : part ? C->groups.n - 1 : k;
}

/* The order to run the nodes in, into order (*n of them).  0; or -1 when
 * the groups wait for each other in a cycle, after splitting one of them
 * (when split): the earliest op not run is a member (its operands come from
 * earlier ops, all run) whose group waits for others; its members that wait
 * for nothing become a group of their own. */
static int schedule(Comb *C, int *order, int *n, bool split)
{
	Sched S;
	sched_init(C, &S);
	int nnodes = 0;
	*n = 0;
	for (int i = 0; i < C->nops; i++) {
		int nd = node_of(C, i);
		if (S.reached[nd])
			continue;
		S.reached[nd] = true, nnodes++;
		if (S.pending[nd] == 0)
			S.queue[S.qt++] = nd;
		drain(C, &S, order, n);
	}
	int rc = *n == nnodes ? 0 : -1, z = 0;
	while (rc != 0 && z < C->nops && S.done[node_of(C, z)])
		z++;
	if (rc != 0 && split && z < C->nops && C->group[z] >= 0)
		split_ready(C, &S, C->group[z]);
	sched_free(&S);
	return rc;
}

/* ---- 4. rewrite ---- */

/* Where the ops made for one member come from. */
typedef struct {
	Pos pos;
	int src_op;
	const char *why;
} Origin;

/* A new value named after value `base`: local shape `local`, laid out by s
 * over a tensor of shape `global`. */
static int new_value(Graph *g, const char *base, DType t, const Shape *local, const Shape *global, const Spec *s,
                     Pos p)
{
	char name[512];
	const char *pct = strchr(base + 1, '%'); /* temporaries are ROOT%N, like the partitioner's */
	snprintf(name, sizeof name, "%.*s%%%d", pct ? (int)(pct - base) : (int)strlen(base), base, g->values.n);
	Spec spec = *s; /* s may point into the values graph_value moves */
	Shape gl = *global;
	int v = graph_value(g, name, t, local, VK_INTER, p);
	g->values.a[v].spec = spec;
	g->values.a[v].global = gl;
	return v;
}

/* Append op k reading in[0..nin) into value out, attributes *at. */
static void add_op(Graph *g, OpKind k, const int *in, int nin, int out, const Attr *at, const Origin *o)
{
	int id = graph_op(g, k, in, nin, out, o->pos);
	Op *op = &g->ops.a[id];
	*op->attr = *at;
	op->why = o->why;
	op->src_op = o->src_op;
}

/* One op on x into a new value like the description, or into `out` when >= 0. */
static int step(Graph *g, OpKind k, int x, const Attr *at, int out, const Shape *local, const Shape *global,
                const Spec *s, const Origin *o)
{
	if (out < 0)
		out = new_value(g, g->values.a[x].name, g->values.a[x].dtype, local, global, s, o->pos);
	add_op(g, k, &x, 1, out, at, o);
	return out;
}

/* perm bringing dim k of a rank-r tensor to the front; its inverse. */
static void front_perm(int k, int r, int *perm, int *inv)
{
	perm[0] = k;
	for (int i = 0, j = 1; i < r; i++)
		if (i != k)
			perm[j++] = i;
	for (int i = 0; i < r; i++)
		inv[perm[i]] = i;
}

static void permute_shape(const Shape *s, const int *perm, Shape *out)
{
	out->rank = s->rank;
	for (int i = 0; i < s->rank; i++)
		out->dim[i] = s->dim[perm[i]];
}

static void permute_spec(const Spec *s, const int *perm, Spec *out)
{
	*out = *s;
	out->open = 0;
	for (int i = 0; i < s->rank; i++) {
		out->nax[i] = s->nax[perm[i]];
		memcpy(out->ax[i], s->ax[perm[i]], sizeof out->ax[i]);
	}
}

/* A buffer's layout: rank dims, dim 0 split over the collective's axes when
 * split0, pending `partial` with reduction `reduce`. */
static void buffer_spec(int rank, const Attr *at, bool split0, unsigned partial, int reduce, Spec *s)
{
	memset(s, 0, sizeof *s);
	s->rank = (uint8_t)rank;
	s->partial = (uint8_t)partial;
	s->reduce = (uint8_t)(partial ? reduce : 0);
	if (split0) {
		s->nax[0] = (uint8_t)at->ncax;
		for (int i = 0; i < at->ncax; i++)
			s->ax[0][i] = (uint8_t)at->cax[i];
	}
}

static Shape shape2(int64_t a, int64_t b) { return (Shape){2, {a, b}}; }

/* How one member is viewed in the buffer: the perm bringing its dim to the
 * front (identity for all_reduce) and its packed shape. */
typedef struct {
	int op;
	int rank, perm[MAX_RANK], inv[MAX_RANK];
	bool moved;  /* perm is not the identity */
	Shape packed;
	int64_t off; /* along the buffer's last axis */
} View;

static void view_of(const Graph *g, const Op *op, int64_t n, View *w)
{
	const Value *x = &g->values.a[op->in[0]];
	int64_t numel = shape_numel(&x->shape);
	w->rank = x->shape.rank;
	front_perm(op->kind == OP_ALL_REDUCE ? 0 : op->attr->dim, w->rank, w->perm, w->inv);
	w->moved = op->kind != OP_ALL_REDUCE && op->attr->dim != 0;
	if (op->kind == OP_ALL_REDUCE)
		w->packed = (Shape){1, {numel}};
	else if (op->kind == OP_REDUCE_SCATTER)
		w->packed = shape2(n, numel / n);
	else
		w->packed = shape2(1, numel);
}

/* Member w's operand into its packed view (transpose, reshape). */
static int pack(Graph *g, const Op *m, const View *w, const Spec *ps, const Shape *pglobal, const Origin *o)
{
	int x = m->in[0];
	Attr at = {0};
	if (w->moved) {
		const Value *xv = &g->values.a[x];
		Shape ts, tg;
		Spec tsp;
		permute_shape(&xv->shape, w->perm, &ts), permute_shape(&xv->global, w->perm, &tg);
		permute_spec(&xv->spec, w->perm, &tsp);
		at.naxes = w->rank;
		memcpy(at.axes, w->perm, sizeof at.axes);
		x = step(g, OP_TRANSPOSE, x, &at, -1, &ts, &tg, &tsp, o);
	}
	if (shape_eq(&g->values.a[x].shape, &w->packed))
		return x;
	memset(&at, 0, sizeof at);
	at.shape = w->packed;
	return step(g, OP_RESHAPE, x, &at, -1, &w->packed, pglobal, ps, o);
}

/* Member w's result out of the collective's result c: its slice, reshaped
 * and transposed back into the member's own result value. */
static void unpack(Graph *g, const Op *m, const View *w, int c, const Origin *o)
{
	const Value *cv = &g->values.a[c], *y = &g->values.a[m->out];
	int last = cv->shape.rank - 1, r = y->shape.rank;
	int64_t len = shape_numel(&y->shape) / (last ? cv->shape.dim[0] : 1);
	Shape ys = y->shape, yg = y->global, ps = cv->shape, pg = cv->global, bs, bg;
	Spec cs = cv->spec, ysp = y->spec, bsp;
	permute_shape(&ys, w->perm, &bs), permute_shape(&yg, w->perm, &bg);
	permute_spec(&ysp, w->perm, &bsp);
	ps.dim[last] = pg.dim[last] = len;
	Attr at = {0};
	for (int d = 0; d <= last; d++)
		at.start[d] = 0, at.limit[d] = cv->shape.dim[d], at.stride[d] = 1;
	at.start[last] = w->off, at.limit[last] = w->off + len;
	bool reshape = !shape_eq(&ps, &bs), done = !reshape && !w->moved;
	int v = step(g, OP_SLICE, c, &at, done ? m->out : -1, &ps, &pg, &cs, o);
	if (reshape) {
		memset(&at, 0, sizeof at);
		at.shape = bs;
		v = step(g, OP_RESHAPE, v, &at, w->moved ? -1 : m->out, &bs, &bg, &bsp, o);
	}
	if (w->moved) {
		memset(&at, 0, sizeof at);
		at.naxes = r;
		memcpy(at.axes, w->inv, sizeof at.axes);
		step(g, OP_TRANSPOSE, v, &at, m->out, &ys, &yg, &ysp, o);
	}
}

static const char *const kind_word[] = {[OP_ALL_REDUCE] = "all_reduce", [OP_REDUCE_SCATTER] = "reduce_scatter",
                                         [OP_ALL_GATHER] = "all_gather"};

/* "combined: a, b, c (3 reduce_scatters over [data] in one buffer)": the results it makes. */
static const char *group_why(Comb *C, const Op *old, const Group *gr)
{
	Graph *g = C->g;
	const Attr *at = old[gr->first].attr;
	size_t cap = 96, n = 0;
	if (C->terse)
		return NULL;
	for (int m = gr->first; m >= 0; m = C->next[m])
		cap += strlen(g->values.a[old[m].out].name) + 2;
	char axes[256];
	mesh_axes_text(&g->mesh, at->cax, at->ncax, axes, sizeof axes);
	cap += strlen(axes);
	char *buf = xmalloc(cap);
	n += (size_t)snprintf(buf, cap, "combined:");
	for (int m = gr->first; m >= 0; m = C->next[m])
		n += (size_t)snprintf(buf + n, cap - n, "%s %s", m == gr->first ? "" : ",", g->values.a[old[m].out].name);
	snprintf(buf + n, cap - n, " (%d %ss over [%s] in one buffer)", gr->n, kind_word[gr->key.kind], axes);
	const char *s = arena_strdup(&g->arena, buf);
	free(buf);
	return s;
}

/* Every member's view and offset in the buffer; the buffer's width. */
static int64_t lay_out(const Comb *C, const Op *old, const Group *gr, View *w)
{
	int64_t n = members_of(C->g, old[gr->first].attr), total = 0;
	int i = 0;
	for (int m = gr->first; m >= 0; m = C->next[m], i++) {
		view_of(C->g, &old[m], n, &w[i]);
		w[i].op = m;
		w[i].off = total;
		total += w[i].packed.dim[w[i].packed.rank - 1];
	}
	return total;
}

/* The buffer of group gr: every member's operand packed (views w, in
 * layout ps), concatenated.  Its id. */
static int pack_all(Comb *C, const Op *old, const Group *gr, const View *w, int64_t total, const Spec *ps,
                    const char *what)
{
	Graph *g = C->g;
	const Op *m0 = &old[gr->first];
	int64_t n = members_of(g, m0->attr);
	bool gather = m0->kind == OP_ALL_GATHER;
	int *packed = xmalloc(sizeof(int) * (size_t)gr->n);
	DType dt = g->values.a[m0->in[0]].dtype;
	for (int i = 0; i < gr->n; i++) {
		const Op *m = &old[w[i].op];
		Shape pg = w[i].packed; /* an all_gather's blocks are one of n */
		pg.dim[0] = gather ? n : pg.dim[0];
		Origin o = {m->pos, m->src_op,
		            what ? arena_printf(&g->arena, "packs %s into %s", g->values.a[m->in[0]].name, what) : NULL};
		packed[i] = pack(g, m, &w[i], ps, &pg, &o);
	}
	Shape bs = w[0].packed, bg;
	bs.dim[bs.rank - 1] = total, bg = bs;
	bg.dim[0] = gather ? n : bg.dim[0];
	Origin po = {m0->pos, -1, what ? arena_printf(&g->arena, "packs the operands of %s into one buffer", what) : NULL};
	int buf = new_value(g, "combine", dt, &bs, &bg, ps, m0->pos);
	Attr at = {0};
	at.axis = bs.rank - 1;
	add_op(g, OP_CONCAT, packed, gr->n, buf, &at, &po);
	free(packed);
	return buf;
}

/* The collective of group k on the concatenation of its members' packed
 * views, then the members' results out of it.  old: the ops before the
 * rewrite, which the members index. */
static void emit_group(Comb *C, const Op *old, int k)
{
	Graph *g = C->g;
	const Group *gr = &C->groups.a[k];
	const Op *m0 = &old[gr->first];
	OpKind kind = m0->kind;
	int rank = kind == OP_ALL_REDUCE ? 1 : 2;
	int64_t n = members_of(g, m0->attr);
	View *w = xmalloc(sizeof *w * (size_t)gr->n);
	int64_t total = lay_out(C, old, gr, w);
	const Value *x0 = &g->values.a[m0->in[0]];
	Spec ps, cs;
	buffer_spec(rank, m0->attr, kind == OP_ALL_GATHER, x0->spec.partial, x0->spec.reduce, &ps);
	buffer_spec(rank, m0->attr, kind == OP_REDUCE_SCATTER, gr->key.partial, m0->attr->reduce, &cs);
	const char *what = C->terse ? NULL : arena_printf(&g->arena, "the combined %s", kind_word[kind]); /* NULL: no reasons */
	int buf = pack_all(C, old, gr, w, total, &ps, what);
	Shape ys = g->values.a[buf].shape, yg = g->values.a[buf].global; /* collectives keep the global shape */
	ys.dim[0] = kind == OP_REDUCE_SCATTER ? 1 : kind == OP_ALL_GATHER ? n : ys.dim[0];
	Origin co = {m0->pos, -1, group_why(C, old, gr)};
	int c = new_value(g, "combine", g->values.a[buf].dtype, &ys, &yg, &cs, m0->pos);
	Attr at = {0};
	at.ncax = m0->attr->ncax;
	memcpy(at.cax, m0->attr->cax, sizeof at.cax);
	at.reduce = kind == OP_ALL_GATHER ? 0 : m0->attr->reduce;
	at.spec_from = ps, at.spec = cs, at.shape = ys, at.global = yg;
	add_op(g, kind, &buf, 1, c, &at, &co);
	for (int i = 0; i < gr->n; i++) {
		const Op *m = &old[w[i].op];
		Origin o = {m->pos, m->src_op,
		            what ? arena_printf(&g->arena, "unpacks %s from %s", g->values.a[m->out].name, what) : NULL};
		unpack(g, m, &w[i], c, &o);
	}
	free(w);
}

/* The ops in the new order, groups expanded; every value's use count. */
static void rewrite(Comb *C, const int *order, int norder)
{
	Graph *g = C->g;
	Op *old = g->ops.a;
	g->ops.a = NULL, g->ops.n = g->ops.cap = 0;
	for (int i = 0; i < norder; i++) {
		int x = order[i];
		if (x >= C->nops) {
			emit_group(C, old, x - C->nops);
			continue;
		}
		vec_push(&g->ops, old[x]);
		g->values.a[old[x].out].producer = g->ops.n - 1;
	}
	free(old);
	for (int v = 0; v < g->values.n; v++)
		g->values.a[v].nuses = 0;
	for (int i = 0; i < g->ops.n; i++)
		for (int j = 0; j < g->ops.a[i].nin; j++)
			g->values.a[g->ops.a[i].in[j]].nuses++;
}

int combine_collectives(Graph *prog, const CombineOpts *o, Diag *d)
{
	Comb C = {.g = prog, .o = o, .nops = prog->ops.n, .terse = d->terse};
	int n = prog->ops.n, rc = 0, norder = 0;
	bool grouped = false;
	C.after = xcalloc((size_t)prog->values.n + 1, sizeof(int));
	C.group = xmalloc(sizeof(int) * (size_t)(n + 1));
	C.next = xmalloc(sizeof(int) * (size_t)(n + 1));
	int *order = xmalloc(sizeof(int) * (size_t)(n + 1));
	groups_clear(&C);
	/* levels within a class group the most; groups that wait for each other
	 * in a cycle are split (rare, a few rounds); levels over all candidates
	 * are the last resort: they cannot make a cycle */
	make_groups(&C, true);
	bool ok = false;
	for (int round = 0; round <= MAX_SPLITS && !ok; round++)
		ok = schedule(&C, order, &norder, round < MAX_SPLITS) == 0;
	if (!ok) {
		groups_clear(&C);
		make_groups(&C, false);
		ok = schedule(&C, order, &norder, false) == 0;
	}
	for (int i = 0; i < n; i++)
		grouped |= C.group[i] >= 0;
	if (!ok) {
		diag_error(d, (Pos){prog->file, 0, 0}, "internal: combining the collectives of '%s' made a cycle",
		           prog->name ? prog->name : "?");
		rc = -1;
	} else if (grouped) {
		rewrite(&C, order, norder);
		rc = graph_verify(prog, d) == 0 ? 0 : -1;
	}
	free(order), free(C.after), free(C.group), free(C.next), free(C.slots);
	vec_free(&C.groups);
	return rc;
}
