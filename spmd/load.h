/* load.h: reading a model file (YAML) into a Graph.
 *
 *   Graph g;
 *   Diag d; diag_init(&d);
 *   if (model_load(&g, "mlp.yaml", &d) != 0) { graph_free(&g); return 2; }
 *   ...
 *   graph_free(&g);
 *
 * The format:
 *   name: mlp                        # optional
 *   mesh: {data: 2, model: 4}        # or {axes: {...}, devices: [...], hardware: NAME}
 *   inputs:  {x: {shape: [32, 512], dtype: f32, sharding: [data, null]}}
 *   params:  {w: {shape: [512, 10], init: {normal: 0.02}}}
 *   ops:     [{out: y, op: einsum, eq: "bd,df->bf", in: [x, w]}]
 *   outputs: [y]
 * Errors are reported as FILE:LINE:COL: error: expected ..., found ....  The
 * loader reports as many errors as it sensibly can, and on any error returns
 * -1: the graph must then not be used (only freed). */
#ifndef SPMD_LOAD_H
#define SPMD_LOAD_H

#include "ops.h"

/* Load a model file into g.  g is initialised here (graph_init; anything it
 * held before is not freed); free it with graph_free whatever the result.
 * 0, or -1 after reporting errors to d. */
int model_load(Graph *g, const char *path, Diag *d);
/* The same from a string; name is the file name used in messages. */
int model_load_string(Graph *g, const char *text, const char *name, Diag *d);

/* Options of a load (the commands' --mesh and --axis-rules).  mesh: a
 * "data=4,model=2" text that replaces the model's mesh before any sharding
 * is read, so annotations may name its axes (or logical ones); axis_rules:
 * a YAML file holding an axis_rules: mapping that replaces the model's.
 * Either may be NULL. */
typedef struct {
	const char *mesh;
	const char *axis_rules;
} LoadOpts;
int model_load_opts(Graph *g, const char *path, const LoadOpts *o, Diag *d);
/* model_load_string with options. */
int model_load_string_opts(Graph *g, const char *text, const char *name, const LoadOpts *o, Diag *d);

/* What a file's top level says it is. */
typedef struct {
	bool spmd;  /* a partitioned program (`spmd: true`): local shapes, collectives */
	int device; /* a per-device program's `device: N`, or -1 */
} LoadKind;

/* Load a model or a partitioned program (docs/format.md, "Partitioned
 * programs"; model_load refuses programs).  kind (may be NULL) gets which. */
int program_load(Graph *g, const char *path, LoadKind *kind, Diag *d);
int program_load_string(Graph *g, const char *text, const char *name, LoadKind *kind, Diag *d);
/* program_load with the options of a model load (applied when the file is a model). */
int program_load_opts(Graph *g, const char *path, LoadKind *kind, const LoadOpts *o, Diag *d);

/* For the attribute parsers (spmd/attrs.c).  When an attribute parser runs,
 * op->in holds valid operand ids, so operand shapes can be read from the
 * graph; the graph's arena is where attribute data that must outlive the
 * YAML document goes (op->attr->eq). */
Graph *load_graph(struct LoadCtx *lc);
Diag *load_diag(struct LoadCtx *lc);
/* The value id a name node refers to; -1 after reporting an unknown name,
 * negative for a value whose definition failed (already reported). */
int load_name(struct LoadCtx *lc, const struct YNode *n);
/* Do specs a and b lay a tensor out alike on mesh m (axes of size 1 do not count)? */
bool load_same_layout(const Spec *a, const Spec *b, const Mesh *m);
/* A shape ([D, ...], each D >= 1, rank <= 8, at most 2^40 elements) at n.  0, or -1 after reporting. */
int load_shape(struct LoadCtx *lc, const struct YNode *n, Shape *s);

/* The attribute keys an op accepts besides out, op, in and sharding;
 * NULL-terminated (spmd/attrs.c). */
const char *const *attr_keys(OpKind k);

#endif
