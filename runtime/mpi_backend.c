/* mpi_backend.c: the MPI backend — collectives over per-axes communicators, MPI start, agreement and abort. */
#include "mpi_backend.h"
#include "../spmd/ops.h"

#include <limits.h>
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

enum { NKEYS = 5 * 5 * 5 * 5 }; /* ordered lists of up to 4 of 4 axes, base 5 */

typedef struct {
	int flags;
	int rank;
	MPI_Comm comm[NKEYS]; /* by axes_key(); MPI_COMM_NULL until first used */
	MpiStats stats;
	char err[MPI_MAX_ERROR_STRING + 128];
} Mb;

/* ---- the watchdog ----
 * Process-wide, as MPI is: before every blocking MPI call the rank notes
 * what it waits in and arms a one-shot real-time timer; after the call it
 * disarms it.  When the timer fires the rank is stuck (another rank died,
 * stopped, or runs a different program): the handler writes the message
 * with write(2), which is async-signal-safe, and ends the process. */
static struct {
	double seconds;        /* 0: off */
	int rank;
	char what[512];        /* what this rank waits in */
	char msg[768];         /* the whole message, made before arming */
	size_t len;
} watch;

static void watch_fire(int sig)
{
	(void)sig;
	ssize_t w = write(2, watch.msg, watch.len);
	(void)w;
	_exit(2);
}

void mpi_backend_set_timeout(double seconds)
{
	watch.seconds = seconds;
	watch.rank = mpi_backend_rank();
	if (seconds > 0)
		signal(SIGALRM, watch_fire);
}

/* Arm the timer for a wait in `what` (a printf format). */
static void watch_begin(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void watch_begin(const char *fmt, ...)
{
	if (watch.seconds <= 0)
		return;
	char what[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	int n = snprintf(watch.msg, sizeof watch.msg, "spmd: rank %d: error: no progress for %g s in %s%s%s (--timeout)\n",
	                 watch.rank, watch.seconds, what, watch.what[0] ? " of " : "", watch.what);
	watch.len = n < 0 ? 0 : (size_t)n < sizeof watch.msg ? (size_t)n : sizeof watch.msg - 1;
	struct itimerval t = {{0, 0}, {(time_t)watch.seconds, (suseconds_t)((watch.seconds - (time_t)watch.seconds) * 1e6)}};
	if (t.it_value.tv_sec == 0 && t.it_value.tv_usec == 0)
		t.it_value.tv_usec = 1;
	setitimer(ITIMER_REAL, &t, NULL);
}

static void watch_end(void)
{
	if (watch.seconds <= 0)
		return;
	struct itimerval t = {{0, 0}, {0, 0}};
	setitimer(ITIMER_REAL, &t, NULL);
}

/* Backend.note: the op the next collective serves, for the message. */
static void mpi_note(Backend *b, int device, const Op *op)
{
	(void)device;
	if (watch.seconds <= 0)
		return;
	char axes[128] = "";
	mesh_axes_text(b->mesh, op->attr->cax, op->attr->ncax, axes, sizeof axes);
	snprintf(watch.what, sizeof watch.what, "%s over [%s] at %s:%d:%d", op_table[op->kind].name, axes,
	         op->pos.file ? op->pos.file : "?", op->pos.line, op->pos.col);
	const char *stall = getenv("SPMD_TEST_MPI_STALL_RANK"); /* tests: this rank stops before its first collective */
	if (stall && atoi(stall) == watch.rank) {
		watch_begin("a stall for tests");
		for (;;)
			pause();
	}
}

/* ---- starting, agreeing, ending ---- */

int mpi_backend_start(void)
{
	int on = 0;
	if (MPI_Initialized(&on) != MPI_SUCCESS)
		return -1;
	if (!on && MPI_Init(NULL, NULL) != MPI_SUCCESS)
		return -1;
	return MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) == MPI_SUCCESS ? 0 : -1;
}

int mpi_backend_rank(void)
{
	int r = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &r);
	return r;
}

int mpi_backend_size(void)
{
	int n = 1;
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	return n;
}

