/* order.h: a partitioned training step's weight update moved into its backward pass, its waited-for collectives issued sooner. */
#ifndef SPMD_ORDER_H
#define SPMD_ORDER_H

#include "../cost_model/cost.h"

/* What order_updates did, for the partition report. */
typedef struct {
	char hw[64];          /* the profile that priced the orders ("": not a step it orders) */
	bool waits;           /* the compute stream waits over 1% of the step as built */
	bool tried;           /* ... and a moved order was priced */
	bool kept;            /* ... and kept: 0.1% faster or more, its peak at most 1% larger */
	int params, moved;    /* the step's params, and those whose new weight is made earlier (tried) */
	int grads;            /* params whose gradient is reduced (its last op run) earlier (tried) */
	int ops;              /* ops moved (tried) */
	int fills, filled;    /* waits of the moved step filled, and the ops moved to do so (kept) */
	int hoists, hoisted;  /* then: waits for an activation's collective hoisted, and the ops moved up (kept) */
	double hoist_s;       /* the steady step with them hoisted (hoists > 0) */
	int64_t hoist_peak;   /* its peak */
	int delays, delayed;  /* last: tail ops' waits put off, and the ops moved to do so (kept) */
	double delay_s;       /* the steady step with them put off (delays > 0) */
	int64_t delay_peak;   /* its peak */
	double before_s, after_s;         /* the steady step as built, and moved (tried) */
	int64_t before_peak, after_peak;  /* their peaks */
} OrderReport;

/* Reorder prog, a training step partitioned from model (map: the value
 * map of pipeline_partition), so that each op after the backward pass (the
 * optimizer's update, clipping, the weight gathers) runs as soon as the
 * cost model on hw expects its operands, in the backward pass: a param
 * whose gradient is reduced early is updated, and its weight gathered,
 * while the backward pass goes on, instead of all of them after it.  Where
 * the moved step then waits for a gradient's collective, updates placed
 * before the op that feeds it move to just before the op that waits.  Ops
 * that need nothing the backward pass makes (state scaled by a constant)
 * go just before their first reader.  The new order is kept only when the
 * cost model's steady step is faster by 0.1% or more and its peak memory
 * at most 1% larger.  Last, whether or not the tail moved, a collective
 * the compute stream waits for moves up with the ops making its operand
 * (a norm made again in the backward, then gathered) past ops they do
 * not read, kept on the same terms; and where the tail moved, an update
 * that then waits for its gradient's collective goes after the ops that
 * fill the wait, with the tail ops reading it, kept on the same terms
 * (rep, or NULL, says what was done); true when the tail moved.
 * Programs without a train: section, pipelined ones and those of the
 * thread backend (no collective overlaps compute there) are left as they
 * are.  Linear in the program, plus up to eight estimates
 * (one where the compute stream hardly waits).  priced (or NULL) gets the
 * estimate of the program as left (steady_only; op NULL when none was
 * made).  When priced->op is set on entry, it is the estimate of prog as it
 * is (steady_only, phases by step_describe), taken over instead of made
 * again; a program left alone keeps it there. */
bool order_updates(Graph *prog, const Graph *model, const int *map, const HwProfile *hw, CostEstimate *priced,
                   OrderReport *rep);

#endif
