/* device_kernels.c: kernels of the ops whose result depends on the device's mesh coordinates. */
#include <math.h>
#include <string.h>

#include "kernels.h"

/* The block index of `device` along dim d of a spec (spec_shard_index). */
static int64_t block_index(const Mesh *m, int device, const Spec *s, int d)
{
	int64_t index[MAX_RANK];
	spec_shard_index(s, m, device, index);
	return index[d];
}

/* Copy the box ext[] at src_off in a buffer of shape ss to dst_off in one of
 * shape ds (4-byte elements).  Recursive over dims; the last is a memcpy. */
static void copy_box(int rank, const int64_t *ext, const char *src, const int64_t *ss, const int64_t *so, char *dst,
                     const int64_t *ds, const int64_t *dof, int d, int64_t sb, int64_t db)
{
	int64_t sbase = sb * ss[d] + so[d], dbase = db * ds[d] + dof[d];
	if (d == rank - 1) {
		memcpy(dst + 4 * dbase, src + 4 * sbase, 4 * (size_t)ext[d]);
		return;
	}
	for (int64_t i = 0; i < ext[d]; i++)
		copy_box(rank, ext, src, ss, so, dst, ds, dof, d + 1, sbase + i, dbase + i);
}

/* out = this device's block under spec (blocks of out's shape), taken from
 * its block under spec_from (blocks of in's shape); zero past the global end.
 * The partitioner only emits re-blockings whose data the device holds. */
int kern_shard_slice(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Attr *at = op->attr;
	const Shape *is = &in[0]->shape, *os = &out->shape;
	int64_t ext[MAX_RANK], so[MAX_RANK], zero[MAX_RANK] = {0};
	bool empty = false;
	memset(out->data, 0, 4 * (size_t)shape_numel(os));
	if (os->rank == 0) {
		memcpy(out->data, in[0]->data, 4);
		return 0;
	}
	for (int d = 0; d < os->rank; d++) {
		int64_t lo = block_index(kc->mesh, kc->device, &at->spec, d) * os->dim[d];
		int64_t from = block_index(kc->mesh, kc->device, &at->spec_from, d) * is->dim[d];
		int64_t e = at->global.dim[d] - lo;
		ext[d] = e < 0 ? 0 : e > os->dim[d] ? os->dim[d] : e;
		so[d] = lo - from;
		empty |= ext[d] == 0;
		if (ext[d] > 0 && (so[d] < 0 || so[d] + ext[d] > is->dim[d])) {
			snprintf(kc->err, sizeof kc->err, "shard_slice: device %d does not hold the block it keeps (dim %d)",
			         kc->device, d);
			return -1;
		}
	}
	if (!empty)
		copy_box(os->rank, ext, in[0]->data, is->dim, so, out->data, os->dim, zero, 0, 0, 0);
	return 0;
}

/* out = numpy.roll(in, R, axis=dim), R = op_roll_elems for this device:
 * per slab of the dims before `dim`, the rows [0, S - R) of the input land
 * at [R, S) and the last R rows at [0, R): two contiguous copies, as the
 * dims after `dim` travel whole with their row. */
int kern_shard_roll(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Shape *s = &in[0]->shape;
	int64_t outer, size, inner, r = op_roll_elems(kc->mesh, op->attr, s, kc->device);
	kern_axis_split(s, op_roll_dim(op->attr, s), &outer, &size, &inner);
	size_t row = 4 * (size_t)inner, head = row * (size_t)(size - r), tail = row * (size_t)r;
	for (int64_t o = 0; o < outer; o++) {
		const char *x = (const char *)in[0]->data + (size_t)o * (head + tail);
		char *y = (char *)out->data + (size_t)o * (head + tail);
		memcpy(y + tail, x, head);
		memcpy(y, x + head, tail);
	}
	return 0;
}

/* An int32 fill for a double one, saturating: the partitioner masks with -inf
 * before a max, which an int tensor cannot hold (a plain cast is undefined). */
