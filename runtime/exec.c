/* exec.c: the reference executor: leaves from deterministic data, then every op's kernel in order. */
#include "exec.h"

#include <math.h>

#include "data.h"
#include "spmd_run.h"
#include "../spmd/ops.h"

#include <string.h>

bool *exec_used_on(const Graph *g, int c)
{
	if (c < 0)
		return NULL;
	bool *used = xcalloc((size_t)g->values.n + 1, sizeof *used);
	for (int i = 0; i < g->ops.n; i++)
		if (op_runs_on(g, &g->ops.a[i], c))
			for (int k = 0; k < g->ops.a[i].nin; k++)
				used[g->ops.a[i].in[k]] = true;
	return used;
}

/* Make the leaf values (no producer) that the caller did not supply and
 * this device reads (used: NULL, every one). */
static void exec_leaves(const Graph *g, Tensor *vals, uint64_t seed, const bool *used)
{
	for (int i = 0; i < g->values.n; i++) {
		const Value *v = &g->values.a[i];
		if (v->producer >= 0 || vals[i].data || (used && !used[i]))
			continue;
		tensor_alloc(&vals[i], v->dtype, &v->shape);
		int64_t range = v->dtype == DT_I32 && v->kind != VK_CONST ? data_id_range(g, i) : 1000;
		data_fill(&vals[i], v, &v->shape, NULL, seed, range);
	}
}

/* last[v]: the index of the last op reading v that the device at stage
 * coordinate c runs, or -1. */
static int *exec_last_uses(const Graph *g, int c)
{
	int *last = xmalloc(sizeof(int) * (size_t)(g->values.n + 1));
	for (int i = 0; i < g->values.n; i++)
		last[i] = -1;
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin && op_runs_on(g, &g->ops.a[i], c); k++)
			last[g->ops.a[i].in[k]] = i;
	return last;
}

/* The values that must survive the run: keep, or else the graph's outputs
 * (*owned is then the array made here, to free). */
static const bool *exec_keep(const Graph *g, const bool *keep, bool **owned)
{
	*owned = NULL;
	if (keep)
		return keep;
	*owned = xcalloc((size_t)g->values.n + 1, sizeof **owned);
	for (int i = 0; i < g->outputs.n; i++)
		(*owned)[g->outputs.a[i]] = true;
	return *owned;
}

/* When profiling: now, noted as op i's start when asked. */
static double exec_clock(const ExecOpts *o, int i)
{
	if (!o->profile)
		return 0;
	double t = now_seconds();
	if (o->op_start)
		o->op_start[i] = t;
	return t;
}

/* Run collective op i through the backend. */
static int exec_collective(const Graph *g, int i, Tensor *vals, const ExecOpts *o, Diag *d)
{
	const Op *op = &g->ops.a[i];
	const Value *out = &g->values.a[op->out];
	tensor_free(&vals[op->out]);
	tensor_alloc(&vals[op->out], out->dtype, &out->shape);
	double t0 = exec_clock(o, i);
	const Tensor *in = &vals[op->in[0]];
	Tensor none = {0}; /* a send's receiver (a pipeline's stage) does not hold what it receives */
	if (!in->data) {
		const Value *x = &g->values.a[op->in[0]];
		tensor_alloc(&none, x->dtype, &x->shape);
		in = &none;
	}
	int rc = spmd_collective(o->backend, o->device, op, in, &vals[op->out]);
	tensor_free(&none);
	if (o->profile && o->op_seconds)
		o->op_seconds[i] = now_seconds() - t0;
	if (rc != 0)
		diag_error(d, op->pos, "device %d: %s aborted (another device failed)", o->device, op_table[op->kind].name);
	return rc;
}

