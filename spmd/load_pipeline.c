/* load_pipeline.c: the pipeline: section of a model and the stage of every op.
 *
 *   pipeline:
 *     axis: stage              # a mesh axis: its coordinate is the device's stage
 *     microbatches: 8          # divides every input's dim 0 (the batch)
 *     schedule: 1f1b           # gpipe (default) | 1f1b | interleaved
 *     virtual_stages: 2        # interleaved only (default 2): stages per device
 *     stages: auto             # optional: balance the stages by the cost model
 *     recompute: true          # optional: recompute the forward in the backward
 *
 * Ops say their stage by `stage: S` (0 <= S < p * V); an op without one
 * takes the latest stage of the ops it reads (the stage of the op before it
 * when it reads none); an op may not read a later stage.  Every error is
 * reported at the node it concerns, after the ops were loaded (the stage
 * rules need the operands). */
#include "load.h"
#include "pipeline_section.h"
#include "../base/yaml.h"

#include <stdlib.h>
#include <string.h>

const char *const pipe_schedule_names[PIPE_COUNT] = {"gpipe", "1f1b", "interleaved"};

typedef struct {
	Graph *g;
	Diag *d;
	Pipeline *pl;
	const YNode *vs_key; /* the virtual_stages key, checked once the schedule is known */
} PipeLoad;

static int expect(PipeLoad *L, const YNode *n, const char *what)
{
	char desc[96];
	ynode_describe(n, desc, sizeof desc);
	diag_error(L->d, n->pos, "expected %s, found %s", what, desc);
	return -1;
}

/* An integer in [lo, hi] at n into *out; what names it. */
static int read_int(PipeLoad *L, const YNode *n, int64_t lo, int64_t hi, const char *what, int64_t *out)
{
	if (ynode_int(n, out, L->d) != 0)
		return -1;
	return *out >= lo && *out <= hi ? 0 : expect(L, n, what);
}

/* axis: NAME, an axis of the model's mesh. */
static int read_axis(PipeLoad *L, const YNode *n)
{
	const Mesh *m = &L->g->mesh;
	const char *s;
	if (ynode_string(n, &s, L->d) != 0)
		return -1;
	int a = mesh_axis_find(m, s);
	if (a >= 0) {
		L->pl->axis = a;
		L->pl->ndev_stages = m->size[a];
		return 0;
	}
	char what[256];
	size_t k = (size_t)snprintf(what, sizeof what, m->naxes ? "a mesh axis (one of " : "a mesh axis (the model has no mesh");
	for (int i = 0; i < m->naxes && k < sizeof what; i++)
		k += (size_t)snprintf(what + k, sizeof what - k, "%s%s", i ? ", " : "", m->name[i]);
	if (k < sizeof what)
		snprintf(what + k, sizeof what - k, ")");
	return expect(L, n, what);
}

/* microbatches: M, dividing every input's dim 0. */
static int read_microbatches(PipeLoad *L, const YNode *n)
{
	int64_t m;
	if (read_int(L, n, 1, 1 << 20, "a microbatch count from 1 to 1048576", &m) != 0)
		return -1;
	L->pl->microbatches = m;
	int64_t p = L->pl->ndev_stages > 0 ? L->pl->ndev_stages : 1;
	if (m * p > PIPE_MAX_STEPS) {
		diag_error(L->d, n->pos, "expected at most %lld microbatches on %lld stages (a schedule of at most %d microbatch steps a stage), found %lld",
		           (long long)(PIPE_MAX_STEPS / p), (long long)p, PIPE_MAX_STEPS, (long long)m);
		return -1;
	}
	for (int i = 0; i < L->g->values.n; i++) {
		const Value *v = &L->g->values.a[i];
		if (v->kind != VK_INPUT || v->shape.rank == 0 || v->shape.dim[0] % m == 0)
			continue;
		diag_error(L->d, n->pos, "expected a microbatch count that divides the batch %lld (dim 0 of input '%s'), found %lld",
		           (long long)v->shape.dim[0], v->name, (long long)m);
		return -1;
	}
	return 0;
}

