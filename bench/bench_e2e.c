/* bench_e2e.c: the whole `spmd run` of eight chained 1024^3 einsums against the eight cblas_sgemm alone.
 *
 *   bench_e2e [REPS [SPMD_BINARY]]     (defaults 7 and the spmd built beside it)
 *
 * Writes the model chain8.yaml (x [N, N], params w1..w8 [N, N],
 * h_i = einsum("ik,kj->ij", h_{i-1}, w_i), outputs [h8]) to a temporary
 * directory, then, REPS times and interleaved so that load on the machine
 * hits every measurement alike (plus one warm-up round):
 *   - 8 chained cblas_sgemm on the same data, in this process;
 *   - `spmd run chain8.yaml`: wall clock of the whole process (start-up,
 *     YAML, data generation, the einsums, printing, exit);
 *   - `spmd check chain8.yaml`: start-up and YAML alone;
 *   - `spmd run --profile chain8.yaml`: the einsums' own time, from its
 *     table, and so the time the same run spent outside them;
 *   - model_load and data_fill of the nine leaves, in this process.
 * Prints the best of each, the ratio run / gemm (goal <= 2.0) and where the
 * rest of the run goes (data generation is a bottleneck if it takes a
 * quarter of the gemm time or more).  Finally checks that spmd's h8 (saved
 * with --save) equals the sgemm chain's. */
#include <cblas.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../runtime/data.h"
#include "../spmd/load.h"
#include "../spmd/npy.h"

#ifndef SPMD_BIN
#define SPMD_BIN "spmd"
#endif

enum { N = 1024, NLAYER = 8 };

extern char **environ;

typedef struct {
	char dir[64];    /* the temporary directory */
	char model[96];  /* DIR/chain8.yaml */
	char out[96];    /* DIR/stdout: what the last spawned process printed */
	char save[96];   /* DIR/save: spmd run --save */
	const char *spmd;
} Files;

/* Best (smallest) times of each measurement, in seconds. */
typedef struct {
	double gemm, run, check, load, fill;
	double prof, prof_ops; /* spmd run --profile: the whole process, its einsums */
	double outside;        /* the least, over rounds, of one profiled run's time outside its einsums */
} Best;

/* Write the chained-einsum model to path; 0 or -1. */
static int model_write(const char *path)
{
	char text[4096];
	int n = snprintf(text, sizeof text, "name: chain8\ninputs:\n  x: {shape: [%d, %d]}\nparams:\n", N, N);
	for (int i = 1; i <= NLAYER; i++)
		n += snprintf(text + n, sizeof text - (size_t)n, "  w%d: {shape: [%d, %d]}\n", i, N, N);
	n += snprintf(text + n, sizeof text - (size_t)n, "ops:\n");
	for (int i = 1; i <= NLAYER; i++) {
		char prev[8];
		snprintf(prev, sizeof prev, i == 1 ? "x" : "h%d", i - 1);
		n += snprintf(text + n, sizeof text - (size_t)n,
		              "  - {out: h%d, op: einsum, in: [%s, w%d], eq: \"ik,kj->ij\"}\n", i, prev, i);
	}
	n += snprintf(text + n, sizeof text - (size_t)n, "outputs: [h%d]\n", NLAYER);
	return file_write_atomic(path, text, (size_t)n);
}

/* Run argv with stdout to f->out and stderr to /dev/null; the wall clock
 * from spawn to exit in *sec.  Returns the exit status, or -1. */
static int spawn_timed(const Files *f, char *const argv[], double *sec)
{
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, f->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	pid_t pid;
	int st = -1;
	double t0 = now_seconds();
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	if (rc == 0 && waitpid(pid, &st, 0) == pid)
		*sec = now_seconds() - t0;
	posix_spawn_file_actions_destroy(&fa);
	return rc == 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The "total" seconds of `spmd run --profile`'s table in f->out, or -1. */
static double profile_total(const Files *f)
{
	size_t n;
	char *text = file_read(f->out, &n);
	double total = -1;
	const char *line = text ? strstr(text, "\ntotal ") : NULL;
	int count;
	if (line && sscanf(line + 1, "total %d %lf", &count, &total) != 2)
		total = -1;
	free(text);
	return total;
}

/* h[i+1] = h[i] @ w[i] for i = 0..NLAYER-1, with h[0] = x. */
static void gemm_chain(float *const *h, float *const *w)
{
	for (int i = 0; i < NLAYER; i++)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, h[i], N, w[i], N, 0.0f,
		            h[i + 1], N);
}

