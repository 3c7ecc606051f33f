/* schedule.c: the steady-state schedule — compute and communication streams over consecutive steps. */
#include "cost.h"

#include <string.h>

#include "../spmd/ops.h"

enum { NSTEPS = 4 }; /* steps simulated: the steady state is measured from the second to the fourth */

/* A binary min-heap of collectives (step * nops + op) ordered by a key
 * (the time their operands are ready, or how soon the compute stream needs
 * them), then by step and program order. */
typedef struct {
	int n, *a;
	const double *key;
} Heap;

static bool before(const Heap *h, int x, int y) { return h->key[x] < h->key[y] || (h->key[x] == h->key[y] && x < y); }

static void heap_push(Heap *h, int x)
{
	int i = h->n++;
	h->a[i] = x;
	for (; i > 0 && before(h, h->a[i], h->a[(i - 1) / 2]); i = (i - 1) / 2) {
		int t = h->a[i];
		h->a[i] = h->a[(i - 1) / 2], h->a[(i - 1) / 2] = t;
	}
}

static int heap_pop(Heap *h)
{
	int top = h->a[0], i = 0;
	h->a[0] = h->a[--h->n];
	for (;;) {
		int l = 2 * i + 1, r = l + 1, m = i;
		if (l < h->n && before(h, h->a[l], h->a[m]))
			m = l;
		if (r < h->n && before(h, h->a[r], h->a[m]))
			m = r;
		if (m == i)
			return top;
		int t = h->a[i];
		h->a[i] = h->a[m], h->a[m] = t, i = m;
	}
}

/* Collectives that occupy the same links (cost_collective_links) wait
 * for each other; of each set, one lane. */
enum { LINKS = COST_LINKS, MAX_LANES = 32 }; /* more sets: the last lane takes the rest, on all their links */

typedef struct {
	unsigned links;
	int nl, l[LINKS]; /* its links' indices */
	Heap heap; /* known collectives by ready time */
	Heap due;  /* collectives ready when the lane is next free, by need */
} Lane;

/* The simulation's state: per step and value, when it is ready (-1: not
 * yet known); per step and collective, how many operands are not known and
 * when the known ones are ready. */
typedef struct {
	const Graph *g;
	const CostEstimate *e;
	int nsteps, nv, nops;
	double *ready;        /* nsteps * nv */
	int *missing;         /* nsteps * nops: collectives' unknown operands */
	double *rkey;         /* nsteps * nops: collectives' operands' ready time */
	int *rd_start, *rd;   /* per value, the collectives reading it (once per operand) */
	int *carry;           /* per value: the leaf it is carried to, or -1 */
	int *from;            /* per value: the value carried to it, or -1 */
	double *need;         /* nsteps * nops: when (in program order, over steps) a collective's result is first read */
	int *lane;            /* per op: its lane (collectives) */
	Lane lanes[MAX_LANES];
	int nlanes, pending;  /* lanes, and the collectives known but not placed */
	double free[LINKS];   /* when each link is next free */
	CostSlot *slot;
	int nslots;
	/* why ops started when they did, per step and op: a compute op's idle
	 * time before it and the collective it waited for; a collective's
	 * delay after its operands were ready and the one before it on its
	 * links (sim_run) */
	double *wait;
	int *why; /* the other op, as step * nops + op + 1 (0: none) */
	int last_on[LINKS]; /* per link: the collective (step * nops + op) that holds it last, or -1 */
} Sim;

/* Value v of step s is ready at t: collectives reading it may become
 * known; a carried value makes the next step's leaf ready. */
static void set_ready(Sim *m, int s, int v, double t)
{
	m->ready[(size_t)s * (size_t)m->nv + (size_t)v] = t;
	for (int k = m->rd_start[v]; k < m->rd_start[v + 1]; k++) {
		size_t c = (size_t)s * (size_t)m->nops + (size_t)m->rd[k];
		m->rkey[c] = t > m->rkey[c] ? t : m->rkey[c];
		if (--m->missing[c] == 0)
			heap_push(&m->lanes[m->lane[m->rd[k]]].heap, (int)c), m->pending++;
	}
	if (m->carry[v] >= 0 && s + 1 < m->nsteps)
		set_ready(m, s + 1, m->carry[v], t);
}

