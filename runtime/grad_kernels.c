/* grad_kernels.c: reference kernels of the ops training adds — greater, the losses, take_grad and the conv2d gradients.
 *
 * Same conventions as kernels.c: 4-byte elements, row-major, results rounded
 * to their dtype by kern_call.  Sums run in double where a whole tensor is
 * reduced (the losses) and in f32 elsewhere, in a fixed order. */
#include "exec.h"
#include "../spmd/ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

void kern_index_format(const Shape *s, int64_t i, char *buf, size_t n)
{
	Shape idx = {.rank = s->rank};
	for (int d = s->rank - 1; d >= 0; d--) {
		idx.dim[d] = i % s->dim[d];
		i /= s->dim[d];
	}
	shape_format(&idx, buf, n);
}

/* ---- greater ---- */

/* Strides of s broadcast (right-aligned) into out: 0 on size-1 or missing dims. */
static void bcast_strides(const Shape *s, const Shape *out, int64_t *st)
{
	int64_t k = 1, own[MAX_RANK];
	for (int d = s->rank - 1; d >= 0; d--)
		own[d] = k, k *= s->dim[d];
	for (int d = 0; d < out->rank; d++) {
		int e = d - (out->rank - s->rank);
		st[d] = e < 0 || s->dim[e] == 1 ? 0 : own[e];
	}
}

/* A scalar of another dtype (a constant) compares as rounded to the result's. */
static float scalar_as(const Tensor *t, DType dt)
{
	float x = tensor_f32(t)[0];
	return dt == DT_BF16 ? round_bf16(x) : dt == DT_F16 ? round_f16(x) : x;
}

/* out = a > b ? 1 : 0 with numpy broadcasting (NaN compares false). */
int kern_greater(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Shape *os = &out->shape;
	int64_t sa[MAX_RANK], sb[MAX_RANK], idx[MAX_RANK] = {0}, oa = 0, ob = 0, n = shape_numel(os);
	bcast_strides(&in[0]->shape, os, sa);
	bcast_strides(&in[1]->shape, os, sb);
	float ca = scalar_as(in[0], out->dtype), cb = scalar_as(in[1], out->dtype);
	bool scal_a = in[0]->dtype != out->dtype, scal_b = in[1]->dtype != out->dtype;
	const float *a = tensor_f32(in[0]), *b = tensor_f32(in[1]);
	for (int64_t i = 0; i < n; i++) {
		float x = scal_a ? ca : a[oa], y = scal_b ? cb : b[ob];
		tensor_f32(out)[i] = x > y ? 1.0f : 0.0f;
		for (int d = os->rank - 1; d >= 0; d--) {
			oa += sa[d], ob += sb[d];
			if (++idx[d] < os->dim[d])
				break;
			oa -= sa[d] * os->dim[d], ob -= sb[d] * os->dim[d];
			idx[d] = 0;
		}
	}
	return 0;
}

/* ---- losses ---- */

/* The count a loss is averaged over: the attribute (the global count, set
 * when the op was made) or, when it is 0, the local one. */
static double loss_count(const Op *op, int64_t local)
{
	return op->attr->value > 0 ? op->attr->value : (double)local;
}

/* The valid extent of each dim of the labels' shard: all of it, or, in a
 * partitioned loss (attr reduce 1: spec and global are the labels'
 * sharding and global shape), what lies before the global end. */
static void padding_limits(KernCtx *kc, const Op *op, const Shape *ls, int64_t *lim)
{
	int64_t index[MAX_RANK] = {0};
	bool split = op->attr->reduce == 1 && kc->mesh && op->attr->spec.rank == ls->rank;
	if (split)
		spec_shard_index(&op->attr->spec, kc->mesh, kc->device, index);
	for (int d = 0; d < ls->rank; d++) {
		int64_t e = split ? op->attr->global.dim[d] - index[d] * ls->dim[d] : ls->dim[d];
		lim[d] = e < 0 ? 0 : e > ls->dim[d] ? ls->dim[d] : e;
	}
}

/* The positions of softmax_cross_entropy and its gradient (classes last):
 * with grad NULL, *total += logsumexp(logits) - logits[label] over them;
 * else each row of grad = (softmax(logits) - one_hot(label)) * scale (the
 * padded positions of a partitioned op skipped, their rows zeros).  0, or
 * -1 with kc->err set: a label outside [0, classes). */
