/* reshard.h: the reshard planner — the collectives that turn a tensor laid out by spec A into spec B.
 *
 *   ReshardPlan p;
 *   int64_t dims[2] = {8, 16};
 *   if (reshard_plan(&p, &from, &to, &mesh, dims, 4, &diag) == 0) {
 *           for (int i = 0; i < p.nsteps; i++)
 *                   ... p.steps[i].kind, .axes, .bytes_sent_per_device ...
 *           reshard_plan_free(&p);
 *   }
 *
 * A plan is a list of steps; each is a local slice (no communication) or one
 * collective over one or more mesh axes.  Between steps every device holds a
 * buffer described by a ReshardLayout; the first is A's shard shape, the last
 * B's.  The planner searches the cheapest sequence by bytes sent per device
 * (ring model, docs/algorithms.md §2); docs/sharding.md explains the moves it tries
 * and the rules its plans follow.  Runtime execution: runtime/collectives.h. */
#ifndef SPMD_RESHARD_H
#define SPMD_RESHARD_H

#include "spec.h"

typedef enum {
	RS_SLICE,          /* local: keep a sub-block, re-pad; no communication */
	RS_ALL_REDUCE,
	RS_REDUCE_SCATTER,
	RS_ALL_GATHER,
	RS_ALL_TO_ALL,
	RS_PERMUTE,        /* collective_permute with an explicit device mapping */
	RS_KIND_COUNT
} ReshardKind;

extern const char *const reshard_kind_names[RS_KIND_COUNT]; /* "slice", "all_reduce", ... */

/* What every device holds between two steps.  Dim d is split major to minor
 * by the axes ax[d][0..nax[d]) into count = product of their sizes shards; the
 * device whose shard index (mixed radix of its coordinates on those axes) is k
 * holds global [k*block[d], k*block[d] + block[d]) clipped to the global size,
 * in a local buffer of extent block[d] whose tail past the size is padding.
 * A spec's own layout has block = ceil(size / count); intermediate layouts may
 * have larger blocks (after an all_gather of an uneven dim).  Axes of size 1
 * never appear.  Unused entries are zero, so layouts compare with memcmp. */
typedef struct {
	uint8_t nax[MAX_RANK];
	uint8_t ax[MAX_RANK][MESH_MAX_AXES];
	int64_t block[MAX_RANK];
	uint8_t partial; /* bit a: each device holds a summand over axis a */
} ReshardLayout;

typedef struct {
	ReshardKind kind;
	int nax;
	int axes[MESH_MAX_AXES];   /* collective's axes, major to minor (permute: the axes it moves data along) */
	int dim;                   /* all_gather, reduce_scatter: the dim; all_to_all: split dim; else -1 */
	int dim2;                  /* all_to_all: concat dim; else -1 */
	int reduce;                /* all_reduce, reduce_scatter: REDUCE_SUM or REDUCE_MAX */
	ReshardLayout before, after;
	int64_t bytes_per_device;      /* the buffer each device hands to the collective (slice: 0) */
	int64_t bytes_sent_per_device; /* on a ring: see docs/sharding.md */
	int *target;               /* RS_PERMUTE: device d sends its buffer to target[d] (ndev entries) */
	bool fallback;             /* an all_gather whose data a later slice drops again */
	bool to_target_mesh;       /* a permute onto the target mesh's device order (always last) */
} ReshardStep;

typedef struct {
	int rank;
	int64_t dims[MAX_RANK];  /* the global shape */
	int elem_size;           /* bytes per element, for the byte counts */
	int ndev;
	int nsteps;
	ReshardStep *steps;
	int64_t bytes_per_device, bytes_sent_per_device; /* sums over the steps */
	bool fallback;           /* some step is a fallback */
	ReshardLayout from, to;  /* the source's and the target's layout */
	const Mesh *mesh;        /* every layout but `to` is on it (not owned) */
	const Mesh *mesh_to;     /* `to` is on it: mesh, or mto */
	Arena arena;             /* steps and permute maps */
} ReshardPlan;

/* Plan from spec `from` to spec `to` for a tensor of global shape dims[0..rank)
 * (rank = from->rank) on mesh m.  The target may keep partial axes of the
 * source (same reduction) but not add new ones.  0, or -1 after reporting to d
 * (then p holds nothing to free).  Free with reshard_plan_free. */
int reshard_plan(ReshardPlan *p, const Spec *from, const Spec *to, const Mesh *m, const int64_t *dims, int elem_size,
                 Diag *d);
/* The same when the target lives on a mesh with the same axes but another
 * device order (mto).  Every step but a final permute runs on p->mesh: mfrom,
 * or mto when the source holds the same data in both orders (replicated). */
int reshard_plan_meshes(ReshardPlan *p, const Spec *from, const Mesh *mfrom, const Spec *to, const Mesh *mto,
                        const int64_t *dims, int elem_size, Diag *d);
void reshard_plan_free(ReshardPlan *p);

/* Plans remembered (reshard_cache.c): for one partition, or shared by
 * many, on any thread.  A plan depends only on the specs, the global
 * shape, the element size and the mesh's sizes and device order. */
typedef struct ReshardCache ReshardCache;
ReshardCache *reshard_cache_new(void);
void reshard_cache_free(ReshardCache *c); /* NULL: nothing */
/* The plan of reshard_plan, made once and kept in c: the cache's (its mesh
 * pointers name a copy of m's sizes and device order, without names), or
 * NULL when the planner refuses (its message in d; nothing kept). */
const ReshardPlan *reshard_cache_plan(ReshardCache *c, const Spec *from, const Spec *to, const Mesh *m,
                                     const int64_t *dims, int elem_size, Diag *d);

/* The layout of a spec (size-1 axes dropped; open marks ignored). */
void reshard_layout_of(ReshardLayout *l, const Spec *s, const Mesh *m, const int64_t *dims);
/* The spec a layout shards by (axes and partial; reduce as given).  Its
 * local shape is l->block, which after an uneven all_gather can exceed the
 * spec's own ceil-divided shard shape. */
void reshard_layout_spec(const ReshardLayout *l, int rank, int reduce, Spec *s);
/* Shard count of dim d, and a device's shard index per dim / summand index. */
int64_t reshard_layout_count(const ReshardLayout *l, const Mesh *m, int d);
void reshard_layout_index(const ReshardLayout *l, const Mesh *m, int rank, int device, int64_t *index);
int reshard_layout_summand(const ReshardLayout *l, const Mesh *m, int device);
/* "collective_permute [data, model]" style one-line description of a step. */
void reshard_step_format(const ReshardStep *s, const Mesh *m, char *buf, size_t n);

/* What a device sends on a ring in a collective of kind k over n devices
 * when it hands in a buffer of `bytes` (docs/sharding.md). */
int64_t reshard_bytes_sent(ReshardKind k, int64_t bytes, int64_t n);

#endif
