/* load.c: the model loader — a YAML tree to a checked Graph.
 *
 * One pass over the document in a fixed order (name, mesh, inputs, params,
 * ops, outputs), whatever order the file lists them in.  Names are looked up
 * in a hash table, so loading is linear in the size of the model.  Errors do
 * not stop the pass: an op that fails still defines its result name, marked
 * broken, so that its users are skipped quietly instead of each reporting
 * "undefined name"; the load then returns -1 and the graph is not used. */
#include "load.h"

#include "emit.h"
#include "train_section.h"
#include "pipeline_section.h"
#include "../base/yaml.h"

#include <math.h>
#include <string.h>

#define MAX_NUMEL ((int64_t)SHAPE_MAX_NUMEL) /* the enum constant is unsigned */

/* ---- a name table: name -> value id and where it was defined ---- */

enum { NAME_BROKEN = -2 }; /* defined by an entry that failed to load */

typedef struct {
	int id;  /* value id, or NAME_BROKEN */
	Pos pos; /* where it was defined */
} Name;

typedef struct {
	StrIndex at; /* name -> its entry in a */
	VEC(Name) a;
} NameTab;

static const Name *names_find(const NameTab *t, const char *name)
{
	int i = strindex_get(&t->at, name);
	return i >= 0 ? &t->a.a[i] : NULL;
}

/* Add name (the caller has checked it is new); name must outlive the table. */
static void names_add(NameTab *t, const char *name, int id, Pos pos)
{
	vec_push(&t->a, ((Name){id, pos}));
	strindex_put(&t->at, name, t->a.n - 1);
}

static void names_free(NameTab *t)
{
	strindex_free(&t->at);
	vec_free(&t->a);
}

/* ---- the loader's state ---- */

struct LoadCtx {
	Graph *g;
	Diag *d;
	NameTab names; /* values defined so far */
	NameTab later; /* every op result name, to say "defined later" */
	VEC(int) ins;  /* operand ids of the op being read */
	int nconst;    /* constants made so far, for their names */
	bool mesh_bad; /* the mesh had errors: its axes are placeholders */
	bool programs_ok; /* the caller reads partitioned programs too */
	bool spmd;     /* this file is a partitioned program (`spmd: true`) */
	int device;    /* a per-device program's `device`, or -1 */
	const LoadOpts *opts; /* may be NULL */
};

Graph *load_graph(struct LoadCtx *lc) { return lc->g; }
Diag *load_diag(struct LoadCtx *lc) { return lc->d; }

typedef struct LoadCtx LoadCtx;

/* Report "expected WHAT, found <description of n>" at n; returns -1. */
static int expect(LoadCtx *lc, const YNode *n, const char *what)
{
	char desc[96];
	ynode_describe(n, desc, sizeof desc);
	diag_error(lc->d, n->pos, "expected %s, found %s", what, desc);
	return -1;
}

/* The value of a required key, or NULL after reporting at the mapping. */
static const YNode *require(LoadCtx *lc, const YNode *map, const char *key, const char *where)
{
	const YNode *v = ynode_get(map, key);
	if (!v)
		diag_error(lc->d, map->pos, "expected key '%s' in %s, found none", key, where);
	return v;
}

static bool key_in(const char *key, const char *const *list)
{
	for (; list && *list; list++)
		if (!strcmp(key, *list))
			return true;
	return false;
}

static void keys_format(char *buf, size_t n, const char *const *const *lists)
{
	size_t k = 0;
	buf[0] = 0;
	for (int i = 0; i < 3; i++)
		for (const char *const *l = lists[i]; l && *l && k < n; l++)
			k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", *l);
}

/* Report every key of map that is in none of the lists (c may be NULL).  0, or -1. */
static int check_keys3(LoadCtx *lc, const YNode *map, const char *const *a, const char *const *b,
                       const char *const *c)
{
	int rc = 0;
	for (int i = 0; i < map->n; i++) {
		const YNode *k = map->keys[i];
		if (key_in(k->str, a) || key_in(k->str, b) || key_in(k->str, c))
			continue;
		char list[256], what[300];
		const char *const *const lists[3] = {a, b, c};
		keys_format(list, sizeof list, lists);
		snprintf(what, sizeof what, "one of %s", list);
		rc = expect(lc, k, what);
	}
	return rc;
}

static int check_keys(LoadCtx *lc, const YNode *map, const char *const *a, const char *const *b)
{
	return check_keys3(lc, map, a, b, NULL);
}

/* ---- names ---- */

static bool is_letter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

/* Mesh axis names: [A-Za-z][A-Za-z0-9_]*.  Value names: [A-Za-z_][A-Za-z0-9_.]*,
 * and in partitioned programs also '%' (temporaries: `h%local`, and the
 * training step's `%g7`, which YAML needs quoted). */
static bool is_identifier(const char *s, bool value_name, bool percent)
{
	if (!is_letter(*s) && !(value_name && *s == '_') && !(percent && *s == '%'))
		return false;
	for (s++; *s; s++)
		if (!is_letter(*s) && !(*s >= '0' && *s <= '9') && *s != '_' && !(value_name && *s == '.') &&
		    !(percent && *s == '%'))
			return false;
	return true;
}

/* Check that n names a value not yet defined.  true if it may be defined. */
static bool check_new_name(LoadCtx *lc, const YNode *n)
{
	if (n->kind != YN_SCALAR || ynode_is_null(n) || !is_identifier(n->str, true, lc->spmd)) {
		expect(lc, n, lc->spmd ? "a value name (a letter, '_' or '%', then letters, digits, '_', '.' or '%')"
		                       : "a value name (a letter or '_', then letters, digits, '_' or '.')");
		if (n->kind == YN_SCALAR && !names_find(&lc->names, n->str)) /* spare its users an "undefined" */
			names_add(&lc->names, n->str, NAME_BROKEN, n->pos);
		return false;
	}
	const Name *e = names_find(&lc->names, n->str);
	if (!e)
		return true;
	diag_error(lc->d, n->pos, "expected a new name, found '%s' (already defined at %s:%d:%d)", n->str, e->pos.file,
	           e->pos.line, e->pos.col);
	return false;
}

/* The value id a name refers to; NAME_BROKEN for a failed definition (not
 * reported again); -1 after reporting an unknown name. */
static int lookup_name(LoadCtx *lc, const YNode *n)
{
	if (n->kind != YN_SCALAR || ynode_is_null(n))
		return expect(lc, n, "a value name");
	const Name *e = names_find(&lc->names, n->str);
	if (e)
		return e->id;
	const Name *l = names_find(&lc->later, n->str);
	if (l)
		diag_error(lc->d, n->pos, "expected a value defined before this op, found '%s' (defined at %s:%d:%d)", n->str,
		           l->pos.file, l->pos.line, l->pos.col);
	else
		expect(lc, n, "the name of an input, a param or an earlier op's result");
	return -1;
}

int load_name(struct LoadCtx *lc, const struct YNode *n) { return lookup_name(lc, n); }

/* ---- mesh ---- */

/* One axis `name: size`.  A bad axis is still added, of size 1, so that
 * shardings naming it do not report it as unknown. */
static void mesh_axis(LoadCtx *lc, const YNode *key, const YNode *val)
{
	Mesh *m = &lc->g->mesh;
	int64_t size = 1;
	if (!is_identifier(key->str, false, false)) {
		expect(lc, key, "a mesh axis name (a letter, then letters, digits or '_')");
		lc->mesh_bad = true;
	}
	if (ynode_int(val, &size, lc->d) != 0)
		lc->mesh_bad = true, size = 1;
	else if (size < 1 || size > MESH_MAX_DEVICES) {
		expect(lc, val, size < 1 ? "a mesh axis size >= 1" : "a mesh axis size of at most 1048576");
		lc->mesh_bad = true, size = 1;
	}
	m->name[m->naxes] = arena_strdup(&lc->g->arena, key->str);
	m->size[m->naxes] = (int)size;
	m->pos[m->naxes] = key->pos;
	m->naxes++;
}