static int32_t fill_i32(double v)
{
	if (v != v)
		return 0;
	if (v <= (double)INT32_MIN)
		return INT32_MIN;
	if (v >= (double)INT32_MAX)
		return INT32_MAX;
	return (int32_t)v;
}

int kern_mask(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Shape *ls = &out->shape, *gs = &op->attr->global;
	int64_t lim[MAX_RANK]; /* valid local extent per dim */
	for (int d = 0; d < ls->rank; d++) {
		int64_t off = block_index(kc->mesh, kc->device, &op->attr->spec, d) * ls->dim[d];
		lim[d] = gs->dim[d] - off;
		lim[d] = lim[d] < 0 ? 0 : lim[d] > ls->dim[d] ? ls->dim[d] : lim[d];
	}
	int64_t n = shape_numel(ls);
	memcpy(out->data, in[0]->data, 4 * (size_t)n);
	float fill = (float)op->attr->value;
	int32_t ifill = fill_i32(op->attr->value);
	bool ints = out->dtype == DT_I32;
	int64_t idx[MAX_RANK] = {0};
	for (int64_t i = 0; i < n; i++) {
		bool pad = false;
		for (int d = 0; d < ls->rank; d++)
			pad |= idx[d] >= lim[d];
		if (pad && ints)
			((int32_t *)out->data)[i] = ifill;
		else if (pad)
			((float *)out->data)[i] = fill;
		for (int d = ls->rank - 1; d >= 0 && ++idx[d] == ls->dim[d]; d--)
			idx[d] = 0;
	}
	return 0;
}

/* The first row this device holds of a table or result whose rows are
 * split by op's sharding, in blocks of `rows`. */
static int64_t shard_row_offset(const KernCtx *kc, const Op *op, int64_t rows)
{
	return block_index(kc->mesh, kc->device, &op->attr->spec, 0) * rows;
}

/* Is id i one of the global table's rows [0, total)?  If not, kc->err says so. */
static bool id_ok(KernCtx *kc, const char *what, int32_t id, int64_t total, int64_t i)
{
	if (id >= 0 && id < total)
		return true;
	snprintf(kc->err, sizeof kc->err, "%s: expected an id in [0, %lld), found %d at flat index %lld", what,
	         (long long)total, id, (long long)i);
	return false;
}

int kern_take_shard(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Tensor *tab = in[0], *ids = in[1];
	int64_t rows = tab->shape.dim[0], total = op->attr->global.dim[0], off = shard_row_offset(kc, op, rows);
	int64_t row = rows ? shape_numel(&tab->shape) / rows : 0, n = shape_numel(&ids->shape);
	memset(out->data, 0, 4 * (size_t)shape_numel(&out->shape));
	for (int64_t i = 0; i < n; i++) {
		int32_t id = ((const int32_t *)ids->data)[i];
		if (!id_ok(kc, "take", id, total, i))
			return -1;
		if (id >= off && id < off + rows)
			memcpy((char *)out->data + 4 * i * row, (const char *)tab->data + 4 * (id - off) * row, 4 * (size_t)row);
	}
	return 0;
}

int kern_take_grad_shard(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Tensor *g = in[0], *ids = in[1];
	int64_t rows = op->attr->depth, total = op->attr->global.dim[0], off = shard_row_offset(kc, op, rows);
	int64_t row = rows ? shape_numel(&out->shape) / rows : 0, n = shape_numel(&ids->shape);
	memset(out->data, 0, 4 * (size_t)shape_numel(&out->shape));
	for (int64_t i = 0; i < n; i++) {
		int32_t id = ((const int32_t *)ids->data)[i];
		if (!id_ok(kc, "take_grad", id, total, i))
			return -1;
		if (id < off || id >= off + rows)
			continue;
		float *dst = (float *)out->data + (id - off) * row;
		const float *src = (const float *)g->data + i * row;
		for (int64_t j = 0; j < row; j++)
			dst[j] += src[j];
	}
	return 0;
}

