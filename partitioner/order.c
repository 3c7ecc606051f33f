/* order.c: a partitioned training step's weight update moved into its
 * backward pass, where the cost model expects its gradients.
 *
 * The step as built runs the forward pass, the backward pass (each
 * gradient's reduction issued where the gradient is made) and then, for
 * every param, its update and its weight gather.  On a device whose
 * collectives overlap compute, the gathers after the backward pass then
 * overlap only the next step's forward pass, and the ones its first ops
 * need stall it.  A gradient made early in the backward pass (the last
 * layers', the output projection's) is reduced long before the pass ends:
 * its update can run then, and its gather overlap the rest of the pass.
 *
 * The tail (the ops after the last forward or backward op) is placed op by
 * op, in one walk each way.  An op that reads a value of the backward pass
 * (or of an op placed so) is "anchored": it goes just before the first
 * backward compute op that the steady-state schedule starts after its
 * operands are ready (a collective's result when the collective ends), and
 * not before any op it reads.  The others (an optimizer state scaled by a
 * constant, the bias correction from the step count, a param's local
 * slice) go just before their first reader.  Ops keep their order where
 * they land together, so the result is a valid program: each op after the
 * ops it reads.  The cost model prices the new order, and it is kept when
 * 0.1% faster or more with a peak at most 1% larger (updates in the
 * backward pass hold their temporaries and gathered weights while
 * activations are still held).  Once kept, what stayed in the tail is
 * placed again by the moved step's schedule, at most ROUNDS times.
 *
 * Placed as early as they can run, the updates hold back the backward
 * ops after them: where the moved step's compute stream then waits for a
 * gradient's collective (the embedding's gradient waits for the gather of
 * its input's gradient, at the end of the pass), updates placed before
 * the op making that collective's operand are moved again, to just before
 * the op that waits, as many as its wait holds (fill_wait): kept on the
 * same terms, at most FILLS times.
 *
 * Then the collectives the step waits for whose operands ops make are
 * issued sooner, with those ops (hoist_order): priced once more, kept on
 * the same terms.  Issued sooner, they can hold the links a gradient's
 * reduction needs, and an update placed where that reduction was to end
 * waits for it: last, such updates go after the ops that fill their waits,
 * with the tail ops reading them (delay_waits), priced and kept so. */
#include "order.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../spmd/ops.h"
#include "../spmd/train_section.h"
#include "step.h"

/* Permute prog's ops into order[0..n) and point the values at their new producers. */
static void permute(Graph *prog, const int *order) { graph_order_ops(prog, order, prog->ops.n); }

/* Does order[0..n) put every op of prog after the ops it reads? */
static bool topological(const Graph *prog, const int *order)
{
	int n = prog->ops.n, *pos = xmalloc(sizeof(int) * ((size_t)n + 1));
	for (int i = 0; i < n; i++)
		pos[order[i]] = i;
	bool ok = true;
	for (int j = 0; j < n && ok; j++)
		for (int k = 0; k < prog->ops.a[j].nin && ok; k++) {
			int p = prog->values.a[prog->ops.a[j].in[k]].producer;
			ok = p < 0 || pos[p] < pos[j];
		}
	free(pos);
	return ok;
}

/* The first of the ns head compute ops slot[] (in program order, so by
 * start) that starts at or after t and comes after op low: two binary
 * searches. */
static int first_slot(const int *slot, int ns, const CostEstimate *e, double t, int low)
{
	int a = 0, b = ns, c = 0, d = ns;
	while (a < b) {
		int mid = (a + b) / 2;
		if (e->op[slot[mid]].start < t)
			a = mid + 1;
		else
			b = mid;
	}
	while (c < d) {
		int mid = (c + d) / 2;
		if (slot[mid] <= low)
			c = mid + 1;
		else
			d = mid;
	}
	return a > c ? a : c;
}

/* The new order of prog's ops into order (n entries); false when it is
 * the old one.  rep gets the counts of what moved: the ops that make a
 * value marked 1 in mark (a param's new weight) and 2 (its gradient,
 * reduced). */
