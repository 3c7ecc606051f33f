/* ir.c: graph construction, the op table instance, dtype and shape helpers, the verifier. */
#include "ops.h"
#include "train_section.h"

#include <assert.h>
#include <string.h>

const char *const dtype_names[DT_COUNT] = {"f32", "bf16", "f16", "f64", "i32"};

int dtype_size(DType t)
{
	static const int size[DT_COUNT] = {4, 2, 2, 8, 4};
	return size[t];
}

bool dtype_is_float(DType t) { return t != DT_I32; }

int dtype_parse(const char *s)
{
	for (int i = 0; i < DT_COUNT; i++)
		if (strcmp(s, dtype_names[i]) == 0)
			return i;
	return -1;
}

bool shape_eq(const Shape *a, const Shape *b)
{
	if (a->rank != b->rank)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (a->dim[i] != b->dim[i])
			return false;
	return true;
}

void shape_format(const Shape *s, char *buf, size_t n)
{
	size_t k = (size_t)snprintf(buf, n, "[");
	for (int i = 0; i < s->rank && k < n; i++)
		k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)s->dim[i]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

/* ---- the op table ---- */

const OpInfo op_table[OP_COUNT] = {
#define OP(id, nm, lo, hi, fl, at, sh, ke) [OP_##id] = {nm, lo, hi, fl, at, sh},
#include "ops.def"
#undef OP
};

int op_find(const char *name)
{
	for (int i = 0; i < OP_COUNT; i++)
		if (strcmp(op_table[i].name, name) == 0)
			return i;
	return -1;
}

int op_roll_dim(const Attr *a, const Shape *x) { return a->dim < 0 ? a->dim + x->rank : a->dim; }

int64_t op_roll_elems(const Mesh *m, const Attr *a, const Shape *x, int device)
{
	int dim = op_roll_dim(a, x);
	int64_t n = 1, size = dim >= 0 && dim < x->rank ? x->dim[dim] : 0;
	for (int i = 0; i < a->ncax; i++)
		n *= m->size[a->cax[i]];
	if (n < 1 || size < 1 || size % n != 0)
		return 0;
	/* shift * c * (size / n) mod size = ((shift * c) mod n) * (size / n):
	 * reduced mod n first, so no shift overflows */
	int64_t k = (a->shift % n + n) % n, c = mesh_group_index(m, device, a->cax, a->ncax);
	return k * c % n * (size / n);
}

/* ---- graphs ---- */

void graph_init(Graph *g)
{
	memset(g, 0, sizeof *g);
	arena_init(&g->arena);
	g->mesh.ndev = 1;
	g->stage_axis = -1;
}

int graph_stage_coord(const Graph *g, int device)
{
	if (g->stage_axis < 0 || g->stage_axis >= g->mesh.naxes)
		return -1;
	int coord[MESH_MAX_AXES];
	mesh_device_coords(&g->mesh, device, coord);
	return coord[g->stage_axis];
}

int value_stage_coord(const Graph *g, int v)
{
	int p = g->values.a[v].producer;
	if (g->stage_axis < 0 || p < 0 || g->ops.a[p].stage < 0)
		return -1;
	const Op *op = &g->ops.a[p];
	return (op->stage_to >= 0 ? op->stage_to : op->stage) % g->mesh.size[g->stage_axis];
}

int graph_check_stages(const Graph *g, Diag *d)
{
	int nerr = 0;
	for (int i = 0; i < g->ops.n && g->stage_axis >= 0; i++) {
		const Op *op = &g->ops.a[i];
		int p = g->mesh.size[g->stage_axis], c = op->stage < 0 ? -1 : op->stage % p;
		for (int k = 0; k < op->nin; k++) {
			int h = value_stage_coord(g, op->in[k]);
			if (h < 0 || h == c)
				continue;
			const Value *x = &g->values.a[op->in[k]];
			if (c < 0)
				diag_error(d, op->pos, "expected an op of no stage to read values every device holds, found '%s' "
				           "of stage coordinate %d", x->name, h);
			else
				diag_error(d, op->pos, "expected an op of stage %d to read values of its own devices (stage "
				           "coordinate %d), found '%s' of coordinate %d: a collective_permute between stages "
				           "must bring it", op->stage, c, x->name, h);
			nerr++;
			break;
		}
	}
	return nerr;
}

