/* bench_einsum.c: the einsum kernel on "ik,kj->ij" against a direct cblas_sgemm on the same data, and data generation.
 *
 *   bench_einsum [N [REPS]]     (default 1024, 10)
 *
 * Prints the best time of REPS runs of each (interleaved, so load on the
 * machine hits both alike), their GFLOP/s and the ratio kernel/sgemm (the
 * goal is >= 0.9), and the time data_fill takes to make the operands (best
 * of 3). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "../runtime/data.h"
#include "../runtime/kernels.h"

/* The graph a @ b -> c with an einsum op; returns the op id. */
static int build(Graph *g, int64_t n)
{
	Shape s = {2, {n, n}};
	graph_init(g);
	int a = graph_value(g, "a", DT_F32, &s, VK_INPUT, (Pos){0});
	int b = graph_value(g, "b", DT_F32, &s, VK_INPUT, (Pos){0});
	int c = graph_value(g, "c", DT_F32, &s, VK_INTER, (Pos){0});
	int op = graph_op(g, OP_EINSUM, (int[]){a, b}, 2, c, (Pos){0});
	Attr *at = g->ops.a[op].attr;
	at->eq = "ik,kj->ij";
	at->nlet[0] = at->nlet[1] = at->nlet[2] = 2;
	memcpy(at->let[0], "ik", 2), memcpy(at->let[1], "kj", 2), memcpy(at->let[2], "ij", 2);
	return op;
}

int main(int argc, char **argv)
{
	int64_t n = argc > 1 ? atoll(argv[1]) : 1024;
	int reps = argc > 2 ? atoi(argv[2]) : 10;
	if (n <= 0 || n > 16384 || reps <= 0) {
		fprintf(stderr, "usage: bench_einsum [N (1..16384) [REPS]]\n");
		return 2;
	}
	Graph g;
	int op = build(&g, n);
	Tensor t[4];
	for (int i = 0; i < 4; i++)
		tensor_alloc(&t[i], DT_F32, &g.values.a[i < 3 ? i : 2].shape);
	double gen = INFINITY; /* best of 3; the first also touches fresh pages */
	for (int r = 0; r < 3; r++) {
		double t0 = now_seconds();
		for (int i = 0; i < 2; i++)
			data_fill(&t[i], &g.values.a[i], &g.values.a[i].shape, NULL, 1, 1000);
		gen = fmin(gen, now_seconds() - t0);
	}

	const Tensor *in[2] = {&t[0], &t[1]};
	KernCtx kc = {{0}, NULL, 0};
	double best_k = INFINITY, best_b = INFINITY;
	for (int r = 0; r <= reps; r++) { /* r == 0 warms up */
		double s = now_seconds();
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, tensor_f32(&t[0]),
		            (int)n, tensor_f32(&t[1]), (int)n, 0.0f, tensor_f32(&t[3]), (int)n);
		double tb = now_seconds() - s;
		s = now_seconds();
		if (kern_einsum(&kc, &g.ops.a[op], in, &t[2]) != 0) {
			fprintf(stderr, "bench_einsum: kernel failed: %s\n", kc.err);
			return 1;
		}
		double tk = now_seconds() - s;
		if (r > 0) {
			best_b = tb < best_b ? tb : best_b;
			best_k = tk < best_k ? tk : best_k;
		}
	}
	double maxdiff = 0;
	for (int64_t i = 0; i < n * n; i++)
		maxdiff = fmax(maxdiff, fabs(tensor_f32(&t[2])[i] - tensor_f32(&t[3])[i]));
	double flop = 2.0 * (double)n * (double)n * (double)n;
	printf("einsum ik,kj->ij  f32  %lld^3, best of %d\n", (long long)n, reps);
	printf("  cblas_sgemm     %8.2f ms  %7.1f GFLOP/s\n", best_b * 1e3, flop / best_b * 1e-9);
	printf("  kern_einsum     %8.2f ms  %7.1f GFLOP/s\n", best_k * 1e3, flop / best_k * 1e-9);
	printf("  ratio           %8.3f  (goal >= 0.9)   max |diff| %g\n", best_b / best_k, maxdiff);
	printf("data_fill         %8.2f ms for 2 x %lld^2 normals (%.0f M/s); 9 matrices ~%.1f ms vs 8 sgemm %.1f ms\n",
	       gen * 1e3, (long long)n, 2.0 * (double)(n * n) / gen * 1e-6, gen * 4.5e3, best_b * 8e3);
	for (int i = 0; i < 4; i++)
		tensor_free(&t[i]);
	graph_free(&g);
	return 0;
}
