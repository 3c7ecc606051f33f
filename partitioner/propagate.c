/* propagate.c: sharding propagation over factors, to a fixed point.
 *
 * The method follows OpenXLA Shardy's factor propagation (see
 * docs/algorithms.md §1).  Every op is described by factors
 * (factors.h).  One step on one op:
 *   1. project each tensor's dim shardings onto the op's factors: the axes of
 *      a dim go to its factors major to minor, to the next factor only once
 *      the previous one is fully split;
 *   2. per factor, pick one candidate: a user's annotation beats an inferred
 *      sharding; then the candidate whose tensor costs more to reshard (the
 *      cost model's price of moving it; the larger tensor: resharding the
 *      smaller one moves fewer bytes); then the one with more axes; then the
 *      smaller axis ids.  Candidates that are not a prefix of the winner lose
 *      and are recorded as conflicts.  Two factors of one tensor given the
 *      same axis: the factor whose candidate loses keeps only its axes before
 *      it (settle_clashes);
 *   3. extend every open dim holding the factor with the winner's axes, as long
 *      as the result keeps each axis once per tensor and a dim is at least as
 *      large as its shard count;
 *   4. enqueue the ops next to every value that changed.
 * A dim only ever grows (its axis list gets longer), so the work list drains.
 * The order of the work list is the graph's, not the file's: ops start in
 * the order of their results' names (a training step's forward pass, the
 * ops the loss depends on, before the rest: forward_first) and a changed
 * value enqueues its producer, then its readers in that order.  Which of
 * two ops pulling an open dim towards different axes acts first — and so
 * wins — therefore depends on names and edges only, and every topological
 * order of the same graph propagates alike (tests/order_test.sh).
 * User annotations are never changed; `null` dims stay unsplit.  Every dim
 * remembers the value, op and factor it came from (Origin), which is what
 * `spmd propagate` prints and `--explain` follows back.
 *
 * Priorities (as Shardy's user priorities): the fixed point above is one
 * round.  Round 0 runs with the annotations of priority 0 (those that name
 * none); a value annotated with priority k > 0 is closed and unsplit until
 * round k, which sets its annotation and runs to the fixed point again from
 * its neighbours.  Dims only grow, so what an earlier round decided stays;
 * dims it left unsplit (and open) are the later rounds' to split.
 *
 * Sharding groups (shard_as): the members of a group are one tensor to
 * propagation.  They share one annotation (members annotated alike, at one
 * priority; the others take it), and a dim that grows on one member grows
 * on all of them (spread), enqueuing every member's neighbours. */
#include "propagate.h"

#include <stdlib.h>
#include <string.h>

#include "../spmd/ops.h"
#include "../spmd/train_section.h"
#include "factors.h"
#include "../cost_model/cost.h"

typedef struct {
	Axes axes;
	int value, dim;
	int64_t bytes;
	double price;  /* seconds to reshard this tensor (cost model): what losing costs */
	bool user;
} Cand;

/* State of one propagation run. */
typedef struct {
	Graph *g;
	Propagation *p;
	Diag *d;
	int nerr;
	HwProfile hw;           /* prices conflicts */
	int *use_start, *use_op; /* consumers of each value, CSR, in `order` */
	int *order;             /* op ids by their results' names */
	int *queue;
	char *queued;
	int head, tail, cap;
	int round;              /* the priority round running */
	uint8_t *prio;          /* per value: the round that sets its annotation */
	Spec *pending;          /* per value of prio > 0: the annotation, open dims marked */
	int *group_next;        /* per value: the next member of its group (a cycle), or -1 */
	FactorCut cuts[MESH_MAX_AXES]; /* sub-axes a reshape asked for: one cut per axis */
	int ncuts;
	struct PriceSlot *prices; /* reshard_price's results, by bytes and axes (direct-mapped) */
	FactorRule *rules;        /* per op: room for its factor rule, made at its first step */
	const FactorRule **rule;  /* per op: its rule (in rules or memo), once rule_state is set */
	int8_t *rule_state;       /* per op 0: not asked yet, 1: in rule, -1: the op has none */
	const FactorRules *memo;  /* rules made before, or NULL */
} Prop;

enum { PRICE_SLOTS = 1024 }; /* the sizes of a model times the sets of axes: some hundreds */

/* A remembered reshard price: the tensor's bytes + 1 (0: empty), its axes packed. */
struct PriceSlot {
	int64_t bytes1;
	unsigned axes;
	double price;
};

static int64_t value_bytes(const Value *v) { return shape_numel(&v->shape) * dtype_size(v->dtype); }

static int value_of(const Op *op, const FactorRule *r, int t)
{
	return t == r->res ? op->out : op->in[t];
}

/* Number of rule tensors an op has: operands in the table, and the result. */
static int rule_tensors(const FactorRule *r) { return r->res + 1; }

/* Project the axes of dim d of tensor t onto its factors (step 1). */

