/* bench_scale.c: load, propagation and partition time of N-layer transformers, on an 8- and a 1024-device mesh.
 *
 *   bench_scale [REPS [SPMD_BINARY]]     (defaults 3 and the spmd built beside it)
 *
 * For N = 24, 96, 384, 1200, 2400 and 4800 layers of the block of
 * examples/transformer_block.yaml (gen_transformer.c; 21 ops a layer, so
 * 4800 layers are 100,800 ops), on the meshes {data: 2, model: 4} and
 * {data: 32, model: 32} (the same shapes, divisible on both: batch 32,
 * 32 heads), the model is written to a temporary file and measured REPS
 * times, the best kept (small models get more repetitions, up to 30), the
 * two meshes taken in turn so that load on the machine hits both alike:
 *   - in this process: model_load, propagate, partition and emit_text (the
 *     program's YAML in memory), each timed apart (the table `stages`), in
 *     wall clock and in CPU time of the thread;
 *   - as processes: `spmd check MODEL` and `spmd partition MODEL -o PROGRAM`,
 *     wall clock and CPU time, with the size of the program written.
 * Prints the op counts, the times, (propagation + partition) / load, the
 * cost of doubling the ops between successive N and fitted over all N, the
 * 1024-device figures against the 8-device ones, and whether each goal holds:
 *   100,000 ops propagated and partitioned in under 1 s;
 *   `spmd partition` within 3x `spmd check`;
 *   twice the ops cost at most 2.2x the time;
 *   a 1024-device mesh costs what an 8-device one does (time and output).
 * Growth and the mesh comparison use CPU time: on a shared machine the wall
 * clock of a long run takes whatever the other jobs leave it. */
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gen_transformer.h"
#include "../partitioner/partition.h"
#include "../partitioner/propagate.h"
#include "../spmd/emit.h"
#include "../spmd/load.h"
#include "../spmd/ops.h"

#ifndef SPMD_BIN
#define SPMD_BIN "spmd"
#endif

extern char **environ;

static const int layer_counts[] = {24, 96, 384, 1200, 2400, 4800};
enum { NSIZES = sizeof layer_counts / sizeof layer_counts[0], NMESH = 2 };
static const int mesh_shape[NMESH][2] = {{2, 4}, {32, 32}};

/* The files a run uses, in a temporary directory. */
typedef struct {
	char dir[32];
	char model[NMESH][64]; /* the model on each mesh */
	char out[64];          /* what a spawned command printed */
	char prog[64];         /* what spmd partition -o wrote */
	const char *spmd;
} Tmp;

/* One model going through the pipeline. */
typedef struct {
	const char *path;
	Graph src, dst;
	Propagation prop;
	char *text;     /* the emitted program */
	size_t ntext;
	Diag d;
} Pipe;

static int st_load(Pipe *p) { return model_load(&p->src, p->path, &p->d); }
static int st_propagate(Pipe *p) { return propagate(&p->src, NULL, &p->prop, &p->d); }
static int st_partition(Pipe *p) { return partition(&p->src, &p->dst, NULL, NULL, &p->d); }
static int st_emit(Pipe *p) { return (p->text = emit_text(&p->dst, -1, &p->ntext)) ? 0 : -1; }

/* The stages, timed one by one in this order (a stage without a function
 * would print "n/a").  Emission makes the program's text in memory, as
 * `spmd partition -o` does before writing it. */
enum { ST_LOAD, ST_PROPAGATE, ST_PARTITION, ST_EMIT, NSTAGES };
static const struct {
	const char *name;
	int (*run)(Pipe *);
} stages[NSTAGES] = {
	[ST_LOAD] = {"load", st_load},
	[ST_PROPAGATE] = {"propagate", st_propagate},
	[ST_PARTITION] = {"partition", st_partition},
	[ST_EMIT] = {"emit", st_emit},
};

/* What one (N, mesh) measured; times are the best of the repetitions, in
 * seconds, and negative when not measured. */