/* How soon each collective's result is needed: the program index of the
 * first compute op that reads it, through further collectives; a carried
 * value is read by the next step (its leaf's first reader, plus nops);
 * a value nothing reads (an output of the step) is due at the step's end.
 * Two passes: the first finds the leaves' first readers, the second adds
 * the carried values'. */
static void sim_need(Sim *m)
{
	const Graph *g = m->g;
	int n = m->nops;
	size_t nv = (size_t)m->nv + 1;
	double *leaf = xmalloc(sizeof(double) * nv), *first = xmalloc(sizeof(double) * nv);
	for (int pass = 0; pass < 2; pass++) {
		for (int v = 0; v < m->nv; v++)
			first[v] = pass && m->carry[v] >= 0 ? n + leaf[m->carry[v]] : n;
		for (int i = n - 1; i >= 0; i--) {
			const Op *op = &g->ops.a[i];
			double t = m->e->op[i].comm ? first[op->out] : i;
			for (int k = 0; k < op->nin; k++)
				first[op->in[k]] = t < first[op->in[k]] ? t : first[op->in[k]];
		}
		memcpy(leaf, first, sizeof(double) * (size_t)m->nv);
	}
	for (int s = 0; s < m->nsteps; s++)
		for (int i = 0; i < n; i++)
			if (m->e->op[i].comm)
				m->need[(size_t)s * (size_t)n + (size_t)i] = (double)s * n + first[g->ops.a[i].out];
	free(leaf), free(first);
}

/* Per op, the links a collective occupies (every link when the profile
 * runs one collective at a time); 0 for the others. */
static unsigned *op_links(const Graph *g, const HwProfile *hw, const CostEstimate *e)
{
	unsigned *links = xcalloc((size_t)g->ops.n + 1, sizeof *links), all = (1u << LINKS) - 1;
	for (int i = 0; i < g->ops.n; i++)
		if (e->op[i].comm)
			links[i] = hw->comm_streams == COMM_ONE ? all : cost_collective_links(hw, g, i);
	return links;
}

/* The lanes: one per set of links the collectives occupy (op_links). */
static void sim_lanes(Sim *m, const unsigned *op_links)
{
	const Graph *g = m->g;
	int *count = xcalloc(MAX_LANES, sizeof *count);
	m->lane = xmalloc(sizeof(int) * ((size_t)g->ops.n + 1));
	for (int i = 0; i < g->ops.n; i++) {
		if (!m->e->op[i].comm)
			continue;
		unsigned links = op_links[i];
		int l = 0;
		while (l < m->nlanes && m->lanes[l].links != links)
			l++;
		if (l == MAX_LANES) /* full: the last lane, on its links and these */
			m->lanes[--l].links |= links;
		else if (l == m->nlanes)
			m->lanes[m->nlanes++].links = links;
		m->lane[i] = l, count[l]++;
	}
	for (int l = 0; l < m->nlanes; l++) {
		Lane *ln = &m->lanes[l];
		for (int k = 0; k < LINKS; k++)
			if (ln->links >> k & 1)
				ln->l[ln->nl++] = k;
		size_t n = (size_t)count[l] * (size_t)m->nsteps + 1;
		m->lanes[l].heap = (Heap){0, xmalloc(sizeof(int) * n), m->rkey};
		m->lanes[l].due = (Heap){0, xmalloc(sizeof(int) * n), m->need};
	}
	free(count);
}

