/* load_train.c: the train: section of a model — loss, optimizer and options — into a Train on the graph.
 *
 *   train:
 *     loss: loss                               # a float scalar value of the model
 *     optimizer: {type: adam, lr: 1e-3}        # sgd | momentum | adam | adamw | lamb
 *     clip_global_norm: 1.0                    # optional
 *     grad_dtype: bf16                         # optional: f32 (default), bf16, f16
 *     weight_update_sharding: off              # off (default) | on | auto; quoted too; true/false: on/off
 *     all_gather: after_update                 # after_update (default) | before_use | first_use
 *     group_bytes: 1048576                     # collectives of smaller buffers are combined; 0: none
 *     steps: 10                                # default step count of `spmd run`
 *
 * Every error is reported at the node it concerns (docs/format.md). */
#include "load.h"
#include "train_section.h"
#include "../base/yaml.h"

#include <math.h>
#include <string.h>

const char *const opt_names[OPT_COUNT] = {"sgd", "momentum", "adam", "adamw", "lamb"};
const char *const ag_names[3] = {"after_update", "before_use", "first_use"};

typedef struct {
	Graph *g;
	Diag *d;
	Train *t;
} TrainLoad;

static int expect(TrainLoad *L, const YNode *n, const char *what)
{
	char desc[96];
	ynode_describe(n, desc, sizeof desc);
	diag_error(L->d, n->pos, "expected %s, found %s", what, desc);
	return -1;
}

/* Report every key of map not in keys (NULL-terminated); `whose` ends the message. */
static int check_keys(TrainLoad *L, const YNode *map, const char *const *keys, const char *whose)
{
	int rc = 0;
	for (int i = 0; i < map->n; i++) {
		bool ok = false;
		for (const char *const *k = keys; *k && !ok; k++)
			ok = strcmp(*k, map->keys[i]->str) == 0;
		if (ok)
			continue;
		char what[256];
		size_t n = (size_t)snprintf(what, sizeof what, "one of ");
		for (const char *const *k = keys; *k && n < sizeof what; k++)
			n += (size_t)snprintf(what + n, sizeof what - n, "%s%s", k == keys ? "" : ", ", *k);
		if (whose && n < sizeof what)
			snprintf(what + n, sizeof what - n, " (%s)", whose);
		rc = expect(L, map->keys[i], what);
	}
	return rc;
}

/* A finite number in [lo, hi) ((lo, hi) when lo_open) into *out; what names it. */
static int read_number(TrainLoad *L, const YNode *n, double lo, double hi, bool lo_open, const char *what, double *out)
{
	if (ynode_double(n, out, L->d) != 0)
		return -1;
	bool ok = (lo_open ? *out > lo : *out >= lo) && *out < hi && isfinite(*out);
	return ok ? 0 : expect(L, n, what);
}

/* loss: NAME, a float scalar value defined in the model. */
static int read_loss(TrainLoad *L, const YNode *n, int nerr_before)
{
	const char *s;
	if (ynode_string(n, &s, L->d) != 0)
		return -1;
	int v = strchr(s, '%') ? -1 : graph_find(L->g, s);
	if (v < 0) /* after earlier errors the loss may be an op that failed to load */
		return L->d->nerr > nerr_before ? -1 : expect(L, n, "the name of a value of the model as the loss");
	const Value *val = &L->g->values.a[v];
	if (!dtype_is_float(val->dtype)) {
		diag_error(L->d, n->pos, "expected a floating-point loss, found %s '%s'", dtype_names[val->dtype], s);
		return -1;
	}
	if (val->shape.rank != 0) {
		char shape[128];
		shape_format(&val->shape, shape, sizeof shape);
		diag_error(L->d, n->pos, "expected a scalar loss (shape []), found '%s' of shape %s", s, shape);
		return -1;
	}
	L->t->loss = v;
	return 0;
}

