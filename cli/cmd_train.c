/* cmd_train.c: `spmd run MODEL.yaml --steps K` — the training step run K times, on the reference or on threads. */
#include "cli.h"
#include "cmd_train.h"
#include "check.h"
#include "resources.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "../spmd/npy.h"
#include "../train/train.h"
#include "../partitioner/partition.h"
#include "../partitioner/pipeline.h"
#include "../runtime/data.h"
#include "../runtime/exec.h"
#include "../runtime/train_run.h"
#include "../runtime/mpi_backend.h"
#include "../base/progress.h"

typedef struct {
	Graph *g;
	const TrainCmd *o;
	Diag *d;
	Tensor *given;   /* per value: --input tensors */
	int ngiven;      /* values when given was made (the passes add values after) */
	int steps;
	const char **file; /* MPI (o->mpi): per value, its --input file; each rank reads its shards */
	Progress bar;      /* the steps done, on a terminal */
	char **args;     /* NAME=FILE: the files of --load, then the --input arguments */
	int nargs;
} Run;

/* --steps K (1..1000000) or the train: section's; 0, or 2 after a usage error. */
static int read_steps(Run *r)
{
	if (!r->o->steps) {
		r->steps = (int)r->g->train->steps;
		return 0;
	}
	char *end;
	errno = 0;
	long v = strtol(r->o->steps, &end, 10);
	if (!*r->o->steps || *end || errno || v < 1 || v > 1000000) {
		diag_usage(r->d, "expected a step count in 1..1000000 after --steps, found '%s'", r->o->steps);
		return 2;
	}
	r->steps = (int)v;
	return 0;
}

/* --input NAME=FILE.npy for an input or param of the model (or a state
 * value, from --load); in a program the file holds the global tensor.  0 or 2. */
static int read_input(Run *r, const char *arg)
{
	const char *eq = strchr(arg, '=');
	char name[256];
	snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - arg) : 0, arg);
	int v = eq && eq[1] ? graph_find(r->g, name) : -1;
	if (v < 0 || r->g->values.a[v].producer >= 0 || r->g->values.a[v].kind == VK_CONST) {
		diag_usage(r->d, "expected --input NAME=FILE.npy naming an input or param, found '%s'", arg);
		return 2;
	}
	const Value *val = &r->g->values.a[v];
	const Shape *shape = r->o->program ? &val->global : &val->shape;
	if (r->file && !r->given) { /* MPI: only note the file */
		r->file[v] = eq + 1;
		return 0;
	}
	Tensor t = {0};
	if (npy_read(eq + 1, &t, r->d) != 0)
		return 2;
	bool fits = t.dtype == val->dtype || ((val->dtype == DT_BF16 || val->dtype == DT_F16) && t.dtype != DT_I32 &&
	                                      t.dtype != DT_F64);
	if (!shape_eq(&t.shape, shape) || !fits) {
		char want[128], got[128];
		shape_format(shape, want, sizeof want);
		shape_format(&t.shape, got, sizeof got);
		diag_error(r->d, val->pos, "expected %s %s for '%s' in %s, found %s %s", dtype_names[val->dtype], want,
		           val->name, eq + 1, dtype_names[t.dtype], got);
		tensor_free(&t);
		return 2;
	}
	t.dtype = val->dtype;
	tensor_round(&t);
	tensor_free(&r->given[v]);
	r->given[v] = t;
	return 0;
}

/* arg: the Run's progress bar, moved past each printed step. */
static void print_loss(void *arg, int step, const Tensor *outputs)
{
	progress_clear(arg);
	printf("step %-5d loss %.6g\n", step + 1, tensor_f32(&outputs[0])[0]);
	fflush(stdout);
	progress_set(arg, step + 1);
}

/* The step on the reference executor; outs gets the last step's outputs.
 * noise > 0: --check's noise run number noise (check.h). */
