/* spmd_run.c: a partitioned program on every device of its mesh (threads), and its gathered outputs. */
#include "spmd_run.h"

#include <string.h>

#include "data.h"
#include "exec.h"
#include "threads.h"
#include "../spmd/npy.h"
#include "../spmd/ops.h"

int spmd_collective(Backend *b, int device, const Op *op, const Tensor *in, Tensor *out)
{
	const Attr *at = op->attr;
	Coll c = {.nax = at->ncax, .dtype = in->dtype, .rank = in->shape.rank, .dim = at->dim, .dim2 = at->dim2,
	          .reduce = at->reduce, .target = at->target};
	memcpy(c.axes, at->cax, sizeof c.axes);
	memcpy(c.shape, in->shape.dim, sizeof c.shape);
	if (b->note)
		b->note(b, device, op);
	switch (op->kind) {
	case OP_ALL_REDUCE: return b->all_reduce(b, device, &c, in->data, out->data);
	case OP_REDUCE_SCATTER: return b->reduce_scatter(b, device, &c, in->data, out->data);
	case OP_ALL_GATHER: return b->all_gather(b, device, &c, in->data, out->data);
	case OP_ALL_TO_ALL: return b->all_to_all(b, device, &c, in->data, out->data);
	case OP_COLLECTIVE_PERMUTE: {
		if (at->target)
			return b->permute(b, device, &c, in->data, out->data);
		int *t = xmalloc(sizeof(int) * (size_t)b->mesh->ndev);
		mesh_shift_targets(b->mesh, at->cax[0], at->shift, t);
		c.target = t;
		int rc = b->permute(b, device, &c, in->data, out->data);
		free(t);
		return rc;
	}
	default: return -1;
	}
}

/* Shared state of one run. */
typedef struct {
	const Graph *prog;
	const SpmdOpts *o;
	Tensor **vals;     /* per device: its values */
	ExecStats *stats;  /* per device */
	Diag *diag;        /* per device, quiet: messages kept in .last */
	int *failed_op;    /* per device */
} Run;

/* Does a file's dtype fit the value's?  bf16 and f16 values take f32 and f16 files too. */
static bool file_dtype_fits(DType want, DType got)
{
	return want == got || ((want == DT_BF16 || want == DT_F16) && (got == DT_F32 || got == DT_F16));
}

/* Read t, the box ext at off of value val, from the whole tensor in file. */
static int leaf_from_file(const Value *val, const char *file, const int64_t *off, const int64_t *ext, Tensor *t,
                          Diag *d)
{
	NpyInfo info;
	if (npy_info(file, &info, d) != 0)
		return -1;
	if (!shape_eq(&info.shape, &val->global) || !file_dtype_fits(val->dtype, info.dtype)) {
		char want[128], got[128];
		shape_format(&val->global, want, sizeof want);
		shape_format(&info.shape, got, sizeof got);
		diag_error(d, val->pos, "expected %s %s for '%s' in %s, found %s %s", dtype_names[val->dtype], want,
		           val->name, file, dtype_names[info.dtype], got);
		return -1;
	}
	if (npy_read_box(file, &info, off, ext, t->data, val->shape.dim, d) != 0)
		return -1;
	tensor_round(t);
	return 0;
}

int spmd_make_leaf(const Graph *prog, const SpmdOpts *o, int device, int v, Tensor *t, Diag *d)
{
	const Value *val = &prog->values.a[v];
	int64_t off[MAX_RANK] = {0}, ext[MAX_RANK];
	tensor_alloc(t, val->dtype, &val->shape);
	if (val->kind == VK_CONST) {
		data_fill(t, val, &val->shape, NULL, 0, 1);
		return 0;
	}
	spec_shard_region(&val->spec, &prog->mesh, val->global.dim, device, off, ext);
	if (o->given_file && o->given_file[v])
		return leaf_from_file(val, o->given_file[v], off, ext, t, d);
	const Tensor *given = o->given && o->given[v].data ? &o->given[v] : NULL;
	if (!given) {
		int64_t range = o->id_range ? o->id_range[v] : 1000;
		data_fill(t, val, &val->global, off, o->seed, range);
		return 0;
	}
	int64_t zero[MAX_RANK] = {0};
	for (int k = 0; k < val->shape.rank; k++)
		if (ext[k] == 0)
			return 0;
	if (val->shape.rank == 0)
		memcpy(t->data, given->data, 4);
	else
		coll_copy_box(val->shape.rank, ext, given->data, val->global.dim, off, t->data, val->shape.dim, zero);
	return 0;
}