/* axes: {NAME: SIZE, ...}, major to minor; 1 to MESH_MAX_AXES of them. */
static void mesh_axes(LoadCtx *lc, const YNode *n)
{
	if (n->n == 0) {
		diag_error(lc->d, n->pos, "expected 1 to %d mesh axes, found none", MESH_MAX_AXES);
		lc->mesh_bad = true;
	}
	for (int i = 0; i < n->n; i++) {
		if (i == MESH_MAX_AXES) {
			diag_error(lc->d, n->keys[i]->pos, "expected at most %d mesh axes, found %d", MESH_MAX_AXES, n->n);
			lc->mesh_bad = true;
			break;
		}
		mesh_axis(lc, n->keys[i], n->items[i]);
	}
	int64_t ndev = 1;
	for (int a = 0; a < lc->g->mesh.naxes; a++)
		ndev *= lc->g->mesh.size[a]; /* each <= 2^20, at most 4: no overflow */
	if (ndev > MESH_MAX_DEVICES) {
		diag_error(lc->d, n->pos, "expected at most %d devices in the mesh, found %lld", MESH_MAX_DEVICES,
		           (long long)ndev);
		lc->mesh_bad = true;
	}
}

/* devices: a permutation of 0..ndev-1, giving the device at each mesh
 * position.  Returns the array (caller frees) or NULL after reporting. */
static int *mesh_devices(LoadCtx *lc, const YNode *n, int ndev)
{
	if (n->kind != YN_SEQ)
		return expect(lc, n, "a list of device ids"), NULL;
	if (n->n != ndev) {
		diag_error(lc->d, n->pos, "expected %d device ids (one per mesh position), found %d", ndev, n->n);
		return NULL;
	}
	int *dev = xmalloc(sizeof *dev * (size_t)ndev);
	char *seen = xcalloc((size_t)ndev, 1);
	bool ok = true;
	for (int i = 0; i < n->n; i++) {
		int64_t v;
		char what[64];
		snprintf(what, sizeof what, "a device id in 0..%d", ndev - 1);
		if (ynode_int(n->items[i], &v, lc->d) != 0)
			ok = false;
		else if (v < 0 || v >= ndev)
			ok = false, expect(lc, n->items[i], what);
		else if (seen[v])
			ok = false, expect(lc, n->items[i], "each device id once (a permutation of the device ids)");
		else
			seen[v] = 1, dev[i] = (int)v;
	}
	free(seen);
	if (!ok)
		free(dev), dev = NULL;
	return dev;
}

static void load_mesh(LoadCtx *lc, const YNode *n)
{
	static const char *const long_keys[] = {"axes", "devices", "hardware", NULL};
	Mesh *m = &lc->g->mesh;
	if (n->kind != YN_MAP) {
		expect(lc, n, "a mapping of mesh axis names to sizes");
		return;
	}
	const YNode *axes = ynode_get(n, "axes"), *devn = NULL;
	if (axes && axes->kind == YN_MAP) {
		check_keys(lc, n, long_keys, NULL);
		const YNode *hw = ynode_get(n, "hardware");
		const char *s;
		if (hw && ynode_string(hw, &s, lc->d) == 0)
			m->hardware = arena_strdup(&lc->g->arena, s);
		devn = ynode_get(n, "devices");
	} else
		axes = n;
	mesh_axes(lc, axes);
	int64_t ndev = 1;
	for (int a = 0; a < m->naxes; a++)
		ndev *= m->size[a];
	for (int a = 0; ndev > MESH_MAX_DEVICES && a < m->naxes; a++)
		m->size[a] = 1; /* reported: keep the names, drop the sizes */
	mesh_finish(m, &lc->g->arena, NULL); /* even after an error: ndev must be the product of the sizes */
	if (lc->mesh_bad)
		return;
	int *dev = devn ? mesh_devices(lc, devn, m->ndev) : NULL;
	if (dev && mesh_finish(m, &lc->g->arena, dev) != 0)
		diag_error(lc->d, devn->pos, "expected a permutation of the device ids, found another list");
	free(dev);
}

/* ---- inputs and params ---- */

/* shape: [D, ...], each D >= 1, rank <= MAX_RANK, at most MAX_NUMEL elements. */
static int read_shape(LoadCtx *lc, const YNode *n, Shape *s)
{
	if (n->kind != YN_SEQ)
		return expect(lc, n, "a shape (a list of dimensions)");
	if (n->n > MAX_RANK) {
		diag_error(lc->d, n->pos, "expected at most %d dimensions, found %d", MAX_RANK, n->n);
		return -1;
	}
	s->rank = n->n;
	int64_t numel = 1;
	for (int i = 0; i < n->n; i++) {
		int64_t v;
		if (ynode_int(n->items[i], &v, lc->d) != 0)
			return -1;
		if (v < 1)
			return expect(lc, n->items[i], "a dimension >= 1");
		if (v > MAX_NUMEL / numel) {
			diag_error(lc->d, n->items[i]->pos, "expected at most 2^40 elements in a tensor, found more");
			return -1;
		}
		numel *= v;
		s->dim[i] = v;
	}
	return 0;
}

int load_shape(struct LoadCtx *lc, const struct YNode *n, Shape *s) { return read_shape(lc, n, s); }

static int read_dtype(LoadCtx *lc, const YNode *n, DType *t)
{
	int k = n->kind == YN_SCALAR ? dtype_parse(n->str) : -1;
	if (k < 0)
		return expect(lc, n, "a dtype (f32, bf16, f16, f64 or i32)");
	*t = (DType)k;
	return 0;
}

static int read_init_map(LoadCtx *lc, const YNode *n, Init *init)
{
	const char *key = n->keys[0]->str;
	const YNode *v = n->items[0];
	if (!strcmp(key, "normal")) {
		init->kind = INIT_NORMAL;
		if (ynode_double(v, &init->a, lc->d) != 0)
			return -1;
		return init->a >= 0 && init->a < INFINITY ? 0 : expect(lc, v, "a standard deviation >= 0");
	}
	init->kind = INIT_UNIFORM;
	if (v->kind != YN_SEQ || v->n != 2)
		return expect(lc, v, "a range [LO, HI]");
	if (ynode_double(v->items[0], &init->a, lc->d) != 0 || ynode_double(v->items[1], &init->b, lc->d) != 0)
		return -1;
	if (!(init->a < init->b) || isinf(init->a) || isinf(init->b))
		return expect(lc, v->items[1], "a finite range [LO, HI] with LO < HI");
	return 0;
}

/* init: zeros | ones | {normal: STD} | {uniform: [LO, HI]} */
static int read_init(LoadCtx *lc, const YNode *n, Init *init)
{
	const char *what = "an init (zeros, ones, {normal: STD} or {uniform: [LO, HI]})";
	if (n->kind == YN_SCALAR && !n->quoted && (!strcmp(n->str, "zeros") || !strcmp(n->str, "ones"))) {
		init->kind = !strcmp(n->str, "zeros") ? INIT_ZEROS : INIT_ONES;
		return 0;
	}
	if (n->kind != YN_MAP || n->n != 1 || (strcmp(n->keys[0]->str, "normal") && strcmp(n->keys[0]->str, "uniform")))
		return expect(lc, n, what);
	return read_init_map(lc, n, init);
}