static bool is_prefix(const Axes *a, const Axes *b)
{
	if (a->n > b->n)
		return false;
	return memcmp(a->ax, b->ax, a->n) == 0;
}

/* The rule that orders two different candidates (step 2). */
static int deciding_rule(const Cand *a, const Cand *b)
{
	if (a->user != b->user)
		return CONFLICT_USER;
	if (a->price != b->price)
		return CONFLICT_BYTES;
	return a->axes.n != b->axes.n ? CONFLICT_AXES : CONFLICT_ORDER;
}

/* Order of preference between two candidates (step 2); true if a beats b. */
static bool better(const Cand *a, const Cand *b)
{
	switch (deciding_rule(a, b)) {
	case CONFLICT_USER: return a->user;
	case CONFLICT_BYTES: return a->price > b->price;
	case CONFLICT_AXES: return a->axes.n > b->axes.n;
	default: return memcmp(a->axes.ax, b->axes.ax, a->axes.n) < 0;
	}
}

static void record_conflict(Prop *pp, int op, const Cand *win, const Cand *lose, char factor)
{
	Conflict c = {.op = op, .winner = win->value, .loser = lose->value, .value = lose->value,
	              .nwin = win->axes.n, .nlose = lose->axes.n, .factor = factor,
	              .win_bytes = win->bytes, .lose_bytes = lose->bytes, .win_dim = win->dim,
	              .rule = (uint8_t)deciding_rule(win, lose)};
	memcpy(c.win_axes, win->axes.ax, win->axes.n);
	memcpy(c.lose_axes, lose->axes.ax, lose->axes.n);
	for (int i = pp->p->op_conflict[op]; i >= 0; i = pp->p->conflicts.a[i].next) {
		Conflict *o = &pp->p->conflicts.a[i];
		if (o->winner == c.winner && o->loser == c.loser && o->factor == factor)
			return;
	}
	c.next = pp->p->op_conflict[op];
	pp->p->op_conflict[op] = pp->p->conflicts.n;
	vec_push(&pp->p->conflicts, c);
}

static void enqueue(Prop *pp, int op)
{
	if (pp->queued[op])
		return;
	pp->queued[op] = 1;
	pp->queue[pp->tail] = op;
	pp->tail = (pp->tail + 1) % pp->cap;
}

static void enqueue_neighbours(Prop *pp, int v)
{
	const Value *val = &pp->g->values.a[v];
	if (val->producer >= 0)
		enqueue(pp, val->producer);
	for (int i = pp->use_start[v]; i < pp->use_start[v + 1]; i++)
		enqueue(pp, pp->use_op[i]);
}

/* Is axis a used on a dim of s other than d? */
static bool axis_used_elsewhere(const Spec *s, int d, int a)
{
	for (int e = 0; e < s->rank; e++)
		for (int k = 0; e != d && k < s->nax[e]; k++)
			if (s->ax[e][k] == a)
				return true;
	return false;
}

/* Build the axes dim d of tensor t would have from the chosen factor axes. */
static void dim_axes(const Graph *g, const FactorRule *r, int t, int d, const Axes *chosen, Axes *out)
{
	out->n = 0;
	for (int i = 0; i < r->nfd[t][d]; i++) {
		int f = r->fd[t][d][i];
		int64_t prod = 1;
		for (int k = 0; k < chosen[f].n && out->n < MESH_MAX_AXES; k++) {
			out->ax[out->n++] = chosen[f].ax[k];
			prod *= g->mesh.size[chosen[f].ax[k]];
		}
		if (prod != r->size[f])
			return;
	}
}

/* Extend dim d of value v towards `want` (step 3); true if it changed. */
static bool extend_dim(Prop *pp, int v, int d, const Axes *want, Origin o)
{
	Value *val = &pp->g->values.a[v];
	Spec *s = &val->spec;
	if (pp->p->closed[v] >> d & 1)
		return false;
	Axes cur = {s->nax[d], {0}};
	memcpy(cur.ax, s->ax[d], cur.n);
	if (want->n <= cur.n || !is_prefix(&cur, want))
		return false;
	int n = cur.n;
	int64_t shards = 1;
	for (int k = 0; k < n; k++)
		shards *= pp->g->mesh.size[cur.ax[k]];
	while (n < want->n) {
		int a = want->ax[n];
		if (axis_used_elsewhere(s, d, a) || shards * pp->g->mesh.size[a] > val->shape.dim[d])
			break;
		shards *= pp->g->mesh.size[a];
		s->ax[d][n++] = (uint8_t)a;
	}
	if (n == cur.n)
		return false;
	s->nax[d] = (uint8_t)n;
	pp->p->origin[v][d] = o;
	return true;
}

/* Dim d of v grew: its neighbours are enqueued, and the other members of
 * its sharding group grow alike (with theirs). */
