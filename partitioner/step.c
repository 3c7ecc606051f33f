/* step.c: the phases of a partitioned training step and its carried values, for the cost model. */
#include "step.h"

#include <string.h>

#include "../spmd/ops.h"
#include "../spmd/train_section.h"

static bool is_collective(const Op *op) { return op_table[op->kind].flags & OPF_COLLECTIVE; }

/* (A collective's result counts as needed by the forward or backward pass
 * when an op there computes with it; ops that only move elements (OPF_MOVE:
 * the partitioner's and the combiner's slices, reshapes, copies) pass the
 * question on to their readers.) */

/* Per op of the training step g: its phase (module comment of step.h). */
static unsigned char *model_phases(const Graph *g)
{
	const Train *t = g->train;
	unsigned char *ph = xcalloc((size_t)g->ops.n + 1, 1);
	bool *need = xcalloc((size_t)g->values.n + 1, sizeof *need), *next = xcalloc((size_t)g->values.n + 1, 1);
	int loss = g->values.a[t->loss].producer, first_update = g->ops.n;
	for (int p = 0; p < t->nparams; p++) {
		need[t->params[p].reduced] = true, next[t->params[p].next] = true;
		first_update = t->params[p].first_op < first_update ? t->params[p].first_op : first_update;
	}
	for (int i = g->ops.n - 1; i > loss; i--)
		for (int k = 0; need[g->ops.a[i].out] && k < g->ops.a[i].nin; k++)
			need[g->ops.a[i].in[k]] = true;
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		bool copy_of_shard = op->kind == OP_COPY && next[op->out] && strstr(g->values.a[op->in[0]].name, "%shard");
		if (i <= loss)
			ph[i] = PHASE_FORWARD;
		else if (copy_of_shard)
			ph[i] = PHASE_GATHER;
		else if (i < first_update && need[op->out])
			ph[i] = PHASE_BACKWARD;
		else
			ph[i] = PHASE_UPDATE;
	}
	free(need), free(next);
	return ph;
}

/* The local ops' phases: their model op's; an op the partitioner added
 * takes the phase of the op it serves: the next op with a model op when
 * one up to there reads its result (it moves an operand of that op), else
 * the op before it (it settles a result).  Either holds wherever a pass
 * moves an op and the partitioner's ops around it (order.c). */
static void local_phases(const Graph *prog, const unsigned char *mph, unsigned char *ph)
{
	int n = prog->ops.n, *next = xmalloc(sizeof(int) * ((size_t)n + 1));
	int *read = xmalloc(sizeof(int) * ((size_t)prog->values.n + 1));
	for (int v = 0; v < prog->values.n; v++)
		read[v] = n;
	for (int i = n - 1, m = -1; i >= 0; i--) {
		const Op *op = &prog->ops.a[i];
		for (int k = 0; k < op->nin; k++)
			read[op->in[k]] = i;
		m = op->src_op >= 0 ? i : m;
		next[i] = m;
	}
	unsigned char last = PHASE_FORWARD;
	for (int i = 0; i < n; i++) {
		const Op *op = &prog->ops.a[i];
		int m = next[i];
		if (op->src_op < 0 && m >= 0 && read[op->out] <= m && mph)
			ph[i] = mph[prog->ops.a[m].src_op];
		else
			ph[i] = last = op->src_op >= 0 && mph ? mph[op->src_op] : last;
	}
	free(next), free(read);
}

/* The collectives' phases, from their operands and what their results feed. */
static void collective_phases(const Graph *prog, const CostStep *s, unsigned char *ph)
{
	int nv = prog->values.n;
	bool *reach = xcalloc((size_t)nv + 1, sizeof *reach), *carried = xcalloc((size_t)nv + 1, sizeof *carried);
	for (int i = 0; i < s->ncarry; i++)
		carried[s->carry_to[i]] = true;
	for (int i = prog->ops.n - 1; i >= 0; i--) {
		const Op *op = &prog->ops.a[i];
		bool fb = !is_collective(op) && !(op_table[op->kind].flags & OPF_MOVE) && (ph[i] == PHASE_FORWARD || ph[i] == PHASE_BACKWARD);
		for (int k = 0; k < op->nin; k++)
			reach[op->in[k]] |= fb || reach[op->out];
	}
	for (int i = 0; i < prog->ops.n; i++) {
		const Op *op = &prog->ops.a[i];
		if (!is_collective(op))
			continue;
		int v = op->in[0], p = prog->values.a[v].producer;
		while (p >= 0 && (op_table[prog->ops.a[p].kind].flags & OPF_MOVE) && !is_collective(&prog->ops.a[p]))
			v = prog->ops.a[p].in[0], p = prog->values.a[v].producer; /* through the reshapes and pads */
		int from = p >= 0 ? ph[p] : -1;
		if (op->kind == OP_ALL_GATHER && (carried[v] || from == PHASE_UPDATE || from == PHASE_GATHER))
			ph[i] = PHASE_GATHER;
		else if (from == PHASE_UPDATE || from == PHASE_GATHER)
			ph[i] = (unsigned char)from;
		else if (from == PHASE_BACKWARD && !reach[op->out] && op_reshard_kind(op->kind) != RS_ALL_GATHER)
			ph[i] = PHASE_GRAD_SYNC;
	}
	free(reach), free(carried);
}

void step_describe(const Graph *model, const Graph *prog, const int *map, CostStep *s)
{
	memset(s, 0, sizeof *s);
	s->phase = xcalloc((size_t)prog->ops.n + 1, 1);
	const Train *t = model->train;
	if (!t || !t->built || !map)
		return;
	s->carry_from = xmalloc(sizeof(int) * ((size_t)t->ncarry + 1));
	s->carry_to = xmalloc(sizeof(int) * ((size_t)t->ncarry + 1));
	for (int i = 0; i < t->ncarry; i++) {
		int f = map[t->carry_from[i]], to = map[t->carry_to[i]];
		if (f >= 0 && to >= 0)
			s->carry_from[s->ncarry] = f, s->carry_to[s->ncarry++] = to;
	}
	unsigned char *mph = model_phases(model);
	local_phases(prog, mph, s->phase);
	collective_phases(prog, s, s->phase);
	free(mph);
}

void step_price(const Graph *model, const Graph *prog, const int *map, const HwProfile *hw, CostEstimate *e)
{
	CostStep st;
	step_describe(model, prog, map, &st);
	st.steady_only = true;
	cost_estimate_step(prog, hw, &st, e);
	cost_step_free(&st);
}

bool step_kept(const CostEstimate *e, double before_s, int64_t peak)
{
	return e->overlapped_s < before_s * (1 - 1e-3) && e->mem.peak <= peak + peak / 100;
}