static int xent_rows(KernCtx *kc, const Op *op, const Tensor *const *in, double scale, float *grad, double *total)
{
	const Shape *s = &in[0]->shape, *ls = &in[1]->shape;
	int64_t c = s->dim[s->rank - 1], npos = shape_numel(ls);
	const float *x = tensor_f32(in[0]);
	int64_t lim[MAX_RANK], idx[MAX_RANK] = {0};
	padding_limits(kc, op, ls, lim);
	for (int64_t p = 0; p < npos; p++, x += c) {
		float *y = grad ? grad + p * c : NULL;
		int32_t label = tensor_i32(in[1])[p];
		bool pad = false;
		for (int d = 0; d < ls->rank; d++)
			pad |= idx[d] >= lim[d];
		for (int d = ls->rank - 1; d >= 0 && ++idx[d] == ls->dim[d]; d--)
			idx[d] = 0;
		if (pad) { /* a padded position of a partitioned loss */
			if (y)
				memset(y, 0, sizeof *y * (size_t)c);
			continue;
		}
		if (label < 0 || label >= c) {
			char at[128];
			kern_index_format(ls, p, at, sizeof at);
			kern_fail(kc, "%s: expected a label in [0, %lld), found %d at index %s", op_table[op->kind].name,
			          (long long)c, label, at);
			return -1;
		}
		double m = -INFINITY, sum = 0;
		for (int64_t k = 0; k < c; k++)
			m = x[k] > m ? x[k] : m;
		for (int64_t k = 0; k < c; k++)
			sum += exp(x[k] - m);
		if (!y)
			*total += m + log(sum) - x[label];
		for (int64_t k = 0; y && k < c; k++)
			y[k] = (float)((exp(x[k] - m) / sum - (k == label)) * scale);
	}
	return 0;
}

/* mean over positions of logsumexp(logits) - logits[label]; classes last. */
int kern_softmax_cross_entropy(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	double total = 0;
	if (xent_rows(kc, op, in, 0, NULL, &total) != 0)
		return -1;
	tensor_f32(out)[0] = (float)(total / loss_count(op, shape_numel(&in[1]->shape)));
	return 0;
}

/* (softmax(logits) - one_hot(label)) * g / count per position. */
int kern_softmax_cross_entropy_grad(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	double scale = (double)tensor_f32(in[2])[0] / loss_count(op, shape_numel(&in[1]->shape));
	return xent_rows(kc, op, in, scale, tensor_f32(out), NULL);
}

/* mean of (prediction - target)^2 over all elements. */
int kern_mse(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	int64_t n = shape_numel(&in[0]->shape);
	const float *p = tensor_f32(in[0]), *t = tensor_f32(in[1]);
	double total = 0;
	for (int64_t i = 0; i < n; i++) {
		double e = (double)p[i] - t[i];
		total += e * e;
	}
	tensor_f32(out)[0] = (float)(total / loss_count(op, n));
	return 0;
}

/* ---- take_grad: the rows of g added into the rows the ids name ---- */

int kern_take_grad(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	const Tensor *g = in[0], *ids = in[1];
	int64_t rows = op->attr->depth, n = shape_numel(&ids->shape);
	int64_t row = shape_numel(&out->shape) / rows;
	memset(out->data, 0, (size_t)shape_numel(&out->shape) * 4);
	for (int64_t i = 0; i < n; i++) {
		int32_t id = tensor_i32(ids)[i];
		if (id < 0 || id >= rows) {
			char at[128];
			kern_index_format(&ids->shape, i, at, sizeof at);
			kern_fail(kc, "take_grad: expected an id in [0, %lld), found %d at index %s", (long long)rows, id, at);
			return -1;
		}
		float *dst = tensor_f32(out) + id * row;
		const float *src = tensor_f32(g) + i * row;
		for (int64_t j = 0; j < row; j++)
			dst[j] += src[j];
	}
	return 0;
}

/* ---- conv2d gradients: im2col and col2im around sgemm ---- */

typedef struct {
	int64_t n, h, w, c, kh, kw, o, oh, ow, sh, sw, pt, pl;
} Conv;

static Conv conv_of(const Op *op, const Shape *x, const Shape *k, const Shape *y)
{
	const Attr *at = op->attr;
	return (Conv){x->dim[0], x->dim[1], x->dim[2], x->dim[3], k->dim[0], k->dim[1], k->dim[3], y->dim[1], y->dim[2],
	              at->strides[0] ? at->strides[0] : 1, at->strides[1] ? at->strides[1] : 1,
	              at->pad_mode == CONV_PAD_VALID ? 0 : at->padding[0][0],
	              at->pad_mode == CONV_PAD_VALID ? 0 : at->padding[1][0]};
}

/* Input position (y, x) under output position r and kernel tap (ky, kx);
 * false when it falls in the padding. */
static bool conv_tap(const Conv *cv, int64_t r, int64_t ky, int64_t kx, int64_t *at)
{
	int64_t y = r / cv->ow * cv->sh + ky - cv->pt, x = r % cv->ow * cv->sw + kx - cv->pl;
	*at = (y * cv->w + x) * cv->c;
	return y >= 0 && y < cv->h && x >= 0 && x < cv->w;
}