static void sim_init(Sim *m, const Graph *g, const unsigned *op_links, const CostEstimate *e, const CostStep *st,
                     int nsteps)
{
	memset(m, 0, sizeof *m);
	m->g = g, m->e = e, m->nsteps = nsteps, m->nv = g->values.n, m->nops = g->ops.n;
	size_t nv = (size_t)nsteps * (size_t)m->nv + 1, no = (size_t)nsteps * (size_t)m->nops + 1;
	m->ready = xmalloc(sizeof(double) * nv);
	for (size_t i = 0; i < nv; i++)
		m->ready[i] = -1;
	m->missing = xcalloc(no, sizeof *m->missing), m->rkey = xcalloc(no, sizeof *m->rkey);
	m->need = xmalloc(sizeof(double) * no);
	sim_lanes(m, op_links);
	m->slot = xmalloc(sizeof(CostSlot) * no);
	m->wait = xcalloc(no, sizeof *m->wait), m->why = xcalloc(no, sizeof *m->why);
	for (int k = 0; k < LINKS; k++)
		m->last_on[k] = -1;
	m->rd_start = xcalloc((size_t)m->nv + 2, sizeof(int));
	m->carry = xmalloc(sizeof(int) * ((size_t)m->nv + 1)), m->from = xmalloc(sizeof(int) * ((size_t)m->nv + 1));
	for (int v = 0; v < m->nv; v++)
		m->carry[v] = m->from[v] = -1;
	for (int i = 0; st && i < st->ncarry; i++)
		m->carry[st->carry_from[i]] = st->carry_to[i], m->from[st->carry_to[i]] = st->carry_from[i];
	int total = 0;
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; e->op[i].comm && k < g->ops.a[i].nin; k++)
			m->rd_start[g->ops.a[i].in[k] + 1]++, total++;
	for (int v = 0; v < m->nv; v++)
		m->rd_start[v + 1] += m->rd_start[v];
	m->rd = xmalloc(sizeof(int) * ((size_t)total + 1));
	int *fill = xcalloc((size_t)m->nv + 1, sizeof *fill);
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; e->op[i].comm && k < g->ops.a[i].nin; k++) {
			int v = g->ops.a[i].in[k];
			m->rd[m->rd_start[v] + fill[v]++] = i;
		}
	free(fill);
	for (int s = 0; s < nsteps; s++)
		for (int i = 0; i < g->ops.n; i++)
			m->missing[(size_t)s * (size_t)m->nops + (size_t)i] = e->op[i].comm ? g->ops.a[i].nin : 0;
	sim_need(m);
}

static void sim_free(Sim *m)
{
	free(m->ready), free(m->missing), free(m->rkey), free(m->need), free(m->lane);
	for (int l = 0; l < m->nlanes; l++)
		free(m->lanes[l].heap.a), free(m->lanes[l].due.a);
	free(m->rd_start), free(m->rd), free(m->carry), free(m->from);
	free(m->wait), free(m->why);
}

/* Leaves are ready at 0 in every step but those carried to, which the
 * previous step makes (the first step finds them at 0 too). */
static void sim_leaves(Sim *m)
{
	for (int s = 0; s < m->nsteps; s++)
		for (int v = 0; v < m->nv; v++)
			if (m->g->values.a[v].producer < 0 && (s == 0 || m->from[v] < 0))
				set_ready(m, s, v, 0);
}

/* Compute op i of step s can start: every operand known.  Its start time
 * (no earlier than *t), and in *last the operand ready last (-1: none
 * later than *t was). */
static bool operands_known(const Sim *m, int s, int i, double *t, int *last)
{
	const Op *op = &m->g->ops.a[i];
	*last = -1;
	for (int k = 0; k < op->nin; k++) {
		double r = m->ready[(size_t)s * (size_t)m->nv + (size_t)op->in[k]];
		if (r < 0)
			return false;
		if (r > *t)
			*t = r, *last = op->in[k];
	}
	return true;
}

static void place(Sim *m, int s, int i, double start, double *stream)
{
	double end = start + m->e->op[i].seconds;
	m->slot[m->nslots++] = (CostSlot){i, s, m->e->op[i].comm, start, end};
	*stream = end;
	set_ready(m, s, m->g->ops.a[i].out, end);
}

/* When lane l next starts a collective: when its links are free if one is
 * waiting, else when the soonest is ready (and its links free); 1e300
 * when none is known. */
