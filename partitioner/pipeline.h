/* pipeline.h: the passes from a loaded model to its partitioned program, in order. */
#ifndef SPMD_PIPELINE_H
#define SPMD_PIPELINE_H

#include "partition.h"
#include "propagate.h"
#include "wus.h"

/* Propagate shardings over g (a model, or a training step built by
 * train_build) and, for a training step, shard the weight update
 * (wus_apply, then propagate again).  p receives the final propagation
 * (free with propagation_free); wus may be NULL.  hw is the hardware profile
 * that prices choices (the command resolves it: passes read no files; NULL:
 * the built-in tpu-v3).  0, or -1 after reporting. */
int pipeline_propagate(Graph *g, const HwProfile *hw, Propagation *p, WusReport *wus, Diag *d);
/* pipeline_propagate, then partition into prog.  When map is not NULL,
 * *map gets a new array (free it) mapping each value of g, as the passes
 * left it, to the value of prog that holds it (see partition()). */
int pipeline_partition(Graph *g, const HwProfile *hw, Graph *prog, int **map, WusReport *wus, Diag *d);
/* A model with a pipeline: section is partitioned by pipe_partition
 * (pipe_program.h): its training step in microbatches, ordered by the
 * schedule, one stage per device coordinate of the stage axis.  This one
 * partitions it with every stage on every device — the stage axis
 * replicated — the program the cost model prices stage by stage
 * (cost_model/pipeline_cost.h); other models as pipeline_partition.
 * share: what the passes share with others (partition_shared), or NULL. */
int pipeline_partition_replicated(Graph *g, const HwProfile *hw, const PassShare *share, Graph *prog, int **map,
                                  WusReport *wus, Diag *d);

#endif
