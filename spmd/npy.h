/* npy.h: reading and writing numpy .npy files (format 1.0 to 3.0, little-endian, C order).
 *
 *   Tensor t;
 *   if (npy_read("x.npy", &t, &d) == 0) { ... tensor_free(&t); }
 *   npy_write("y.npy", &t);
 *
 * Read: dtypes '<f4' (DT_F32), '<f8' (DT_F64, converted to float), '<f2'
 * (DT_F16, converted to float) and '<i4' (DT_I32); any rank up to MAX_RANK,
 * rank 0 included.  Write: format 1.0; f32, bf16 and f16 as '<f4', f64 as
 * '<f8', i32 as '<i4'. */
#ifndef SPMD_NPY_H
#define SPMD_NPY_H

#include "tensor.h"

/* Read path into t (allocated here; t untouched on error).  0, or -1 after
 * reporting "PATH: error: expected ..., found ..." to d. */
int npy_read(const char *path, Tensor *t, Diag *d);
/* Reading part of a file (each device its own shard): npy_info parses the
 * header only and checks the payload's size; npy_read_box then reads the box
 * ext[] at off[] (in the file's shape) into dst, a buffer of 4-byte elements
 * of shape dst_dims holding the box at its origin (other elements untouched),
 * decoded as npy_read does.  Only the box's bytes are read.  0, or -1 after
 * reporting "PATH: error: ...". */
typedef struct {
	Shape shape;
	DType dtype;         /* as npy_read: DT_F32, DT_F64, DT_F16 or DT_I32 */
	int elem_size;       /* bytes per element in the file */
	int64_t data_offset; /* where the elements start */
} NpyInfo;
int npy_info(const char *path, NpyInfo *info, Diag *d);
int npy_read_box(const char *path, const NpyInfo *info, const int64_t *off, const int64_t *ext, void *dst,
                 const int64_t *dst_dims, Diag *d);
/* Write t to path atomically (temporary file, then rename).  0, or -1 with errno set. */
int npy_write(const char *path, const Tensor *t);

#endif
