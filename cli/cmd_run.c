/* cmd_run.c: `spmd run MODEL.yaml` — run a model and print (or save) its outputs. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "cli.h"
#include "check.h"
#include "cmd_train.h"
#include "cost_trace.h"
#include "measure.h"
#include "commands.h"
#include "run_devices.h"
#include "../spmd/load.h"
#include "../spmd/npy.h"
#include "../spmd/ops.h"
#include "../partitioner/partition.h"
#include "../partitioner/pipeline.h"
#include "../partitioner/propagate.h"
#include "../runtime/data.h"
#include "../runtime/exec.h"
#include "../runtime/spmd_run.h"
#include "../runtime/mpi_backend.h"
#include "resources.h"

enum { O_SEED, O_INPUT, O_SAVE, O_BACKEND, O_PROFILE, O_CHECK, O_MESH, O_STEPS, O_AXIS_RULES, O_TRACE, O_LOAD, O_MEMORY, O_TIMEOUT, NRUN_OPTS };

static const CliOpt run_opts[NRUN_OPTS] = {
	[O_SEED] = {"seed", "N", "seed of the deterministic data (default 0)"},
	[O_INPUT] = {"input", "NAME=FILE.npy", "take input or param NAME from a .npy file (repeatable)"},
	[O_SAVE] = {"save", "DIR", "write each output to DIR/NAME.npy (DIR is created if needed); training: the params, optimizer state and step counter after the last step"},
	[O_BACKEND] = {"backend", "NAME", "threads (one thread per device; the default with a mesh), mpi (one process per device: mpirun -np DEVICES; docs/mpi.md) or ref (the reference executor)"},
	[O_PROFILE] = {"profile", NULL, "time every op and print a table by op kind (threads: the mean over devices)"},
	[O_CHECK] = {"check", NULL, "also run the unpartitioned model and compare every output (exit 1 on a mismatch)"},
	[O_MESH] = CLI_MESH_OPT,
	[O_AXIS_RULES] = CLI_AXIS_RULES_OPT,
	[O_STEPS] = {"steps", "K", "train: run K steps of a model's train: section or a training program (default: its steps) and print the loss of each"},
	[O_LOAD] = {"load", "DIR", "train: start from the params, optimizer state and step counter that --save wrote to DIR (resume)"},
	[O_TRACE] = {"trace", "FILE.json", "with --profile: write every device's measured ops as a Chrome trace (docs/pictures.md)"},
	[O_TIMEOUT] = {"timeout", "SECONDS", "--backend mpi: a rank that waits this long in one collective names it and ends the job (default 600)"},
	[O_MEMORY] = {"memory", "BYTES", "memory this run may use (8e9, 16GB, 16GiB): refuse to start when the devices' peak (by liveness) exceeds it (default: what the machine has free)"},
};

static const char run_desc[] =
	"Run a model.  With a mesh it is propagated, partitioned and run with one\n"
	"thread per device (each making only its own shards of the data); the\n"
	"outputs are gathered into their global shapes.  Inputs and params not\n"
	"given with --input are made from the seed: element i of a tensor depends\n"
	"only on (seed, name, i), so every backend sees the same numbers.  Prints\n"
	"each output's shape and statistics.  A partitioned program (written by\n"
	"spmd partition -o or --per-device) runs as it is, on threads, with the\n"
	"same data and outputs as its model; a training program trains as its\n"
	"model does.  Under mpirun with --backend mpi, DIR (written by --per-device)\n"
	"runs with rank r loading only DIR/device_r.yaml.";

/* Does the file's dtype fit the value's?  bf16 and f16 values take f32 files too. */
static bool npy_dtype_fits(DType want, DType got)
{
	if (want == got)
		return true;
	return (want == DT_BF16 || want == DT_F16) && (got == DT_F32 || got == DT_F16);
}

/* The input or param that --input NAME=FILE names (*file: FILE), or -1
 * after a usage error. */
