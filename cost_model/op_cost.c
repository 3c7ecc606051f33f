/* op_cost.c: the work of one local op (FLOPs, transcendentals, bytes), its roofline time, and elementwise fusion. */
#include "cost.h"

#include "../spmd/ops.h"

static double numel(const Graph *g, int v) { return (double)shape_numel(&g->values.a[v].shape); }
static double bytes_of(const Graph *g, int v) { return numel(g, v) * dtype_size(g->values.a[v].dtype); }

/* Elements of the innermost dim (the rows of softmax and friends are the rest). */
static double rows_of(const Graph *g, const Op *op)
{
	const Shape *s = &g->values.a[op->in[0]].shape;
	int axis = op->attr->axes[0];
	if (axis < 0)
		axis += s->rank;
	double n = numel(g, op->in[0]);
	return s->rank && axis >= 0 && axis < s->rank && s->dim[axis] ? n / (double)s->dim[axis] : n;
}

/* einsum: 2 * (product of every letter's size) with two operands, the
 * product with one (shape.c's rule, on local shapes). */
static double einsum_flops(const Graph *g, const Op *op)
{
	const Attr *a = op->attr;
	double size[128] = {0}, f = 1;
	for (int i = 0; i < op->nin && i < 2; i++)
		for (int k = 0; k < a->nlet[i]; k++)
			size[(unsigned char)a->let[i][k] & 127] = (double)g->values.a[op->in[i]].shape.dim[k];
	for (int c = 0; c < 128; c++)
		f *= size[c] ? size[c] : 1;
	return op->nin == 2 ? 2 * f : f;
}

static double conv_flops(const Graph *g, const Op *op)
{
	const Shape *o = &g->values.a[op->out].shape, *w = &g->values.a[op->in[1]].shape;
	return 2.0 * (double)o->dim[0] * (double)o->dim[1] * (double)o->dim[2] * (double)w->dim[0] * (double)w->dim[1] *
	       (double)w->dim[2] * (double)w->dim[3];
}

/* The executor's im2col work (runtime/kernels.c, runtime/grad_kernels.c):
 * conv2d copies one run of KW*C floats per kernel row of every output
 * position into its im2col matrix; its gradients copy (or add back) C
 * floats per kernel tap.  Its GEMM's width N: conv2d and the filter
 * gradient multiply by a K x C_out matrix, the input gradient by the
 * kernel transposed (C_out x KH*KW*C). */
static void conv_copies(const Graph *g, const Op *op, OpWork *w)
{
	bool input = op->kind == OP_CONV2D_GRAD_INPUT, conv = op->kind == OP_CONV2D;
	const Shape *k = &g->values.a[op->kind == OP_CONV2D_GRAD_FILTER ? op->out : op->in[1]].shape;
	const Shape *y = &g->values.a[conv ? op->out : op->in[input ? 0 : 1]].shape;
	if (k->rank != 4 || y->rank != 4)
		return;
	double rows = (double)y->dim[0] * (double)y->dim[1] * (double)y->dim[2];
	w->copies = rows * (double)k->dim[0] * (conv ? 1 : (double)k->dim[1]);
	w->width = input ? (double)k->dim[0] * (double)k->dim[1] * (double)k->dim[2] : (double)k->dim[3];
}

/* conv2d's gradients: as many multiply-adds as the conv2d itself,
 * 2 * (dy's elements) * KH * KW * C_in, the kernel being operand 1 of
 * conv2d_grad_input (dy, w) and the result of conv2d_grad_filter (x, dy). */
static double conv_grad_flops(const Graph *g, const Op *op)
{
	bool input = op->kind == OP_CONV2D_GRAD_INPUT;
	const Shape *w = &g->values.a[input ? op->in[1] : op->out].shape;
	const Shape *dy = &g->values.a[input ? op->in[0] : op->in[1]].shape;
	if (w->rank != 4 || dy->rank != 4)
		return 0;
	return 2.0 * (double)shape_numel(dy) * (double)w->dim[0] * (double)w->dim[1] * (double)w->dim[2];
}

/* Arithmetic and transcendentals of an elementwise unary op on n elements. */
static void unary_work(OpKind k, double n, OpWork *w)
{
	w->flops = n;
	switch (k) {
	case OP_EXP: case OP_LOG: case OP_TANH: case OP_SQRT: case OP_RSQRT: w->trans = n; break;
	case OP_SIGMOID: w->flops = 3 * n, w->trans = n; break;             /* 1 / (1 + exp(-x)) */
	case OP_GELU: w->flops = 8 * n, w->trans = n; break;                /* tanh approximation */
	default: break;
	}
}

/* Bytes read: every operand once (a scalar constant too). */
static double read_bytes(const Graph *g, const Op *op)
{
	double b = 0;
	for (int k = 0; k < op->nin; k++)
		b += bytes_of(g, op->in[k]);
	return b;
}

