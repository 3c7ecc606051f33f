/* verify.c: the collective-matching check of per-device programs (spmd verify).
 *
 * The model is MPI's: each device runs its collectives one after another in
 * program order, and a collective returns only when every member of its
 * replica group has entered it.  The check plays this out.  Every device has
 * a head, its next collective.  A device at its head waits in the slot of
 * the head's group, keyed by the group's axes (in order) and the group's
 * member 0: the members of one group, and only they, find the same slot.
 * When a slot holds as many devices as the group has members, the
 * collective goes through — after its members are compared (same kind,
 * axes, reduction, dims, operand dtype and shape, result name; a permute's
 * partners paired up) — and the members move on to their next collective.
 * A device enters one slot per collective it runs and a firing walks its
 * members once, so the work is linear in the collectives run over all
 * devices.  When nothing can fire while some device still waits, the
 * programs deadlock; the report follows the chain of waits (a waits for b,
 * which waits for c, ...) to a device that has finished or has no program,
 * or until it closes a cycle.  Whom a report names is a guess at who broke
 * the programs: the device that left the sequence most devices run.
 * docs/verify.md says what a pass proves. */
#include "verify.h"

#include <string.h>

#include "../spmd/emit.h"
#include "../spmd/ops.h"

/* The code of a send between pipeline stages: this plus the receiver. */
enum { SEND_CODE = 1 << 20 };

/* One collective as one device runs it. */
typedef struct {
	const Graph *g;
	const Op *op;
	int dev, index; /* the device; the collective's number there, from 1 */
	int code;       /* its axes in order, as base-5 digits axis + 1 */
	int first;      /* its group's member 0 */
	int size;       /* the group's member count */
	int to, from;   /* collective_permute: the partners, -1: none */
} Ev;

/* The devices waiting at one group's collective. */
typedef struct {
	int code, first; /* the key */
	int count;       /* devices waiting */
	int list, last;  /* the first and last of them, linked through Sim.next */
	int bnext;       /* next slot with the same member 0; next free slot */
} Slot;

typedef struct {
	const Mesh *m;
	int ndev;
	const Graph *const *prog; /* device -> its program, NULL: none */
	const int *const *coll;   /* device -> op ids of its collectives, in order */
	const int *ncoll;
	const int *const *to;     /* verify_program: per op, every device's permute partners */
	const int *const *from;   /*   (NULL: not a permute); else NULL */
	int *head;   /* device -> number of collectives it has run */
	int *wait;   /* device -> the slot it waits in, or -1 */
	int *next;   /* device -> the next device in the same slot, or -1 */
	int *bucket; /* member 0 of a group -> its first slot, or -1 */
	int *queue;  /* devices to move on: a ring of ndev */
	int qh, qn;
	Slot *slot;  /* ndev slots: a waiting device holds at most one */
	int nfree;   /* head of the free slot list */
	VerifyResult *r;
} Sim;

static int axes_code(const Attr *a)
{
	int c = 0;
	for (int i = 0; i < a->ncax; i++)
		c = c * 5 + a->cax[i] + 1;
	return c;
}

/* dev's partners in a collective_permute of attributes a: along the shift,
 * or by the explicit map (whose inverse is searched). */
static void permute_partners(const Mesh *m, const Attr *a, int dev, int *to, int *from)
{
	*to = *from = dev;
	if (a->target) {
		*to = a->target[dev], *from = -1;
		for (int i = 0; i < m->ndev && *from < 0; i++)
			*from = a->target[i] == dev ? i : -1;
	} else if (m->naxes && a->ncax >= 1) {
		int c[MESH_MAX_AXES], ax = a->cax[0], n = m->size[ax];
		mesh_device_coords(m, dev, c);
		int c0 = c[ax], sh = (int)((a->shift % n + n) % n);
		c[ax] = (c0 + sh) % n;
		*to = mesh_coords_device(m, c);
		c[ax] = (c0 - sh + n) % n;
		*from = mesh_coords_device(m, c);
	}
}