static bool new_order(const Graph *prog, const CostEstimate *e, double slack, const uint8_t *mark, int *order,
                      OrderReport *rep)
{
	int n = prog->ops.n, nv = prog->values.n, head = -1;
	for (int i = 0; i < n; i++) /* the last op computing for the forward or backward pass */
		if ((e->op[i].phase == PHASE_FORWARD || e->op[i].phase == PHASE_BACKWARD) && !e->op[i].comm &&
		    !(op_table[prog->ops.a[i].kind].flags & OPF_MOVE))
			head = i;
	if (head < 0 || head >= n - 1)
		return false;
	/* per value: when it is ready (the steady step's clock) and the key of the tail op making it */
	double *ready = xcalloc((size_t)nv + 1, sizeof *ready);
	int *key = xmalloc(sizeof(int) * ((size_t)n + 1));
	bool *anchored = xcalloc((size_t)n + 1, sizeof *anchored);
	for (int i = 0; i <= head; i++)
		ready[prog->ops.a[i].out] = e->op[i].end + (e->op[i].comm ? slack : 0);
	/* the head's compute ops, by start: the places an anchored op can go */
	int *slot = xmalloc(sizeof(int) * ((size_t)head + 2)), ns = 0;
	for (int i = 0; i <= head; i++)
		if (!e->op[i].comm)
			slot[ns++] = i;
	for (int i = head + 1; i < n; i++) {
		const Op *op = &prog->ops.a[i];
		double t = 0;
		int low = 0;
		for (int k = 0; k < op->nin; k++) {
			int p = prog->values.a[op->in[k]].producer;
			if (p < 0)
				continue;
			if (p <= head || anchored[p]) { /* the others go before their first reader: after low */
				anchored[i] = true;
				t = fmax(t, ready[op->in[k]]);
				int at = p <= head ? p : key[p];
				low = at > low ? at : low;
			}
		}
		key[i] = head;
		if (!anchored[i])
			continue;
		/* a collective ends no sooner than it did where it was (the stream may be busy) */
		ready[op->out] = e->op[i].comm ? fmax(t + e->op[i].seconds, e->op[i].end) + slack : t;
		/* the first head compute op after `low` that starts at or after t
		 * (compute ops start in program order): go before it */
		int lo = first_slot(slot, ns, e, t, low);
		key[i] = lo < ns ? slot[lo] - 1 : head;
		key[i] = key[i] > low ? key[i] : low;
	}
	/* the others: just before their first reader in the tail (the end when only the next step reads them) */
	int *first = xmalloc(sizeof(int) * ((size_t)nv + 1));
	for (int v = 0; v < nv; v++)
		first[v] = head;
	for (int i = n - 1; i > head; i--) {
		const Op *op = &prog->ops.a[i];
		if (!anchored[i])
			key[i] = first[op->out];
		for (int k = 0; k < op->nin; k++)
			first[op->in[k]] = key[i] < first[op->in[k]] ? key[i] : first[op->in[k]];
	}
	/* head op p, then the tail ops keyed p in their old order */
	int *count = xcalloc((size_t)head + 2, sizeof *count), m = 0;
	bool moved = false;
	for (int i = head + 1; i < n; i++) {
		count[key[i]]++, moved |= key[i] < head;
		rep->moved += key[i] < head && mark[prog->ops.a[i].out] == 1;
		rep->grads += key[i] < head && mark[prog->ops.a[i].out] == 2;
		rep->ops += key[i] < head;
	}
	if (moved) {
		int *start = xmalloc(sizeof(int) * ((size_t)head + 2)), *fill = xcalloc((size_t)head + 2, sizeof *fill);
		for (int p = 0, at = 0; p <= head; p++)
			start[p] = at, at += count[p];
		int *tail = xmalloc(sizeof(int) * ((size_t)(n - head) + 1));
		for (int i = head + 1; i < n; i++)
			tail[start[key[i]] + fill[key[i]]++] = i;
		for (int p = 0, t = 0; p <= head; p++) {
			order[m++] = p;
			for (int c = 0; c < count[p]; c++)
				order[m++] = tail[t++];
		}
		free(start), free(fill), free(tail);
		if (!topological(prog, order)) { /* the keys keep every op after what it reads: never so */
#if SPMD_VERIFY_PARTITION
			fprintf(stderr, "spmd: internal: the step's order would move an op before one it reads\n");
			abort();
#endif
			moved = false;
		}
	}
	free(ready), free(key), free(anchored), free(slot), free(first), free(count);
	return moved;
}

