/* collectives.h: the collective operations a multi-device backend provides, and running a reshard plan on one.
 *
 * Every device calls the same collective with the same Coll at the same point
 * of its program (SPMD); each passes its own device id and buffers.  The
 * replica groups are the devices that differ only in the axes c->axes; a
 * group's members are ordered by their coordinates on those axes, row-major
 * with axes[0] most significant (mesh_group).  With n members and member
 * index k (docs/collectives.md has worked examples):
 *
 *   all_reduce      out = in[0] op in[1] op ... op in[n-1], left to right;
 *   reduce_scatter  the same reduction, then member k keeps block k of `dim`
 *                   (shape[dim] must divide by n; out's dim is shape[dim]/n);
 *   all_gather      out = the members' buffers concatenated along `dim` in
 *                   member order (out's dim is n * shape[dim]);
 *   all_to_all      split in into n blocks along `dim`, send block j to member
 *                   j, concatenate what arrives along `dim2` in member order;
 *   permute         device d sends its buffer to target[d] (-1: to nobody);
 *                   a device nobody sends to gets zeros.
 *
 * The fixed reduction order makes every result bit-for-bit reproducible.
 * Elements are 4 bytes (spmd/tensor.h): DT_I32 reduces as int32_t, every
 * other dtype as float.  in and out must not overlap.  Each call returns 0,
 * or -1 when the run was aborted (another device failed). */
#ifndef SPMD_COLLECTIVES_H
#define SPMD_COLLECTIVES_H

#include "../spmd/tensor.h"
#include "../sharding_spec/reshard.h"

typedef struct {
	int nax;
	int axes[MESH_MAX_AXES]; /* the replica groups' axes, major to minor */
	DType dtype;
	int rank;
	int64_t shape[MAX_RANK]; /* the local input buffer */
	int dim, dim2;           /* see above */
	int reduce;              /* REDUCE_SUM or REDUCE_MAX */
	const int *target;       /* permute: ndev entries */
} Coll;

typedef struct Backend Backend;
typedef int (*CollFn)(Backend *b, int device, const Coll *c, const void *in, void *out);

/* A backend: the thread backend (runtime/threads.h) shares one Backend among
 * all device threads; an MPI backend would hold one per rank, with one
 * communicator per set of axes.  impl is the backend's own state. */
struct Backend {
	const Mesh *mesh;
	void *impl;
	CollFn all_reduce, reduce_scatter, all_gather, all_to_all, permute;
	int (*barrier)(Backend *b, int device);
	/* Told which op the next collective serves (may be NULL): the MPI
	 * backend names it when a rank waits too long (mpi_backend_set_timeout). */
	void (*note)(Backend *b, int device, const Op *op);
};

/* Elements in the output buffer of a collective on the input c->shape. */
int64_t coll_out_numel(ReshardKind k, const Coll *c, const Mesh *m);

/* Run plan p on device `device` of backend b: in holds the device's shard
 * under the plan's first layout, out receives its shard under the last
 * (both padded to the layout's block; out's padding is zeroed).  dims and
 * layouts come from p; mesh is b->mesh.  0, or -1 if aborted. */
int coll_plan_run(const ReshardPlan *p, Backend *b, int device, DType dt, const void *in, void *out);
/* Elements of the local buffer under a layout. */
int64_t coll_layout_numel(const ReshardLayout *l, int rank);

/* ---- strided copies shared by the backends ----
 * Copy (or reduce into dst) the box of extent ext[0..rank) at src_off in a
 * src buffer of shape src_dims to dst_off in a dst buffer of shape dst_dims.
 * Elements are 4 bytes. */
void coll_copy_box(int rank, const int64_t *ext, const void *src, const int64_t *src_dims, const int64_t *src_off,
                   void *dst, const int64_t *dst_dims, const int64_t *dst_off);
void coll_reduce_box(int rank, const int64_t *ext, const void *src, const int64_t *src_dims, const int64_t *src_off,
                     void *dst, const int64_t *dst_dims, const int64_t *dst_off, DType dt, int reduce);

#endif