static int read_schedule(PipeLoad *L, const YNode *n)
{
	const char *s;
	if (ynode_string(n, &s, L->d) != 0)
		return -1;
	for (int k = 0; k < PIPE_COUNT; k++)
		if (strcmp(s, pipe_schedule_names[k]) == 0) {
			L->pl->schedule = (PipeSchedule)k;
			return 0;
		}
	return expect(L, n, "a schedule (gpipe, 1f1b or interleaved)");
}

/* stages: auto, recompute: BOOL. */
static int read_flags(PipeLoad *L, const YNode *n)
{
	const YNode *v;
	const char *s;
	int rc = 0;
	if ((v = ynode_get(n, "stages"))) {
		if (ynode_string(v, &s, L->d) != 0)
			rc = -1;
		else if (strcmp(s, "auto") == 0)
			L->pl->auto_stages = true;
		else
			rc = expect(L, v, "auto (or no stages key: ops say their stage)");
	}
	if ((v = ynode_get(n, "recompute")) && ynode_bool(v, &L->pl->recompute, L->d) != 0)
		rc = -1;
	L->pl->recompute_given = v != NULL;
	return rc;
}

/* virtual_stages: V >= 2, only with schedule: interleaved; interleaving
 * runs the microbatches in groups of p. */
static int read_virtual(PipeLoad *L, const YNode *n)
{
	Pipeline *pl = L->pl;
	const YNode *v = ynode_get(n, "virtual_stages");
	int64_t V = 2;
	pl->virtual_stages = 1;
	if (pl->schedule != PIPE_INTERLEAVED) {
		for (int i = 0; v && i < n->n; i++)
			if (n->items[i] == v)
				return expect(L, n->keys[i], "no virtual_stages without schedule: interleaved");
		return 0;
	}
	if (v && read_int(L, v, 2, 64, "a virtual stage count from 2 to 64", &V) != 0)
		return -1;
	if (v && pl->microbatches * pl->ndev_stages * V > PIPE_MAX_STEPS) {
		diag_error(L->d, v->pos, "expected at most %lld virtual stages (a schedule of at most %d microbatch steps a stage), found %lld",
		           (long long)(PIPE_MAX_STEPS / (pl->microbatches * pl->ndev_stages)), PIPE_MAX_STEPS, (long long)V);
		return -1;
	}
	pl->virtual_stages = (int)V;
	if (pl->microbatches % pl->ndev_stages != 0) {
		diag_error(L->d, ynode_get(n, "microbatches")->pos,
		           "expected a microbatch count that is a multiple of the %d stages of axis '%s' (schedule interleaved), found %lld",
		           pl->ndev_stages, L->g->mesh.name[pl->axis], (long long)pl->microbatches);
		return -1;
	}
	return 0;
}

static int check_section_keys(PipeLoad *L, const YNode *n)
{
	static const char *const keys[] = {"axis", "microbatches", "schedule", "virtual_stages", "stages", "recompute", NULL};
	int rc = 0;
	for (int i = 0; i < n->n; i++) {
		bool ok = false;
		for (const char *const *k = keys; *k && !ok; k++)
			ok = strcmp(*k, n->keys[i]->str) == 0;
		if (!ok)
			rc = expect(L, n->keys[i], "one of axis, microbatches, schedule, virtual_stages, stages, recompute (pipeline)");
	}
	return rc;
}

static int read_section(PipeLoad *L, const YNode *n)
{
	if (n->kind != YN_MAP)
		return expect(L, n, "a pipeline section (a mapping with axis and microbatches)");
	int rc = check_section_keys(L, n);
	const YNode *v;
	if (!(v = ynode_get(n, "axis")))
		rc = expect(L, n, "an axis in the pipeline section");
	else if (read_axis(L, v) != 0)
		rc = -1;
	if (!(v = ynode_get(n, "microbatches")))
		rc = expect(L, n, "microbatches in the pipeline section");
	else if (read_microbatches(L, v) != 0)
		rc = -1;
	if ((v = ynode_get(n, "schedule")) && read_schedule(L, v) != 0)
		rc = -1;
	L->pl->schedule_given = v != NULL;
	rc |= read_flags(L, n);
	if (rc == 0)
		rc = read_virtual(L, n);
	L->pl->nstages = L->pl->ndev_stages * L->pl->virtual_stages;
	return rc;
}