/* Wait w of the moved step filled (into order; false: nothing to move).
 * Where a forward or backward op w waits for a collective whose operand
 * a backward op p makes, the updates and gathers the rounds placed before
 * p hold p back: moved to just before w, they run while the collective is
 * in flight, and p, its collective and w come sooner.  From w back, an
 * update or gather op is moved when every op that reads it before w is
 * moved too (so each op stays after what it reads), and those before p
 * as long as their compute fits in the wait.  A wait for a collective of
 * a leaf (a weight gathered before use) has no such p. */
static bool fill_wait(const Graph *prog, const CostEstimate *e, int w, int *order, int *nfill)
{
	int n = prog->ops.n;
	const Op *c = &prog->ops.a[e->op[w].wait_on];
	int p = c->nin ? prog->values.a[c->in[0]].producer : -1;
	while (p >= 0 && (op_table[prog->ops.a[p].kind].flags & OPF_MOVE) && !e->op[p].comm)
		p = prog->values.a[prog->ops.a[p].in[0]].producer; /* through reshapes: the op computing it */
	if (p < 0 || p >= w || e->op[p].comm)
		return false;
	bool *sel = xcalloc((size_t)n + 1, sizeof *sel), *blocked = xcalloc((size_t)prog->values.n + 1, sizeof *blocked);
	for (int k = 0; k < prog->ops.a[w].nin; k++)
		blocked[prog->ops.a[w].in[k]] = true;
	double fill = 0, room = e->op[w].wait;
	int m = 0;
	for (int i = w - 1; i >= 0; i--) {
		const Op *op = &prog->ops.a[i];
		int ph = e->op[i].phase;
		double sec = e->op[i].comm ? 0 : e->op[i].seconds;
		sel[i] = (ph == PHASE_UPDATE || ph == PHASE_GATHER) && !blocked[op->out] && (i > p || fill + sec <= room);
		if (sel[i] && i < p)
			fill += sec;
		m += sel[i];
		for (int k = 0; !sel[i] && k < op->nin; k++)
			blocked[op->in[k]] = true;
	}
	if (fill > 0) {
		int j = 0;
		for (int i = 0; i < n; i++) {
			if (i == w)
				for (int k = 0; k < w; k++)
					if (sel[k])
						order[j++] = k;
			if (!sel[i])
				order[j++] = i;
		}
		*nfill = m;
	}
	free(sel), free(blocked);
	return fill > 0;
}

/* Is op i of the step's tail as priced by e: an update, a gather or a
 * gradient's reduction, or an op whose results only such ops read (the
 * copy of a reduced gradient the update reads)? */
static bool tail_op(const Graph *prog, const CostEstimate *e, const int *start, const int *list, int i)
{
	int ph = e->op[i].phase;
	if (ph == PHASE_UPDATE || ph == PHASE_GATHER || ph == PHASE_GRAD_SYNC)
		return true;
	int v = prog->ops.a[i].out;
	if (ph != PHASE_BACKWARD || start[v] == start[v + 1])
		return false;
	for (int k = start[v]; k < start[v + 1]; k++) {
		int r = e->op[list[k]].phase;
		if (r != PHASE_UPDATE && r != PHASE_GATHER && r != PHASE_GRAD_SYNC)
			return false;
	}
	return true;
}