static double lane_at(const Sim *m, const Lane *l)
{
	if (!l->heap.n && !l->due.n)
		return 1e300;
	double at = 0;
	for (int k = 0; k < l->nl; k++)
		at = m->free[l->l[k]] > at ? m->free[l->l[k]] : at;
	if (!l->due.n && m->rkey[l->heap.a[0]] > at)
		at = m->rkey[l->heap.a[0]];
	return at;
}

/* Run the streams over m->nsteps steps.  The compute stream runs the
 * local ops in program order, step after step.  Each lane is a
 * communication stream: when its links are free, it runs, of its
 * collectives whose operands are ready, the one whose result the compute
 * stream needs first (sim_need); the lane that can start soonest goes
 * first (on a tie, the one whose collective is needed first); it decides
 * only once the compute stream has passed that time, or can go no further
 * without a collective: no op placed later can make a collective ready
 * sooner. */
static void sim_run(Sim *m)
{
	double tc = 0;
	int n = m->nops, next = 0, total = m->nsteps * n;
	while (next < total || m->pending) {
		while (next < total && m->e->op[next % n].comm)
			next++;
		double t = tc;
		int last = -1;
		bool can = next < total && operands_known(m, next / n, next % n, &t, &last);
		Lane *best = NULL;
		double at = 1e300;
		for (int k = 0; k < m->nlanes; k++) {
			Lane *l = &m->lanes[k];
			double a = lane_at(m, l);
			if (a >= 1e300 || a > at || (can && a > tc))
				continue;
			while (l->heap.n && m->rkey[l->heap.a[0]] <= a)
				heap_push(&l->due, heap_pop(&l->heap));
			if (!best || a < at || m->need[l->due.a[0]] < m->need[best->due.a[0]])
				best = l, at = a;
		}
		if (best) {
			int c = heap_pop(&best->due);
			double end, held = m->rkey[c];
			m->wait[c] = at - m->rkey[c];
			for (int k = 0; k < best->nl; k++) /* the collective its links waited for last */
				if (m->last_on[best->l[k]] >= 0 && m->free[best->l[k]] > held)
					held = m->free[best->l[k]], m->why[c] = m->last_on[best->l[k]] + 1;
			place(m, c / n, c % n, at, &end);
			for (int k = 0; k < best->nl; k++)
				m->free[best->l[k]] = end, m->last_on[best->l[k]] = c;
			m->pending--;
		} else if (can) {
			size_t x = (size_t)next;
			m->wait[x] = t - tc;
			if (last >= 0 && t > tc) { /* the collective it waited for, in this step or (a carried leaf) the one before */
				int s = next / n, v = last;
				if (m->g->values.a[v].producer < 0 && m->from[v] >= 0 && s > 0)
					v = m->from[v], s--;
				int p = m->g->values.a[v].producer;
				m->why[x] = p >= 0 && m->e->op[p].comm ? s * n + p + 1 : 0;
			}
			place(m, next / n, next % n, t, &tc);
			next++;
		} else {
			break; /* a compute op reads a value no op makes: not a valid program */
		}
	}
}

/* Seconds of [a, b) during which the compute stream is busy (compute
 * slots are in time order). */