/* sharding: parsed into v by spec_parse, if the key is present; its
 * priority (models only) into *prio. */
static int read_sharding(LoadCtx *lc, const YNode *map, int rank, Spec *spec, bool *has, uint8_t *prio)
{
	const YNode *n = ynode_get(map, "sharding");
	*has = false;
	*prio = 0;
	memset(spec, 0, sizeof *spec);
	spec->rank = (uint8_t)rank;
	if (!n)
		return 0;
	int p = 0;
	if (spec_parse_annotation(spec, lc->spmd ? NULL : &p, n, &lc->g->mesh, &lc->g->rules, rank, lc->d) != 0)
		return -1;
	*prio = (uint8_t)p;
	if (lc->spmd && spec->open)
		return expect(lc, n, "a sharding without open dims ('_' or '?') in a partitioned program");
	*has = true;
	return 0;
}

/* ---- partitioned programs ----
 * In a file with `spmd: true` shapes are local: `global` is the shape of the
 * whole tensor and `sharding` its actual layout (partial axes allowed on op
 * results).  `global` defaults to the local shape times the shard counts,
 * or, for the ops that move one tensor's data (collectives, shard_slice,
 * mask), to the operand's.  A per-device file (`device: N`) also states the
 * device's facts — blocks, groups, permute partners — each checked against
 * what the program implies (emit.h computes them for the writer too). */

/* The axes of size > 1 that split dim d of s, in order, into ax; their count. */
static int split_axes(const Spec *s, const Mesh *m, int d, uint8_t *ax)
{
	int n = 0;
	for (int i = 0; i < s->nax[d]; i++)
		if (m->size[s->ax[d][i]] > 1)
			ax[n++] = s->ax[d][i];
	return n;
}

/* Do a and b lay a tensor out alike (axes of size 1 do not count)? */
static bool same_layout(const Spec *a, const Spec *b, const Mesh *m)
{
	unsigned big = 0;
	for (int x = 0; x < m->naxes; x++)
		big |= m->size[x] > 1 ? 1u << x : 0;
	if (a->rank != b->rank || (a->partial & big) != (b->partial & big))
		return false;
	if ((a->partial & big) && a->reduce != b->reduce)
		return false;
	for (int d = 0; d < a->rank; d++) {
		uint8_t x[MESH_MAX_AXES], y[MESH_MAX_AXES];
		int n = split_axes(a, m, d, x);
		if (n != split_axes(b, m, d, y) || memcmp(x, y, (size_t)n) != 0)
			return false;
	}
	return true;
}

bool load_same_layout(const Spec *a, const Spec *b, const Mesh *m) { return same_layout(a, b, m); }

/* global has local's rank and, when exact (inputs, params: the values whose
 * data is made per block), local == ceil(global / shards) under layout s.
 * Op results are not held to this: intermediates may be re-blocked (larger
 * blocks after an all_gather) or pieces (a halo row).  0, or -1 after
 * reporting at p. */
static int check_blocks(LoadCtx *lc, Pos p, const Shape *local, const Spec *s, const Shape *global, bool exact)
{
	if (global->rank != local->rank) {
		diag_error(lc->d, p, "expected a global shape of rank %d (the local shape's), found rank %d", local->rank,
		           global->rank);
		return -1;
	}
	Shape want = {global->rank, {0}};
	spec_shard_shape(s, &lc->g->mesh, global->dim, want.dim);
	if (!exact || shape_eq(&want, local))
		return 0;
	char ls[160], gs[160], ws[160], ss[256];
	shape_format(local, ls, sizeof ls), shape_format(global, gs, sizeof gs), shape_format(&want, ws, sizeof ws);
	spec_format(s, &lc->g->mesh, ss, sizeof ss);
	diag_error(lc->d, p, "expected a global shape whose blocks under %s are the local shape %s, found %s (blocks %s)",
	           ss, ls, gs, ws);
	return -1;
}

/* `global` of a value of local shape `local` laid out by s: the map's key,
 * or def, or local times the shard counts; checked by check_blocks. */
static int read_global(LoadCtx *lc, const YNode *map, const Shape *local, const Spec *s, const Shape *def, bool exact,
                       Shape *global)
{
	const YNode *gn = ynode_get(map, "global");
	*global = def ? *def : *local;
	for (int d = 0; d < local->rank && !def; d++)
		global->dim[d] = local->dim[d] * spec_dim_shards(s, &lc->g->mesh, d);
	if (gn && read_shape(lc, gn, global) != 0)
		return -1;
	return check_blocks(lc, gn ? gn->pos : map->pos, local, s, global, exact);
}

/* key: [N, ...] in map, if given, must be want[0..n).  0, or -1 after reporting. */
static int check_fact_list(LoadCtx *lc, const YNode *map, const char *key, const int64_t *want, int n)
{
	const YNode *v = ynode_get(map, key);
	char what[160];
	if (!v)
		return 0;
	if (v->kind != YN_SEQ || v->n != n) {
		snprintf(what, sizeof what, "a list of %d integers (the %s of device %d)", n, key, lc->device);
		return expect(lc, v, what);
	}
	for (int i = 0; i < n; i++) {
		int64_t x;
		if (ynode_int(v->items[i], &x, lc->d) != 0)
			return -1;
		snprintf(what, sizeof what, "%lld (entry %d of the %s of device %d)", (long long)want[i], i, key, lc->device);
		if (x != want[i])
			return expect(lc, v->items[i], what);
	}
	return 0;
}

static int check_fact(LoadCtx *lc, const YNode *map, const char *key, int64_t want)
{
	const YNode *v = ynode_get(map, key);
	int64_t x;
	char what[160];
	if (!v)
		return 0;
	if (ynode_int(v, &x, lc->d) != 0)
		return -1;
	snprintf(what, sizeof what, "%lld (the %s of device %d)", (long long)want, key, lc->device);
	return x == want ? 0 : expect(lc, v, what);
}

/* offset (and extent) of the block the device holds. */
static int check_block_facts(LoadCtx *lc, const YNode *map, const char *key, const Spec *s, const Shape *local,
                             const Shape *global, bool extent)
{
	int64_t off[MAX_RANK], ext[MAX_RANK];
	emit_block(s, &lc->g->mesh, local, global, lc->device, off, ext);
	int rc = check_fact_list(lc, map, key, off, local->rank);
	if (rc == 0 && extent)
		rc = check_fact_list(lc, map, "extent", ext, local->rank);
	return rc;
}

/* An input or param of a program: laid out without partial axes, with its global shape. */
static int program_leaf(LoadCtx *lc, const YNode *n, Value *v)
{
	if (v->spec.partial)
		return expect(lc, ynode_get(n, "sharding"), "a sharding without partial axes for an input or param");
	if (read_global(lc, n, &v->shape, &v->spec, NULL, true, &v->global) != 0)
		return -1;
	return lc->device >= 0 ? check_block_facts(lc, n, "offset", &v->spec, &v->shape, &v->global, true) : 0;
}

/* shard_as: GROUP (models only), a name interned in the graph's arena. */
static int read_shard_as(LoadCtx *lc, const YNode *map, Value *v)
{
	const YNode *n = ynode_get(map, "shard_as");
	if (!n)
		return 0;
	if (lc->spmd)
		return expect(lc, n, "no shard_as in a partitioned program (groups are propagation's)");
	if (n->kind != YN_SCALAR || ynode_is_null(n))
		return expect(lc, n, "a sharding group's name");
	v->shard_as = arena_strdup(&lc->g->arena, n->str);
	v->shard_as_pos = n->pos;
	return 0;
}

