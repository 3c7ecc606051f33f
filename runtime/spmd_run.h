/* spmd_run.h: running a partitioned program on every device of its mesh, and gathering its outputs. */
#ifndef SPMD_SPMD_RUN_H
#define SPMD_SPMD_RUN_H

#include "collectives.h"

typedef struct {
	uint64_t seed;
	/* Per program value: a whole tensor given by the user (--input) to be
	 * sliced per device, or NULL entries / NULL array: deterministic data. */
	const Tensor *given;
	/* Per program value: the id range of i32 leaves (data_id_range on the
	 * source graph), or NULL: 1000. */
	const int64_t *id_range;
} SpmdOpts;

/* Per-device memory, filled by spmd_run when asked. */
typedef struct {
	int64_t persistent; /* bytes of params and optimizer state */
	int64_t peak;       /* largest bytes held at once */
} DeviceMemory;

/* Run program prog (partition's output) with one thread per device.  Each
 * device makes only its own shards of the leaves.  On success outputs[i]
 * holds output i gathered into its global shape (padding dropped; replicas
 * checked to agree bit for bit).  mem (ndev entries) may be NULL.  0, or -1
 * after reporting (a kernel error names the device and the op). */
int spmd_run(const Graph *prog, const SpmdOpts *o, Tensor *outputs, DeviceMemory *mem, Diag *d);

/* The collective of op (kind, attributes) on one device, through backend b. */
int spmd_collective(Backend *b, int device, const Op *op, const Tensor *in, Tensor *out);

#endif
