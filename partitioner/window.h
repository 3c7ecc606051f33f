/* window.h: collective matmul — an all_gather, reduce_scatter or all_reduce
 * next to an einsum split into blocks that overlap the einsum's blocks. */
#ifndef SPMD_WINDOW_H
#define SPMD_WINDOW_H

#include "../cost_model/cost.h"

/* Rings longer than this are left as they are: each block adds an einsum
 * and a send per reader, so the program grows by that factor there. */
enum { WINDOW_MAX_RING = 128 };

/* What window_einsums did, for the partition report. */
typedef struct {
	char hw[64];          /* the profile that priced both programs ("": none looked at) */
	int gathers;          /* all_gathers read by einsums in blocks (tried) */
	int scatters;         /* reduce_scatters of an einsum made in blocks (tried) */
	int reduces;          /* all_reduces of an einsum made in blocks, each block's reduced as it is made (tried) */
	int einsums;          /* einsums split into blocks (tried) */
	int chained;          /* ops after the all_reduces run in their blocks (tried) */
	bool tried, kept;     /* a windowed program was priced; and kept */
	double before_s, after_s;         /* the steady step as partitioned, and windowed (tried) */
	int64_t before_peak, after_peak;  /* their peaks */
} WindowReport;

/* Rewrite prog, partitioned from model (map: pipeline_partition's value
 * map), so that the all_gathers of one mesh axis whose results einsums
 * read, and the reduce_scatters of one axis whose operand an einsum makes,
 * overlap those einsums (docs/partitioning.md, "Collective matmul"):
 *
 *   y = einsum(all_gather(x), w)      x's blocks are passed round the
 *                                     ring (n - 1 collective_permutes),
 *                                     each einsummed with w when it
 *                                     arrives; the blocks of y are
 *                                     concatenated and rolled into place
 *                                     (shard_roll);
 *   r = reduce_scatter(einsum(a, b))  a is rolled by the device's ring
 *                                     position and cut into n blocks;
 *                                     each block's einsum is added to the
 *                                     partial sum passed from the ring
 *                                     neighbour, which passes it on;
 *   r = all_reduce(einsum(a, b) [+ c]) a is cut into 4 blocks along a dim
 *                                     whole on the device; each block's
 *                                     einsum (and c added, the same for
 *                                     every block) all_reduced while the
 *                                     next is einsummed; the blocks
 *                                     concatenated into r.
 *
 * Only a gathered dim that stays a free dim of the einsum's result, or a
 * scattered dim that is a free dim of one operand, is split; only rings of
 * 2 to WINDOW_MAX_RING devices, blocks of equal size and no padding.  On
 * a closed torus ring the blocks and sums go both ways round it.  The
 * all_gather stays where other ops read its result before its readers'
 * einsums (else it is made again from the blocks).  The new program is
 * kept when the cost model on hw prices its steady step 0.1% faster or
 * more with a peak at most 1% larger; with gathers and scatters taken, the
 * program with the gathers alone is priced too and kept if better still;
 * else prog is left as it was (rep, or NULL, says what was done).  Pipelined programs and the thread
 * backend's (nothing overlaps there) are left alone.  Linear in the
 * program times the ring size, plus an estimate of prog when some pattern
 * is found (handed on through priced) and one of the rewritten program
 * when the patterns' expected savings reach 0.2% of the step (two when
 * both kinds are taken).  Values the new program no longer makes are left without a
 * producer (kind VK_INTER, read by nothing).  priced (or NULL) gets the
 * estimate of prog as left (steady_only; op NULL when none was made).
 * reduces: the all_reduces are candidates too (false: a search's proxies,
 * as they keep the step's order, partition.h). */
bool window_einsums(Graph *prog, const Graph *model, const int *map, const HwProfile *hw, bool reduces,
                    CostEstimate *priced, WindowReport *rep);

#endif
