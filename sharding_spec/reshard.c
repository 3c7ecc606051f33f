/* reshard.c: the reshard planner — a cheapest-first search over local layouts from spec A to spec B.
 *
 * How it works.  A state is a ReshardLayout (which axes split each dim, in
 * which order, how large each device's block is, which axes are partial).
 * From a state the planner tries a handful of moves, each one step of a plan:
 *
 *   all_reduce      every partial axis the target does not keep, at once;
 *   reduce_scatter  partial axes the target wants on a dim, in order after
 *                   a prefix of the target's axes or out of order as below;
 *   slice           free axes (used nowhere) the target wants next on such a
 *                   dim, or anywhere on a dim holding only axes the target
 *                   wants there — local, no communication; also re-blocking
 *                   a dim whose axes are right but whose padded block is not;
 *   all_gather      any trailing (minor) axes of a dim;
 *   all_to_all      trailing axes of dim i that the target wants on dim j;
 *   permute         straight to the target when every dim has the target's
 *                   shard count and block (axis order or device order
 *                   differs), or relabelling axes of equal size, or reordering
 *                   the axes of one dim.
 *
 * This is the move set of Shardy's reshard-to-collectives and GSPMD's
 * ReshardNoCache (docs/algorithms.md §2), but instead of applying the moves in a
 * fixed order the planner runs Dijkstra over them, pricing each step by the
 * bytes a device sends on a ring, ties broken by fewer steps.  So
 * partial -> split is one reduce_scatter (cheaper than all_reduce + slice),
 * a split moving between dims is one all_to_all (cheaper than gather + slice),
 * and gather-everything-then-slice only wins when nothing else is possible
 * (uneven dims whose blocks no collective can line up); such gathers are
 * marked `fallback`.
 *
 * Uneven dims.  Blocks are padded to ceil(size / count), but a gathered block
 * is count * block, which for uneven sizes is larger than the canonical block
 * of the coarser split: layouts therefore carry their block size, and a local
 * step is allowed only when every device already holds all the data its new
 * block needs (reblock_ok).  Padding positions are always global indices past
 * the end of the dim, so no collective ever mixes padding into data. */
#include "reshard.h"

#include <string.h>

const char *const reshard_kind_names[RS_KIND_COUNT] = {
	"slice", "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "collective_permute",
};

enum { SEARCH_MAX_NODES = 20000 };

typedef struct {
	ReshardKind kind;
	int nax;
	int axes[MESH_MAX_AXES];
	int dim, dim2;
	bool to_b; /* a permute onto the target mesh's device order */
} Move;

typedef struct {
	ReshardLayout l;
	bool onb;    /* the layout is in the target mesh's device order */
	bool done;   /* popped: its cost is final */
	int64_t cost; /* bytes sent per device so far */
	int nsteps;
	int parent;  /* node index, -1 for the start */
	Move mv;     /* the step from parent */
} Node;

typedef struct {
	int64_t cost;
	int nsteps, node;
} HeapItem;

typedef struct {
	const Mesh *m, *mto;
	int rank;
	int64_t dims[MAX_RANK];
	int elem;
	int reduce;
	unsigned big;        /* axes of size > 1 */
	ReshardLayout goal;
	VEC(Node) nodes;
	VEC(HeapItem) heap;
	int *table;          /* open addressing: node index + 1, 0 empty */
	int cap;
} Search;

/* ---- layouts ---- */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t axes_size(const Mesh *m, const int *axes, int n)
{
	int64_t s = 1;
	for (int i = 0; i < n; i++)
		s *= m->size[axes[i]];
	return s;
}

static int64_t mask_size(const Mesh *m, unsigned mask) { return mesh_axes_size(m, mask); }

int64_t reshard_layout_count(const ReshardLayout *l, const Mesh *m, int d)
{
	int64_t n = 1;
	for (int i = 0; i < l->nax[d]; i++)
		n *= m->size[l->ax[d][i]];
	return n;
}

void reshard_layout_of(ReshardLayout *l, const Spec *s, const Mesh *m, const int64_t *dims)
{
	memset(l, 0, sizeof *l);
	for (int d = 0; d < s->rank; d++) {
		for (int i = 0; i < s->nax[d]; i++)
			if (m->size[s->ax[d][i]] > 1)
				l->ax[d][l->nax[d]++] = s->ax[d][i];
		l->block[d] = ceil_div(dims[d], reshard_layout_count(l, m, d));
	}
	for (int a = 0; a < m->naxes; a++)
		if ((s->partial >> a & 1) && m->size[a] > 1)
			l->partial |= (uint8_t)(1u << a);
}

void reshard_layout_spec(const ReshardLayout *l, int rank, int reduce, Spec *s)
{
	memset(s, 0, sizeof *s);
	s->rank = (uint8_t)rank;
	for (int d = 0; d < rank; d++) {
		s->nax[d] = l->nax[d];
		memcpy(s->ax[d], l->ax[d], sizeof s->ax[d]);
	}
	s->partial = l->partial;
	s->reduce = (uint8_t)(l->partial ? reduce : REDUCE_SUM);
}