/* The defaults of each optimizer: lr, beta1, beta2, eps, weight_decay. */
static void opt_defaults(Train *t)
{
	static const double def[OPT_COUNT][5] = {
		[OPT_SGD] = {0.01, 0, 0, 0, 0},         [OPT_MOMENTUM] = {0.01, 0.9, 0, 0, 0},
		[OPT_ADAM] = {0.001, 0.9, 0.999, 1e-8, 0}, [OPT_ADAMW] = {0.001, 0.9, 0.999, 1e-8, 0.01},
		[OPT_LAMB] = {0.001, 0.9, 0.999, 1e-6, 0},
	};
	const double *p = def[t->opt];
	t->lr = p[0], t->beta1 = p[1], t->beta2 = p[2], t->eps = p[3], t->weight_decay = p[4];
}

/* The fields of each optimizer type. */
static const char *const *opt_fields(OptKind k)
{
	static const char *const sgd[] = {"type", "lr", "weight_decay", NULL},
	                         *const momentum[] = {"type", "lr", "beta1", "weight_decay", NULL},
	                         *const adam[] = {"type", "lr", "beta1", "beta2", "eps", "weight_decay", NULL};
	return k == OPT_SGD ? sgd : k == OPT_MOMENTUM ? momentum : adam;
}

/* The optional fields other than type, each checked for its range. */
static int read_opt_fields(TrainLoad *L, const YNode *n)
{
	Train *t = L->t;
	const YNode *v;
	int rc = 0;
	if ((v = ynode_get(n, "lr")))
		rc |= read_number(L, v, 0, INFINITY, true, "a learning rate > 0", &t->lr);
	if ((v = ynode_get(n, "beta1")))
		rc |= read_number(L, v, 0, 1, false, "a beta1 in [0, 1)", &t->beta1);
	if ((v = ynode_get(n, "beta2")))
		rc |= read_number(L, v, 0, 1, false, "a beta2 in [0, 1)", &t->beta2);
	if ((v = ynode_get(n, "eps")))
		rc |= read_number(L, v, 0, INFINITY, true, "an eps > 0", &t->eps);
	if ((v = ynode_get(n, "weight_decay")))
		rc |= read_number(L, v, 0, INFINITY, false, "a weight_decay >= 0", &t->weight_decay);
	return rc ? -1 : 0;
}

/* optimizer: {type: T, FIELD: X, ...}; only the fields type T uses. */
static int read_optimizer(TrainLoad *L, const YNode *n)
{
	static const char what[] = "an optimizer type (sgd, momentum, adam, adamw or lamb)";
	if (n->kind != YN_MAP)
		return expect(L, n, "an optimizer mapping ({type: sgd, lr: 0.01, ...})");
	const YNode *tn = ynode_get(n, "type");
	if (!tn) {
		diag_error(L->d, n->pos, "expected key 'type' in the optimizer, found none");
		return -1;
	}
	int k = -1;
	for (int i = 0; i < OPT_COUNT && tn->kind == YN_SCALAR; i++)
		if (!strcmp(tn->str, opt_names[i]))
			k = i;
	if (k < 0)
		return expect(L, tn, what);
	L->t->opt = (OptKind)k;
	opt_defaults(L->t);
	char whose[64];
	snprintf(whose, sizeof whose, "the fields of %s", opt_names[k]);
	int rc = check_keys(L, n, opt_fields(L->t->opt), whose);
	return read_opt_fields(L, n) | rc;
}

/* A scalar among names[0..n), plain or quoted (a YAML writer quotes 'on'
 * and 'off'); its index or -1 after reporting. */
static int read_choice(TrainLoad *L, const YNode *n, const char *const *names, int count, const char *what)
{
	for (int i = 0; i < count && n->kind == YN_SCALAR; i++)
		if (!strcmp(n->str, names[i]))
			return i;
	return expect(L, n, what);
}

