/* spmd_run_mpi.c: a partitioned program on MPI — each rank runs its own device on its own shards; outputs meet on rank 0.
 *
 * Every rank: make its device's leaves (spmd_make_leaf: from the seed, or
 * only its box of each --input file); agree with the others that all could
 * (a rank that could not — a bad file on one machine — is reported by the
 * lowest such rank, and every rank returns -1 together, nothing hangs); run
 * its program with exec_run, collectives through the MPI backend; then send
 * its local tensor of every output to rank 0, which assembles the global
 * outputs with spmd_gather_value (the thread backend's gather) and checks
 * that replicas agree.  A failure during the run cannot be agreed on — the
 * others may wait in a collective for the failed rank — so that rank reports
 * and its caller ends the job (SPMD_RUN_ABORT, mpi_backend_abort).  Training
 * (train_run_mpi) repeats the run and the gathering once per step, carrying
 * values from step to step on each rank, as train_run_threads does. */
#include "mpi_backend.h"

#include <mpi.h>
#include <string.h>

#include "exec.h"
#include "train_run.h"

/* A Diag whose messages are kept, formatted as they would print, until we
 * know whether this rank is the one to print them. */
typedef struct {
	Diag d;
	char *text;
	size_t len;
} Captured;

static void capture_open(Captured *c)
{
	diag_init(&c->d);
	c->text = NULL;
	c->len = 0;
	c->d.out = open_memstream(&c->text, &c->len);
	if (!c->d.out) { /* keep only the last message */
		c->d.out = stderr;
		c->d.quiet = true;
	}
}

static void capture_close(Captured *c)
{
	if (c->d.out != stderr)
		fclose(c->d.out);
	free(c->text);
}

/* Print what this rank's device reported, then which device failed (and the
 * MPI error, if a collective failed). */
static void report(Captured *c, const Backend *b, const Graph *prog, int rank, Diag *d)
{
	if (c->d.out != stderr)
		fflush(c->d.out);
	if (!d->quiet && c->len)
		fwrite(c->text, 1, c->len, d->out);
	else if (!d->quiet && c->d.nerr)
		diag_error(d, c->d.last_pos, "%s", c->d.last);
	const char *why = mpi_backend_error(b);
	Pos at = c->d.nerr && c->d.last_pos.line ? c->d.last_pos : (Pos){prog->file, 0, 0}; /* the failing op's place */
	diag_error(d, at, "device %d (MPI rank %d) failed%s%s", rank, rank, why[0] ? ": " : "", why);
}

/* The device's leaves (a pipeline's device: those its stages read). */
static int make_leaves(const Graph *prog, const SpmdOpts *o, int device, Tensor *vals, Diag *d)
{
	bool *used = exec_used_on(prog, graph_stage_coord(prog, device));
	int rc = 0;
	for (int v = 0; v < prog->values.n && rc == 0; v++)
		if (prog->values.a[v].producer < 0 && (!used || used[v]))
			rc = spmd_make_leaf(prog, o, device, v, &vals[v], d);
	free(used);
	return rc;
}

/* Rank 0's view of the devices while gathering one output. */
typedef struct {
	const Tensor *mine; /* rank 0's own local tensor */
	Tensor buf;         /* the last one received */
	int tag;
	bool failed;
	char err[MPI_MAX_ERROR_STRING];
} Fetch;