/* A param's own weight_update_sharding (off, on or auto) at n (may be
 * NULL: *wus = 0, the train: section's).  0, or -1. */
static int read_param_wus(LoadCtx *lc, const YNode *n, int8_t *wus)
{
	static const char *const modes[] = {"off", "on", "auto"}; /* WusMode order */
	*wus = 0;
	for (int k = 0; n && k < 3; k++)
		if (n->kind == YN_SCALAR && !n->quoted && strcmp(n->str, modes[k]) == 0)
			*wus = (int8_t)(k + 1);
	return n && !*wus ? expect(lc, n, "weight_update_sharding off, on or auto") : 0;
}

/* A param's own all_gather (after_update, before_use or first_use) at n
 * (may be NULL: *gather = 0, the train: section's).  0, or -1. */
static int read_param_gather(LoadCtx *lc, const YNode *n, int8_t *gather)
{
	*gather = 0;
	for (int k = 0; n && k < 3; k++)
		if (n->kind == YN_SCALAR && !n->quoted && strcmp(n->str, ag_names[k]) == 0)
			*gather = (int8_t)(k + AG_AFTER_UPDATE);
	return n && !*gather ? expect(lc, n, "all_gather after_update, before_use or first_use") : 0;
}

/* The fields of one input or param entry, read into v.  0, or -1. */
static int read_value_entry(LoadCtx *lc, const YNode *n, ValueKind kind, Value *v)
{
	static const char *const input_keys[] = {"shape", "dtype", "sharding", "shard_as", NULL};
	static const char *const param_keys[] = {"shape", "dtype", "sharding", "init", "weight_update_sharding",
	                                         "all_gather", "shard_as", NULL};
	static const char *const program_keys[] = {"global", NULL}, *const device_keys[] = {"offset", "extent", NULL};
	bool held = kind != VK_INPUT; /* params and optimizer state (programs) have an init */
	const char *where = kind == VK_PARAM ? "a param" : kind == VK_STATE ? "a state value" : "an input";
	if (n->kind != YN_MAP)
		return expect(lc, n, held ? "a mapping with shape, dtype, sharding and init"
		                          : "a mapping with shape, dtype and sharding");
	int rc = check_keys3(lc, n, held ? param_keys : input_keys, lc->spmd ? program_keys : NULL,
	                     lc->device >= 0 ? device_keys : NULL);
	const YNode *sn = require(lc, n, "shape", where), *dn = ynode_get(n, "dtype"), *in = ynode_get(n, "init");
	v->dtype = DT_F32;
	if (!sn || read_shape(lc, sn, &v->shape) != 0)
		return -1;
	if (dn && read_dtype(lc, dn, &v->dtype) != 0)
		rc = -1;
	else if (held && !dtype_is_float(v->dtype))
		rc = expect(lc, dn, kind == VK_PARAM ? "a floating-point dtype for a param (f32, bf16, f16 or f64)"
		                                     : "a floating-point dtype for a state value (f32, bf16, f16 or f64)");
	if (in && read_init(lc, in, &v->init) != 0)
		rc = -1;
	if (read_sharding(lc, n, v->shape.rank, &v->spec, &v->has_spec, &v->priority) != 0 ||
	    read_shard_as(lc, n, v) != 0)
		rc = -1;
	/* reported, the param still made: the load fails, and its name resolves */
	if (kind == VK_PARAM) {
		read_param_wus(lc, ynode_get(n, "weight_update_sharding"), &v->wus);
		read_param_gather(lc, ynode_get(n, "all_gather"), &v->gather);
	}
	v->spec_pos = v->has_spec ? ynode_get(n, "sharding")->pos : (Pos){0};
	if (rc == 0 && lc->spmd)
		rc = program_leaf(lc, n, v);
	return rc;
}

static void load_value(LoadCtx *lc, const YNode *key, const YNode *n, ValueKind kind)
{
	bool fresh = check_new_name(lc, key);
	Value v = {0};
	int id = NAME_BROKEN;
	if (read_value_entry(lc, n, kind, &v) == 0 && fresh) {
		id = graph_value(lc->g, key->str, v.dtype, &v.shape, kind, key->pos);
		Value *p = &lc->g->values.a[id];
		p->init = v.init, p->wus = v.wus, p->gather = v.gather, p->has_spec = v.has_spec, p->spec = v.spec, p->spec_pos = v.spec_pos;
		p->priority = v.priority, p->shard_as = v.shard_as, p->shard_as_pos = v.shard_as_pos;
		p->global = v.global;
	}
	if (fresh)
		names_add(&lc->names, id >= 0 ? lc->g->values.a[id].name : key->str, id, key->pos);
}

static void load_values(LoadCtx *lc, const YNode *sec, ValueKind kind)
{
	if (sec->kind != YN_MAP && !ynode_is_null(sec)) {
		expect(lc, sec, kind == VK_PARAM   ? "a mapping of param names to their shapes"
		                : kind == VK_STATE ? "a mapping of state names to their shapes"
		                                   : "a mapping of input names to their shapes");
		return;
	}
	for (int i = 0; i < sec->n && sec->kind == YN_MAP; i++)
		load_value(lc, sec->keys[i], sec->items[i], kind);
}

/* ---- ops ---- */

/* Levenshtein distance, for "did you mean"; strings of at most 31 bytes. */
static int edit_distance(const char *a, const char *b)
{
	int la = (int)strlen(a), lb = (int)strlen(b), row[32];
	if (la > 31 || lb > 31)
		return 99;
	for (int j = 0; j <= lb; j++)
		row[j] = j;
	for (int i = 1; i <= la; i++) {
		int diag = row[0];
		row[0] = i;
		for (int j = 1; j <= lb; j++) {
			int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
			best = up + 1 < best ? up + 1 : best;
			best = row[j - 1] + 1 < best ? row[j - 1] + 1 : best;
			diag = up, row[j] = best;
		}
	}
	return row[lb];
}

/* op: NAME.  The OpKind, or -1 after reporting (with a suggestion). */
static int read_op_kind(LoadCtx *lc, const YNode *n)
{
	int k = n->kind == YN_SCALAR ? op_find(n->str) : -1;
	if (k >= 0 && (op_table[k].flags & OPF_DEVICE) && !lc->spmd) {
		diag_error(lc->d, n->pos, "expected an op name, found '%s' (an internal op of partitioned programs)", n->str);
		return -1;
	}
	if (k >= 0)
		return k;
	int best = -1, bestd = 3;
	for (int i = 0; i < OP_COUNT && n->kind == YN_SCALAR; i++) {
		if (op_table[i].flags & OPF_DEVICE)
			continue;
		int dist = edit_distance(n->str, op_table[i].name);
		if (dist < bestd)
			best = i, bestd = dist;
	}
	char desc[96];
	ynode_describe(n, desc, sizeof desc);
	if (best >= 0)
		diag_error(lc->d, n->pos, "expected an op name, found %s (did you mean '%s'?)", desc, op_table[best].name);
	else
		diag_error(lc->d, n->pos, "expected an op name, found %s", desc);
	return -1;
}

/* A number in an `in` list: a new scalar f32 constant.  Its value id. */
static int make_const(LoadCtx *lc, const YNode *n)
{
	double v = 0;
	ynode_double(n, &v, lc->d);
	char name[32];
	snprintf(name, sizeof name, "%%const%d", lc->nconst++);
	int id = graph_value(lc->g, name, DT_F32, &(Shape){0}, VK_CONST, n->pos);
	lc->g->values.a[id].cval = v;
	return id;
}