static void spread(Prop *pp, int v, int d)
{
	enqueue_neighbours(pp, v);
	const Spec *s = &pp->g->values.a[v].spec;
	Axes want = {s->nax[d], {0}};
	memcpy(want.ax, s->ax[d], want.n);
	for (int u = pp->group_next[v]; u >= 0 && u != v; u = pp->group_next[u])
		if (extend_dim(pp, u, d, &want, (Origin){v, -1, 0, d, (uint8_t)pp->round}))
			enqueue_neighbours(pp, u);
}

/* The price of resharding a tensor of `bytes` off the axes a: an
 * all_to_all of its shard over them on the mesh's hardware profile
 * (cost_model/; tpu-v3 when the mesh names none).  Monotone in the bytes. */
static double reshard_price(const Prop *pp, int64_t bytes, const Axes *a)
{
	unsigned key = (unsigned)a->n;
	for (int k = 0; k < a->n; k++)
		key = key << 3 | (unsigned)a->ax[k];
	int64_t b1 = bytes + 1; /* the price depends on the bytes: tensors of a size share it */
	struct PriceSlot *slot = &pp->prices[((uint64_t)b1 * 0x9e3779b97f4a7c15u >> 40 ^ key * 40503u) % PRICE_SLOTS];
	if (slot->bytes1 == b1 && slot->axes == key)
		return slot->price;
	int ax[MESH_MAX_AXES];
	for (int k = 0; k < a->n; k++)
		ax[k] = a->ax[k];
	double n = 1;
	for (int k = 0; k < a->n; k++)
		n *= pp->g->mesh.size[a->ax[k]];
	double local = (double)bytes / n;
	double price = cost_collective_seconds(&pp->hw, &pp->g->mesh, RS_ALL_TO_ALL, ax, a->n, local, NULL, 0) +
	               (double)bytes * 1e-30; /* equal prices: the larger tensor */
	*slot = (struct PriceSlot){b1, key, price};
	return price;
}

/* Remember that a reshape could keep a split if axis cut.axis were cut
 * (the first such cut of each axis). */
static void want_cut(Prop *pp, FactorCut cut)
{
	for (int i = 0; i < pp->ncuts; i++)
		if (pp->cuts[i].axis == cut.axis)
			return;
	if (pp->ncuts < MESH_MAX_AXES)
		pp->cuts[pp->ncuts++] = cut;
}

/* Gather the candidates for every factor from every tensor of the op. */
static void collect(Prop *pp, const Op *op, const FactorRule *r, Cand best[], bool have[], int id)
{
	const Graph *g = pp->g;
	for (int t = 0; t < rule_tensors(r); t++) {
		int v = value_of(op, r, t);
		const Value *val = &g->values.a[v];
		for (int d = 0; d < val->shape.rank; d++) {
			if (!val->spec.nax[d]) /* a whole dim offers no factor an axis */
				continue;
			Axes fa[MAX_FACTORS]; /* only the dim's factors are read */
			FactorCut cut = {0, 0};
			for (int i = 0; i < r->nfd[t][d]; i++)
				fa[r->fd[t][d][i]].n = 0;
			factor_project_dim_cut(&g->mesh, r, t, d, &val->spec, fa, &cut);
			if (cut.at)
				want_cut(pp, cut);
			for (int i = 0; i < r->nfd[t][d]; i++) {
				int f = r->fd[t][d][i];
				if (!fa[f].n || r->kind[f] == FK_REPLICATE)
					continue;
				int64_t bytes = value_bytes(val);
				Cand c = {fa[f], v, d, bytes, reshard_price(pp, bytes, &fa[f]),
				          (pp->p->closed[v] >> d & 1) != 0};
				if (!have[f] || better(&c, &best[f])) {
					if (have[f] && !is_prefix(&best[f].axes, &c.axes))
						record_conflict(pp, id, &c, &best[f], r->name[f]);
					best[f] = c, have[f] = true;
				} else if (!is_prefix(&c.axes, &best[f].axes)) {
					record_conflict(pp, id, &best[f], &c, r->name[f]);
				}
			}
		}
	}
}

/* Do factors f and g hold dims of one tensor of the rule? */
static bool share_tensor(const FactorRule *r, int f, int g)
{
	for (int t = 0; t < rule_tensors(r); t++) {
		bool hf = false, hg = false;
		for (int d = 0; d < MAX_RANK; d++)
			for (int i = 0; i < r->nfd[t][d]; i++)
				hf |= r->fd[t][d][i] == f, hg |= r->fd[t][d][i] == g;
		if (hf && hg)
			return true;
	}
	return false;
}

/* Two factors of one tensor cannot take the same mesh axis: the factor
 * whose candidate loses by the conflict rule (step 2) keeps only its axes
 * before the shared one.  Else the dim met first would take the axis. */