static int input_value(const Graph *g, const char *arg, const char **file, Diag *d)
{
	const char *eq = strchr(arg, '=');
	if (!eq || eq == arg || !eq[1]) {
		diag_usage(d, "expected --input NAME=FILE.npy, found '%s'", arg);
		return -1;
	}
	char name[256];
	snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
	int v = graph_find(g, name);
	if (v < 0 || (g->values.a[v].kind != VK_INPUT && g->values.a[v].kind != VK_PARAM)) {
		diag_usage(d, "expected the name of an input or param in --input, found '%s'", name);
		return -1;
	}
	*file = eq + 1;
	return v;
}

/* Read one --input NAME=FILE into vals; 0 or 2 after an error.  In a
 * partitioned program (global) the file holds the whole tensor. */
static int read_input(const Graph *g, const char *arg, bool global, Tensor *vals, Diag *d)
{
	const char *file;
	int v = input_value(g, arg, &file, d);
	if (v < 0)
		return 2;
	const Value *val = &g->values.a[v];
	const Shape *shape = global ? &val->global : &val->shape;
	Tensor t = {0};
	if (npy_read(file, &t, d) != 0)
		return 2;
	if (!shape_eq(&t.shape, shape) || !npy_dtype_fits(val->dtype, t.dtype)) {
		char want[128], got[128];
		shape_format(shape, want, sizeof want);
		shape_format(&t.shape, got, sizeof got);
		diag_error(d, val->pos, "expected %s %s for '%s' in %s, found %s %s", dtype_names[val->dtype], want,
		           val->name, file, dtype_names[t.dtype], got);
		tensor_free(&t);
		return 2;
	}
	t.dtype = val->dtype;
	tensor_round(&t);
	tensor_free(&vals[v]);
	vals[v] = t;
	return 0;
}

static void print_stats(const Value *v, const Tensor *t)
{
	int64_t n = shape_numel(&t->shape);
	double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
	for (int64_t i = 0; i < n; i++) {
		double x = t->dtype == DT_I32 ? tensor_i32(t)[i] : tensor_f32(t)[i];
		sum += x, sq += x * x;
		lo = x < lo ? x : lo;
		hi = x > hi ? x : hi;
	}
	double mean = sum / (double)n, var = sq / (double)n - mean * mean;
	char shape[128];
	shape_format(&t->shape, shape, sizeof shape);
	printf("%-12s %-4s %-16s mean %-12.6g std %-12.6g min %-12.6g max %.6g\n", v->name, dtype_names[v->dtype],
	       shape, mean, sqrt(var > 0 ? var : 0), lo, hi);
}

/* Write every output to DIR/NAME.npy; 0 or 2. */
static int save_outputs(const Graph *g, const Tensor *outs, const char *dir, Diag *d)
{
	if (dir_make(dir) != 0) {
		diag_usage(d, "expected a directory for --save, found '%s' (%s)", dir, strerror(errno));
		return 2;
	}
	for (int i = 0; i < g->outputs.n; i++) {
		const Value *v = &g->values.a[g->outputs.a[i]];
		char path[4096];
		snprintf(path, sizeof path, "%s/%s.npy", dir, v->name);
		if (npy_write(path, &outs[i]) != 0) {
			diag_usage(d, "cannot write %s: %s", path, strerror(errno));
			return 2;
		}
	}
	return 0;
}

/* Print the time per op kind, largest first. */
static void print_profile(const Graph *g, const double *sec)
{
	double by_kind[OP_COUNT] = {0}, total = 0;
	int count[OP_COUNT] = {0};
	for (int i = 0; i < g->ops.n; i++) {
		by_kind[g->ops.a[i].kind] += sec[i];
		count[g->ops.a[i].kind]++;
		total += sec[i];
	}
	printf("\n%-20s %6s %12s %7s\n", "op kind", "count", "seconds", "share");
	for (;;) {
		int best = -1;
		for (int k = 0; k < OP_COUNT; k++)
			if (count[k] && (best < 0 || by_kind[k] > by_kind[best]))
				best = k;
		if (best < 0)
			break;
		printf("%-20s %6d %12.6f %6.1f%%\n", op_table[best].name, count[best], by_kind[best],
		       total > 0 ? 100 * by_kind[best] / total : 0);
		count[best] = 0;
	}
	printf("%-20s %6d %12.6f\n", "total", g->ops.n, total);
}