static double busy_compute(const CostSlot *cs, int n, double a, double b)
{
	int lo = 0, hi = n;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (cs[mid].end <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	double t = 0;
	for (int i = lo; i < n && cs[i].start < b; i++) {
		double x = cs[i].start > a ? cs[i].start : a, y = cs[i].end < b ? cs[i].end : b;
		t += y > x ? y - x : 0;
	}
	return t;
}

/* When each step's first compute op starts (its first op, when it has no
 * compute), and when its last op ends. */
static void step_bounds(const Sim *m, double *first, double *last)
{
	double any[NSTEPS];
	for (int s = 0; s < m->nsteps; s++)
		first[s] = any[s] = 1e300, last[s] = 0;
	for (int i = 0; i < m->nslots; i++) {
		const CostSlot *c = &m->slot[i];
		if (!c->comm)
			first[c->step] = c->start < first[c->step] ? c->start : first[c->step];
		any[c->step] = c->start < any[c->step] ? c->start : any[c->step];
		last[c->step] = c->end > last[c->step] ? c->end : last[c->step];
	}
	for (int s = 0; s < m->nsteps; s++)
		first[s] = first[s] < 1e300 ? first[s] : any[s];
}

/* The steady step (the third simulated) into e: its ops' times from its
 * start, each collective's time hidden under compute, per phase. */
static void steady(const Sim *m, const double *first, CostEstimate *e)
{
	int nc = 0;
	CostSlot *cs = xmalloc(sizeof(CostSlot) * ((size_t)m->nslots + 1));
	for (int i = 0; i < m->nslots; i++)
		if (!m->slot[i].comm)
			cs[nc++] = m->slot[i];
	for (int i = 0; i < m->nslots; i++) {
		const CostSlot *c = &m->slot[i];
		if (c->step != 2)
			continue;
		OpEstimate *o = &e->op[c->op];
		o->start = c->start - first[2], o->end = c->end - first[2], o->lane = c->comm ? m->lane[c->op] : 0;
		o->links = c->comm ? m->lanes[o->lane].links : 0;
		o->hidden = c->comm ? busy_compute(cs, nc, c->start, c->end) : 0;
		e->phase_hidden_s[o->phase] += o->hidden;
		size_t x = (size_t)c->step * (size_t)m->nops + (size_t)c->op;
		int why = m->why[x] ? (m->why[x] - 1) % m->nops : -1;
		if (c->comm)
			o->delay = m->wait[x], o->behind = why;
		else
			o->wait = m->wait[x], o->wait_on = why;
	}
	free(cs);
}

/* The busiest link's seconds a step: the collectives' time on it. */
static double link_busy(const Sim *m)
{
	double t[LINKS] = {0}, most = 0;
	for (int i = 0; i < m->nops; i++)
		for (int k = 0; m->e->op[i].comm && k < LINKS; k++)
			if (m->lanes[m->lane[i]].links >> k & 1)
				t[k] += m->e->op[i].seconds;
	for (int k = 0; k < LINKS; k++)
		most = t[k] > most ? t[k] : most;
	return most;
}

void cost_schedule(const Graph *g, const HwProfile *hw, const CostStep *st, CostEstimate *e)
{
	if (hw->topo == TOPO_THREADS) { /* the thread backend runs collectives on the device's own thread */
		double t = 0;
		for (int i = 0; i < g->ops.n; i++)
			e->op[i].start = t, e->op[i].end = t += e->op[i].seconds;
		e->overlapped_s = e->first_step_s = e->serial_s, e->nlanes = 1, e->link_busy_s = e->comm_s;
		return;
	}
	Sim m;
	double first[NSTEPS], last[NSTEPS];
	unsigned *links = op_links(g, hw, e);
	e->first_step_s = 0;
	if (!st || !st->steady_only) {
		sim_init(&m, g, links, e, st, 1);
		sim_leaves(&m);
		sim_run(&m);
		step_bounds(&m, first, last);
		e->first_step_s = g->ops.n ? last[0] : 0;
		sim_free(&m), free(m.slot);
	}
	sim_init(&m, g, links, e, st, NSTEPS);
	sim_leaves(&m);
	sim_run(&m);
	step_bounds(&m, first, last);
	/* Two steps' span, measured at their ends and at their starts, and no
	 * less than the busiest link's time: the last simulated step's tail
	 * finishes early (no later step's collectives compete with it), and
	 * the collectives of independent steps (an inference program) can run
	 * ahead of the compute for a few steps but not for a long run.  The span of the starts is at least the compute
	 * stream's busy time. */
	double ends = (last[3] - last[1]) / 2, starts = (first[3] - first[1]) / 2;
	double p = ends > starts ? ends : starts, busy = e->link_busy_s = link_busy(&m);
	e->overlapped_s = g->ops.n ? (p > busy ? p : busy) : 0;
	steady(&m, first, e);
	e->nlanes = m.nlanes > 0 ? m.nlanes : 1;
	e->nsteps_sim = NSTEPS;
	for (int s = 0; s < NSTEPS; s++)
		e->step_origin[s] = g->ops.n ? first[s] : 0;
	e->slot = m.slot, e->nslots = m.nslots;
	sim_free(&m), free(links);
}