static void settle_clashes(const FactorRule *r, const Cand *best, const bool *have, Axes *chosen)
{
	for (int f = 0; f < r->nf; f++)
		for (int g = f + 1; g < r->nf; g++) {
			if (!have[f] || !have[g] || !chosen[f].n || !chosen[g].n || !share_tensor(r, f, g))
				continue;
			int lose = better(&best[g], &best[f]) ? f : g, win = lose == f ? g : f;
			for (int k = 0; k < chosen[lose].n; k++) {
				bool clash = false;
				for (int j = 0; j < chosen[win].n; j++)
					clash |= chosen[win].ax[j] == chosen[lose].ax[k];
				if (clash) {
					chosen[lose].n = k;
					break;
				}
			}
		}
}

/* One propagation step on op `id` (steps 1 to 4). */
static void step(Prop *pp, int id)
{
	const Op *op = &pp->g->ops.a[id];
	if (!pp->rule_state[id])
		pp->rule_state[id] = (pp->rule[id] = factor_rule_memo(pp->memo, pp->g, op, &pp->rules[id])) ? 1 : -1;
	if (pp->rule_state[id] < 0)
		return;
	const FactorRule *r = pp->rule[id];
	Cand best[MAX_FACTORS];
	bool have[MAX_FACTORS] = {0};
	collect(pp, op, r, best, have, id);
	Axes chosen[MAX_FACTORS];
	bool any = false;
	for (int f = 0; f < r->nf; f++) {
		chosen[f].n = 0;
		if (have[f])
			chosen[f] = best[f].axes, any = true;
	}
	if (!any) /* no tensor of the op is split: nothing to extend */
		return;
	settle_clashes(r, best, have, chosen);
	for (int t = 0; t < rule_tensors(r); t++) {
		int v = value_of(op, r, t);
		for (int d = 0; d < pp->g->values.a[v].shape.rank; d++) {
			if (!r->nfd[t][d])
				continue;
			Axes want;
			dim_axes(pp->g, r, t, d, chosen, &want);
			if (!want.n)
				continue;
			int f = r->fd[t][d][0];
			Origin o = {have[f] ? best[f].value : -1, id, r->name[f], have[f] ? best[f].dim : 0,
			            (uint8_t)pp->round};
			if (extend_dim(pp, v, d, &want, o))
				spread(pp, v, d);
		}
	}
}

static void build_uses(Prop *pp)
{
	const Graph *g = pp->g;
	pp->use_start = xcalloc((size_t)g->values.n + 1, sizeof(int));
	int total = 0;
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++)
			pp->use_start[g->ops.a[i].in[k] + 1]++, total++;
	for (int v = 0; v < g->values.n; v++)
		pp->use_start[v + 1] += pp->use_start[v];
	pp->use_op = xmalloc(sizeof(int) * (size_t)(total + 1));
	int *fill = xcalloc((size_t)g->values.n + 1, sizeof(int));
	for (int j = 0; j < g->ops.n; j++) {
		int i = pp->order[j];
		for (int k = 0; k < g->ops.a[i].nin; k++) {
			int v = g->ops.a[i].in[k];
			pp->use_op[pp->use_start[v] + fill[v]++] = i;
		}
	}
	free(fill);
}

typedef struct {
	uint64_t head; /* the name's first 8 bytes, big-endian, zero-padded: compares as strcmp does */
	const char *name;
	int op;
} Named;

static int by_name(const void *a, const void *b)
{
	const Named *x = a, *y = b;
	if (x->head != y->head)
		return x->head < y->head ? -1 : 1;
	int c = (x->head & 0xff) ? strcmp(x->name + 8, y->name + 8) : 0; /* a NUL among the 8: equal */
	return c ? c : (x->op > y->op) - (x->op < y->op);
}

static Named named(const Graph *g, int i)
{
	const char *s = g->values.a[g->ops.a[i].out].name;
	uint64_t h = 0;
	int k = 0;
	for (; k < 8 && s[k]; k++)
		h = h << 8 | (unsigned char)s[k];
	return (Named){k ? h << 8 * (8 - k) : 0, s, i};
}

/* The op ids ordered by their results' names (unique in a model).  The
 * order g remembers (of its ops' results: a pass may move ops, renames
 * some and adds more) is taken where it still holds: the results still
 * made by an op and in order with both neighbours are kept, the rest
 * sorted and merged in. */
static int *ops_by_name(const Graph *g)
{
	int n = g->ops.n, n0 = g->name_order ? g->name_order_n : 0, kept = 0, nrest = 0, m = 0;
	Named *a = xmalloc(sizeof *a * ((size_t)n0 + 1)), *rest = xmalloc(sizeof *rest * ((size_t)n + 1));
	uint8_t *in = xcalloc((size_t)n + 1, 1);
	for (int i = 0; i < n0; i++) {
		int v = g->name_order[i], op = v < g->values.n ? g->values.a[v].producer : -1;
		if (op >= 0 && op < n && g->ops.a[op].out == v)
			a[m++] = named(g, op);
	}
	for (int i = 0; i < m; i++)
		if ((!kept || by_name(&a[kept - 1], &a[i]) < 0) && (i + 1 == m || by_name(&a[i], &a[i + 1]) < 0))
			a[kept++] = a[i], in[a[i].op] = 1;
	for (int i = 0; i < n; i++)
		if (!in[i])
			rest[nrest++] = named(g, i);
	qsort(rest, (size_t)nrest, sizeof *rest, by_name);
	int *order = xmalloc(sizeof(int) * ((size_t)n + 1));
	for (int i = 0, j = 0, k = 0; k < n; k++)
		order[k] = j == nrest || (i < kept && by_name(&a[i], &rest[j]) < 0) ? a[i++].op : rest[j++].op;
	free(a), free(rest), free(in);
	return order;
}