typedef struct {
	int nlayer, ndev;
	long src_ops, dst_ops, ncoll;
	size_t dst_bytes;     /* the partitioned graph's arena */
	size_t text_bytes;    /* the emitted program */
	double t[NSTAGES];    /* wall clock */
	double cpu[NSTAGES];  /* CPU time of this thread: what load on the machine disturbs least */
	double check, part;   /* processes: spmd check, spmd partition -o */
	double check_cpu, part_cpu; /* their CPU time */
	long part_out;        /* bytes of the program spmd partition -o wrote */
	bool failed;
} Result;

static double best(double old, double t) { return old < 0 || t < old ? t : old; }

/* CPU seconds of the calling thread. */
static double cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Release what stages 0 .. done-1 made (each initialises its result even
 * when it fails). */
static void pipe_free(Pipe *p, int done)
{
	free(p->text);
	if (done > ST_PARTITION)
		graph_free(&p->dst);
	if (done > ST_PROPAGATE)
		propagation_free(&p->prop);
	graph_free(&p->src);
}

/* Run and time every stage once into r (keeping the best); 0 or -1 after
 * the failing stage reported to stderr. */
static int pipe_once(const char *path, Result *r)
{
	Pipe p = {.path = path};
	diag_init(&p.d);
	int done = 0, rc = 0;
	for (; done < NSTAGES && rc == 0; done++) {
		if (!stages[done].run)
			continue;
		double t0 = now_seconds(), c0 = cpu_seconds();
		rc = stages[done].run(&p);
		r->cpu[done] = best(r->cpu[done], cpu_seconds() - c0);
		r->t[done] = best(r->t[done], now_seconds() - t0);
	}
	if (rc == 0) {
		r->src_ops = p.src.ops.n, r->dst_ops = p.dst.ops.n, r->dst_bytes = p.dst.arena.used;
		r->text_bytes = p.ntext;
		r->ncoll = 0;
		for (int i = 0; i < p.dst.ops.n; i++)
			r->ncoll += (op_table[p.dst.ops.a[i].kind].flags & OPF_COLLECTIVE) != 0;
	} else
		fprintf(stderr, "bench_scale: %s failed on %s (%d layers, %d devices)\n", stages[done - 1].name, path,
		        r->nlayer, r->ndev);
	pipe_free(&p, done);
	return rc;
}

/* Run argv with stdout to `out`; wall clock from spawn to exit in *sec,
 * the child's CPU time (user + system, all threads) in *cpu.  The exit
 * status, or -1. */