static int check_arity(LoadCtx *lc, const YNode *in, OpKind kind)
{
	const OpInfo *info = &op_table[kind];
	int n = in->n, lo = info->nmin, hi = info->nmax;
	if (n >= lo && (hi < 0 || n <= hi))
		return 0;
	if (lo == hi)
		diag_error(lc->d, in->pos, "expected %d operand%s for %s, found %d", lo, lo == 1 ? "" : "s", info->name, n);
	else if (hi < 0)
		diag_error(lc->d, in->pos, "expected at least %d operand%s for %s, found %d", lo, lo == 1 ? "" : "s",
		           info->name, n);
	else
		diag_error(lc->d, in->pos, "expected %d to %d operands for %s, found %d", lo, hi, info->name, n);
	return -1;
}

/* in: [NAME or NUMBER, ...] into lc->ins.  0, or -1 (errors reported, or an
 * operand whose definition failed). */
static int read_operands(LoadCtx *lc, const YNode *in, OpKind kind)
{
	lc->ins.n = 0;
	if (in->kind != YN_SEQ)
		return expect(lc, in, "a list of operands");
	int rc = check_arity(lc, in, kind);
	for (int i = 0; i < in->n; i++) {
		const YNode *it = in->items[i];
		int id = ynode_is_number(it) ? make_const(lc, it) : lookup_name(lc, it);
		if (id < 0)
			rc = -1;
		vec_push(&lc->ins, id);
	}
	return rc;
}

/* Parse the op's attributes and apply its shape rule to the operands in
 * lc->ins.  Fills *op (its attr pointing at *attr), *s and *dt.  0, or -1. */
static int check_op(LoadCtx *lc, const YNode *n, OpKind kind, Op *op, Attr *attr, Shape *s, DType *dt)
{
	memset(attr, 0, sizeof *attr);
	*op = (Op){.kind = kind, .nin = lc->ins.n, .in = lc->ins.a, .out = -1, .attr = attr, .pos = n->pos};
	const OpInfo *info = &op_table[kind];
	if (info->attr(lc, n, op) != 0)
		return -1;
	return info->shape(lc->g, op, s, dt, lc->d);
}

/* Add the checked op and its result value to the graph.  The value id. */
static int add_op(LoadCtx *lc, const YNode *out, const Op *op, const Shape *s, DType dt, const Spec *spec,
                  const YNode *sn)
{
	Graph *g = lc->g;
	int v = graph_value(g, out->str, dt, s, VK_INTER, out->pos);
	if (sn) {
		g->values.a[v].has_spec = true;
		g->values.a[v].spec = *spec;
		g->values.a[v].spec_pos = sn->pos;
	}
	int id = graph_op(g, op->kind, op->in, op->nin, v, op->pos);
	*g->ops.a[id].attr = *op->attr;
	return v;
}

/* ---- ops of partitioned programs ---- */

/* Ops that move one tensor's data: the result is the operand's tensor. */
static bool moves_data(OpKind k)
{
	return (op_table[k].flags & OPF_COLLECTIVE) || k == OP_SHARD_SLICE || k == OP_MASK || k == OP_SHARD_ROLL;
}

/* The per-device keys an op of kind k may carry. */
static const char *const *device_op_keys(OpKind k)
{
	static const char *const group[] = {"group", NULL}, *const permute[] = {"send_to", "recv_from", NULL},
	                         *const slice[] = {"offset", "extent", "from_offset", NULL},
	                         *const mask[] = {"offset", "extent", NULL}, *const roll[] = {"roll", NULL},
	                         *const none[] = {NULL};
	if (k == OP_COLLECTIVE_PERMUTE)
		return permute;
	if (op_table[k].flags & OPF_COLLECTIVE)
		return group;
	return k == OP_SHARD_SLICE ? slice : k == OP_MASK ? mask : k == OP_SHARD_ROLL ? roll : none;
}

/* shard_slice: `from` is the operand's layout, whose blocks it holds; the
 * result is laid out by `to` (a `sharding` key must agree with it). */
static int shard_slice_layout(LoadCtx *lc, const YNode *n, const Op *op, const Value *x, Spec *spec, bool has)
{
	const Mesh *m = &lc->g->mesh;
	const Attr *a = op->attr;
	char want[256];
	spec_format(&x->spec, m, want, sizeof want);
	if (!same_layout(&a->spec_from, &x->spec, m)) {
		char what[300];
		snprintf(what, sizeof what, "the operand's layout %s as 'from'", want);
		return expect(lc, ynode_get(n, "from"), what);
	}
	if (has && !same_layout(spec, &a->spec, m))
		return expect(lc, ynode_get(n, "sharding"), "the shard_slice's 'to' as its sharding");
	*spec = a->spec;
	return 0;
}

/* shard_roll: the result keeps the operand's layout (each device turns
 * its own block); a `sharding` key must agree with it. */
static int shard_roll_layout(LoadCtx *lc, const YNode *n, const Value *x, Spec *spec, bool has)
{
	if (!has) {
		*spec = x->spec;
		return 0;
	}
	if (same_layout(spec, &x->spec, &lc->g->mesh))
		return 0;
	char want[256], what[320];
	spec_format(&x->spec, &lc->g->mesh, want, sizeof want);
	snprintf(what, sizeof what, "the operand's layout %s as the shard_roll's sharding", want);
	return expect(lc, ynode_get(n, "sharding"), what);
}

static int read_why(LoadCtx *lc, const YNode *n, const char **why)
{
	const YNode *w = ynode_get(n, "why");
	const char *s;
	*why = NULL;
	if (!w)
		return 0;
	if (ynode_string(w, &s, lc->d) != 0)
		return -1;
	*why = arena_strdup(&lc->g->arena, s);
	return 0;
}

/* count: N of a loss in a program: the positions its mean is over (the
 * global count, where the loader would take the local operand's). */
static int read_count(LoadCtx *lc, const YNode *n, Op *op)
{
	const YNode *cn = ynode_get(n, "count");
	double v;
	bool xent = op->kind == OP_SOFTMAX_CROSS_ENTROPY || op->kind == OP_SOFTMAX_CROSS_ENTROPY_GRAD;
	if (xent) { /* as partition() makes it: skip the labels' padding */
		const Value *labels = &lc->g->values.a[op->in[1]];
		op->attr->reduce = 1;
		op->attr->spec = labels->spec;
		op->attr->global = labels->global;
	}
	if (!cn || (op->kind != OP_MSE && op->kind != OP_XENT_GRAD_SHARD && !xent))
		return 0;
	if (ynode_double(cn, &v, lc->d) != 0)
		return -1;
	if (!(v >= 1 && v <= 1e300))
		return expect(lc, cn, "a count >= 1");
	op->attr->value = v;
	return 0;
}

/* The program parts of an op whose local result shape is s: its layout,
 * global shape and why.  The ops that move one tensor's data keep its
 * global shape. */