/* A training step's forward pass first: the ops the loss depends on, then
 * the rest (the backward pass and the update), each part in name order.
 * In name order alone the backward's temporaries (%g..., d%...) sort
 * before the model's names and acted first on the open dims they share
 * with the forward values: a gelu result read by a Megatron matmul took
 * the sequence split of its gradient's reshard instead of the hidden
 * split of its own operand.  The forward pass is what the annotations
 * describe; the backward follows it, as it does in program order. */
static void forward_first(const Graph *g, int *order)
{
	const Train *t = g->train;
	if (!t || !t->built || t->loss < 0)
		return;
	int n = g->ops.n, top = 0;
	uint8_t *fwd = xcalloc((size_t)n + 1, 1);
	int *stack = xmalloc(sizeof(int) * ((size_t)n + 1));
	int p = g->values.a[t->loss].producer;
	if (p >= 0)
		fwd[p] = 1, stack[top++] = p;
	while (top > 0) {
		const Op *op = &g->ops.a[stack[--top]];
		for (int k = 0; k < op->nin; k++) {
			int q = g->values.a[op->in[k]].producer;
			if (q >= 0 && !fwd[q])
				fwd[q] = 1, stack[top++] = q;
		}
	}
	int *out = stack, m = 0;
	for (int pass = 1; pass >= 0; pass--)
		for (int i = 0; i < n; i++)
			if (fwd[order[i]] == pass)
				out[m++] = order[i];
	memcpy(order, out, sizeof(int) * (size_t)n);
	free(stack), free(fwd);
}

void propagate_remember_order(Graph *g)
{
	int *order = ops_by_name(g), *v = arena_alloc(&g->arena, sizeof(int) * ((size_t)g->ops.n + 1));
	for (int i = 0; i < g->ops.n; i++)
		v[i] = g->ops.a[order[i]].out;
	free(order);
	g->name_order = v, g->name_order_n = g->ops.n;
}

static void init_values(Prop *pp)
{
	Graph *g = pp->g;
	Propagation *p = pp->p;
	for (int v = 0; v < g->values.n; v++) {
		Value *val = &g->values.a[v];
		pp->group_next[v] = -1;
		for (int d = 0; d < MAX_RANK; d++)
			p->origin[v][d] = (Origin){-1, -1, 0, d, 0};
		if (!val->has_spec) {
			memset(&val->spec, 0, sizeof val->spec);
			val->spec.rank = (uint8_t)val->shape.rank;
			continue;
		}
		p->closed[v] = (uint8_t)(((1u << val->shape.rank) - 1) & ~val->spec.open);
		val->spec.open = 0;
		pp->prio[v] = val->priority;
		if (val->spec.partial && val->producer < 0) {
			diag_error(pp->d, val->spec_pos, "expected a sharding without partial axes for %s '%s' (a pending "
			           "sum is a property of op results), found partial axes", val->kind == VK_PARAM ? "param" :
			           "input", val->name);
			pp->nerr++;
		}
	}
}

/* ---- sharding groups ---- */

/* u's annotation against the group's (that of a): the same dims, closed
 * alike, at the same priority.  0, or 1 after reporting at u's. */
static int check_member_annotation(Prop *pp, int a, int u)
{
	const Graph *g = pp->g;
	const Value *va = &g->values.a[a], *vu = &g->values.a[u];
	char sa[256], su[256], at[256];
	snprintf(at, sizeof at, "%s:%d:%d", va->spec_pos.file ? va->spec_pos.file : "?", va->spec_pos.line,
	         va->spec_pos.col);
	if (va->priority != vu->priority) {
		diag_error(pp->d, vu->spec_pos, "expected priority %d, that of '%s' in sharding group '%s' (annotated at %s), "
		           "found priority %d", va->priority, va->name, va->shard_as, at, vu->priority);
		return 1;
	}
	if (spec_eq(&va->spec, &vu->spec) && pp->p->closed[a] == pp->p->closed[u])
		return 0;
	spec_format(&va->spec, &g->mesh, sa, sizeof sa);
	spec_format(&vu->spec, &g->mesh, su, sizeof su);
	diag_error(pp->d, vu->spec_pos, "expected the sharding of '%s' in sharding group '%s', %s%s (annotated at %s), "
	           "found %s%s", va->name, va->shard_as, sa, pp->p->closed[a] == ((1u << va->shape.rank) - 1) ? "" :
	           " with open dims", at, su, pp->p->closed[u] == ((1u << vu->shape.rank) - 1) ? "" : " with open dims");
	return 1;
}

