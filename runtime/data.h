/* data.h: deterministic data — the elements of inputs and parameters as a function of (seed, name, index).
 *
 * Element i (flat C-order index in the global tensor) of value v depends on
 * the seed, the hash of v's name and i only, so a device makes exactly its
 * own shard and the reference makes the whole tensor:
 *
 *   Tensor t; tensor_alloc(&t, v->dtype, &local_shape);
 *   data_fill(&t, v, &v->shape, offset, seed, data_id_range(g, id));
 *
 * Distributions: parameters by their Init (INIT_DEFAULT is normal(0, 0.02));
 * float inputs normal(0, 1); i32 values uniform integers in [0, id_range);
 * optimizer state zeros unless its Init says otherwise; constants their
 * value.  Results are rounded to bf16/f16 when the dtype says so. */
#ifndef SPMD_DATA_H
#define SPMD_DATA_H

#include "../spmd/tensor.h"

/* 64-bit hash of a tensor name (FNV-1a, then mixed). */
uint64_t data_name_hash(const char *name);
/* A 64-bit mixing function (splitmix64's finalizer): well spread bits for a counter. */
uint64_t data_mix64(uint64_t z);
/* Fill t (its shape is the local shape) with the global tensor's elements at
 * global index offset[d] + local index (offset may be NULL: all zeros).
 * Local elements outside `global` (padding of uneven shards) are 0. */
void data_fill(Tensor *t, const Value *v, const Shape *global, const int64_t *offset, uint64_t seed,
               int64_t id_range);
/* For an i32 value: the id range valid for every op that reads it (take:
 * the table's first dim; one_hot: depth; ops that only move elements pass
 * their readers' range through; otherwise 1000); the minimum over readers. */
int64_t data_id_range(const Graph *g, int value);

#endif