typedef struct {
	Graph g;          /* the model, or a partitioned program (program) */
	bool program;     /* g is a partitioned program (spmd: true) */
	Tensor *given;    /* per model value: --input tensors */
	uint64_t seed;
	Diag d;
	int mpi_rank;      /* --backend mpi: this process's rank; else -1 */
	const char **file; /* MPI: per model value, its --input file (each rank reads its shards) */
	bool profile;      /* --profile on the thread backend */
	const char *trace; /* --trace FILE.json */
	bool check;        /* --check: the reference runs too */
	double mem_avail;  /* --memory, or what the machine has free */
} RunCtx;

/* The reference executor on the model; outputs[i] gets output i.  noise >
 * 0: --check's noise run number noise (check.h). */
static int run_reference(RunCtx *c, Tensor *outputs, double *sec, int noise);

static int noise_run(void *c, Tensor *outputs, int noise) { return run_reference(c, outputs, NULL, noise); }

static int run_reference(RunCtx *c, Tensor *outputs, double *sec, int noise)
{
	Tensor *vals = xcalloc((size_t)c->g.values.n + 1, sizeof *vals);
	for (int v = 0; v < c->g.values.n; v++)
		if (c->given[v].data) {
			tensor_alloc(&vals[v], c->given[v].dtype, &c->given[v].shape);
			memcpy(vals[v].data, c->given[v].data, 4 * (size_t)shape_numel(&c->given[v].shape));
		}
	ExecOpts o = {.seed = c->seed, .profile = sec != NULL, .op_seconds = sec, .jitter = noise ? CHECK_JITTER : 0,
	              .jitter_seed = (uint64_t)noise};
	int rc = exec_run(&c->g, vals, NULL, &o, &c->d) == 0 ? 0 : 2;
	for (int i = 0; i < c->g.outputs.n && rc == 0; i++) {
		outputs[i] = vals[c->g.outputs.a[i]];
		vals[c->g.outputs.a[i]].data = NULL;
	}
	exec_free_values(&c->g, vals);
	free(vals);
	return rc;
}

/* Run prog with one MPI process per device (spmd_run_mpi): each rank reads
 * only its shards of the --input files; outputs are gathered on rank 0.  A
 * rank that fails mid-run ends the job, as the others may wait for it. */
static int run_mpi(RunCtx *c, const Graph *prog, SpmdOpts *o, Tensor *outputs)
{
	const char **file = xcalloc((size_t)prog->values.n + 1, sizeof *file);
	for (int v = 0, w = 0; v < c->g.values.n; v++) { /* a program's leaves are the model's, in order */
		if (c->program || c->g.values.a[v].producer >= 0) {
			file[v] = c->program ? c->file[v] : NULL;
			continue;
		}
		while (prog->values.a[w].producer >= 0)
			w++;
		file[w++] = c->file[v];
	}
	o->given = NULL;
	o->given_file = file;
	/* docs/mpi.md: SPMD_MPI_REDUCE=native (MPI's own reductions), SPMD_MPI_STATS=1 (what each rank sent) */
	const char *reduce = getenv("SPMD_MPI_REDUCE"), *show = getenv("SPMD_MPI_STATS");
	MpiStats *st = xcalloc((size_t)prog->mesh.ndev + 1, sizeof *st);
	Diag d; /* every rank reports its own failure */
	diag_init(&d);
	int rc = spmd_run_mpi(prog, o, reduce && strcmp(reduce, "native") == 0 ? MPI_BACKEND_NATIVE : 0, outputs, NULL,
	                      st, &d);
	c->d.nerr += d.nerr;
	for (int dev = 0; dev < prog->mesh.ndev && rc == 0 && c->mpi_rank == 0 && show && *show == '1'; dev++)
		printf("mpi rank %d: %lld collectives, %lld bytes sent, %.6f s in collectives\n", dev,
		       (long long)st[dev].calls, (long long)st[dev].bytes_sent, st[dev].seconds);
	free(st);
	free(file);
	if (rc == SPMD_RUN_ABORT)
		mpi_backend_abort(2);
	return rc;
}

/* --input NAME=FILE on MPI: check NAME and keep FILE; each rank reads its
 * shards when it runs.  0 or 2. */
static int note_input(RunCtx *c, const char *arg)
{
	const char *file;
	int v = input_value(&c->g, arg, &file, &c->d);
	if (v < 0)
		return 2;
	c->file[v] = file;
	return 0;
}

