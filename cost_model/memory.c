/* memory.c: per-device memory by liveness over the program order — persistent leaves, live results, the peak. */
#include "cost.h"

#include "../spmd/ops.h"
#include "../spmd/train_section.h"

static int64_t value_bytes(const Graph *g, int v)
{
	const Value *val = &g->values.a[v];
	return shape_numel(&val->shape) * dtype_size(val->dtype);
}

/* last[v]: the last op reading v; ops.n for an output (held to the end); -1 unread. */
static int *last_uses(const Graph *g)
{
	int *last = xmalloc(sizeof(int) * (size_t)(g->values.n + 1));
	for (int v = 0; v < g->values.n; v++)
		last[v] = -1;
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++)
			last[g->ops.a[i].in[k]] = i;
	for (int i = 0; i < g->outputs.n; i++)
		last[g->outputs.a[i]] = g->ops.n;
	return last;
}

static void count_leaves(const Graph *g, MemoryEstimate *m)
{
	for (int v = 0; v < g->values.n; v++) {
		const Value *val = &g->values.a[v];
		if (val->producer >= 0 || val->kind == VK_INTER) /* an op's result no op makes now: not held */
			continue;
		if (val->kind == VK_PARAM)
			m->params += value_bytes(g, v);
		else if (val->kind == VK_STATE)
			m->state += value_bytes(g, v);
		else
			m->inputs += value_bytes(g, v);
	}
}

/* The liveness walk: m gets the leaves and the peak; held (when not NULL,
 * g->ops.n entries) the bytes held just after each op's result is made. */
static void memory_walk(const Graph *g, MemoryEstimate *m, int64_t *held)
{
	*m = (MemoryEstimate){.peak_op = -1};
	count_leaves(g, m);
	int *last = last_uses(g);
	int64_t leaves = m->params + m->state + m->inputs, live = 0, coll = 0;
	m->peak = leaves;
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		bool is_coll = op_table[op->kind].flags & OPF_COLLECTIVE;
		live += value_bytes(g, op->out);
		coll += is_coll ? value_bytes(g, op->out) : 0;
		if (held)
			held[i] = leaves + live;
		if (leaves + live > m->peak)
			m->peak = leaves + live, m->peak_op = i, m->peak_activations = live, m->peak_collective = coll;
		for (int k = 0; k <= op->nin; k++) {
			int v = k < op->nin ? op->in[k] : op->out, p = g->values.a[v].producer;
			bool dup = false; /* an operand given twice is freed once */
			for (int j = 0; j < k && !dup; j++)
				dup = (j < op->nin ? op->in[j] : op->out) == v;
			if (p < 0 || dup || last[v] > i)
				continue;
			live -= value_bytes(g, v);
			if (op_table[g->ops.a[p].kind].flags & OPF_COLLECTIVE)
				coll -= value_bytes(g, v);
		}
	}
	free(last);
}

void cost_memory(const Graph *g, MemoryEstimate *m) { memory_walk(g, m, NULL); }

void cost_memory_phases(const Graph *g, const OpEstimate *op, MemoryEstimate *m, int64_t *phase_peak)
{
	int64_t *held = xmalloc(sizeof(int64_t) * (size_t)(g->ops.n + 1));
	memory_walk(g, m, held);
	for (int p = 0; p < PHASE_COUNT; p++)
		phase_peak[p] = 0;
	for (int i = 0; i < g->ops.n; i++)
		if (held[i] > phase_peak[op[i].phase])
			phase_peak[op[i].phase] = held[i];
	free(held);
}

void cost_memory_timeline(const Graph *g, int64_t *held)
{
	MemoryEstimate m;
	memory_walk(g, &m, held);
}

int64_t cost_step_floor(const Graph *g, int ndev)
{
	const Train *t = g->train;
	int cut = t && t->built ? g->values.a[t->loss].producer : -1;
	bool *read = xcalloc((size_t)g->values.n + 1, sizeof *read), *late = xcalloc((size_t)g->values.n + 1, sizeof *late);
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++)
			read[g->ops.a[i].in[k]] = true, late[g->ops.a[i].in[k]] |= i > cut;
	for (int i = 0; i < g->outputs.n; i++)
		read[g->outputs.a[i]] = late[g->outputs.a[i]] = true;
	int64_t sum = 0;
	for (int v = 0; v < g->values.n; v++) {
		const Value *val = &g->values.a[v];
		if (val->producer < 0 ? val->kind != VK_INTER && read[v] : val->producer <= cut && late[v])
			sum += value_bytes(g, v);
	}
	free(read), free(late);
	return sum / (ndev > 0 ? ndev : 1);
}

int cost_live_values(const Graph *g, int i, int *vals)
{
	int *last = last_uses(g), n = 0;
	for (int v = 0; v < g->values.n; v++) {
		int p = g->values.a[v].producer;
		if (p >= 0 && (p == i || (p < i && last[v] >= i)))
			vals[n++] = v;
	}
	free(last);
	return n;
}

int64_t cost_memory_floor(const Graph *g, bool wus_on)
{
	int64_t floor = 0;
	for (int v = 0; v < g->values.n; v++) {
		const Value *val = &g->values.a[v];
		if (val->producer >= 0 || !val->has_spec || val->priority != 0 ||
		    (val->kind != VK_PARAM && val->kind != VK_INPUT))
			continue;
		int64_t local[MAX_RANK];
		spec_shard_shape(&val->spec, &g->mesh, val->shape.dim, local);
		int64_t n = 1, free_ways = 1;
		for (int d = 0; d < val->shape.rank; d++)
			n *= local[d];
		bool wus = val->kind == VK_PARAM && g->train && (val->wus ? val->wus - 1 != WUS_OFF : wus_on);
		if (val->spec.open || wus) {
			unsigned used = val->spec.partial;
			for (int d = 0; d < val->spec.rank; d++)
				for (int k = 0; k < val->spec.nax[d]; k++)
					used |= 1u << val->spec.ax[d][k];
			for (int a = 0; a < g->mesh.naxes; a++)
				if (!(used >> a & 1))
					free_ways *= g->mesh.size[a];
		}
		floor += (n + free_ways - 1) / free_ways * dtype_size(val->dtype);
	}
	return floor;
}
