/* test_mpi_backend.c: the MPI backend's collectives against naive loops on 6 ranks (the test runs mpirun on itself).
 *
 * Run by ctest without mpirun, the test starts `mpirun -np 6` on its own
 * binary (bounded by timeout) and passes if every rank passed.  Each rank
 * then checks, on the mesh {a: 2, b: 3} with and without a device order,
 * every collective over the axes [b], [a], [a, b] and [b, a] (groups of 3, 2
 * and 6, in both member orders) against the definition in
 * docs/collectives.md computed by plain loops from every device's input:
 * float sums bit for bit in member order (the default) and within rounding
 * with MPI_BACKEND_NATIVE; packing along a middle dim; permutes with a
 * shift and with a -1 target; and the bytes each rank counts against the
 * partitioner's formula (reshard_bytes_sent). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/mpi_backend.h"

enum { NRANKS = 6 };

/* ---- the checks, on every rank ---- */

typedef struct {
	Backend b;
	int me, failures;
	bool native;
	const char *mesh_name;
} T;

/* Element i of device d's input: big and small parts, so that the order of
 * a float sum shows in its bits. */
static float input_of(int d, int64_t i, DType dt)
{
	int64_t h = (d * 7 + i * 3) % 11 - 5;
	if (dt == DT_I32)
		return (float)(h * 1000 + d * 10 + i % 10);
	return (float)h * 1e7f + (float)(d + 1) * 0.37f + (float)(i % 13) * 0.01f;
}

static void fill(void *buf, int d, int64_t n, DType dt)
{
	for (int64_t i = 0; i < n; i++) {
		if (dt == DT_I32)
			((int32_t *)buf)[i] = (int32_t)input_of(d, i, dt);
		else
			((float *)buf)[i] = input_of(d, i, dt);
	}
}

static double value_at(const void *buf, int64_t i, DType dt)
{
	return dt == DT_I32 ? ((const int32_t *)buf)[i] : ((const float *)buf)[i];
}

static void report_bad(T *t, const char *what, const Coll *c, int64_t i, double got, double want)
{
	if (t->failures++ < 5)
		fprintf(stderr, "rank %d (%s%s, axes %d:[%d,%d]): %s: element %lld is %.9g, expected %.9g\n", t->me,
		        t->mesh_name, t->native ? ", native" : "", c->nax, c->axes[0], c->nax > 1 ? c->axes[1] : -1, what,
		        (long long)i, got, want);
}

static int64_t numel(const int64_t *shape, int rank)
{
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= shape[d];
	return n;
}

/* Flat index <-> multi-index in shape. */
static void unflatten(int64_t i, const int64_t *shape, int rank, int64_t *idx)
{
	for (int d = rank - 1; d >= 0; d--)
		idx[d] = i % shape[d], i /= shape[d];
}

static int64_t flatten(const int64_t *idx, const int64_t *shape, int rank)
{
	int64_t i = 0;
	for (int d = 0; d < rank; d++)
		i = i * shape[d] + idx[d];
	return i;
}

/* The reduction over the group of element i, left to right in member order. */
static double reduce_naive(const Coll *c, const int *g, int n, int64_t i)
{
	if (c->dtype == DT_I32) {
		int32_t acc = (int32_t)input_of(g[0], i, DT_I32);
		for (int j = 1; j < n; j++) {
			int32_t x = (int32_t)input_of(g[j], i, DT_I32);
			acc = c->reduce == REDUCE_MAX ? (x > acc ? x : acc) : acc + x;
		}
		return acc;
	}
	float acc = input_of(g[0], i, DT_F32);
	for (int j = 1; j < n; j++) {
		float x = input_of(g[j], i, DT_F32);
		acc = c->reduce == REDUCE_MAX ? (x > acc ? x : acc) : acc + x;
	}
	return acc;
}

/* Is got close enough to want: exact, or (native float sums) within rounding of the summands. */
static bool agrees(const T *t, const Coll *c, double got, double want)
{
	if (!t->native || c->dtype == DT_I32 || c->reduce == REDUCE_MAX)
		return got == want;
	return fabs(got - want) <= 6 * 3e8 * 1.2e-7; /* 6 roundings of sums below 3e8 */
}

/* What member k of group g should hold at output element i. */
typedef double (*WantFn)(const Coll *c, const int *g, int n, int k, int64_t i);

static double want_all_reduce(const Coll *c, const int *g, int n, int k, int64_t i) { return reduce_naive(c, g, n, i); }

static double want_reduce_scatter(const Coll *c, const int *g, int n, int k, int64_t i)
{
	int64_t os[MAX_RANK], idx[MAX_RANK] = {0};
	memcpy(os, c->shape, sizeof os);
	os[c->dim] /= n;
	unflatten(i, os, c->rank, idx);
	idx[c->dim] += k * os[c->dim];
	return reduce_naive(c, g, n, flatten(idx, c->shape, c->rank));
}

