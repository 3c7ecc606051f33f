/* pipe_program.h: the pipelined training step of a model with a pipeline: section (docs/pipeline.md).
 *
 *   Graph prog;  int *map;
 *   if (train_build(&g, &d) == 0 && pipe_partition(&g, &hw, &prog, &map, NULL, &d) == 0)
 *           ... prog: one program, each op with its stage (Op.stage), sends
 *           between stages as collective_permutes, in the schedule's order ...
 *
 * The batch is cut into the section's microbatches (rows of every input's
 * dim 0), the step built on them (gradients accumulated over microbatches
 * before the one update), partitioned over the other mesh axes as any step,
 * and ordered by the schedule.  A device runs the ops of its stages only
 * (op_runs_on); values cross stages by collective_permute. */
#ifndef SPMD_PIPE_PROGRAM_H
#define SPMD_PIPE_PROGRAM_H

#include "wus.h"

/* g: a model with a pipeline: section whose training step train_build made.
 * prog gets the pipelined program (prog->stage_axis is the section's axis),
 * *map (when map is not NULL; free it) per value of g the value of prog
 * that holds it: inputs, params, state and the outputs (the loss, the
 * updated params and state, in g's order); other values -1.  Its ops'
 * src_op are -1 (they were made for ops of the microbatched model, not
 * g's).  0, or -1
 * after reporting (models the pipeline cannot cut: rows of the batch mixed,
 * a param read on two stages, clipping, stages: auto, recompute). */
int pipe_partition(Graph *g, const HwProfile *hw, Graph *prog, int **map, WusReport *wus, Diag *d);

#endif
