/* combine.h: fuse the small collectives of a partitioned program — scalar all_reduces, and small reduce_scatters and all_gathers through one flat buffer.
 *
 *   Graph prog;                                   // partition()'s output
 *   CombineOpts o = {.group_bytes = 1 << 20};     // the train: section's group_bytes
 *   if (combine_collectives(&prog, &o, &d) != 0) ...
 *
 * Before, a LAMB step with clipping on {data: 4} runs one scalar all_reduce
 * per param for the global norm and two per param for the trust ratios,
 * and one reduce_scatter and one all_gather per param; after, one all_reduce
 * for the global norm, one or two (one per set of axes) for the trust ratios,
 * one reduce_scatter of every small gradient and one all_gather of every
 * small weight.  What each device computes is unchanged: every tensor's
 * result is laid out exactly as before (docs/weight_update_sharding.md). */
#ifndef SPMD_COMBINE_H
#define SPMD_COMBINE_H

#include "../spmd/ir.h"

typedef struct {
	/* all_reduces, reduce_scatters and all_gathers whose per-device buffer
	 * (the larger of operand and result) has fewer bytes are grouped; 0:
	 * none.  Scalar all_reduces are fused whatever this says. */
	int64_t group_bytes;
} CombineOpts;

/* Rewrite prog, a partitioned program, in place: independent collectives of
 * one kind over the same mesh axes (in order), with the same reduction and
 * dtype, each small (see CombineOpts), become one collective on a flat
 * buffer — each operand packed (reduce_scatter, all_gather: its split dim
 * brought to the front and viewed as [members, rest]), concatenated, the
 * collective, and each result sliced back out and reshaped to what it was.
 * Value ids do not change (each old result keeps its id and its sharding;
 * new values are appended), so maps into prog stay valid; op ids do change.
 * Ops are reordered only as far as a fused collective needs: it runs once
 * its last operand exists, and the ops that read its results wait for it.
 * The fused collective's why lists the results it makes ("combined: a, b").
 * Deterministic; linear in the program's size (times a few rounds in the
 * rare program whose groups would wait for each other).  0, or -1 after
 * reporting an internal error (prog then unchanged or invalid). */
int combine_collectives(Graph *prog, const CombineOpts *o, Diag *d);

#endif