static double want_all_gather(const Coll *c, const int *g, int n, int k, int64_t i)
{
	int64_t os[MAX_RANK], idx[MAX_RANK] = {0};
	memcpy(os, c->shape, sizeof os);
	os[c->dim] *= n;
	unflatten(i, os, c->rank, idx);
	int j = (int)(idx[c->dim] / c->shape[c->dim]);
	idx[c->dim] %= c->shape[c->dim];
	return input_of(g[j], flatten(idx, c->shape, c->rank), c->dtype);
}

/* Member k's output block j along dim2 is block k along dim of member j's input. */
static double want_all_to_all(const Coll *c, const int *g, int n, int k, int64_t i)
{
	int64_t os[MAX_RANK], idx[MAX_RANK] = {0};
	memcpy(os, c->shape, sizeof os);
	os[c->dim] /= n;
	int64_t blk = os[c->dim2];
	os[c->dim2] *= n;
	unflatten(i, os, c->rank, idx);
	int j = (int)(idx[c->dim2] / blk);
	idx[c->dim2] %= blk;
	idx[c->dim] += k * (c->shape[c->dim] / n);
	return input_of(g[j], flatten(idx, c->shape, c->rank), c->dtype);
}

/* Run collective fn on this rank and compare every output element. */
static void check(T *t, const char *what, CollFn fn, ReshardKind kind, const Coll *c, WantFn want)
{
	int g[NRANKS], n = 1, k;
	for (int i = 0; i < c->nax; i++)
		n *= t->b.mesh->size[c->axes[i]];
	k = mesh_group(t->b.mesh, t->me, c->axes, c->nax, g);
	int64_t nin = numel(c->shape, c->rank), nout = coll_out_numel(kind, c, t->b.mesh);
	void *in = xmalloc((size_t)nin * 4), *out = xmalloc((size_t)nout * 4);
	fill(in, t->me, nin, c->dtype);
	int64_t before = mpi_backend_stats(&t->b)->bytes_sent;
	if (fn(&t->b, t->me, c, in, out) != 0)
		report_bad(t, what, c, -1, -1, 0);
	for (int64_t i = 0; i < nout; i++) {
		double got = value_at(out, i, c->dtype), w = want(c, g, n, k, i);
		if (!agrees(t, c, got, w)) {
			report_bad(t, what, c, i, got, w);
			break;
		}
	}
	int64_t sent = mpi_backend_stats(&t->b)->bytes_sent - before;
	if (nin % n == 0 && sent != reshard_bytes_sent(kind, 4 * nin, n))
		report_bad(t, "bytes sent", c, 0, (double)sent, (double)reshard_bytes_sent(kind, 4 * nin, n));
	free(in);
	free(out);
}

static Coll coll(const int *axes, int nax, int rank, const int64_t *shape, int dim, int dim2)
{
	Coll c = {.nax = nax, .dtype = DT_F32, .rank = rank, .dim = dim, .dim2 = dim2, .reduce = REDUCE_SUM};
	memcpy(c.axes, axes, sizeof(int) * (size_t)nax);
	memcpy(c.shape, shape, sizeof(int64_t) * (size_t)rank);
	return c;
}

/* Every collective over one list of axes. */
static void check_axes(T *t, const int *axes, int nax)
{
	int n = 1;
	for (int i = 0; i < nax; i++)
		n *= t->b.mesh->size[axes[i]];
	Coll c = coll(axes, nax, 2, (int64_t[]){7, 5}, 0, 0); /* 35 elements: uneven pieces */
	check(t, "all_reduce sum", t->b.all_reduce, RS_ALL_REDUCE, &c, want_all_reduce);
	c.reduce = REDUCE_MAX;
	check(t, "all_reduce max", t->b.all_reduce, RS_ALL_REDUCE, &c, want_all_reduce);
	c.dtype = DT_I32, c.reduce = REDUCE_SUM;
	check(t, "all_reduce i32", t->b.all_reduce, RS_ALL_REDUCE, &c, want_all_reduce);
	c = coll(axes, nax, 2, (int64_t[]){n * 2, 6}, 0, 0);
	check(t, "all_reduce even", t->b.all_reduce, RS_ALL_REDUCE, &c, want_all_reduce);
	c = coll(axes, nax, 3, (int64_t[]){3, 2 * n, 2}, 1, 0); /* a middle dim: packed */
	check(t, "reduce_scatter dim 1", t->b.reduce_scatter, RS_REDUCE_SCATTER, &c, want_reduce_scatter);
	c.dtype = DT_I32, c.reduce = REDUCE_MAX;
	check(t, "reduce_scatter i32 max", t->b.reduce_scatter, RS_REDUCE_SCATTER, &c, want_reduce_scatter);
	c = coll(axes, nax, 2, (int64_t[]){n, 4}, 0, 0);
	check(t, "reduce_scatter dim 0", t->b.reduce_scatter, RS_REDUCE_SCATTER, &c, want_reduce_scatter);
	c = coll(axes, nax, 2, (int64_t[]){2, 3}, 1, 0);
	check(t, "all_gather dim 1", t->b.all_gather, RS_ALL_GATHER, &c, want_all_gather);
	c = coll(axes, nax, 2, (int64_t[]){2, 3}, 0, 0);
	check(t, "all_gather dim 0", t->b.all_gather, RS_ALL_GATHER, &c, want_all_gather);
	c = coll(axes, nax, 2, (int64_t[]){n * 2, n * 3}, 1, 0);
	check(t, "all_to_all 1->0", t->b.all_to_all, RS_ALL_TO_ALL, &c, want_all_to_all);
	c = coll(axes, nax, 2, (int64_t[]){n * 2, 3}, 0, 1);
	check(t, "all_to_all 0->1", t->b.all_to_all, RS_ALL_TO_ALL, &c, want_all_to_all);
	c = coll(axes, nax, 3, (int64_t[]){2, n * 2, 3}, 1, 1);
	check(t, "all_to_all 1->1", t->b.all_to_all, RS_ALL_TO_ALL, &c, want_all_to_all);
}