/* Unannotated member v of a group takes the annotation of member a. */
static void take_annotation(Prop *pp, int v, int a)
{
	pp->g->values.a[v].spec = pp->g->values.a[a].spec;
	pp->p->closed[v] = pp->p->closed[a], pp->prio[v] = pp->prio[a];
	for (int d = 0; d < MAX_RANK; d++)
		pp->p->origin[v][d] = (Origin){a, -1, 0, d, pp->prio[a]};
}

/* Link the members m[0..n) of one group (by name) into a cycle (those
 * whose shape is that of the member defined first) and give every member
 * the group's annotation: that of the annotated member defined first (value
 * ids are in the file's order), against which the others are checked.
 * Errors. */
static int init_group(Prop *pp, const int *m, int n)
{
	Graph *g = pp->g;
	int first = m[0], ann = -1, nerr = 0;
	for (int i = 1; i < n; i++)
		first = m[i] < first ? m[i] : first;
	const Value *vf = &g->values.a[first];
	int last = -1, head = -1;
	for (int i = 0; i < n; i++) {
		Value *vu = &g->values.a[m[i]];
		if (!shape_eq(&vu->shape, &vf->shape)) {
			char a[128], b[128];
			shape_format(&vf->shape, a, sizeof a);
			shape_format(&vu->shape, b, sizeof b);
			diag_error(pp->d, vu->shard_as_pos, "expected the shape of '%s' in sharding group '%s', %s, found %s",
			           vf->name, vf->shard_as, a, b);
			nerr++;
			continue;
		}
		if (vu->has_spec && (ann < 0 || m[i] < ann))
			ann = m[i];
		if (last >= 0)
			pp->group_next[last] = m[i];
		else
			head = m[i];
		last = m[i];
	}
	pp->group_next[last] = head;
	int v = head;
	do {
		if (ann >= 0 && v != ann && g->values.a[v].has_spec)
			nerr += check_member_annotation(pp, ann, v);
		else if (ann >= 0 && !g->values.a[v].has_spec)
			take_annotation(pp, v, ann);
		v = pp->group_next[v];
	} while (v != head);
	return nerr;
}

typedef struct {
	const char *group, *name;
	int v;
} Member;

/* By group, then by the value's name (unique): the order of a group's
 * cycle, and so of spread, is the graph's, not the file's. */
static int by_group(const void *a, const void *b)
{
	const Member *x = a, *y = b;
	int c = strcmp(x->group, y->group);
	return c ? c : strcmp(x->name, y->name);
}

/* Every sharding group (values sharing a shard_as name), checked and
 * linked.  The count of errors. */
static int init_groups(Prop *pp)
{
	const Graph *g = pp->g;
	Member *m = xmalloc(sizeof *m * ((size_t)g->values.n + 1));
	int n = 0, nerr = 0;
	for (int v = 0; v < g->values.n; v++)
		if (g->values.a[v].shard_as)
			m[n++] = (Member){g->values.a[v].shard_as, g->values.a[v].name, v};
	qsort(m, (size_t)n, sizeof *m, by_group);
	int *ids = xmalloc(sizeof(int) * ((size_t)n + 1));
	for (int i = 0, j; i < n; i = j) {
		for (j = i; j < n && !strcmp(m[j].group, m[i].group); j++)
			ids[j - i] = m[j].v;
		nerr += init_group(pp, ids, j - i);
	}
	free(ids);
	free(m);
	return nerr;
}

/* The pending reduction op yields when a dim it reduces over is split:
 * REDUCE_SUM or REDUCE_MAX (reduce_max); a sum for a gather factor (take)
 * and for the ops linear in their operands (add, sub, neg, mul, div), which
 * pass sums through; -2 for copy and cast, which pass either through; -1
 * when it yields none. */
static int yielded_reduction(const Graph *g, const Op *op)
{
	FactorRule r;
	if (factor_rule(g, op, &r) == 0)
		for (int f = 0; f < r.nf; f++)
			if (r.kind[f] == FK_REDUCE || r.kind[f] == FK_GATHER)
				return r.kind[f] == FK_REDUCE ? r.reduce[f] : REDUCE_SUM;
	switch (op->kind) {
	case OP_ADD: case OP_SUB: case OP_NEG: case OP_MUL: case OP_DIV: return REDUCE_SUM;
	case OP_COPY: case OP_CAST: return -2;
	default: return -1;
	}
}

/* A result annotated as a pending reduction needs an op that yields one of
 * that kind: one that reduces over something (a reduction factor) or
 * passes sums through (an op linear in its operands).  Reported at the
 * annotation (so every command refuses it alike); the count of errors. */
