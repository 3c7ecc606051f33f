/* estimate.c: the step of a partitioned program — per-op times, serial and overlapped totals, tables, memory. */
#include "cost.h"

#include <stdio.h>
#include <string.h>

#include "../spmd/ops.h"

/* Bytes a device sends over each axis of collective op (ring volumes,
 * decomposed per axis in the op's order, minor axis first). */
static void axis_bytes(const Graph *g, const Op *op, double *out)
{
	const Value *in = &g->values.a[op->in[0]];
	double B = (double)shape_numel(&in->shape) * dtype_size(in->dtype);
	ReshardKind k = op_reshard_kind(op->kind);
	if (k == RS_PERMUTE) {
		out[op->attr->cax[0]] += B;
		return;
	}
	if (k == RS_ALL_GATHER)
		for (int i = 0; i < op->attr->ncax; i++)
			B *= g->mesh.size[op->attr->cax[i]];
	for (int i = op->attr->ncax - 1; i >= 0; i--) {
		int a = op->attr->cax[i];
		double n = g->mesh.size[a];
		switch (k) {
		case RS_ALL_REDUCE: out[a] += 2 * (n - 1) / n * B; break;
		case RS_REDUCE_SCATTER: case RS_ALL_GATHER: case RS_ALL_TO_ALL: out[a] += (n - 1) / n * B; break;
		default: break;
		}
		if (k != RS_ALL_TO_ALL)
			B /= n;
	}
}

static double vbytes(const Graph *g, int v)
{
	return (double)shape_numel(&g->values.a[v].shape) * dtype_size(g->values.a[v].dtype);
}

/* Bytes of every fused group of more than one op (into bytes[leader]): the
 * values its ops read from outside it, once each, and the values it
 * produces that are read outside it, returned, or never read. */
static void group_bytes(const Graph *g, const int *group, const int *size, double *bytes)
{
	int *mark = xcalloc((size_t)g->values.n + 1, sizeof *mark), *ext = xcalloc((size_t)g->values.n + 1, sizeof *ext);
	int *reads = xcalloc((size_t)g->values.n + 1, sizeof *reads);
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++) {
			int v = g->ops.a[i].in[k], p = g->values.a[v].producer;
			reads[v]++;
			ext[v] |= p >= 0 && group[p] != group[i];
		}
	for (int i = 0; i < g->outputs.n; i++)
		ext[g->outputs.a[i]] = 1;
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		int r = group[i];
		if (size[r] < 2)
			continue;
		for (int k = 0; k < op->nin; k++) {
			int v = op->in[k], p = g->values.a[v].producer;
			if ((p < 0 || group[p] != r) && mark[v] != r + 1)
				mark[v] = r + 1, bytes[r] += vbytes(g, v);
		}
		if (ext[op->out] || reads[op->out] == 0)
			bytes[r] += vbytes(g, op->out);
	}
	free(mark), free(ext), free(reads);
}

/* The kernels of g: *group per op its fused group's first op (itself
 * without fusion), *size per first op the ops of its group (both malloc). */
static void fused(const Graph *g, const HwProfile *hw, int **group, int **size)
{
	int n = g->ops.n;
	*group = xmalloc(sizeof(int) * (size_t)(n + 1)), *size = xcalloc((size_t)n + 1, sizeof **size);
	for (int i = 0; i < n; i++)
		(*group)[i] = i;
	if (hw->fusion)
		cost_fusion_groups(g, *group);
	for (int i = 0; i < n; i++)
		(*size)[(*group)[i]]++;
}

/* Split a kernel of `seconds` with compute term c and memory term m: the
 * larger term is what limits it, the rest is its fixed cost. */
static void kernel_limits(double c, double m, double seconds, OpEstimate *o)
{
	double roof = c > m ? c : m;
	roof = roof < seconds ? roof : seconds;
	o->limit_s[c > m ? LIMIT_FLOPS : LIMIT_MEMORY] += roof;
	o->limit_s[LIMIT_LATENCY] += seconds - roof;
}

/* Split collective op i: its steps' latency (its time on no bytes), and the
 * rest on the links of the axis it sends the most bytes over. */