/* Collective number k (from 0) of device dev. */
static void event_get(const Sim *s, int dev, int k, Ev *e)
{
	const Graph *g = s->prog[dev];
	const Op *op = &g->ops.a[s->coll[dev][k]];
	const Attr *a = op->attr;
	int c[MESH_MAX_AXES] = {0};
	*e = (Ev){.g = g, .op = op, .dev = dev, .index = k + 1, .code = axes_code(a), .size = 1, .to = -1, .from = -1};
	mesh_device_coords(s->m, dev, c);
	for (int i = 0; i < a->ncax; i++)
		e->size *= s->m->size[a->cax[i]], c[a->cax[i]] = 0;
	e->first = mesh_coords_device(s->m, c);
	if (op->kind == OP_COLLECTIVE_PERMUTE && s->to)
		e->to = s->to[s->coll[dev][k]][dev], e->from = s->from[s->coll[dev][k]][dev];
	else if (op->kind == OP_COLLECTIVE_PERMUTE)
		permute_partners(s->m, a, dev, &e->to, &e->from);
	if (op->stage_to >= 0) { /* a send between pipeline stages: the pair alone meets */
		bool sends = e->to >= 0 && e->to != dev;
		e->first = sends ? dev : e->from;
		e->code = SEND_CODE + (sends ? e->to : dev);
		e->size = 2;
	}
}

/* e's group in member order into grp (e->size entries). */
static void members(const Sim *s, const Ev *e, int *grp)
{
	if (e->code >= SEND_CODE) {
		grp[0] = e->first, grp[1] = e->code - SEND_CODE;
		return;
	}
	mesh_group(s->m, e->dev, e->op->attr->cax, e->op->attr->ncax, grp);
}

/* snprintf for messages, which are cut at their buffer's end. */
static void textf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void textf(char *buf, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, n, fmt, ap);
	va_end(ap);
}

static const Value *operand(const Ev *e) { return &e->g->values.a[e->op->in[0]]; }
static const char *result_name(const Ev *e) { return e->g->values.a[e->op->out].name; }

/* Do two members run the same collective with buffers that fit? */
static bool same_event(const Ev *a, const Ev *b)
{
	const Attr *x = a->op->attr, *y = b->op->attr;
	OpKind k = a->op->kind;
	if (k != b->op->kind || a->code != b->code || strcmp(result_name(a), result_name(b)) != 0)
		return false;
	if (operand(a)->dtype != operand(b)->dtype || !shape_eq(&operand(a)->shape, &operand(b)->shape))
		return false;
	if ((k == OP_ALL_REDUCE || k == OP_REDUCE_SCATTER) && x->reduce != y->reduce)
		return false;
	if ((k == OP_REDUCE_SCATTER || k == OP_ALL_GATHER || k == OP_ALL_TO_ALL) && x->dim != y->dim)
		return false;
	return k != OP_ALL_TO_ALL || x->dim2 == y->dim2;
}

/* "all_reduce [model] sum of [8, 4] f32 -> y" */
static void describe(const Sim *s, const Ev *e, char *buf, size_t n)
{
	const Attr *a = e->op->attr;
	char axes[96] = "", shape[96], extra[48] = "";
	mesh_axes_text(s->m, a->cax, a->ncax, axes, sizeof axes);
	const char *red = a->reduce == REDUCE_MAX ? "max" : "sum";
	switch (e->op->kind) {
	case OP_ALL_REDUCE: textf(extra, sizeof extra, " %s", red); break;
	case OP_REDUCE_SCATTER: textf(extra, sizeof extra, " %s dim %d", red, a->dim); break;
	case OP_ALL_GATHER: textf(extra, sizeof extra, " dim %d", a->dim); break;
	case OP_ALL_TO_ALL: textf(extra, sizeof extra, " dims %d->%d", a->dim, a->dim2); break;
	default: break;
	}
	shape_format(&operand(e)->shape, shape, sizeof shape);
	textf(buf, n, "%s [%s]%s of %s %s -> %s", op_table[e->op->kind].name, axes, extra, shape,
	      dtype_names[operand(e)->dtype], result_name(e));
}

/* "[2, 3]": e's group, its first members if it is large. */
static void group_text(const Sim *s, const Ev *e, char *buf, size_t n)
{
	int *grp = xmalloc(sizeof(int) * (size_t)e->size);
	members(s, e, grp);
	size_t k = (size_t)snprintf(buf, n, "[");
	for (int i = 0; i < e->size && k < n; i++) {
		if (i == 8 && e->size > 9) {
			k += (size_t)snprintf(buf + k, n - k, ", ... (%d devices)", e->size);
			break;
		}
		k += (size_t)snprintf(buf + k, n - k, "%s%d", i ? ", " : "", grp[i]);
	}
	if (k < n)
		textf(buf + k, n - k, "]");
	free(grp);
}