/* The key node of `key` in map n, or NULL. */
static const YNode *key_node(const YNode *n, const char *key)
{
	for (int i = 0; n->kind == YN_MAP && i < n->n; i++)
		if (strcmp(n->keys[i]->str, key) == 0)
			return n->keys[i];
	return NULL;
}

/* The latest stage among the ops op i reads, and in *from the operand of that stage; -1 when it reads no op. */
static int operand_stage(PipeLoad *L, int i, int *from)
{
	const Op *op = &L->g->ops.a[i];
	int s = -1;
	for (int k = 0; k < op->nin; k++) {
		int p = L->g->values.a[op->in[k]].producer;
		if (p >= 0 && L->pl->op_stage[p] > s)
			s = L->pl->op_stage[p], *from = op->in[k];
	}
	return s;
}

/* The stage of op i from its `stage:` key (item n) or its operands. */
static int place_op(PipeLoad *L, const YNode *n, int i, int prev)
{
	Pipeline *pl = L->pl;
	const YNode *sn = ynode_get(n, "stage");
	int from = -1, in = operand_stage(L, i, &from);
	pl->op_stage[i] = in >= 0 ? in : prev;
	if (!sn)
		return 0;
	if (pl->auto_stages)
		return expect(L, key_node(n, "stage"), "no stage on an op when the pipeline has stages: auto");
	char what[64];
	snprintf(what, sizeof what, "a stage from 0 to %d", pl->nstages - 1);
	int64_t s;
	if (read_int(L, sn, 0, pl->nstages - 1, what, &s) != 0)
		return -1;
	if (s < in) {
		diag_error(L->d, sn->pos, "expected a stage of at least %d (the op reads '%s' of stage %d), found %lld", in,
		           L->g->values.a[from].name, in, (long long)s);
		return -1;
	}
	pl->op_stage[i] = (int)s;
	return 0;
}

/* Params and inputs are placed by their first reader: a param's update and
 * an input's reshards belong there. */
static bool is_leaf(const Value *v) { return v->kind == VK_PARAM || v->kind == VK_INPUT; }

/* Every param's and input's position and first reader (load time: ops are the model's). */
static void find_params(const Graph *g, Pipeline *pl)
{
	int k = 0;
	for (int v = 0; v < g->values.n && k < pl->nparams; v++) {
		if (!is_leaf(&g->values.a[v]))
			continue;
		pl->param_pos[k] = g->values.a[v].pos;
		pl->param_first_op[k] = -1;
		for (int i = 0; i < pl->nops && pl->param_first_op[k] < 0; i++)
			for (int j = 0; j < g->ops.a[i].nin; j++)
				if (g->ops.a[i].in[j] == v)
					pl->param_first_op[k] = i;
		k++;
	}
}

void pipeline_place_params(Pipeline *pl)
{
	for (int k = 0; k < pl->nparams; k++)
		pl->param_stage[k] = pl->param_first_op[k] >= 0 ? pl->op_stage[pl->param_first_op[k]] : 0;
}

void pipeline_take_cut(Pipeline *pl, const Pipeline *cut)
{
	if (!cut || !pl->auto_stages || cut->nops != pl->nops || cut->nstages != pl->nstages ||
	    (cut->nops > 0 && cut->op_stage[0] < 0))
		return;
	memcpy(pl->op_stage, cut->op_stage, sizeof(int) * (size_t)pl->nops);
	pipeline_place_params(pl);
}

static Pos entry_pos(const Pipeline *pl, int k) { return k < pl->nops ? pl->op_pos[k] : pl->param_pos[k - pl->nops]; }

static int pos_cmp(Pos a, Pos b) { return a.line != b.line ? (a.line > b.line) - (a.line < b.line) : (a.col > b.col) - (a.col < b.col); }

static _Thread_local const Pipeline *sort_pl; /* qsort has no context argument (one per thread: autoshard loads plans on several) */
static int entry_cmp(const void *a, const void *b)
{
	return pos_cmp(entry_pos(sort_pl, *(const int *)a), entry_pos(sort_pl, *(const int *)b));
}