/* This device's block of the classes (the last dim of op's spec and global
 * shape; c of them): its first class, and into *valid how many are real
 * classes (the rest padding), of *total. */
static int64_t class_block(KernCtx *kc, const Op *op, int64_t c, int64_t *valid, int64_t *total)
{
	int last = op->attr->global.rank - 1;
	int64_t lo = block_index(kc->mesh, kc->device, &op->attr->spec, last) * c;
	*total = op->attr->global.dim[last];
	*valid = *total - lo < c ? (*total > lo ? *total - lo : 0) : c;
	return lo;
}

/* Label p of labels, checked against the global classes as the loss's kernel does. */
static int xent_label(KernCtx *kc, const Tensor *labels, int64_t p, int64_t total, int32_t *label)
{
	*label = tensor_i32(labels)[p];
	if (*label >= 0 && *label < total)
		return 0;
	char at[128];
	kern_index_format(&labels->shape, p, at, sizeof at);
	kern_fail(kc, "softmax_cross_entropy: expected a label in [0, %lld), found %d at index %s", (long long)total,
	          *label, at);
	return -1;
}

int kern_one_hot_shard(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	int64_t depth = op->attr->depth, n = shape_numel(&in[0]->shape), valid, total;
	int64_t lo = class_block(kc, op, depth, &valid, &total);
	for (int64_t i = 0; op->attr->value != 0 && i < n; i++) { /* a loss's labels: as the loss's kernel */
		int32_t label;
		if (xent_label(kc, in[0], i, total, &label) != 0)
			return -1;
	}
	/* this device's classes, those past the global ones padding (as one_hot: zeros) */
	kern_one_hot_rows(in[0], lo, valid, depth, out);
	return 0;
}

/* ---- softmax_cross_entropy with its classes split ---- */

/* Per position: the sum of exp(logits - max) over this device's classes, and
 * the label's logit where this device holds it (else 0). */
int kern_xent_stats_shard(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Shape *s = &in[0]->shape;
	int64_t c = s->dim[s->rank - 1], npos = shape_numel(&in[2]->shape), valid, total;
	int64_t lo = class_block(kc, op, c, &valid, &total);
	const float *x = tensor_f32(in[0]), *m = tensor_f32(in[1]);
	float *y = tensor_f32(out);
	for (int64_t p = 0; p < npos; p++, x += c) {
		int32_t label;
		if (xent_label(kc, in[2], p, total, &label) != 0)
			return -1;
		double sum = 0;
		for (int64_t k = 0; k < valid; k++)
			sum += exp((double)x[k] - m[p]);
		y[2 * p] = (float)sum;
		y[2 * p + 1] = label >= lo && label < lo + valid ? x[label - lo] : 0;
	}
	return 0;
}

/* (exp(logits - max) / sum - one_hot(label)) * g / count on this device's
 * classes; padded classes 0. */
int kern_xent_grad_shard(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Shape *s = &in[0]->shape;
	int64_t c = s->dim[s->rank - 1], npos = shape_numel(&in[3]->shape), valid, total;
	int64_t lo = class_block(kc, op, c, &valid, &total);
	double scale = (double)tensor_f32(in[4])[0] / (op->attr->value > 0 ? op->attr->value : (double)npos);
	const float *x = tensor_f32(in[0]), *m = tensor_f32(in[1]), *sum = tensor_f32(in[2]);
	float *y = tensor_f32(out);
	for (int64_t p = 0; p < npos; p++, x += c, y += c) {
		int32_t label;
		if (xent_label(kc, in[3], p, total, &label) != 0)
			return -1;
		for (int64_t k = 0; k < c; k++)
			y[k] = k < valid ? (float)((exp((double)x[k] - m[p]) / sum[p] - (lo + k == label)) * scale) : 0;
	}
	return 0;
}