/* Multiply every element of op i's float result t by 1 + delta, delta
 * uniform in +-o->jitter units of roundoff of t's dtype, and add eps,
 * uniform in +-o->jitter_abs units of roundoff of t's largest finite
 * magnitude (hashes of the seed, op and element), then round t to its
 * dtype.  The added part is the rounding of an op that cancels (x - max -
 * log sum in a log_softmax): a result exact in the reference's wider
 * arithmetic, such as -1e-16 beside values near 30, is a float
 * implementation's 0 or -1e-7, and a sqrt after it NaN or not.
 *
 * Where an op cancels, its rounding is of the size of its operands, not
 * of its result:
 * - a reduce_sum or reduce_mean whose terms cancel (a sum of standardized
 *   values, 0 in real numbers) comes out exactly 0 in the reference and
 *   1e-8 in a reordered sum, or the other way round: the added part is at
 *   the scale of the operand's largest magnitude when that is larger;
 * - a log_softmax's x - max is rounded at the scale of x;
 * - a layer_norm's x - mean is rounded at the scale of x and then divided
 *   by the slab's sqrt(var + eps): two rows of [1.001, 0.999] standardize
 *   to +-0.3 exactly in the reference's double arithmetic and to
 *   magnitudes an f32 unit of 1 apart, 6e-5 of the result, in a split
 *   one.  Its added part is per slab, the slab's largest |x| over that.
 * Exactly cancelling is one of rounding's outcomes too (the sqrt of the
 * negated square of 0 is -0, of anything else NaN): the runs of odd seed
 * add no noise but make 0 every element of a sum's result within its
 * scale of 0.
 *
 * A sum of products (sums_terms) gets +-o->jitter units of roundoff of
 * the sum of its terms' magnitudes added, per element: a reordered sum
 * rounds partial sums of the size of its terms, and where they cancel
 * (a weight's gradient summed over tokens) that is far more than a unit
 * of the result.
 *
 * A log_softmax always gets +-o->jitter units of roundoff added too: its
 * log of a sum whose largest term is 1 is off by about one unit in a
 * float implementation whatever the result's size (1 + 9e-8 is 1 in f32,
 * so a largest element that the reference makes -9e-8 is a device's 0),
 * which no relative perturbation of the result or of its operand (the
 * largest element minus the max is 0 either way) reproduces. */
static double max_abs(const Tensor *t)
{
	double top = 0;
	const float *x = tensor_f32(t);
	for (int64_t k = 0, n = shape_numel(&t->shape); k < n; k++)
		if (isfinite(x[k]) && fabs((double)x[k]) > top)
			top = fabs((double)x[k]);
	return top;
}

/* Per slab of a layer_norm along axis over x ([outer, n, inner], slab o *
 * inner + i): the largest |x| over sqrt(var + eps) (malloc'd). */
static double *norm_scales(const Tensor *x, int axis, double eps, int64_t *inner_out, int64_t *n_out)
{
	int64_t outer, n, inner;
	kern_axis_split(&x->shape, axis, &outer, &n, &inner);
	double *sc = xmalloc(sizeof(double) * (size_t)(outer * inner + 1));
	const float *v = tensor_f32(x);
	for (int64_t o = 0; o < outer; o++)
		for (int64_t i = 0; i < inner; i++) {
			double sum = 0, sq = 0, top = 0;
			for (int64_t k = 0; k < n; k++)
				sum += v[(o * n + k) * inner + i];
			double mean = sum / (double)(n ? n : 1);
			for (int64_t k = 0; k < n; k++) {
				double a = v[(o * n + k) * inner + i];
				sq += (a - mean) * (a - mean), top = fmax(top, fabs(a));
			}
			double s = top / sqrt(sq / (double)(n ? n : 1) + eps);
			sc[o * inner + i] = isfinite(s) ? s : 0;
		}
	*inner_out = inner, *n_out = n;
	return sc;
}

/* Whether op's result is a sum of products of its float operands (each
 * term's magnitude the product of theirs): its rounding, reordered, is of
 * the size of the sum of its terms' magnitudes, not of the result's. */