static int read_options(TrainLoad *L, const YNode *n)
{
	static const char *const dtypes[] = {"f32", "bf16", "f16"}, *const wus[] = {"off", "on", "auto"};
	static const DType dtype_of[] = {DT_F32, DT_BF16, DT_F16};
	Train *t = L->t;
	const YNode *v;
	int rc = 0, k;
	if ((v = ynode_get(n, "clip_global_norm")))
		rc |= read_number(L, v, 0, INFINITY, true, "a clip_global_norm > 0", &t->clip);
	if ((v = ynode_get(n, "grad_dtype"))) {
		k = read_choice(L, v, dtypes, 3, "a gradient dtype (f32, bf16 or f16)");
		rc |= k < 0 ? -1 : 0;
		t->grad_dtype = k < 0 ? DT_F32 : dtype_of[k];
	}
	if ((v = ynode_get(n, "weight_update_sharding"))) {
		bool on; /* a YAML boolean, as a writer emits a bare on or off it read as one */
		Diag quiet;
		diag_init(&quiet);
		quiet.quiet = true;
		k = ynode_bool(v, &on, &quiet) == 0 ? (on ? WUS_ON : WUS_OFF)
		                                    : read_choice(L, v, wus, 3, "weight_update_sharding off, on or auto");
		rc |= k < 0 ? -1 : 0;
		t->wus = k < 0 ? WUS_OFF : (WusMode)k;
	}
	if ((v = ynode_get(n, "all_gather"))) {
		k = read_choice(L, v, ag_names, 3, "all_gather after_update, before_use or first_use");
		rc |= k < 0 ? -1 : 0;
		t->gather_before_use = k >= 1, t->gather_first_use = k == 2;
	}
	if ((v = ynode_get(n, "prefetch"))) {
		static const char *const onoff[] = {"off", "on", "false", "true"};
		static const char what[] = "prefetch on, off or a count of weights 0..64";
		double w = 0;
		if (v->kind == YN_SCALAR && ynode_is_number(v)) {
			if (ynode_double(v, &w, L->d) != 0)
				rc = -1;
			else if (!(w >= 0 && w <= PREFETCH_MAX) || w != (double)(int)w)
				rc = expect(L, v, what);
			else
				t->prefetch = (int)w;
		} else {
			k = read_choice(L, v, onoff, 4, what);
			rc |= k < 0 ? -1 : 0;
			t->prefetch = k >= 0 && k % 2 == 0 ? 0 : PREFETCH_DEFAULT;
		}
	}
	if ((v = ynode_get(n, "group_bytes")) && ynode_int(v, &t->group_bytes, L->d) != 0)
		rc = -1;
	else if (v && (t->group_bytes < 0 || t->group_bytes > (int64_t)SHAPE_MAX_NUMEL))
		rc = expect(L, v, "a group_bytes in 0..1099511627776");
	if ((v = ynode_get(n, "recompute"))) {
		static const char *const onoff[] = {"off", "on", "selective"};
		bool on; /* true or false, or (as weight_update_sharding) on or off; or selective */
		Diag quiet;
		diag_init(&quiet);
		quiet.quiet = true;
		k = ynode_bool(v, &on, &quiet) == 0 ? on : read_choice(L, v, onoff, 3, "recompute true, false or selective");
		rc |= k < 0 ? -1 : 0;
		t->recompute = k < 0 ? RECOMPUTE_OFF : (int8_t)k, t->recompute_pos = v->pos;
	}
	if ((v = ynode_get(n, "steps")) && ynode_int(v, &t->steps, L->d) != 0)
		rc = -1;
	else if (v && (t->steps < 1 || t->steps > 1000000))
		rc = expect(L, v, "a step count in 1..1000000");
	return rc ? -1 : 0;
}

/* A model that trains has params. */
static int check_params(TrainLoad *L, const YNode *n)
{
	for (int v = 0; v < L->g->values.n; v++)
		if (L->g->values.a[v].kind == VK_PARAM)
			return 0;
	diag_error(L->d, n->pos, "expected params to train in a model with a train: section, found none");
	return -1;
}