/* The problem is at e (NULL: at no collective of dev). */
static void problem(Sim *s, int dev, const Ev *e, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void problem(Sim *s, int dev, const Ev *e, const char *fmt, ...)
{
	VerifyProblem *p = &s->r->problem;
	va_list ap;
	s->r->ok = false;
	*p = (VerifyProblem){.device = dev};
	if (e)
		p->index = e->index, p->op = op_table[e->op->kind].name, p->value = result_name(e), p->pos = e->op->pos;
	va_start(ap, fmt);
	vsnprintf(p->msg, sizeof p->msg, fmt, ap);
	va_end(ap);
}

/* "a.yaml:3:5", or "no position" */
static void where(const Ev *e, char *buf, size_t n)
{
	Pos p = e->op->pos;
	if (p.file && p.line > 0)
		textf(buf, n, "%s:%d:%d", p.file, p.line, p.col);
	else
		textf(buf, n, "%s", p.file ? p.file : "no position");
}

/* ---- slots and the work queue ---- */

/* The slot of the group (code, first), made if no device waits there yet. */
static int slot_get(Sim *s, int code, int first)
{
	for (int i = s->bucket[first]; i >= 0; i = s->slot[i].bnext)
		if (s->slot[i].code == code)
			return i;
	int i = s->nfree;
	s->nfree = s->slot[i].bnext;
	s->slot[i] = (Slot){.code = code, .first = first, .list = -1, .last = -1, .bnext = s->bucket[first]};
	s->bucket[first] = i;
	return i;
}

static void slot_drop(Sim *s, int sl)
{
	int *p = &s->bucket[s->slot[sl].first];
	while (*p != sl)
		p = &s->slot[*p].bnext;
	*p = s->slot[sl].bnext;
	s->slot[sl].bnext = s->nfree;
	s->nfree = sl;
}

/* A device is in the queue at most once: before it first waits, or after
 * the collective it waited at went through. */
static void enqueue(Sim *s, int dev) { s->queue[(s->qh + s->qn++) % s->ndev] = dev; }

static int dequeue(Sim *s)
{
	int dev = s->queue[s->qh];
	s->qh = (s->qh + 1) % s->ndev, s->qn--;
	return dev;
}

/* ---- a group's collective going through ---- */

/* The members of a slot disagree: bad's collective differs from ref's. */
static void mismatch(Sim *s, int ref, int bad)
{
	Ev a, b;
	char want[200], got[200], grp[96], at[160];
	event_get(s, ref, s->head[ref], &a);
	event_get(s, bad, s->head[bad], &b);
	describe(s, &a, want, sizeof want), describe(s, &b, got, sizeof got);
	group_text(s, &b, grp, sizeof grp), where(&a, at, sizeof at);
	problem(s, bad, &b,
	        "device %d: collective #%d does not match its group %s: expected %s, as device %d runs it, found %s "
	        "(device %d's is its collective #%d, at %s)",
	        bad, b.index, grp, want, ref, got, ref, a.index, at);
}

/* e sends to (send) or receives from device p: p must be in e's group,
 * waiting in slot sl, and receive from (send to) e's device.  False if so. */
static bool pair_bad(Sim *s, int sl, const Ev *e, int p, bool send)
{
	char desc[200], grp[96], other[32], at[160];
	const char *verb = send ? "sends to" : "receives from";
	if (p < 0)
		return false;
	describe(s, e, desc, sizeof desc);
	if (p >= s->ndev || s->wait[p] != sl) {
		group_text(s, e, grp, sizeof grp);
		problem(s, e->dev, e, "device %d: collective #%d %s %s device %d: expected a device of its group %s, found one outside it",
		        e->dev, e->index, desc, verb, p, grp);
		return true;
	}
	Ev q;
	event_get(s, p, s->head[p], &q);
	int back = send ? q.from : q.to;
	if (back == e->dev)
		return false;
	if (back < 0)
		textf(other, sizeof other, "nobody");
	else
		textf(other, sizeof other, "device %d", back);
	where(&q, at, sizeof at);
	problem(s, e->dev, e,
	        "device %d: collective #%d %s %s device %d: expected device %d to %s device %d, found it %s %s "
	        "(its collective #%d, at %s)",
	        e->dev, e->index, desc, verb, p, p, send ? "receive from" : "send to", e->dev,
	        send ? "receives from" : "sends to", other, q.index, at);
	return true;
}

/* A collective_permute whose members all wait in slot sl: does every
 * device a member sends to receive from it, and the other way round? */
static bool pairs_bad(Sim *s, int sl)
{
	for (int d = s->slot[sl].list; d >= 0; d = s->next[d]) {
		Ev e;
		event_get(s, d, s->head[d], &e);
		if (pair_bad(s, sl, &e, e.to, true) || pair_bad(s, sl, &e, e.from, false))
			return true;
	}
	return false;
}

/* Does dev's next collective differ from what most devices run as their
 * collective of the same number?  (Which of two disagreeing devices to
 * blame: in programs of one SPMD program, the one that left the common
 * sequence.) */
static bool deviates(const Sim *s, int dev)
{
	Ev e, o;
	int k = s->head[dev], agree = 0, have = 0;
	event_get(s, dev, k, &e);
	for (int d = 0; d < s->ndev; d++) {
		if (k >= s->ncoll[d])
			continue;
		event_get(s, d, k, &o);
		have++, agree += same_event(&e, &o);
	}
	return 2 * agree <= have;
}

/* Every member of slot sl's group waits there: compare them, then let the
 * collective go through.  Of the first member to arrive and the first that
 * differs from it, the one to blame is the one that deviates from the
 * common sequence; failing that, the first when it agrees with no other
 * member of a group of three or more, else the other. */
static void fire(Sim *s, int sl)
{
	Ev ref, e;
	int first = s->slot[sl].list, agree = 0, odd = -1;
	event_get(s, first, s->head[first], &ref);
	for (int d = first; d >= 0; d = s->next[d]) {
		event_get(s, d, s->head[d], &e);
		if (same_event(&ref, &e))
			agree++;
		else if (odd < 0)
			odd = d;
	}
	if (odd >= 0) {
		bool df = deviates(s, first), dodd = deviates(s, odd);
		if ((df && !dodd) || (df == dodd && agree == 1 && ref.size > 2))
			mismatch(s, odd, first);
		else
			mismatch(s, first, odd);
	}
	if (odd >= 0 || (ref.op->kind == OP_COLLECTIVE_PERMUTE && pairs_bad(s, sl)))
		return;
	s->r->ngroup++;
	for (int d = first, nx; d >= 0; d = nx) {
		nx = s->next[d];
		s->head[d]++, s->wait[d] = -1, s->next[d] = -1;
		enqueue(s, d);
	}
	slot_drop(s, sl);
}

/* dev stands at its next collective: wait in its group's slot. */
static void arrive(Sim *s, int dev)
{
	Ev e;
	event_get(s, dev, s->head[dev], &e);
	int sl = slot_get(s, e.code, e.first);
	Slot *t = &s->slot[sl];
	if (t->last >= 0)
		s->next[t->last] = dev;
	else
		t->list = dev;
	t->last = dev;
	s->next[dev] = -1;
	s->wait[dev] = sl;
	if (++t->count == e.size)
		fire(s, sl);
}

/* ---- deadlocks ---- */

/* e waits forever for device p of its group, which is not waiting with it. */
static void blocked(Sim *s, const Ev *e, int p)
{
	char desc[200], grp[96], found[300];
	describe(s, e, desc, sizeof desc);
	group_text(s, e, grp, sizeof grp);
	if (!s->prog[p])
		textf(found, sizeof found, "no program for device %d", p);
	else if (s->head[p] == s->ncoll[p])
		textf(found, sizeof found, "device %d has run all its %d collective%s", p, s->ncoll[p],
		      s->ncoll[p] == 1 ? "" : "s");
	else {
		Ev q;
		char qd[200], qg[96], at[160];
		event_get(s, p, s->head[p], &q);
		describe(s, &q, qd, sizeof qd), group_text(s, &q, qg, sizeof qg), where(&q, at, sizeof at);
		textf(found, sizeof found, "it at its collective #%d %s over %s (at %s)", q.index, qd, qg, at);
	}
	problem(s, e->dev, e, "device %d: collective #%d %s waits forever for device %d of its group %s: expected device %d to run it too, found %s",
	        e->dev, e->index, desc, p, grp, p, found);
}

/* Devices still wait when nothing can go through.  From dev, follow who
 * waits for whom to a device that does not wait (finished, or without a
 * program) or back to one already passed.  Report the first link whose
 * waiting device deviates from the common sequence, else the last. */
static void report_stuck(Sim *s, int dev)
{
	char *seen = xcalloc((size_t)s->ndev, 1);
	int *grp = xmalloc(sizeof(int) * (size_t)s->ndev), *from = xmalloc(sizeof(int) * (size_t)s->ndev),
	    *to = xmalloc(sizeof(int) * (size_t)s->ndev), n = 0;
	for (;;) {
		Ev e;
		event_get(s, dev, s->head[dev], &e);
		members(s, &e, grp);
		seen[dev] = 1;
		int p = -1;
		for (int i = 0; i < e.size && p < 0; i++)
			p = s->wait[grp[i]] != s->wait[dev] ? grp[i] : -1;
		from[n] = dev, to[n++] = p < 0 ? dev : p; /* p < 0 cannot be: the slot would have fired */
		if (p < 0 || s->wait[p] < 0 || seen[p])
			break;
		dev = p;
	}
	int pick = n - 1;
	for (int i = 0; i < n - 1 && pick == n - 1; i++)
		pick = deviates(s, from[i]) ? i : pick;
	Ev e;
	event_get(s, from[pick], s->head[from[pick]], &e);
	blocked(s, &e, to[pick]);
	free(seen), free(grp), free(from), free(to);
}

/* Play the collectives out; r gets the first problem. */
static void sim_run(Sim *s)
{
	char mesh[128];
	for (int d = 0; d < s->ndev; d++)
		enqueue(s, d);
	while (s->qn > 0 && s->r->ok) {
		int d = dequeue(s);
		if (s->head[d] < s->ncoll[d])
			arrive(s, d);
	}
	for (int d = 0; d < s->ndev && s->r->ok; d++)
		if (s->head[d] < s->ncoll[d])
			report_stuck(s, d);
	mesh_format(s->m, mesh, sizeof mesh);
	for (int d = 0; d < s->ndev && s->r->ok; d++)
		if (!s->prog[d])
			problem(s, d, NULL, "device %d: expected a program for each of the %d devices of the mesh %s, found none for device %d",
			        d, s->ndev, s->m->naxes ? mesh : "(none)", d);
}

static void sim_init(Sim *s, const Mesh *m, int ndev, VerifyResult *r)
{
	size_t n = (size_t)ndev;
	memset(s, 0, sizeof *s);
	s->m = m, s->ndev = ndev, s->r = r;
	s->head = xcalloc(n, sizeof(int));
	s->wait = xmalloc(n * sizeof(int)), s->next = xmalloc(n * sizeof(int));
	s->bucket = xmalloc(n * sizeof(int)), s->queue = xmalloc(n * sizeof(int));
	s->slot = xmalloc(n * sizeof(Slot));
	for (int i = 0; i < ndev; i++) {
		s->wait[i] = s->next[i] = s->bucket[i] = -1;
		s->slot[i].bnext = i + 1 < ndev ? i + 1 : -1;
	}
	*r = (VerifyResult){.ok = true, .ndev = ndev};
}

static void sim_free(Sim *s)
{
	free(s->head), free(s->wait), free(s->next), free(s->bucket), free(s->queue), free(s->slot);
}

/* The op ids of the collectives device dev runs of g (a pipeline's device:
 * its stages' only), in order, into a new array; *n their count. */
static int *collectives_of(const Graph *g, int dev, int *n)
{
	int *c = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1)), sc = graph_stage_coord(g, dev);
	*n = 0;
	for (int i = 0; i < g->ops.n; i++)
		if ((op_table[g->ops.a[i].kind].flags & OPF_COLLECTIVE) && op_runs_on(g, &g->ops.a[i], sc))
			c[(*n)++] = i;
	return c;
}

