/* chunk.h: a long collective that holds the links a more urgent one waits
 * for, split into chunks the urgent one can run between. */
#ifndef SPMD_CHUNK_H
#define SPMD_CHUNK_H

#include "../cost_model/cost.h"

/* Chunks a collective is split into, at most. */
enum { CHUNK_MAX = 8 };

/* What chunk_collectives did, for the partition report. */
typedef struct {
	char hw[64];                      /* the profile that priced the programs ("": no collective to cut found) */
	int collectives, chunks;          /* collectives split, into this many chunks in all (tried) */
	bool tried, kept;                 /* a chunked program was priced; and kept */
	double before_s, after_s;         /* the steady step as it was, and chunked (tried) */
	int64_t before_peak, after_peak;  /* their peaks */
} ChunkReport;

/* Split, in prog (partitioned from model; map: pipeline_partition's value
 * map), the all_gathers, reduce_scatters and all_reduces that the cost
 * model on hw finds holding the links while a collective the compute
 * stream waits for is ready (OpEstimate.behind of a collective a compute
 * op waits on), each into k chunks along a dim of its operand that is
 * whole and not its gathered or scattered dim:
 *
 *   y = all_gather(x)   ->   x_i = slice(x); y_i = all_gather(x_i);
 *                            y = concat(y_0 .. y_k-1)
 *
 * k: the collective's seconds over the waiting one's, 2 to CHUNK_MAX.
 * The chunks take the collective's place; the concat goes just before
 * the first op that reads y (at the end when the next step reads it).
 * Between two chunks the links run whatever collective is needed sooner,
 * as data-parallel runtimes bucket their gradient reductions.  The new
 * program is kept when the cost model prices its steady step 0.1% faster
 * or more with a peak at most 1% larger; else prog is left as it was
 * (rep, or NULL, says what was done).  Pipelined programs and the thread
 * backend's are left alone.  priced: on entry the estimate of prog as it
 * is, or op NULL (then one is made); on return the estimate of prog as
 * left (steady_only). */
bool chunk_collectives(Graph *prog, const Graph *model, const int *map, const HwProfile *hw, CostEstimate *priced,
                       ChunkReport *rep);

#endif
