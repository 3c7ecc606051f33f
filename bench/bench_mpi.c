/* bench_mpi.c: bandwidth of the MPI backend's collectives, as bench_collectives measures the thread backend's.
 *
 * usage: mpirun -np DEVICES bench_mpi [MAX_MIB]   (default 64; bench/bench_mpi.sh runs it)
 *
 * Every rank is one device of the mesh {d: DEVICES}.  For each collective
 * and a full-buffer size S of 1, 4, 16, 64 MiB (the buffer each device holds
 * before an all_reduce, reduce_scatter or all_to_all, after an all_gather),
 * rank 0 prints the time per call, the bus bandwidth per device — the ring
 * traffic, (n-1)/n * S for all_gather, reduce_scatter and all_to_all and
 * 2(n-1)/n * S for all_reduce, divided by the time — the ratio of all
 * devices' bus bandwidth to one memcpy stream's (measured on rank 0 before),
 * and the bytes rank 0 counted as sent per call against that ring traffic.
 * all_reduce and reduce_scatter run twice: in the fixed member order (the
 * default) and with MPI's own reductions (MPI_BACKEND_NATIVE). */
#include <mpi.h>
#include <string.h>

#include "../runtime/mpi_backend.h"

/* Bytes of memcpy per second on one thread, buffers of `bytes`. */
static double memcpy_rate(size_t bytes)
{
	char *a = xmalloc(bytes), *b = xmalloc(bytes);
	memset(a, 1, bytes);
	memset(b, 2, bytes);
	int iters = (int)(((size_t)512 << 20) / bytes) + 1;
	double t0 = now_seconds();
	for (int i = 0; i < iters; i++) {
		memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
		__asm__ __volatile__("" ::: "memory");
	}
	double rate = (double)bytes * iters / (now_seconds() - t0);
	free(a);
	free(b);
	return rate;
}

static double ring_factor(ReshardKind k, int n) { return (k == RS_ALL_REDUCE ? 2.0 : 1.0) * (n - 1) / n; }

static CollFn collective(Backend *b, ReshardKind k)
{
	return k == RS_ALL_REDUCE       ? b->all_reduce
	       : k == RS_REDUCE_SCATTER ? b->reduce_scatter
	       : k == RS_ALL_GATHER     ? b->all_gather
	                                : b->all_to_all;
}

/* Time kind on full-buffer `bytes`; rank 0 prints a line.  0 or -1. */
static int bench_one(Backend *b, ReshardKind kind, bool native, int64_t bytes, double copy_rate)
{
	int n = b->mesh->ndev, me = mpi_backend_rank();
	int64_t full = bytes / 4;
	full -= full % ((int64_t)n * n);
	int64_t n_in = kind == RS_ALL_GATHER ? full / n : full;
	Coll c = {.nax = 1, .axes = {0}, .dtype = DT_F32, .rank = 1, .shape = {n_in}};
	float *in = xcalloc((size_t)full, sizeof *in), *out = xcalloc((size_t)full, sizeof *out);
	for (int64_t i = 0; i < full; i++)
		in[i] = (float)(i % 97) * 0.5f + (float)me;
	int iters = (int)(((int64_t)256 << 20) / bytes) + 2, rc = 0;
	CollFn fn = collective(b, kind);
	rc |= fn(b, me, &c, in, out) | b->barrier(b, me); /* warm up, and make the communicator */
	int64_t sent0 = mpi_backend_stats(b)->bytes_sent;
	double t0 = MPI_Wtime();
	for (int i = 0; i < iters && rc == 0; i++)
		rc |= fn(b, me, &c, in, out);
	rc |= b->barrier(b, me);
	double t = (MPI_Wtime() - t0) / iters, bus = ring_factor(kind, n) * (double)full * 4 / t;
	double counted = (double)(mpi_backend_stats(b)->bytes_sent - sent0) / iters;
	if (me == 0 && rc == 0)
		printf("%-15s %-7s %5lld MiB %10.3f ms %9.2f GB/s %8.2f %14.0f %14.0f\n", reshard_kind_names[kind],
		       native ? "native" : "ordered", (long long)(bytes >> 20), t * 1e3, bus / 1e9,
		       bus * n / copy_rate, counted, ring_factor(kind, n) * (double)full * 4);
	free(in);
	free(out);
	return rc;
}

/* Every collective and size on one backend; 0 or -1. */
static int bench_all(const Mesh *m, bool native, int max_mib, double copy)
{
	Backend b;
	if (mpi_backend_init(&b, m, native ? MPI_BACKEND_NATIVE : 0) != 0)
		return -1;
	static const ReshardKind kinds[] = {RS_ALL_REDUCE, RS_REDUCE_SCATTER, RS_ALL_GATHER, RS_ALL_TO_ALL};
	int rc = 0;
	for (int k = 0; k < 4; k++) {
		if (native && kinds[k] != RS_ALL_REDUCE && kinds[k] != RS_REDUCE_SCATTER)
			continue; /* moves do not depend on the flag */
		for (int mib = 1; mib <= max_mib && rc == 0; mib *= 4)
			rc = bench_one(&b, kinds[k], native, (int64_t)mib << 20, copy);
	}
	mpi_backend_free(&b);
	return rc;
}

int main(int argc, char **argv)
{
	if (mpi_backend_start() != 0)
		return 2;
	int ndev = mpi_backend_size(), max_mib = argc > 1 ? atoi(argv[1]) : 64;
	if (ndev < 2 || max_mib < 1 || max_mib > 1024) {
		if (mpi_backend_rank() == 0)
			fprintf(stderr, "usage: mpirun -np DEVICES (2 or more) bench_mpi [MAX_MIB (1..1024)]\n");
		return mpi_backend_finish(2);
	}
	Arena arena;
	arena_init(&arena);
	Mesh m = {.naxes = 1, .name = {"d"}, .size = {ndev}};
	mesh_finish(&m, &arena, NULL);
	double copy = mpi_backend_rank() == 0 ? memcpy_rate((size_t)16 << 20) : 1;
	if (mpi_backend_rank() == 0) {
		printf("MPI backend, %d ranks; memcpy %.2f GB/s (rank 0, 16 MiB buffers)\n", ndev, copy / 1e9);
		printf("%-15s %-7s %9s %13s %14s %8s %14s %14s\n", "collective", "order", "size", "time/call", "bus bw/device",
		       "x memcpy", "counted B/call", "ring B/call");
	}
	int rc = bench_all(&m, false, max_mib, copy);
	if (rc == 0)
		rc = bench_all(&m, true, max_mib, copy);
	arena_free(&arena);
	return mpi_backend_finish(rc ? 1 : 0);
}