static int run_ref(Run *r, bool print, Tensor *outs, int noise)
{
	const Train *t = r->g->train;
	Tensor *vals = xcalloc((size_t)r->g->values.n + 1, sizeof *vals);
	for (int v = 0; v < r->ngiven; v++)
		if (r->given[v].data) {
			tensor_alloc(&vals[v], r->given[v].dtype, &r->given[v].shape);
			memcpy(vals[v].data, r->given[v].data, 4 * (size_t)shape_numel(&r->given[v].shape));
		}
	StepOpts s = {r->steps, t->ncarry, t->carry_from, t->carry_to, print ? print_loss : NULL, &r->bar, NULL,
	              noise ? CHECK_JITTER : 0, (uint64_t)noise};
	int rc = train_run_ref(r->g, vals, r->o->seed, &s, outs, r->d);
	exec_free_values(r->g, vals);
	free(vals);
	return rc == 0 ? 0 : 2;
}

static int noise_run(void *r, Tensor *outs, int noise) { return run_ref(r, false, outs, noise); }

/* --backend mpi: the steps on this rank's device (train_run_mpi), the --input
 * files read shard by shard; a rank failing mid-run ends the job. */
static int train_mpi(Run *r, const Graph *prog, const int *map, SpmdOpts *o, const StepOpts *s, Tensor *outs)
{
	const char **file = xcalloc((size_t)prog->values.n + 1, sizeof *file);
	for (int v = 0; v < r->ngiven; v++)
		if (r->g->values.a[v].producer < 0 && map[v] >= 0)
			file[map[v]] = r->file[v];
	o->given = NULL;
	o->given_file = file;
	const char *reduce = getenv("SPMD_MPI_REDUCE");
	Diag d; /* every rank reports its own failure */
	diag_init(&d);
	int rc = train_run_mpi(prog, o, reduce && strcmp(reduce, "native") == 0 ? MPI_BACKEND_NATIVE : 0, s, outs, NULL,
	                       NULL, &d);
	r->d->nerr += d.nerr;
	free(file);
	if (rc == SPMD_RUN_ABORT)
		mpi_backend_abort(2);
	return rc;
}

/* Per-device memory: what every device holds between steps, and the most
 * any device held during the last step. */
static void print_memory(const Graph *prog, const DeviceMemory *mem)
{
	int64_t state = spmd_state_bytes(prog), peak = 0;
	for (int dev = 0; dev < prog->mesh.ndev; dev++)
		peak = mem[dev].peak > peak ? mem[dev].peak : peak;
	printf("memory per device: params %lld B, optimizer state %lld B, peak %lld B\n",
	       (long long)(mem[0].persistent - state), (long long)state, (long long)peak);
}

/* The partitioned step on threads, its carries mapped into the program. */
static int run_program(Run *r, const Graph *prog, const int *map, Tensor *outs)
{
	const Train *t = r->g->train;
	Tensor *given;
	int64_t *range;
	int *from = xmalloc(sizeof(int) * (size_t)(t->ncarry + 1)), *to = xmalloc(sizeof(int) * (size_t)(t->ncarry + 1));
	if (r->o->program) { /* the program's own ids */
		given = xcalloc((size_t)prog->values.n + 1, sizeof *given);
		range = xmalloc(sizeof *range * (size_t)(prog->values.n + 1));
		memcpy(given, r->given, sizeof *given * (size_t)r->ngiven);
		memcpy(range, r->o->id_range, sizeof *range * (size_t)prog->values.n);
	} else
		spmd_leaf_opts(r->g, prog, map, r->given, r->ngiven, &given, &range);
	for (int i = 0; i < t->ncarry; i++)
		from[i] = map[t->carry_from[i]], to[i] = map[t->carry_to[i]];
	SpmdOpts o = {.seed = r->o->seed, .given = given, .id_range = range};
	DeviceMemory *mem = xcalloc((size_t)prog->mesh.ndev, sizeof *mem);
	StepOpts s = {r->steps, t->ncarry, from, to, print_loss, &r->bar, r->o->mpi ? NULL : mem, 0, 0};
	int rc = check_run_status(r->o->mpi ? train_mpi(r, prog, map, &o, &s, outs)
	                                    : train_run_threads(prog, &o, &s, outs, r->d));
	/* a program prints what its model's run prints: one device runs on the reference, without this line */
	bool threads = !r->o->program || prog->mesh.ndev > 1 || (r->o->backend && !strcmp(r->o->backend, "threads"));
	if (rc == 0 && !r->o->mpi && threads)
		print_memory(prog, mem);
	free(given), free(range), free(from), free(to), free(mem);
	return rc;
}

