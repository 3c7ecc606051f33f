/* emit.h: writing a partitioned program as YAML — the whole program, or one file per device.
 *
 *   Graph prog;
 *   if (partition(&model, &prog, NULL, &d) == 0 &&
 *       emit_program(&prog, "mlp.spmd.yaml", &d) == 0 &&   // spmd partition -o
 *       emit_devices(&prog, "mlp.devices", &d) == 0)       // spmd partition --per-device
 *           ...
 *
 * The format is the model format with a few additions (docs/format.md,
 * "Partitioned programs"): `spmd: true` at the top, local shapes with their
 * `global` shape and actual `sharding` (partial axes in the mapping form),
 * collectives, shard_slice and mask as ops, and each op's `why`.  The
 * loader reads it back (program_load in load.h), and `spmd run` runs it.
 * A per-device file is the same program with `device: N` and the concrete
 * facts of that device: replica groups, permute partners, block offsets. */
#ifndef SPMD_EMIT_H
#define SPMD_EMIT_H

#include "ir.h"

/* Write prog (partition's output) to path, atomically.  0, or -1 after
 * reporting to d. */
int emit_program(const Graph *prog, const char *path, Diag *d);
/* Write DIR/device_N.yaml for every device N (DIR is created if needed).
 * DIR may hold only such files (and leftovers of interrupted writes); those
 * of devices the mesh no longer has are removed.  Work and output grow as
 * ndev times the program (plus the replica groups listed).  0, or -1. */
int emit_devices(const Graph *prog, const char *dir, Diag *d);
/* The text of the program (device -1) or of one device's file; *n gets its
 * length.  The caller frees it. */
char *emit_text(const Graph *prog, int device, size_t *n);

/* ---- per-device facts, shared with the loader's checks ---- */

/* The block a device holds of a tensor of shape `global` laid out by spec s
 * in buffers of shape `local`: offset[d] = its block index on d * local[d],
 * extent[d] = the valid part, clamp(global[d] - offset[d], 0, local[d]). */
void emit_block(const Spec *s, const Mesh *m, const Shape *local, const Shape *global, int device, int64_t *offset,
                int64_t *extent);
/* target[d] (ndev entries, -1: nobody) of a collective_permute's attributes:
 * its explicit map, or its shift along cax[0]. */
void emit_permute_targets(const Mesh *m, const Attr *at, int *target);

#endif