/* The waits of the step's tail ops put off (into order; *nwaits: how
 * many, *ndelayed: the ops moved; false: none).  An update placed in the backward pass where
 * the schedule expected its gradient, whose compute stream then idles for
 * it (its reduction queued on the links behind a collective issued
 * sooner, say by hoist_order), goes instead after the ops that fill the
 * wait, with the tail ops that read it: the compute stream runs those
 * while the reduction ends.  One walk: a waiting tail op opens a group
 * with its wait to fill; a tail op reading a group joins it (the groups it
 * reads merge); any other op reading a group puts the group out just
 * before it; every other op's compute counts against each open group's
 * wait, and a group whose wait is filled goes out after that op, its ops
 * in their order.  Each op moves at most once; linear in the program
 * times the groups open at once (a group's ops are found again between
 * its first op and where it goes out). */
static bool delay_waits(const Graph *prog, const CostEstimate *e, int *order, int *nwaits, int *ndelayed)
{
	int n = prog->ops.n, m = 0, ng = 0, nlive = 0, *start, *list;
	graph_readers(prog, &start, &list);
	int *grp = xmalloc(sizeof(int) * ((size_t)n + 1));   /* per op: its group (-1: none, or out) */
	int *gof = xmalloc(sizeof(int) * ((size_t)n + 1));   /* per group: the group it merged into (itself: its own) */
	int *first = xmalloc(sizeof(int) * ((size_t)n + 1)); /* per group: its first op */
	int *live = xmalloc(sizeof(int) * ((size_t)n + 1));  /* the open groups */
	double *need = xmalloc(sizeof(double) * ((size_t)n + 1)); /* per open group: the wait left to fill */
	*ndelayed = *nwaits = 0;
	for (int i = 0; i < n; i++) {
		const Op *op = &prog->ops.a[i];
		const OpEstimate *o = &e->op[i];
		int g = -1;
		grp[i] = -1;
		for (int k = 0; k < op->nin; k++) {
			int h = prog->values.a[op->in[k]].producer, x = h >= 0 ? grp[h] : -1;
			while (x >= 0 && gof[x] != x)
				x = gof[x];
			if (x < 0 || x == g)
				continue;
			if (g < 0) {
				g = x;
				continue;
			}
			gof[x] = g, need[g] = fmax(need[g], need[x]), first[g] = first[g] < first[x] ? first[g] : first[x];
			for (int l = 0; l < nlive; l++) /* x is g's now */
				if (live[l] == x)
					live[l] = live[--nlive];
		}
		bool tail = tail_op(prog, e, start, list, i);
		if (g >= 0 && tail) { /* joins */
			grp[i] = g;
			continue;
		}
		if (g < 0 && tail && !o->comm && o->wait > 0 && o->wait_on >= 0) { /* opens one */
			gof[ng] = ng, need[ng] = o->wait, first[ng] = i, live[nlive++] = ng, (*nwaits)++;
			grp[i] = ng++;
			continue;
		}
		if (g >= 0) /* read by another op: out before it */
			need[g] = 0;
		else
			order[m++] = i;
		for (int l = 0; l < nlive;) { /* i's compute fills the open waits; the filled go out */
			int x = live[l];
			if (g < 0 && !o->comm)
				need[x] -= o->seconds;
			if (need[x] > 0) {
				l++;
				continue;
			}
			for (int k = first[x]; k < i; k++) {
				int y = grp[k];
				while (y >= 0 && gof[y] != y)
					y = gof[y];
				if (y == x)
					order[m++] = k, grp[k] = -1, (*ndelayed)++;
			}
			live[l] = live[--nlive];
		}
		if (g >= 0)
			order[m++] = i;
	}
	for (int k = 0; k < n; k++) /* still open: at the end, in their order */
		if (grp[k] >= 0)
			order[m++] = k, (*ndelayed)++;
	free(start), free(list), free(grp), free(gof), free(first), free(live), free(need);
	return *ndelayed > 0 && m == n;
}