static bool sums_terms(OpKind k)
{
	return k == OP_EINSUM || k == OP_REDUCE_SUM || k == OP_REDUCE_MEAN || k == OP_CONV2D ||
	       k == OP_CONV2D_GRAD_INPUT || k == OP_CONV2D_GRAD_FILTER || k == OP_TAKE_GRAD;
}

/* Op i of a sum-of-products kind run on the magnitudes of its float
 * operands into *mag: per element of the result, the sum of its terms'
 * magnitudes.  False when the kernel fails (then *mag is left empty). */
static bool term_magnitudes(const KernCtx *kc, const Op *op, const Tensor *const *in, const Tensor *out, Tensor *mag)
{
	Tensor absv[8];
	const Tensor *a[8];
	if (op->nin > 8)
		return false;
	for (int k = 0; k < op->nin; k++) {
		a[k] = in[k];
		if (in[k]->dtype == DT_I32)
			continue;
		tensor_alloc(&absv[k], in[k]->dtype, &in[k]->shape);
		const float *x = tensor_f32(in[k]);
		float *y = tensor_f32(&absv[k]);
		for (int64_t e = 0, n = shape_numel(&in[k]->shape); e < n; e++)
			y[e] = fabsf(x[e]);
		a[k] = &absv[k];
	}
	tensor_alloc(mag, out->dtype, &out->shape);
	KernCtx c = *kc;
	bool ok = kern_call(&c, op, a, mag) == 0;
	for (int k = 0; k < op->nin; k++)
		if (in[k]->dtype != DT_I32)
			tensor_free(&absv[k]);
	if (!ok)
		tensor_free(mag);
	return ok;
}

static void exec_jitter(const ExecOpts *o, int i, const Op *op, const Tensor *const *in, const KernCtx *kc, Tensor *t)
{
	if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
		return;
	double unit = t->dtype == DT_BF16 ? 0x1p-8 : t->dtype == DT_F16 ? 0x1p-11 : 0x1p-24, size = o->jitter * unit;
	int64_t n = shape_numel(&t->shape), inner = 1, len = 1;
	float *x = tensor_f32(t);
	bool sum = op->kind == OP_REDUCE_SUM || op->kind == OP_REDUCE_MEAN, abs = o->jitter_abs > 0;
	double in_top = abs && (sum || op->kind == OP_LOG_SOFTMAX) && in[0]->dtype != DT_I32 ? max_abs(in[0]) : 0;
	double add = abs ? o->jitter_abs * unit * fmax(max_abs(t), in_top) : 0;
	if (op->kind == OP_LOG_SOFTMAX)
		add = fmax(add, o->jitter * unit);
	uint64_t key = data_mix64(o->jitter_seed ^ data_mix64((uint64_t)i + 1));
	if (abs && (o->jitter_seed & 1)) { /* the flushing runs */
		for (int64_t k = 0; k < n && sum && in_top > 0; k++)
			if (fabs((double)x[k]) <= o->jitter_abs * unit * in_top)
				x[k] = 0;
		return;
	}
	double *slab = abs && op->kind == OP_LAYER_NORM ? norm_scales(in[0], op->attr->axes[0], op->attr->eps, &inner, &len)
	                                                : NULL;
	Tensor mag = {0};
	const float *m = sums_terms(op->kind) && term_magnitudes(kc, op, in, t, &mag) ? tensor_f32(&mag) : NULL;
	for (int64_t k = 0; k < n; k++) {
		uint64_t h = data_mix64(key ^ (uint64_t)k);
		double r = (double)(h >> 11) * 0x1p-53, q = (double)(data_mix64(h) >> 11) * 0x1p-53; /* [0, 1) */
		double a = slab ? fmax(add, o->jitter_abs * unit * slab[k / (len * inner) * inner + k % inner]) : add;
		if (m && isfinite(m[k]))
			a = fmax(a, size * m[k]);
		x[k] = (float)(x[k] * (1 + size * (2 * r - 1)) + a * (2 * q - 1));
	}
	free(slab);
	if (m)
		tensor_free(&mag);
	tensor_round(t);
}