/* ---- the entry points ---- */

int verify_devices(const Graph *const *progs, int ndev, VerifyResult *r)
{
	const Graph *any = NULL;
	for (int d = 0; d < ndev && !any; d++)
		any = progs[d];
	*r = (VerifyResult){.ok = false, .ndev = ndev};
	if (!any || ndev < 1) {
		textf(r->problem.msg, sizeof r->problem.msg, "device 0: expected a program for each device, found none");
		return 1;
	}
	Sim s;
	sim_init(&s, &any->mesh, ndev, r);
	int **coll = xcalloc((size_t)ndev, sizeof *coll), *ncoll = xcalloc((size_t)ndev, sizeof(int));
	for (int d = 0; d < ndev; d++) {
		coll[d] = progs[d] ? collectives_of(progs[d], d, &ncoll[d]) : NULL;
		r->ncoll += ncoll[d];
	}
	s.prog = progs, s.coll = (const int *const *)coll, s.ncoll = ncoll;
	sim_run(&s);
	for (int d = 0; d < ndev; d++)
		free(coll[d]);
	free(coll), free(ncoll);
	sim_free(&s);
	return r->ok ? 0 : 1;
}

/* verify_program's permute partners: per op k, to[k] and from[k] for
 * every device (NULL for the other ops). */
