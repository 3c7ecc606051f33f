/* train.h: the one graph of a training step, built from a model's train: section (spmd/train_section.h).
 *
 *   Graph g;                                  // a model with a train: section
 *   if (model_load(&g, "train_mlp.yaml", &d) != 0 || train_build(&g, &d) != 0) ...
 *   Train *t = g.train;
 *   // g now computes, in one pass: the forward ops, the loss, the backward
 *   // ops (autodiff.h), and the optimizer's update of every param.  Its
 *   // outputs are the loss, then each param's and state's next value; after
 *   // a step, value t->carry_from[i] becomes leaf t->carry_to[i] of the next.
 *   for (int i = 0; i < t->nparams; i++)
 *           use(t->params[i].grad, t->params[i].first_op, t->params[i].nops);
 *
 * Optimizer state (momentum, Adam's moments, the step counter) are VK_STATE
 * values, zeros before the first step.  Every update is computed in f32. */
#ifndef SPMD_TRAIN_H
#define SPMD_TRAIN_H

#include "../spmd/train_section.h"
#include "../spmd/tensor.h"

/* Turn g, a model with a train: section, into its training step: append the
 * backward ops, the gradient casts and clipping, the optimizer update and
 * the state, and set the outputs to [loss, next params..., next states...].
 * Fills g->train's step fields.  0, or -1 after reporting. */
int train_build(Graph *g, Diag *d);

/* Give each optimizer state of built step g its param's annotation
 * (sharding, position, priority), as train_build does: for a caller that
 * sets the params' shardings on a step built before (a fork, graph_fork). */
void train_shard_states(Graph *g);

/* After propagation: give each carried value the sharding of the leaf it is
 * carried to, so that the partitioned program's next step finds it laid out
 * as the leaf. */
void train_tie_specs(Graph *g);

/* After partitioning: give prog (partition's output of g, a built training
 * step; map: value of g -> value of prog) a Train of its own, in prog's
 * arena: the loss, every param with its next value and state, the carries
 * and the options, in prog's value ids (update op ranges and gradients are
 * not kept: -1).  prog is then a training program that the emitter writes
 * out and the runners step (docs/format.md, "Training programs"). */
void train_map(const Graph *g, const int *map, Graph *prog);

/* Between two steps: each carried value's tensor becomes its leaf's
 * (vals: per value of g, or of a program whose carries are given in the
 * same value ids); the carried value's slot is left empty. */
void train_carry(const Graph *g, Tensor *vals);

#endif
