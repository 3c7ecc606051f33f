/* spec.c: sharding specs — parsing, printing and tile math (shard shapes, offsets, uneven padding). */
#include "spec.h"
#include "../base/yaml.h"

#include <string.h>

/* ---- parsing ---- */

typedef struct {
	Spec *s;
	const Mesh *m;
	Diag *d;
	unsigned seen; /* axes named so far, in dims or partial */
	const AxisRules *rules; /* logical names, or NULL */
	const char *via[MESH_MAX_AXES]; /* the logical name that reached a seen axis, or NULL */
	const char *by[MESH_MAX_AXES];  /* the name written for a seen axis ("model", "model:(1)4") */
	int *priority; /* annotations: where `priority:` goes; NULL: the key is not allowed */
} Parser;

const AxisRule *axis_rules_find(const AxisRules *rules, const char *name)
{
	for (int i = 0; rules && i < rules->n; i++)
		if (!strcmp(rules->a[i].name, name))
			return &rules->a[i];
	return NULL;
}

/* "data, model" for messages: the axes as written, pieces joined. */
static void axis_list(const Mesh *m, char *buf, size_t n)
{
	size_t k = 0;
	buf[0] = 0;
	for (int a = 0, r, size; a < m->naxes && k < n; a += r) {
		char name[128];
		r = mesh_written_axis(m, a, name, sizeof name, &size);
		k += (size_t)snprintf(buf + k, n - k, "%s%s", a ? ", " : "", name);
	}
}

static int expected_axis(Parser *p, const YNode *n)
{
	char axes[256], found[128];
	axis_list(p->m, axes, sizeof axes);
	ynode_describe(n, found, sizeof found);
	if (p->m->naxes == 0)
		diag_error(p->d, n->pos, "expected no sharding (the model has no mesh), found %s", found);
	else
		diag_error(p->d, n->pos, "expected a mesh axis (one of %s)%s, found %s", axes,
		           p->rules && p->rules->n ? " or a logical axis of axis_rules" : "", found);
	return -1;
}

/* Mark axis a seen (written n->str, reached through logical name via, or
 * NULL); -1 after reporting if it was seen before. */
static int see_axis(Parser *p, const YNode *n, int a, const char *via)
{
	if (!(p->seen >> a & 1)) {
		p->seen |= 1u << a;
		p->via[a] = via;
		p->by[a] = n->str;
		return 0;
	}
	bool sub = strchr(n->str, ':') || strchr(p->by[a], ':'), same = !strcmp(p->by[a], n->str);
	if (sub && !same) {
		diag_error(p->d, n->pos, "expected sub-axes of '%s' that do not overlap, found '%s' overlapping '%s'",
		           p->m->base[a], n->str, p->by[a]);
		return -1;
	}
	const char *name = sub ? n->str : p->m->pre[a] ? p->m->base[a] : p->m->name[a];
	const char *was = p->via[a], *one = via ? via : was;
	char how[160] = "";
	if (via && was)
		snprintf(how, sizeof how, " (through logical axes '%s' and '%s')", was, via);
	else if (one)
		snprintf(how, sizeof how, " (once through logical axis '%s')", one);
	diag_error(p->d, n->pos, "expected each mesh axis at most once, found '%s' twice%s", name, how);
	return -1;
}

/* A sub-axis that is not one: sizes that do not fit, or cuts that do not nest. */
static int bad_sub(Parser *p, const YNode *n, int why)
{
	size_t len;
	int64_t pre, size;
	mesh_sub_form(n->str, &len, &pre, &size);
	uint8_t ax[MESH_MAX_AXES];
	char base[128], cuts[256];
	snprintf(base, sizeof base, "%.*s", (int)len, n->str);
	int k = mesh_resolve(p->m, base, ax), whole = 1;
	for (int i = 0; i < k; i++)
		whole *= p->m->size[ax[i]];
	if (why == MESH_BAD_SUB && size < 2)
		diag_error(p->d, n->pos, "expected a sub-axis of size at least 2, found '%s'", n->str);
	else if (why == MESH_BAD_SUB)
		diag_error(p->d, n->pos, "expected a sub-axis %s:(P)S of '%s' (size %d) with P*S dividing %d, found '%s'",
		           base, base, whole, whole, n->str);
	else if (p->m->naxes == MESH_MAX_AXES)
		diag_error(p->d, n->pos, "expected at most %d mesh axes counting the pieces sub-axes cut them into, found "
		           "'%s', which needs another cut of '%s'", MESH_MAX_AXES, n->str, base);
	else {
		size_t w = 0;
		cuts[0] = 0;
		for (int i = 0; i < k && w < sizeof cuts; i++)
			w += (size_t)snprintf(cuts + w, sizeof cuts - w, "%s%s", i ? ", " : "", p->m->name[ax[i]]);
		diag_error(p->d, n->pos, "expected a sub-axis made of the pieces the other sub-axes cut '%s' into (%s), found '%s'",
		           base, cuts, n->str);
	}
	return -1;
}