/* The longest wait of the moved step that fill_wait() can fill (order, *nfill), of the WAITS longest; false: none. */
enum { WAITS = 8 };
static bool fill_order(const Graph *prog, const CostEstimate *e, int *order, int *nfill)
{
	int top[WAITS], nt = 0;
	for (int i = 0; i < prog->ops.n; i++) {
		if (e->op[i].comm || e->op[i].wait_on < 0 || !(e->op[i].wait > 0) ||
		    (e->op[i].phase != PHASE_FORWARD && e->op[i].phase != PHASE_BACKWARD))
			continue;
		int j = nt < WAITS ? nt++ : WAITS;
		for (; j > 0 && e->op[top[j - 1]].wait < e->op[i].wait; j--)
			if (j < WAITS)
				top[j] = top[j - 1];
		if (j < WAITS)
			top[j] = i;
	}
	for (int k = 0; k < nt; k++)
		if (fill_wait(prog, e, top[k], order, nfill))
			return true;
	return false;
}

/* The waits of the step for a collective of the forward or backward
 * pass, hoisted (into order; false: none moved).  Where a forward or
 * backward op w waits for a collective C whose operand ops made from
 * values long ready (a norm made again in the backward from its kept
 * input, then gathered for the weight's gradient), C and the cheap ops
 * that make its operand (their compute at most the wait) move up, in
 * their order, past the ops before them that they do not read, until
 * those ops' compute covers the wait: C then runs while they do.  The walk back from C stops at an op the
 * moved ones read that cannot move (an op whose compute would take more
 * than the wait, a collective of a leaf's chain, an op of the tail), at
 * another collective the step waits for (the order of waits is kept) and
 * after HOIST_SPAN ops.  Only ops of the forward and backward passes
 * move: waits for a leaf's collective (a weight gathered before use: the
 * prefetch's) and for the tail's (a new weight's gather: new_order
 * placed it) are left alone.  Each op is moved at most once; the walks
 * cover at most HOIST_SPAN ops per wait: linear. */
enum { HOIST_SPAN = 256 };

static bool pass_phase(int ph) { return ph == PHASE_FORWARD || ph == PHASE_BACKWARD; }

static bool hoist_order(const Graph *prog, const CostEstimate *e, int *order, int *nhoist, int *nmoved)
{
	int n = prog->ops.n, nv = prog->values.n;
	int *pos = xmalloc(sizeof(int) * ((size_t)n + 1)), *tmp = xmalloc(sizeof(int) * ((size_t)HOIST_SPAN + 2));
	uint8_t *moved = xcalloc((size_t)n + 1, 1), *in_m = xcalloc((size_t)n + 1, 1), *waited = xcalloc((size_t)n + 1, 1);
	uint32_t *needed = xcalloc((size_t)nv + 1, sizeof *needed); /* the wait (1 + its index) whose moved ops read v */
	for (int i = 0; i < n; i++)
		order[i] = i, pos[i] = i;
	for (int i = 0; i < n; i++)
		if (!e->op[i].comm && e->op[i].wait_on >= 0 && e->op[i].wait > 0)
			waited[e->op[i].wait_on] = 1;
	int hoists = 0, mv = 0;
	for (int w = 0; w < n; w++) {
		const OpEstimate *ew = &e->op[w];
		if (ew->comm || ew->wait_on < 0 || !(ew->wait > 0) || !pass_phase(ew->phase))
			continue;
		int c = ew->wait_on;
		const Op *cop = &prog->ops.a[c];
		if (moved[c] || cop->nin == 0 || prog->values.a[cop->in[0]].producer < 0 || !pass_phase(e->op[c].phase))
			continue; /* a leaf's collective (the prefetch's), or a new weight's (the tail's order) */
		uint32_t tag = (uint32_t)w + 1;
		double room = ew->wait, fill = 0, chain = 0;
		int at = pos[c], q = at, span = 0, nm = 1;
		in_m[c] = 1;
		for (int k = 0; k < cop->nin; k++)
			needed[cop->in[k]] = tag;
		for (int j = at - 1; j >= 0 && span < HOIST_SPAN && fill < room; j--, span++) {
			int i = order[j];
			const Op *op = &prog->ops.a[i];
			double sec = e->op[i].comm ? 0 : e->op[i].seconds;
			if (needed[op->out] == tag) { /* the moved ops read it: it moves too, or they stop here */
				if (moved[i] || (e->op[i].comm && waited[i]) || chain + sec > room || !pass_phase(e->op[i].phase) ||
				    (e->op[i].comm && (op->nin == 0 || prog->values.a[op->in[0]].producer < 0)))
					break;
				chain += sec, in_m[i] = 1, nm++;
				for (int k = 0; k < op->nin; k++)
					needed[op->in[k]] = tag;
			} else if (e->op[i].comm && waited[i]) {
				break; /* the order of the collectives the step waits for stays */
			} else {
				fill += sec;
			}
			q = j;
		}
		if (fill > 0 && q < at) { /* order[q..at]: the moved ops first, then the rest, each in order */
			int m = 0;
			for (int j = q; j <= at; j++)
				if (in_m[order[j]])
					tmp[m++] = order[j];
			for (int j = q; j <= at; j++)
				if (!in_m[order[j]])
					tmp[m++] = order[j];
			for (int j = q; j <= at; j++)
				order[j] = tmp[j - q], pos[order[j]] = j, moved[order[j]] |= in_m[order[j]];
			hoists++, mv += nm;
		}
		for (int j = q; j <= at; j++)
			in_m[order[j]] = 0;
	}
	free(pos), free(tmp), free(moved), free(in_m), free(waited), free(needed);
	*nhoist = hoists, *nmoved = mv;
	return hoists > 0;
}

