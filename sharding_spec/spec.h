/* spec.h: a tensor's sharding over a mesh, tile math, parsing and printing. */
#ifndef SPMD_SPEC_H
#define SPMD_SPEC_H

#include "../mesh/mesh.h"

enum { REDUCE_SUM = 0, REDUCE_MAX = 1 };

/* A sharding: per dimension d, the mesh axes ax[d][0..nax[d]) that split it,
 * major to minor; the axes in `partial` hold a pending reduction (`reduce`);
 * every other axis is replicated.  `open` marks dims an annotation leaves to
 * propagation.  A zeroed Spec of the right rank is fully replicated. */
typedef struct {
	uint8_t rank;
	uint8_t nax[MAX_RANK];
	uint8_t ax[MAX_RANK][MESH_MAX_AXES];
	uint8_t partial; /* bit a: axis a is partial */
	uint8_t reduce;  /* REDUCE_SUM or REDUCE_MAX, when partial != 0 */
	uint8_t open;    /* bit d: dim d open to propagation */
} Spec;

struct YNode;

/* Logical axis names (a model's axis_rules:, docs/sharding.md): each name
 * stands for a list of mesh axes, possibly none, wherever a sharding may
 * name a mesh axis.  `axes` holds the targets present in the mesh, in the
 * order written; targets the mesh lacks are left out (the loader warns). */
typedef struct {
	const char *name;
	Pos pos;                       /* the rule's key, for messages */
	uint8_t n;                     /* mesh axes it resolves to */
	uint8_t axes[MESH_MAX_AXES];
} AxisRule;

typedef struct {
	AxisRule *a;
	int n;
} AxisRules;

/* The rule called name, or NULL (rules may be NULL). */
const AxisRule *axis_rules_find(const AxisRules *rules, const char *name);

/* Parse a sharding in any of its YAML forms for a tensor of `rank` dims on
 * mesh m: the list form `[data, null]`, `[[data, model], null]`, with `_`
 * or `?` for a dim left open to propagation; or the mapping form
 * `{dims: [null, model], partial: [data]}` / `partial: {axes: [data], reduce: max}`.
 * Checks: known axes, each axis at most once (dims and partial together),
 * one entry per dim.  0, or -1 after reporting at the offending node. */
int spec_parse(Spec *s, const struct YNode *n, const Mesh *m, int rank, Diag *d);
/* The same where a name may also be a logical axis of rules (NULL: none):
 * it stands for the mesh axes it resolves to, in place (none: the entry
 * adds no split).  A mesh axis reached twice, directly or through logical
 * names, is an error naming both. */
int spec_parse_rules(Spec *s, const struct YNode *n, const Mesh *m, const AxisRules *rules, int rank, Diag *d);
/* An annotation in a model: as spec_parse_rules, and the mapping form may
 * carry `priority: N` (0 to SPEC_MAX_PRIORITY; the propagation round that
 * applies it), stored in *priority, 0 when absent. */
enum { SPEC_MAX_PRIORITY = 100 };
int spec_parse_annotation(Spec *s, int *priority, const struct YNode *n, const Mesh *m, const AxisRules *rules,
                          int rank, Diag *d);
/* Print a spec in the form spec_parse reads: "[data, null]",
 * "[[data, model], null]", "{dims: [null, model], partial: [data]}". */
void spec_format(const Spec *s, const Mesh *m, char *buf, size_t n);

/* ---- tile math (docs/sharding.md) ----
 * Dim d of a global size D is cut into n = spec_dim_shards() shards of the
 * padded size c = ceil(D / n): every device holds the same local shape, and
 * shard k covers [k*c, k*c + c) clipped to [0, D).  A device's shard index on
 * dim d is the mixed-radix number of its coordinates on ax[d][0..], the first
 * axis most significant.  `global`, `local`, `offset`, `extent` and `index`
 * hold s->rank entries. */
int64_t spec_dim_shards(const Spec *s, const Mesh *m, int d);
void spec_shard_shape(const Spec *s, const Mesh *m, const int64_t *global, int64_t *local);
void spec_shard_index(const Spec *s, const Mesh *m, int device, int64_t *index);
/* Offset of device's shard and its valid extent, clamp(D - offset, 0, c):
 * the last shards may be short or empty; the rest of the local buffer is padding. */
void spec_shard_region(const Spec *s, const Mesh *m, const int64_t *global, int device, int64_t *offset,
                       int64_t *extent);
/* Which summand a device holds: the mixed-radix number of its coordinates on
 * the partial axes (0 when there are none). */
int spec_partial_index(const Spec *s, const Mesh *m, int device);
/* Mask of the axes that split some dim (partial axes not included). */
unsigned spec_dim_axes(const Spec *s);
/* True if the axis neither splits a dim nor is partial. */
bool spec_replicated_over(const Spec *s, int axis);
bool spec_eq(const Spec *a, const Spec *b);
/* Axes in range, each at most once over dims and partial. */
bool spec_is_valid(const Spec *s, const Mesh *m);
/* The same sharding on `to`, a cut of mesh `from` (mesh_cut): each axis
 * replaced by its pieces.  0 (always, as a cut mesh has at most
 * MESH_MAX_AXES axes; -1 would mean a dim needs more). */
int spec_remap(Spec *s, const Mesh *from, const Mesh *to);
/* Cut m for every sub-axis named in the YAML tree n ("model:(1)4" as a
 * scalar anywhere in it), so that the shardings and collectives in it can
 * be parsed: run before parsing them, while no spec holds axis ids of m.
 * Names that are not valid sub-axes of m are left for the parser to
 * report. */
void spec_cut_mesh(Mesh *m, Arena *a, const struct YNode *n);

#endif
