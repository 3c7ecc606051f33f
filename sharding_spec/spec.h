/* spec.h: a tensor's sharding over a mesh, tile math, parsing and printing. */
#ifndef SPMD_SPEC_H
#define SPMD_SPEC_H

#include "../mesh/mesh.h"

enum { REDUCE_SUM = 0, REDUCE_MAX = 1 };

/* A sharding: per dimension d, the mesh axes ax[d][0..nax[d]) that split it,
 * major to minor; the axes in `partial` hold a pending reduction (`reduce`);
 * every other axis is replicated.  `open` marks dims an annotation leaves to
 * propagation.  A zeroed Spec of the right rank is fully replicated. */
typedef struct {
	uint8_t rank;
	uint8_t nax[MAX_RANK];
	uint8_t ax[MAX_RANK][MESH_MAX_AXES];
	uint8_t partial; /* bit a: axis a is partial */
	uint8_t reduce;  /* REDUCE_SUM or REDUCE_MAX, when partial != 0 */
	uint8_t open;    /* bit d: dim d open to propagation */
} Spec;

#endif
