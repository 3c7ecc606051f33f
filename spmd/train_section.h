/* train_section.h: the train: section of a model as the loader reads it
 * (spmd/load_train.c), and the training step's bookkeeping that the
 * training-step builder (train/train.h) fills in on the same struct.
 * Optimizer state (momentum, Adam's moments, the step counter) are VK_STATE
 * values, zeros before the first step. */
#ifndef SPMD_TRAIN_SECTION_H
#define SPMD_TRAIN_SECTION_H

#include "ir.h"

typedef enum { OPT_SGD, OPT_MOMENTUM, OPT_ADAM, OPT_ADAMW, OPT_LAMB, OPT_COUNT } OptKind;
typedef enum { WUS_OFF, WUS_ON, WUS_AUTO } WusMode;

extern const char *const opt_names[OPT_COUNT];

/* One param of the step: where its gradient is and which ops update it. */
typedef struct {
	int param;         /* the VK_PARAM value */
	int grad;          /* its gradient as autodiff left it ("d%NAME", the param's dtype): where a
	                    * data-parallel run has its all-reduce */
	int reduced;       /* the gradient in grad_dtype ("NAME%grad"): where its reduction across replicas belongs */
	int grad_in;       /* the gradient the update reads: after grad_dtype and clipping, f32 */
	int first_op, nops; /* the update: ops [first_op, first_op + nops), reading grad_in, the param,
	                    * its state and the shared scalars (step counter, clip scale) */
	int next;          /* the updated param ("NAME%next"), carried to param */
	int nstate;        /* 0 (sgd), 1 (momentum), 2 (adam, adamw, lamb) */
	int state[2];      /* "momentum%NAME", "adam_m%NAME", "adam_v%NAME": VK_STATE, f32 */
	int next_state[2]; /* their updates ("...%next"), carried to state[i] */
} TrainParam;

/* prefetch: on, the default depth, and the most a model may write */
enum { PREFETCH_DEFAULT = 3, PREFETCH_MAX = 64 };

/* train: recompute: false, true or selective */
enum { RECOMPUTE_OFF, RECOMPUTE_ALL, RECOMPUTE_SELECTIVE };

typedef struct Train {
	/* the train: section */
	Pos pos;
	int loss;          /* value id of the loss */
	OptKind opt;
	double lr, beta1, beta2, eps, weight_decay;
	double clip;       /* clip_global_norm, or 0 for none */
	DType grad_dtype;  /* DT_F32: no cast */
	WusMode wus;       /* weight_update_sharding */
	bool gather_before_use; /* all_gather: before_use or first_use — sharded weights stay sharded between steps */
	bool gather_first_use;  /* all_gather: first_use — one gathered copy serves the forward and the backward */
	int prefetch;      /* prefetch: with before_use, each weight is gathered this many weights ahead of its
	                    * first use and each gradient reduced this many gradients later (partitioner/wus.c);
	                    * 0 (off): gathered at its first use, reduced as it is made */
	int64_t group_bytes; /* group_bytes: collectives of smaller per-device buffers are combined (partitioner/combine.h); 0: none */
	int8_t recompute;  /* recompute: RECOMPUTE_ALL, the backward recomputes the forward from the checkpoints;
	                    * RECOMPUTE_SELECTIVE, the results cheap for their size (train/train.c) */
	Pos recompute_pos; /* where recompute: was written */
	int64_t steps;     /* default step count of `spmd run` */
	/* the training step, filled by train_build */
	bool built;
	int nparams;
	TrainParam *params;
	int step, next_step;  /* the step counter "opt%step" (adam, adamw, lamb) and its update, or -1 */
	int clip_scale;       /* the scalar every gradient is multiplied by when clipping, or -1 */
	int ncarry;           /* values carried to the next step: carry_from[i] -> carry_to[i] */
	int *carry_from, *carry_to;
} Train;

struct LoadCtx;
struct YNode;

/* Parse the train: section n into a new Train on the loader's graph
 * (spmd/load_train.c; called by the loader after `outputs`).  0, or -1
 * after reporting errors at their positions. */
int load_train(struct LoadCtx *lc, const struct YNode *n);
/* The train: section of a training program (docs/format.md, "Training
 * programs": loss, steps, carry) into a built Train: the step is already in
 * the program's ops.  0, or -1 after reporting. */
int load_program_train(struct LoadCtx *lc, const struct YNode *n);

#endif