/* Load the model, time it, and make its leaves (seed 0, as spmd run does)
 * into leaf[0..NLAYER] (x, w1..w8); the fill time in *fill.  0 or -1. */
static int leaves_make(const Files *f, Tensor *leaf, double *load, double *fill)
{
	Graph g;
	Diag d;
	diag_init(&d);
	double t0 = now_seconds();
	if (model_load(&g, f->model, &d) != 0) {
		graph_free(&g);
		return -1;
	}
	*load = now_seconds() - t0;
	t0 = now_seconds();
	for (int i = 0; i <= NLAYER; i++) {
		char name[8];
		snprintf(name, sizeof name, i == 0 ? "x" : "w%d", i);
		const Value *v = &g.values.a[graph_find(&g, name)];
		tensor_free(&leaf[i]);
		tensor_alloc(&leaf[i], DT_F32, &v->shape);
		data_fill(&leaf[i], v, &v->shape, NULL, 0, 1000);
	}
	*fill = now_seconds() - t0;
	graph_free(&g);
	return 0;
}

static double min2(double a, double b) { return a < b ? a : b; }

/* One round of every measurement; keeps the best in b.  0 or -1. */
static int round_run(const Files *f, Tensor *leaf, float **h, Best *b)
{
	char *run[] = {(char *)f->spmd, "run", (char *)f->model, NULL};
	char *check[] = {(char *)f->spmd, "check", (char *)f->model, NULL};
	char *prof[] = {(char *)f->spmd, "run", "--profile", (char *)f->model, NULL};
	float *w[NLAYER];
	double load, fill, t_run = 0, t_check = 0, t_prof = 0;
	if (leaves_make(f, leaf, &load, &fill) != 0)
		return -1;
	h[0] = tensor_f32(&leaf[0]);
	for (int i = 0; i < NLAYER; i++)
		w[i] = tensor_f32(&leaf[i + 1]);
	double t0 = now_seconds();
	gemm_chain(h, w);
	double gemm = now_seconds() - t0;
	if (spawn_timed(f, run, &t_run) != 0 || spawn_timed(f, check, &t_check) != 0 ||
	    spawn_timed(f, prof, &t_prof) != 0 || profile_total(f) < 0)
		return -1;
	double ops = profile_total(f);
	*b = (Best){min2(b->gemm, gemm), min2(b->run, t_run), min2(b->check, t_check), min2(b->load, load),
	            min2(b->fill, fill), min2(b->prof, t_prof), min2(b->prof_ops, ops), min2(b->outside, t_prof - ops)};
	return 0;
}

/* Largest |spmd's saved h8 - the sgemm chain's h8|, or -1 if it cannot be had. */
static double output_diff(const Files *f, const float *h8)
{
	char *argv[] = {(char *)f->spmd, "run", (char *)f->model, "--save", (char *)f->save, NULL};
	char path[128];
	double sec, maxdiff = -1;
	Tensor t;
	Diag d;
	diag_init(&d);
	snprintf(path, sizeof path, "%s/h%d.npy", f->save, NLAYER);
	if (spawn_timed(f, argv, &sec) != 0 || npy_read(path, &t, &d) != 0)
		return -1;
	if (shape_numel(&t.shape) == (int64_t)N * N) {
		maxdiff = 0;
		for (int64_t i = 0; i < (int64_t)N * N; i++)
			maxdiff = fmax(maxdiff, fabs(tensor_f32(&t)[i] - h8[i]));
	}
	tensor_free(&t);
	unlink(path);
	rmdir(f->save);
	return maxdiff;
}

