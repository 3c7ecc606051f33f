/* mpi_backend.h: the MPI backend — each device of a mesh is one MPI process; device d is rank d of MPI_COMM_WORLD.
 *
 *   if (mpi_backend_start() != 0) ...                      (MPI_Init)
 *   Backend b;
 *   if (mpi_backend_init(&b, &mesh, 0) == 0) {            (ranks == mesh.ndev)
 *           ... b.all_reduce(&b, mpi_backend_rank(), &coll, in, out) ...
 *           mpi_backend_free(&b);
 *   }
 *   status = mpi_backend_finish(status);                   (every rank gets the worst status; MPI_Finalize)
 *
 * The same Backend table as the thread backend (runtime/collectives.h,
 * docs/collectives.md), so a program runs unchanged on either.  A collective
 * over axes A uses one communicator per ordered list A, made with
 * MPI_Comm_split on first use (every device reaches the same collective at
 * the same point, so every rank splits together) and kept: the colour is the
 * group's first member, the key the member index, so a communicator's rank
 * order is mesh_group()'s member order.
 *
 *   all_gather      MPI_Allgather (blocks along dim packed/unpacked locally)
 *   all_to_all      MPI_Alltoall
 *   permute         MPI_Sendrecv (MPI_Send / MPI_Recv for a chain's ends)
 *   all_reduce      MPI_Alltoallv of 1/n pieces, each member reduces its piece
 *                   over the group left to right in member order, MPI_Allgatherv;
 *                   with MPI_BACKEND_NATIVE: MPI_Allreduce
 *   reduce_scatter  MPI_Alltoall of the blocks, each member reduces its own
 *                   block in member order; with MPI_BACKEND_NATIVE:
 *                   MPI_Reduce_scatter_block
 *
 * By default the reductions keep the fixed left-to-right order of
 * docs/collectives.md, so results equal the thread backend's bit for bit;
 * MPI_BACKEND_NATIVE hands float sums to MPI, whose reduction order is its
 * own (results then agree within rounding).  Both send what a ring would:
 * 2(n-1)/n of the buffer for all_reduce, (n-1)/n for reduce_scatter and
 * all_to_all, (n-1) buffers for all_gather.
 *
 * Errors: MPI calls return their errors (MPI_ERRORS_RETURN); a failed call
 * makes the collective return -1 with the reason in mpi_backend_error().  A
 * rank that cannot go on while others may wait in a collective must end the
 * job with mpi_backend_abort(); mpirun also ends the job when a process dies. */
#ifndef SPMD_MPI_BACKEND_H
#define SPMD_MPI_BACKEND_H

#include "collectives.h"
#include "spmd_run.h"
#include "train_run.h"

enum { MPI_BACKEND_NATIVE = 1 }; /* flags: MPI's own reductions for float sums */

/* What one rank's collectives did. */
typedef struct {
	int64_t calls;      /* collectives run */
	int64_t bytes_sent; /* bytes this rank addressed to other ranks */
	double seconds;     /* wall time inside collectives */
} MpiStats;

/* MPI_Init (once; a process started without mpirun is a single rank) and
 * errors returned, not fatal.  0, or -1 if MPI could not start. */
int mpi_backend_start(void);
/* This process's rank and the number of ranks in MPI_COMM_WORLD. */
int mpi_backend_rank(void);
int mpi_backend_size(void);
/* Every rank passes its status; all get the largest.  *first (may be NULL)
 * gets the lowest rank whose status is nonzero, or -1.  A collective over
 * MPI_COMM_WORLD: every rank calls it, or mpi_backend_finish instead — a
 * rank that failed early may go straight to finishing, and the others learn
 * here that the job is ending (their later agreements return at once). */
int mpi_backend_agree(int status, int *first);
/* Does every rank hold the same x as rank 0?  0 if so, else 2, with *first
 * (may be NULL) the lowest rank that differs.  Called by every rank, as
 * mpi_backend_agree. */
int mpi_backend_same(uint64_t x, int *first);
/* The agreed status (as mpi_backend_agree), then MPI_Finalize. */
int mpi_backend_finish(int status);
/* End the whole job now with exit status `status` (MPI_Abort): for a rank
 * that failed while others may be waiting for it.  Does not return. */
void mpi_backend_abort(int status) __attribute__((noreturn));

/* A backend over MPI_COMM_WORLD for mesh m (kept by pointer).  0, or -1 if
 * the number of ranks is not m->ndev. */
int mpi_backend_init(Backend *b, const Mesh *m, int flags);
void mpi_backend_free(Backend *b);
const MpiStats *mpi_backend_stats(const Backend *b);
/* The reason the last collective failed, or "". */
const char *mpi_backend_error(const Backend *b);

enum { SPMD_RUN_ABORT = -2 };

/* Run program prog on this rank's device (every rank calls it): the rank
 * makes only its own shards of the leaves (o->given_file: only its box of
 * each file), runs its program with collectives over MPI, then sends its
 * shards of the outputs to rank 0, where outputs[i] gets output i gathered
 * into its global shape (as spmd_run; other ranks' outputs stay empty).
 * mem and stats (ndev entries each, filled on rank 0 for every device) may
 * be NULL.  Returns 0;
 * -1 on every rank when some rank could not make its leaves (the lowest such
 * rank reports) or rank 0 found replicas differing; or SPMD_RUN_ABORT on a
 * rank that failed during the run (reported), whose caller must end the job
 * (mpi_backend_abort) as the other ranks may be waiting for it. */
int spmd_run_mpi(const Graph *prog, const SpmdOpts *o, int flags, Tensor *outputs, DeviceMemory *mem,
                 MpiStats *stats, Diag *d);
/* The same for s->steps training steps (train_run.h): each rank makes its
 * leaves once and carries values from step to step; every step's outputs
 * are gathered on rank 0, which calls s->on_step.  outputs: the last step's;
 * mem (or else s->mem): the last step's figures. */
int train_run_mpi(const Graph *prog, const SpmdOpts *o, int flags, const StepOpts *s, Tensor *outputs,
                  DeviceMemory *mem, MpiStats *stats, Diag *d);

#endif
