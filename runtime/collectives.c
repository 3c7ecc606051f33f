/* collectives.c: strided box copies and reductions, and running a reshard plan on any backend. */
#include "collectives.h"

#include <string.h>

/* ---- boxes ---- */

typedef void (*RowFn)(void *dst, const void *src, int64_t n, DType dt, int reduce);

static void row_copy(void *dst, const void *src, int64_t n, DType dt, int reduce)
{
	memcpy(dst, src, (size_t)n * 4);
}

static void row_reduce(void *dst, const void *src, int64_t n, DType dt, int reduce)
{
	if (dt == DT_I32) {
		int32_t *y = dst;
		const int32_t *x = src;
		if (reduce == REDUCE_MAX)
			for (int64_t i = 0; i < n; i++)
				y[i] = x[i] > y[i] ? x[i] : y[i];
		else
			for (int64_t i = 0; i < n; i++)
				y[i] = (int32_t)((uint32_t)y[i] + (uint32_t)x[i]); /* wraps like two's complement */
		return;
	}
	float *y = dst;
	const float *x = src;
	if (reduce == REDUCE_MAX) /* NaN wins, as numpy's max and the reduce_max kernel */
		for (int64_t i = 0; i < n; i++)
			y[i] = x[i] > y[i] || x[i] != x[i] ? x[i] : y[i];
	else
		for (int64_t i = 0; i < n; i++)
			y[i] += x[i];
}

static bool dim_full(int d, const int64_t *ext, const int64_t *sd, const int64_t *so, const int64_t *dd,
                     const int64_t *dof)
{
	return ext[d] == sd[d] && ext[d] == dd[d] && so[d] == 0 && dof[d] == 0;
}

/* Apply fn to each contiguous row of the box: trailing dims the box covers
 * whole in both buffers are folded into the row. */
static void walk_box(int rank, const int64_t *ext, const char *src, const int64_t *sd, const int64_t *so, char *dst,
                     const int64_t *dd, const int64_t *dof, RowFn fn, DType dt, int reduce)
{
	if (rank == 0) {
		fn(dst, src, 1, dt, reduce);
		return;
	}
	int64_t ss[MAX_RANK], ds[MAX_RANK], idx[MAX_RANK] = {0}, rows = 1;
	ss[rank - 1] = ds[rank - 1] = 4;
	for (int d = rank - 2; d >= 0; d--) {
		ss[d] = ss[d + 1] * sd[d + 1];
		ds[d] = ds[d + 1] * dd[d + 1];
	}
	for (int d = 0; d < rank; d++)
		if (ext[d] <= 0)
			return;
	int j = rank - 1;
	while (j > 0 && dim_full(j, ext, sd, so, dd, dof))
		j--;
	int64_t row = ext[j] * (ss[j] / 4);
	for (int d = 0; d < j; d++)
		rows *= ext[d];
	for (int64_t r = 0; r < rows; r++) {
		int64_t s = so[j] * ss[j], t = dof[j] * ds[j];
		for (int d = 0; d < j; d++) {
			s += (so[d] + idx[d]) * ss[d];
			t += (dof[d] + idx[d]) * ds[d];
		}
		fn(dst + t, src + s, row, dt, reduce);
		for (int d = j - 1; d >= 0 && ++idx[d] == ext[d]; d--)
			idx[d] = 0;
	}
}

void coll_copy_box(int rank, const int64_t *ext, const void *src, const int64_t *src_dims, const int64_t *src_off,
                   void *dst, const int64_t *dst_dims, const int64_t *dst_off)
{
	walk_box(rank, ext, src, src_dims, src_off, dst, dst_dims, dst_off, row_copy, DT_F32, 0);
}

void coll_reduce_box(int rank, const int64_t *ext, const void *src, const int64_t *src_dims, const int64_t *src_off,
                     void *dst, const int64_t *dst_dims, const int64_t *dst_off, DType dt, int reduce)
{
	walk_box(rank, ext, src, src_dims, src_off, dst, dst_dims, dst_off, row_reduce, dt, reduce);
}

/* ---- shapes ---- */