/* The index of ops and params by position (by_pos). */
static void index_positions(Graph *g, Pipeline *pl)
{
	int n = pl->nops + pl->nparams;
	pl->by_pos = arena_alloc(&g->arena, sizeof *pl->by_pos * (size_t)(n + 1));
	for (int k = 0; k < n; k++)
		pl->by_pos[k] = k;
	sort_pl = pl;
	qsort(pl->by_pos, (size_t)n, sizeof *pl->by_pos, entry_cmp);
	sort_pl = NULL;
}

static void alloc_tables(Graph *g, Pipeline *pl)
{
	pl->nops = g->ops.n;
	pl->op_stage = arena_alloc(&g->arena, sizeof *pl->op_stage * (size_t)(pl->nops + 1));
	pl->op_pos = arena_alloc(&g->arena, sizeof *pl->op_pos * (size_t)(pl->nops + 1));
	for (int i = 0; i < pl->nops; i++)
		pl->op_pos[i] = g->ops.a[i].pos, pl->op_stage[i] = -1;
	for (int v = 0; v < g->values.n; v++)
		pl->nparams += is_leaf(&g->values.a[v]);
	pl->param_pos = arena_alloc(&g->arena, sizeof *pl->param_pos * (size_t)(pl->nparams + 1));
	pl->param_stage = arena_alloc(&g->arena, sizeof *pl->param_stage * (size_t)(pl->nparams + 1));
	pl->param_first_op = arena_alloc(&g->arena, sizeof *pl->param_first_op * (size_t)(pl->nparams + 1));
	find_params(g, pl);
	index_positions(g, pl);
}

/* Place every op (the ops loaded one per item of `ops`). */
static int place_ops(PipeLoad *L, const YNode *ops)
{
	Pipeline *pl = L->pl;
	alloc_tables(L->g, pl);
	if (pl->auto_stages) { /* a `stage:` key is still an error */
		int rc = 0;
		for (int i = 0; i < ops->n; i++)
			if (ynode_get(ops->items[i], "stage"))
				rc = expect(L, key_node(ops->items[i], "stage"), "no stage on an op when the pipeline has stages: auto");
		return rc;
	}
	int rc = 0, prev = 0;
	for (int i = 0; i < ops->n; i++) {
		rc |= place_op(L, ops->items[i], i, prev);
		prev = pl->op_stage[i];
	}
	pipeline_place_params(pl);
	return rc;
}

/* Without a section, a `stage:` key is an error. */
static int no_stages(PipeLoad *L, const YNode *ops)
{
	int rc = 0;
	for (int i = 0; ops && ops->kind == YN_SEQ && i < ops->n; i++) {
		const YNode *k = key_node(ops->items[i], "stage");
		if (k)
			rc = expect(L, k, "no stage on an op of a model without a pipeline: section");
	}
	return rc;
}

int load_pipeline(struct LoadCtx *lc, const struct YNode *n, const struct YNode *ops)
{
	Graph *g = load_graph(lc);
	PipeLoad L = {.g = g, .d = load_diag(lc)};
	if (!n)
		return no_stages(&L, ops);
	int nerr = L.d->nerr;
	L.pl = arena_alloc(&g->arena, sizeof *L.pl);
	L.pl->pos = n->pos;
	if (read_section(&L, n) != 0 || L.d->nerr > nerr)
		return -1;
	/* the ops loaded one for each item only when all of them loaded */
	if (!ops || ops->kind != YN_SEQ || ops->n != g->ops.n)
		return -1;
	if (place_ops(&L, ops) != 0)
		return -1;
	g->pipeline = L.pl;
	return 0;
}

/* The entry (op k, or param nops + k) at position p, or -1. */
static int entry_at(const Pipeline *pl, Pos p)
{
	int lo = 0, hi = pl->nops + pl->nparams;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2, c = pos_cmp(entry_pos(pl, pl->by_pos[mid]), p);
		if (c == 0)
			return pl->by_pos[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

int pipeline_op_at(const Pipeline *pl, Pos p)
{
	int k = entry_at(pl, p);
	return k < pl->nops ? k : -1;
}

int pipeline_stage_at(const Pipeline *pl, Pos p)
{
	int k = entry_at(pl, p);
	return k < 0 ? -1 : k < pl->nops ? pl->op_stage[k] : pl->param_stage[k - pl->nops];
}
