/* bench_collectives.c: bandwidth of the thread backend's collectives, as a ratio to memcpy measured in the same run.
 *
 * usage: bench_collectives [DEVICES [MAX_MIB]]   (defaults 4 and 64)
 *
 * For each collective and a full-buffer size S of 1, 4, 16, 64 MiB (the
 * buffer each device holds before an all_reduce, reduce_scatter or
 * all_to_all, after an all_gather), prints the time per call, the bus
 * bandwidth per device — the ring traffic of the collective, (n-1)/n * S for
 * all_gather, reduce_scatter and all_to_all and 2(n-1)/n * S for all_reduce,
 * divided by the time — and the ratio of all devices' bus bandwidth to a
 * single memcpy stream's. */
#include <string.h>

#include "../runtime/threads.h"

typedef struct {
	ReshardKind kind;
	int ndev;
	int64_t full;   /* elements of the full buffer */
	int iters;
	float **in, **out;
	double seconds; /* device 0: from the first to the last barrier */
} Bench;

static int bench_body(int device, void *arg, Backend *b)
{
	Bench *B = arg;
	int64_t n_in = B->kind == RS_ALL_GATHER ? B->full / B->ndev : B->full;
	Coll c = {.nax = 1, .axes = {0}, .dtype = DT_F32, .rank = 1, .shape = {n_in}, .dim = 0, .dim2 = 0};
	CollFn fn = B->kind == RS_ALL_REDUCE       ? b->all_reduce
	            : B->kind == RS_REDUCE_SCATTER ? b->reduce_scatter
	            : B->kind == RS_ALL_GATHER     ? b->all_gather
	                                           : b->all_to_all;
	if (fn(b, device, &c, B->in[device], B->out[device]) != 0 || b->barrier(b, device) != 0) /* warm up */
		return -1;
	double t0 = now_seconds();
	for (int i = 0; i < B->iters; i++)
		if (fn(b, device, &c, B->in[device], B->out[device]) != 0)
			return -1;
	if (b->barrier(b, device) != 0)
		return -1;
	if (device == 0)
		B->seconds = now_seconds() - t0;
	return 0;
}

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

static double ring_factor(ReshardKind k, int n)
{
	return (k == RS_ALL_REDUCE ? 2.0 : 1.0) * (n - 1) / n;
}

static int bench_one(const Mesh *m, ReshardKind kind, int64_t bytes, double copy_rate)
{
	Bench B = {.kind = kind, .ndev = m->ndev, .full = bytes / 4};
	B.full -= B.full % (m->ndev * m->ndev);
	B.iters = (int)(((int64_t)256 << 20) / bytes) + 2;
	B.in = xcalloc((size_t)m->ndev, sizeof *B.in);
	B.out = xcalloc((size_t)m->ndev, sizeof *B.out);
	for (int d = 0; d < m->ndev; d++) {
		B.in[d] = xcalloc((size_t)B.full, sizeof(float));
		B.out[d] = xcalloc((size_t)B.full, sizeof(float));
		for (int64_t i = 0; i < B.full; i++)
			B.in[d][i] = (float)(i % 97) * 0.5f + (float)d;
	}
	int rc = threads_run(m, bench_body, &B);
	if (rc == 0) {
		double t = B.seconds / B.iters, bus = ring_factor(kind, m->ndev) * (double)B.full * 4 / t;
		printf("%-15s %5lld MiB %10.3f ms %9.2f GB/s %8.2f\n", reshard_kind_names[kind],
		       (long long)(bytes >> 20), t * 1e3, bus / 1e9, bus * m->ndev / copy_rate);
	}
	for (int d = 0; d < m->ndev; d++) {
		free(B.in[d]);
		free(B.out[d]);
	}
	free(B.in);
	free(B.out);
	return rc;
}

int main(int argc, char **argv)
{
	int ndev = argc > 1 ? atoi(argv[1]) : 4, max_mib = argc > 2 ? atoi(argv[2]) : 64;
	if (ndev < 2 || ndev > 64 || max_mib < 1 || max_mib > 1024) {
		fprintf(stderr, "usage: bench_collectives [DEVICES (2..64) [MAX_MIB (1..1024)]]\n");
		return 2;
	}
	Arena arena;
	arena_init(&arena);
	Mesh m = {.naxes = 1, .name = {"d"}, .size = {ndev}};
	mesh_finish(&m, &arena, NULL);
	double copy = memcpy_rate((size_t)16 << 20);
	printf("thread backend, %d devices; memcpy %.2f GB/s (one thread, 16 MiB buffers)\n", ndev, copy / 1e9);
	printf("%-15s %9s %13s %14s %8s\n", "collective", "size", "time/call", "bus bw/device", "x memcpy");
	static const ReshardKind kinds[] = {RS_ALL_REDUCE, RS_REDUCE_SCATTER, RS_ALL_GATHER, RS_ALL_TO_ALL};
	int rc = 0;
	for (int k = 0; k < 4; k++)
		for (int mib = 1; mib <= max_mib && rc == 0; mib *= 4)
			rc = bench_one(&m, kinds[k], (int64_t)mib << 20, copy);
	arena_free(&arena);
	return rc ? 1 : 0;
}
