/* partition.h: rewrite a propagated graph into the program every device runs. */
#ifndef SPMD_PARTITION_H
#define SPMD_PARTITION_H

#include "../spmd/ir.h"
#include "../cost_model/cost.h"
#include "../sharding_spec/reshard.h"
#include "factors.h"

/* Partition src, whose values carry their shardings (propagate), into dst:
 * one SPMD program with local shapes, collectives, shard slices and masks,
 * run alike by every device (device-dependent ops read the device's mesh
 * coordinates).  dst is initialised here; free it with graph_free.  Every
 * collective's Op.why says which value and op it serves and why.  dst values
 * keep the source names for inputs, params and op results; each dst value's
 * spec is its sharding (partial included) and `global` its global shape.
 * map (src->values.n entries, or NULL) gets, per source value, the dst
 * value that holds it at the end.  Temporaries are named NAME%N, a name no
 * model can use.  hw prices moves (NULL: the built-in tpu-v3 profile).  0, or
 * -1 after reporting. */
int partition(const Graph *src, Graph *dst, int *map, const HwProfile *hw, Diag *d);
/* What the passes over many variants of one model share (a search
 * partitions hundreds on one mesh): reshard plans, which any partition on
 * any thread takes and adds to, and the factor rules of the model's ops,
 * read only (src a fork of their graph).  Either may be NULL. */
typedef struct {
	ReshardCache *plans;
	const FactorRules *rules;
	/* A training step's first propagation (before weight-update sharding),
	 * which reads only the shardings: when `first` is set, the pipeline
	 * takes its per-value shardings instead of running it; when
	 * `keep_first` is set, it gets a malloc'd copy of what the run found
	 * (NULL when the run cut the mesh).  Both NULL: nothing kept. */
	const Spec *first;
	Spec **keep_first;
	/* When set: the estimate the pipeline made of the program it returns
	 * (window_einsums and order_updates on the passes' hw, steady state
	 * only), handed over (op NULL when it made none; free with
	 * cost_estimate_free). */
	CostEstimate *priced;
	/* Leave a training step's order as built (order_updates not run) and
	 * the all_reduces of einsums' sums whole (window_einsums): a search's
	 * proxies, whose extrapolation wants each layer to add alike, and
	 * whose estimates would cost a price more for each plan with tensor
	 * parallelism */
	bool keep_order;
} PassShare;
/* partition, with what share holds (NULL: nothing). */
int partition_shared(const Graph *src, Graph *dst, int *map, const HwProfile *hw, const PassShare *share, Diag *d);

/* Per value of a propagated graph (defer, values.n entries): 1 where the
 * partitioner may leave a pending sum for its readers instead of reducing it
 * (a result, not an output nor annotated by the user, read only by ops
 * linear in it: add and sub; neg, copy, transpose and narrowing float casts
 * as its only reader).  One pass over the ops. */
void partition_deferrable(const Graph *g, uint8_t *defer);

/* The mesh axes add or sub `op` leaves its result a pending sum over when
 * its operands are pending sums over pa and pb (0: whole): pa when they
 * agree; when one is whole and the result may stay pending (defer, from
 * partition_deferrable, or it is annotated a pending sum), the other's: the
 * whole operand is divided by the replica count of those axes, so the sum
 * over the replicas counts it once.  That only where it costs nothing later
 * (the pending operand is as large as the result) and the division is exact
 * to rounding (float results; f32, or a power-of-two count).  Else 0. */
unsigned partition_add_pending(const Graph *g, const Op *op, unsigned pa, unsigned pb, const uint8_t *defer);

/* The local shape of a tensor of global shape g under spec s on mesh m:
 * ceil(g[d] / shards of d) on every dim (uneven shards are padded). */
void spec_local_shape(const Spec *s, const Mesh *m, const Shape *g, Shape *out);

#endif