int64_t coll_out_numel(ReshardKind k, const Coll *c, const Mesh *m)
{
	int64_t numel = 1, n = 1;
	for (int d = 0; d < c->rank; d++)
		numel *= c->shape[d];
	for (int i = 0; i < c->nax; i++)
		n *= m->size[c->axes[i]];
	if (k == RS_ALL_GATHER)
		return numel * n;
	if (k == RS_REDUCE_SCATTER)
		return numel / n;
	return numel;
}

/* ---- running a plan ---- */

int64_t coll_layout_numel(const ReshardLayout *l, int rank)
{
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= l->block[d];
	return n;
}

/* The local step from layout a to b on one device: copy the part of b's
 * block that holds data out of a's block (the planner checked it is there),
 * zero the rest. */
static void local_copy(const ReshardPlan *p, const Mesh *m, int device, const ReshardLayout *a, const ReshardLayout *b,
                       const void *src, void *dst)
{
	int64_t ia[MAX_RANK], ib[MAX_RANK], ext[MAX_RANK], so[MAX_RANK], zero[MAX_RANK] = {0};
	bool empty = false;
	reshard_layout_index(a, m, p->rank, device, ia);
	reshard_layout_index(b, m, p->rank, device, ib);
	if (a == b)
		memcpy(ia, ib, sizeof ia);
	for (int d = 0; d < p->rank; d++) {
		int64_t lo = ib[d] * b->block[d], e = p->dims[d] - lo;
		ext[d] = e < 0 ? 0 : e > b->block[d] ? b->block[d] : e;
		so[d] = lo - ia[d] * a->block[d];
		empty |= ext[d] == 0;
		if (ext[d] > 0 && (so[d] < 0 || so[d] + ext[d] > a->block[d]))
			abort(); /* the planner let a slice read data the device does not hold */
	}
	memset(dst, 0, (size_t)coll_layout_numel(b, p->rank) * 4);
	if (!empty)
		coll_copy_box(p->rank, ext, src, a->block, so, dst, b->block, zero);
}

static int run_step(const ReshardPlan *p, const ReshardStep *s, Backend *b, int device, DType dt, const void *in,
                    void *out)
{
	if (s->kind == RS_SLICE) {
		local_copy(p, b->mesh, device, &s->before, &s->after, in, out);
		return 0;
	}
	Coll c = {.nax = s->nax, .dtype = dt, .rank = p->rank, .dim = s->dim, .dim2 = s->dim2, .reduce = s->reduce,
	          .target = s->target};
	memcpy(c.axes, s->axes, sizeof c.axes);
	memcpy(c.shape, s->before.block, sizeof c.shape);
	switch (s->kind) {
	case RS_ALL_REDUCE: return b->all_reduce(b, device, &c, in, out);
	case RS_REDUCE_SCATTER: return b->reduce_scatter(b, device, &c, in, out);
	case RS_ALL_GATHER: return b->all_gather(b, device, &c, in, out);
	case RS_ALL_TO_ALL: return b->all_to_all(b, device, &c, in, out);
	case RS_PERMUTE: return b->permute(b, device, &c, in, out);
	default: return -1;
	}
}

int coll_plan_run(const ReshardPlan *p, Backend *b, int device, DType dt, const void *in, void *out)
{
	int64_t most = coll_layout_numel(&p->from, p->rank);
	for (int i = 0; i < p->nsteps; i++) {
		int64_t n = coll_layout_numel(&p->steps[i].after, p->rank);
		most = n > most ? n : most;
	}
	char *buf[2] = {xmalloc((size_t)most * 4), xmalloc((size_t)most * 4)};
	memcpy(buf[0], in, (size_t)coll_layout_numel(&p->from, p->rank) * 4);
	int cur = 0, rc = 0;
	for (int i = 0; i < p->nsteps && rc == 0; i++) {
		rc = run_step(p, &p->steps[i], b, device, dt, buf[cur], buf[1 - cur]);
		cur = 1 - cur;
	}
	if (rc == 0) /* zero the padding, whatever the collectives left there */
		local_copy(p, p->mesh_to, device, &p->to, &p->to, buf[cur], out);
	free(buf[0]);
	free(buf[1]);
	return rc;
}