/* Propagate, shard the weight update, partition (pipeline.h), run; a
 * program runs as it is. */
/* --memory: the devices of prog in this process (one under MPI) and the
 * reference on ref (may be NULL), each at its peak, fit in what the run may
 * use (cli/resources.h); reports when not. */
static bool fits(Run *r, const Graph *prog, const Graph *ref)
{
	if (r->o->mem_avail <= 0)
		return true;
	return memory_check(prog, r->o->mpi ? 1 : prog->mesh.ndev, ref, r->o->mem_avail, r->d) == 0;
}

static int run_threads(Run *r, Tensor *outs)
{
	Graph prog;
	int *map = NULL;
	HwProfile hw;
	if (r->o->program) {
		map = xmalloc(sizeof *map * (size_t)(r->g->values.n + 1));
		for (int v = 0; v < r->g->values.n; v++)
			map[v] = v;
		int rc = fits(r, r->g, NULL) ? run_program(r, r->g, map, outs) : 2;
		free(map);
		return rc;
	}
	cli_pass_prices(r->g, &hw);
	int rc = pipeline_partition(r->g, &hw, &prog, &map, NULL, r->d) == 0 ? 0 : 2;
	if (rc == 0 && !fits(r, &prog, r->o->check ? r->g : NULL))
		rc = 2;
	if (rc == 0)
		rc = run_program(r, &prog, map, outs);
	free(map);
	graph_free(&prog);
	return rc;
}

static void print_param(const Value *v, const Tensor *t)
{
	int64_t n = shape_numel(&t->shape);
	double sum = 0, sq = 0;
	for (int64_t i = 0; i < n; i++)
		sum += tensor_f32(t)[i], sq += (double)tensor_f32(t)[i] * tensor_f32(t)[i];
	double mean = sum / (double)n, var = sq / (double)n - mean * mean;
	char shape[128];
	shape_format(&t->shape, shape, sizeof shape);
	printf("%-12s %-4s %-16s mean %-12.6g std %.6g\n", v->name, dtype_names[v->dtype], shape, mean,
	       sqrt(var > 0 ? var : 0));
}

/* The params and optimizer state after the last step (output 1 + i is
 * carried to leaf i) into DIR/NAME.npy, which --load reads back; 0 or 2. */
static int save_params(Run *r, const Tensor *outs)
{
	const Train *t = r->g->train;
	if (dir_make(r->o->save) != 0) {
		diag_usage(r->d, "expected a directory for --save, found '%s' (%s)", r->o->save, strerror(errno));
		return 2;
	}
	for (int i = 0; i < t->ncarry; i++) {
		char path[4096];
		snprintf(path, sizeof path, "%s/%s.npy", r->o->save, r->g->values.a[t->carry_to[i]].name);
		if (npy_write(path, &outs[1 + i]) != 0) {
			diag_usage(r->d, "cannot write %s: %s", path, strerror(errno));
			return 2;
		}
	}
	return 0;
}

/* Print the params, compare with the reference and its noise runs (ref
 * may be NULL: no --check; cli/check.h), save. */
static int report(Run *r, const Tensor *outs, const Tensor *ref, Tensor *const *noise, int nruns)
{
	const Train *t = r->g->train;
	int rc = 0;
	for (int i = 0; i < t->nparams; i++)
		print_param(&r->g->values.a[t->params[i].param], &outs[1 + i]);
	if (ref)
		rc = check_train(r->g, r->given, r->ngiven, r->o->seed, r->steps, outs, ref, noise, nruns);
	if (rc == 0 && r->o->save)
		rc = save_params(r, outs);
	return rc;
}

/* Check the options against the model; 0 or 2. */
static int check_usage(Run *r)
{
	const char *b = r->o->backend;
	if (!r->g->train) {
		diag_usage(r->d, "expected a model with a train: section for --steps or --load, found none in %s", r->g->file);
		return 2;
	}
	if (b && strcmp(b, "ref") != 0 && strcmp(b, "threads") != 0 && strcmp(b, "mpi") != 0) {
		diag_usage(r->d, "expected --backend threads, mpi or ref to train, found '%s'", b);
		return 2;
	}
	return read_steps(r);
}

/* r->args: NAME=DIR/NAME.npy for every param and state value the step
 * carries (--load DIR: each file must be there), then the --input
 * arguments, which may override them.  0 or 2. */