/* Rows [r0, r0+nr) of the im2col matrix of one image (KH*KW*C columns, HWC order). */
static void im2col(const Conv *cv, const float *img, int64_t r0, int64_t nr, float *cols)
{
	for (int64_t r = 0; r < nr; r++)
		for (int64_t ky = 0; ky < cv->kh; ky++)
			for (int64_t kx = 0; kx < cv->kw; kx++) {
				float *dst = cols + (r * cv->kh * cv->kw + ky * cv->kw + kx) * cv->c;
				int64_t at;
				if (conv_tap(cv, r0 + r, ky, kx, &at))
					memcpy(dst, img + at, (size_t)cv->c * sizeof(float));
				else
					memset(dst, 0, (size_t)cv->c * sizeof(float));
			}
}

/* The transpose of im2col: add the rows back into the image. */
static void col2im(const Conv *cv, const float *cols, int64_t r0, int64_t nr, float *img)
{
	for (int64_t r = 0; r < nr; r++)
		for (int64_t ky = 0; ky < cv->kh; ky++)
			for (int64_t kx = 0; kx < cv->kw; kx++) {
				const float *src = cols + (r * cv->kh * cv->kw + ky * cv->kw + kx) * cv->c;
				int64_t at;
				if (conv_tap(cv, r0 + r, ky, kx, &at))
					for (int64_t c = 0; c < cv->c; c++)
						img[at + c] += src[c];
			}
}

/* Rows of im2col per block: about 16 MB of scratch. */
static int64_t conv_chunk(const Conv *cv)
{
	int64_t kcols = cv->kh * cv->kw * cv->c, npos = cv->oh * cv->ow;
	int64_t chunk = ((int64_t)1 << 22) / (kcols ? kcols : 1);
	return chunk < 1 ? 1 : chunk > npos ? npos : chunk;
}

/* dx = col2im(dy @ W^T): in = [dy, kernel], out the input's shape. */
int kern_conv2d_grad_input(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	Conv cv = conv_of(op, &out->shape, &in[1]->shape, &in[0]->shape);
	int64_t kcols = cv.kh * cv.kw * cv.c, npos = cv.oh * cv.ow, chunk = conv_chunk(&cv);
	memset(out->data, 0, (size_t)shape_numel(&out->shape) * 4);
	if (kcols > INT32_MAX || cv.o > INT32_MAX || npos == 0)
		return 0;
	float *cols = xmalloc((size_t)(chunk * kcols) * sizeof(float));
	for (int64_t b = 0; b < cv.n; b++) {
		float *img = tensor_f32(out) + b * cv.h * cv.w * cv.c;
		for (int64_t r0 = 0; r0 < npos; r0 += chunk) {
			int64_t nr = npos - r0 < chunk ? npos - r0 : chunk;
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)kcols, (int)cv.o, 1.0f,
			            tensor_f32(in[0]) + (b * npos + r0) * cv.o, (int)cv.o, tensor_f32(in[1]), (int)cv.o, 0.0f,
			            cols, (int)kcols);
			col2im(&cv, cols, r0, nr, img);
		}
	}
	free(cols);
	return 0;
}

/* dW = sum over images of im2col(x)^T @ dy: in = [x, dy], out the kernel's shape. */
int kern_conv2d_grad_filter(KernCtx *kc, const Op *op, const Tensor *const *in, Tensor *out)
{
	Conv cv = conv_of(op, &in[0]->shape, &out->shape, &in[1]->shape);
	int64_t kcols = cv.kh * cv.kw * cv.c, npos = cv.oh * cv.ow, chunk = conv_chunk(&cv);
	memset(out->data, 0, (size_t)shape_numel(&out->shape) * 4);
	if (kcols > INT32_MAX || cv.o > INT32_MAX || npos == 0)
		return 0;
	float *cols = xmalloc((size_t)(chunk * kcols) * sizeof(float));
	for (int64_t b = 0; b < cv.n; b++) {
		const float *img = tensor_f32(in[0]) + b * cv.h * cv.w * cv.c;
		for (int64_t r0 = 0; r0 < npos; r0 += chunk) {
			int64_t nr = npos - r0 < chunk ? npos - r0 : chunk;
			im2col(&cv, img, r0, nr, cols);
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kcols, (int)cv.o, (int)nr, 1.0f, cols,
			            (int)kcols, tensor_f32(in[1]) + (b * npos + r0) * cv.o, (int)cv.o, 1.0f, tensor_f32(out),
			            (int)cv.o);
		}
	}
	free(cols);
	return 0;
}