/* A permute by target: device d's buffer lands on target[d]; nobody's: zeros. */
static void check_permute(T *t, const int *target)
{
	int from = -1;
	for (int d = 0; d < NRANKS; d++)
		if (target[d] == t->me)
			from = d;
	Coll c = coll((int[]){0}, 1, 2, (int64_t[]){3, 4}, 0, 0);
	c.target = target;
	float in[12], out[12];
	fill(in, t->me, 12, DT_F32);
	if (t->b.permute(&t->b, t->me, &c, in, out) != 0)
		report_bad(t, "permute", &c, -1, -1, 0);
	for (int i = 0; i < 12; i++) {
		double w = from < 0 ? 0 : input_of(from, i, DT_F32);
		if (out[i] != w) {
			report_bad(t, "permute", &c, i, out[i], w);
			break;
		}
	}
}

static void check_mesh(T *t, const int *devices, const char *name, bool native)
{
	Arena a;
	arena_init(&a);
	Mesh m = {.naxes = 2, .name = {"a", "b"}, .size = {2, 3}};
	mesh_finish(&m, &a, devices);
	t->mesh_name = name;
	t->native = native;
	if (mpi_backend_init(&t->b, &m, native ? MPI_BACKEND_NATIVE : 0) != 0) {
		fprintf(stderr, "rank %d: mpi_backend_init failed\n", t->me);
		t->failures++;
		arena_free(&a);
		return;
	}
	static const int lists[][2] = {{1, -1}, {0, -1}, {0, 1}, {1, 0}};
	for (int i = 0; i < 4; i++)
		check_axes(t, lists[i], lists[i][1] < 0 ? 1 : 2);
	int shift[NRANKS], chain[NRANKS] = {1, 2, 3, 4, 5, -1};
	mesh_shift_targets(&m, 1, 1, shift);
	check_permute(t, shift);
	check_permute(t, chain);
	if (t->b.barrier(&t->b, t->me) != 0)
		t->failures++;
	mpi_backend_free(&t->b);
	arena_free(&a);
}

/* Do the inputs make a float sum's order show in its bits?  (Else the
 * exact checks could not catch a backend reducing in another order.) */
static bool order_shows(void)
{
	int fwd[3] = {0, 1, 2}, rev[3] = {2, 1, 0}, diff = 0;
	Coll c = {.dtype = DT_F32, .reduce = REDUCE_SUM};
	for (int64_t i = 0; i < 35; i++)
		diff += reduce_naive(&c, fwd, 3, i) != reduce_naive(&c, rev, 3, i);
	return diff > 0;
}

static int worker(void)
{
	if (mpi_backend_start() != 0)
		return 1;
	T t = {.me = mpi_backend_rank()};
	if (!order_shows()) {
		fprintf(stderr, "test_mpi_backend: the inputs do not make the order of a sum show\n");
		t.failures++;
	}
	if (mpi_backend_size() != NRANKS) {
		fprintf(stderr, "test_mpi_backend: expected %d ranks, found %d\n", NRANKS, mpi_backend_size());
		t.failures++;
	} else
		for (int native = 0; native < 2; native++) {
			check_mesh(&t, NULL, "{a: 2, b: 3}", native);
			check_mesh(&t, (int[]){5, 3, 1, 0, 2, 4}, "{a: 2, b: 3} devices [5, 3, 1, 0, 2, 4]", native);
		}
	return mpi_backend_finish(t.failures ? 1 : 0);
}

/* ---- the launcher, under ctest ---- */

static void runs_on_six_ranks(void **state)
{
	(void)state;
	char self[4096], cwd[4096], cmd[10000];
	assert_non_null(getcwd(cwd, sizeof cwd)); /* ctest runs tests in the source folder */
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	assert_true(n > 0);
	self[n] = 0;
	/* LSan: Open MPI's own allocations at exit (tests/lsan_mpi.supp), our code still checked */
	snprintf(cmd, sizeof cmd,
	         "LSAN_OPTIONS=suppressions=%s/tests/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0 timeout 120 mpirun %s "
	         "--oversubscribe -np %d '%s'",
	         cwd, geteuid() == 0 ? "--allow-run-as-root" : "", NRANKS, self);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	if (getenv("OMPI_COMM_WORLD_SIZE")) /* started by mpirun: one of the ranks */
		return worker();
	const struct CMUnitTest tests[] = {cmocka_unit_test(runs_on_six_ranks)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