enum { ROUNDS = 2, FILLS = 3 };

/* prog in order (order[i] the op to be i-th), priced into next (st: its
 * phases, described again): kept when 0.1% faster than cur or more with
 * a peak at most 1% above peak (step_kept), else put back (the caller
 * frees next). */
static bool try_order(Graph *prog, const Graph *model, const int *map, const HwProfile *hw, CostStep *st,
                      const int *order, const CostEstimate *cur, CostEstimate *next, int64_t peak)
{
	int n = prog->ops.n;
	permute(prog, order);
	cost_step_free(st);
	step_describe(model, prog, map, st); /* the phases, of the ops where they are now */
	st->steady_only = true;
	cost_estimate_step(prog, hw, st, next);
	if (step_kept(next, cur->overlapped_s, peak))
		return true;
	int *undo = xmalloc(sizeof(int) * ((size_t)n + 1)); /* the order before back: its op order[i] is at i now */
	for (int i = 0; i < n; i++)
		undo[order[i]] = i;
	permute(prog, undo);
	free(undo);
	return false;
}

/* order (made by the step `what`: fill_wait, hoist_order, delay_waits)
 * priced by try_order; when kept, *cur is its estimate and the one before
 * is freed (*next the spare); else prog is as it was and *next freed.  In
 * test builds, an order that would put an op before one it reads aborts. */
static bool take_order(Graph *prog, const Graph *model, const int *map, const HwProfile *hw, CostStep *st,
                       const int *order, CostEstimate **cur, CostEstimate **next, int64_t peak, const char *what)
{
#if SPMD_VERIFY_PARTITION
	if (!topological(prog, order)) {
		fprintf(stderr, "spmd: internal: %s would move an op before one it reads\n", what);
		abort();
	}
#else
	(void)what;
#endif
	if (!try_order(prog, model, map, hw, st, order, *cur, *next, peak)) {
		cost_estimate_free(*next);
		return false;
	}
	cost_estimate_free(*cur);
	CostEstimate *was = *cur;
	*cur = *next, *next = was;
	return true;
}