/* axes: a scalar naming a mesh axis, or a logical axis standing for mesh
 * axes; each not named before.  The count (0 when a logical name resolves
 * to none) with the axes in out[], or -1. */
static int parse_axes(Parser *p, const YNode *n, uint8_t *out)
{
	int k = n->kind == YN_SCALAR && !ynode_is_null(n) ? mesh_resolve(p->m, n->str, out) : MESH_UNKNOWN;
	if (k > 0) {
		for (int i = 0; i < k; i++)
			if (see_axis(p, n, out[i], NULL) != 0)
				return -1;
		return k;
	}
	if (k != MESH_UNKNOWN)
		return bad_sub(p, n, k);
	const AxisRule *r = n->kind == YN_SCALAR && !ynode_is_null(n) ? axis_rules_find(p->rules, n->str) : NULL;
	if (!r)
		return expected_axis(p, n);
	for (int i = 0; i < r->n; i++) {
		if (see_axis(p, n, r->axes[i], r->name) != 0)
			return -1;
		out[i] = r->axes[i];
	}
	return r->n;
}

static bool is_open_mark(const YNode *n)
{
	return n->kind == YN_SCALAR && (!strcmp(n->str, "_") || !strcmp(n->str, "?"));
}

/* Append the axes n names to dim's list.  0, or -1 after reporting. */
static int add_axes(Parser *p, const YNode *n, int dim)
{
	uint8_t ax[MESH_MAX_AXES];
	int k = parse_axes(p, n, ax);
	for (int i = 0; i < k; i++)
		p->s->ax[dim][p->s->nax[dim]++] = ax[i];
	return k < 0 ? -1 : 0;
}

/* dim: null | _ | ? | axis | [axis, ..., (_)?] */
static int parse_dim(Parser *p, const YNode *n, int dim)
{
	Spec *s = p->s;
	if (ynode_is_null(n))
		return 0;
	if (is_open_mark(n)) {
		s->open |= (uint8_t)(1u << dim);
		return 0;
	}
	if (n->kind != YN_SEQ)
		return add_axes(p, n, dim);
	int err = 0;
	for (int i = 0; i < n->n; i++) {
		const YNode *it = n->items[i];
		if (is_open_mark(it) && i == n->n - 1) {
			s->open |= (uint8_t)(1u << dim);
			continue;
		}
		if (add_axes(p, it, dim) != 0)
			err = -1;
	}
	return err;
}

/* dims: [dim, ...] with exactly rank entries */
static int parse_dims(Parser *p, const YNode *n, int rank)
{
	char found[128];
	if (n->kind != YN_SEQ) {
		ynode_describe(n, found, sizeof found);
		diag_error(p->d, n->pos, "expected a list with one entry per dimension, found %s", found);
		return -1;
	}
	if (n->n != rank) {
		diag_error(p->d, n->pos, "expected %d entr%s (one per dimension), found %d", rank,
		           rank == 1 ? "y" : "ies", n->n);
		return -1;
	}
	int err = 0;
	for (int i = 0; i < n->n; i++)
		if (parse_dim(p, n->items[i], i) != 0)
			err = -1;
	return err;
}

/* partial axis: an axis (or a logical axis: its axes) that splits no dimension. */
static int parse_partial_axis(Parser *p, const YNode *n, unsigned dims)
{
	uint8_t pieces[MESH_MAX_AXES];
	int np = n->kind == YN_SCALAR && !ynode_is_null(n) ? mesh_resolve(p->m, n->str, pieces) : 0;
	unsigned mask = 0;
	for (int i = 0; i < np; i++)
		mask |= 1u << pieces[i];
	if (mask & dims) {
		diag_error(p->d, n->pos,
		           "expected partial axes that split no dimension, found a partial axis also used on a dimension ('%s')",
		           n->str);
		return -1;
	}
	uint8_t ax[MESH_MAX_AXES];
	int k = parse_axes(p, n, ax);
	for (int i = 0; i < k; i++)
		p->s->partial |= (uint8_t)(1u << ax[i]);
	return k < 0 ? -1 : 0;
}