static void op_flops(const Graph *g, const Op *op, OpWork *w)
{
	double n = numel(g, op->out), nin = op->nin ? numel(g, op->in[0]) : 0;
	unsigned fl = op_table[op->kind].flags;
	if (fl & OPF_UNARY)
		unary_work(op->kind, n, w);
	else if (fl & OPF_BINARY)
		w->flops = n, w->trans = op->kind == OP_POW ? n : 0;
	else if (fl & OPF_REDUCE)
		w->flops = nin;
	switch (op->kind) {
	case OP_EINSUM:
		w->flops = einsum_flops(g, op), w->matrix = op->nin == 2;
		w->layout = w->matrix ? numel(g, op->in[0]) + numel(g, op->in[1]) + n : 0;
		break;
	case OP_CONV2D: w->flops = conv_flops(g, op), w->matrix = true, conv_copies(g, op, w); break;
	case OP_CONV2D_GRAD_INPUT: case OP_CONV2D_GRAD_FILTER:
		w->flops = conv_grad_flops(g, op), w->matrix = true, conv_copies(g, op, w);
		break;
	case OP_SOFTMAX_CROSS_ENTROPY: w->flops = 5 * nin, w->trans = nin; break; /* a log_softmax, a pick, a mean */
	case OP_SOFTMAX_CROSS_ENTROPY_GRAD: w->flops = 6 * nin, w->trans = nin; break; /* a softmax, a subtraction, a scale */
	case OP_MSE: w->flops = 3 * nin; break;
	case OP_SOFTMAX: w->flops = 5 * nin, w->trans = nin; break;
	case OP_LOG_SOFTMAX: w->flops = 5 * nin, w->trans = nin + rows_of(g, op); break;
	case OP_LAYER_NORM: w->flops = 5 * nin, w->trans = rows_of(g, op); break;
	default: break;
	}
}

void cost_op_work(const Graph *g, int i, OpWork *w)
{
	const Op *op = &g->ops.a[i];
	*w = (OpWork){.kind = -1};
	if (op_table[op->kind].flags & OPF_COLLECTIVE)
		return;
	op_flops(g, op, w);
	w->kind = op->kind;
	w->elems = numel(g, op->out);
	if (op->nin && numel(g, op->in[0]) > w->elems)
		w->elems = numel(g, op->in[0]);
	double out = bytes_of(g, op->out);
	switch (op->kind) {
	case OP_TAKE: case OP_TAKE_SHARD: /* the ids, and the rows taken */
		w->bytes = bytes_of(g, op->in[1]) + 2 * out;
		break;
	case OP_SLICE: case OP_SHARD_SLICE: case OP_SHARD_ROLL: /* the part kept; a roll keeps it all, turned */
		w->bytes = 2 * out;
		break;
	default:
		w->bytes = read_bytes(g, op) + out;
	}
}

double cost_compute_seconds(const HwProfile *hw, DType dt, const OpWork *w)
{
	if (w->kind >= 0 && w->kind < OP_COUNT && hw->op_rate[w->kind] > 0)
		return w->elems / hw->op_rate[w->kind];
	double peak = w->matrix ? hw->flops[dt] : hw->vector_flops;
	if (w->width > 0 && hw->matrix_half_width > 0) /* a narrow GEMM (Hockney's n-half) */
		peak *= w->width / (w->width + hw->matrix_half_width);
	return w->flops / peak + w->trans / hw->transcendentals + w->copies * hw->im2col_copy +
	       w->layout * hw->matrix_element;
}

double cost_kernel_seconds(const HwProfile *hw, double compute, double bytes, bool matrix, int kind)
{
	double memory = bytes / hw->mem_bw;
	double overhead = matrix && hw->matrix_overhead > 0 ? hw->matrix_overhead : hw->kernel_overhead;
	if (kind >= 0 && kind < OP_COUNT && hw->op_overhead[kind] > 0)
		overhead = hw->op_overhead[kind];
	return (compute > memory ? compute : memory) + overhead;
}

double cost_roofline(const HwProfile *hw, DType dt, const OpWork *w, int ndev)
{
	return cost_kernel_seconds(hw, cost_compute_seconds(hw, dt, w), w->bytes, w->matrix, w->kind);
}

double cost_dispatch_seconds(const HwProfile *hw, double out_bytes)
{
	double bw = hw->dispatch_bw > 0 ? hw->dispatch_bw : hw->mem_bw;
	return hw->dispatch_overhead > 0 ? hw->dispatch_overhead + out_bytes / bw : 0;
}

/* ---- fusion ---- */

static bool elementwise(OpKind k) { return (op_table[k].flags & (OPF_UNARY | OPF_BINARY)) || k == OP_CAST; }

static int find(int *parent, int i)
{
	while (parent[i] != i)
		i = parent[i] = parent[parent[i]];
	return i;
}

int cost_fusion_groups(const Graph *g, int *group)
{
	int *uses = xcalloc((size_t)g->values.n + 1, sizeof *uses);
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++)
			uses[g->ops.a[i].in[k]]++;
	for (int i = 0; i < g->outputs.n; i++)
		uses[g->outputs.a[i]] += 2; /* an output is written out */
	for (int i = 0; i < g->ops.n; i++)
		group[i] = i;
	for (int j = 0; j < g->ops.n; j++) {
		const Op *op = &g->ops.a[j];
		if (!elementwise(op->kind))
			continue;
		for (int k = 0; k < op->nin; k++) {
			int v = op->in[k], p = g->values.a[v].producer;
			if (p < 0 || uses[v] != 1 || !elementwise(g->ops.a[p].kind) || numel(g, v) != numel(g, op->out))
				continue;
			int a = find(group, p), b = find(group, j);
			group[a > b ? a : b] = a < b ? a : b;
		}
	}
	int n = 0;
	for (int i = 0; i < g->ops.n; i++)
		n += (group[i] = find(group, i)) == i;
	free(uses);
	return n;
}
