/* emit.c: a partitioned program as YAML text — the whole program (-o) and one file per device (--per-device).
 *
 * The text is built in memory, then written atomically.  Everything is
 * written in flow style, one op per line, in the program's order: the
 * format is the model format (docs/format.md) plus the keys of its section
 * "Partitioned programs".  Names are written plain when YAML and the loader
 * read them back unchanged (`h%local` is a plain scalar), otherwise double
 * quoted; numbers in their shortest form that reads back exactly.
 *
 * Per-device files repeat the program with the facts of one device.  The
 * maps of collective_permutes (and their inverses) are computed once per
 * op, so each file costs the program's size plus its replica groups. */
#include "emit.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "load.h"
#include "ops.h"
#include "train_section.h"

/* ---- a growing text buffer ---- */

typedef struct {
	char *a;
	size_t n, cap;
} Buf;

static void put_raw(Buf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		b->cap = 2 * (b->n + n + 1) > 4096 ? 2 * (b->n + n + 1) : 4096;
		b->a = xrealloc(b->a, b->cap);
	}
	memcpy(b->a + b->n, s, n);
	b->n += n;
	b->a[b->n] = 0;
}

static void put(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Buf *b, const char *fmt, ...)
{
	char small[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof small, fmt, ap);
	va_end(ap);
	if (n < (int)sizeof small) {
		put_raw(b, small, (size_t)n);
		return;
	}
	char *big = xmalloc((size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	put_raw(b, big, (size_t)n);
	free(big);
}

/* ---- scalars ---- */

/* Words the loader reads as null or a boolean when written plain. */
static bool reserved_word(const char *s)
{
	static const char *const w[] = {"null", "Null", "NULL", "true", "True", "TRUE", "false", "False", "FALSE"};
	for (size_t i = 0; i < sizeof w / sizeof *w; i++)
		if (!strcmp(s, w[i]))
			return true;
	return false;
}

/* [A-Za-z_][A-Za-z0-9_.%]*, not a reserved word: plain YAML in flow context. */
static bool plain_ok(const char *s)
{
	bool first = true;
	for (const char *p = s; *p; p++, first = false) {
		char c = *p;
		bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
		if (!letter && (first || !((c >= '0' && c <= '9') || c == '.' || c == '%')))
			return false;
	}
	return !first && !reserved_word(s);
}

/* Length (2..4) of the well-formed UTF-8 sequence at s and its code point, or 0. */
static int utf8_seq(const unsigned char *s, unsigned *cp)
{
	static const unsigned least[5] = {0, 0, 0x80, 0x800, 0x10000};
	int n = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 ? 2 : 0;
	unsigned c = s[0] & (0x7F >> n);
	for (int i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		c = c << 6 | (s[i] & 0x3F);
	}
	if (n == 0 || c < least[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
		return 0;
	*cp = c;
	return n;
}

/* A double-quoted scalar: printable text as it is, the rest escaped (bytes
 * that are not UTF-8 become \xNN, the closest YAML has). */
static void put_quoted(Buf *b, const char *s)
{
	put_raw(b, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)s; *p;) {
		unsigned cp = 0;
		int n = *p >= 0x80 ? utf8_seq(p, &cp) : 0;
		if (*p == '"' || *p == '\\')
			put(b, "\\%c", *p);
		else if (*p >= 0x20 && *p < 0x7F)
			put_raw(b, (const char *)p, 1);
		else if (n && cp >= 0xA0 && cp != 0xFEFF && cp != 0xFFFE && cp != 0xFFFF)
			put_raw(b, (const char *)p, (size_t)n);
		else if (n)
			put(b, cp < 0x10000 ? "\\u%04X" : "\\U%08X", cp);
		else
			put(b, "\\x%02X", *p);
		p += n ? n : 1;
	}
	put_raw(b, "\"", 1);
}

/* A name or other string: plain when it reads back unchanged. */
static void put_str(Buf *b, const char *s)
{
	if (plain_ok(s))
		put_raw(b, s, strlen(s));
	else
		put_quoted(b, s);
}

/* A number in the shortest form that reads back to the same double. */
static void put_num(Buf *b, double x)
{
	if (isnan(x) || isinf(x)) {
		put(b, "%s", isnan(x) ? ".nan" : x < 0 ? "-.inf" : ".inf");
		return;
	}
	if (x == 0) {
		put(b, "%s", signbit(x) ? "-0.0" : "0");
		return;
	}
	char s[40];
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(s, sizeof s, "%.*g", prec, x);
		if (strtod(s, NULL) == x)
			break;
	}
	put(b, "%s", s);
}

static void put_i64s(Buf *b, const int64_t *v, int n)
{
	put_raw(b, "[", 1);
	for (int i = 0; i < n; i++)
		put(b, "%s%lld", i ? ", " : "", (long long)v[i]);
	put_raw(b, "]", 1);
}

static void put_ints(Buf *b, const int *v, int n)
{
	put_raw(b, "[", 1);
	for (int i = 0; i < n; i++)
		put(b, "%s%d", i ? ", " : "", v[i]);
	put_raw(b, "]", 1);
}

static void put_shape(Buf *b, const Shape *s) { put_i64s(b, s->dim, s->rank); }

/* ---- shardings and the mesh ---- */

/* [data, model:(1)4]: pieces of one axis joined (mesh_run_name) */
static void put_axes(Buf *b, const Mesh *m, const uint8_t *ax, int n)
{
	put_raw(b, "[", 1);
	for (int i = 0; i < n;) {
		char name[128];
		put(b, "%s", i ? ", " : "");
		i += mesh_run_name(m, ax + i, n - i, name, sizeof name);
		put_raw(b, name, strlen(name)); /* an identifier, or one with :(P)S: plain YAML */
	}
	put_raw(b, "]", 1);
}

/* The sharding as spec_format writes it (and spec_parse reads it back). */
static void put_spec(Buf *b, const Spec *s, const Mesh *m)
{
	char text[4096];
	spec_format(s, m, text, sizeof text);
	put_raw(b, text, strlen(text));
}

/* The short form, or the long one when there is a device order or hardware. */
static void put_mesh(Buf *b, const Mesh *m)
{
	bool full = m->devices || m->hardware;
	if (!m->naxes)
		return;
	put(b, "mesh: %s{", full ? "{axes: " : "");
	for (int a = 0, r, size; a < m->naxes; a += r) { /* as written: a cut axis whole (its pieces are named where used) */
		char name[128];
		r = mesh_written_axis(m, a, name, sizeof name, &size);
		put(b, "%s", a ? ", " : "");
		put_str(b, name);
		put(b, ": %d", size);
	}
	put(b, "}");
	if (m->devices) {
		put(b, ", devices: ");
		put_ints(b, m->devices, m->ndev);
	}
	if (m->hardware) {
		put(b, ", hardware: ");
		put_str(b, m->hardware);
	}
	put(b, "%s\n", full ? "}" : "");
}

/* ---- the emitter ---- */

typedef struct {
	int *target;   /* device d sends to target[d] (-1: nobody) */
	int *source;   /* device d receives from source[d] (-1: nobody) */
	bool is_shift; /* target is a shift along cax[0] ... */
	int64_t shift; /* ... by this much */
} Permute;

typedef struct {
	const Graph *g;
	Buf b;
	int device;    /* -1: the shared program; else the device whose file this is */
	Permute *perm; /* per op: filled for collective_permutes */
	int *group;    /* ndev entries: scratch for replica groups */
	Diag *d;
} Emit;

void emit_block(const Spec *s, const Mesh *m, const Shape *local, const Shape *global, int device, int64_t *offset,
                int64_t *extent)
{
	int64_t index[MAX_RANK] = {0};
	spec_shard_index(s, m, device, index);
	for (int d = 0; d < local->rank; d++) {
		int64_t off = index[d] * local->dim[d], e = global->dim[d] - off;
		offset[d] = off;
		extent[d] = e < 0 ? 0 : e > local->dim[d] ? local->dim[d] : e;
	}
}

void emit_permute_targets(const Mesh *m, const Attr *at, int *target)
{
	if (at->target)
		memcpy(target, at->target, sizeof(int) * (size_t)m->ndev);
	else if (m->naxes && at->ncax >= 1)
		mesh_shift_targets(m, at->cax[0], at->shift, target);
	else
		for (int dev = 0; dev < m->ndev; dev++)
			target[dev] = dev;
}

/* Is the map p->target a shift along the op's one axis?  Sets is_shift and shift. */
static void permute_find_shift(const Mesh *m, const Attr *at, Permute *p)
{
	p->is_shift = !at->target && at->ncax == 1;
	p->shift = at->shift;
	if (at->target == NULL || at->ncax != 1 || p->target[0] < 0)
		return;
	int a = at->cax[0], c0[MESH_MAX_AXES] = {0}, c1[MESH_MAX_AXES] = {0};
	mesh_device_coords(m, 0, c0);
	mesh_device_coords(m, p->target[0], c1);
	int64_t shift = ((c1[a] - c0[a]) % m->size[a] + m->size[a]) % m->size[a];
	int *t = xmalloc(sizeof(int) * (size_t)m->ndev);
	mesh_shift_targets(m, a, shift, t);
	p->is_shift = memcmp(t, p->target, sizeof(int) * (size_t)m->ndev) == 0;
	p->shift = shift;
	free(t);
}

/* The maps of every collective_permute: once per program, not per device. */
static void emit_init(Emit *e, const Graph *g, Diag *d)
{
	int ndev = g->mesh.ndev;
	*e = (Emit){.g = g, .device = -1, .d = d};
	e->perm = xcalloc((size_t)g->ops.n + 1, sizeof *e->perm);
	e->group = xmalloc(sizeof(int) * (size_t)ndev);
	for (int i = 0; i < g->ops.n; i++) {
		const Op *op = &g->ops.a[i];
		if (op->kind != OP_COLLECTIVE_PERMUTE)
			continue;
		Permute *p = &e->perm[i];
		p->target = xmalloc(sizeof(int) * (size_t)ndev);
		p->source = xmalloc(sizeof(int) * (size_t)ndev);
		emit_permute_targets(&g->mesh, op->attr, p->target);
		for (int dev = 0; dev < ndev; dev++)
			p->source[dev] = -1;
		for (int dev = 0; dev < ndev; dev++)
			if (p->target[dev] >= 0 && p->target[dev] < ndev)
				p->source[p->target[dev]] = dev;
		permute_find_shift(&g->mesh, op->attr, p);
	}
}

static void emit_free(Emit *e)
{
	for (int i = 0; i < e->g->ops.n; i++)
		free(e->perm[i].target), free(e->perm[i].source);
	free(e->perm), free(e->group), free(e->b.a);
}

/* ---- inputs and params ---- */

static void put_init(Buf *b, const Init *in)
{
	switch (in->kind) {
	case INIT_NORMAL: put(b, ", init: {normal: "), put_num(b, in->a), put(b, "}"); break;
	case INIT_UNIFORM:
		put(b, ", init: {uniform: ["), put_num(b, in->a), put(b, ", "), put_num(b, in->b), put(b, "]}");
		break;
	case INIT_ZEROS: put(b, ", init: zeros"); break;
	case INIT_ONES: put(b, ", init: ones"); break;
	default: break;
	}
}

/* ", offset: [...], extent: [...]" of the block a device holds. */
static void put_block(Emit *e, const char *key, const Spec *s, const Shape *local, const Shape *global, bool extent)
{
	int64_t off[MAX_RANK], ext[MAX_RANK];
	emit_block(s, &e->g->mesh, local, global, e->device, off, ext);
	put(&e->b, ", %s: ", key);
	put_i64s(&e->b, off, local->rank);
	if (extent) {
		put(&e->b, ", extent: ");
		put_i64s(&e->b, ext, local->rank);
	}
}

static void put_leaf(Emit *e, const Value *v)
{
	Buf *b = &e->b;
	put(b, "  ");
	put_str(b, v->name);
	put(b, ": {shape: ");
	put_shape(b, &v->shape);
	put(b, ", global: ");
	put_shape(b, &v->global);
	put(b, ", dtype: %s, sharding: ", dtype_names[v->dtype]);
	put_spec(b, &v->spec, &e->g->mesh);
	if (v->kind == VK_PARAM)
		put_init(b, &v->init);
	if (v->kind == VK_STATE) /* optimizer state starts at zero (runtime/data.c) */
		put_init(b, &(Init){v->init.kind == INIT_DEFAULT ? INIT_ZEROS : v->init.kind, v->init.a, v->init.b});
	if (e->device >= 0)
		put_block(e, "offset", &v->spec, &v->shape, &v->global, true);
	put(b, "}\n");
}

/* The inputs (kind VK_INPUT), params or state section. */
static void put_leaves(Emit *e, ValueKind kind)
{
	const Graph *g = e->g;
	int n = 0;
	for (int v = 0; v < g->values.n; v++)
		n += g->values.a[v].producer < 0 && g->values.a[v].kind == kind;
	if (n == 0 && kind != VK_INPUT)
		return;
	put(&e->b, "%s:%s\n", kind == VK_PARAM ? "params" : kind == VK_STATE ? "state" : "inputs", n ? "" : " {}");
	for (int v = 0; v < g->values.n; v++)
		if (g->values.a[v].producer < 0 && g->values.a[v].kind == kind)
			put_leaf(e, &g->values.a[v]);
}

/* ---- ops ---- */

/* A constant as the number it holds once made in its dtype. */
static double const_value(const Value *v)
{
	if (v->dtype == DT_BF16)
		return round_bf16((float)v->cval);
	if (v->dtype == DT_F16)
		return round_f16((float)v->cval);
	return v->cval;
}

static void put_operands(Emit *e, const Op *op)
{
	put(&e->b, ", in: [");
	for (int i = 0; i < op->nin; i++) {
		const Value *v = &e->g->values.a[op->in[i]];
		put(&e->b, "%s", i ? ", " : "");
		if (v->kind == VK_CONST)
			put_num(&e->b, const_value(v));
		else
			put_str(&e->b, v->name);
	}
	put(&e->b, "]");
}

static void put_permute(Emit *e, const Op *op, int i)
{
	const Permute *p = &e->perm[i];
	if (p->is_shift) {
		put(&e->b, ", shift: %lld", (long long)p->shift);
		return;
	}
	put(&e->b, ", targets: [");
	for (int dev = 0, first = 1; dev < e->g->mesh.ndev; dev++)
		if (p->target[dev] != dev) {
			put(&e->b, "%s[%d, %d]", first ? "" : ", ", dev, p->target[dev]);
			first = 0;
		}
	put(&e->b, "]");
}

/* axes: the mesh axes of a collective or a shard_roll, major to minor. */
static void put_cax(Emit *e, const Attr *a)
{
	uint8_t ax[MESH_MAX_AXES];
	for (int k = 0; k < a->ncax && k < MESH_MAX_AXES; k++)
		ax[k] = (uint8_t)a->cax[k];
	put(&e->b, ", axes: ");
	put_axes(&e->b, &e->g->mesh, ax, a->ncax);
}

static void put_collective(Emit *e, const Op *op, int i)
{
	const Attr *a = op->attr;
	put_cax(e, a);
	if (op->kind == OP_ALL_REDUCE || op->kind == OP_REDUCE_SCATTER)
		put(&e->b, ", reduce: %s", a->reduce == REDUCE_MAX ? "max" : "sum");
	if (op->kind == OP_REDUCE_SCATTER || op->kind == OP_ALL_GATHER)
		put(&e->b, ", dim: %d", a->dim);
	if (op->kind == OP_ALL_TO_ALL)
		put(&e->b, ", split_dim: %d, concat_dim: %d", a->dim, a->dim2);
	if (op->kind == OP_COLLECTIVE_PERMUTE)
		put_permute(e, op, i);
}

static void put_conv(Buf *b, const Attr *a)
{
	put(b, ", strides: [%d, %d], padding: ", a->strides[0], a->strides[1]);
	if (a->pad_mode == CONV_PAD_VALID)
		put(b, "valid");
	else
		put(b, "[[%lld, %lld], [%lld, %lld]]", (long long)a->padding[0][0], (long long)a->padding[0][1],
		    (long long)a->padding[1][0], (long long)a->padding[1][1]);
}

/* The op's attributes, in the keys the loader reads (attr_keys).  false
 * if the op has attributes this writer does not know. */
static bool put_attrs(Emit *e, const Op *op, int i)
{
	const Attr *a = op->attr;
	Buf *b = &e->b;
	int rank = e->g->values.a[op->in[0]].shape.rank;
	switch (op->kind) {
	case OP_EINSUM: put(b, ", eq: "), put_quoted(b, a->eq); break;
	case OP_REDUCE_SUM: case OP_REDUCE_MAX: case OP_REDUCE_MEAN:
		put(b, ", axes: "), put_ints(b, a->axes, a->naxes);
		put(b, "%s", a->keepdims ? ", keepdims: true" : "");
		break;
	case OP_SOFTMAX: case OP_LOG_SOFTMAX: put(b, ", axis: %d", a->axes[0]); break;
	case OP_LAYER_NORM: put(b, ", axis: %d, eps: ", a->axes[0]), put_num(b, a->eps); break;
	case OP_TRANSPOSE: put(b, ", perm: "), put_ints(b, a->axes, a->naxes); break;
	case OP_RESHAPE: case OP_BROADCAST_TO: put(b, ", shape: "), put_shape(b, &a->shape); break;
	case OP_SLICE:
		put(b, ", start: "), put_i64s(b, a->start, rank), put(b, ", limit: "), put_i64s(b, a->limit, rank);
		put(b, ", stride: "), put_i64s(b, a->stride, rank);
		break;
	case OP_CONCAT: put(b, ", axis: %d", a->axis); break;
	case OP_PAD:
		put(b, ", low: "), put_i64s(b, a->start, rank), put(b, ", high: "), put_i64s(b, a->limit, rank);
		put(b, ", value: "), put_num(b, a->value);
		break;
	case OP_CONV2D: put_conv(b, a); break;
	case OP_CONV2D_GRAD_INPUT: case OP_CONV2D_GRAD_FILTER: /* attr_conv2d_grad's keys */
		put(b, op->kind == OP_CONV2D_GRAD_INPUT ? ", input_size: " : ", kernel_size: ");
		put_shape(b, &a->shape), put_conv(b, a);
		break;
	case OP_TAKE_GRAD: case OP_TAKE_GRAD_SHARD: put(b, ", num_rows: %lld", (long long)a->depth); break;
	case OP_SOFTMAX_CROSS_ENTROPY: case OP_SOFTMAX_CROSS_ENTROPY_GRAD: case OP_MSE: case OP_XENT_GRAD_SHARD:
		put(b, ", count: "), put_num(b, a->value);
		break;
	case OP_TAKE_SHARD: break; /* its table's layout and global shape */
	case OP_ONE_HOT: put(b, ", depth: %lld", (long long)a->depth); break;
	case OP_ONE_HOT_SHARD: put(b, ", depth: %lld%s", (long long)a->depth, a->value != 0 ? ", labels: true" : ""); break;
	case OP_CAST: put(b, ", dtype: %s", dtype_names[a->dtype]); break;
	case OP_SHARD_SLICE:
		put(b, ", from: "), put_spec(b, &a->spec_from, &e->g->mesh);
		put(b, ", to: "), put_spec(b, &a->spec, &e->g->mesh), put(b, ", shape: "), put_shape(b, &a->shape);
		break;
	case OP_MASK: put(b, ", value: "), put_num(b, a->value); break;
	case OP_SHARD_ROLL: put_cax(e, a), put(b, ", dim: %d, shift: %lld", a->dim, (long long)a->shift); break;
	default:
		if (op_table[op->kind].flags & OPF_COLLECTIVE)
			put_collective(e, op, i);
		else
			return attr_keys(op->kind)[0] == NULL;
	}
	return true;
}

/* Members of a collective's replica groups. */
static int group_size(const Mesh *m, const Attr *a)
{
	int n = 1;
	for (int k = 0; k < a->ncax; k++)
		n *= m->size[a->cax[k]];
	return n;
}

/* The device's facts about op i: its replica group, its permute partners,
 * the block it keeps, or how far it rolls. */
static void put_facts(Emit *e, const Op *op, int i)
{
	const Graph *g = e->g;
	const Value *in = &g->values.a[op->in[0]], *out = &g->values.a[op->out];
	const Attr *a = op->attr;
	if (op->kind == OP_COLLECTIVE_PERMUTE) {
		put(&e->b, ", send_to: %d, recv_from: %d", e->perm[i].target[e->device], e->perm[i].source[e->device]);
	} else if (op_table[op->kind].flags & OPF_COLLECTIVE) {
		mesh_group(&g->mesh, e->device, a->cax, a->ncax, e->group);
		put(&e->b, ", group: ");
		put_ints(&e->b, e->group, group_size(&g->mesh, a));
	} else if (op->kind == OP_SHARD_SLICE) {
		put_block(e, "offset", &a->spec, &a->shape, &a->global, true);
		put_block(e, "from_offset", &a->spec_from, &in->shape, &a->global, false);
	} else if (op->kind == OP_MASK) {
		put_block(e, "offset", &a->spec, &out->shape, &a->global, true);
	} else if (op->kind == OP_SHARD_ROLL) {
		put(&e->b, ", roll: %lld", (long long)op_roll_elems(&g->mesh, a, &in->shape, e->device));
	}
}

/* shard_slice, mask, take_grad_shard and one_hot_shard carry their result's layout in
 * their attributes too, take_shard its table's: the file says it once, so
 * the two must agree.  0, or -1 after reporting. */
static int check_op(Emit *e, const Op *op)
{
	const Value *out = &e->g->values.a[op->out], *in = &e->g->values.a[op->in[0]];
	const Attr *a = op->attr;
	const Value *v = op->kind == OP_TAKE_SHARD ? in : out;
	if (op->kind != OP_SHARD_SLICE && op->kind != OP_MASK && op->kind != OP_TAKE_SHARD &&
	    op->kind != OP_TAKE_GRAD_SHARD && op->kind != OP_ONE_HOT_SHARD)
		return 0;
	bool ok = spec_eq(&a->spec, &v->spec) && shape_eq(&a->global, &v->global);
	if (op->kind == OP_SHARD_SLICE)
		ok = ok && shape_eq(&a->shape, &out->shape);
	if (!ok)
		diag_error(e->d, op->pos, "internal: the %s making '%s' disagrees with its result's sharding or shape",
		           op_table[op->kind].name, out->name);
	return ok ? 0 : -1;
}

/* One op's line.  0, or -1 after reporting an op this writer cannot write. */
static int put_op(Emit *e, int i)
{
	const Op *op = &e->g->ops.a[i];
	const Value *out = &e->g->values.a[op->out];
	Buf *b = &e->b;
	put(b, "  - {out: ");
	put_str(b, out->name);
	put(b, ", op: %s", op_table[op->kind].name);
	put_operands(e, op);
	if (!put_attrs(e, op, i)) {
		diag_error(e->d, op->pos, "internal: expected an op whose attributes can be written, found %s",
		           op_table[op->kind].name);
		return -1;
	}
	if (op->kind != OP_SHARD_SLICE) { /* its `to` says it */
		put(b, ", sharding: ");
		put_spec(b, &out->spec, &e->g->mesh);
	}
	put(b, ", global: ");
	put_shape(b, &out->global);
	if (op->stage >= 0 && op->stage_to >= 0)
		put(b, ", stage: [%d, %d]", op->stage, op->stage_to);
	else if (op->stage >= 0)
		put(b, ", stage: %d", op->stage);
	if (e->device >= 0)
		put_facts(e, op, i);
	if (op->why) {
		put(b, ", why: ");
		put_quoted(b, op->why);
	}
	put(b, "}\n");
	return 0;
}

/* A comment line: printable ASCII only, so that any file name is safe in it. */
static void put_comment(Buf *b, const char *text)
{
	put(b, "# ");
	for (const char *p = text; *p; p++)
		put(b, "%c", *p >= 0x20 && *p < 0x7F ? *p : '?');
	put(b, "\n");
}

static void put_header(Emit *e)
{
	const Graph *g = e->g;
	char line[512];
	snprintf(line, sizeof line, "SPMD program partitioned from %s by spmd partition: every device runs it.",
	         g->file ? g->file : "a model");
	put_comment(&e->b, line);
	put_comment(&e->b, "Shapes are per device; `global` is the whole tensor's shape, `sharding` its layout.");
	if (e->device >= 0) {
		snprintf(line, sizeof line, "Device %d's view: its replica groups, permute partners and block offsets.",
		         e->device);
		put_comment(&e->b, line);
	}
}

/* A training program's step: its loss, step count and carries (leaf: the
 * value that replaces it after each step, in the order of the outputs after
 * the loss). */
static void put_train(Emit *e)
{
	const Graph *g = e->g;
	const Train *t = g->train;
	if (!t || !t->built)
		return;
	put(&e->b, "train:\n  loss: ");
	put_str(&e->b, g->values.a[t->loss].name);
	put(&e->b, "\n  steps: %lld\n  carry:%s\n", (long long)t->steps, t->ncarry ? "" : " {}");
	for (int i = 0; i < t->ncarry; i++) {
		put(&e->b, "    ");
		put_str(&e->b, g->values.a[t->carry_to[i]].name);
		put(&e->b, ": ");
		put_str(&e->b, g->values.a[t->carry_from[i]].name);
		put(&e->b, "\n");
	}
}

/* The whole text into e->b.  0, or -1 after reporting. */
static int put_program(Emit *e)
{
	const Graph *g = e->g;
	Buf *b = &e->b;
	int rc = 0;
	b->n = 0;
	put_header(e);
	put(b, "spmd: true\n");
	if (e->device >= 0)
		put(b, "device: %d\n", e->device);
	if (g->name)
		put(b, "name: "), put_str(b, g->name), put(b, "\n");
	put_mesh(b, &g->mesh);
	if (g->stage_axis >= 0) /* a pipeline: each op runs on the devices of its stage */
		put(b, "stages: "), put_str(b, g->mesh.name[g->stage_axis]), put(b, "\n");
	put_leaves(e, VK_INPUT);
	put_leaves(e, VK_PARAM);
	put_leaves(e, VK_STATE);
	put(b, "ops:%s\n", g->ops.n ? "" : " []");
	for (int i = 0; i < g->ops.n; i++) {
		rc |= check_op(e, &g->ops.a[i]);
		rc |= put_op(e, i);
	}
	put(b, "outputs: [");
	for (int i = 0; i < g->outputs.n; i++)
		put(b, "%s", i ? ", " : ""), put_str(b, g->values.a[g->outputs.a[i]].name);
	put(b, "]\n");
	put_train(e);
	return rc;
}

/* Only inputs, params, constants and op results can be written, and the
 * optimizer state of a training program. */
static int check_leaves(const Graph *g, Diag *d)
{
	for (int v = 0; v < g->values.n; v++)
		if (g->values.a[v].kind == VK_STATE && !(g->train && g->train->built)) {
			diag_error(d, g->values.a[v].pos, "expected inputs and params in a program to write, found the "
			           "optimizer state '%s'", g->values.a[v].name);
			return -1;
		}
	return 0;
}

char *emit_text(const Graph *prog, int device, size_t *n)
{
	Emit e;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	emit_init(&e, prog, &d);
	e.device = device;
	put_program(&e);
	char *text = e.b.a;
	*n = e.b.n;
	e.b.a = NULL;
	emit_free(&e);
	return text;
}

static int write_text(const char *path, const Buf *b, Diag *d)
{
	if (file_write_atomic(path, b->a, b->n) == 0)
		return 0;
	diag_usage(d, "cannot write %s: %s", path, strerror(errno));
	return -1;
}

int emit_program(const Graph *prog, const char *path, Diag *d)
{
	if (check_leaves(prog, d) != 0)
		return -1;
	Emit e;
	emit_init(&e, prog, d);
	int rc = put_program(&e);
	if (rc == 0)
		rc = write_text(path, &e.b, d);
	emit_free(&e);
	return rc;
}

/* ---- per-device files ---- */

/* Is name one of our files: device_N.yaml, or what an interrupted write
 * left (device_N.yaml.tmp.PID)?  *dev gets N for the exact name
 * device_N.yaml (no leading zeros), else -1. */
static bool device_file(const char *name, long *dev)
{
	const char *p = name + 7;
	*dev = -1;
	if (strncmp(name, "device_", 7) != 0 || *p < '0' || *p > '9')
		return false;
	char *end;
	long n = strtol(p, &end, 10);
	if (strncmp(end, ".yaml", 5) != 0)
		return false;
	bool canonical = (p[0] != '0' || end == p + 1) && end - p < 9;
	if (end[5] == 0) {
		*dev = canonical ? n : -1;
		return true;
	}
	return strncmp(end + 5, ".tmp.", 5) == 0;
}

/* Check that dir holds nothing but our files (remove false), or remove
 * those that are not device_N.yaml for N < ndev (remove true).  0 or -1. */
static int dir_sweep(const char *dir, int ndev, bool remove, Diag *d)
{
	DIR *dp = opendir(dir);
	if (!dp) {
		diag_usage(d, "cannot read directory %s: %s", dir, strerror(errno));
		return -1;
	}
	int rc = 0;
	struct dirent *de;
	while ((de = readdir(dp)) && rc == 0) {
		long dev;
		const char *name = de->d_name;
		if (!strcmp(name, ".") || !strcmp(name, ".."))
			continue;
		bool ours = device_file(name, &dev);
		if (!ours && !remove) {
			diag_usage(d, "expected a directory holding only device_N.yaml files for --per-device, found '%s' in %s",
			           name, dir);
			rc = -1;
		} else if (ours && remove && (dev < 0 || dev >= ndev)) {
			size_t len = strlen(dir) + strlen(name) + 2;
			char *path = xmalloc(len);
			snprintf(path, len, "%s/%s", dir, name);
			if (unlink(path) != 0 && errno != ENOENT)
				diag_usage(d, "cannot remove %s: %s", path, strerror(errno)), rc = -1;
			free(path);
		}
	}
	closedir(dp);
	return rc;
}

int emit_devices(const Graph *prog, const char *dir, Diag *d)
{
	if (check_leaves(prog, d) != 0)
		return -1;
	if (dir_make(dir) != 0) {
		diag_usage(d, "expected a directory for --per-device, found '%s' (%s)", dir, strerror(errno));
		return -1;
	}
	if (dir_sweep(dir, prog->mesh.ndev, false, d) != 0)
		return -1;
	Emit e;
	emit_init(&e, prog, d);
	size_t len = strlen(dir) + 32;
	char *path = xmalloc(len);
	int rc = 0;
	for (int dev = 0; dev < prog->mesh.ndev && rc == 0; dev++) {
		e.device = dev;
		snprintf(path, len, "%s/device_%d.yaml", dir, dev);
		rc = put_program(&e);
		if (rc == 0)
			rc = write_text(path, &e.b, d);
	}
	free(path);
	emit_free(&e);
	return rc == 0 ? dir_sweep(dir, prog->mesh.ndev, true, d) : -1;
}