static int program_op(LoadCtx *lc, const YNode *n, Op *op, const Shape *s, Spec *spec, bool has, Shape *global,
                      const char **why)
{
	const Value *x = &lc->g->values.a[op->in[0]];
	bool moves = moves_data(op->kind);
	if (read_count(lc, n, op) != 0)
		return -1;
	if (op->kind == OP_SHARD_SLICE && shard_slice_layout(lc, n, op, x, spec, has) != 0)
		return -1;
	if (op->kind == OP_SHARD_ROLL && shard_roll_layout(lc, n, x, spec, has) != 0)
		return -1;
	if (op->kind == OP_MASK && !same_layout(&op->attr->spec, &x->spec, &lc->g->mesh)) {
		char b[256];
		spec_format(&x->spec, &lc->g->mesh, b, sizeof b);
		diag_error(lc->d, n->pos, "expected a mask whose sharding is its operand's, %s, found another", b);
		return -1;
	}
	if (read_global(lc, n, s, spec, moves ? &x->global : NULL, false, global) != 0)
		return -1;
	if (op->kind == OP_TAKE_GRAD_SHARD || op->kind == OP_ONE_HOT_SHARD) {
		/* its rows (classes) are its result's blocks: num_rows (depth) must be one */
		const YNode *gn = ynode_get(n, "global");
		if (check_blocks(lc, gn ? gn->pos : n->pos, s, spec, global, true) != 0)
			return -1;
		op->attr->spec = *spec, op->attr->global = *global;
	}
	if (op->kind == OP_XENT_STATS_SHARD || op->kind == OP_XENT_GRAD_SHARD) /* the logits' blocks of classes */
		op->attr->spec = x->spec, op->attr->global = x->global;
	if (moves && !shape_eq(global, &x->global)) {
		char a[160], b[160];
		shape_format(&x->global, a, sizeof a), shape_format(global, b, sizeof b);
		diag_error(lc->d, ynode_get(n, "global")->pos, "expected the operand's global shape %s for %s, found %s", a,
		           op_table[op->kind].name, b);
		return -1;
	}
	return read_why(lc, n, why);
}

static int check_group(LoadCtx *lc, const YNode *n, const Attr *a)
{
	const Mesh *m = &lc->g->mesh;
	int *grp = xmalloc(sizeof(int) * (size_t)m->ndev), size = 1;
	int64_t *want = xmalloc(sizeof(int64_t) * (size_t)m->ndev);
	for (int k = 0; k < a->ncax; k++)
		size *= m->size[a->cax[k]];
	mesh_group(m, lc->device, a->cax, a->ncax, grp);
	for (int k = 0; k < size; k++)
		want[k] = grp[k];
	int rc = check_fact_list(lc, n, "group", want, size);
	free(grp), free(want);
	return rc;
}

static int check_permute(LoadCtx *lc, const YNode *n, const Attr *a)
{
	const Mesh *m = &lc->g->mesh;
	int *t = xmalloc(sizeof(int) * (size_t)m->ndev), from = -1;
	emit_permute_targets(m, a, t);
	for (int dev = 0; dev < m->ndev && from < 0; dev++)
		from = t[dev] == lc->device ? dev : -1;
	int rc = check_fact(lc, n, "send_to", t[lc->device]);
	if (rc == 0)
		rc = check_fact(lc, n, "recv_from", from);
	free(t);
	return rc;
}

/* The device's facts about the op it runs. */
static int check_op_facts(LoadCtx *lc, const YNode *n, const Op *op)
{
	const Attr *a = op->attr;
	const Value *x = &lc->g->values.a[op->in[0]], *y = &lc->g->values.a[op->out];
	if (op->kind == OP_COLLECTIVE_PERMUTE)
		return check_permute(lc, n, a);
	if (op_table[op->kind].flags & OPF_COLLECTIVE)
		return check_group(lc, n, a);
	if (op->kind == OP_SHARD_SLICE && check_block_facts(lc, n, "offset", &a->spec, &a->shape, &a->global, true) != 0)
		return -1;
	if (op->kind == OP_SHARD_SLICE)
		return check_block_facts(lc, n, "from_offset", &a->spec_from, &x->shape, &a->global, false);
	if (op->kind == OP_MASK)
		return check_block_facts(lc, n, "offset", &a->spec, &y->shape, &a->global, true);
	if (op->kind == OP_SHARD_ROLL)
		return check_fact(lc, n, "roll", op_roll_elems(&lc->g->mesh, a, &x->shape, lc->device));
	return 0;
}

/* Value v's layout and global shape, its op's why, and the device's facts. */
/* A pipelined program's stage: N (the stage whose devices run the op) or,
 * on a send between stages, stage: [FROM, TO]. */
static void read_program_stage(LoadCtx *lc, const YNode *n, Op *op)
{
	const YNode *sn = ynode_get(n, "stage");
	int64_t a = -1, b = -1;
	if (!sn)
		return;
	if (lc->g->stage_axis < 0) {
		expect(lc, sn, "no stage on an op of a program without a top-level `stages: AXIS`");
		return;
	}
	bool pair = sn->kind == YN_SEQ && sn->n == 2 && op->kind == OP_COLLECTIVE_PERMUTE;
	if (pair ? ynode_int(sn->items[0], &a, lc->d) != 0 || ynode_int(sn->items[1], &b, lc->d) != 0
	         : sn->kind != YN_SCALAR || ynode_int(sn, &a, lc->d) != 0) {
		if (sn->kind != YN_SCALAR && !pair)
			expect(lc, sn, op->kind == OP_COLLECTIVE_PERMUTE ? "a stage number, or [from, to] stages of a send"
			                                                 : "a stage number");
		return;
	}
	if (a < 0 || a >= PIPE_MAX_STEPS || b < -1 || b >= PIPE_MAX_STEPS || (pair && b < 0)) {
		expect(lc, sn, "stage numbers from 0");
		return;
	}
	op->stage = (int)a, op->stage_to = (int)b;
}

static void finish_program_op(LoadCtx *lc, const YNode *n, int v, const Spec *spec, const Shape *global,
                              const char *why)
{
	Value *val = &lc->g->values.a[v];
	Op *op = &lc->g->ops.a[val->producer];
	val->spec = *spec;
	val->global = *global;
	op->why = why;
	read_program_stage(lc, n, op);
	if (lc->device >= 0)
		check_op_facts(lc, n, op);
}

/* {out: NAME, op: KIND, in: [...], sharding: SPEC, ATTR: ...} */
static void load_op(LoadCtx *lc, const YNode *n)
{
	static const char *const model_keys[] = {"out", "op", "in", "sharding", "shard_as", "stage", NULL};
	static const char *const program_keys[] = {"out", "op", "in", "sharding", "global", "why", "stage", NULL};
	static const char *const loss_keys[] = {"out", "op", "in", "sharding", "global", "why", "count", "stage", NULL};
	if (n->kind != YN_MAP) {
		expect(lc, n, "an op (a mapping with out, op and in)");
		return;
	}
	const YNode *out = require(lc, n, "out", "an op"), *kn = require(lc, n, "op", "an op");
	const YNode *in = require(lc, n, "in", "an op");
	int kind = kn ? read_op_kind(lc, kn) : -1;
	bool loss = kind == OP_MSE || kind == OP_SOFTMAX_CROSS_ENTROPY || kind == OP_SOFTMAX_CROSS_ENTROPY_GRAD ||
	            kind == OP_XENT_GRAD_SHARD;
	if (kind >= 0)
		check_keys3(lc, n, !lc->spmd ? model_keys : loss ? loss_keys : program_keys, attr_keys((OpKind)kind),
		            lc->device >= 0 ? device_op_keys((OpKind)kind) : NULL);
	bool fresh = out && check_new_name(lc, out);
	int id = NAME_BROKEN;
	Op op;
	Attr attr;
	Shape s = {0};
	DType dt = DT_F32;
	Spec spec;
	bool has = false;
	Value strat = {0}; /* priority and shard_as */
	Shape global = {0};
	const char *why = NULL;
	if (kind >= 0 && in && read_operands(lc, in, (OpKind)kind) == 0 &&
	    check_op(lc, n, (OpKind)kind, &op, &attr, &s, &dt) == 0 &&
	    read_sharding(lc, n, s.rank, &spec, &has, &strat.priority) == 0 &&
	    read_shard_as(lc, n, &strat) == 0 && (!lc->spmd || program_op(lc, n, &op, &s, &spec, has, &global, &why) == 0) && fresh)
		id = add_op(lc, out, &op, &s, dt, &spec, has ? ynode_get(n, "sharding") : NULL);
	if (id >= 0) {
		Value *v = &lc->g->values.a[id];
		v->priority = strat.priority, v->shard_as = strat.shard_as, v->shard_as_pos = strat.shard_as_pos;
	}
	if (id >= 0 && lc->spmd)
		finish_program_op(lc, n, id, &spec, &global, why);
	if (fresh)
		names_add(&lc->names, id >= 0 ? lc->g->values.a[id].name : out->str, id, out->pos);
}