static int check_partial_results(const Graph *g, Diag *d)
{
	static const char *const kind[] = {[REDUCE_SUM] = "sum", [REDUCE_MAX] = "max"};
	int nerr = 0;
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		const Value *out = &g->values.a[op->out];
		if (!out->has_spec || !out->spec.partial || !out->spec_pos.line)
			continue;
		int y = yielded_reduction(g, op);
		if (y == -1) {
			diag_error(d, out->spec_pos, "expected a sharding %s can produce, found partial axes but it sums over "
			           "nothing", op_table[op->kind].name);
			nerr++;
		} else if (y >= 0 && y != out->spec.reduce) {
			diag_error(d, out->spec_pos, "expected a pending %s, as %s yields, found partial axes with reduce: %s",
			           kind[y], op_table[op->kind].name, kind[out->spec.reduce]);
			nerr++;
		}
	}
	return nerr;
}

/* Run the work list to the fixed point. */
static long drain(Prop *pp)
{
	long steps = 0;
	while (pp->head != pp->tail) {
		int op = pp->queue[pp->head];
		pp->head = (pp->head + 1) % pp->cap;
		pp->queued[op] = 0;
		step(pp, op);
		steps++;
	}
	return steps;
}

/* Round pp->round begins for value v: its annotation is set, its open dims
 * open, and its neighbours enqueued. */
static void activate(Prop *pp, int v)
{
	Value *val = &pp->g->values.a[v];
	val->spec = pp->pending[v];
	pp->p->closed[v] = (uint8_t)(((1u << val->shape.rank) - 1) & ~pp->pending[v].open);
	val->spec.open = 0;
	for (int d = 0; d < val->shape.rank; d++)
		pp->p->origin[v][d] = (Origin){-1, -1, 0, d, (uint8_t)pp->round};
	enqueue_neighbours(pp, v);
}

typedef struct {
	int prio;
	const char *name;
	int v;
} Later;

/* By round, then by name: a round enqueues its values' neighbours in the
 * graph's order, not the file's. */
static int by_round(const void *a, const void *b)
{
	const Later *x = a, *y = b;
	return x->prio != y->prio ? x->prio - y->prio : strcmp(x->name, y->name);
}

/* Values annotated with a priority k > 0 wait, closed and unsplit, for
 * round k: their annotations move to pp->pending.  Their ids by (k, name)
 * into *later; their count. */
static int defer_priorities(Prop *pp, int **later)
{
	Graph *g = pp->g;
	int n = 0;
	*later = xmalloc(sizeof(int) * ((size_t)g->values.n + 1));
	for (int v = 0; v < g->values.n; v++) {
		if (!pp->prio[v])
			continue;
		Value *val = &g->values.a[v];
		pp->pending[v] = val->spec;
		pp->pending[v].open = (uint8_t)(((1u << val->shape.rank) - 1) & ~pp->p->closed[v]);
		memset(&val->spec, 0, sizeof val->spec);
		val->spec.rank = (uint8_t)val->shape.rank;
		pp->p->closed[v] = (uint8_t)((1u << val->shape.rank) - 1);
		(*later)[n++] = v;
	}
	Later *l = xmalloc(sizeof *l * ((size_t)n + 1));
	for (int i = 0; i < n; i++)
		l[i] = (Later){pp->prio[(*later)[i]], g->values.a[(*later)[i]].name, (*later)[i]};
	qsort(l, (size_t)n, sizeof *l, by_round);
	for (int i = 0; i < n; i++)
		(*later)[i] = l[i].v;
	free(l);
	return n;
}

/* One propagation over g's mesh as it is; the cuts of its axes that would
 * let reshapes keep more splits into cuts[0..*ncuts). */