static void collective_limits(const HwProfile *hw, const Graph *g, int i, OpEstimate *o)
{
	const Op *op = &g->ops.a[i];
	double lat = cost_collective_seconds(hw, &g->mesh, op_reshard_kind(op->kind), op->attr->cax, op->attr->ncax, 0,
	                                     op->attr->target, op->attr->shift);
	double by[MESH_MAX_AXES] = {0};
	axis_bytes(g, op, by);
	int top = op->attr->ncax ? op->attr->cax[0] : 0;
	for (int a = 0; a < g->mesh.naxes; a++)
		top = by[a] > by[top] ? a : top;
	lat = lat < o->seconds ? lat : o->seconds;
	o->limit_s[LIMIT_LATENCY] += lat;
	o->limit_s[LIMIT_LINKS + top] += o->seconds - lat;
}

/* Time of every local op: its kernel's roofline (a fused group's on the
 * group's work), shared among the group's ops in proportion to their own
 * rooflines. */
static void kernel_times(const Graph *g, const HwProfile *hw, CostEstimate *e)
{
	int n = g->ops.n, *group, *size;
	fused(g, hw, &group, &size);
	OpWork *w = xcalloc((size_t)n + 1, sizeof *w);
	double *alone = xcalloc((size_t)n + 1, sizeof *alone), *share = xcalloc((size_t)n + 1, sizeof *share);
	double *bytes = xcalloc((size_t)n + 1, sizeof *bytes), *compute = xcalloc((size_t)n + 1, sizeof *compute);
	bool *matrix = xcalloc((size_t)n + 1, sizeof *matrix);
	for (int i = 0; i < n; i++) {
		DType dt = g->values.a[g->ops.a[i].out].dtype;
		cost_op_work(g, i, &w[i]);
		alone[i] = cost_roofline(hw, dt, &w[i], g->mesh.ndev);
		int r = group[i];
		share[r] += alone[i];
		compute[r] += cost_compute_seconds(hw, dt, &w[i]), matrix[r] |= w[i].matrix;
		e->flops += w[i].flops;
	}
	group_bytes(g, group, size, bytes);
	for (int i = 0; i < n; i++) {
		const Op *op = &g->ops.a[i];
		OpEstimate *o = &e->op[i];
		int r = group[i];
		o->comm = op_table[op->kind].flags & OPF_COLLECTIVE;
		e->nkernels += r == i && !o->comm && !(hw->fusion && op->kind == OP_RESHAPE);
		if (o->comm) {
			o->seconds = cost_collective_op(hw, g, i);
			axis_bytes(g, op, e->axis_bytes);
			collective_limits(hw, g, i, o);
		} else if (hw->fusion && op->kind == OP_RESHAPE) {
			o->seconds = 0; /* a compiler's reshape is a bitcast */
		} else if (size[r] < 2) {
			o->seconds = alone[i];
			DType dt = g->values.a[op->out].dtype;
			kernel_limits(cost_compute_seconds(hw, dt, &w[i]), w[i].bytes / hw->mem_bw, o->seconds, o);
		} else {
			double k = cost_kernel_seconds(hw, compute[r], bytes[r], matrix[r], -1);
			o->seconds = k * alone[i] / share[r];
			kernel_limits(compute[r] * alone[i] / share[r], bytes[r] / hw->mem_bw * alone[i] / share[r], o->seconds, o);
		}
		double disp = cost_dispatch_seconds(hw, vbytes(g, op->out));
		o->seconds += disp, e->dispatch_s += disp, o->limit_s[LIMIT_LATENCY] += disp;
	}
	free(group), free(size), free(w), free(alone), free(share), free(bytes), free(compute), free(matrix);
}

double cost_compute_bound(const Graph *g, const HwProfile *hw, int ndev)
{
	int n = g->ops.n, *group, *size;
	fused(g, hw, &group, &size);
	double *bytes = xcalloc((size_t)n + 1, sizeof *bytes), *compute = xcalloc((size_t)n + 1, sizeof *compute);
	bool *matrix = xcalloc((size_t)n + 1, sizeof *matrix);
	group_bytes(g, group, size, bytes);
	double t = 0;
	for (int i = 0; i < n; i++) {
		const Op *op = &g->ops.a[i];
		if (hw->fusion && op->kind == OP_RESHAPE)
			continue;
		OpWork w;
		cost_op_work(g, i, &w);
		w.flops /= ndev, w.trans /= ndev, w.elems /= ndev, w.layout /= ndev, w.copies /= ndev;
		int r = group[i];
		compute[r] += cost_compute_seconds(hw, g->values.a[op->out].dtype, &w), matrix[r] |= w.matrix;
		if (size[r] < 2)
			bytes[r] = w.bytes;
		t += cost_dispatch_seconds(hw, vbytes(g, op->out) / ndev);
	}
	for (int r = 0; r < n; r++)
		if (group[r] == r && !(hw->fusion && g->ops.a[r].kind == OP_RESHAPE))
			t += cost_kernel_seconds(hw, compute[r], bytes[r] / ndev, matrix[r], size[r] < 2 ? (int)g->ops.a[r].kind : -1);
	free(group), free(size), free(bytes), free(compute), free(matrix);
	return t;
}

