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
	/* Per program value: a .npy file holding the whole tensor, of which each
	 * device reads only its own shard, or NULL entries / NULL array (the MPI
	 * backend's --input: no rank holds a whole split tensor). */
	const char *const *given_file;
	/* When not NULL: ndev * prog->ops.n entries, device-major, get every
	 * op's seconds on every device (--profile); the devices then wait for
	 * each other after making their leaves, so no op times their setup.
	 * MPI: each rank times its own row, and rank 0 receives every row. */
	double *op_seconds;
} SpmdOpts;

/* Per-device memory, filled by spmd_run when asked. */
typedef struct {
	int64_t persistent; /* bytes of params and optimizer state */
	int64_t peak;       /* largest bytes held at once */
} DeviceMemory;

/* Per program value, for SpmdOpts: *given (the model's given[v] for the
 * leaves, v < ngiven; given may be NULL) and *range (the id range of i32
 * leaves, from data_id_range on the model; else 1000).  map: partition()'s.
 * Free both. */
void spmd_leaf_opts(const Graph *model, const Graph *prog, const int *map, const Tensor *given, int ngiven,
                    Tensor **given_out, int64_t **range_out);

/* Bytes of the params and optimizer state one device of prog holds (every
 * device holds the same local shapes). */
int64_t spmd_persistent_bytes(const Graph *prog);
int64_t spmd_state_bytes(const Graph *prog);

/* Run program prog (partition's output) with one thread per device.  Each
 * device makes only its own shards of the leaves.  On success outputs[i]
 * holds output i gathered into its global shape (padding dropped; replicas
 * checked to agree bit for bit).  mem (ndev entries) may be NULL.  0, or -1
 * after reporting (a kernel error names the device and the op). */
int spmd_run(const Graph *prog, const SpmdOpts *o, Tensor *outputs, DeviceMemory *mem, Diag *d);

/* Make device's shard of leaf v of prog into t (allocated here): from
 * o->given_file, o->given or the seed.  0, or -1 after reporting a file that
 * cannot be read or does not hold the value's global shape and dtype. */
int spmd_make_leaf(const Graph *prog, const SpmdOpts *o, int device, int v, Tensor *t, Diag *d);

/* Device's local tensor of the value being gathered. */
typedef const Tensor *(*SpmdFetchFn)(void *arg, int device);
/* Gather value v of prog into out (allocated in its global shape, padding
 * dropped) from every device's local tensor, fetch(arg, device), called
 * exactly once per device: first replicas first, then the others, which
 * must hold the same bits.  0, or -1 after reporting a disagreement. */
int spmd_gather_value(const Graph *prog, int v, SpmdFetchFn fetch, void *arg, Tensor *out, Diag *d);

/* The collective of op (kind, attributes) on one device, through backend b. */
int spmd_collective(Backend *b, int device, const Op *op, const Tensor *in, Tensor *out);

#endif