static int spawn_timed(char *const argv[], const char *out, double *sec, double *cpu)
{
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	pid_t pid;
	int st = -1;
	struct rusage ru;
	double t0 = now_seconds();
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	if (rc == 0 && wait4(pid, &st, 0, &ru) == pid) {
		*sec = now_seconds() - t0;
		*cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
		       1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
	}
	posix_spawn_file_actions_destroy(&fa);
	return rc == 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Time `spmd check MODEL` and `spmd partition MODEL -o PROG` once each into r. */
static void procs_once(const Tmp *f, int m, Result *r)
{
	char *check[] = {(char *)f->spmd, "check", (char *)f->model[m], NULL};
	char *part[] = {(char *)f->spmd, "partition", (char *)f->model[m], "-o", (char *)f->prog, NULL};
	double t, c;
	struct stat st;
	if (spawn_timed(check, f->out, &t, &c) == 0)
		r->check = best(r->check, t), r->check_cpu = best(r->check_cpu, c);
	if (spawn_timed(part, f->out, &t, &c) == 0 && stat(f->prog, &st) == 0) {
		r->part = best(r->part, t), r->part_cpu = best(r->part_cpu, c);
		r->part_out = (long)st.st_size;
	}
	unlink(f->prog);
}

/* Write the model of r's size and mesh to path; 0 or -1. */
static int model_write(const Result *r, const char *path)
{
	GenOpts o = gen_opts_default(r->nlayer);
	int m = r->ndev == mesh_shape[0][0] * mesh_shape[0][1] ? 0 : 1;
	o.batch = 32, o.heads = 32;
	o.data = mesh_shape[m][0], o.model = mesh_shape[m][1];
	size_t n;
	char *text = gen_transformer(&o, &n);
	int rc = file_write_atomic(path, text, n);
	free(text);
	return rc;
}

/* Repetitions for a model of nops ops: more for small models, whose times
 * are short enough for the machine's noise to swamp them. */
static int reps_for(int reps, long nops)
{
	long k = 100000 / nops;
	return k > reps ? (k < 30 ? (int)k : 30) : reps;
}

/* Measure one N on every mesh: write the models to path[m], then rounds
 * that take every mesh in turn, so that load on the machine hits them alike. */
static void measure(const Tmp *f, int reps, Result *r)
{
	int rc = 0;
	for (int m = 0; m < NMESH && rc == 0; m++) {
		for (int i = 0; i < NSTAGES; i++)
			r[m].t[i] = r[m].cpu[i] = -1;
		r[m].check = r[m].part = r[m].check_cpu = r[m].part_cpu = -1, r[m].part_out = -1;
		rc = model_write(&r[m], f->model[m]);
	}
	GenOpts o = gen_opts_default(r->nlayer);
	reps = reps_for(reps, gen_op_count(&o));
	for (int k = 0; k < reps && rc == 0; k++)
		for (int m = 0; m < NMESH && rc == 0; m++) {
			rc = pipe_once(f->model[m], &r[m]);
			procs_once(f, m, &r[m]);
		}
	for (int m = 0; m < NMESH; m++)
		r[m].failed = rc != 0;
}

/* "%9.2f" of milliseconds, or "n/a". */
static const char *ms(double sec, char *buf)
{
	if (sec < 0)
		return "n/a";
	snprintf(buf, 16, "%.2f", sec * 1e3);
	return buf;
}

/* Propagate + partition of stage times t (Result.t or Result.cpu). */
static double prop_part(const double *t) { return t[ST_PROPAGATE] + t[ST_PARTITION]; }

/* The sum of the stage times t that were measured. */
static double all_stages(const double *t)
{
	double sum = 0;
	for (int i = 0; i < NSTAGES; i++)
		sum += t[i] > 0 ? t[i] : 0;
	return sum;
}

static void row_print(const Result *r)
{
	char b[NSTAGES + 2][16];
	if (r->failed) {
		printf("%6d %7s %5d  FAILED (see the error above)\n", r->nlayer, "", r->ndev);
		return;
	}
	printf("%6d %7ld %5d %9s %9s %9s %9s %8.2f %8.2f %8ld %6ld %8.0f | %9s %9s %6.2f %6.2f\n", r->nlayer, r->src_ops,
	       r->ndev, ms(r->t[ST_LOAD], b[0]), ms(r->t[ST_PROPAGATE], b[1]), ms(r->t[ST_PARTITION], b[2]),
	       ms(r->t[ST_EMIT], b[3]), prop_part(r->t) / r->t[ST_LOAD], prop_part(r->cpu) * 1e3, r->dst_ops, r->ncoll,
	       r->text_bytes / 1024.0, ms(r->check, b[4]), ms(r->part, b[5]),
	       r->check > 0 && r->part > 0 ? r->part / r->check : NAN,
	       r->check_cpu > 0 && r->part_cpu > 0 ? r->part_cpu / r->check_cpu : NAN);
}

static void table_head(int reps)
{
	printf("scale: N layers of examples/transformer_block.yaml (batch 32, seq 16, d_model 64, 32 heads of 16,\n"
	       "MLP 256) on meshes {data: 2, model: 4} (8 devices) and {data: 32, model: 32} (1024);\n"
	       "best of %d (of up to 30 below 100,000 / REPS ops), the meshes taken in turn; times in ms.\n"
	       "In process: model_load, propagate, partition, emit_text (the program's YAML in memory), wall\n"
	       "clock, and propagate + partition in CPU time of the thread (cpu p+p);\n"
	       "as processes: spmd check MODEL, spmd partition MODEL -o PROGRAM (listing to a file), wall\n"
	       "clock, and partition / check in wall clock (ratio) and in the processes' CPU time (cpu)\n\n",
	       reps);
	printf("%6s %7s %5s %9s %9s %9s %9s %8s %8s %8s %6s %8s | %9s %9s %6s %6s\n", "layers", "ops", "devs", "load",
	       "propagate", "partition", "emit", "(p+p)/ld", "cpu p+p", "part.ops", "colls", "prog KB", "check",
	       "partition", "ratio", "cpu");
}

/* The time series whose growth is shown: column c of a result, in CPU time
 * (the stages in this process, the spmd partition process), which load on
 * the machine disturbs far less than the wall clock. */
enum { G_LOAD, G_PROPAGATE, G_PARTITION, G_EMIT, G_PP, G_ALL, G_PROC, NG };
static const char *const g_names[NG] = {"load", "propagate", "partition", "emit", "p+p", "all", "spmd part."};

static double g_time(const Result *r, int c)
{
	switch (c) {
	case G_PP: return prop_part(r->cpu);
	case G_ALL: return all_stages(r->cpu);
	case G_PROC: return r->part_cpu;
	default: return r->cpu[c];
	}
}

/* Doubling cost 2^k of time t2 over t1 for ops o2 over o1, where t ~ ops^k. */
static double doubling(double t1, double t2, long o1, long o2)
{
	return pow(2.0, log(t2 / t1) / log((double)o2 / (double)o1));
}

/* 2^k of the least-squares fit log t = k log ops + c over the results that
 * ran, for column c. */
static double doubling_fit(const Result *r, int c)
{
	double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
	for (int i = 0; i < NSIZES; i++) {
		if (r[i].failed || g_time(&r[i], c) <= 0)
			continue;
		double x = log((double)r[i].src_ops), y = log(g_time(&r[i], c));
		n++, sx += x, sy += y, sxx += x * x, sxy += x * y;
	}
	return n < 2 ? NAN : pow(2.0, (n * sxy - sx * sy) / (n * sxx - sx * sx));
}

/* Cost of doubling the ops between successive N and over the whole range
 * (8 devices); returns the worst fitted one. */
static double growth_print(const Result *r8)
{
	double worst = 0;
	printf("\ngrowth, 8 devices: cost of doubling the ops, 2^k where time ~ ops^k (goal <= 2.2);\n"
	       "CPU time\n%13s", "layers");
	for (int c = 0; c < NG; c++)
		printf(" %10s", g_names[c]);
	for (int i = 1; i < NSIZES; i++) {
		const Result *a = &r8[i - 1], *b = &r8[i];
		if (a->failed || b->failed)
			continue;
		printf("\n%5d -> %5d", a->nlayer, b->nlayer);
		for (int c = 0; c < NG; c++)
			printf(" %10.2f", doubling(g_time(a, c), g_time(b, c), a->src_ops, b->src_ops));
	}
	printf("\n%13s", "fit, all N");
	for (int c = 0; c < NG; c++) {
		double f = doubling_fit(r8, c);
		printf(" %10.2f", f);
		worst = f > worst ? f : worst;
	}
	printf("\n");
	return worst;
}

/* The 1024-device figures over the 8-device ones; the worst time ratio
 * (all stages) in *time, of output sizes (ops, program text, what spmd
 * partition -o wrote) in *size. */
static void mesh_print(const Result *r8, const Result *r1k, double *time, double *size)
{
	*time = *size = 0;
	printf("\n1024 devices / 8 devices (goal: 1; CPU time in process)\n");
	printf("%6s %9s %9s %9s %9s %9s %9s %9s %9s\n", "layers", "load", "propagate", "partition", "emit", "all",
	       "part.ops", "prog KB", "-o bytes");
	for (int i = 0; i < NSIZES; i++) {
		const Result *a = &r8[i], *b = &r1k[i];
		if (a->failed || b->failed)
			continue;
		double all = all_stages(b->cpu) / all_stages(a->cpu), ops = (double)b->dst_ops / (double)a->dst_ops;
		double text = (double)b->text_bytes / (double)a->text_bytes;
		double out = a->part_out > 0 && b->part_out > 0 ? (double)b->part_out / (double)a->part_out : NAN;
		printf("%6d", a->nlayer);
		for (int k = 0; k < NSTAGES; k++)
			printf(" %9.2f", a->cpu[k] > 0 ? b->cpu[k] / a->cpu[k] : NAN);
		printf(" %9.2f %9.2f %9.3f %9.3f\n", all, ops, text, out);
		*time = fmax(*time, all);
		*size = fmax(*size, fmax(ops, isnan(out) ? text : fmax(text, out)));
	}
}

/* The verdicts. */
static void goals_print(const Result *r8, const Result *r1k, double growth, double mesh_t, double mesh_s)
{
	const Result *a = &r8[NSIZES - 1], *b = &r1k[NSIZES - 1];
	double ratio = 0, cpu = 0;
	for (int i = 0; i < 2 * NSIZES; i++) {
		const Result *r = i < NSIZES ? &r8[i] : &r1k[i - NSIZES];
		if (r->check > 0 && r->part > 0)
			ratio = fmax(ratio, r->part / r->check);
		if (r->check_cpu > 0 && r->part_cpu > 0)
			cpu = fmax(cpu, r->part_cpu / r->check_cpu);
	}
	printf("\ngoals\n");
	if (!a->failed && !b->failed)
		printf("  %ld ops: propagate + partition %.0f ms (8 devices), %.0f ms (1024) wall clock, %.0f and %.0f ms CPU:"
		       " under 1 s: %s\n", a->src_ops, prop_part(a->t) * 1e3, prop_part(b->t) * 1e3, prop_part(a->cpu) * 1e3,
		       prop_part(b->cpu) * 1e3, fmax(prop_part(a->t), prop_part(b->t)) < 1 ? "holds" : "MISSED");
	if (ratio > 0)
		printf("  spmd partition / spmd check, worst: %.2f in CPU time (goal <= 3): %s; %.2f in wall clock: %s\n",
		       cpu, cpu <= 3 ? "holds" : "MISSED", ratio, ratio <= 3 ? "holds" : "MISSED");
	else
		printf("  spmd partition / spmd check: n/a (spmd partition -o did not run)\n");
	printf("  doubling the ops, fitted over all N, worst column: %.2fx the time (goal <= 2.2): %s\n", growth,
	       growth <= 2.2 ? "holds" : "MISSED");
	printf("  1024 / 8 devices, worst: CPU time %.2f (goal <= 1.2 on this noisy machine): %s; output size %.3f "
	       "(goal <= 1.05): %s\n", mesh_t, mesh_t <= 1.2 ? "holds" : "MISSED", mesh_s,
	       mesh_s <= 1.05 ? "holds" : "MISSED");
}

/* Make the temporary directory and name the files in it; 0 or -1. */
static int tmp_make(Tmp *f, const char *spmd)
{
	snprintf(f->dir, sizeof f->dir, "/tmp/bench_scale.XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	for (int m = 0; m < NMESH; m++)
		snprintf(f->model[m], sizeof f->model[m], "%s/model%d.yaml", f->dir, m);
	snprintf(f->out, sizeof f->out, "%s/stdout", f->dir);
	snprintf(f->prog, sizeof f->prog, "%s/program.yaml", f->dir);
	f->spmd = spmd;
	return 0;
}

static void tmp_remove(const Tmp *f)
{
	for (int m = 0; m < NMESH; m++)
		unlink(f->model[m]);
	unlink(f->out), unlink(f->prog), rmdir(f->dir);
}

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 3;
	Tmp f;
	if (reps <= 0 || argc > 3) {
		fprintf(stderr, "usage: bench_scale [REPS [SPMD_BINARY]]\n");
		return 2;
	}
	if (tmp_make(&f, argc > 2 ? argv[2] : SPMD_BIN) != 0) {
		fprintf(stderr, "bench_scale: cannot make a directory in /tmp\n");
		return 1;
	}
	Result r[NSIZES][NMESH], r8[NSIZES], r1k[NSIZES];
	table_head(reps);
	for (int i = 0; i < NSIZES; i++) {
		for (int m = 0; m < NMESH; m++)
			r[i][m] = (Result){.nlayer = layer_counts[i], .ndev = mesh_shape[m][0] * mesh_shape[m][1]};
		measure(&f, reps, r[i]);
		for (int m = 0; m < NMESH; m++)
			row_print(&r[i][m]);
		fflush(stdout);
		r8[i] = r[i][0], r1k[i] = r[i][1];
	}
	double growth = growth_print(r8), mesh_t, mesh_s;
	mesh_print(r8, r1k, &mesh_t, &mesh_s);
	goals_print(r8, r1k, growth, mesh_t, mesh_s);
	tmp_remove(&f);
	return 0;
}