static void report(const Best *b, int reps, double maxdiff)
{
	double flop = 2.0 * NLAYER * (double)N * N * N, ratio = b->run / b->gemm;
	printf("end to end: %d chained einsums ik,kj->ij, f32 %d^3, best of %d\n", NLAYER, N, reps);
	printf("  %d x cblas_sgemm, in process   %8.1f ms  %6.1f GFLOP/s\n", NLAYER, b->gemm * 1e3,
	       flop / b->gemm * 1e-9);
	printf("  spmd run, whole process       %8.1f ms  %6.1f GFLOP/s\n", b->run * 1e3, flop / b->run * 1e-9);
	printf("  ratio run / gemm              %8.2f     (goal <= 2.0: %s)\n", ratio, ratio <= 2.0 ? "holds" : "MISSED");
	printf("where the run goes (best of %d each)\n", reps);
	printf("  spmd run --profile, whole     %8.1f ms\n", b->prof * 1e3);
	printf("    einsums (its table)         %8.1f ms  (%.2f x the sgemm chain)\n", b->prof_ops * 1e3,
	       b->prof_ops / b->gemm);
	printf("    all but the einsums         %8.1f ms  (%.2f x the sgemm chain; whole - einsums of one run)\n",
	       b->outside * 1e3, b->outside / b->gemm);
	printf("      start-up + YAML           %8.1f ms  (spmd check, a process of its own)\n", b->check * 1e3);
	printf("        of which model_load     %8.1f ms  (in this process)\n", b->load * 1e3);
	printf("      data generation           %8.1f ms  (data_fill of the %d leaves in this process, %.0f M "
	       "elements/s)\n", b->fill * 1e3, NLAYER + 1, (NLAYER + 1.0) * N * N / b->fill * 1e-6);
	printf("  data generation / gemm        %8.2f     (%s)\n", b->fill / b->gemm,
	       b->fill < 0.25 * b->gemm ? "not the bottleneck" : "A BOTTLENECK");
	printf("spmd's h%d against the sgemm chain's: max |diff| %g\n", NLAYER, maxdiff);
}

/* Make the temporary directory and the model in it; 0 or -1. */
static int files_make(Files *f, const char *spmd)
{
	snprintf(f->dir, sizeof f->dir, "/tmp/bench_e2e.XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	snprintf(f->model, sizeof f->model, "%s/chain8.yaml", f->dir);
	snprintf(f->out, sizeof f->out, "%s/stdout", f->dir);
	snprintf(f->save, sizeof f->save, "%s/save", f->dir);
	f->spmd = spmd;
	return model_write(f->model);
}

static void files_remove(const Files *f)
{
	unlink(f->model);
	unlink(f->out);
	rmdir(f->dir);
}

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 7;
	Files f;
	if (reps <= 0 || argc > 3) {
		fprintf(stderr, "usage: bench_e2e [REPS [SPMD_BINARY]]\n");
		return 2;
	}
	if (files_make(&f, argc > 2 ? argv[2] : SPMD_BIN) != 0) {
		fprintf(stderr, "bench_e2e: cannot write the model in /tmp\n");
		return 1;
	}
	Tensor leaf[NLAYER + 1] = {{0}}, hs[NLAYER];
	float *h[NLAYER + 1];
	Shape s = {2, {N, N}};
	for (int i = 0; i < NLAYER; i++)
		tensor_alloc(&hs[i], DT_F32, &s), h[i + 1] = tensor_f32(&hs[i]);
	Best b = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY}, warm = b;
	int rc = 0;
	for (int r = 0; r <= reps && rc == 0; r++) /* r == 0 warms up */
		rc = round_run(&f, leaf, h, r == 0 ? &warm : &b);
	if (rc != 0)
		fprintf(stderr, "bench_e2e: %s failed on %s\n", f.spmd, f.model);
	else
		report(&b, reps, output_diff(&f, h[NLAYER]));
	for (int i = 0; i <= NLAYER; i++)
		tensor_free(&leaf[i]);
	for (int i = 0; i < NLAYER; i++)
		tensor_free(&hs[i]);
	files_remove(&f);
	return rc != 0;
}