static const Tensor *fetch_rank(void *arg, int device)
{
	Fetch *f = arg;
	if (device == 0)
		return f->mine;
	int n = (int)shape_numel(&f->buf.shape), len = 0;
	int rc = MPI_Recv(f->buf.data, n, MPI_INT32_T, device, f->tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	if (rc != MPI_SUCCESS && !f->failed) {
		f->failed = true;
		MPI_Error_string(rc, f->err, &len);
		memset(f->buf.data, 0, (size_t)n * 4);
	}
	return &f->buf;
}

/* Send every output's local tensor to rank 0 (other ranks), or gather them
 * there into outputs.  0; SPMD_RUN_DISAGREE if replicas differ (rank 0);
 * SPMD_RUN_ABORT if MPI failed (reported). */
static int gather_outputs(const Graph *prog, Tensor *vals, int rank, Tensor *outputs, Diag *d)
{
	int rc = 0;
	for (int i = 0; i < prog->outputs.n && rc != SPMD_RUN_ABORT; i++) {
		int v = prog->outputs.a[i];
		const Value *val = &prog->values.a[v];
		if (shape_numel(&val->shape) > INT32_MAX) {
			diag_error(d, val->pos, "expected outputs of at most %d elements per device for MPI, found '%s'",
			           INT32_MAX, val->name);
			return SPMD_RUN_ABORT;
		}
		int home = value_stage_coord(prog, v); /* a pipeline's output: only its stage's devices hold it */
		if (rank != 0 && home >= 0 && graph_stage_coord(prog, rank) != home)
			continue;
		if (rank != 0) {
			if (MPI_Send(vals[v].data, (int)shape_numel(&val->shape), MPI_INT32_T, 0, i, MPI_COMM_WORLD) != MPI_SUCCESS)
				rc = SPMD_RUN_ABORT;
			continue;
		}
		Fetch f = {.mine = &vals[v], .tag = i};
		tensor_alloc(&f.buf, val->dtype, &val->shape);
		if (spmd_gather_value(prog, v, fetch_rank, &f, &outputs[i], d) != 0)
			rc = SPMD_RUN_DISAGREE;
		tensor_free(&f.buf);
		if (f.failed) {
			diag_error(d, val->pos, "gathering '%s' on rank 0: MPI_Recv failed: %s", val->name, f.err);
			rc = SPMD_RUN_ABORT;
		}
	}
	if (rc == SPMD_RUN_ABORT && rank != 0)
		diag_error(d, (Pos){prog->file, 0, 0}, "device %d (MPI rank %d) failed to send its outputs", rank, rank);
	return rc;
}

/* Every device's memory (as spmd_run) and collective figures, on rank 0 (mem, stats may be NULL). */
static void gather_figures(const Graph *prog, const ExecStats *st, const MpiStats *ms, DeviceMemory *mem,
                           MpiStats *stats)
{
	int ndev = prog->mesh.ndev;
	int64_t mine[5] = {spmd_persistent_bytes(prog), st->peak, ms->calls, ms->bytes_sent, (int64_t)(ms->seconds * 1e9)};
	int64_t *all = xcalloc((size_t)ndev * 5 + 5, sizeof *all);
	MPI_Gather(mine, 5, MPI_INT64_T, all, 5, MPI_INT64_T, 0, MPI_COMM_WORLD);
	for (int dev = 0; dev < ndev; dev++) {
		const int64_t *a = all + 5 * dev;
		if (mem)
			mem[dev] = (DeviceMemory){a[0], a[1]};
		if (stats)
			stats[dev] = (MpiStats){a[2], a[3], (double)a[4] * 1e-9};
	}
	free(all);
}

/* After a step: each carried value's tensor becomes its leaf's (as train_run_threads). */
static void carry(const StepOpts *s, Tensor *vals)
{
	for (int i = 0; i < s->ncarry; i++) {
		tensor_free(&vals[s->to[i]]);
		vals[s->to[i]] = vals[s->from[i]];
		vals[s->from[i]] = (Tensor){0};
	}
}

/* This rank's steps (one when s is NULL), each gathered on rank 0, which
 * calls s->on_step.  Every rank runs every step (rank 0 keeps going after
 * finding replicas differing, so nobody waits for it).  0, SPMD_RUN_DISAGREE
 * or SPMD_RUN_ABORT. */
static int run_steps(const Graph *prog, const SpmdOpts *o, const StepOpts *s, Backend *b, Tensor *vals,
                     ExecStats *es, Captured *cap, Tensor *outputs, Diag *d)
{
	int rank = mpi_backend_rank(), rc = 0;
	for (int step = 0; step < (s ? s->steps : 1); step++) {
		ExecOpts eo = {.seed = o->seed, .backend = b, .device = rank, .stats = es};
		if (o->op_seconds) { /* --profile: this rank's row; the ranks start together */
			eo.profile = true;
			eo.op_seconds = o->op_seconds + (size_t)rank * (size_t)prog->ops.n;
			if (b->barrier(b, rank) != 0)
				return SPMD_RUN_ABORT;
		}
		if (exec_run(prog, vals, NULL, &eo, &cap->d) != 0) {
			report(cap, b, prog, rank, d);
			return SPMD_RUN_ABORT;
		}
		for (int i = 0; i < prog->outputs.n; i++)
			tensor_free(&outputs[i]);
		int st = gather_outputs(prog, vals, rank, outputs, d);
		if (st == SPMD_RUN_ABORT)
			return st;
		rc = rc ? rc : st;
		if (rc == 0 && rank == 0 && s && s->on_step)
			s->on_step(s->arg, step, outputs);
		if (s)
			carry(s, vals);
	}
	return rc;
}

int train_run_mpi(const Graph *prog, const SpmdOpts *o, int flags, const StepOpts *s, Tensor *outputs,
                  DeviceMemory *mem, MpiStats *stats, Diag *d)
{
	Backend b;
	if (mpi_backend_init(&b, &prog->mesh, flags) != 0) {
		diag_error(d, (Pos){prog->file, 0, 0}, "expected %d MPI processes (one per device), found %d",
		           prog->mesh.ndev, mpi_backend_size());
		return -1;
	}
	int rank = mpi_backend_rank(), first, rc;
	Tensor *vals = xcalloc((size_t)prog->values.n + 1, sizeof *vals);
	Captured cap;
	capture_open(&cap);
	rc = make_leaves(prog, o, rank, vals, &cap.d);
	if (mpi_backend_agree(rc ? 2 : 0, &first) != 0) {
		if (first == rank)
			report(&cap, &b, prog, rank, d);
		rc = -1;
	} else {
		ExecStats es = {0};
		rc = run_steps(prog, o, s, &b, vals, &es, &cap, outputs, d);
		if (!mem && s)
			mem = s->mem;
		if (rc != SPMD_RUN_ABORT && o->op_seconds) /* every rank's op times into rank 0's table */
			MPI_Gather(rank == 0 ? MPI_IN_PLACE : o->op_seconds + (size_t)rank * (size_t)prog->ops.n, prog->ops.n,
			           MPI_DOUBLE, o->op_seconds, prog->ops.n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
		if (rc != SPMD_RUN_ABORT)
			gather_figures(prog, &es, mpi_backend_stats(&b), rank == 0 ? mem : NULL, rank == 0 ? stats : NULL);
	}
	exec_free_values(prog, vals);
	free(vals);
	capture_close(&cap);
	mpi_backend_free(&b);
	return rc;
}

int spmd_run_mpi(const Graph *prog, const SpmdOpts *o, int flags, Tensor *outputs, DeviceMemory *mem,
                 MpiStats *stats, Diag *d)
{
	return train_run_mpi(prog, o, flags, NULL, outputs, mem, stats, d);
}
