/* ir.h: the program representation — values and ops in dense arrays with integer ids.
 *
 * A Graph owns everything it points to through its arena.  Ops are kept in
 * topological order (the order of the YAML file); every op has exactly one
 * result value.  Values and ops remember the file:line:col they came from.
 *
 *   Graph g; graph_init(&g);
 *   int x = graph_value(&g, "x", DT_F32, shape, VK_INPUT, pos);
 *   int y = graph_value(&g, "y", DT_F32, shape, VK_INTER, pos);
 *   int op = graph_op(&g, OP_RELU, (int[]){x}, 1, y, pos);
 *   ...
 *   graph_free(&g);
 */
#ifndef SPMD_IR_H
#define SPMD_IR_H

#include "../base/base.h"
#include "../mesh/mesh.h"
#include "../sharding_spec/spec.h"

typedef enum { DT_F32, DT_BF16, DT_F16, DT_F64, DT_I32, DT_COUNT } DType;

extern const char *const dtype_names[DT_COUNT];
int dtype_size(DType t);               /* bytes of one element as the model declares it */
bool dtype_is_float(DType t);
int dtype_parse(const char *s);        /* DType, or -1 */

typedef struct {
	int rank;
	int64_t dim[MAX_RANK];
} Shape;

/* 1 for rank 0.  Inline: the passes ask it millions of times a search. */
static inline int64_t shape_numel(const Shape *s)
{
	int64_t n = 1;
	for (int i = 0; i < s->rank; i++)
		n *= s->dim[i];
	return n;
}
bool shape_eq(const Shape *a, const Shape *b);
void shape_format(const Shape *s, char *buf, size_t n); /* "[32, 512]" */
enum { SHAPE_MAX_NUMEL = (int64_t)1 << 40 }; /* larger tensors are refused at load */

typedef enum {
	VK_INPUT,   /* fed at run time */
	VK_PARAM,   /* trainable weight */
	VK_CONST,   /* scalar constant written in an `in` list */
	VK_INTER,   /* result of an op */
	VK_STATE,   /* optimizer state carried between steps */
} ValueKind;

typedef enum { INIT_DEFAULT, INIT_NORMAL, INIT_UNIFORM, INIT_ZEROS, INIT_ONES } InitKind;

typedef struct {
	InitKind kind;
	double a, b; /* normal: a = std; uniform: [a, b) */
} Init;

/* A param's own all_gather (Value.gather; 0: the train: section's). */
enum { AG_AFTER_UPDATE = 1, AG_BEFORE_USE = 2, AG_FIRST_USE = 3 };
/* Their names in the format, from AG_AFTER_UPDATE on (spmd/load_train.c). */
extern const char *const ag_names[3];

typedef struct {
	const char *name;
	DType dtype;
	Shape shape;
	ValueKind kind;
	int producer;  /* op id, or -1 */
	Pos pos;
	bool has_spec; /* the user annotated it */
	Spec spec;     /* the annotation (has_spec), later the inferred sharding */
	Pos spec_pos;  /* where the annotation was written */
	uint8_t priority;     /* the annotation's propagation round (sharding: {..., priority: N}) */
	const char *shard_as; /* sharding group (shard_as: G): its members take one sharding; or NULL */
	Pos shard_as_pos;
	Init init;     /* params */
	int8_t wus;    /* params: weight_update_sharding of this param (WusMode + 1; 0: the train: section's) */
	int8_t gather; /* params: all_gather of this param (AG_AFTER_UPDATE, AG_BEFORE_USE, AG_FIRST_USE; 0: the train: section's) */
	double cval;   /* VK_CONST: the number */
	int nuses;     /* ops reading it */
	Shape global;  /* partitioned programs: the global shape this value is a shard of */
} Value;

/* Op kinds come from the op table, ops.def. */
typedef enum {
#define OP(id, name, nmin, nmax, flags, attr, shape, kern) OP_##id,
#include "ops.def"
#undef OP
	OP_COUNT
} OpKind;