bool order_updates(Graph *prog, const Graph *model, const int *map, const HwProfile *hw, CostEstimate *priced,
                   OrderReport *rep)
{
	const Train *t = model->train;
	OrderReport local;
	if (!rep)
		rep = &local;
	memset(rep, 0, sizeof *rep);
	CostEstimate given = {0}; /* the estimate of prog as it is, when the caller has one */
	if (priced)
		given = *priced, memset(priced, 0, sizeof *priced);
	if (!t || !t->built || !map || model->pipeline || hw->topo == TOPO_THREADS || prog->ops.n < 2) {
		if (priced)
			*priced = given;
		return false;
	}
	snprintf(rep->hw, sizeof rep->hw, "%s", hw->name);
	CostStep st;
	step_describe(model, prog, map, &st);
	st.steady_only = true;
	CostEstimate before, after;
	if (given.op)
		before = given;
	else
		cost_estimate_step(prog, hw, &st, &before);
	rep->before_s = before.overlapped_s, rep->before_peak = before.mem.peak;
	int n = prog->ops.n, *order = xmalloc(sizeof(int) * ((size_t)n + 1));
	uint8_t *mark = xcalloc((size_t)prog->values.n + 1, 1);
	for (int i = 0; i < st.ncarry; i++) /* the params' new weights */
		if (prog->values.a[st.carry_to[i]].kind == VK_PARAM)
			mark[st.carry_from[i]] = 1, rep->params++;
	for (int p = 0; p < t->nparams; p++) /* their gradients, reduced */
		if (map[t->params[p].reduced] >= 0)
			mark[map[t->params[p].reduced]] = 2;
	/* nothing to gain where the compute stream hardly waits */
	rep->waits = before.overlapped_s - before.compute_s > before.overlapped_s / 100;
	/* Rounds: the first places the tail by the step as built, where a
	 * reduction whose reader comes last may end last too; a second places
	 * what stayed by the moved step's times. */
	CostEstimate *cur = &before, *next = &after;
	int64_t peak = before.mem.peak; /* as built */
	for (int round = 0; round < ROUNDS && rep->waits; round++) {
		/* a reduction made ready can wait for a gather already on the stream: the longest */
		double slack = 0;
		for (int i = 0; i < n; i++)
			if (cur->op[i].comm && cur->op[i].phase == PHASE_GATHER)
				slack = fmax(slack, cur->op[i].seconds);
		OrderReport r = *rep;
		r.ops = r.grads = r.moved = 0;
		if (!new_order(prog, cur, slack, mark, order, &r))
			break;
		rep->tried = true;
		bool better = try_order(prog, model, map, hw, &st, order, cur, next, peak);
		if (round == 0)
			rep->after_s = next->overlapped_s, rep->after_peak = next->mem.peak;
		if (!better) {
			cost_estimate_free(next);
			break;
		}
		rep->kept = true, rep->after_s = next->overlapped_s, rep->after_peak = next->mem.peak;
		rep->ops += r.ops, rep->grads += r.grads, rep->moved += r.moved;
		cost_estimate_free(cur);
		CostEstimate *was = cur;
		cur = next, next = was;
	}
	/* then the longest waits of the moved step filled, one at a time, each kept where faster */
	for (int f = 0; f < FILLS && rep->kept; f++) {
		int nfill = 0;
		if (!fill_order(prog, cur, order, &nfill) ||
		    !take_order(prog, model, map, hw, &st, order, &cur, &next, peak, "filling a wait"))
			break;
		rep->filled += nfill, rep->fills++;
		rep->after_s = cur->overlapped_s, rep->after_peak = cur->mem.peak;
	}
	/* then the collectives the compute stream waits for hoisted, kept where faster (a second round, on the
	 * hoisted step's waits, gained nothing on the benchmark's models) */
	int nh = 0, nm = 0;
	if (cur->overlapped_s - cur->compute_s > cur->overlapped_s / 100 && hoist_order(prog, cur, order, &nh, &nm) &&
	    take_order(prog, model, map, hw, &st, order, &cur, &next, peak, "hoisting a collective")) {
		rep->hoists = nh, rep->hoisted = nm;
		rep->hoist_s = cur->overlapped_s, rep->hoist_peak = cur->mem.peak;
	}
	/* then the tail's waits put off, kept where faster */
	int nd = 0, nw = 0;
	if (rep->kept && delay_waits(prog, cur, order, &nw, &nd) &&
	    take_order(prog, model, map, hw, &st, order, &cur, &next, peak, "putting off a wait")) {
		rep->delays = nw, rep->delayed = nd;
		rep->delay_s = cur->overlapped_s, rep->delay_peak = cur->mem.peak;
	}
	free(order), free(mark);
	cost_step_free(&st);
	/* cur: the estimate of prog as it is (the others are freed) */
	if (priced)
		*priced = *cur;
	else
		cost_estimate_free(cur);
	return rep->kept;
}