static int parse_reduce(Parser *p, const YNode *n)
{
	char found[128];
	if (n->kind == YN_SCALAR && !strcmp(n->str, "sum"))
		p->s->reduce = REDUCE_SUM;
	else if (n->kind == YN_SCALAR && !strcmp(n->str, "max"))
		p->s->reduce = REDUCE_MAX;
	else {
		ynode_describe(n, found, sizeof found);
		diag_error(p->d, n->pos, "expected a reduction (sum or max), found %s", found);
		return -1;
	}
	return 0;
}

/* partial: axis | [axis, ...] | {axes: axis | [axis, ...], reduce: sum | max} */
static int parse_partial(Parser *p, const YNode *n)
{
	unsigned dims = p->seen;
	if (n->kind == YN_MAP) {
		char found[128];
		int err = 0;
		for (int i = 0; i < n->n; i++) {
			const char *k = n->keys[i]->str;
			if (!strcmp(k, "reduce"))
				err |= parse_reduce(p, n->items[i]);
			else if (strcmp(k, "axes") != 0) {
				ynode_describe(n->keys[i], found, sizeof found);
				diag_error(p->d, n->keys[i]->pos, "expected a partial key (axes or reduce), found %s", found);
				err = -1;
			}
		}
		const YNode *axes = ynode_get(n, "axes");
		if (!axes) {
			diag_error(p->d, n->pos, "expected the partial axes (axes: [...]), found none");
			return -1;
		}
		return parse_partial(p, axes) | err;
	}
	if (n->kind != YN_SEQ)
		return parse_partial_axis(p, n, dims);
	int err = 0;
	for (int i = 0; i < n->n; i++)
		err |= parse_partial_axis(p, n->items[i], dims);
	return err;
}

/* priority: N, 0 <= N <= SPEC_MAX_PRIORITY */
static int parse_priority(Parser *p, const YNode *n)
{
	int64_t v;
	if (ynode_int(n, &v, p->d) != 0)
		return -1;
	if (v < 0 || v > SPEC_MAX_PRIORITY) {
		diag_error(p->d, n->pos, "expected a priority from 0 to %d, found %lld", SPEC_MAX_PRIORITY, (long long)v);
		return -1;
	}
	*p->priority = (int)v;
	return 0;
}

/* {dims: [...], partial: ..., priority: N} (priority in annotations only) */
static int parse_map(Parser *p, const YNode *n, int rank)
{
	char found[128];
	int err = 0;
	for (int i = 0; i < n->n; i++) {
		const char *k = n->keys[i]->str;
		if (p->priority && !strcmp(k, "priority"))
			err |= parse_priority(p, n->items[i]);
		else if (strcmp(k, "dims") != 0 && strcmp(k, "partial") != 0) {
			ynode_describe(n->keys[i], found, sizeof found);
			diag_error(p->d, n->keys[i]->pos, "expected a sharding key (%s), found %s",
			           p->priority ? "dims, partial or priority" : "dims or partial", found);
			err = -1;
		}
	}
	const YNode *dims = ynode_get(n, "dims"), *partial = ynode_get(n, "partial");
	if (dims)
		err |= parse_dims(p, dims, rank);
	else if (rank > 0) {
		diag_error(p->d, n->pos, "expected dims (one entry per dimension) in the sharding, found none");
		err = -1;
	}
	if (partial && !ynode_is_null(partial))
		err |= parse_partial(p, partial);
	return err;
}

int spec_parse(Spec *s, const YNode *n, const Mesh *m, int rank, Diag *d)
{
	return spec_parse_rules(s, n, m, NULL, rank, d);
}

int spec_parse_rules(Spec *s, const YNode *n, const Mesh *m, const AxisRules *rules, int rank, Diag *d)
{
	return spec_parse_annotation(s, NULL, n, m, rules, rank, d);
}