static int device_main(int device, void *arg, Backend *b)
{
	Run *r = arg;
	const Graph *g = r->prog;
	Tensor *vals = xcalloc((size_t)g->values.n + 1, sizeof *vals);
	r->vals[device] = vals;
	diag_init(&r->diag[device]);
	r->diag[device].quiet = true;
	bool *used = exec_used_on(g, graph_stage_coord(g, device));
	int rc = 0;
	for (int v = 0; v < g->values.n && rc == 0; v++)
		if (g->values.a[v].producer < 0 && (!used || used[v]))
			rc = spmd_make_leaf(g, r->o, device, v, &vals[v], &r->diag[device]);
	free(used);
	if (rc != 0)
		return -1;
	ExecOpts eo = {.seed = r->o->seed, .backend = b, .device = device, .stats = &r->stats[device]};
	if (r->o->op_seconds) { /* --profile */
		eo.profile = true;
		eo.op_seconds = r->o->op_seconds + (size_t)device * (size_t)g->ops.n;
		if (b->barrier(b, device) != 0)
			return -1;
	}
	return exec_run(g, vals, NULL, &eo, &r->diag[device]) == 0 ? 0 : -1;
}

/* Is device the first of its replicas for spec s (coordinate 0 on every
 * axis that neither splits a dim nor is partial)?  On the stage axis of a
 * pipelined program (stage_axis, >= 0) only the coordinate home holds the
 * value (-1: every one does). */
static bool first_replica(const Mesh *m, const Spec *s, int device, int stage_axis, int home)
{
	int coord[MESH_MAX_AXES];
	mesh_device_coords(m, device, coord);
	for (int a = 0; a < m->naxes; a++)
		if (a == stage_axis && home >= 0 ? coord[a] != home : spec_replicated_over(s, a) && coord[a] != 0)
			return false;
	return true;
}

/* Do the box ext[] at aoff in a (shape ad) and at boff in b (shape bd) hold the same bits? */
static bool box_equal(int rank, const int64_t *ext, const char *a, const int64_t *ad, const int64_t *aoff,
                      const char *b, const int64_t *bd, const int64_t *boff, int d, int64_t ab, int64_t bb)
{
	int64_t abase = ab * ad[d] + aoff[d], bbase = bb * bd[d] + boff[d];
	if (d == rank - 1)
		return memcmp(a + 4 * abase, b + 4 * bbase, 4 * (size_t)ext[d]) == 0;
	for (int64_t i = 0; i < ext[d]; i++)
		if (!box_equal(rank, ext, a, ad, aoff, b, bd, boff, d + 1, abase + i, bbase + i))
			return false;
	return true;
}

int spmd_gather_value(const Graph *g, int v, SpmdFetchFn fetch, void *arg, Tensor *out, Diag *d)
{
	const Value *val = &g->values.a[v];
	const Mesh *m = &g->mesh;
	int rank = val->shape.rank, rc = 0;
	tensor_alloc(out, val->dtype, &val->global);
	bool partial = val->spec.partial != 0;
	int home = value_stage_coord(g, v);
	for (int pass = 0; pass < 2; pass++)
		for (int dev = 0; dev < m->ndev; dev++) {
			/* pass 0 copies one replica of every block (summand 0 of a pending
			 * reduction); pass 1 checks the other replicas, or adds the other
			 * summands; devices of other stages do not hold it */
			if (home >= 0 && graph_stage_coord(g, dev) != home)
				continue;
			bool first = first_replica(m, &val->spec, dev, g->stage_axis, home);
			if (partial ? !first || (spec_partial_index(&val->spec, m, dev) == 0) != (pass == 0)
			            : first != (pass == 0))
				continue;
			int64_t off[MAX_RANK], ext[MAX_RANK], zero[MAX_RANK] = {0};
			spec_shard_region(&val->spec, m, val->global.dim, dev, off, ext);
			const Tensor *src = fetch(arg, dev);
			bool empty = false;
			for (int k = 0; k < rank; k++)
				empty |= ext[k] == 0;
			if (empty || rc != 0)
				continue;
			if (pass == 1 && partial)
				coll_reduce_box(rank, ext, src->data, val->shape.dim, zero, out->data, val->global.dim, off,
				                val->dtype, val->spec.reduce);
			else if (rank == 0 && pass == 0)
				memcpy(out->data, src->data, 4);
			else if (pass == 0)
				coll_copy_box(rank, ext, src->data, val->shape.dim, zero, out->data, val->global.dim, off);
			else if (rank == 0 ? memcmp(out->data, src->data, 4) != 0
			                   : !box_equal(rank, ext, src->data, val->shape.dim, zero, out->data, val->global.dim,
			                                off, 0, 0, 0)) {
				diag_error(d, val->pos, "expected the replicas of '%s' to agree, found device %d differing",
				           val->name, dev);
				rc = SPMD_RUN_DISAGREE;
			}
		}
	return rc;
}