static void program_partners(const Graph *g, int **to, int **from)
{
	const Mesh *m = &g->mesh;
	for (int k = 0; k < g->ops.n; k++) {
		const Op *op = &g->ops.a[k];
		to[k] = from[k] = NULL;
		if (op->kind != OP_COLLECTIVE_PERMUTE)
			continue;
		to[k] = xmalloc(sizeof(int) * (size_t)m->ndev), from[k] = xmalloc(sizeof(int) * (size_t)m->ndev);
		emit_permute_targets(m, op->attr, to[k]);
		for (int d = 0; d < m->ndev; d++)
			from[k][d] = -1;
		for (int d = 0; d < m->ndev; d++)
			if (to[k][d] >= 0 && to[k][d] < m->ndev)
				from[k][to[k][d]] = d;
	}
}

int verify_program(const Graph *prog, Diag *d)
{
	int ndev = prog->mesh.ndev, n = prog->ops.n, np = prog->stage_axis >= 0 ? prog->mesh.size[prog->stage_axis] : 1;
	/* devices of one stage coordinate run the same collectives: one list each */
	int **coll = xcalloc((size_t)np, sizeof *coll), *count = xcalloc((size_t)np, sizeof(int));
	const Graph **progs = xmalloc(sizeof *progs * (size_t)ndev);
	const int **colls = xmalloc(sizeof *colls * (size_t)ndev);
	int *ncoll = xmalloc(sizeof(int) * (size_t)ndev);
	int **to = xcalloc((size_t)n + 1, sizeof *to), **from = xcalloc((size_t)n + 1, sizeof *from);
	VerifyResult r;
	Sim s;
	sim_init(&s, &prog->mesh, ndev, &r);
	for (int i = 0; i < ndev; i++) {
		int c = np > 1 ? graph_stage_coord(prog, i) : 0;
		if (!coll[c])
			coll[c] = collectives_of(prog, i, &count[c]);
		progs[i] = prog, colls[i] = coll[c], ncoll[i] = count[c];
		r.ncoll += count[c];
	}
	program_partners(prog, to, from);
	s.prog = progs, s.coll = colls, s.ncoll = ncoll;
	s.to = (const int *const *)to, s.from = (const int *const *)from;
	sim_run(&s);
	if (!r.ok)
		diag_error(d, r.problem.pos, "the partitioned program fails its collective check (spmd verify): %s",
		           r.problem.msg);
	for (int k = 0; k < n; k++)
		free(to[k]), free(from[k]);
	for (int c = 0; c < np; c++)
		free(coll[c]);
	free(to), free(from), free(coll), free(count), free(progs), free(colls), free(ncoll);
	sim_free(&s);
	return r.ok ? 0 : -1;
}

void verify_report(const VerifyResult *r, Diag *d)
{
	if (!r->ok)
		diag_error(d, r->problem.pos, "%s", r->problem.msg);
}