/* Run op i: allocate its result, call the kernel, round.  0 or -1 (reported). */
static int exec_op(const Graph *g, int i, Tensor *vals, const ExecOpts *o, Diag *d)
{
	const Op *op = &g->ops.a[i];
	const OpInfo *info = &op_table[op->kind];
	const Value *out = &g->values.a[op->out];
	if (!op_kernels[op->kind] && o && o->backend)
		return exec_collective(g, i, vals, o, d);
	if (!op_kernels[op->kind]) {
		diag_error(d, op->pos, "expected an op the reference executor can run, found collective '%s' "
		           "(collectives need a multi-device backend)", info->name);
		return -1;
	}
	const Tensor *small[8], **in = op->nin <= 8 ? small : xmalloc(sizeof *in * (size_t)op->nin);
	for (int k = 0; k < op->nin; k++)
		in[k] = &vals[op->in[k]];
	tensor_free(&vals[op->out]);
	tensor_alloc(&vals[op->out], out->dtype, &out->shape);
	KernCtx kc = {.mesh = &g->mesh, .device = o ? o->device : 0};
	double t0 = o ? exec_clock(o, i) : 0;
	int rc = kern_call(&kc, op, in, &vals[op->out]);
	if (o && o->profile && o->op_seconds)
		o->op_seconds[i] = now_seconds() - t0;
	if (rc != 0)
		diag_error(d, op->pos, "%s", kc.err[0] ? kc.err : "kernel failed");
	else if (o && o->jitter > 0)
		exec_jitter(o, i, op, in, &kc, &vals[op->out]);
	if (in != small)
		free(in);
	return rc;
}

/* Bytes of value v as the model declares its dtype. */
static int64_t value_bytes(const Graph *g, int v)
{
	const Value *val = &g->values.a[v];
	return shape_numel(&val->shape) * dtype_size(val->dtype);
}

static void stats_leaves(const Graph *g, const Tensor *vals, ExecStats *st)
{
	st->leaves = 0;
	for (int v = 0; v < g->values.n; v++)
		if (g->values.a[v].producer < 0 && vals[v].data)
			st->leaves += value_bytes(g, v);
	st->peak = st->leaves;
	st->peak_op = -1;
}

int exec_run(const Graph *g, Tensor *vals, const bool *keep, const ExecOpts *o, Diag *d)
{
	/* a pipelined program: this device runs the ops of its stages only */
	int c = o && o->backend ? graph_stage_coord(g, o->device) : -1;
	bool *used = exec_used_on(g, c);
	exec_leaves(g, vals, o ? o->seed : 0, used);
	free(used);
	int *last = exec_last_uses(g, c);
	bool *owned;
	const bool *kept = exec_keep(g, keep, &owned);
	int rc = 0;
	ExecStats *st = o ? o->stats : NULL;
	if (st)
		stats_leaves(g, vals, st);
	int64_t held = st ? st->leaves : 0;
	for (int i = 0; i < g->ops.n && rc == 0; i++) {
		const Op *op = &g->ops.a[i];
		if (!op_runs_on(g, op, c))
			continue;
		rc = exec_op(g, i, vals, o, d);
		held += value_bytes(g, op->out);
		if (st && held > st->peak)
			st->peak = held, st->peak_op = i;
		for (int k = 0; k <= op->nin && rc == 0; k++) {
			int v = k < op->nin ? op->in[k] : op->out;
			if (last[v] <= i && g->values.a[v].producer >= 0 && !kept[v] && vals[v].data) {
				tensor_free(&vals[v]);
				held -= value_bytes(g, v);
			}
		}
	}
	free(last);
	free(owned);
	return rc;
}

void exec_free_values(const Graph *g, Tensor *vals)
{
	for (int i = 0; i < g->values.n; i++)
		tensor_free(&vals[i]);
}