typedef struct {
	const Run *r;
	int v;
} Fetch;

static const Tensor *fetch_thread(void *arg, int device)
{
	const Fetch *f = arg;
	return &f->r->vals[device][f->v];
}

/* Report the first device that failed. */
static void report_failure(const Run *r, Diag *d)
{
	for (int dev = 0; dev < r->prog->mesh.ndev; dev++)
		if (r->diag[dev].nerr && !strstr(r->diag[dev].last, "aborted")) {
			diag_error(d, r->diag[dev].last_pos, "device %d: %s", dev, r->diag[dev].last);
			return;
		}
	diag_error(d, (Pos){r->prog->file, 0, 0}, "the run on threads failed");
}

int spmd_run(const Graph *prog, const SpmdOpts *o, Tensor *outputs, DeviceMemory *mem, Diag *d)
{
	int ndev = prog->mesh.ndev;
	Run r = {prog, o, xcalloc((size_t)ndev, sizeof(Tensor *)), xcalloc((size_t)ndev, sizeof(ExecStats)),
	         xcalloc((size_t)ndev, sizeof(Diag)), NULL};
	int rc = threads_run(&prog->mesh, device_main, &r);
	if (rc == THREADS_NOT_STARTED)
		diag_error(d, (Pos){prog->file, 0, 0}, "%s", threads_start_error());
	else if (rc != 0)
		report_failure(&r, d);
	for (int i = 0; i < prog->outputs.n && rc == 0; i++)
		rc = spmd_gather_value(prog, prog->outputs.a[i], fetch_thread, &(Fetch){&r, prog->outputs.a[i]}, &outputs[i], d);
	for (int dev = 0; dev < ndev; dev++) {
		if (mem)
			mem[dev] = (DeviceMemory){spmd_persistent_bytes(prog), r.stats[dev].peak};
		if (r.vals[dev])
			exec_free_values(prog, r.vals[dev]);
		free(r.vals[dev]);
	}
	free(r.vals), free(r.stats), free(r.diag);
	return rc;
}

/* Bytes one device holds of the leaves of kind k (local shapes, declared
 * dtypes); a pipeline's devices hold their stages' only: the most of any. */
static int64_t leaf_bytes(const Graph *prog, ValueKind k)
{
	int np = prog->stage_axis >= 0 ? prog->mesh.size[prog->stage_axis] : 0;
	int64_t most = 0;
	for (int c = np ? 0 : -1; c < np || c < 0; c++) {
		bool *used = exec_used_on(prog, c);
		int64_t n = 0;
		for (int v = 0; v < prog->values.n; v++) {
			const Value *val = &prog->values.a[v];
			if (val->producer < 0 && val->kind == k && (!used || used[v]))
				n += shape_numel(&val->shape) * dtype_size(val->dtype);
		}
		free(used);
		most = n > most ? n : most;
		if (c < 0)
			break;
	}
	return most;
}

int64_t spmd_persistent_bytes(const Graph *prog) { return leaf_bytes(prog, VK_PARAM) + leaf_bytes(prog, VK_STATE); }

int64_t spmd_state_bytes(const Graph *prog) { return leaf_bytes(prog, VK_STATE); }

void spmd_leaf_opts(const Graph *model, const Graph *prog, const int *map, const Tensor *given, int ngiven,
                    Tensor **given_out, int64_t **range_out)
{
	Tensor *gv = xcalloc((size_t)prog->values.n + 1, sizeof *gv);
	int64_t *range = xcalloc((size_t)prog->values.n + 1, sizeof *range);
	for (int v = 0; v < prog->values.n; v++)
		range[v] = 1000;
	for (int v = 0; v < model->values.n; v++) {
		if (model->values.a[v].producer >= 0 || map[v] < 0) /* map[v] < 0: not in prog (a pipeline's constants) */
			continue;
		if (given && v < ngiven)
			gv[map[v]] = given[v];
		if (model->values.a[v].dtype == DT_I32)
			range[map[v]] = data_id_range(model, v);
	}
	*given_out = gv;
	*range_out = range;
}