int load_train(struct LoadCtx *lc, const struct YNode *n)
{
	static const char *const keys[] = {"loss", "optimizer", "clip_global_norm", "grad_dtype",
	                                   "weight_update_sharding", "all_gather", "prefetch", "group_bytes", "recompute", "steps", NULL};
	TrainLoad L = {load_graph(lc), load_diag(lc), NULL};
	int nerr = L.d->nerr;
	if (n->kind != YN_MAP)
		return expect(&L, n, "a train: mapping with loss and optimizer");
	L.t = arena_alloc(&L.g->arena, sizeof *L.t);
	*L.t = (Train){.pos = n->pos, .loss = -1, .grad_dtype = DT_F32, .wus = WUS_OFF, .steps = 1,
	               .group_bytes = 1 << 20, .prefetch = PREFETCH_DEFAULT,
	               .step = -1, .next_step = -1, .clip_scale = -1};
	int rc = check_keys(&L, n, keys, NULL);
	const YNode *ln = ynode_get(n, "loss"), *on = ynode_get(n, "optimizer");
	if (!ln || !on) {
		diag_error(L.d, n->pos, "expected key '%s' in train, found none", ln ? "optimizer" : "loss");
		rc = -1;
	}
	if (ln && read_loss(&L, ln, nerr) != 0)
		rc = -1;
	if (on && read_optimizer(&L, on) != 0)
		rc = -1;
	rc |= read_options(&L, n) | check_params(&L, n);
	L.g->train = L.t;
	return rc ? -1 : 0;
}

/* ---- the train: section of a training program ---- */

/* "f32 [8, 4] sharded [data, null] in blocks [4, 4]" */
static void describe_layout(const Graph *g, const Value *v, char *buf, size_t n)
{
	char global[128], local[128], spec[128];
	shape_format(&v->global, global, sizeof global);
	shape_format(&v->shape, local, sizeof local);
	spec_format(&v->spec, &g->mesh, spec, sizeof spec);
	snprintf(buf, n, "%s %s sharded %s in blocks %s", dtype_names[v->dtype], global, spec, local);
}

/* Is value `from` fit to replace leaf `to` after a step: an op's result with
 * the leaf's dtype, local and global shape and layout?  0, or -1 after
 * reporting at n. */
static int check_carry(TrainLoad *L, const YNode *n, int to, int from)
{
	const Value *t = &L->g->values.a[to], *f = &L->g->values.a[from];
	if (f->producer < 0)
		return expect(L, n, "the name of an op's result to carry to the next step");
	if (f->dtype == t->dtype && shape_eq(&f->shape, &t->shape) && shape_eq(&f->global, &t->global) &&
	    load_same_layout(&f->spec, &t->spec, &L->g->mesh))
		return 0;
	char want[512], got[512];
	describe_layout(L->g, t, want, sizeof want);
	describe_layout(L->g, f, got, sizeof got);
	diag_error(L->d, n->pos, "expected a value laid out as '%s' (%s) to carry to it, found '%s' (%s)", t->name, want,
	           f->name, got);
	return -1;
}

/* One `LEAF: RESULT` of carry, the i-th: a param or state value, each once,
 * the params first, carried from output 1 + i.  0, or -1. */
static int read_carry(TrainLoad *L, struct LoadCtx *lc, const YNode *key, const YNode *val, int i, char *seen)
{
	Train *t = L->t;
	int to = load_name(lc, key), from = load_name(lc, val);
	if (to < 0 || from < 0)
		return -1;
	const Value *tv = &L->g->values.a[to];
	if (tv->producer >= 0 || (tv->kind != VK_PARAM && tv->kind != VK_STATE) || seen[to])
		return expect(L, key, seen[to] ? "each param or state value carried once" : "a param or state value");
	if (tv->kind == VK_PARAM && i != t->nparams)
		return expect(L, key, "the params' carries before the state's");
	if (i + 1 >= L->g->outputs.n || L->g->outputs.a[i + 1] != from) {
		char what[128];
		snprintf(what, sizeof what, "output %d of the program (the carried values follow the loss in order)", i + 1);
		return expect(L, val, what);
	}
	if (check_carry(L, val, to, from) != 0)
		return -1;
	seen[to] = 1;
	t->carry_to[i] = to, t->carry_from[i] = from, t->ncarry = i + 1;
	if (tv->kind == VK_PARAM)
		t->params[t->nparams++] = (TrainParam){.param = to, .grad = -1, .reduced = -1, .grad_in = -1,
		                                       .first_op = -1, .next = from, .state = {-1, -1},
		                                       .next_state = {-1, -1}};
	return 0;
}