/* Remember where every op result is defined, to tell "used before defined"
 * from "undefined". */
static void collect_later(LoadCtx *lc, const YNode *ops)
{
	for (int i = 0; i < ops->n; i++) {
		const YNode *out = ynode_get(ops->items[i], "out");
		if (out && out->kind == YN_SCALAR && !names_find(&lc->later, out->str))
			names_add(&lc->later, out->str, -1, out->pos);
	}
}

static void load_ops(LoadCtx *lc, const YNode *ops)
{
	if (ops->kind != YN_SEQ) {
		expect(lc, ops, "a list of ops");
		return;
	}
	collect_later(lc, ops);
	for (int i = 0; i < ops->n; i++)
		load_op(lc, ops->items[i]);
}

/* An output of a program is gathered from its blocks (a partial one summed):
 * they must have its layout's own shape. */
static void program_output(LoadCtx *lc, const YNode *n, int id)
{
	const Value *v = &lc->g->values.a[id];
	char ss[256], ls[160], ws[160];
	Shape want = {v->global.rank, {0}};
	spec_shard_shape(&v->spec, &lc->g->mesh, v->global.dim, want.dim);
	if (shape_eq(&want, &v->shape))
		return;
	spec_format(&v->spec, &lc->g->mesh, ss, sizeof ss);
	shape_format(&v->shape, ls, sizeof ls), shape_format(&want, ws, sizeof ws);
	diag_error(lc->d, n->pos, "expected an output in the blocks of its sharding %s (%s), found '%s' in blocks %s", ss,
	           ws, v->name, ls);
}

/* outputs: [NAME, ...], non-empty, each defined and listed once. */
static void load_outputs(LoadCtx *lc, const YNode *n)
{
	if (n->kind != YN_SEQ || n->n == 0) {
		expect(lc, n, "a non-empty list of output names");
		return;
	}
	char *seen = xcalloc((size_t)lc->g->values.n + 1, 1);
	for (int i = 0; i < n->n; i++) {
		int id = lookup_name(lc, n->items[i]);
		if (id < 0)
			continue;
		if (seen[id]) {
			diag_error(lc->d, n->items[i]->pos, "expected each output once, found '%s' again", n->items[i]->str);
			continue;
		}
		seen[id] = 1;
		vec_push(&lc->g->outputs, id);
		if (lc->spmd)
			program_output(lc, n->items[i], id);
	}
	free(seen);
}

/* ---- the model ---- */

/* spmd: BOOL — a partitioned program, if the caller reads them.  0, or -1 to stop. */
static int read_kind(LoadCtx *lc, const YNode *root)
{
	const YNode *n = ynode_get(root, "spmd");
	if (n && ynode_bool(n, &lc->spmd, lc->d) != 0)
		return -1;
	if (lc->spmd && !lc->programs_ok) {
		diag_error(lc->d, n->pos, "expected a model, found a partitioned program (spmd: true; 'spmd run' runs it)");
		return -1;
	}
	return 0;
}

/* device: N of a per-device program, once the mesh is known. */
static void read_device(LoadCtx *lc, const YNode *root)
{
	const YNode *n = ynode_get(root, "device");
	int64_t dev;
	if (!n || ynode_int(n, &dev, lc->d) != 0)
		return;
	if (dev < 0 || dev >= lc->g->mesh.ndev) {
		char what[64];
		snprintf(what, sizeof what, "a device id in 0..%d", lc->g->mesh.ndev - 1);
		expect(lc, n, what);
		return;
	}
	lc->device = (int)dev;
}

/* stages: AXIS of a pipelined program: the mesh axis whose coordinate
 * says which ops a device runs (Op.stage). */
static void read_stages(LoadCtx *lc, const YNode *root)
{
	const YNode *n = ynode_get(root, "stages");
	const char *s;
	if (!n || ynode_string(n, &s, lc->d) != 0)
		return;
	int a = mesh_axis_find(&lc->g->mesh, s);
	if (a < 0)
		expect(lc, n, "the mesh axis of the stages");
	else
		lc->g->stage_axis = a;
}

/* --mesh: the model's mesh replaced (its hardware kept) before any sharding is read. */
static void replace_mesh(LoadCtx *lc, const char *text)
{
	Mesh m;
	if (mesh_parse_text(&m, &lc->g->arena, text, lc->d) != 0) {
		lc->mesh_bad = true;
		return;
	}
	m.hardware = lc->g->mesh.hardware;
	lc->g->mesh = m;
	lc->mesh_bad = false;
}

/* ---- logical axes ----
 * axis_rules: {NAME: axis | [axis, ...] | null, ...} names logical axes
 * that shardings may use wherever a mesh axis may stand (docs/sharding.md).
 * Targets the mesh lacks are dropped with a warning naming them, so one
 * model serves meshes with different axes. */

/* One target of rule r at n: a mesh axis appended to r, or a warning. */
static int add_target(LoadCtx *lc, AxisRule *r, const YNode *n, unsigned *seen)
{
	if (n->kind != YN_SCALAR || ynode_is_null(n))
		return expect(lc, n, "a mesh axis name");
	uint8_t ax[MESH_MAX_AXES];
	int k = mesh_resolve(&lc->g->mesh, n->str, ax);
	if (k == MESH_BAD_SUB || k == MESH_OFF_CUTS)
		return expect(lc, n, "a mesh axis, or a sub-axis NAME:(P)S with P*S dividing its size and S >= 2");
	if (k < 0) {
		char mesh[128];
		mesh_format(&lc->g->mesh, mesh, sizeof mesh);
		diag_warn(lc->d, n->pos, "logical axis '%s' maps to mesh axis '%s', which mesh %s does not have: not split on it",
		          r->name, n->str, mesh);
		return 0;
	}
	for (int i = 0; i < k; i++) {
		if (*seen >> ax[i] & 1) {
			diag_error(lc->d, n->pos, "expected each mesh axis at most once in a rule, found '%s' twice", n->str);
			return -1;
		}
		*seen |= 1u << ax[i];
		r->axes[r->n++] = ax[i];
	}
	return 0;
}

/* A rule's value as written: "data", "[data, model]", "null". */
static const char *written_form(LoadCtx *lc, const YNode *v)
{
	char buf[256];
	size_t k = 0;
	if (ynode_is_null(v) || v->kind == YN_SCALAR)
		return arena_strdup(&lc->g->arena, ynode_is_null(v) ? "null" : v->str);
	if (v->kind != YN_SEQ)
		return "?";
	k += (size_t)snprintf(buf, sizeof buf, "[");
	for (int i = 0; i < v->n && k < sizeof buf; i++)
		k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", i ? ", " : "",
		                      v->items[i]->kind == YN_SCALAR ? v->items[i]->str : "?");
	if (k < sizeof buf)
		snprintf(buf + k, sizeof buf - k, "]");
	return arena_strdup(&lc->g->arena, buf);
}