void reshard_layout_index(const ReshardLayout *l, const Mesh *m, int rank, int device, int64_t *index)
{
	int coord[MESH_MAX_AXES] = {0};
	mesh_device_coords(m, device, coord);
	for (int d = 0; d < rank; d++) {
		int64_t k = 0;
		for (int i = 0; i < l->nax[d]; i++)
			k = k * m->size[l->ax[d][i]] + coord[l->ax[d][i]];
		index[d] = k;
	}
}

int reshard_layout_summand(const ReshardLayout *l, const Mesh *m, int device)
{
	int coord[MESH_MAX_AXES] = {0}, k = 0;
	mesh_device_coords(m, device, coord);
	for (int a = 0; a < m->naxes; a++)
		if (l->partial >> a & 1)
			k = k * m->size[a] + coord[a];
	return k;
}

static unsigned lay_used(const ReshardLayout *l, int rank)
{
	unsigned u = 0;
	for (int d = 0; d < rank; d++)
		for (int i = 0; i < l->nax[d]; i++)
			u |= 1u << l->ax[d][i];
	return u;
}

static int64_t lay_numel(const ReshardLayout *l, int rank)
{
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= l->block[d];
	return n;
}

static bool lay_eq(const ReshardLayout *a, const ReshardLayout *b) { return memcmp(a, b, sizeof *a) == 0; }

static void lay_append(ReshardLayout *l, int d, const int *axes, int n)
{
	for (int i = 0; i < n; i++)
		l->ax[d][l->nax[d]++] = (uint8_t)axes[i];
}

static void lay_drop(ReshardLayout *l, int d, int n)
{
	while (n-- > 0)
		l->ax[d][--l->nax[d]] = 0;
}

/* Length of l's axes on dim d if they are a prefix of t's, else -1. */
static int prefix(const ReshardLayout *l, const ReshardLayout *t, int d)
{
	if (l->nax[d] > t->nax[d] || memcmp(l->ax[d], t->ax[d], l->nax[d]) != 0)
		return -1;
	return l->nax[d];
}

/* Can a dim of size D held as `count` blocks of size b become count*m blocks
 * of size b2 (new shard k2 = k*m + s) without communication: does every new
 * block's data lie inside the old block it comes from? */
static bool reblock_ok(int64_t D, int64_t count, int64_t b, int64_t m, int64_t b2)
{
	for (int64_t k2 = 0; k2 < count * m; k2++) {
		int64_t lo = k2 * b2, hi = lo + b2 < D ? lo + b2 : D, k = k2 / m;
		if (lo >= D)
			break;
		int64_t olo = k * b, ohi = olo + b < D ? olo + b : D;
		if (lo < olo || hi > ohi)
			return false;
	}
	return true;
}

/* x * a / b without overflow, rounded up. */
static int64_t frac(int64_t x, int64_t a, int64_t b) { return x / b * a + ceil_div(x % b * a, b); }

static int64_t step_sent(ReshardKind k, int64_t bytes, int64_t n)
{
	switch (k) {
	case RS_SLICE: return 0;
	case RS_ALL_REDUCE: return frac(bytes, 2 * (n - 1), n);
	case RS_REDUCE_SCATTER:
	case RS_ALL_TO_ALL: return frac(bytes, n - 1, n);
	case RS_ALL_GATHER: return bytes * (n - 1);
	case RS_PERMUTE: return bytes;
	default: return 0;
	}
}

/* ---- the search's node table and heap ---- */

/* A layout is hashed a word at a time (its padding is zeroed too: layouts
 * compare with memcmp), each word's high bits folded into the low ones
 * that pick the slot. */
