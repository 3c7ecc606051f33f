/* threads.c: the thread backend — devices as pthreads, collectives through shared memory and per-group rendezvous. */
#include "threads.h"

#include <cblas.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A rendezvous of one set of devices: the k-th wait of each member on the
 * same set meets the k-th of the others.  Members of a set call its
 * collectives in the same order (the program is SPMD over each group), so
 * the set alone names the rendezvous; groups that share no device never
 * wait for each other. */
typedef struct Slot {
	struct Slot *next;
	int n;             /* members */
	int *dev;          /* sorted */
	int waiting;       /* members in this rendezvous */
	unsigned long gen; /* rendezvous generation */
} Slot;

enum { NBUCKETS = 256 };

typedef struct {
	int ndev;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int waiting;       /* threads blocked in some rendezvous */
	int finished;      /* threads whose device function returned */
	bool abort;
	Slot *bucket[NBUCKETS];
	const void **in;   /* per device: its published input buffer */
	void **out;        /* per device: its published output buffer */
} Shared;

static void set_abort(Shared *s)
{
	pthread_mutex_lock(&s->mu);
	s->abort = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static unsigned set_hash(const int *dev, int n)
{
	unsigned h = 2166136261u;
	for (int i = 0; i < n; i++)
		h = (h ^ (unsigned)dev[i]) * 16777619u;
	return h % NBUCKETS;
}

/* The slot of the sorted set dev[0..n), made on first use (under s->mu). */
static Slot *slot_of(Shared *s, const int *dev, int n)
{
	unsigned h = set_hash(dev, n);
	for (Slot *t = s->bucket[h]; t; t = t->next)
		if (t->n == n && memcmp(t->dev, dev, sizeof(int) * (size_t)n) == 0)
			return t;
	Slot *t = xcalloc(1, sizeof *t);
	t->n = n;
	t->dev = xmalloc(sizeof(int) * (size_t)n);
	memcpy(t->dev, dev, sizeof(int) * (size_t)n);
	t->next = s->bucket[h];
	s->bucket[h] = t;
	return t;
}

/* Wait until every device of the sorted set dev[0..n) arrives; -1 if the run
 * is aborted meanwhile, or if every device still running is blocked (some
 * device returned or waits elsewhere: nobody can ever complete a rendezvous). */
static int set_wait(Shared *s, const int *dev, int n)
{
	if (n <= 1)
		return s->abort ? -1 : 0;
	pthread_mutex_lock(&s->mu);
	Slot *t = slot_of(s, dev, n);
	unsigned long gen = t->gen;
	int rc = 0;
	if (s->abort)
		rc = -1;
	else if (++t->waiting == n) {
		t->waiting = 0;
		t->gen++;
		s->waiting -= n - 1;
		pthread_cond_broadcast(&s->cv);
	} else if (++s->waiting + s->finished == s->ndev) {
		s->abort = true;
		pthread_cond_broadcast(&s->cv);
		rc = -1;
	} else {
		while (t->gen == gen && !s->abort)
			pthread_cond_wait(&s->cv, &s->mu);
		rc = t->gen == gen ? -1 : 0;
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

static int th_barrier(Backend *b, int device)
{
	Shared *s = b->impl;
	int *all = xmalloc(sizeof(int) * (size_t)s->ndev);
	for (int d = 0; d < s->ndev; d++)
		all[d] = d;
	int rc = set_wait(s, all, s->ndev);
	free(all);
	return rc;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* A collective's members: the group in member order, and sorted (the rendezvous' key). */
typedef struct {
	int n, self;
	int *g, *sorted;
} Group;

static void group_free(Group *gr)
{
	free(gr->g);
	free(gr->sorted);
}

static int group_wait(Shared *s, const Group *gr) { return set_wait(s, gr->sorted, gr->n); }

/* The device's group over c's axes, its size and own index. */
static Group group_of(const Backend *b, int device, const Coll *c)
{
	Group gr = {1, 0, NULL, NULL};
	for (int i = 0; i < c->nax; i++)
		gr.n *= b->mesh->size[c->axes[i]];
	gr.g = xmalloc(sizeof(int) * (size_t)gr.n);
	gr.sorted = xmalloc(sizeof(int) * (size_t)gr.n);
	gr.self = mesh_group(b->mesh, device, c->axes, c->nax, gr.g);
	memcpy(gr.sorted, gr.g, sizeof(int) * (size_t)gr.n);
	qsort(gr.sorted, (size_t)gr.n, sizeof(int), cmp_int);
	return gr;
}

static int64_t numel_of(const Coll *c)
{
	int64_t n = 1;
	for (int d = 0; d < c->rank; d++)
		n *= c->shape[d];
	return n;
}

/* Publish in (and out), then wait for the group. */
static int publish(Shared *s, const Group *gr, int device, const void *in, void *out)
{
	s->in[device] = in;
	s->out[device] = out;
	return group_wait(s, gr);
}

/* Each member reduces its own 1/n of the flat buffer over the whole group, in
 * member order; then everyone copies the other members' pieces. */
static int th_all_reduce(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Shared *s = b->impl;
	Group gr = group_of(b, device, c);
	int n = gr.n, k = gr.self, *g = gr.g, rc = publish(s, &gr, device, in, out);
	int64_t N = numel_of(c), lo = N * k / n, len = N * (k + 1) / n - lo;
	if (rc == 0) {
		memcpy((char *)out + lo * 4, (const char *)s->in[g[0]] + lo * 4, (size_t)len * 4);
		for (int j = 1; j < n; j++)
			coll_reduce_box(1, &len, s->in[g[j]], &N, &lo, out, &N, &lo, c->dtype, c->reduce);
		rc = group_wait(s, &gr);
	}
	for (int j = 0; j < n && rc == 0; j++) {
		int64_t jl = N * j / n, jn = N * (j + 1) / n - jl;
		if (j != k)
			memcpy((char *)out + jl * 4, (const char *)s->out[g[j]] + jl * 4, (size_t)jn * 4);
	}
	if (rc == 0)
		rc = group_wait(s, &gr);
	group_free(&gr);
	return rc;
}

static int th_reduce_scatter(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Shared *s = b->impl;
	Group gr = group_of(b, device, c);
	int n = gr.n, *g = gr.g, rc = publish(s, &gr, device, in, out);
	int64_t ext[MAX_RANK], off[MAX_RANK] = {0}, zero[MAX_RANK] = {0};
	memcpy(ext, c->shape, sizeof ext);
	ext[c->dim] = c->shape[c->dim] / n;
	off[c->dim] = gr.self * ext[c->dim];
	if (rc == 0) {
		coll_copy_box(c->rank, ext, s->in[g[0]], c->shape, off, out, ext, zero);
		for (int j = 1; j < n; j++)
			coll_reduce_box(c->rank, ext, s->in[g[j]], c->shape, off, out, ext, zero, c->dtype, c->reduce);
		rc = group_wait(s, &gr);
	}
	group_free(&gr);
	return rc;
}

static int th_all_gather(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Shared *s = b->impl;
	Group gr = group_of(b, device, c);
	int n = gr.n, *g = gr.g, rc = publish(s, &gr, device, in, out);
	int64_t od[MAX_RANK], off[MAX_RANK] = {0}, zero[MAX_RANK] = {0};
	memcpy(od, c->shape, sizeof od);
	od[c->dim] *= n;
	for (int j = 0; j < n && rc == 0; j++) {
		off[c->dim] = j * c->shape[c->dim];
		coll_copy_box(c->rank, c->shape, s->in[g[j]], c->shape, zero, out, od, off);
	}
	if (rc == 0)
		rc = group_wait(s, &gr);
	group_free(&gr);
	return rc;
}

static int th_all_to_all(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Shared *s = b->impl;
	Group gr = group_of(b, device, c);
	int n = gr.n, *g = gr.g, rc = publish(s, &gr, device, in, out);
	int64_t ext[MAX_RANK], od[MAX_RANK], so[MAX_RANK] = {0}, dof[MAX_RANK] = {0};
	memcpy(ext, c->shape, sizeof ext);
	ext[c->dim] = c->shape[c->dim] / n;
	memcpy(od, ext, sizeof od);
	od[c->dim2] *= n;
	so[c->dim] = gr.self * ext[c->dim];
	for (int j = 0; j < n && rc == 0; j++) {
		dof[c->dim2] = j * ext[c->dim2];
		coll_copy_box(c->rank, ext, s->in[g[j]], c->shape, so, out, od, dof);
	}
	if (rc == 0)
		rc = group_wait(s, &gr);
	group_free(&gr);
	return rc;
}

/* The devices a permute links to device: the chain or cycle of sends through
 * it (each device sends to at most one and hears from at most one), sorted.
 * Only they meet: a device that neither sends nor receives waits for nobody. */
static Group permute_chain(const Backend *b, int device, const Coll *c, int *src)
{
	int ndev = b->mesh->ndev, *from = xmalloc(sizeof(int) * (size_t)ndev);
	for (int d = 0; d < ndev; d++)
		from[d] = -1;
	for (int d = 0; d < ndev; d++)
		if (c->target[d] >= 0 && c->target[d] != d && from[c->target[d]] < 0)
			from[c->target[d]] = d;
	*src = c->target[device] == device ? device : from[device];
	int head = device, n = 1;
	while (from[head] >= 0 && from[head] != device)
		head = from[head];
	for (int d = head; c->target[d] >= 0 && c->target[d] != d && c->target[d] != head && n < ndev; d = c->target[d])
		n++;
	Group gr = {n, 0, xmalloc(sizeof(int) * (size_t)n), xmalloc(sizeof(int) * (size_t)n)};
	for (int i = 0, d = head; i < n; i++, d = c->target[d])
		gr.sorted[i] = gr.g[i] = d;
	qsort(gr.sorted, (size_t)n, sizeof(int), cmp_int);
	free(from);
	return gr;
}

static int th_permute(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Shared *s = b->impl;
	int src;
	Group gr = permute_chain(b, device, c, &src);
	int rc = publish(s, &gr, device, in, out);
	if (rc == 0) {
		if (src >= 0)
			memcpy(out, s->in[src], (size_t)numel_of(c) * 4);
		else
			memset(out, 0, (size_t)numel_of(c) * 4);
		rc = group_wait(s, &gr);
	}
	group_free(&gr);
	return rc;
}

/* ---- running ---- */

typedef struct {
	Shared *s;
	Backend *b;
	DeviceFn fn;
	void *arg;
	int device, rc;
} ThreadArg;

static void *thread_main(void *p)
{
	ThreadArg *t = p;
	t->rc = t->fn(t->device, t->arg, t->b);
	Shared *s = t->s;
	pthread_mutex_lock(&s->mu);
	s->finished++;
	if (t->rc != 0 || (s->waiting > 0 && s->waiting + s->finished == s->ndev)) {
		s->abort = true;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static _Thread_local char start_error[160];

const char *threads_start_error(void) { return start_error; }

/* Start a thread per device, join them all; the number that failed to start
 * (start_error says why). */
static int start_join(Shared *s, ThreadArg *ta, int n)
{
	pthread_t *th = xmalloc(sizeof *th * (size_t)n);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, (size_t)4 << 20);
	int started = 0, err = 0;
	for (; started < n; started++)
		if ((err = pthread_create(&th[started], &attr, thread_main, &ta[started])) != 0)
			break;
	if (started < n) {
		snprintf(start_error, sizeof start_error, "cannot start thread %d of %d (one per device): %s", started + 1, n,
		         strerror(err));
		set_abort(s);
	}
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_attr_destroy(&attr);
	free(th);
	return n - started;
}

int threads_run(const Mesh *m, DeviceFn fn, void *arg)
{
	if (m->ndev > 1) /* one core per device: BLAS's own threads would compete with them */
		openblas_set_num_threads(1);
	int n = m->ndev;
	if (n <= 0 || n > THREADS_MAX_DEVICES) {
		snprintf(start_error, sizeof start_error, "expected 1 to %d devices for the thread backend, found %d",
		         THREADS_MAX_DEVICES, n);
		return THREADS_NOT_STARTED;
	}
	Shared s = {.ndev = n};
	pthread_mutex_init(&s.mu, NULL);
	pthread_cond_init(&s.cv, NULL);
	s.in = xcalloc((size_t)n, sizeof *s.in);
	s.out = xcalloc((size_t)n, sizeof *s.out);
	Backend b = {.mesh = m, .impl = &s, .all_reduce = th_all_reduce, .reduce_scatter = th_reduce_scatter,
	             .all_gather = th_all_gather, .all_to_all = th_all_to_all, .permute = th_permute,
	             .barrier = th_barrier};
	ThreadArg *ta = xcalloc((size_t)n, sizeof *ta);
	for (int i = 0; i < n; i++)
		ta[i] = (ThreadArg){&s, &b, fn, arg, i, 0};
	int rc = 0;
	if (start_join(&s, ta, n))
		rc = THREADS_NOT_STARTED;
	for (int i = 0; i < n && rc == 0; i++)
		rc = ta[i].rc ? THREADS_FAILED : 0;
	if (s.abort && rc == 0)
		rc = THREADS_FAILED;
	free(ta);
	for (int h = 0; h < NBUCKETS; h++)
		for (Slot *t = s.bucket[h], *next; t; t = next) {
			next = t->next;
			free(t->dev);
			free(t);
		}
	free(s.in);
	free(s.out);
	pthread_mutex_destroy(&s.mu);
	pthread_cond_destroy(&s.cv);
	return rc;
}

/* ---- checking a plan on deterministic data ---- */

/* Element i of the global tensor: a multiple of 1/4 in [-12.5, 12.5]. */
static float global_value(int64_t i) { return (float)((i * 37 + 11) % 101 - 50) * 0.25f; }
/* A summand that is not the first one: a multiple of 1/2 in [-2, 2]. */
static float extra_part(int64_t i, int t) { return (float)((i * 13 + t * 7) % 9 - 4) * 0.5f; }

/* Summand t of n of element i, so that the n summands reduce to the value. */
static float part_value(int64_t i, int t, int n, int reduce)
{
	float g = global_value(i);
	if (reduce == REDUCE_MAX)
		return t == i % n ? g : g - 1.0f - (float)t;
	if (t > 0)
		return extra_part(i, t);
	for (int u = 1; u < n; u++)
		g -= extra_part(i, u);
	return g;
}

static void store(void *buf, int64_t k, float v, DType dt)
{
	if (dt == DT_I32)
		((int32_t *)buf)[k] = (int32_t)(v * 4);
	else
		((float *)buf)[k] = v;
}

static float load(const void *buf, int64_t k, DType dt)
{
	return dt == DT_I32 ? (float)((const int32_t *)buf)[k] / 4 : ((const float *)buf)[k];
}

typedef struct {
	int n;
	const Mesh *mesh;     /* this run: the plans planned on it */
	const ReshardPlan *p; /* n plans */
	const Spec *from, *to;
	DType dt;
	void **out;           /* [plan * ndev + device]: the result */
} CheckRun;

/* Local element k of a buffer of shape local holding the block at offset
 * off: its flat global index, or -1 for padding. */
static int64_t global_index(const ReshardPlan *p, const int64_t *local, const int64_t *off, int64_t k)
{
	int64_t flat = 0, stride = 1;
	for (int d = p->rank - 1; d >= 0; d--) {
		int64_t i = off[d] + k % local[d];
		k /= local[d];
		if (i >= p->dims[d])
			return -1;
		flat += i * stride;
		stride *= p->dims[d];
	}
	return flat;
}

/* The device's shard of the source: its summand of the global tensor. */
static void *make_input(const ReshardPlan *p, const Spec *from, int device, DType dt)
{
	int64_t local[MAX_RANK], off[MAX_RANK], ext[MAX_RANK];
	spec_shard_shape(from, p->mesh, p->dims, local);
	spec_shard_region(from, p->mesh, p->dims, device, off, ext);
	int64_t n = coll_layout_numel(&p->from, p->rank);
	int nparts = mesh_axes_size(p->mesh, from->partial), t = spec_partial_index(from, p->mesh, device);
	void *in = xcalloc((size_t)n, 4);
	for (int64_t k = 0; k < n; k++) {
		int64_t gi = global_index(p, local, off, k);
		if (gi >= 0)
			store(in, k, part_value(gi, t, nparts, from->reduce), dt);
	}
	return in;
}

static int check_device(int device, void *arg, Backend *b)
{
	CheckRun *r = arg;
	int ndev = r->mesh->ndev;
	for (int i = 0; i < r->n; i++) {
		const ReshardPlan *p = &r->p[i];
		if (p->mesh != r->mesh)
			continue;
		void *in = make_input(p, &r->from[i], device, r->dt);
		void *out = xcalloc((size_t)coll_layout_numel(&p->to, p->rank), 4);
		r->out[i * ndev + device] = out;
		int rc = coll_plan_run(p, b, device, r->dt, in, out);
		free(in);
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* Compare device dev's result (reduced over its partial group) with the
 * global tensor; 0, or 1 after describing the first difference. */
static int compare_device(const ReshardPlan *p, const Spec *to, void *const *out, DType dt, int dev, char *msg,
                          size_t n)
{
	const Mesh *m = p->mesh_to;
	int64_t local[MAX_RANK], off[MAX_RANK], ext[MAX_RANK], numel = 1;
	spec_shard_shape(to, m, p->dims, local);
	spec_shard_region(to, m, p->dims, dev, off, ext);
	for (int d = 0; d < p->rank; d++) {
		numel *= local[d];
		if (local[d] != p->to.block[d]) {
			snprintf(msg, n, "device %d: local dim %d is %lld, expected %lld", dev, d,
			         (long long)p->to.block[d], (long long)local[d]);
			return 1;
		}
	}
	int axes[MESH_MAX_AXES], nax = 0, group[THREADS_MAX_DEVICES];
	for (int a = 0; a < m->naxes; a++)
		if (to->partial >> a & 1)
			axes[nax++] = a;
	int gsize = mesh_axes_size(m, to->partial);
	mesh_group(m, dev, axes, nax, group);
	for (int64_t k = 0; k < numel; k++) {
		int64_t gi = global_index(p, local, off, k);
		float got = load(out[group[0]], k, dt);
		for (int j = 1; j < gsize; j++) {
			float x = load(out[group[j]], k, dt);
			got = to->reduce == REDUCE_MAX ? (x > got ? x : got) : got + x;
		}
		float want = gi < 0 ? 0 : global_value(gi);
		if (got != want) {
			snprintf(msg, n, "device %d: local element %lld (%s) is %g, expected %g", dev, (long long)k,
			         gi < 0 ? "padding" : "data", got, want);
			return 1;
		}
	}
	return 0;
}

int threads_check_plans(int n, const ReshardPlan *p, const Spec *from, const Spec *to, DType dt, int *bad,
                        char *msg, size_t len)
{
	int ndev = n ? p[0].mesh->ndev : 0, rc = 0;
	*bad = -1;
	if (n == 0)
		return 0;
	CheckRun r = {n, NULL, p, from, to, dt, xcalloc((size_t)n * (size_t)ndev, sizeof(void *))};
	for (int i = 0; i < n && rc == 0; i++) { /* one run per mesh the plans run on */
		bool seen = false;
		for (int j = 0; j < i; j++)
			seen |= p[j].mesh == p[i].mesh;
		r.mesh = p[i].mesh;
		int run = seen ? 0 : p[i].mesh->ndev != ndev ? THREADS_FAILED : threads_run(r.mesh, check_device, &r);
		if (run == THREADS_NOT_STARTED)
			snprintf(msg, len, "%s", threads_start_error());
		else if (run != 0)
			snprintf(msg, len, "the run on %d threads failed", ndev);
		rc = run;
	}
	for (int i = 0; i < n && rc == 0; i++)
		for (int dev = 0; dev < ndev && rc == 0; dev++)
			if ((rc = compare_device(&p[i], &to[i], r.out + (size_t)i * ndev, dt, dev, msg, len)) != 0)
				*bad = i;
	for (int i = 0; i < n * ndev; i++)
		free(r.out[i]);
	free(r.out);
	if (rc == 0)
		snprintf(msg, len, "ok");
	return rc;
}

int threads_check_plan(const ReshardPlan *p, const Spec *from, const Spec *to, DType dt, char *msg, size_t n)
{
	int bad;
	return threads_check_plans(1, p, from, to, dt, &bad, msg, n);
}