/* carry: {LEAF: RESULT, ...} covering every param and state value, the
 * outputs after the loss. */
static int read_carries(TrainLoad *L, struct LoadCtx *lc, const YNode *n)
{
	Graph *g = L->g;
	Train *t = L->t;
	if (n->kind != YN_MAP && !ynode_is_null(n))
		return expect(L, n, "a mapping of params and state to the values that replace them (carry)");
	int cap = n->kind == YN_MAP ? n->n : 0, rc = 0;
	t->carry_from = arena_alloc(&g->arena, sizeof(int) * (size_t)(cap + 1));
	t->carry_to = arena_alloc(&g->arena, sizeof(int) * (size_t)(cap + 1));
	t->params = arena_alloc(&g->arena, sizeof(TrainParam) * (size_t)(cap + 1));
	char *seen = xcalloc((size_t)g->values.n + 1, 1);
	for (int i = 0; i < cap && rc == 0; i++)
		rc = read_carry(L, lc, n->keys[i], n->items[i], i, seen);
	for (int v = 0; v < g->values.n && rc == 0; v++)
		if (!seen[v] && g->values.a[v].producer < 0 &&
		    (g->values.a[v].kind == VK_PARAM || g->values.a[v].kind == VK_STATE)) {
			diag_error(L->d, n->pos, "expected a carry for every param and state value, found none for '%s'",
			           g->values.a[v].name);
			rc = -1;
		}
	free(seen);
	if (rc == 0 && g->outputs.n != t->ncarry + 1)
		rc = expect(L, n, "as many carries as outputs after the loss");
	return rc;
}

int load_program_train(struct LoadCtx *lc, const struct YNode *n)
{
	static const char *const keys[] = {"loss", "steps", "carry", NULL};
	TrainLoad L = {load_graph(lc), load_diag(lc), NULL};
	if (n->kind != YN_MAP)
		return expect(&L, n, "a train: mapping with loss, steps and carry");
	L.t = arena_alloc(&L.g->arena, sizeof *L.t);
	*L.t = (Train){.pos = n->pos, .loss = -1, .grad_dtype = DT_F32, .steps = 1, .built = true, .step = -1,
	               .next_step = -1, .clip_scale = -1};
	int rc = check_keys(&L, n, keys, "a training program's");
	const YNode *ln = ynode_get(n, "loss"), *cn = ynode_get(n, "carry"), *sn = ynode_get(n, "steps");
	if (!ln || !cn) {
		diag_error(L.d, n->pos, "expected key '%s' in train, found none", ln ? "carry" : "loss");
		return -1;
	}
	if (read_loss(&L, ln, 0) != 0) /* quiet after any error: the loss's op may have failed to load */
		return -1;
	if (L.g->outputs.n == 0 || L.g->outputs.a[0] != L.t->loss)
		return expect(&L, ln, "the program's first output as the loss");
	if (sn && ynode_int(sn, &L.t->steps, L.d) != 0)
		rc = -1;
	else if (sn && (L.t->steps < 1 || L.t->steps > 1000000))
		rc = expect(&L, sn, "a step count in 1..1000000");
	rc |= read_carries(&L, lc, cn);
	L.g->train = L.t;
	return rc ? -1 : 0;
}