/* Rule key k with value v into r.  0, or -1 after reporting. */
static int read_rule(LoadCtx *lc, const YNode *k, const YNode *v, AxisRule *r, const char **written)
{
	r->name = arena_strdup(&lc->g->arena, k->str);
	r->pos = k->pos;
	if (mesh_axis_find(&lc->g->mesh, k->str) >= 0)
		return expect(lc, k, "a logical axis name that is not a mesh axis");
	*written = written_form(lc, v);
	if (ynode_is_null(v))
		return 0;
	unsigned seen = 0;
	if (v->kind != YN_SEQ)
		return add_target(lc, r, v, &seen);
	int err = 0;
	for (int i = 0; i < v->n; i++)
		err |= add_target(lc, r, v->items[i], &seen);
	return err;
}

static void read_rules(LoadCtx *lc, const YNode *n)
{
	if (n->kind != YN_MAP) {
		expect(lc, n, "a mapping of logical axis names to mesh axes");
		return;
	}
	Graph *g = lc->g;
	g->rules.a = arena_alloc(&g->arena, sizeof(AxisRule) * (size_t)(n->n + 1));
	g->rules_written = arena_alloc(&g->arena, sizeof(char *) * (size_t)(n->n + 1));
	for (int i = 0; i < n->n; i++)
		if (read_rule(lc, n->keys[i], n->items[i], &g->rules.a[g->rules.n], &g->rules_written[g->rules.n]) == 0)
			g->rules.n++;
}

/* The rules of --axis-rules FILE (its axis_rules: key), else the model's n (may be NULL). */
static void load_axis_rules(LoadCtx *lc, const YNode *n)
{
	if (lc->mesh_bad)
		return;
	const char *path = lc->opts ? lc->opts->axis_rules : NULL;
	if (!path) {
		if (n)
			read_rules(lc, n);
		return;
	}
	YDoc doc;
	if (ydoc_parse_file(&doc, path, lc->d) == 0) {
		const YNode *root = doc.root, *r = root && root->kind == YN_MAP ? ynode_get(root, "axis_rules") : NULL;
		if (r)
			spec_cut_mesh(&lc->g->mesh, &lc->g->arena, r), read_rules(lc, r);
		else
			diag_error(lc->d, root ? root->pos : (Pos){path, 1, 1},
			           "expected a mapping with key 'axis_rules' in the --axis-rules file, found %s",
			           root ? "none" : "an empty file");
	}
	ydoc_free(&doc);
}

static void load_sections(LoadCtx *lc, const YNode *root)
{
	static const char *const top_keys[] = {"name", "mesh", "axis_rules", "inputs", "params", "ops", "outputs", "spmd", "train", "pipeline", NULL};
	static const char *const program_keys[] = {"device", "state", "stages", NULL};
	if (read_kind(lc, root) != 0)
		return;
	check_keys(lc, root, top_keys, lc->spmd ? program_keys : NULL);
	const YNode *n = ynode_get(root, "name");
	const char *s;
	if (n && ynode_string(n, &s, lc->d) == 0)
		lc->g->name = arena_strdup(&lc->g->arena, s);
	if ((n = ynode_get(root, "mesh")))
		load_mesh(lc, n);
	if (lc->opts && lc->opts->mesh && !lc->spmd)
		replace_mesh(lc, lc->opts->mesh);
	if (!lc->mesh_bad)
		spec_cut_mesh(&lc->g->mesh, &lc->g->arena, root); /* sub-axes: before any sharding is read */
	if (lc->spmd)
		read_device(lc, root), read_stages(lc, root);
	else
		load_axis_rules(lc, ynode_get(root, "axis_rules"));
	if ((n = require(lc, root, "inputs", "the model")))
		load_values(lc, n, VK_INPUT);
	if ((n = ynode_get(root, "params")))
		load_values(lc, n, VK_PARAM);
	if (lc->spmd && (n = ynode_get(root, "state")))
		load_values(lc, n, VK_STATE);
	if ((n = require(lc, root, "ops", "the model")))
		load_ops(lc, n);
	if ((n = require(lc, root, "outputs", "the model")))
		load_outputs(lc, n);
	if (lc->spmd && lc->g->stage_axis >= 0)
		graph_check_stages(lc->g, lc->d);
	if (lc->spmd && (n = ynode_get(root, "pipeline")))
		expect(lc, n, "no pipeline section in a partitioned program");
	else if (!lc->spmd)
		load_pipeline(lc, ynode_get(root, "pipeline"), ynode_get(root, "ops")); /* spmd/load_pipeline.c */
	if ((n = ynode_get(root, "train")) && lc->spmd)
		load_program_train(lc, n); /* spmd/load_train.c: loss, steps, carry */
	else if (n)
		load_train(lc, n); /* spmd/load_train.c */
}

static int load_doc(Graph *g, const YDoc *doc, LoadKind *kind, const LoadOpts *opts, Diag *d)
{
	const YNode *root = doc->root;
	if (!root) {
		diag_error(d, (Pos){g->file, 1, 1}, "expected a model (a mapping with inputs, ops and outputs), found an empty file");
		return -1;
	}
	LoadCtx lc = {.g = g, .d = d, .programs_ok = kind != NULL, .device = -1, .opts = opts};
	if (root->kind != YN_MAP) {
		expect(&lc, root, "a model (a mapping with inputs, ops and outputs)");
		return -1;
	}
	int nerr = d->nerr;
	load_sections(&lc, root);
	if (kind)
		*kind = (LoadKind){lc.spmd, lc.device};
	names_free(&lc.names);
	names_free(&lc.later);
	vec_free(&lc.ins);
	return d->nerr > nerr ? -1 : 0;
}

/* Load from a file (text NULL) or a string; kind NULL refuses programs. */
static int load_any(Graph *g, const char *path, const char *text, LoadKind *kind, const LoadOpts *opts, Diag *d)
{
	LoadKind none = {false, -1};
	graph_init(g);
	g->file = arena_strdup(&g->arena, path);
	if (kind)
		*kind = none;
	YDoc doc;
	int rc = text ? ydoc_parse_string(&doc, text, g->file, d) : ydoc_parse_file(&doc, g->file, d);
	if (rc == 0)
		rc = load_doc(g, &doc, kind, opts, d);
	ydoc_free(&doc);
	return rc;
}

int model_load(Graph *g, const char *path, Diag *d) { return load_any(g, path, NULL, NULL, NULL, d); }

int model_load_opts(Graph *g, const char *path, const LoadOpts *o, Diag *d)
{
	return load_any(g, path, NULL, NULL, o, d);
}

int model_load_string(Graph *g, const char *text, const char *name, Diag *d)
{
	return load_any(g, name, text, NULL, NULL, d);
}

int model_load_string_opts(Graph *g, const char *text, const char *name, const LoadOpts *o, Diag *d)
{
	return load_any(g, name, text, NULL, o, d);
}

int program_load(Graph *g, const char *path, LoadKind *kind, Diag *d)
{
	LoadKind k;
	return load_any(g, path, NULL, kind ? kind : &k, NULL, d);
}

int program_load_string(Graph *g, const char *text, const char *name, LoadKind *kind, Diag *d)
{
	LoadKind k;
	return load_any(g, name, text, kind ? kind : &k, NULL, d);
}

int program_load_opts(Graph *g, const char *path, LoadKind *kind, const LoadOpts *o, Diag *d)
{
	LoadKind k;
	return load_any(g, path, NULL, kind ? kind : &k, o, d);
}