static int propagate_run(Graph *g, const HwProfile *hw, const FactorRules *memo, Propagation *p, Diag *d,
                         FactorCut *cuts, int *ncuts)
{
	memset(p, 0, sizeof *p);
	p->origin = xmalloc(sizeof *p->origin * ((size_t)g->values.n + 1)); /* init_values sets every one */
	p->closed = xcalloc((size_t)g->values.n + 1, 1);
	p->op_conflict = xmalloc(sizeof(int) * ((size_t)g->ops.n + 1));
	for (int i = 0; i < g->ops.n; i++)
		p->op_conflict[i] = -1;
	Prop pp = {.g = g, .p = p, .d = d, .cap = g->ops.n + 1, .memo = memo};
	if (hw)
		pp.hw = *hw;
	else
		hw_profile_builtin(&pp.hw, "tpu-v3");
	pp.queue = xmalloc(sizeof(int) * (size_t)pp.cap);
	pp.queued = xcalloc((size_t)pp.cap, 1);
	pp.prio = xcalloc((size_t)g->values.n + 1, 1);
	pp.pending = xmalloc(sizeof *pp.pending * ((size_t)g->values.n + 1)); /* set and read for deferred values only */
	pp.group_next = xmalloc(sizeof(int) * ((size_t)g->values.n + 1));
	pp.prices = xcalloc(PRICE_SLOTS, sizeof *pp.prices);
	pp.rules = xmalloc(sizeof *pp.rules * ((size_t)g->ops.n + 1));
	pp.rule = xmalloc(sizeof *pp.rule * ((size_t)g->ops.n + 1));
	pp.rule_state = xcalloc((size_t)g->ops.n + 1, 1);
	init_values(&pp);
	pp.nerr += init_groups(&pp);
	pp.nerr += check_partial_results(g, d);
	int *later, nlater = defer_priorities(&pp, &later);
	pp.order = ops_by_name(g);
	forward_first(g, pp.order);
	build_uses(&pp);
	for (int i = 0; i < g->ops.n; i++)
		enqueue(&pp, pp.order[i]);
	long steps = drain(&pp);
	for (int i = 0; i < nlater;) {
		pp.round = pp.prio[later[i]];
		for (; i < nlater && pp.prio[later[i]] == pp.round; i++)
			activate(&pp, later[i]);
		steps += drain(&pp);
	}
	p->max_priority = pp.round;
	p->rounds = (int)(steps / (g->ops.n ? g->ops.n : 1));
	for (int v = 0; v < g->values.n; v++)
		g->values.a[v].priority = 0;
	free(later), free(pp.prio), free(pp.pending), free(pp.group_next);
	free(pp.queue), free(pp.queued), free(pp.use_start), free(pp.use_op), free(pp.order), free(pp.prices);
	free(pp.rules), free(pp.rule), free(pp.rule_state);
	memcpy(cuts, pp.cuts, sizeof pp.cuts);
	*ncuts = pp.ncuts;
	return pp.nerr ? -1 : 0;
}

/* ---- sub-axes ----
 * A reshape that splits a dim split over an axis the new major dim does
 * not divide ([32] over model = 8 into [4, 8]) keeps the split only if the
 * axis is cut in pieces (model:(1)4 on the 4, model:(4)2 on the 8).  The
 * mesh starts with the cuts the model names; a run that finds a reshape
 * wanting another cuts the mesh and runs again from the annotations, now
 * on the pieces.  Each run adds an axis, so there are at most
 * MESH_MAX_AXES runs; when the mesh cannot take another axis, or a
 * pipeline names its stage axis by id, the split is dropped as before. */

typedef struct {
	Spec spec;
	uint8_t priority;
} Saved;

static int by_axis_down(const void *a, const void *b)
{
	return ((const FactorCut *)b)->axis - ((const FactorCut *)a)->axis;
}

/* Cut g's mesh (the largest axis id first: the cuts before it keep their
 * ids) and carry the annotations and the logical axes over to the pieces.
 * True if the mesh changed. */
static bool cut_mesh(Graph *g, Saved *saved, FactorCut *cuts, int n)
{
	Mesh m = g->mesh;
	bool changed = false;
	qsort(cuts, (size_t)n, sizeof *cuts, by_axis_down);
	for (int i = 0; i < n; i++)
		changed |= mesh_cut(&m, &g->arena, cuts[i].axis, cuts[i].at) == 0;
	if (!changed)
		return false;
	for (int v = 0; v < g->values.n; v++)
		spec_remap(&saved[v].spec, &g->mesh, &m);
	for (int i = 0; i < g->rules.n; i++) {
		AxisRule *r = &g->rules.a[i];
		uint8_t ax[MESH_MAX_AXES];
		int k = 0;
		for (int j = 0; j < r->n; j++)
			k += mesh_pieces(&m, &g->mesh, r->axes[j], ax + k);
		memcpy(r->axes, ax, (size_t)k);
		r->n = (uint8_t)k;
	}
	g->mesh = m;
	return true;
}

int propagate(Graph *g, const HwProfile *hw, Propagation *p, Diag *d)
{
	return propagate_shared(g, hw, NULL, p, d);
}

int propagate_shared(Graph *g, const HwProfile *hw, const FactorRules *rules, Propagation *p, Diag *d)
{
	Saved *saved = xmalloc(sizeof *saved * ((size_t)g->values.n + 1));
	for (int v = 0; v < g->values.n; v++)
		saved[v] = (Saved){g->values.a[v].spec, g->values.a[v].priority};
	int rc;
	for (;;) {
		FactorCut cuts[MESH_MAX_AXES];
		int n = 0;
		rc = propagate_run(g, hw, rules, p, d, cuts, &n);
		if (rc != 0 || n == 0 || g->pipeline || !cut_mesh(g, saved, cuts, n))
			break;
		propagation_free(p);
		for (int v = 0; v < g->values.n; v++)
			g->values.a[v].spec = saved[v].spec, g->values.a[v].priority = saved[v].priority;
	}
	free(saved);
	return rc;
}

void propagation_free(Propagation *p)
{
	free(p->origin);
	free(p->closed);
	free(p->op_conflict);
	vec_free(&p->conflicts);
}