bool op_runs_on(const Graph *g, const Op *op, int c)
{
	if (c < 0 || op->stage < 0)
		return true;
	int p = g->mesh.size[g->stage_axis];
	return op->stage % p == c || (op->stage_to >= 0 && op->stage_to % p == c);
}

void graph_free(Graph *g)
{
	vec_free(&g->values);
	vec_free(&g->ops);
	vec_free(&g->outputs);
	arena_free(&g->arena);
}

/* A copy of a's n elements of sz bytes with room for cap (> n). */
static void *dup_array(const void *a, int n, int cap, size_t sz)
{
	void *b = xmalloc(sz * (size_t)cap);
	if (n > 0)
		memcpy(b, a, sz * (size_t)n);
	return b;
}

void graph_fork(const Graph *src, Graph *dst)
{
	*dst = *src;
	memset(&dst->arena, 0, sizeof dst->arena);
	/* room for what the passes add (weight-update sharding: a few values and ops per param) */
	dst->values.cap = src->values.n + src->values.n / 2 + 16, dst->ops.cap = src->ops.n + src->ops.n / 2 + 16;
	dst->outputs.cap = src->outputs.n + 1;
	dst->values.a = dup_array(src->values.a, src->values.n, dst->values.cap, sizeof(Value));
	dst->ops.a = dup_array(src->ops.a, src->ops.n, dst->ops.cap, sizeof(Op));
	dst->outputs.a = dup_array(src->outputs.a, src->outputs.n, dst->outputs.cap, sizeof(int));
	for (int i = 0; i < src->ops.n; i++) {
		Op *op = &dst->ops.a[i];
		op->in = arena_alloc(&dst->arena, sizeof(int) * (size_t)(op->nin ? op->nin : 1));
		memcpy(op->in, src->ops.a[i].in, sizeof(int) * (size_t)op->nin);
	}
	if (src->train) {
		const Train *t = src->train;
		dst->train = arena_alloc(&dst->arena, sizeof *t);
		*dst->train = *t;
		if (t->nparams > 0) {
			dst->train->params = arena_alloc(&dst->arena, sizeof *t->params * (size_t)t->nparams);
			memcpy(dst->train->params, t->params, sizeof *t->params * (size_t)t->nparams);
		}
	}
}

int graph_value(Graph *g, const char *name, DType t, const Shape *s, ValueKind k, Pos p)
{
	Value v = {0};
	v.name = arena_strdup(&g->arena, name);
	v.dtype = t;
	v.shape = *s;
	v.global = *s;
	v.kind = k;
	v.producer = -1;
	v.pos = p;
	v.spec.rank = (uint8_t)s->rank;
	vec_push(&g->values, v);
	return g->values.n - 1;
}

void graph_unshare_consts(Graph *g)
{
	int n0 = g->values.n;
	char *used = xcalloc((size_t)n0 + 1, 1);
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++) {
			int v = g->ops.a[i].in[k];
			if (v >= n0 || g->values.a[v].kind != VK_CONST || !used[v]++)
				continue;
			Value c = g->values.a[v]; /* graph_value may move the array */
			int w = graph_value(g, c.name, c.dtype, &c.shape, VK_CONST, c.pos);
			Value *nv = &g->values.a[w];
			nv->cval = c.cval, nv->global = c.global, nv->spec = c.spec, nv->nuses = 1;
			g->values.a[v].nuses--;
			g->ops.a[i].in[k] = w;
		}
	free(used);
}

