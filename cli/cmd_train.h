/* cmd_train.h: `spmd run` on a model with a train: section — K training steps, the loss of each printed. */
#ifndef SPMD_CMD_TRAIN_H
#define SPMD_CMD_TRAIN_H

#include "../spmd/ir.h"

/* The options of `spmd run` that training reads (cmd_run.c fills it). */
typedef struct {
	const char *steps;    /* --steps K, or NULL: the train: section's steps */
	const char *backend;  /* --backend, or NULL: threads with a mesh of several devices, else ref */
	const char *save;     /* --save DIR: the params after the last step, DIR/NAME.npy */
	bool check;           /* --check: also run on the reference, compare loss and params */
	uint64_t seed;
	const char *const *inputs; /* --input NAME=FILE.npy arguments */
	int ninputs;
	bool mpi;             /* --backend mpi: this process is one rank of the job (docs/mpi.md) */
	const char *load;     /* --load DIR: start from the params and state saved there, DIR/NAME.npy */
	bool program;         /* g is a training program (`spmd: true`), run as it is */
	const int64_t *id_range; /* a program: per value, the id range of its i32 leaves */
} TrainCmd;

/* Build g's training step (g has a train: section, or --steps is an error),
 * run it o->steps times and print the loss of each step, then each param's
 * statistics.  g may also be a training program (written by spmd partition
 * from such a model), which runs as it is: the same steps, output and files.
 * The exit status: 0, 1 (a --check mismatch) or 2. */
int cmd_run_train(Graph *g, const TrainCmd *o, Diag *d);

#endif