int spec_parse_annotation(Spec *s, int *priority, const YNode *n, const Mesh *m, const AxisRules *rules, int rank,
                          Diag *d)
{
	if (priority)
		*priority = 0;
	if (!n) {
		diag_error(d, (Pos){0}, "expected a sharding, found nothing");
		return -1;
	}
	if (rank < 0 || rank > MAX_RANK) {
		diag_error(d, n->pos, "expected a tensor of rank at most %d, found rank %d", MAX_RANK, rank);
		return -1;
	}
	memset(s, 0, sizeof *s);
	s->rank = (uint8_t)rank;
	Parser p = {.s = s, .m = m, .d = d, .rules = rules, .priority = priority};
	int err;
	if (n->kind == YN_SEQ)
		err = parse_dims(&p, n, rank);
	else if (n->kind == YN_MAP)
		err = parse_map(&p, n, rank);
	else {
		char found[128];
		ynode_describe(n, found, sizeof found);
		diag_error(d, n->pos, "expected a sharding (a list with one entry per dimension, or {dims: ..., partial: ...}), found %s",
		           found);
		err = -1;
	}
	if (!s->partial)
		s->reduce = REDUCE_SUM;
	return err ? -1 : 0;
}

/* ---- printing ---- */

typedef struct {
	char *buf;
	size_t n, k;
} Out;

static void put(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Out *o, const char *fmt, ...)
{
	if (o->k >= o->n)
		return;
	va_list ap;
	va_start(ap, fmt);
	int w = vsnprintf(o->buf + o->k, o->n - o->k, fmt, ap);
	va_end(ap);
	o->k = w < 0 ? o->n : o->k + (size_t)w;
}

/* Append a string: the common case, without a format to parse. */
static void put_str(Out *o, const char *str)
{
	size_t len = strlen(str);
	if (o->k + len >= o->n) {
		put(o, "%s", str);
		return;
	}
	memcpy(o->buf + o->k, str, len + 1);
	o->k += len;
}

/* The names of ax[0..n), pieces of one axis joined ("model" for all of
 * model's pieces in order), into names[]; their count. */
static int run_names(const Mesh *m, const uint8_t *ax, int n, char names[][128])
{
	int k = 0;
	for (int i = 0; i < n; k++)
		i += mesh_run_name(m, ax + i, n - i, names[k], sizeof names[k]);
	return k;
}

static void put_dim(Out *o, const Spec *s, const Mesh *m, int d)
{
	bool open = s->open >> d & 1;
	char names[MESH_MAX_AXES][128];
	int n = run_names(m, s->ax[d], s->nax[d], names);
	if (n == 0) {
		put_str(o, open ? "_" : "null");
		return;
	}
	if (n == 1 && !open) {
		put_str(o, names[0]);
		return;
	}
	put_str(o, "[");
	for (int i = 0; i < n; i++)
		put_str(o, i ? ", " : ""), put_str(o, names[i]);
	put_str(o, open ? ", _]" : "]");
}

static void put_dims(Out *o, const Spec *s, const Mesh *m)
{
	put_str(o, "[");
	for (int d = 0; d < s->rank; d++) {
		put_str(o, d ? ", " : "");
		put_dim(o, s, m, d);
	}
	put_str(o, "]");
}

void spec_format(const Spec *s, const Mesh *m, char *buf, size_t n)
{
	Out o = {buf, n, 0};
	if (n)
		buf[0] = 0;
	if (!s->partial) {
		put_dims(&o, s, m);
		return;
	}
	put(&o, "{dims: ");
	put_dims(&o, s, m);
	put(&o, ", partial: %s", s->reduce == REDUCE_MAX ? "{axes: [" : "[");
	uint8_t ax[MESH_MAX_AXES];
	char names[MESH_MAX_AXES][128];
	int np = 0;
	for (int a = 0; a < m->naxes; a++)
		if (s->partial >> a & 1)
			ax[np++] = (uint8_t)a;
	np = run_names(m, ax, np, names);
	for (int i = 0; i < np; i++)
		put(&o, "%s%s", i ? ", " : "", names[i]);
	put(&o, "%s}", s->reduce == REDUCE_MAX ? "], reduce: max}" : "]");
}

/* ---- tile math ---- */