enum { CONV_PAD_EXPLICIT, CONV_PAD_SAME, CONV_PAD_VALID };

/* Attributes of an op.  Which fields an op uses is said in ops.def beside its
 * row; the rest stay zero. */
typedef struct {
	/* einsum: the equation, and per operand / result its letters */
	const char *eq;
	int nlet[3];                /* letters of operand 0, operand 1, result */
	char let[3][MAX_RANK];
	/* reduce_*: axes (sorted, non-negative) and keepdims;
	 * transpose: perm in axes[0..rank);
	 * softmax, log_softmax, layer_norm: the axis in axes[0] (naxes 1) */
	int naxes;
	int axes[MAX_RANK];
	bool keepdims;
	double eps;                 /* layer_norm */
	Shape shape;                /* reshape, broadcast_to: the target shape */
	int64_t start[MAX_RANK];    /* slice: start; pad: low */
	int64_t limit[MAX_RANK];    /* slice: limit; pad: high */
	int64_t stride[MAX_RANK];   /* slice: stride (1 when not given) */
	double value;               /* pad: the fill value */
	int axis;                   /* concat: axis (non-negative) */
	int strides[2];             /* conv2d */
	int pad_mode;               /* conv2d: CONV_PAD_* */
	int64_t padding[2][2];      /* conv2d: [[top, bottom], [left, right]], resolved */
	int64_t depth;              /* one_hot */
	DType dtype;                /* cast */
	/* collectives: mesh axes, major to minor; the reduction; the dims */
	int ncax;
	int cax[MESH_MAX_AXES];
	int reduce;                 /* REDUCE_SUM or REDUCE_MAX */
	int dim;                    /* all_gather, reduce_scatter: the dim; all_to_all: split dim */
	int dim2;                   /* all_to_all: concat dim */
	int64_t shift;              /* collective_permute: offset along cax[0] (mod size) */
	const int *target;          /* collective_permute: device d sends to target[d] (ndev entries), or NULL: shift */
	/* shard_slice: the operand is laid out by spec_from (blocks of its own
	 * shape), the result by spec (blocks of the result's shape) over a
	 * tensor of shape `global`; mask: the operand's sharding (spec) and
	 * global shape, and the fill in `value` */
	Spec spec, spec_from;
	Shape global;
} Attr;

typedef struct {
	OpKind kind;
	int nin;
	int *in;       /* operand value ids */
	int out;       /* result value id */
	Attr *attr;    /* never NULL */
	Pos pos;
	const char *why; /* partitioned programs: why the partitioner put this op here */
	int src_op;      /* partitioned programs: the model op it was made for, or -1 */
	int stage;       /* pipelined programs: the stage whose devices run it, or -1: every device */
	int stage_to;    /* pipelined programs: a permute between stages also runs on this stage's devices, or -1 */
	int pipe_step;   /* pipelined programs built here (not read from files): 1 + 2 mb + (1 for a backward) for
	                  * an op of microbatch mb's step through its stage, 0: none (zero so that any Op literal
	                  * is of no step); what --compare-run times the steps by */
} Op;

typedef struct {
	Arena arena;
	const char *name;
	const char *file;  /* the model file, for messages */
	Mesh mesh;         /* naxes == 0 when the model has none */
	AxisRules rules;   /* logical axis names (axis_rules:), resolved on mesh */
	const char **rules_written; /* per rule, its mapping as written ("[data, model]") */
	VEC(Value) values;
	VEC(Op) ops;
	VEC(int) outputs;  /* value ids */
	struct Pipeline *pipeline; /* the pipeline: section and every op's stage (spmd/pipeline_section.h), or NULL */
	struct Train *train; /* the train: section and the training step built from it (spmd/train_section.h), or NULL */
	int stage_axis;    /* pipelined programs: the mesh axis of the stages (device coordinate s runs the
	                    * stages s, s + size, ...), or -1: every device runs every op */
	const int *name_order; /* name_order_n ops' results by name, as remembered (propagate_remember_order; a hint
	                        * checked at use); a fork shares its source's */
	int name_order_n;
} Graph;