/* --profile on threads: each op's time is the mean over the devices. */
static void print_device_profile(const Graph *prog, double *sec)
{
	for (int i = 0; i < prog->ops.n; i++) {
		for (int dev = 1; dev < prog->mesh.ndev; dev++)
			sec[i] += sec[(size_t)dev * (size_t)prog->ops.n + (size_t)i];
		sec[i] /= prog->mesh.ndev;
	}
	print_profile(prog, sec);
	printf("(per device, the mean over %d devices)\n\n", prog->mesh.ndev);
}

/* Propagate, partition, run on threads; outputs[i] gets output i gathered. */
/* On stderr (stdout holds the outputs alone):
 * "mlp on 8 devices (mesh data=2,model=4, threads): 1 collective" */
static void print_run_header(const Graph *model, const Graph *prog, const char *backend)
{
	char mesh[128];
	int ncoll = 0;
	mesh_format(&prog->mesh, mesh, sizeof mesh);
	for (int i = 0; i < prog->ops.n; i++)
		ncoll += (op_table[prog->ops.a[i].kind].flags & OPF_COLLECTIVE) != 0;
	fprintf(stderr, "%s on %d device%s (mesh %s, %s): %d collective%s (spmd partition shows them)\n",
	       model->name ? model->name : model->file, prog->mesh.ndev, prog->mesh.ndev == 1 ? "" : "s",
	       prog->mesh.naxes ? mesh : "none", backend, ncoll, ncoll == 1 ? "" : "s");
}

static int run_threads(RunCtx *c, Tensor *outputs)
{
	Graph prog;
	int *map = NULL;
	HwProfile hw;
	cli_pass_prices(&c->g, &hw);
	int rc = pipeline_partition(&c->g, &hw, &prog, &map, NULL, &c->d) == 0 ? 0 : 2;
	if (rc == 0)
		rc = memory_check(&prog, c->mpi_rank >= 0 ? 1 : prog.mesh.ndev, c->check && c->mpi_rank <= 0 ? &c->g : NULL,
		                  c->mem_avail, &c->d);
	if (rc == 0) {
		Tensor *given;
		int64_t *range;
		spmd_leaf_opts(&c->g, &prog, map, c->given, c->g.values.n, &given, &range);
		SpmdOpts o = {.seed = c->seed, .given = given, .id_range = range};
		if (c->profile)
			o.op_seconds = xcalloc((size_t)prog.mesh.ndev * (size_t)prog.ops.n + 1, sizeof(double));
		if (c->mpi_rank <= 0)
			print_run_header(&c->g, &prog, c->mpi_rank >= 0 ? "mpi" : "threads");
		rc = check_run_status(c->mpi_rank >= 0 ? run_mpi(c, &prog, &o, outputs)
		                                       : spmd_run(&prog, &o, outputs, NULL, &c->d));
		if (rc == 0 && o.op_seconds && c->mpi_rank <= 0 && c->trace &&
		    run_trace_write(c->trace, &prog, o.op_seconds, prog.mesh.ndev, &c->d) != 0)
			rc = 2;
		if (rc == 0 && o.op_seconds && c->mpi_rank <= 0)
			print_device_profile(&prog, o.op_seconds);
		free(o.op_seconds);
		free(given);
		free(range);
	}
	free(map);
	graph_free(&prog);
	return rc;
}

/* The id range one reader of a program puts on its operand k, as
 * data_id_range does on the model (runtime/data.c: keep the two alike), with
 * global shapes (a take table's rows, the classes of a loss) and ids moving
 * through collectives too; range[] holds those of values read later. */