static uint64_t lay_hash(const ReshardLayout *l, bool onb)
{
	const unsigned char *p = (const unsigned char *)l;
	uint64_t h = 1469598103934665603ull ^ onb, w;
	size_t i = 0;
	for (; i + sizeof w <= sizeof *l; i += sizeof w) {
		memcpy(&w, p + i, sizeof w);
		h = (h ^ w) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
	}
	for (; i < sizeof *l; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h ^ (h >> 32);
}

static int table_find(const Search *S, const ReshardLayout *l, bool onb, size_t *slot)
{
	size_t i = (size_t)lay_hash(l, onb) & (size_t)(S->cap - 1);
	for (; S->table[i]; i = (i + 1) & (size_t)(S->cap - 1)) {
		const Node *n = &S->nodes.a[S->table[i] - 1];
		if (n->onb == onb && lay_eq(&n->l, l))
			return S->table[i] - 1;
	}
	*slot = i;
	return -1;
}

static void table_grow(Search *S)
{
	free(S->table);
	S->cap = S->cap ? 2 * S->cap : 1024;
	S->table = xcalloc((size_t)S->cap, sizeof *S->table);
	for (int k = 0; k < S->nodes.n; k++) {
		size_t slot = 0;
		table_find(S, &S->nodes.a[k].l, S->nodes.a[k].onb, &slot);
		S->table[slot] = k + 1;
	}
}

static bool item_less(const HeapItem *a, const HeapItem *b)
{
	return a->cost < b->cost || (a->cost == b->cost && a->nsteps < b->nsteps);
}

static void heap_push(Search *S, HeapItem it)
{
	vec_push(&S->heap, it);
	HeapItem *h = S->heap.a;
	for (int i = S->heap.n - 1; i > 0 && item_less(&h[i], &h[(i - 1) / 2]); i = (i - 1) / 2) {
		HeapItem t = h[i];
		h[i] = h[(i - 1) / 2];
		h[(i - 1) / 2] = t;
	}
}

static HeapItem heap_pop(Search *S)
{
	HeapItem *h = S->heap.a, top = h[0];
	h[0] = h[--S->heap.n];
	for (int i = 0;;) {
		int l = 2 * i + 1, r = l + 1, m = i;
		if (l < S->heap.n && item_less(&h[l], &h[m]))
			m = l;
		if (r < S->heap.n && item_less(&h[r], &h[m]))
			m = r;
		if (m == i)
			break;
		HeapItem t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
	return top;
}

/* Add a node (no table lookup); returns its index. */
static int node_add(Search *S, const ReshardLayout *l, bool onb, int parent, const Move *mv, int64_t cost, int nsteps)
{
	Node n = {.l = *l, .onb = onb, .cost = cost, .nsteps = nsteps, .parent = parent};
	if (mv)
		n.mv = *mv;
	vec_push(&S->nodes, n);
	return S->nodes.n - 1;
}

/* Reach layout `after` from node `at` by move mv, if cheaper than known. */
static void relax(Search *S, int at, const Move *mv, const ReshardLayout *after, bool onb)
{
	const Node *c = &S->nodes.a[at];
	int64_t bytes = lay_numel(&c->l, S->rank) * S->elem;
	int64_t cost = c->cost + step_sent(mv->kind, bytes, axes_size(S->m, mv->axes, mv->nax));
	int nsteps = c->nsteps + 1;
	if (2 * (S->nodes.n + 1) > S->cap)
		table_grow(S);
	size_t slot = 0;
	int k = table_find(S, after, onb, &slot);
	HeapItem it = {cost, nsteps, k};
	if (k < 0) {
		it.node = node_add(S, after, onb, at, mv, cost, nsteps);
		S->table[slot] = it.node + 1;
	} else {
		Node *n = &S->nodes.a[k];
		if (n->done || !item_less(&it, &(HeapItem){n->cost, n->nsteps, k}))
			return;
		n->cost = cost;
		n->nsteps = nsteps;
		n->parent = at;
		n->mv = *mv;
	}
	heap_push(S, it);
}

static Move move_make(ReshardKind k, const int *axes, int nax, int dim, int dim2)
{
	Move mv = {.kind = k, .nax = nax, .dim = dim, .dim2 = dim2};
	for (int i = 0; i < nax; i++)
		mv.axes[i] = axes[i];
	return mv;
}

static int mask_axes(unsigned mask, int *axes)
{
	int n = 0;
	for (int a = 0; a < MESH_MAX_AXES; a++)
		if (mask >> a & 1)
			axes[n++] = a;
	return n;
}

/* ---- moves ---- */

/* A local re-block of dim d so its block divides by n (before a
 * reduce_scatter or all_to_all splits it), if no device lacks data. */
static void move_pad(Search *S, int at, int d, int64_t n)
{
	ReshardLayout l = S->nodes.a[at].l;
	int64_t count = reshard_layout_count(&l, S->m, d), b2 = ceil_div(l.block[d], n) * n;
	if (!reblock_ok(S->dims[d], count, l.block[d], 1, b2))
		return;
	l.block[d] = b2;
	Move mv = move_make(RS_SLICE, NULL, 0, d, -1);
	relax(S, at, &mv, &l, S->nodes.a[at].onb);
}

/* The target's next axes on dim d (after the current prefix) that are in
 * mask, in order; -1 if the current axes are not a prefix of the target's. */
static int next_axes(const Search *S, const ReshardLayout *l, int d, unsigned mask, int *run)
{
	int p = prefix(l, &S->goal, d), n = 0;
	if (p < 0)
		return -1;
	for (int i = p; i < S->goal.nax[d] && (mask >> S->goal.ax[d][i] & 1); i++)
		run[n++] = S->goal.ax[d][i];
	return n;
}

static unsigned dim_mask(const ReshardLayout *l, int d)
{
	unsigned m = 0;
	for (int i = 0; i < l->nax[d]; i++)
		m |= 1u << l->ax[d][i];
	return m;
}

/* Axes in mask the target wants on dim d, out of order: d's current axes all
 * belong on d in the target, so a later permute can reorder them.  The
 * target's next axis in order (first) is left out: the in-order moves have it. */
static unsigned wanted_out_of_order(const Search *S, const ReshardLayout *l, int d, unsigned mask, int first)
{
	unsigned want = dim_mask(&S->goal, d);
	if (dim_mask(l, d) & ~want)
		return 0;
	return want & mask & ~(first >= 0 ? 1u << first : 0u);
}

/* reduce_scatter the partial axes axes[0..L) onto dim d (appended, minor). */
static void try_reduce_scatter(Search *S, int at, int d, const int *axes, int L)
{
	const ReshardLayout l = S->nodes.a[at].l;
	int64_t n = axes_size(S->m, axes, L);
	if (l.block[d] % n) {
		move_pad(S, at, d, n);
		return;
	}
	ReshardLayout after = l;
	lay_append(&after, d, axes, L);
	after.block[d] /= n;
	for (int i = 0; i < L; i++)
		after.partial &= (uint8_t)~(1u << axes[i]);
	Move mv = move_make(RS_REDUCE_SCATTER, axes, L, d, -1);
	relax(S, at, &mv, &after, S->nodes.a[at].onb);
}

static void moves_reduce(Search *S, int at)
{
	const ReshardLayout l = S->nodes.a[at].l;
	unsigned R = l.partial & ~S->goal.partial;
	if (!R)
		return;
	int axes[MESH_MAX_AXES], run[MESH_MAX_AXES];
	ReshardLayout after = l;
	after.partial &= (uint8_t)~R;
	Move mv = move_make(RS_ALL_REDUCE, axes, mask_axes(R, axes), -1, -1);
	relax(S, at, &mv, &after, S->nodes.a[at].onb);
	for (int d = 0; d < S->rank; d++) {
		int nrun = next_axes(S, &l, d, R, run);
		for (int L = 1; L <= nrun; L++)
			try_reduce_scatter(S, at, d, run, L);
		unsigned more = wanted_out_of_order(S, &l, d, R, nrun > 0 ? run[0] : -1);
		for (int a = 0; a < S->m->naxes; a++)
			if (more >> a & 1)
				try_reduce_scatter(S, at, d, &a, 1);
	}
}

static void try_slice(Search *S, int at, int d, const int *axes, int L, int64_t b2)
{
	const ReshardLayout *l = &S->nodes.a[at].l;
	int64_t n = axes_size(S->m, axes, L), count = reshard_layout_count(l, S->m, d);
	if (!reblock_ok(S->dims[d], count, l->block[d], n, b2))
		return;
	ReshardLayout after = *l;
	lay_append(&after, d, axes, L);
	after.block[d] = b2;
	Move mv = move_make(RS_SLICE, NULL, 0, d, -1);
	relax(S, at, &mv, &after, S->nodes.a[at].onb);
}

/* Slice any run of free axes onto any dim as its minor axes, even where the target
 * does not want it there: the detour that
 * moves a split between axes of different sizes without a gather ([data] ->
 * [[data, model]] -> permute to [[model, data]] -> all_gather data =
 * [model]), or that shards a dim the target leaves whole while an uneven
 * dim is gathered.  And re-block any dim to its spec's own block (after a gather of
 * uneven blocks), so detours through any spec's layout are in reach. */
static void slice_runs(Search *S, int at, int d, unsigned free_axes, int *run, int L)
{
	if (L > 0) {
		const ReshardLayout *l = &S->nodes.a[at].l; /* relax may move the nodes */
		int64_t n = axes_size(S->m, run, L), count = reshard_layout_count(l, S->m, d);
		int64_t canon = ceil_div(S->dims[d], count * n), fit = ceil_div(l->block[d], n);
		try_slice(S, at, d, run, L, canon);
		if (fit != canon)
			try_slice(S, at, d, run, L, fit);
	}
	for (int a = 0; a < S->m->naxes; a++)
		if (free_axes >> a & 1) {
			run[L] = a;
			slice_runs(S, at, d, free_axes & ~(1u << a), run, L + 1);
		}
}

static void moves_slice_any(Search *S, int at, unsigned free_axes)
{
	const ReshardLayout l = S->nodes.a[at].l;
	int run[MESH_MAX_AXES];
	for (int d = 0; d < S->rank; d++)
		slice_runs(S, at, d, free_axes, run, 0);
	for (int d = 0; d < S->rank; d++) { /* back to the spec's own block */
		int64_t canon = ceil_div(S->dims[d], reshard_layout_count(&l, S->m, d));
		if (l.block[d] != canon)
			try_slice(S, at, d, NULL, 0, canon);
	}
}

static void moves_slice(Search *S, int at)
{
	const ReshardLayout l = S->nodes.a[at].l;
	unsigned free_axes = S->big & ~(lay_used(&l, S->rank) | l.partial);
	int run[MESH_MAX_AXES];
	for (int d = 0; d < S->rank; d++) {
		int nrun = next_axes(S, &l, d, free_axes, run);
		int64_t count = reshard_layout_count(&l, S->m, d);
		for (int L = 1; L <= nrun; L++) {
			int64_t n = axes_size(S->m, run, L), canon = ceil_div(S->dims[d], count * n);
			try_slice(S, at, d, run, L, canon);
			if (ceil_div(l.block[d], n) != canon)
				try_slice(S, at, d, run, L, ceil_div(l.block[d], n));
		}
		unsigned more = wanted_out_of_order(S, &l, d, free_axes, nrun > 0 ? run[0] : -1);
		for (int a = 0; a < S->m->naxes; a++)
			if (more >> a & 1) {
				int64_t canon = ceil_div(S->dims[d], count * S->m->size[a]);
				try_slice(S, at, d, &a, 1, canon);
				if (ceil_div(l.block[d], S->m->size[a]) != canon)
					try_slice(S, at, d, &a, 1, ceil_div(l.block[d], S->m->size[a]));
			}
		if (nrun == 0 && l.nax[d] == S->goal.nax[d] && l.block[d] != S->goal.block[d])
			try_slice(S, at, d, NULL, 0, S->goal.block[d]);
	}
	/* while a reduction is pending, only axes the target splits by: slicing
	 * an idle axis around an all_reduce is cheaper by bytes but turns the
	 * one all_reduce of the rules into three collectives */
	bool reducing = l.partial & ~S->goal.partial;
	moves_slice_any(S, at, reducing ? free_axes & lay_used(&S->goal, S->rank) : free_axes);
}

static void moves_gather(Search *S, int at)
{
	const ReshardLayout l = S->nodes.a[at].l;
	for (int d = 0; d < S->rank; d++)
		for (int L = 1; L <= l.nax[d]; L++) {
			int axes[MESH_MAX_AXES];
			for (int i = 0; i < L; i++)
				axes[i] = l.ax[d][l.nax[d] - L + i];
			ReshardLayout after = l;
			lay_drop(&after, d, L);
			after.block[d] *= axes_size(S->m, axes, L);
			Move mv = move_make(RS_ALL_GATHER, axes, L, d, -1);
			relax(S, at, &mv, &after, S->nodes.a[at].onb);
		}
}

/* Move the last L axes of dim i onto dim j (appended, minor), wherever the
 * target wants them: a later permute or all_to_all fixes the order, and a
 * detour through a dim the target leaves whole can beat a gather of uneven
 * blocks. */
static void try_all_to_all(Search *S, int at, int i, int L, int j)
{
	const ReshardLayout l = S->nodes.a[at].l;
	int axes[MESH_MAX_AXES];
	for (int k = 0; k < L; k++)
		axes[k] = l.ax[i][l.nax[i] - L + k];
	int64_t n = axes_size(S->m, axes, L);
	if (l.block[j] % n) {
		move_pad(S, at, j, n);
		return;
	}
	ReshardLayout after = l;
	lay_drop(&after, i, L);
	after.block[i] *= n;
	lay_append(&after, j, axes, L);
	after.block[j] /= n;
	Move mv = move_make(RS_ALL_TO_ALL, axes, L, j, i);
	relax(S, at, &mv, &after, S->nodes.a[at].onb);
}

static void moves_all_to_all(Search *S, int at)
{
	for (int i = 0; i < S->rank; i++)
		for (int L = 1; L <= S->nodes.a[at].l.nax[i]; L++)
			for (int j = 0; j < S->rank; j++)
				if (j != i)
					try_all_to_all(S, at, i, L, j);
}

/* Same shard count and block on every dim and as many summands: one permute
 * takes a to b. */
static bool permutable(const Search *S, const ReshardLayout *a, const ReshardLayout *b)
{
	for (int d = 0; d < S->rank; d++)
		if (a->block[d] != b->block[d] ||
		    reshard_layout_count(a, S->m, d) != reshard_layout_count(b, S->m, d))
			return false;
	return mask_size(S->m, a->partial) == mask_size(S->m, b->partial);
}

/* All permutations of 0..k-1 in lexicographic order; returns how many. */
static int permutations(int k, int out[24][MESH_MAX_AXES])
{
	int p[MESH_MAX_AXES] = {0}, n = 0;
	for (int i = 0; i < k; i++)
		p[i] = i;
	for (;;) {
		memcpy(out[n++], p, sizeof p);
		int i = k - 2;
		while (i >= 0 && p[i] > p[i + 1])
			i--;
		if (i < 0)
			return n;
		int j = k - 1;
		while (p[j] < p[i])
			j--;
		int t = p[i];
		p[i] = p[j];
		p[j] = t;
		for (int a = i + 1, b = k - 1; a < b; a++, b--)
			t = p[a], p[a] = p[b], p[b] = t;
	}
}

static void relabel(const ReshardLayout *l, const int *pi, int rank, ReshardLayout *out)
{
	*out = *l;
	out->partial = 0;
	for (int d = 0; d < rank; d++)
		for (int i = 0; i < l->nax[d]; i++)
			out->ax[d][i] = (uint8_t)pi[l->ax[d][i]];
	for (int a = 0; a < MESH_MAX_AXES; a++)
		if (l->partial >> a & 1)
			out->partial |= (uint8_t)(1u << pi[a]);
}

static void moves_permute(Search *S, int at)
{
	const ReshardLayout l = S->nodes.a[at].l;
	bool onb = S->nodes.a[at].onb;
	int perm[24][MESH_MAX_AXES], np = permutations(S->m->naxes, perm);
	Move mv = move_make(RS_PERMUTE, NULL, 0, -1, -1);
	if (!(onb && lay_eq(&l, &S->goal)) && permutable(S, &l, &S->goal)) {
		mv.to_b = !onb;
		relax(S, at, &mv, &S->goal, true);
		mv.to_b = false;
	}
	for (int k = 1; k < np; k++) { /* relabel axes of equal size */
		bool ok = true;
		for (int a = 0; a < S->m->naxes; a++)
			ok &= S->m->size[perm[k][a]] == S->m->size[a];
		ReshardLayout after;
		relabel(&l, perm[k], S->rank, &after);
		if (ok && !lay_eq(&after, &l))
			relax(S, at, &mv, &after, onb);
	}
	for (int d = 0; d < S->rank; d++) { /* reorder the axes of one dim */
		np = permutations(l.nax[d], perm);
		for (int k = 1; k < np; k++) {
			ReshardLayout after = l;
			for (int i = 0; i < l.nax[d]; i++)
				after.ax[d][i] = l.ax[d][perm[k][i]];
			relax(S, at, &mv, &after, onb);
		}
	}
}

static void expand(Search *S, int at)
{
	moves_reduce(S, at);
	moves_slice(S, at);
	moves_gather(S, at);
	moves_all_to_all(S, at);
	moves_permute(S, at);
}

/* Dijkstra from node 0 to the goal; the goal's node index, or -1 when the
 * node budget runs out. */
static int search_run(Search *S)
{
	heap_push(S, (HeapItem){0, 0, 0});
	while (S->heap.n > 0) {
		HeapItem it = heap_pop(S);
		Node *n = &S->nodes.a[it.node];
		if (n->done || it.cost != n->cost || it.nsteps != n->nsteps)
			continue;
		n->done = true;
		if (n->onb && lay_eq(&n->l, &S->goal))
			return it.node;
		if (S->nodes.n > SEARCH_MAX_NODES)
			return -1;
		expand(S, it.node);
	}
	return -1;
}

/* The plan of last resort, built without search: all_reduce what must be
 * reduced, all_gather every dim, slice to the target, permute if the device
 * order differs.  Always valid. */
static int search_fallback(Search *S)
{
	int at = 0;
	ReshardLayout l = S->nodes.a[0].l;
	unsigned R = l.partial & ~S->goal.partial;
	int axes[MESH_MAX_AXES];
	if (R) {
		Move mv = move_make(RS_ALL_REDUCE, axes, mask_axes(R, axes), -1, -1);
		l.partial &= (uint8_t)~R;
		at = node_add(S, &l, S->nodes.a[0].onb, at, &mv, 0, 0);
	}
	for (int d = 0; d < S->rank; d++) {
		if (!l.nax[d])
			continue;
		for (int i = 0; i < l.nax[d]; i++)
			axes[i] = l.ax[d][i];
		Move mv = move_make(RS_ALL_GATHER, axes, l.nax[d], d, -1);
		l.block[d] *= reshard_layout_count(&l, S->m, d);
		lay_drop(&l, d, l.nax[d]);
		at = node_add(S, &l, S->nodes.a[0].onb, at, &mv, 0, 0);
	}
	Move slice = move_make(RS_SLICE, NULL, 0, -1, -1);
	at = node_add(S, &S->goal, S->nodes.a[0].onb, at, &slice, 0, 0);
	if (!S->nodes.a[0].onb) {
		Move mv = move_make(RS_PERMUTE, NULL, 0, -1, -1);
		mv.to_b = true;
		at = node_add(S, &S->goal, true, at, &mv, 0, 0);
	}
	return at;
}

/* ---- turning the path into a plan ---- */

typedef struct {
	int64_t key;
	int dev;
} KeyDev;

static int keydev_cmp(const void *a, const void *b)
{
	const KeyDev *x = a, *y = b;
	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->dev - y->dev;
}

/* What a device holds under a layout: its shard indices and summand, as one number. */
static int64_t hold_key(const ReshardLayout *l, const Mesh *m, int rank, int dev)
{
	int64_t index[MAX_RANK], key = 0;
	reshard_layout_index(l, m, rank, dev, index);
	for (int d = 0; d < rank; d++)
		key = key * reshard_layout_count(l, m, d) + index[d];
	return key * mask_size(m, l->partial) + reshard_layout_summand(l, m, dev);
}

/* target[dev] for a permute from layout a (on mesh ma) to b (on mb):
 * devices keep what they already hold; the rest are matched in device order. */
static void permute_map(const ReshardLayout *a, const Mesh *ma, const ReshardLayout *b, const Mesh *mb, int rank,
                        int *target)
{
	int n = ma->ndev, ns = 0, nr = 0;
	KeyDev *send = xmalloc(sizeof *send * (size_t)n), *recv = xmalloc(sizeof *recv * (size_t)n);
	for (int dev = 0; dev < n; dev++) {
		int64_t ka = hold_key(a, ma, rank, dev), kb = hold_key(b, mb, rank, dev);
		target[dev] = ka == kb ? dev : -1;
		if (ka != kb) {
			send[ns++] = (KeyDev){ka, dev};
			recv[nr++] = (KeyDev){kb, dev};
		}
	}
	qsort(send, (size_t)ns, sizeof *send, keydev_cmp);
	qsort(recv, (size_t)nr, sizeof *recv, keydev_cmp);
	for (int i = 0; i < ns && i < nr; i++)
		target[send[i].dev] = recv[i].dev;
	free(send);
	free(recv);
}

static bool map_identity(const int *target, int n)
{
	for (int i = 0; i < n; i++)
		if (target[i] != i)
			return false;
	return true;
}

/* The axes along which a permute moves data. */
static void permute_axes(ReshardStep *s, const Mesh *m)
{
	unsigned mask = 0;
	for (int dev = 0; dev < m->ndev; dev++) {
		int c1[MESH_MAX_AXES] = {0}, c2[MESH_MAX_AXES] = {0};
		mesh_device_coords(m, dev, c1);
		mesh_device_coords(m, s->target[dev], c2);
		for (int a = 0; a < m->naxes; a++)
			if (c1[a] != c2[a])
				mask |= 1u << a;
	}
	s->nax = mask_axes(mask, s->axes);
}

/* Merge neighbouring slices and neighbouring permutes; a permute that moves
 * nothing becomes a slice (a relabelling).  Returns the new step count. */
static int steps_tidy(ReshardStep *st, int n, int ndev)
{
	int k = 0;
	for (int i = 0; i < n; i++) {
		ReshardStep s = st[i];
		ReshardStep *prev = k ? &st[k - 1] : NULL;
		if (prev && prev->kind == RS_PERMUTE && s.kind == RS_PERMUTE) {
			for (int dev = 0; dev < ndev; dev++)
				prev->target[dev] = s.target[prev->target[dev]];
			prev->after = s.after;
			prev->to_target_mesh |= s.to_target_mesh;
			s = *prev;
			k--;
		}
		if (s.kind == RS_PERMUTE && map_identity(s.target, ndev)) {
			/* moves nothing: a relabelling, or (onto the target mesh,
			 * always the last step) nothing at all */
			if (s.to_target_mesh)
				continue;
			s.kind = RS_SLICE;
		}
		prev = k ? &st[k - 1] : NULL;
		if (prev && prev->kind == RS_SLICE && s.kind == RS_SLICE) {
			prev->after = s.after;
			continue;
		}
		st[k++] = s;
	}
	return k;
}

/* Does slice step s cut dim d's block, dropping data a gather brought (not
 * just padding past the dim's size D)? */
static bool slice_drops(const ReshardStep *s, int d, int64_t D)
{
	return s->after.block[d] < s->before.block[d] && s->after.block[d] < D;
}

/* Byte counts, slice cleanup and fallback marks of the finished steps: an
 * all_gather is a fallback when a later slice drops part of the dim it
 * gathered (cheaper plans move only what the target keeps). */
static void steps_finish(ReshardPlan *p, const Mesh *m)
{
	int k = 0;
	for (int i = 0; i < p->nsteps; i++) {
		ReshardStep *s = &p->steps[i];
		if (s->kind == RS_SLICE && lay_eq(&s->before, &s->after))
			continue;
		if (s->kind == RS_SLICE) {
			s->nax = 0;
			s->dim = s->dim2 = -1;
			s->target = NULL;
		}
		if (s->kind == RS_PERMUTE)
			permute_axes(s, m);
		int64_t bytes = lay_numel(&s->before, p->rank) * p->elem_size;
		s->bytes_per_device = s->kind == RS_SLICE ? 0 : bytes;
		s->bytes_sent_per_device = step_sent(s->kind, bytes, axes_size(m, s->axes, s->nax));
		p->steps[k++] = *s;
	}
	p->nsteps = k;
	for (int i = 0; i < k; i++) {
		ReshardStep *s = &p->steps[i];
		for (int j = i + 1; j < k && s->kind == RS_ALL_GATHER; j++)
			if (p->steps[j].kind == RS_SLICE && slice_drops(&p->steps[j], s->dim, p->dims[s->dim]))
				s->fallback = true;
		p->fallback |= s->fallback;
		p->bytes_per_device += s->bytes_per_device;
		p->bytes_sent_per_device += s->bytes_sent_per_device;
	}
}

/* Walk back from the goal node and fill p's steps. */
static void plan_build(ReshardPlan *p, Search *S, int goal)
{
	int n = 0;
	for (int k = goal; S->nodes.a[k].parent >= 0; k = S->nodes.a[k].parent)
		n++;
	p->steps = arena_alloc(&p->arena, sizeof *p->steps * (size_t)(n ? n : 1));
	p->nsteps = n;
	for (int k = goal, i = n - 1; i >= 0; k = S->nodes.a[k].parent, i--) {
		const Node *nd = &S->nodes.a[k], *par = &S->nodes.a[nd->parent];
		ReshardStep *s = &p->steps[i];
		*s = (ReshardStep){.kind = nd->mv.kind, .nax = nd->mv.nax, .dim = nd->mv.dim, .dim2 = nd->mv.dim2,
		                   .reduce = S->reduce, .before = par->l, .after = nd->l};
		memcpy(s->axes, nd->mv.axes, sizeof s->axes);
		s->to_target_mesh = nd->mv.to_b;
		if (s->kind == RS_PERMUTE) {
			s->target = arena_alloc(&p->arena, sizeof(int) * (size_t)S->m->ndev);
			permute_map(&par->l, S->m, &nd->l, nd->mv.to_b ? S->mto : S->m, S->rank, s->target);
		}
	}
	p->nsteps = steps_tidy(p->steps, n, S->m->ndev);
	steps_finish(p, S->m);
}

/* ---- entry points ---- */

/* Does every device hold the same data under layout l on both meshes? */
static bool same_holdings(const ReshardLayout *l, const Mesh *a, const Mesh *b, int rank)
{
	for (int dev = 0; dev < a->ndev; dev++)
		if (hold_key(l, a, rank, dev) != hold_key(l, b, rank, dev))
			return false;
	return true;
}

static bool same_axes(const Mesh *a, const Mesh *b)
{
	if (a->naxes != b->naxes)
		return false;
	for (int i = 0; i < a->naxes; i++)
		if (a->size[i] != b->size[i] || strcmp(a->name[i], b->name[i]) != 0)
			return false;
	return true;
}

/* The checks on the inputs a caller could get wrong; 0 or -1 after reporting. */
static int plan_check(const Spec *from, const Mesh *mfrom, const Spec *to, const Mesh *mto, const int64_t *dims,
                      Diag *d)
{
	Pos none = {0};
	if (!same_axes(mfrom, mto)) {
		diag_error(d, none, "expected the target mesh to have the source mesh's axes, found other axes");
		return -1;
	}
	if (from->rank != to->rank || !spec_is_valid(from, mfrom) || !spec_is_valid(to, mto)) {
		diag_error(d, none, "expected two valid shardings of the same rank, found ranks %d and %d", from->rank,
		           to->rank);
		return -1;
	}
	for (int i = 0; i < from->rank; i++)
		if (dims[i] < 0) {
			diag_error(d, none, "expected non-negative dimensions, found %lld", (long long)dims[i]);
			return -1;
		}
	unsigned big = 0;
	for (int a = 0; a < mfrom->naxes; a++)
		big |= (mfrom->size[a] > 1) << a;
	unsigned extra = to->partial & ~from->partial & big;
	if (extra) {
		int a = 0;
		while (!(extra >> a & 1))
			a++;
		diag_error(d, none, "expected the target's partial axes to be partial in the source, found '%s' partial only in the target",
		           mfrom->name[a]);
		return -1;
	}
	if ((to->partial & big) && from->reduce != to->reduce) {
		diag_error(d, none, "expected the same pending reduction in source and target, found %s and %s",
		           from->reduce == REDUCE_MAX ? "max" : "sum", to->reduce == REDUCE_MAX ? "max" : "sum");
		return -1;
	}
	return 0;
}

int reshard_plan_meshes(ReshardPlan *p, const Spec *from, const Mesh *mfrom, const Spec *to, const Mesh *mto,
                        const int64_t *dims, int elem_size, Diag *d)
{
	memset(p, 0, sizeof *p);
	if (plan_check(from, mfrom, to, mto, dims, d) != 0)
		return -1;
	ReshardLayout start;
	reshard_layout_of(&start, from, mfrom, dims);
	if (!mesh_same_order(mfrom, mto) && same_holdings(&start, mfrom, mto, from->rank))
		mfrom = mto; /* e.g. replicated: plan in the target's device order from the start */
	arena_init(&p->arena);
	p->rank = from->rank;
	memcpy(p->dims, dims, sizeof(int64_t) * (size_t)from->rank);
	p->elem_size = elem_size;
	p->ndev = mfrom->ndev;
	Search S = {.m = mfrom, .mto = mto, .rank = from->rank, .elem = elem_size, .reduce = from->reduce};
	memcpy(S.dims, p->dims, sizeof S.dims);
	for (int a = 0; a < mfrom->naxes; a++)
		S.big |= (unsigned)(mfrom->size[a] > 1) << a;
	reshard_layout_of(&S.goal, to, mto, dims);
	p->from = start;
	p->mesh = mfrom;
	p->mesh_to = mto;
	p->to = S.goal;
	table_grow(&S);
	node_add(&S, &start, mesh_same_order(mfrom, mto), -1, NULL, 0, 0);
	size_t slot = 0;
	table_find(&S, &start, S.nodes.a[0].onb, &slot);
	S.table[slot] = 1;
	int goal = search_run(&S);
	if (goal < 0)
		goal = search_fallback(&S);
	plan_build(p, &S, goal);
	vec_free(&S.nodes);
	vec_free(&S.heap);
	free(S.table);
	return 0;
}

int reshard_plan(ReshardPlan *p, const Spec *from, const Spec *to, const Mesh *m, const int64_t *dims, int elem_size,
                 Diag *d)
{
	return reshard_plan_meshes(p, from, m, to, m, dims, elem_size, d);
}

void reshard_plan_free(ReshardPlan *p)
{
	arena_free(&p->arena);
	memset(p, 0, sizeof *p);
}

void reshard_step_format(const ReshardStep *s, const Mesh *m, char *buf, size_t n)
{
	size_t k = (size_t)snprintf(buf, n, "%s", reshard_kind_names[s->kind]);
	if (s->nax && k < n) {
		char axes[256];
		mesh_axes_text(m, s->axes, s->nax, axes, sizeof axes);
		k += (size_t)snprintf(buf + k, n - k, " [%s]", axes);
	}
	if (k >= n)
		return;
	if (s->kind == RS_ALL_TO_ALL)
		snprintf(buf + k, n - k, " split dim %d, concat dim %d", s->dim, s->dim2);
	else if (s->kind == RS_ALL_GATHER || s->kind == RS_REDUCE_SCATTER)
		snprintf(buf + k, n - k, " dim %d", s->dim);
}

int64_t reshard_bytes_sent(ReshardKind k, int64_t bytes, int64_t n) { return step_sent(k, bytes, n); }
