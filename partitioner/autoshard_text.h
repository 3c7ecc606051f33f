/* autoshard_text.h: a model's YAML written back with a sharding plan in it (autoshard.c's helper). */
#ifndef SPMD_AUTOSHARD_TEXT_H
#define SPMD_AUTOSHARD_TEXT_H

#include "../base/yaml.h"
#include "../mesh/mesh.h"
#include "../sharding_spec/spec.h"

/* What replaces the model's own: the mesh, each leaf's sharding (and for
 * params its weight_update_sharding, 0: none written, else WusMode + 1),
 * the sharding of the op results the plan pins, and
 * for a training step with set_train the section's weight_update_sharding
 * (off: the params say) and all_gather; for a pipeline the microbatch
 * count, whether the cost model cuts the stages, and the schedule and
 * recompute where the search chose them. */
typedef struct {
	const Mesh *mesh;
	bool mesh_long;          /* write {axes: ...} (the model used that form; so does a hardware) */
	const char *hardware;    /* the mesh's hardware: the plan's profile, the model's, or NULL */
	int nleaf;
	const char *const *leaf; /* input and param names */
	const Spec *spec;
	const int8_t *wus;
	const int8_t *gather;    /* per leaf: a param's own all_gather (AG_AFTER_UPDATE...), 0: none written; or NULL */
	const uint8_t *as_group; /* per leaf: its sharding kept as written (annotated, or a sharding group's), not
	                          * spec's; or NULL */
	int nact;                /* op results pinned: their names and shardings */
	const char *const *act;
	const Spec *act_spec;
	bool set_train, gather_before_use;
	int train_recompute;     /* with set_train: the train: section's recompute written (RECOMPUTE_ALL: true,
	                          * RECOMPUTE_SELECTIVE: selective), or RECOMPUTE_OFF: the model's */
	int prefetch;            /* with gather_before_use: weights ahead (written unless PREFETCH_DEFAULT) */
	int64_t microbatches;    /* > 0: the pipeline: section's microbatches */
	bool set_schedule, set_recompute; /* write the pipeline: section's schedule, recompute as these */
	int schedule;            /* a PipeSchedule */
	int virtual_stages;      /* with set_schedule interleaved: its virtual stages */
	bool recompute;
	bool stages_auto;        /* the pipeline: section gets stages: auto and the ops lose their stage: keys */
	int hint;                /* where the last leaf was found (plan_text's own cursor) */
} PlanText;

/* The document root (a mapping) written as YAML with p's choices in place
 * of the model's: a new string (free it). */
char *plan_text(const YNode *root, PlanText *p);

/* A chain of repeated layers: names whose first run of digits reads k,
 * first <= k < first + n, belong to layer k. */
typedef struct {
	long first, n;
} LayerRange;

/* The layer of name (the value of its first digit run) or -1 when it has
 * none; *at and *len get that run's place. */
long layer_of(const char *name, size_t *at, size_t *len);

/* The model with only the first `keep` layers of r: entries of inputs,
 * params and ops in a later layer are left out, and references to values
 * of a later layer (op operands, outputs) read the same value of the last
 * layer kept.  A new string (free it). */
char *proxy_text(const YNode *root, const LayerRange *r, long keep);

#endif