static int64_t program_reader_range(const Graph *g, const Op *op, int k, const int64_t *range)
{
	if ((op->kind == OP_TAKE || op->kind == OP_TAKE_SHARD) && k == 1) {
		const Shape *tab = &g->values.a[op->in[0]].global;
		return tab->rank ? tab->dim[0] : 1;
	}
	if (op->kind == OP_ONE_HOT || (op->kind == OP_TAKE_GRAD && k == 1))
		return op->attr->depth;
	if (op->kind == OP_TAKE_GRAD_SHARD && k == 1)
		return op->attr->global.dim[0];
	if (op->kind == OP_ONE_HOT_SHARD || (op->kind == OP_XENT_STATS_SHARD && k == 2) ||
	    (op->kind == OP_XENT_GRAD_SHARD && k == 3)) /* labels: the global classes */
		return op->attr->global.dim[op->attr->global.rank - 1];
	if ((op->kind == OP_SOFTMAX_CROSS_ENTROPY || op->kind == OP_SOFTMAX_CROSS_ENTROPY_GRAD) && k == 1) {
		const Shape *x = &g->values.a[op->in[0]].global;
		return x->rank ? x->dim[x->rank - 1] : 1;
	}
	bool moves = (op_table[op->kind].flags & (OPF_MOVE | OPF_COLLECTIVE)) || op->kind == OP_MASK;
	if (moves && op->kind != OP_CAST && g->values.a[op->out].dtype == DT_I32)
		return range[op->out] >= 0 ? range[op->out] : 1000;
	return 1000;
}

/* The id range of every value of a program, in one backward pass. */
static int64_t *program_id_ranges(const Graph *g)
{
	int64_t *range = xmalloc(sizeof(int64_t) * (size_t)(g->values.n + 1));
	for (int v = 0; v < g->values.n; v++)
		range[v] = -1;
	for (int i = g->ops.n - 1; i >= 0; i--) {
		const Op *op = &g->ops.a[i];
		for (int k = 0; k < op->nin; k++) {
			int64_t r = program_reader_range(g, op, k, range), *at = &range[op->in[k]];
			*at = *at < 0 || r < *at ? r : *at;
		}
	}
	for (int v = 0; v < g->values.n; v++)
		range[v] = range[v] < 0 ? 1000 : range[v];
	return range;
}

/* A partitioned program as it is, on threads; outputs[i] gets output i gathered. */
static int run_program(RunCtx *c, Tensor *outputs)
{
	if (memory_check(&c->g, c->mpi_rank >= 0 ? 1 : c->g.mesh.ndev, NULL, c->mem_avail, &c->d) != 0)
		return 2;
	int64_t *range = program_id_ranges(&c->g);
	SpmdOpts o = {.seed = c->seed, .given = c->given, .id_range = range};
	int rc = c->mpi_rank >= 0 ? run_mpi(c, &c->g, &o, outputs) : spmd_run(&c->g, &o, outputs, NULL, &c->d);
	rc = check_run_status(rc);
	free(range);
	return rc;
}

/* Load MODEL.yaml (with --mesh applied), or a partitioned program, which
 * runs as it is: without --mesh, --check, --steps or the reference backend.
 * 0, or 2. */
static int load_input(RunCtx *c, const CliParse *p, const char *path)
{
	LoadKind kind = {true, -1};
	const char *mesh = cli_get(p, O_MESH), *backend = cli_get(p, O_BACKEND);
	LoadOpts lo = {mesh, cli_get(p, O_AXIS_RULES)};
	bool dir = run_is_dir(path);
	if (dir && c->mpi_rank < 0) {
		graph_init(&c->g);
		diag_usage(&c->d, "expected --backend mpi (mpirun -np DEVICES) to run the per-device files of %s, one per "
		           "rank, found %s (spmd run %s/device_0.yaml runs the program on threads)", path,
		           backend ? backend : "no --backend", path);
		return 2;
	}
	if (dir ? run_load_devices(&c->g, path, &c->d) != 0 : program_load_opts(&c->g, path, &kind, &lo, &c->d) != 0)
		return 2;
	c->program = kind.spmd;
	if (!c->program) /* stages: auto runs the cut spmd cost prices */
		return cost_pipeline_cut(&c->g, path, &lo, &c->d) == 0 ? 0 : 2;
	const char *opt = mesh ? "--mesh" : lo.axis_rules ? "--axis-rules" : cli_flag(p, O_CHECK) ? "--check" : NULL;
	if (!opt && backend && strcmp(backend, "ref") == 0)
		opt = "--backend ref";
	if (opt) {
		diag_usage(&c->d, "expected a model for %s, found the partitioned program %s (it runs as it is)", opt, path);
		return 2;
	}
	opt = c->g.train ? NULL : cli_get(p, O_STEPS) ? "--steps" : cli_get(p, O_LOAD) ? "--load" : NULL;
	if (!opt) /* a training program (its train: section) takes --steps and --load */
		return 0;
	diag_usage(&c->d, "expected a model or a training program for %s, found the partitioned program %s (a "
	           "forward pass)", opt, path);
	return 2;
}

