/* reshard_cache.c: reshard plans remembered, for one partition or shared
 * by many and their threads.
 *
 * A plan is a function of the two specs, the global shape, the element
 * size and the mesh's axis sizes and device order.  A model repeats its
 * reshards, and a search partitions hundreds of variants of one model on
 * one mesh, asking the planner the same few hundred questions tens of
 * thousands of times; here each is answered once.  One lock guards the
 * table, held while a missing plan is made: misses are few, and no plan
 * is made twice. */
#include "reshard.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	Spec from, to;
	int64_t dims[MAX_RANK];
	int rank, elem, naxes;
	int size[MESH_MAX_AXES];
} CacheKey;

typedef struct {
	CacheKey key;
	Mesh mesh; /* the plan's mesh: m's sizes and device order, without names (m may not outlive the plan) */
	ReshardPlan plan;
} CacheEntry;

struct ReshardCache {
	pthread_mutex_t lock;
	CacheEntry **e; /* each its own allocation: a plan handed out never moves */
	int n, cap;
	int *slots;     /* open addressing: indices into e, -1 empty */
	size_t nslots;  /* a power of two, at least twice n */
};

ReshardCache *reshard_cache_new(void)
{
	ReshardCache *c = xcalloc(1, sizeof *c);
	pthread_mutex_init(&c->lock, NULL);
	return c;
}

void reshard_cache_free(ReshardCache *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->n; i++) {
		reshard_plan_free(&c->e[i]->plan);
		free(c->e[i]);
	}
	free(c->e);
	free(c->slots);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static size_t key_slot(const CacheKey *k, size_t nslots) { return (size_t)hash_bytes(k, sizeof *k) & (nslots - 1); }

static void grow(ReshardCache *c)
{
	size_t n = c->nslots ? 2 * c->nslots : 256;
	int *slots = xmalloc(sizeof(int) * n);
	for (size_t i = 0; i < n; i++)
		slots[i] = -1;
	for (int e = 0; e < c->n; e++) {
		size_t i = key_slot(&c->e[e]->key, n);
		while (slots[i] >= 0)
			i = (i + 1) & (n - 1);
		slots[i] = e;
	}
	free(c->slots);
	c->slots = slots, c->nslots = n;
}

const ReshardPlan *reshard_cache_plan(ReshardCache *c, const Spec *from, const Spec *to, const Mesh *m,
                                     const int64_t *dims, int elem_size, Diag *d)
{
	CacheKey k;
	memset(&k, 0, sizeof k); /* compared with memcmp: no stray bytes */
	k.from = *from, k.to = *to, k.rank = from->rank, k.elem = elem_size, k.naxes = m->naxes;
	memcpy(k.dims, dims, sizeof(int64_t) * (size_t)k.rank);
	memcpy(k.size, m->size, sizeof(int) * (size_t)m->naxes);
	const ReshardPlan *out = NULL;
	pthread_mutex_lock(&c->lock);
	if (2 * ((size_t)c->n + 1) > c->nslots)
		grow(c);
	size_t i = key_slot(&k, c->nslots); /* device orders of one shape share a chain */
	for (; c->slots[i] >= 0; i = (i + 1) & (c->nslots - 1)) {
		const CacheEntry *e = c->e[c->slots[i]];
		if (memcmp(&e->key, &k, sizeof k) == 0 && mesh_same_order(&e->mesh, m))
			break;
	}
	if (c->slots[i] >= 0) {
		out = &c->e[c->slots[i]]->plan;
	} else {
		CacheEntry *e = xcalloc(1, sizeof *e);
		if (reshard_plan(&e->plan, from, to, m, dims, elem_size, d) != 0) {
			free(e);
		} else {
			e->key = k;
			e->mesh.naxes = m->naxes;
			memcpy(e->mesh.size, m->size, sizeof e->mesh.size);
			mesh_finish(&e->mesh, &e->plan.arena, m->devices); /* a permutation: m's own */
			e->plan.mesh = e->plan.mesh_to = &e->mesh;
			if (c->n == c->cap) {
				c->cap = c->cap ? 2 * c->cap : 64;
				c->e = xrealloc(c->e, sizeof *c->e * (size_t)c->cap);
			}
			c->slots[i] = c->n;
			c->e[c->n++] = e;
			out = &e->plan;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return out;
}