void graph_init(Graph *g);
void graph_free(Graph *g);
/* A copy of src that the passes may change: its own values, ops (with their
 * operand lists), outputs and train: section (with its params); names,
 * attributes, the mesh and the rest are src's, which must outlive dst
 * unchanged.  Linear in the graph: what a search that prices many plans
 * of one model does instead of loading and building it again each time. */
void graph_fork(const Graph *src, Graph *dst);
/* Add a value; returns its id.  name is copied into the arena. */
int graph_value(Graph *g, const char *name, DType t, const Shape *s, ValueKind k, Pos p);
/* Add an op reading in[0..nin) and producing out; returns its id.  The op's
 * attributes start zeroed: fill graph->ops.a[id].attr. */
int graph_op(Graph *g, OpKind k, const int *in, int nin, int out, Pos p);
/* g's ops set to ops[0..n) (copied), values' producers and use counts to match. */
void graph_set_ops(Graph *g, const Op *ops, int n);
/* g's ops set to its ops seq[0..n) in that order (some may be left out or new), as graph_set_ops. */
void graph_order_ops(Graph *g, const int *seq, int n);
/* The ops reading each value of g: *list[(*start)[v] .. (*start)[v + 1])
 * are the ops reading v, once per operand, in program order (two new
 * arrays: free them).  Linear in the graph. */
void graph_readers(const Graph *g, int **start, int **list);
/* Give every use of a constant its own value (a copy), as a program read
 * back from a file has (its constants are written in place), so that both
 * hold the same leaves.  Linear in the graph. */
void graph_unshare_consts(Graph *g);
/* Pipelined programs (stage_axis >= 0): device's coordinate on the stage
 * axis, or -1 for a graph without stages. */
int graph_stage_coord(const Graph *g, int device);
/* Does the device at stage coordinate c (graph_stage_coord; -1: every op
 * runs) run op? */
bool op_runs_on(const Graph *g, const Op *op, int c);
/* Pipelined programs: the stage coordinate of the devices that hold op
 * result v (its producer's stage; a permute's receiving one), or -1: every
 * device (leaves, ops of no stage, graphs without stages). */
int value_stage_coord(const Graph *g, int v);
/* Pipelined programs: does every op read only values its devices hold
 * (leaves, values of no stage, its own stage coordinate's)?  Errors at the
 * ops to d; returns their number. */
int graph_check_stages(const Graph *g, Diag *d);
/* Find a value by name: id or -1.  Linear; loaders keep their own index. */
int graph_find(const Graph *g, const char *name);
/* graph_find of each of names[0..n) into ids, in time linear in g's
 * values and n (a hash table of the names, built once). */
void graph_find_many(const Graph *g, const char *const *names, int n, int *ids);
/* Check the graph's invariants (ids in range, topological order, one producer
 * per value, shapes equal to what the op's shape rule gives).  Errors go to d;
 * returns the number found. */
int graph_verify(const Graph *g, Diag *d);

/* Move the ops from `first` to the end (which may read only values defined
 * before any op) to the front, keeping both parts' order; producers follow.
 * Op ids held elsewhere shift: the callers fix their own. */
void graph_rotate_ops(Graph *g, int first);

/* Replace the mesh by one given as text ("data=4,model=2"): the same axes in
 * the same order with other sizes (device order back to row-major), or any
 * mesh for a model without one.  0, or -1 after a usage error. */
int graph_set_mesh(Graph *g, const char *text, Diag *d);
/* Does mesh text have the axes of g's mesh as written, in order (what
 * graph_set_mesh requires)?  0, or -1 after a usage error. */
int graph_check_mesh(Graph *g, const char *text, Diag *d);

/* Parameter count and FLOPs of one forward evaluation, for `spmd check`. */
int64_t graph_param_count(const Graph *g);
double graph_flops(const Graph *g);
/* The FLOPs of op (graph_flops' count). */
double graph_op_flops(const Graph *g, const Op *op);

#endif