/* --backend mpi: one process per device, so mpirun -np must match the mesh.  0, or 2. */
static int check_ranks(RunCtx *c)
{
	int n = mpi_backend_size();
	if (n == c->g.mesh.ndev)
		return 0;
	char mesh[256];
	mesh_format(&c->g.mesh, mesh, sizeof mesh);
	diag_usage(&c->d, "expected %d MPI processes for the mesh %s of %s (mpirun -np %d, or --mesh sizes whose "
	           "product is %d), found %d", c->g.mesh.ndev, c->g.mesh.naxes ? mesh : "(none)", c->g.file,
	           c->g.mesh.ndev, n, n);
	return 2;
}

/* A model with a train: section (or --steps): K training steps (cmd_train.c). */
static int run_training(RunCtx *c, const CliParse *p)
{
	const char **inputs = xcalloc((size_t)p->args.n + 1, sizeof *inputs);
	int n = 0;
	for (int i = 0; i < p->args.n; i++)
		if (p->args.a[i].opt == O_INPUT)
			inputs[n++] = p->args.a[i].value;
	TrainCmd o = {cli_get(p, O_STEPS), cli_get(p, O_BACKEND), cli_get(p, O_SAVE), cli_flag(p, O_CHECK), c->seed,
	              inputs, n, c->mpi_rank >= 0, cli_get(p, O_LOAD), c->program, NULL, c->mem_avail};
	int64_t *range = c->program ? program_id_ranges(&c->g) : NULL;
	o.id_range = range;
	int rc = cmd_run_train(&c->g, &o, &c->d);
	free(inputs), free(range);
	graph_free(&c->g);
	return rc;
}

