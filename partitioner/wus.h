/* wus.h: cross-replica weight-update sharding (ZeRO; Xu et al. 2020). */
#ifndef SPMD_WUS_H
#define SPMD_WUS_H

#include "../spmd/ir.h"
#include "../cost_model/cost.h"
#include "chunk.h"
#include "order.h"
#include "window.h"

/* The decision for one param. */
typedef struct {
	int param;         /* the param's value id */
	bool sharded;
	int dim;           /* the dim its update is split on, or -1 */
	unsigned axes;     /* the replica axes the update is split over (mask) */
	int64_t padding;   /* padded elements over all shards of the update */
	int64_t bytes;     /* the param's bytes */
	const char *why;   /* in the graph's arena */
} WusParam;

typedef struct {
	int n;
	WusParam *p;       /* in the graph's arena */
	OrderReport order; /* the update's place in the step (pipeline.h: order_updates) */
	WindowReport window; /* collective matmul (window.h: window_einsums) */
	ChunkReport chunk; /* long collectives in chunks (chunk.h: chunk_collectives) */
} WusReport;

/* Decide, for every param of g's training step, whether its update is split
 * over the axes the param is replicated over, and annotate the step so that
 * propagation and the partitioner do the rest: the gradient is annotated
 * with the param's sharding plus those axes on one dim (its pending sum
 * becomes a reduce_scatter), the optimizer state and the updated shard keep
 * that sharding, and a copy annotated like the param gathers the new weight.
 * Must run on a propagated graph (the params' shardings known); the caller
 * propagates again afterwards.  hw prices `auto` (NULL: the built-in tpu-v3
 * profile).  0, or -1 after reporting. */
int wus_apply(Graph *g, const HwProfile *hw, WusReport *rep, Diag *d);

#endif