int64_t spec_dim_shards(const Spec *s, const Mesh *m, int d)
{
	int64_t n = 1;
	for (int i = 0; i < s->nax[d]; i++)
		n *= m->size[s->ax[d][i]];
	return n;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void spec_shard_shape(const Spec *s, const Mesh *m, const int64_t *global, int64_t *local)
{
	for (int d = 0; d < s->rank; d++)
		local[d] = ceil_div(global[d], spec_dim_shards(s, m, d));
}

void spec_shard_index(const Spec *s, const Mesh *m, int device, int64_t *index)
{
	int coord[MESH_MAX_AXES] = {0};
	mesh_device_coords(m, device, coord);
	for (int d = 0; d < s->rank; d++) {
		int64_t k = 0;
		for (int i = 0; i < s->nax[d]; i++) {
			int a = s->ax[d][i];
			k = k * m->size[a] + coord[a];
		}
		index[d] = k;
	}
}

void spec_shard_region(const Spec *s, const Mesh *m, const int64_t *global, int device, int64_t *offset,
                       int64_t *extent)
{
	int64_t index[MAX_RANK], local[MAX_RANK];
	spec_shard_index(s, m, device, index);
	spec_shard_shape(s, m, global, local);
	for (int d = 0; d < s->rank; d++) {
		int64_t off = index[d] * local[d], e = global[d] - off;
		offset[d] = off;
		extent[d] = e < 0 ? 0 : e > local[d] ? local[d] : e;
	}
}

int spec_partial_index(const Spec *s, const Mesh *m, int device)
{
	int coord[MESH_MAX_AXES] = {0}, k = 0;
	mesh_device_coords(m, device, coord);
	for (int a = 0; a < m->naxes; a++)
		if (s->partial >> a & 1)
			k = k * m->size[a] + coord[a];
	return k;
}

unsigned spec_dim_axes(const Spec *s)
{
	unsigned mask = 0;
	for (int d = 0; d < s->rank; d++)
		for (int i = 0; i < s->nax[d]; i++)
			mask |= 1u << s->ax[d][i];
	return mask;
}

bool spec_replicated_over(const Spec *s, int axis)
{
	return !((spec_dim_axes(s) | s->partial) >> axis & 1);
}

bool spec_eq(const Spec *a, const Spec *b)
{
	if (a->rank != b->rank || a->partial != b->partial || a->open != b->open)
		return false;
	if (a->partial && a->reduce != b->reduce)
		return false;
	for (int d = 0; d < a->rank; d++) {
		if (a->nax[d] != b->nax[d])
			return false;
		if (memcmp(a->ax[d], b->ax[d], a->nax[d]) != 0)
			return false;
	}
	return true;
}

bool spec_is_valid(const Spec *s, const Mesh *m)
{
	unsigned seen = 0;
	if (s->rank > MAX_RANK || (s->partial >> m->naxes) != 0 || s->reduce > REDUCE_MAX)
		return false;
	for (int d = 0; d < s->rank; d++)
		for (int i = 0; i < s->nax[d]; i++) {
			int a = s->ax[d][i];
			if (a >= m->naxes || (seen >> a & 1))
				return false;
			seen |= 1u << a;
		}
	return (seen & s->partial) == 0;
}

int spec_remap(Spec *s, const Mesh *from, const Mesh *to)
{
	Spec r = *s;
	uint8_t pieces[MESH_MAX_AXES];
	r.partial = 0;
	for (int d = 0; d < s->rank; d++) {
		r.nax[d] = 0;
		for (int i = 0; i < s->nax[d]; i++) {
			int n = mesh_pieces(to, from, s->ax[d][i], pieces);
			if (r.nax[d] + n > MESH_MAX_AXES)
				return -1;
			memcpy(r.ax[d] + r.nax[d], pieces, (size_t)n);
			r.nax[d] = (uint8_t)(r.nax[d] + n);
		}
	}
	for (int a = 0; a < from->naxes; a++)
		if (s->partial >> a & 1)
			for (int i = 0, n = mesh_pieces(to, from, a, pieces); i < n; i++)
				r.partial |= (uint8_t)(1u << pieces[i]);
	*s = r;
	return 0;
}

void spec_cut_mesh(Mesh *m, Arena *a, const YNode *n)
{
	if (!n)
		return;
	if (n->kind == YN_SCALAR && strchr(n->str, ':'))
		mesh_cut_name(m, a, n->str); /* a bad one is reported where it is parsed */
	for (int i = 0; (n->kind == YN_SEQ || n->kind == YN_MAP) && i < n->n; i++)
		spec_cut_mesh(m, a, n->items[i]);
}
