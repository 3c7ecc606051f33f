/* pipeline_section.h: the pipeline: section of a model as the loader reads
 * it (spmd/load_pipeline.c), and the stage of every op.
 *
 *   pipeline: {axis: stage, microbatches: 8, schedule: 1f1b}
 *   ops:
 *     - {out: h1, op: einsum, eq: "bd,df->bf", in: [x, w1], stage: 0}
 *     - {out: h2, op: einsum, eq: "bf,fd->bd", in: [h1, w2], stage: 1}
 *
 * The mesh axis `axis` holds the stages: device coordinate s on it runs
 * stage s (interleaved: the virtual stages s, s + p, s + 2p, ... of p * V).
 * Ops are placed by their file position: the training step's backward ops
 * carry the position of the forward op they differentiate, and a param's
 * update ops the param's, so one table of positions places every op of a
 * model, of its training step and of its partitioned program
 * (pipeline_stage_at).  docs/pipeline.md has the whole design. */
#ifndef SPMD_PIPELINE_SECTION_H
#define SPMD_PIPELINE_SECTION_H

#include "ir.h"

/* microbatches x devices on the stage axis (and x virtual stages) is at most this. */
enum { PIPE_MAX_STEPS = 1 << 20 };

typedef enum { PIPE_GPIPE, PIPE_1F1B, PIPE_INTERLEAVED, PIPE_COUNT } PipeSchedule;
extern const char *const pipe_schedule_names[PIPE_COUNT]; /* "gpipe", "1f1b", "interleaved" */

typedef struct Pipeline {
	Pos pos;              /* the section */
	int axis;             /* the mesh axis of the stages */
	int ndev_stages;      /* p: the axis' size */
	int virtual_stages;   /* V: 1 unless interleaved (default 2) */
	int nstages;          /* p * V: the stages ops are placed on */
	int64_t microbatches; /* m: it divides every input's dim 0 (the batch) */
	PipeSchedule schedule;
	bool auto_stages;     /* stages: auto — op_stage is filled by a balancer (cost_model/pipeline_cost.h) */
	bool recompute;       /* the backward recomputes a stage's forward instead of keeping its activations */
	bool schedule_given, recompute_given; /* written in the section (autoshard keeps them; else it chooses) */
	int nops;             /* the model's ops when loaded */
	int *op_stage;        /* per model op: its stage in [0, nstages), or -1 (auto, not yet balanced) */
	Pos *op_pos;          /* per model op: its position (the key the stage is found by) */
	int nparams;          /* params and inputs ("params" below) */
	Pos *param_pos;       /* per param: its position, the first op that reads it (-1: none), and that op's stage */
	int *param_first_op;
	int *param_stage;
	int *by_pos;          /* ops (k < nops) and params (nops + k) sorted by position, for lookups */
} Pipeline;

struct LoadCtx;
struct YNode;

/* Read the pipeline: section n (NULL: none) after the ops were loaded from
 * the list `ops`: the section's fields, every op's `stage:` key, the stages
 * of unannotated ops, and the rules (docs/format.md).  Without a section a
 * `stage:` key is an error.  0, or -1 after reporting errors at their
 * positions. */
int load_pipeline(struct LoadCtx *lc, const struct YNode *n, const struct YNode *ops);

/* The stage of whatever was made at position p (an op of the model, of its
 * training step or of its partitioned program, or a param's update), or -1
 * when nothing of the model is there (shared scalars of the step). */
int pipeline_stage_at(const Pipeline *pl, Pos p);
/* The model op at position p, or -1. */
int pipeline_op_at(const Pipeline *pl, Pos p);
/* The device coordinate on the stage axis that runs stage s. */
static inline int pipeline_stage_device(const Pipeline *pl, int s) { return s % pl->ndev_stages; }
/* After a balancer filled op_stage: the params' stages from their first readers. */
void pipeline_place_params(Pipeline *pl);
/* stages: auto — take the stages a balancer gave the same model's section
 * cut (loaded from the same file); nothing when cut is NULL or unbalanced. */
void pipeline_take_cut(Pipeline *pl, const Pipeline *cut);

#endif