/* MPI is process-wide state, and so is this: once some rank has entered
 * mpi_backend_finish, every agreement this process joined has told it so,
 * and it agrees no more (the finishing rank will not answer). */
static struct {
	bool ending;
	int status;
} job;

/* Agree on [status, lowest failing rank, ending] with every rank. */
static int agree(int status, int *first, bool ending)
{
	if (job.ending) {
		if (first)
			*first = -1;
		return job.status > status ? job.status : status;
	}
	int rank = mpi_backend_rank(), size = mpi_backend_size();
	int mine[3] = {status, status ? size - rank : 0, ending}, all[3] = {status ? status : 2, 0, 1};
	watch.what[0] = 0;
	watch_begin("the agreement of every rank on the run's status");
	MPI_Allreduce(mine, all, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	watch_end();
	if (first)
		*first = all[1] ? size - all[1] : -1;
	if (all[2] && !ending && all[0] == 0) /* someone finished before the run: a failure */
		all[0] = 2;
	if (all[2])
		job.ending = true, job.status = all[0];
	return all[0];
}

int mpi_backend_agree(int status, int *first) { return agree(status, first, false); }

int mpi_backend_same(uint64_t x, int *first)
{
	uint64_t x0 = x;
	if (!job.ending)
		MPI_Bcast(&x0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
	return agree(x != x0 ? 2 : 0, first, false);
}

int mpi_backend_finish(int status)
{
	status = agree(status, NULL, true);
	fflush(stdout);
	fflush(stderr);
	MPI_Finalize();
	return status;
}

void mpi_backend_abort(int status)
{
	fflush(stdout);
	fflush(stderr);
	MPI_Abort(MPI_COMM_WORLD, status);
	abort(); /* MPI_Abort does not return */
}

/* ---- helpers ---- */

/* Record a failed MPI call; -1. */
static int mpi_fail(Mb *s, int code, const char *what)
{
	char text[MPI_MAX_ERROR_STRING] = "";
	int len = 0;
	MPI_Error_string(code, text, &len);
	snprintf(s->err, sizeof s->err, "%s failed on rank %d: %s", what, s->rank, text);
	return -1;
}

/* 0 if code is MPI_SUCCESS, else -1 after recording what failed. */
static int ck(Mb *s, int code, const char *what)
{
	watch_end();
	return code == MPI_SUCCESS ? 0 : mpi_fail(s, code, what);
}

/* A blocking MPI call, watched: ck(s, CALL, "MPI_Name") with the timer armed around CALL. */
#define WAITED(s, call, name) (watch_begin("%s", name), ck(s, call, name))

static int64_t numel_of(const Coll *c)
{
	int64_t n = 1;
	for (int d = 0; d < c->rank; d++)
		n *= c->shape[d];
	return n;
}

/* Do counts of n elements (times the group size) fit MPI's int?  -1 if not. */
static int check_count(Mb *s, int64_t n, int members)
{
	if (n * members <= INT_MAX)
		return 0;
	snprintf(s->err, sizeof s->err, "a collective of %lld elements over %d devices (limit is %d elements)",
	         (long long)n, members, INT_MAX);
	return -1;
}

static int axes_key(const Coll *c)
{
	int key = 0;
	for (int i = 0; i < c->nax; i++)
		key = key * 5 + c->axes[i] + 1;
	return key;
}

/* The communicator of c's groups, its size and this rank's index.  Made on
 * first use by MPI_Comm_create_group, collective over the group alone: the
 * members of a group reach its first collective together, other groups need
 * not (the stages of a pipeline run different op sequences). */
static int group_comm(Backend *b, const Coll *c, MPI_Comm *comm, int *n, int *k)
{
	Mb *s = b->impl;
	int key = axes_key(c);
	int *g = xmalloc(sizeof(int) * (size_t)b->mesh->ndev);
	int self = mesh_group(b->mesh, s->rank, c->axes, c->nax, g), size = 1;
	for (int i = 0; i < c->nax; i++)
		size *= b->mesh->size[c->axes[i]];
	if (s->comm[key] == MPI_COMM_NULL) {
		MPI_Group world, sub;
		MPI_Comm_group(MPI_COMM_WORLD, &world);
		MPI_Group_incl(world, size, g, &sub);
		int rc = WAITED(s, MPI_Comm_create_group(MPI_COMM_WORLD, sub, key, &s->comm[key]), "MPI_Comm_create_group");
		MPI_Group_free(&sub);
		MPI_Group_free(&world);
		if (rc != 0) {
			free(g);
			return -1;
		}
		MPI_Comm_set_errhandler(s->comm[key], MPI_ERRORS_RETURN);
	}
	free(g);
	*comm = s->comm[key];
	MPI_Comm_size(*comm, n);
	MPI_Comm_rank(*comm, k);
	if (*k == self)
		return 0;
	snprintf(s->err, sizeof s->err, "rank %d is member %d of its communicator, expected %d", s->rank, *k, self);
	return -1;
}

/* Is the box along dim contiguous per block (every dim before dim is 1)? */
static bool blocks_contiguous(const int64_t *shape, int dim)
{
	for (int d = 0; d < dim; d++)
		if (shape[d] != 1)
			return false;
	return true;
}

/* Copy n blocks of in (shape) along dim, block j to buf + j*M. */
static void pack_blocks(const Coll *c, int n, const void *in, char *buf)
{
	int64_t ext[MAX_RANK], off[MAX_RANK] = {0}, zero[MAX_RANK] = {0}, m = numel_of(c) / n;
	memcpy(ext, c->shape, sizeof ext);
	ext[c->dim] /= n;
	for (int j = 0; j < n; j++) {
		off[c->dim] = j * ext[c->dim];
		coll_copy_box(c->rank, ext, in, c->shape, off, buf + 4 * j * m, ext, zero);
	}
}

/* out = blocks[0] op blocks[1] op ... op blocks[n-1], m elements each, left to right. */
static void reduce_blocks(const Coll *c, int n, int64_t m, const char *blocks, void *out)
{
	int64_t zero = 0;
	memcpy(out, blocks, (size_t)m * 4);
	for (int j = 1; j < n; j++)
		coll_reduce_box(1, &m, blocks + 4 * j * m, &m, &zero, out, &m, &zero, c->dtype, c->reduce);
}

static MPI_Datatype elem_type(const Coll *c) { return c->dtype == DT_I32 ? MPI_INT32_T : MPI_FLOAT; }
static MPI_Op reduce_op(const Coll *c) { return c->reduce == REDUCE_MAX ? MPI_MAX : MPI_SUM; }

/* Account one collective that took since t0 and sent `elems` elements. */
static int account(Mb *s, double t0, int64_t elems, int rc)
{
	s->stats.calls++;
	s->stats.bytes_sent += 4 * elems;
	s->stats.seconds += MPI_Wtime() - t0;
	return rc;
}

/* ---- the collectives ---- */

/* Member k reduces piece k (elements [N*k/n, N*(k+1)/n)) of every member's
 * buffer in member order, then every member gathers every piece. */
static int all_reduce_ordered(Mb *s, MPI_Comm comm, int n, int k, const Coll *c, const void *in, void *out)
{
	int64_t N = numel_of(c);
	int *cnt = xmalloc(sizeof(int) * 4 * (size_t)n), *dis = cnt + n, *rcnt = dis + n, *rdis = rcnt + n;
	for (int j = 0; j < n; j++) {
		dis[j] = (int)(N * j / n);
		cnt[j] = (int)(N * (j + 1) / n) - dis[j];
	}
	for (int j = 0; j < n; j++)
		rcnt[j] = cnt[k], rdis[j] = j * cnt[k];
	char *tmp = xmalloc((size_t)n * (size_t)cnt[k] * 4 + 4);
	int st = WAITED(s, MPI_Alltoallv(in, cnt, dis, MPI_INT32_T, tmp, rcnt, rdis, MPI_INT32_T, comm), "MPI_Alltoallv");
	if (st == 0) {
		reduce_blocks(c, n, cnt[k], tmp, (char *)out + 4 * (int64_t)dis[k]);
		st = WAITED(s, MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, cnt, dis, MPI_INT32_T, comm),
		        "MPI_Allgatherv");
	}
	free(tmp);
	free(cnt);
	return st;
}

static int mpi_all_reduce(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Mb *s = b->impl;
	double t0 = MPI_Wtime();
	MPI_Comm comm;
	int n, k, st;
	int64_t N = numel_of(c);
	if (group_comm(b, c, &comm, &n, &k) != 0 || check_count(s, N, 1) != 0)
		return account(s, t0, 0, -1);
	if (n == 1) {
		memcpy(out, in, (size_t)N * 4);
		return account(s, t0, 0, 0);
	}
	if (s->flags & MPI_BACKEND_NATIVE)
		st = WAITED(s, MPI_Allreduce(in, out, (int)N, elem_type(c), reduce_op(c), comm), "MPI_Allreduce");
	else
		st = all_reduce_ordered(s, comm, n, k, c, in, out);
	int64_t piece = N * (k + 1) / n - N * k / n; /* sent: all but the own piece, then it to n-1 members */
	return account(s, t0, (N - piece) + (n - 1) * piece, st);
}

static int mpi_reduce_scatter(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Mb *s = b->impl;
	double t0 = MPI_Wtime();
	MPI_Comm comm;
	int n, k;
	int64_t N = numel_of(c);
	if (group_comm(b, c, &comm, &n, &k) != 0 || check_count(s, N, 1) != 0)
		return account(s, t0, 0, -1);
	int64_t m = N / n;
	char *send = blocks_contiguous(c->shape, c->dim) ? NULL : xmalloc((size_t)N * 4 + 4);
	if (send)
		pack_blocks(c, n, in, send);
	const void *src = send ? send : in;
	int st;
	if (s->flags & MPI_BACKEND_NATIVE)
		st = WAITED(s, MPI_Reduce_scatter_block(src, out, (int)m, elem_type(c), reduce_op(c), comm),
		        "MPI_Reduce_scatter_block");
	else {
		char *tmp = xmalloc((size_t)N * 4 + 4);
		st = WAITED(s, MPI_Alltoall(src, (int)m, MPI_INT32_T, tmp, (int)m, MPI_INT32_T, comm), "MPI_Alltoall");
		if (st == 0)
			reduce_blocks(c, n, m, tmp, out);
		free(tmp);
	}
	free(send);
	return account(s, t0, (n - 1) * m, st);
}

static int mpi_all_gather(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Mb *s = b->impl;
	double t0 = MPI_Wtime();
	MPI_Comm comm;
	int n, k;
	int64_t m = numel_of(c);
	if (group_comm(b, c, &comm, &n, &k) != 0 || check_count(s, m, n) != 0)
		return account(s, t0, 0, -1);
	bool direct = blocks_contiguous(c->shape, c->dim);
	char *tmp = direct ? out : xmalloc((size_t)(m * n) * 4 + 4);
	int st = WAITED(s, MPI_Allgather(in, (int)m, MPI_INT32_T, tmp, (int)m, MPI_INT32_T, comm), "MPI_Allgather");
	if (st == 0 && !direct) {
		int64_t od[MAX_RANK], off[MAX_RANK] = {0}, zero[MAX_RANK] = {0};
		memcpy(od, c->shape, sizeof od);
		od[c->dim] *= n;
		for (int j = 0; j < n; j++) {
			off[c->dim] = j * c->shape[c->dim];
			coll_copy_box(c->rank, c->shape, tmp + 4 * j * m, c->shape, zero, out, od, off);
		}
	}
	if (!direct)
		free(tmp);
	return account(s, t0, (n - 1) * m, st);
}

static int mpi_all_to_all(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Mb *s = b->impl;
	double t0 = MPI_Wtime();
	MPI_Comm comm;
	int n, k;
	int64_t N = numel_of(c);
	if (group_comm(b, c, &comm, &n, &k) != 0 || check_count(s, N, 1) != 0)
		return account(s, t0, 0, -1);
	int64_t m = N / n, ext[MAX_RANK], od[MAX_RANK], off[MAX_RANK] = {0}, zero[MAX_RANK] = {0};
	memcpy(ext, c->shape, sizeof ext);
	ext[c->dim] /= n;
	memcpy(od, ext, sizeof od);
	od[c->dim2] *= n;
	char *send = blocks_contiguous(c->shape, c->dim) ? NULL : xmalloc((size_t)N * 4 + 4);
	bool direct = blocks_contiguous(od, c->dim2);
	char *recv = direct ? out : xmalloc((size_t)N * 4 + 4);
	if (send)
		pack_blocks(c, n, in, send);
	int st = WAITED(s, MPI_Alltoall(send ? send : in, (int)m, MPI_INT32_T, recv, (int)m, MPI_INT32_T, comm),
	            "MPI_Alltoall");
	for (int j = 0; j < n && st == 0 && !direct; j++) {
		off[c->dim2] = j * ext[c->dim2];
		coll_copy_box(c->rank, ext, recv + 4 * j * m, ext, zero, out, od, off);
	}
	free(send);
	if (!direct)
		free(recv);
	return account(s, t0, (n - 1) * m, st);
}

static int mpi_permute(Backend *b, int device, const Coll *c, const void *in, void *out)
{
	Mb *s = b->impl;
	double t0 = MPI_Wtime();
	int64_t N = numel_of(c);
	int me = s->rank, to = c->target[me], from = -1, st = 0;
	for (int d = 0; d < b->mesh->ndev && from < 0; d++)
		if (c->target[d] == me)
			from = d;
	if (check_count(s, N, 1) != 0)
		return account(s, t0, 0, -1);
	if (from < 0)
		memset(out, 0, (size_t)N * 4);
	if (to == me)
		memcpy(out, in, (size_t)N * 4);
	else if (to >= 0 && from >= 0)
		st = WAITED(s, MPI_Sendrecv(in, (int)N, MPI_INT32_T, to, 0, out, (int)N, MPI_INT32_T, from, 0, MPI_COMM_WORLD,
		                        MPI_STATUS_IGNORE), "MPI_Sendrecv");
	else if (to >= 0)
		st = WAITED(s, MPI_Send(in, (int)N, MPI_INT32_T, to, 0, MPI_COMM_WORLD), "MPI_Send");
	else if (from >= 0)
		st = WAITED(s, MPI_Recv(out, (int)N, MPI_INT32_T, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
	return account(s, t0, to >= 0 && to != me ? N : 0, st);
}

static int mpi_barrier(Backend *b, int device)
{
	return WAITED((Mb *)b->impl, MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

/* ---- the table ---- */

int mpi_backend_init(Backend *b, const Mesh *m, int flags)
{
	if (mpi_backend_size() != m->ndev)
		return -1;
	Mb *s = xcalloc(1, sizeof *s);
	s->flags = flags;
	s->rank = mpi_backend_rank();
	for (int i = 0; i < NKEYS; i++)
		s->comm[i] = MPI_COMM_NULL;
	*b = (Backend){.mesh = m, .impl = s, .all_reduce = mpi_all_reduce, .reduce_scatter = mpi_reduce_scatter,
	               .all_gather = mpi_all_gather, .all_to_all = mpi_all_to_all, .permute = mpi_permute,
	               .barrier = mpi_barrier, .note = mpi_note};
	return 0;
}

void mpi_backend_free(Backend *b)
{
	Mb *s = b->impl;
	if (!s)
		return;
	for (int i = 0; i < NKEYS; i++)
		if (s->comm[i] != MPI_COMM_NULL)
			MPI_Comm_free(&s->comm[i]);
	free(s);
	b->impl = NULL;
}

const MpiStats *mpi_backend_stats(const Backend *b) { return &((const Mb *)b->impl)->stats; }
const char *mpi_backend_error(const Backend *b) { return ((const Mb *)b->impl)->err; }