/* Devices that are threads sharing C host cores (ndev D > C) run their
 * local ops uninterrupted at one core's rate, in turns: a collective
 * waits (D / C - 1) times the local work since the previous collective,
 * and the last collective (the last op, when there is none) also waits
 * that much for the work after it, which the other devices do meanwhile
 * (docs/cost_model.md, "Devices sharing cores"). */
static void host_waits(const Graph *g, const HwProfile *hw, CostEstimate *e)
{
	double share = hw_share(hw, g->mesh.ndev), seg = 0;
	int last = g->ops.n - 1;
	if (share >= 1 || g->ops.n == 0)
		return;
	for (int i = 0; i < g->ops.n; i++) {
		OpEstimate *o = &e->op[i];
		if (!o->comm) {
			seg += o->seconds;
			continue;
		}
		double wait = (1 / share - 1) * seg;
		o->seconds += wait, e->wait_s += wait, o->limit_s[LIMIT_HOST] += wait, seg = 0, last = i;
	}
	double wait = (1 / share - 1) * seg;
	e->op[last].seconds += wait, e->wait_s += wait, e->op[last].limit_s[LIMIT_HOST] += wait;
}

void cost_estimate_step(const Graph *g, const HwProfile *hw, const CostStep *s, CostEstimate *e)
{
	memset(e, 0, sizeof *e);
	e->nops = g->ops.n;
	e->op = xcalloc((size_t)g->ops.n + 1, sizeof *e->op);
	kernel_times(g, hw, e);
	host_waits(g, hw, e);
	for (int i = 0; i < g->ops.n; i++) {
		OpEstimate *o = &e->op[i];
		o->phase = s && s->phase ? s->phase[i] : PHASE_FORWARD;
		o->wait_on = o->behind = -1;
		e->serial_s += o->seconds;
		*(o->comm ? &e->comm_s : &e->compute_s) += o->seconds;
		e->kind_s[g->ops.a[i].kind] += o->seconds;
		e->kind_n[g->ops.a[i].kind]++;
		e->phase_s[o->phase] += o->seconds;
		for (int l = 0; l < LIMIT_COUNT; l++)
			e->phase_limit_s[o->phase][l] += o->limit_s[l];
	}
	cost_schedule(g, hw, s, e);
	cost_memory_phases(g, e->op, &e->mem, e->phase_peak);
	/* threads: every device's memory comes out of the one machine's (as spmd run checks it) */
	e->fits = (double)e->mem.peak * (hw->topo == TOPO_THREADS ? g->mesh.ndev : 1) <= hw->mem_capacity;
}

void cost_estimate(const Graph *g, const HwProfile *hw, CostEstimate *e) { cost_estimate_step(g, hw, NULL, e); }

void cost_estimate_free(CostEstimate *e)
{
	free(e->op), free(e->slot);
	e->op = NULL, e->slot = NULL;
}

void cost_step_free(CostStep *s)
{
	free(s->phase), free(s->carry_from), free(s->carry_to);
	memset(s, 0, sizeof *s);
}

const char *const cost_phase_names[PHASE_COUNT] = {"forward", "backward", "gradient sync", "weight update",
                                                   "weight gather"};

const char *cost_limit_name(const Mesh *m, int l, char *buf, size_t n)
{
	static const char *const fixed[] = {"FLOPs", "memory bandwidth", "latency", "host cores"};
	if (l < LIMIT_LINKS)
		snprintf(buf, n, "%s", l >= 0 ? fixed[l] : "nothing");
	else
		snprintf(buf, n, "links of %s", l - LIMIT_LINKS < m->naxes ? m->name[l - LIMIT_LINKS] : "?");
	return buf;
}

int cost_limit_top(const double *lim)
{
	int top = -1;
	for (int l = 0; l < LIMIT_COUNT; l++)
		if (lim[l] > 0 && (top < 0 || lim[l] > lim[top]))
			top = l;
	return top;
}