int graph_op(Graph *g, OpKind k, const int *in, int nin, int out, Pos p)
{
	Op op = {0};
	op.kind = k;
	op.nin = nin;
	op.in = arena_alloc(&g->arena, sizeof(int) * (size_t)(nin ? nin : 1));
	memcpy(op.in, in, sizeof(int) * (size_t)nin);
	op.out = out;
	op.attr = arena_alloc(&g->arena, sizeof *op.attr);
	op.pos = p;
	op.src_op = -1;
	op.stage = op.stage_to = -1;
	vec_push(&g->ops, op);
	int id = g->ops.n - 1;
	assert(out >= 0 && out < g->values.n);
	g->values.a[out].producer = id;
	for (int i = 0; i < nin; i++)
		g->values.a[in[i]].nuses++;
	return id;
}

int graph_find(const Graph *g, const char *name)
{
	for (int i = 0; i < g->values.n; i++)
		if (strcmp(g->values.a[i].name, name) == 0)
			return i;
	return -1;
}

void graph_find_many(const Graph *g, const char *const *names, int n, int *ids)
{
	StrIndex first; /* the first value of a name, as graph_find finds it */
	strindex_init(&first, (size_t)g->values.n);
	for (int v = 0; v < g->values.n; v++)
		strindex_put(&first, g->values.a[v].name, v);
	for (int k = 0; k < n; k++)
		ids[k] = strindex_get(&first, names[k]);
	strindex_free(&first);
}

/* Check one op: operand ids defined before it, result produced here, shape rule agrees. */
static int verify_op(const Graph *g, int id, char *defined, Diag *d)
{
	const Op *op = &g->ops.a[id];
	const OpInfo *info = &op_table[op->kind];
	int nerr = 0;
	if (op->nin < info->nmin || (info->nmax >= 0 && op->nin > info->nmax)) {
		diag_error(d, op->pos, "verifier: op %d (%s) has %d operands", id, info->name, op->nin);
		return 1;
	}
	for (int i = 0; i < op->nin; i++) {
		int v = op->in[i];
		if (v < 0 || v >= g->values.n || !defined[v]) {
			diag_error(d, op->pos, "verifier: op %d (%s) reads value %d before it is defined", id, info->name, v);
			nerr++;
		}
	}
	if (op->out < 0 || op->out >= g->values.n || defined[op->out] || g->values.a[op->out].producer != id) {
		diag_error(d, op->pos, "verifier: op %d (%s) has a bad result id %d", id, info->name, op->out);
		return nerr + 1;
	}
	if (nerr)
		return nerr;
	Shape s;
	DType t;
	const Value *out = &g->values.a[op->out];
	if (info->shape(g, op, &s, &t, d) != 0)
		return 1;
	if (!shape_eq(&s, &out->shape) || t != out->dtype) {
		char a[128], b[128];
		shape_format(&s, a, sizeof a), shape_format(&out->shape, b, sizeof b);
		diag_error(d, op->pos, "verifier: %s gives %s %s, but %s is %s %s", info->name, dtype_names[t], a,
		           out->name, dtype_names[out->dtype], b);
		return 1;
	}
	defined[op->out] = 1;
	return 0;
}

int graph_verify(const Graph *g, Diag *d)
{
	char *defined = xcalloc((size_t)g->values.n + 1, 1);
	int nerr = 0;
	for (int i = 0; i < g->values.n; i++)
		if (g->values.a[i].producer < 0)
			defined[i] = 1;
	for (int i = 0; i < g->ops.n; i++)
		nerr += verify_op(g, i, defined, d);
	for (int i = 0; i < g->outputs.n; i++) {
		int v = g->outputs.a[i];
		if (v < 0 || v >= g->values.n) {
			diag_error(d, (Pos){g->file, 0, 0}, "verifier: output %d is not a value", v);
			nerr++;
		}
	}
	free(defined);
	return nerr;
}

int64_t graph_param_count(const Graph *g)
{
	int64_t n = 0;
	for (int i = 0; i < g->values.n; i++)
		if (g->values.a[i].kind == VK_PARAM)
			n += shape_numel(&g->values.a[i].shape);
	return n;
}

/* Has m the axes of g's mesh as written (an axis cut into pieces by its
 * whole name), in order?  Else a usage error naming text. */