static int run_model(const CliParse *p, const char *path)
{
	RunCtx c = {.seed = 0};
	diag_init(&c.d);
	const char *backend = cli_get(p, O_BACKEND);
	if (backend && strcmp(backend, "ref") != 0 && strcmp(backend, "threads") != 0 && strcmp(backend, "mpi") != 0) {
		fprintf(stderr, "spmd run: error: expected a backend (threads, mpi, ref), found '%s'\n", backend);
		return 2;
	}
	c.mpi_rank = backend && strcmp(backend, "mpi") == 0 ? mpi_backend_rank() : -1;
	c.d.quiet = c.mpi_rank > 0; /* what every rank finds alike, rank 0 says */
	if (cli_get(p, O_SEED) && cli_uint("run", "seed", cli_get(p, O_SEED), &c.seed) != 0)
		return 2;
	c.mem_avail = memory_available();
	if (cli_get(p, O_MEMORY) && memory_parse("run", cli_get(p, O_MEMORY), &c.mem_avail) != 0)
		return 2;
	c.check = cli_flag(p, O_CHECK);
	if (load_input(&c, p, path) != 0 || (c.mpi_rank >= 0 && check_ranks(&c) != 0)) {
		graph_free(&c.g);
		return 2;
	}
	if (c.g.train || cli_get(p, O_STEPS) || cli_get(p, O_LOAD))
		return run_training(&c, p);
	bool threads = c.program || (backend ? strcmp(backend, "ref") != 0 : c.g.mesh.ndev > 1);
	int nout = c.g.outputs.n, rc = 0;
	c.given = xcalloc((size_t)c.g.values.n + 1, sizeof *c.given);
	c.file = xcalloc((size_t)c.g.values.n + 1, sizeof *c.file);
	Tensor *outs = xcalloc((size_t)nout + 1, sizeof *outs), *ref = xcalloc((size_t)nout + 1, sizeof *ref);
	for (int i = 0; i < p->args.n && rc == 0; i++)
		if (p->args.a[i].opt == O_INPUT)
			rc = c.mpi_rank >= 0 ? note_input(&c, p->args.a[i].value)
			                     : read_input(&c.g, p->args.a[i].value, c.program, c.given, &c.d);
	double *sec = cli_flag(p, O_PROFILE) && !threads ? xcalloc((size_t)c.g.ops.n + 1, sizeof *sec) : NULL;
	c.profile = cli_flag(p, O_PROFILE) && threads;
	c.trace = cli_get(p, O_TRACE);
	if (c.trace && !cli_flag(p, O_PROFILE)) {
		fprintf(stderr, "spmd run: error: expected --profile with --trace, found --trace alone\n");
		rc = 2;
	}
	if (rc == 0 && !c.program && !threads)
		rc = memory_check(NULL, 0, &c.g, c.mem_avail, &c.d);
	if (rc == 0)
		rc = c.program ? run_program(&c, outs) : threads ? run_threads(&c, outs) : run_reference(&c, outs, sec, 0);
	bool check = cli_flag(p, O_CHECK);
	if (rc == 0 && check && c.mpi_rank == 0) /* the reference needs the whole inputs: rank 0 only */
		for (int i = 0; i < p->args.n && rc == 0; i++)
			if (p->args.a[i].opt == O_INPUT)
				rc = read_input(&c.g, p->args.a[i].value, c.program, c.given, &c.d);
	Tensor *noise[CHECK_MAX_RUNS];
	for (int k = 0; k < CHECK_MAX_RUNS; k++)
		noise[k] = xcalloc((size_t)nout + 1, sizeof(Tensor));
	int nruns = CHECK_NOISE_RUNS;
	if (rc == 0 && check && c.mpi_rank <= 0)
		rc = run_reference(&c, ref, NULL, 0);
	if (rc == 0 && check && c.mpi_rank <= 0)
		rc = check_noise_runs(&c.g, outs, ref, noise, noise_run, &c, &nruns);
	if (rc == 0 && c.mpi_rank <= 0) {
		for (int i = 0; i < nout; i++)
			print_stats(&c.g.values.a[c.g.outputs.a[i]], &outs[i]);
		if (sec && c.trace && run_trace_write(c.trace, &c.g, sec, 1, &c.d) != 0)
			rc = 2;
		if (sec)
			print_profile(&c.g, sec);
		for (int i = 0; i < nout && check; i++)
			if (!check_output(&c.g, i, outs, ref, noise, nruns))
				rc = 1;
		if (rc == 0 && cli_get(p, O_SAVE))
			rc = save_outputs(&c.g, outs, cli_get(p, O_SAVE), &c.d);
	}
	for (int i = 0; i < nout; i++)
		tensor_free(&outs[i]), tensor_free(&ref[i]);
	for (int k = 0; k < CHECK_MAX_RUNS; k++) {
		for (int i = 0; i < nout; i++)
			tensor_free(&noise[k][i]);
		free(noise[k]);
	}
	for (int v = 0; v < c.g.values.n; v++)
		tensor_free(&c.given[v]);
	free(outs), free(ref), free(sec), free(c.given), free(c.file);
	graph_free(&c.g);
	return rc;
}

static bool backend_is_mpi(const CliParse *p)
{
	const char *backend = cli_get(p, O_BACKEND);
	return backend && strcmp(backend, "mpi") == 0;
}

/* --backend mpi: MPI around the run (started only then, so spmd runs without
 * mpirun otherwise); every rank exits with the worst rank's status. */
static int run_mpi_job(const CliParse *p, const char *path)
{
	double timeout = 600;
	if (cli_get(p, O_TIMEOUT) && cli_seconds("run", "timeout", cli_get(p, O_TIMEOUT), &timeout) != 0)
		return 2;
	if (mpi_backend_start() != 0) {
		fprintf(stderr, "spmd run: error: expected MPI to start for --backend mpi, found it failing\n");
		return 2;
	}
	mpi_backend_set_timeout(timeout);
	return mpi_backend_finish(run_model(p, path));
}

static int run_body(const CliParse *p, const char *path)
{
	return backend_is_mpi(p) ? run_mpi_job(p, path) : run_model(p, path);
}

int cmd_run(int argc, char **argv)
{
	static const CliCommand c = {"run", "MODEL.yaml", "MODEL.yaml|PROGRAM.yaml|DIR [options]", run_desc, run_opts, NRUN_OPTS, run_body};
	return cli_main(&c, argc, argv);
}