static int collect_args(Run *r)
{
	const Train *t = r->g->train;
	const char *dir = r->o->load;
	r->args = xcalloc((size_t)(t->ncarry + r->o->ninputs + 1), sizeof *r->args);
	for (int i = 0; dir && i < t->ncarry; i++) {
		const Value *v = &r->g->values.a[t->carry_to[i]];
		size_t n = strlen(v->name) * 2 + strlen(dir) + 8;
		char *arg = xmalloc(n);
		snprintf(arg, n, "%s=%s/%s.npy", v->name, dir, v->name);
		r->args[r->nargs++] = arg;
		if (access(strchr(arg, '=') + 1, R_OK) != 0) {
			diag_usage(r->d, "expected %s, the saved %s '%s', in --load %s (spmd run --save writes it), found "
			           "none (%s)", strchr(arg, '=') + 1, v->kind == VK_PARAM ? "param" : "optimizer state",
			           v->name, dir, strerror(errno));
			return 2;
		}
	}
	for (int i = 0; i < r->o->ninputs; i++)
		r->args[r->nargs++] = xstrdup(r->o->inputs[i]);
	return 0;
}

int cmd_run_train(Graph *g, const TrainCmd *o, Diag *d)
{
	Run r = {.g = g, .o = o, .d = d};
	int rc = check_usage(&r);
	if (rc == 0 && train_build(g, d) != 0)
		rc = 2;
	if (rc == 0)
		rc = collect_args(&r);
	if (rc == 0 && o->check)
		check_train_outputs(g);
	bool rank0 = !o->mpi || mpi_backend_rank() == 0; /* MPI: only rank 0 checks and prints */
	r.file = o->mpi ? xcalloc((size_t)g->values.n + 1, sizeof *r.file) : NULL;
	for (int i = 0; i < r.nargs && rc == 0 && o->mpi; i++)
		rc = read_input(&r, r.args[i]);
	r.given = xcalloc((size_t)g->values.n + 1, sizeof(Tensor));
	r.ngiven = g->values.n;
	for (int i = 0; i < r.nargs && rc == 0 && !o->mpi; i++)
		rc = read_input(&r, r.args[i]);
	bool threads = o->program || (o->backend ? strcmp(o->backend, "ref") != 0 : g->mesh.ndev > 1);
	int nout = g->outputs.n;
	Tensor *outs = xcalloc((size_t)nout + 1, sizeof *outs), *ref = xcalloc((size_t)nout + 1, sizeof *ref);
	Tensor *noise[CHECK_MAX_RUNS];
	for (int k = 0; k < CHECK_MAX_RUNS; k++)
		noise[k] = xcalloc((size_t)nout + 1, sizeof(Tensor));
	int nruns = 0;
	if (rc == 0 && !threads && o->mem_avail > 0 && memory_check(NULL, 0, g, o->mem_avail, d) != 0)
		rc = 2;
	progress_begin(&r.bar, "run", r.steps, "steps");
	if (rc == 0)
		rc = threads ? run_threads(&r, outs) : run_ref(&r, true, outs, 0);
	progress_end(&r.bar);
	for (int i = 0; i < r.nargs && rc == 0 && o->mpi && o->check && rank0; i++)
		rc = read_input(&r, r.args[i]); /* the reference needs the whole inputs */
	if (rc == 0 && o->check && rank0)
		rc = run_ref(&r, false, ref, 0);
	if (rc == 0 && o->check && rank0)
		rc = check_noise_runs(g, outs, ref, noise, noise_run, &r, &nruns);
	if (rc == 0 && rank0)
		rc = report(&r, outs, o->check ? ref : NULL, noise, nruns);
	for (int i = 0; i < nout; i++)
		tensor_free(&outs[i]), tensor_free(&ref[i]);
	for (int k = 0; k < CHECK_MAX_RUNS; k++) {
		for (int i = 0; i < nout; i++)
			tensor_free(&noise[k][i]);
		free(noise[k]);
	}
	for (int v = 0; v < r.ngiven; v++)
		tensor_free(&r.given[v]);
	for (int i = 0; i < r.nargs; i++)
		free(r.args[i]);
	free(outs), free(ref), free(r.given), free(r.file), free(r.args);
	return rc;
}