static int check_mesh(const Graph *g, const Mesh *m, const char *text, Diag *d)
{
	bool same = true;
	int k = 0;
	for (int a = 0, r; a < g->mesh.naxes; a += r, k++) {
		char name[128];
		int size;
		r = mesh_written_axis(&g->mesh, a, name, sizeof name, &size);
		same &= k < m->naxes && strcmp(name, m->name[k]) == 0;
	}
	if (g->mesh.naxes && (!same || k != m->naxes)) {
		char want[128];
		mesh_format(&g->mesh, want, sizeof want);
		diag_usage(d, "expected --mesh with the model's axes in its order (%s), found '%s'", want, text);
		return -1;
	}
	return 0;
}

int graph_check_mesh(Graph *g, const char *text, Diag *d)
{
	Mesh m;
	return mesh_parse_text(&m, &g->arena, text, d) != 0 ? -1 : check_mesh(g, &m, text, d);
}

int graph_set_mesh(Graph *g, const char *text, Diag *d)
{
	Mesh m;
	if (mesh_parse_text(&m, &g->arena, text, d) != 0 || check_mesh(g, &m, text, d) != 0)
		return -1;
	m.hardware = g->mesh.hardware;
	g->mesh = m;
	return 0;
}

void graph_rotate_ops(Graph *g, int first)
{
	int n = g->ops.n, k = n - first;
	if (k <= 0 || first == 0)
		return;
	Op *tmp = xmalloc(sizeof(Op) * (size_t)k);
	memcpy(tmp, g->ops.a + first, sizeof(Op) * (size_t)k);
	memmove(g->ops.a + k, g->ops.a, sizeof(Op) * (size_t)first);
	memcpy(g->ops.a, tmp, sizeof(Op) * (size_t)k);
	free(tmp);
	for (int v = 0; v < g->values.n; v++) {
		int p = g->values.a[v].producer;
		if (p >= 0)
			g->values.a[v].producer = p < first ? p + k : p - first;
	}
}

ReshardKind op_reshard_kind(int op_kind)
{
	switch (op_kind) {
	case OP_ALL_REDUCE: return RS_ALL_REDUCE;
	case OP_REDUCE_SCATTER: return RS_REDUCE_SCATTER;
	case OP_ALL_GATHER: return RS_ALL_GATHER;
	case OP_ALL_TO_ALL: return RS_ALL_TO_ALL;
	case OP_COLLECTIVE_PERMUTE: return RS_PERMUTE;
	default: return RS_SLICE;
	}
}

/* g's ops set to ops[0..n), producers and use counts to match. */
void graph_set_ops(Graph *g, const Op *ops, int n)
{
	g->ops.n = 0;
	for (int i = 0; i < n; i++)
		vec_push(&g->ops, ops[i]);
	for (int v = 0; v < g->values.n; v++)
		g->values.a[v].producer = -1, g->values.a[v].nuses = 0;
	for (int i = 0; i < n; i++) {
		const Op *op = &g->ops.a[i];
		g->values.a[op->out].producer = i;
		for (int k = 0; k < op->nin; k++)
			g->values.a[op->in[k]].nuses++;
	}
}

void graph_order_ops(Graph *g, const int *seq, int n)
{
	Op *ops = xmalloc(sizeof(Op) * ((size_t)n + 1));
	for (int i = 0; i < n; i++)
		ops[i] = g->ops.a[seq[i]];
	graph_set_ops(g, ops, n);
	free(ops);
}

void graph_readers(const Graph *g, int **start, int **list)
{
	int nv = g->values.n, total = 0;
	int *st = xcalloc((size_t)nv + 2, sizeof(int)), *fill = xcalloc((size_t)nv + 1, sizeof(int));
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++)
			st[g->ops.a[i].in[k] + 1]++, total++;
	for (int v = 0; v < nv; v++)
		st[v + 1] += st[v];
	int *ls = xmalloc(sizeof(int) * ((size_t)total + 1));
	for (int i = 0; i < g->ops.n; i++)
		for (int k = 0; k < g->ops.a[i].nin; k++) {
			int v = g->ops.a[i].in[k];
			ls[st[v] + fill[v]++] = i;
		}
	free(fill);
	*start = st, *list = ls;
}
