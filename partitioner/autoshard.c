/* autoshard.c: choose shardings for a model's inputs and params by an
 * integer program over estimates, the best few priced exactly.
 *
 * The decisions.  Every input and param gets a sharding: each mesh axis
 * (of size > 1) splits one of its dims or none, so data parallelism (the
 * batch dim of the inputs split), Megatron tensor parallelism (one weight
 * split on its output dim, the next on its input dim), 2-D weight sharding
 * (two axes on two dims), vocab-parallel embeddings (the table split on its
 * vocab dim) and the inputs' sequence dim split are all points of one
 * space, not templates.  A param of a training step also gets
 * weight_update_sharding on or off (when some axis replicates it), and the
 * step gets all_gather after_update or before_use (and a param kind of a
 * before_use answer its own after_update or first_use, keep_whole and
 * hold_weights).  Tensors whose names
 * differ only in their digits and that have the same shape are one layer
 * kind and share one choice (unless per_layer).  A user's `sharding:` is
 * kept; the rest of the program is left to propagation.
 *
 * Estimates.  The exact price of a plan (written into the YAML, loaded,
 * built, propagated, partitioned, cost_estimate: the path of `spmd cost`)
 * is linear in the model.  When the model is a chain of repeated layers,
 * a plan is priced on the model cut to one, two and three layers (two,
 * three and four on deep models) and extrapolated by the last layer's
 * increment; plans whose increments are not steady are left out.  Estimates are cached in a hash table.
 *
 * The search.  Per mesh shape and gather mode, seeds: the replicated plan
 * and every split of the axes into batch and tensor axes, weight-update
 * sharding off and on.  The space with the best seed is refined by GLPK
 * integer programs over a second-order expansion of the estimate around a
 * centre (unary changes, and the interactions of kinds that meet), each
 * solution estimated, cut off when it is no better, the next centre when
 * it is.  The fastest estimates and the fastest seeds are priced exactly;
 * the answer is the fastest of those that fits, so never slower than the
 * seeds priced; a ZeRO-3 answer then keeps param kinds whole where that
 * is faster and fits (keep_whole).  The bound reported is
 * cost_compute_bound: no plan on
 * that many devices keeps its compute stream less busy.  docs/autoshard.md
 * has the details. */
#include "autoshard.h"

#include <glpk.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <string.h>

#include "../base/progress.h"
#include "../base/yaml.h"
#include "../spmd/load.h"
#include "../train/train.h"
#include "autoshard_pipe.h"
#include "autoshard_text.h"
#include "pipeline.h"
#include "step.h"

/* PAIR_DEPTH: kinds whose tensors are read within this many ops of each
 * other interact; PAIR_WIDTH: the choices of a kind whose interactions are
 * priced (its fastest alone, by its estimated step time); the rest get none. */
enum { PAIR_DEPTH = 2, PAIR_WIDTH = 4, MAX_ROUNDS = 2, MAX_CUTS = 8 };
/* A param kind holding less than 1/TINY of the params' bytes: a norm's
 * scale, a bias (see seed_plan). */
enum { TINY = 1000 };
/* distinct sizes of the dims tensor-parallel seeds split, kept (more are not looked for) */
enum { NSPLIT = 16 };

typedef struct {
	Spec spec;
	int8_t wus;  /* 0: none written, else WusMode + 1 */
	int twin;    /* the choice with the same spec and weight_update_sharding off (or none) */
	bool follow; /* an activation left to propagation: no sharding written */
	/* changed alone around an earlier centre of this mesh and gather mode,
	 * the plan could not be estimated (not steady, or not partitioned):
	 * not asked again around later centres (see unary_terms) */
	bool dead;
} Choice;

/* The activations the search may pin, found by structure: the residual
 * stream (a layer_norm's result, and its operand when an op made it) and
 * the gather point (the norm's result once scaled and shifted
 * elementwise, where contractions read it).  Sequence parallelism splits
 * the stream's sequence dim and gathers it back at the gather point. */
enum { ROLE_NONE, ROLE_STREAM, ROLE_GATHER };

typedef struct {
	const char *key, *label; /* label: the name with digit runs as '#', and the shape */
	bool fixed, param;
	bool tiny;   /* a param kind of under 1/TINY of the params' bytes (see seed_plan) */
	int8_t role; /* an activation kind (op results): ROLE_STREAM or ROLE_GATHER; else ROLE_NONE */
	bool source; /* a stream kind made from leaves alone (an embedding's lookup): its batch may be pinned */
	int8_t seq;  /* an activation's sequence dim: its first dim after the batch that is not normalised */
	int8_t norm; /* an activation's normalised dim: never split */
	int first;   /* a member leaf */
	int members; /* its leaves */
	int as;      /* >= 0: a kind whose sharding is kept as written (fixed): the value annotated with it, the
	              * members' own or, for unannotated members of a sharding group (shard_as), the group's; its
	              * weight-update sharding is still chosen */
	VEC(Choice) ch;
} Group;

typedef struct {
	int value, group;
} Leaf;

typedef struct {
	int *pick;
	double t;      /* overlapped step time: what the answer minimises */
	double serial; /* the sum of the ops' times: reported beside t */
	int64_t peak;
	bool ok;
	bool pending; /* in the cache, to be estimated by the next run_batch() */
	/* the proxies the plan is estimated on: 0 none yet, 2 the rough
	 * estimate alone (rough()), NPROXY the estimate (t, peak, ok, ...);
	 * and those the next run_batch() is to have */
	int8_t level, need;
	/* the rough estimate from the two smaller proxies (rough()), which
	 * the integer programs' terms take: t2 and peak2, when ok2 (once
	 * level >= 2; where the terms are not rough, roughly(): the estimate) */
	bool ok2;
	double t2;
	int64_t peak2;
	struct ProxyPrice *part; /* per proxy, once priced (done); freed once the plan is estimated */
	double exact_s; /* the seconds pricing the plan exactly on the whole model would take, judged by its estimate's */
	double busy[2];  /* the compute stream's busy seconds a step, and the busiest link's (its collectives) */
	int64_t phase_peak[PHASE_COUNT + 1]; /* per CostPhase the most held after one of its ops; [PHASE_COUNT]: the leaves */
	PipeBest pipe; /* a pipeline: its microbatch count (t and peak are its scheduled step's) */
} Eval;

/* all_gather after_update; before_use with prefetch (PREFETCH_DEFAULT
 * weights ahead), with one weight ahead, and with prefetch off: each one
 * less memory at the peak than the one before, and exposes more */
enum { GATHER_AFTER, GATHER_BEFORE, GATHER_NEAR, GATHER_AT_USE, NGATHER };

/* A plan to price exactly at the end: its mesh, gather mode (GATHER_*) and
 * choices, and its estimate. */
typedef struct {
	Mesh mesh;
	int gather;
	int recompute; /* the train: section's recompute it is written with (RECOMPUTE_*) */
	int *pick;
	double t;
	int64_t peak;
} Cand;

enum { NPROXY = 3 };
/* A chain of at least DEEP layers is estimated on two, three and four of
 * them, not one, two and three: the increments from two layers on are
 * the steadier (over the 49 plans priced exactly in searches of the
 * benchmark's 48- and 96-layer models (12 searches), estimates erred by
 * 0.20% on average and at most 2.8%, against 0.26% and 3.8% from one
 * layer on), and the search's answers were as fast or faster on 25 of the
 * 26 budgets tried on 24, 48 and 96 layers (by up to 13%; 0.15% slower on
 * one).  An estimate costs about half as much again, which deep models,
 * whose exact prices are the dearer, afford; shorter chains keep one, two
 * and three (12 layers searched in under a second). */
enum { DEEP = 16 };
/* Plans priced exactly: the NCAND fastest estimates that fit, and the
 * NSEED fastest seeds (estimates err by a few percent: the seeds that may
 * be best are all priced, so the answer is never slower than they are). */
enum { NCAND = 2, NSEED = 3 };

typedef struct {
	Cand a[NSEED > NCAND ? NSEED : NCAND];
	int n;
} Top;

/* A mesh shape, gather mode and recompute (RECOMPUTE_*) to search: its
 * best seed and that seed's estimate, and its best seed estimated
 * otherwise (another program; NULL when there is none). */
typedef struct {
	Mesh mesh;
	int gather, recompute;
	int *seed, *other;
	Eval est, est_other;
} Space;

/* Spaces the integer programs search: the one with the best seed (of
 * those within SEARCH_CLOSE_PCT percent of it, the one on the fewest live
 * axes), and, when the fastest estimate found there is SEARCH_FAR_PCT
 * percent or more above the compute bound, the next whose best seed is
 * as good within SEARCH_FAR_PCT percent (the seeds' estimates err by some
 * percent, and the rounds from each differ by more: the 12-layer d1024
 * model on 8 TPU v4s within 2.1 GB, 2 x 4 from a seed of 53.7 ms to 48.6,
 * 1 x 8 from one of 55.1 to 41.9; 1 x 8 is searched first, on fewer
 * axes and within SEARCH_CLOSE_PCT).  A space whose best seed is the one
 * before's in the same mode (a mesh's axes swapped, say) is not searched
 * again; in another mode it is searched from its best seed of another
 * program (Space.other). */
enum { NSEARCH = 2, SEARCH_CLOSE_PCT = 3, SEARCH_FAR_PCT = 10 };

/* A proxy's first propagation for one set of shardings (see first_find). */
typedef struct {
	uint64_t hash;
	int k;       /* the proxy */
	int *twins;  /* per group: its choice's twin (the same sharding, weight-update sharding off) */
	Spec *spec;  /* per value of the proxy's fork: what the first run left */
	int n;
} FirstRun;

/* The proxies' first runs for the current templates; any thread reads and
 * adds under the lock (an entry, once in, stays until first_clear). */
typedef struct {
	pthread_mutex_t lock;
	FirstRun **slot; /* open addressing, cap a power of two (0: empty) */
	int n, cap, ngroup;
} FirstCache;

typedef struct {
	const char *text, *file;
	const AutoOpts *o;
	YDoc doc;
	Graph base;
	Mesh mesh;
	bool mesh_long;
	int gather;       /* the current GATHER_* mode */
	const char *hardware;
	int nleaf, ngroup, nact; /* leaves: the inputs and params, then nact activations */
	Leaf *leaf;
	Group *group;
	StrIndex kinds; /* the kinds by key, while make_groups makes them */
	bool *adj;        /* ngroup x ngroup: kinds that meet */
	Eval **cache;     /* open addressing by the hash of the choices; each its own allocation */
	int ncache, cap;
	VEC(Eval *) batch; /* plans entered in the cache and not yet estimated, in the order asked */
	int jobs;         /* threads that estimate a batch */
	ReshardCache *plans; /* reshard plans every estimate shares: they repeat across plans and meshes */
	double exact_s;   /* the longest an exact price is judged to take (Eval.exact_s): --time-limit keeps time for them */
	LayerRange layers; /* the chain of repeated layers (n 0: none) */
	int pbase; /* the first proxy's layers: proxies of pbase, pbase + 1 and pbase + 2 (see DEEP) */
	YDoc proxy[NPROXY]; /* the model with its first pbase, pbase + 1 and pbase + 2 layers: plans are estimated on them */
	/* the proxies loaded and built once per mesh shape, with every first
	 * choice (pins nothing): an estimate forks them and sets its plan's
	 * shardings (apply_plan) instead of loading each again */
	bool have_tmpl;
	Mesh tmpl_mesh;
	int tmpl_recompute; /* ... and the train_recompute they were built with */
	Graph tmpl[NPROXY];
	int *tmpl_value[NPROXY]; /* per leaf: its value in proxy k, or -1 (a layer the proxy leaves out) */
	int *tmpl_copy[NPROXY];  /* per leaf: when the step recomputes, an activation's copy made in the backward (NAME%re), or -1 */
	FactorRules tmpl_rules[NPROXY]; /* the factor rules of proxy k's ops, for its forks */
	double tmpl_s[NPROXY];   /* the seconds loading and building proxy k took (an exact price does that too) */
	FirstCache *firsts; /* the proxies' first propagations, by shardings (first_find) */
	int64_t width;    /* the model's width (width_of): tensor-parallel seeds split the params' other dims */
	int64_t split[NSPLIT]; /* the sizes of the dims those seeds split, of params not tiny (find_split_sizes) */
	int nsplit;
	double lower;     /* the compute bound on the overlapped step time */
	Top cand, seed;   /* the fastest estimates that fit, and seeds, fastest first */
	VEC(Cand) settled; /* plans priced exactly so far (confirm, settle_all), t and peak exact */
	Cand smallest_cand; /* the plan with the smallest estimated peak */
	Cand smallest_seed; /* the seed with the smallest estimated peak (seeds' estimates are the surest) */
	VEC(Space) spaces;
	int64_t smallest_est;
	double start;
	AutoPipe pipe;    /* a pipeline: the stage axis, stage counts tried */
	int64_t micro;    /* > 0: plans are written with this microbatch count (else autopipe_default_m), */
	PipeSchedule sched; /* and this schedule (with virt virtual stages) and recompute where the section does not say them */
	int virt;
	bool recomp;
	PipeBest best_pipe;
	Progress bar;     /* plans priced, when o->progress */
	bool cut, proven; /* proven: every integer program solved to optimality */
	bool enumerated;  /* the space searched was small enough to price every plan of (enumerable) */
	Mesh enum_mesh;   /* ... its mesh and gather mode */
	int enum_gather, enum_recompute;
	bool acts_free;   /* the integer programs move the activation kinds (and keep the rest), else the rest */
	int solves, evaluations, exact;
	int solver_failed; /* integer programs GLPK gave up on with an internal error */
	/* the best plan that fits, over every mesh */
	bool found;
	double best_t, best_serial, best_busy; /* best_busy: its compute stream's busy seconds */
	int64_t best_peak, smallest;
	bool smallest_recompute; /* smallest is of a plan written with recompute */
	int *best_pick;
	Mesh best_mesh;
	int best_gather, best_recompute;
	int8_t *own; /* per group: its params' own all_gather (AG_AFTER_UPDATE; 0: the step's), see keep_whole */
	int depth;   /* > 0: the answer's prefetch depth (tune_prefetch), else its gather mode's */
	char *best_text;
	int train_recompute; /* the plans are written with the train: section's recompute: true or selective (RECOMPUTE_*) */
	int64_t sel_floor; /* the step recomputing selectively: its memory floor (-1: the search may not write it; select_spaces) */
	bool sel_needed;   /* the answer recomputes selectively, and no plan found without fits (search_selective) */
} Search;

/* Seconds the search may go on: --time-limit less the time already
 * spent and the time the exact prices at the end take when the limit cut
 * the search (one on each thread, judged by the longest estimate's
 * exact_s: settle_all); infinite without a limit. */
static double time_left(const Search *s)
{
	if (s->o->time_limit <= 0)
		return INFINITY;
	return s->o->time_limit - (now_seconds() - s->start) - s->exact_s;
}

static bool out_of_time(Search *s)
{
	if (time_left(s) <= 0)
		s->cut = true;
	return s->cut;
}

/* ---- the decisions ---- */

/* The layer-kind key of a leaf: kind, name with digit runs as '#', shape,
 * annotated, dtype; *label gets the name and shape. */
static const char *leaf_key(Search *s, const Value *v, const char **label)
{
	char name[256], shape[128];
	size_t k = 0;
	for (const char *c = v->name; *c && k + 1 < sizeof name; c++)
		if (!(*c >= '0' && *c <= '9'))
			name[k++] = *c;
		else if (k == 0 || name[k - 1] != '#')
			name[k++] = '#';
	name[k] = 0;
	shape_format(&v->shape, shape, sizeof shape);
	*label = arena_printf(&s->base.arena, "%s %s", s->o->per_layer ? v->name : name, shape);
	if (s->o->per_layer)
		return arena_printf(&s->base.arena, "%s", v->name);
	return arena_printf(&s->base.arena, "%d %s %s %d %d", v->kind, name, shape, v->has_spec, v->dtype);
}

/* Value v in its layer kind (a new one when none has its key). */
static void add_leaf(Search *s, int v, int8_t role, int8_t norm, int as)
{
	const Value *val = &s->base.values.a[v];
	const char *label, *key = leaf_key(s, val, &label);
	if (role)
		key = arena_printf(&s->base.arena, "%s act %d %d", key, role, norm);
	bool grouped = val->shard_as && !val->has_spec; /* a sharding group's member (shard_as) not annotated itself */
	if (val->has_spec) { /* kept as annotated: tensors annotated alike are one kind */
		char spec[256];
		spec_format(&val->spec, &s->base.mesh, spec, sizeof spec);
		key = arena_printf(&s->base.arena, "%s %s p%d", key, spec, val->priority);
	} else if (grouped && as >= 0) /* the group's annotation kept: a kind of its own */
		key = arena_printf(&s->base.arena, "%s as %s", key, val->shard_as);
	else if (grouped) { /* none annotated: one choice for all its members, whatever their names */
		char shape[128];
		shape_format(&val->shape, shape, sizeof shape);
		key = arena_printf(&s->base.arena, "shard_as %s %s %d", val->shard_as, shape, val->dtype);
		label = arena_printf(&s->base.arena, "shard_as %s %s", val->shard_as, shape);
	}
	int g = strindex_put(&s->kinds, key, s->ngroup);
	if (g == s->ngroup) {
		int8_t seq = 1;
		while (seq == norm)
			seq++;
		s->ngroup++;
		s->group[g] = (Group){.key = key, .label = label, .fixed = val->has_spec || (grouped && as >= 0),
		                      .param = val->kind == VK_PARAM, .role = role, .seq = seq, .norm = norm,
		                      .first = s->nleaf, .as = val->has_spec ? v : grouped ? as : -1};
	}
	s->leaf[s->nleaf++] = (Leaf){v, g};
}

/* Per value of a sharding group (shard_as): the group's annotated member
 * defined first (value ids are in the file's order), as propagation takes
 * the group's sharding from it; -1 for the others.  Linear: one table of
 * the groups' names. */
static int *group_annotations(const Graph *b)
{
	int n = b->values.n, *as = xmalloc(sizeof(int) * ((size_t)n + 1));
	int *first = xmalloc(sizeof(int) * ((size_t)n + 1)), ngroup = 0; /* per group, its annotated member */
	StrIndex group;
	strindex_init(&group, 16);
	for (int pass = 0; pass < 2; pass++)
		for (int v = 0; v < n; v++) {
			const char *name = b->values.a[v].shard_as;
			as[v] = -1;
			if (!name)
				continue;
			int j = strindex_put(&group, name, ngroup);
			if (j == ngroup)
				first[ngroup++] = -1;
			if (pass == 0 && b->values.a[v].has_spec && first[j] < 0)
				first[j] = v;
			as[v] = first[j];
		}
	strindex_free(&group), free(first);
	return as;
}

/* Mark v with a role (the stream's wins) and its normalised dim. */
static void set_role(int8_t *role, int8_t *norm, int v, int r, int axis)
{
	if (role[v] != ROLE_STREAM)
		role[v] = (int8_t)r, norm[v] = (int8_t)axis;
}

/* The residual stream and the gather points of the model's layer_norms:
 * from a norm's result, follow the one op reading it while that op is
 * elementwise (the scale and the shift) and keeps the shape; where it
 * stops, contractions read the value. */
static void find_roles(const Search *s, int8_t *role, int8_t *norm)
{
	const Graph *b = &s->base;
	int *use = xmalloc(sizeof(int) * (size_t)(b->values.n + 1));
	for (int i = 0; i < b->ops.n; i++)
		for (int k = 0; k < b->ops.a[i].nin; k++)
			use[b->ops.a[i].in[k]] = i;
	for (int i = 0; i < b->ops.n; i++) {
		const Op *op = &b->ops.a[i];
		if (op->kind != OP_LAYER_NORM)
			continue;
		int v = op->out, axis = op->attr->axes[0];
		axis += axis < 0 ? b->values.a[v].shape.rank : 0;
		set_role(role, norm, v, ROLE_STREAM, axis);
		if (b->values.a[op->in[0]].kind == VK_INTER)
			set_role(role, norm, op->in[0], ROLE_STREAM, axis);
		for (;;) {
			const Op *next = b->values.a[v].nuses == 1 ? &b->ops.a[use[v]] : NULL;
			if (!next || (next->kind != OP_ADD && next->kind != OP_MUL && next->kind != OP_SUB && next->kind != OP_DIV) ||
			    !shape_eq(&b->values.a[next->out].shape, &b->values.a[v].shape))
				break;
			v = next->out;
		}
		if (v != op->out)
			set_role(role, norm, v, ROLE_GATHER, axis);
	}
	free(use);
}

static void make_groups(Search *s)
{
	const Graph *b = &s->base;
	s->leaf = xcalloc((size_t)b->values.n + 1, sizeof *s->leaf);
	s->group = xcalloc((size_t)b->values.n + 1, sizeof *s->group);
	strindex_init(&s->kinds, (size_t)b->values.n);
	int *as = group_annotations(b);
	for (int v = 0; v < b->values.n; v++)
		if (b->values.a[v].kind == VK_INPUT || b->values.a[v].kind == VK_PARAM)
			add_leaf(s, v, ROLE_NONE, 0, as[v]);
	free(as);
	int8_t *role = xcalloc((size_t)b->values.n + 1, 1), *norm = xcalloc((size_t)b->values.n + 1, 1);
	find_roles(s, role, norm);
	/* an activation with a sequence dim (some dim after the first that is
	 * not normalised) and no sharding of the user's */
	for (int v = 0; v < b->values.n; v++) {
		const Value *val = &b->values.a[v];
		if (role[v] && !val->has_spec && !val->shard_as && val->shape.rank >= 2 + (norm[v] >= 1)) {
			add_leaf(s, v, role[v], norm[v], -1), s->nact++;
			const Op *op = &b->ops.a[val->producer];
			bool leaves = role[v] == ROLE_STREAM && norm[v] != 0;
			for (int k = 0; k < op->nin; k++)
				leaves &= b->values.a[op->in[k]].producer < 0;
			s->group[s->leaf[s->nleaf - 1].group].source = leaves;
		}
	}
	free(role), free(norm);
	strindex_free(&s->kinds);
	double total = 0, *bytes = xcalloc((size_t)s->ngroup + 1, sizeof *bytes);
	for (int i = 0; i < s->nleaf; i++) {
		const Value *v = &b->values.a[s->leaf[i].value];
		double n = (double)shape_numel(&v->shape) * dtype_size(v->dtype);
		if (v->kind == VK_PARAM)
			total += n, bytes[s->leaf[i].group] += n;
		s->group[s->leaf[i].group].members++;
	}
	for (int g = 0; g < s->ngroup; g++)
		s->group[g].tiny = s->group[g].param && bytes[g] * TINY < total;
	free(bytes);
}

/* Axis a splits tensors: it has more than one device and does not hold
 * pipeline stages (each stage is partitioned with that axis of size 1). */
static bool axis_live(const Search *s, int a) { return s->mesh.size[a] > 1 && a != s->pipe.axis; }

/* Append spec (and its weight-update variants) to g's choices. */
static void add_choice(Search *s, Group *g, const Spec *sp)
{
	bool train = s->base.train && g->param && !s->o->keep_train;
	unsigned reps = 0;
	for (int a = 0; a < s->mesh.naxes; a++)
		if (axis_live(s, a) && spec_replicated_over(sp, a))
			reps |= 1u << a;
	int twin = g->ch.n;
	vec_push(&g->ch, ((Choice){.spec = *sp, .wus = (int8_t)(train ? WUS_OFF + 1 : 0), .twin = twin}));
	if (train && reps)
		vec_push(&g->ch, ((Choice){.spec = *sp, .wus = WUS_ON + 1, .twin = twin}));
}

/* Whether a dim of n split into k shards is tried: k divides n, or the
 * shards are uneven (each ceil(n / k), padded), as long as there are no
 * more shards than elements: a vocabulary of 50257 over 8 devices (7
 * shards of 6283, the last 6276), a batch of 12 over 8 (six shards of 2,
 * two empty: 2 rows a device where 4-way takes 3); not 64 heads over 256
 * devices. */
static bool split_ok(int64_t n, int64_t k)
{
	return k <= n;
}

/* Every assignment of the mesh axes (size > 1) to a dim or none whose
 * shard counts split the dims (split_ok), replicated first. */
static void enumerate(Search *s, Group *g, const Shape *shape, int *dim_of, int a)
{
	const Mesh *m = &s->mesh;
	if (a == m->naxes) {
		Spec sp = {.rank = (uint8_t)shape->rank};
		int64_t n[MAX_RANK];
		for (int d = 0; d < shape->rank; d++)
			n[d] = 1;
		for (int x = 0; x < m->naxes; x++)
			if (dim_of[x] >= 0) {
				sp.ax[dim_of[x]][sp.nax[dim_of[x]]++] = (uint8_t)x;
				n[dim_of[x]] *= m->size[x];
			}
		for (int d = 0; d < shape->rank; d++)
			if (!split_ok(shape->dim[d], n[d]))
				return;
		add_choice(s, g, &sp);
		return;
	}
	for (int d = -1; d < (axis_live(s, a) ? shape->rank : 0); d++) {
		dim_of[a] = d;
		enumerate(s, g, shape, dim_of, a + 1);
	}
}

/* The axes that split tensors (axis_live), a bit each. */
static unsigned live_axes(const Search *s)
{
	unsigned live = 0;
	for (int a = 0; a < s->mesh.naxes; a++)
		live |= (unsigned)axis_live(s, a) << a;
	return live;
}

/* An activation's choices: follow propagation (first, so that the plan
 * of every first choice pins nothing), and its sequence dim split over
 * each set of live axes that splits it (split_ok; the stream) or not split (the
 * gather point), its normalised dim whole, the other dims open.  Where
 * the stream starts (made from leaves: an embedding's lookup) also its
 * batch dim split over each such set, the rest whole: a table split on
 * its model dim then sends its lookup's result to the batch's devices
 * (an all_to_all of one device's rows), where propagation would keep the
 * table's split into the layers or the vocabulary's partial sums would be
 * reduce_scattered (each device's rows for every device's batch). */
static void act_choices(Search *s, Group *g, const Shape *shape)
{
	Spec sp = {.rank = (uint8_t)shape->rank};
	vec_push(&g->ch, ((Choice){.spec = sp, .twin = 0, .follow = true}));
	for (int d = 0; d < shape->rank; d++)
		sp.open |= (uint8_t)((d != g->seq && d != g->norm) << d);
	unsigned live = live_axes(s);
	for (unsigned set = g->role == ROLE_STREAM ? 1 : 0; set <= (g->role == ROLE_STREAM ? live : 0); set++) {
		if (set & ~live)
			continue;
		Spec t = sp;
		int64_t n = 1;
		for (int a = 0; a < s->mesh.naxes; a++)
			if (set >> a & 1)
				t.ax[g->seq][t.nax[g->seq]++] = (uint8_t)a, n *= s->mesh.size[a];
		int twin = g->ch.n; /* itself: read before the push, which moves n */
		if (split_ok(shape->dim[g->seq], n))
			vec_push(&g->ch, ((Choice){.spec = t, .twin = twin}));
	}
	for (unsigned set = 1; g->source && set <= live; set++) {
		if (set & ~live)
			continue;
		Spec t = {.rank = (uint8_t)shape->rank};
		int64_t n = 1;
		for (int a = 0; a < s->mesh.naxes; a++)
			if (set >> a & 1)
				t.ax[0][t.nax[0]++] = (uint8_t)a, n *= s->mesh.size[a];
		int twin = g->ch.n;
		if (split_ok(shape->dim[0], n))
			vec_push(&g->ch, ((Choice){.spec = t, .twin = twin}));
	}
}

static void make_choices(Search *s)
{
	for (int i = 0; i < s->ngroup; i++) {
		Group *g = &s->group[i];
		g->ch.n = 0;
		const Value *v = &s->base.values.a[s->leaf[g->first].value];
		int dim_of[MESH_MAX_AXES];
		if (g->role)
			act_choices(s, g, &v->shape);
		else if (g->fixed)
			add_choice(s, g, &s->base.values.a[g->as].spec);
		else
			enumerate(s, g, &v->shape, dim_of, 0);
	}
}

/* The answer's mesh, gather mode and recompute made current, with its mesh's choices. */
static void at_best(Search *s)
{
	s->mesh = s->best_mesh, s->gather = s->best_gather, s->train_recompute = s->best_recompute;
	make_choices(s);
}

/* Kinds that meet: leaves read within PAIR_DEPTH ops of two or more
 * operands upstream of one op. */
static void collect(const Search *s, const int *group_of, int v, int depth, bool *seen)
{
	const Value *val = &s->base.values.a[v];
	if (group_of[v] >= 0)
		seen[group_of[v]] = true;
	if (val->producer >= 0 && depth > 0) { /* leaves have none; activations are walked through */
		const Op *op = &s->base.ops.a[val->producer];
		for (int k = 0; k < op->nin; k++) /* one-operand ops cost no depth */
			collect(s, group_of, op->in[k], op->nin > 1 ? depth - 1 : depth, seen);
	}
}

static void make_pairs(Search *s)
{
	int n = s->ngroup, *group_of = xmalloc(sizeof(int) * (size_t)(s->base.values.n + 1));
	for (int v = 0; v < s->base.values.n; v++)
		group_of[v] = -1;
	for (int i = 0; i < s->nleaf; i++)
		group_of[s->leaf[i].value] = s->leaf[i].group;
	s->adj = xcalloc((size_t)(n * n + 1), 1);
	bool *seen = xmalloc((size_t)n + 1);
	for (int i = 0; i < s->base.ops.n; i++) {
		memset(seen, 0, (size_t)n + 1);
		collect(s, group_of, s->base.ops.a[i].out, PAIR_DEPTH, seen);
		for (int g = 0; g < n; g++)
			for (int h = g + 1; seen[g] && h < n; h++)
				s->adj[g * n + h] |= seen[h];
	}
	free(seen);
	free(group_of);
}

/* ---- pricing a plan ---- */

/* The prefetch depth of a gather mode: the model's own where its train:
 * section is kept, the depth tune_prefetch chose for the answer's. */
static int gather_depth(const Search *s, int gather)
{
	if (s->o->keep_train && s->base.train)
		return s->base.train->prefetch;
	if (s->depth > 0 && gather == s->best_gather)
		return s->depth;
	return gather == GATHER_BEFORE ? PREFETCH_DEFAULT : gather == GATHER_NEAR ? 1 : 0;
}

static char *plan_of(const Search *s, const YNode *root, const int *pick, int gather)
{
	const char **name = xmalloc(sizeof(char *) * (size_t)(s->nleaf + 1));
	Spec *spec = xmalloc(sizeof(Spec) * (size_t)(s->nleaf + 1));
	int8_t *wus = xmalloc((size_t)s->nleaf + 1), *own = xcalloc((size_t)s->nleaf + 1, 1);
	uint8_t *as = xcalloc((size_t)s->nleaf + 1, 1);
	int nleaf = s->nleaf - s->nact, npin = nleaf;
	for (int i = 0; i < s->nleaf; i++) {
		const Choice *c = &s->group[s->leaf[i].group].ch.a[pick[s->leaf[i].group]];
		int k = i < nleaf ? i : npin; /* the pinned activations after the leaves, in order */
		if (c->follow)
			continue;
		as[k] = s->group[s->leaf[i].group].as >= 0;
		name[k] = s->base.values.a[s->leaf[i].value].name, spec[k] = c->spec, wus[k] = c->wus;
		own[k] = s->own && i < nleaf ? s->own[s->leaf[i].group] : 0;
		npin += i >= nleaf;
	}
	PlanText p = {.mesh = &s->mesh, .mesh_long = s->mesh_long, .hardware = s->hardware, .nleaf = nleaf,
	              .leaf = name, .spec = spec, .wus = wus, .gather = own, .as_group = as, .nact = npin - nleaf,
	              .act = name + nleaf,
	              .act_spec = spec + nleaf, .set_train = s->base.train && !s->o->keep_train,
	              .gather_before_use = gather != GATHER_AFTER, .prefetch = gather_depth(s, gather),
	              .microbatches = s->micro ? s->micro : autopipe_default_m(&s->pipe, &s->base, &s->mesh),
	              .stages_auto = autopipe_stages_auto(&s->pipe, &s->mesh), .train_recompute = s->train_recompute};
	if (s->micro) /* written as priced: autopipe_price chose what the section leaves open */
		p.set_schedule = !s->base.pipeline->schedule_given, p.schedule = s->sched, p.virtual_stages = s->virt,
		p.set_recompute = !s->base.pipeline->recompute_given && s->base.train, p.recompute = s->recomp;
	char *text = plan_text(root, &p);
	free(name);
	free(spec);
	free(wus);
	free(own);
	free(as);
	return text;
}

/* Load and build text as `spmd cost` does, into g (freed when false). */
static bool load_text(const Search *s, const char *text, Graph *g)
{
	Diag d;
	diag_init(&d);
	d.quiet = true;
	if (model_load_string(g, text, s->file, &d) == 0 && (!g->train || train_build(g, &d) == 0))
		return true;
	graph_free(g);
	return false;
}

/* Propagate, partition and price loaded model g (freed) as `spmd cost`
 * does.  rules: those of the graph g was forked from, or NULL.  A proxy
 * keeps its step's order as built: the weight update moved into the
 * backward pass (partitioner/order.h) gains a proxy of one, two or three
 * layers amounts that do not grow by the layer, so the search ranks
 * plans by their unmoved steps, and every exact price (the answer's
 * included) is of the program `spmd cost` prices, moved where faster. */
static bool price_graph(const Search *s, Graph *g, const FactorRules *rules, const Spec *first, Spec **keep_first,
                        bool proxy, Eval *ev)
{
	Graph prog;
	Diag d;
	diag_init(&d);
	d.quiet = true, d.terse = true; /* the program is only priced: no reasons written */
	graph_init(&prog);
	int *map = NULL;
	CostEstimate pre;
	PassShare share = {s->plans, rules, first, keep_first, .priced = &pre, .keep_order = proxy};
	pre.op = NULL;
#if SPMD_VERIFY_PARTITION /* test builds: the floor autoshard proves plans over budget with holds */
	int64_t floor = g->pipeline ? 0 : cost_step_floor(g, g->mesh.ndev);
#endif
	bool ok = pipeline_partition_replicated(g, s->o->pass_hw, &share, &prog, &map, NULL, &d) == 0; /* a pipeline: priced per stage */
	if (ok) { /* the steady state of a long run, as spmd cost prices it */
		CostEstimate e;
		if (pre.op && s->o->hw == s->o->pass_hw) { /* the pipeline priced it so already */
			e = pre, pre.op = NULL;
		} else { /* the search ranks by the steady step alone */
			step_price(g, &prog, map, s->o->hw, &e);
		}
		memcpy(ev->phase_peak, e.phase_peak, sizeof e.phase_peak);
		ev->phase_peak[PHASE_COUNT] = e.mem.params + e.mem.state + e.mem.inputs; /* the leaves */
		ev->busy[0] = e.compute_s, ev->busy[1] = e.link_busy_s;
		ev->t = e.overlapped_s, ev->serial = e.serial_s, ev->peak = e.mem.peak;
		ok = isfinite(ev->t) && isfinite(ev->serial);
#if SPMD_VERIFY_PARTITION
		if (e.mem.peak < floor) {
			fprintf(stderr, "autoshard: internal: a plan peaks at %lld bytes, below the floor %lld\n",
			        (long long)e.mem.peak, (long long)floor);
			abort();
		}
#endif
		if (ok && g->pipeline) /* ranked by the scheduled step of the best microbatch count */
			ok = autopipe_price(&s->pipe, g, &prog, s->o->hw, &e, s->o->budget, &ev->pipe);
		if (ok && g->pipeline)
			ev->t = ev->pipe.step_s, ev->peak = (int64_t)ceil(ev->pipe.peak);
		cost_estimate_free(&e);
	}
	if (pre.op)
		cost_estimate_free(&pre);
	free(map);
	graph_free(&prog);
	graph_free(g);
	return ok;
}

/* Load, build, propagate, partition and price text as `spmd cost` does
 * (a proxy: with the step's order as built, see price_graph). */
static bool price_text_as(const Search *s, const char *text, bool proxy, Eval *ev)
{
	Graph g;
	return load_text(s, text, &g) && price_graph(s, &g, NULL, NULL, NULL, proxy, ev);
}

static bool price_text(const Search *s, const char *text, Eval *ev) { return price_text_as(s, text, false, ev); }

/* Are plans priced on the whole model (no chain of layers, or a pipeline,
 * whose step is no sum of layers), not estimated on the proxies? */
static bool priced_whole(const Search *s) { return s->layers.n == 0 || s->pipe.axis >= 0; }

static bool same_mesh(const Mesh *a, const Mesh *b)
{
	if (a->naxes != b->naxes || a->devices || b->devices)
		return false;
	for (int i = 0; i < a->naxes; i++)
		if (a->size[i] != b->size[i] || strcmp(a->name[i], b->name[i]))
			return false;
	return true;
}

static void first_clear(FirstCache *c)
{
	for (int i = 0; i < c->cap; i++)
		if (c->slot[i])
			free(c->slot[i]->twins), free(c->slot[i]->spec), free(c->slot[i]);
	free(c->slot);
	c->slot = NULL, c->n = c->cap = 0;
}

/* The key of plan pick's first propagation on proxy k: the twins of its
 * choices.  That run reads the shardings the plan writes, not its
 * weight_update_sharding nor the gather mode (only wus_apply and the
 * second run do), so plans that differ only there share it: a third of
 * the estimates of the 12-layer 16-H100 search, half of the tight 8-TPU
 * one. */
static uint64_t first_key(const Search *s, int k, const int *pick, int *twins)
{
	uint64_t h = 14695981039346656037u ^ (uint64_t)k;
	for (int g = 0; g < s->ngroup; g++)
		twins[g] = s->group[g].ch.a[pick[g]].twin, h = (h ^ (uint64_t)(uint32_t)twins[g]) * 1099511628211u;
	return h;
}

/* The slot of the first run keyed (h, k, twins): its entry or an empty one.
 * Holds the lock. */
static FirstRun **first_slot(FirstCache *c, uint64_t h, int k, const int *twins)
{
	for (uint64_t i = h;; i++) {
		FirstRun **e = &c->slot[i & (uint64_t)(c->cap - 1)];
		if (!*e || ((*e)->hash == h && (*e)->k == k && !memcmp((*e)->twins, twins, sizeof(int) * (size_t)c->ngroup)))
			return e;
	}
}

/* The remembered first run of (k, twins), or NULL. */
static const FirstRun *first_find(FirstCache *c, uint64_t h, int k, const int *twins)
{
	pthread_mutex_lock(&c->lock);
	FirstRun *e = c->cap ? *first_slot(c, h, k, twins) : NULL;
	pthread_mutex_unlock(&c->lock);
	return e; /* never freed while the templates stand */
}

/* Remember spec (taken), the first run of (k, twins) on a fork of n values. */
static void first_put(FirstCache *c, uint64_t h, int k, const int *twins, Spec *spec, int n)
{
	pthread_mutex_lock(&c->lock);
	if (2 * (c->n + 1) > c->cap) {
		FirstRun **old = c->slot;
		int cap = c->cap;
		c->cap = cap ? 2 * cap : 256;
		c->slot = xcalloc((size_t)c->cap, sizeof *c->slot);
		for (int i = 0; i < cap; i++)
			if (old[i])
				*first_slot(c, old[i]->hash, old[i]->k, old[i]->twins) = old[i];
		free(old);
	}
	FirstRun **e = first_slot(c, h, k, twins);
	if (*e) { /* another thread ran it too: the same result */
		free(spec);
	} else {
		FirstRun *r = xmalloc(sizeof *r);
		r->hash = h, r->k = k, r->spec = spec, r->n = n;
		r->twins = xmalloc(sizeof(int) * ((size_t)c->ngroup + 1));
		memcpy(r->twins, twins, sizeof(int) * (size_t)c->ngroup);
		*e = r;
		c->n++;
	}
	pthread_mutex_unlock(&c->lock);
}

static void free_templates(Search *s)
{
	first_clear(s->firsts);
	for (int k = 0; k < NPROXY && s->have_tmpl; k++)
		graph_free(&s->tmpl[k]), free(s->tmpl_value[k]), free(s->tmpl_copy[k]), factor_rules_free(&s->tmpl_rules[k]);
	s->have_tmpl = false;
}

/* Proxy k's template loaded and built (ok[k]: whether it could be). */
typedef struct {
	Search *s;
	bool *ok;
} Tmpl;

static void make_template(void *ctx, int j)
{
	Tmpl *t = ctx;
	Search *s = t->s;
	int k = NPROXY - 1 - j; /* the largest first */
	double t0 = now_seconds();
	int *pick = xcalloc((size_t)s->ngroup + 1, sizeof *pick);
	char *text = plan_of(s, s->proxy[k].root, pick, s->gather);
	free(pick);
	t->ok[k] = load_text(s, text, &s->tmpl[k]);
	free(text);
	if (!t->ok[k])
		return;
	propagate_remember_order(&s->tmpl[k]);
	factor_rules_make(&s->tmpl_rules[k], &s->tmpl[k]);
	s->tmpl_s[k] = now_seconds() - t0;
	bool recomputes = s->train_recompute || (s->base.train && s->base.train->recompute);
	s->tmpl_value[k] = xmalloc(sizeof(int) * ((size_t)s->nleaf + 1));
	s->tmpl_copy[k] = xmalloc(sizeof(int) * ((size_t)s->nleaf + 1));
	/* the leaves by name, and their recomputed copies' (name%re) */
	const char **names = xmalloc(sizeof *names * (2 * (size_t)s->nleaf + 1));
	int *ids = xmalloc(sizeof(int) * (2 * (size_t)s->nleaf + 1)), ncopy = 0;
	for (int i = 0; i < s->nleaf; i++) {
		names[i] = s->base.values.a[s->leaf[i].value].name;
		if (recomputes && i >= s->nleaf - s->nact) {
			size_t len = strlen(names[i]) + sizeof "%re";
			char *re = xmalloc(len);
			snprintf(re, len, "%s%%re", names[i]);
			names[s->nleaf + ncopy++] = re;
		}
	}
	graph_find_many(&s->tmpl[k], names, s->nleaf + ncopy, ids);
	for (int i = 0, c = 0; i < s->nleaf; i++) {
		s->tmpl_value[k][i] = ids[i];
		s->tmpl_copy[k][i] = recomputes && i >= s->nleaf - s->nact ? ids[s->nleaf + c++] : -1;
	}
	for (int c = 0; c < ncopy; c++)
		free((char *)names[s->nleaf + c]);
	free(names), free(ids);
}

/* Load and build the proxies for the current mesh once (see Search.tmpl),
 * the largest first, on s->jobs threads; when one cannot be, estimates
 * load each plan's text instead. */
static void make_templates(Search *s)
{
	if (priced_whole(s) ||
	    (s->have_tmpl && same_mesh(&s->tmpl_mesh, &s->mesh) && s->tmpl_recompute == s->train_recompute))
		return;
	free_templates(s);
	s->firsts->ngroup = s->ngroup;
	bool ok[NPROXY];
	parallel_for(NPROXY, s->jobs, make_template, &(Tmpl){s, ok});
	s->have_tmpl = true;
	for (int k = 0; k < NPROXY; k++)
		s->have_tmpl &= ok[k];
	for (int k = 0; k < NPROXY && !s->have_tmpl; k++)
		if (ok[k])
			graph_free(&s->tmpl[k]), free(s->tmpl_value[k]), free(s->tmpl_copy[k]), factor_rules_free(&s->tmpl_rules[k]);
	s->tmpl_mesh = s->mesh, s->tmpl_recompute = s->train_recompute;
}

/* Set plan pick on g, a fork of proxy k's template: what loading the
 * plan's text (plan_of) sets — the leaves' shardings and weight-update
 * sharding, the pinned activations, the optimizer state sharded like its
 * param (train_build), the gather mode. */
static void apply_plan(const Search *s, int k, const int *pick, Graph *g)
{
	for (int i = 0; i < s->nleaf; i++) {
		int v = s->tmpl_value[k][i];
		const Choice *c = &s->group[s->leaf[i].group].ch.a[pick[s->leaf[i].group]];
		if (v < 0 || c->follow)
			continue;
		Value *val = &g->values.a[v];
		if (val->kind == VK_PARAM)
			val->wus = c->wus;
		if (s->group[s->leaf[i].group].as >= 0) /* kept as written (annotated, or a sharding group's) */
			continue;
		val->has_spec = true, val->spec = c->spec, val->priority = 0;
		if (s->tmpl_copy[k][i] >= 0) { /* recomputed in the backward: its copy is annotated alike (train_build) */
			Value *re = &g->values.a[s->tmpl_copy[k][i]];
			re->has_spec = true, re->spec = c->spec, re->priority = 0;
		}
	}
	for (int v = 0; s->base.train && !s->o->keep_train && v < g->values.n; v++)
		g->values.a[v].gather = 0; /* the step's, chosen (as plan_of writes it) */
	for (int i = 0; s->own && i < s->nleaf; i++) /* but the kinds keep_whole keeps whole */
		if (s->tmpl_value[k][i] >= 0 && s->own[s->leaf[i].group])
			g->values.a[s->tmpl_value[k][i]].gather = s->own[s->leaf[i].group];
	train_shard_states(g);
	Train *t = g->train;
	if (t && s->base.train && !s->o->keep_train)
		t->gather_before_use = s->gather != GATHER_AFTER, t->prefetch = gather_depth(s, s->gather);
}

static uint64_t pick_hash(const int *pick, int n)
{
	uint64_t h = 14695981039346656037u;
	for (int i = 0; i < n; i++)
		h = (h ^ (uint64_t)(uint32_t)pick[i]) * 1099511628211u;
	return h;
}

/* Proxy k's estimate of plan pick: a fork of its template, else its text. */
static bool price_proxy(const Search *s, int k, const int *pick, Eval *ev)
{
	if (!s->have_tmpl) {
		char *text = plan_of(s, s->proxy[k].root, pick, s->gather);
		bool ok = price_text_as(s, text, true, ev);
		free(text);
		return ok;
	}
	Graph g;
	graph_fork(&s->tmpl[k], &g);
	apply_plan(s, k, pick, &g);
	int *twins = xmalloc(sizeof(int) * ((size_t)s->ngroup + 1));
	uint64_t h = first_key(s, k, pick, twins);
	/* only plans that choose weight-update sharding have twins to share with */
	bool share = s->base.train && !s->o->keep_train;
	const FirstRun *fr = share ? first_find(s->firsts, h, k, twins) : NULL;
	Spec *kept = NULL;
	int n = g.values.n;
	bool ok = price_graph(s, &g, &s->tmpl_rules[k], fr && fr->n == n ? fr->spec : NULL, share && !fr ? &kept : NULL,
	                      true, ev);
	if (kept)
		first_put(s->firsts, h, k, twins, kept, n);
	free(twins);
#if SPMD_VERIFY_PARTITION /* test builds: the fork prices the plan as its text does (one plan in 4) */
	if (pick_hash(pick, s->ngroup) >> 40 & 3)
		return ok;
	char *text = plan_of(s, s->proxy[k].root, pick, s->gather);
	Eval x;
	bool ok2 = price_text_as(s, text, true, &x);
	free(text);
	if (ok != ok2 || (ok && (x.t != ev->t || x.peak != ev->peak || x.serial != ev->serial))) {
		fprintf(stderr, "autoshard: internal: a forked proxy priced a plan unlike its text (%g s %lld B, %g s %lld B)\n",
		        ok ? ev->t : -1, ok ? (long long)ev->peak : -1, ok2 ? x.t : -1, ok2 ? (long long)x.peak : -1);
		abort();
	}
#endif
	return ok;
}

/* a, b, c: a quantity with one, two and three layers (or two, three and
 * four: see DEEP).  Each layer adds to it, the third about as much as the
 * second: overlap and the place of the peak make the steps differ by some tens of percent, a conflict
 * resolved at a place that moves with the depth by far more. */
static bool steady(double a, double b, double c)
{
	double d1 = b - a, d2 = c - b;
	return d1 >= 0 && d2 >= 0 && d2 <= 1.5 * d1 + 1e-12 * c && d1 <= 1.5 * d2 + 1e-12 * c;
}

/* The estimate of plan pick on the current mesh: its exact price when the
 * model has no chain of layers, else extrapolated from the proxies (the
 * model cut to one, two and three layers): X(L) = X(3) + (L - 3) (X(3) -
 * X(1)) / 2 for the step times (grow()), X(3) + (L - 3) (X(3) - X(2))
 * for the peak (on deep models the proxies' layers one more each, and
 * X(4) in place of X(3)) of each phase of the step
 * (forward, backward, gradient sync, update, gathers; and the leaves)
 * apart, the peak the largest of them: the place of the peak moves with
 * the depth (on three layers it can be in the update, where the params
 * and the optimizer state count, and on 96 at the end of the forward,
 * where every layer's activations are held).  An estimate costs three
 * small partitions whatever the depth.  The proxies stand for the model
 * only when each layer adds about the same: a plan whose shardings
 * conflict (the batch split coming from the inputs, another split from
 * the head) is resolved by propagation where the two meet, a place that
 * moves with the depth; such a plan is not estimated (false). */
/* A time on more layers than the proxies' a, b, c (one, two, three
 * layers, or two, three, four): the third layer's increment per layer, or
 * the mean of the second's and the third's when that is larger.  The third layer alone
 * adds less than a layer of the model does where its collectives can
 * still hide under the head's compute (up to a fifth less, seen on ZeRO-3
 * plans of 96 layers); elsewhere the increments grow with the depth.
 * Over 42 plans priced exactly this errs by 2% on average, the third's
 * increment alone by 6%. */
static double grow(double a, double b, double c, int64_t more) { return c + (double)more * fmax(c - b, (c - a) / 2); }

/* One part of a plan's estimate: proxy k priced (x, ok; took: the
 * seconds it took and its loading took once), or, for a model priced
 * whole, the whole model at k 0 (into e; nothing at k > 0). */
typedef struct ProxyPrice {
	Eval x;
	double took;
	bool ok, done;
} ProxyPrice;

static void estimate_part(const Search *s, Eval *e, int k, ProxyPrice *out)
{
	double t0 = now_seconds();
	if (priced_whole(s)) {
		if (k == 0) {
			char *text = plan_of(s, s->doc.root, e->pick, s->gather);
			out->ok = price_text(s, text, e);
			free(text);
			e->exact_s = now_seconds() - t0;
		}
		out->done = true;
		return;
	}
	out->ok = price_proxy(s, k, e->pick, &out->x);
	out->took = now_seconds() - t0 + (s->have_tmpl ? s->tmpl_s[k] : 0); /* what loading it took, once */
	out->done = true;
}

/* The plan's estimate from its proxies' prices x (priced apart, on any
 * threads).  False when a proxy could not be priced or the proxies are
 * not steady. */
static bool estimate(const Search *s, Eval *e, const ProxyPrice *x)
{
	if (priced_whole(s))
		return x[0].ok;
	double took[NPROXY] = {0};
	bool ok = true;
	for (int k = 0; k < NPROXY && ok; k++) /* the seconds up to the first failure, as one after the other */
		ok = x[k].ok, took[k] = x[k].took;
	/* pricing is linear in the model: the whole one takes about the
	 * third proxy's time and the last layer's increment per layer more */
	e->exact_s = took[2] + (double)(s->layers.n - NPROXY - s->pbase + 1) * fmax(took[2] - took[1], 0);
	if (!ok || !steady(x[0].x.t, x[1].x.t, x[2].x.t))
		return false;
	int64_t more = s->layers.n - NPROXY - s->pbase + 1;
	int top = 0;
	for (int p = 0; p <= PHASE_COUNT; p++) {
		int64_t *pk = e->phase_peak;
		pk[p] = x[2].x.phase_peak[p] + more * (x[2].x.phase_peak[p] - x[1].x.phase_peak[p]);
		if (pk[p] > pk[top])
			top = p;
	}
	/* the peak steady, or reached: the last layer adds nothing (a chain whose values die as it goes, with no
	 * param a layer: the activations live at once stop growing) */
	int64_t p0 = x[0].x.phase_peak[top], p1 = x[1].x.phase_peak[top], p2 = x[2].x.phase_peak[top];
	if (!steady((double)p0, (double)p1, (double)p2) && !(p2 == p1 && p1 >= p0))
		return false;
	/* a step takes at least each stream's busy time: on three layers the
	 * collectives can hide under compute and on 96 not, so the step's
	 * increment alone would miss what the depth exposes */
	e->t = grow(x[0].x.t, x[1].x.t, x[2].x.t, more);
	for (int k = 0; k < 2; k++)
		e->t = fmax(e->t, grow(x[0].x.busy[k], x[1].x.busy[k], x[2].x.busy[k], more));
	e->serial = grow(x[0].x.serial, x[1].x.serial, x[2].x.serial, more);
	e->peak = e->phase_peak[top];
	return isfinite(e->t) && e->t > 0;
}

/* The rough estimate of a plan from its two smaller proxies' prices x[0]
 * and x[1] alone (into e->t2, e->peak2): each quantity grown by the
 * second proxy's increment per layer.  The integer programs take their
 * terms from it — differences between plans near a centre, which the
 * smaller proxies rank about as the three do — and price the third
 * proxy only of the plans they then weigh whole (a solution, a seed, a
 * candidate): that proxy is half the work of an estimate (on 12 layers:
 * 962 ops of the three proxies' 2025).  False when a proxy could not be
 * priced or the second adds less than the first. */
static bool rough(const Search *s, Eval *e, const ProxyPrice *x)
{
	if (!x[0].ok || !x[1].ok)
		return false;
	int64_t more = s->layers.n - s->pbase - 1;
	const Eval *a = &x[0].x, *b = &x[1].x;
	if (b->t < a->t)
		return false;
	e->t2 = b->t + (double)more * (b->t - a->t);
	for (int k = 0; k < 2; k++)
		e->t2 = fmax(e->t2, b->busy[k] + (double)more * (b->busy[k] - a->busy[k]));
	e->peak2 = 0;
	for (int p = 0; p <= PHASE_COUNT; p++)
		e->peak2 = fmax(e->peak2, b->phase_peak[p] + more * (b->phase_peak[p] - a->phase_peak[p]));
	return isfinite(e->t2) && e->t2 > 0;
}

/* Do the integer programs take their terms from rough estimates?  On a
 * chain of fewer than DEEP layers (proxies of one, two and three).  Not on
 * a model priced whole (the estimate is the exact price), and not on deep
 * chains, whose proxies of two, three and four layers the search affords
 * and whose answers rough terms made slower (96 layers over 256 H100s
 * within 85.9 GB: 1.948 s a step became 1.955 s, on TPU v4s within
 * 17.2 GB 3.502 s 3.515 s). */
static bool roughly(const Search *s) { return !priced_whole(s) && s->layers.n < DEEP; }

static bool fits(const Search *s, const Eval *e) { return e->ok && (double)e->peak <= s->o->budget; }

static void cand_set(Search *s, Cand *c, const Eval *e)
{
	free(c->pick);
	c->mesh = s->mesh, c->gather = s->gather, c->recompute = s->train_recompute, c->t = e->t, c->peak = e->peak;
	c->pick = xmalloc(sizeof(int) * (size_t)(s->ngroup + 1));
	memcpy(c->pick, e->pick, sizeof(int) * (size_t)s->ngroup);
	/* before_use with no update sharded is after_update's program: named so */
	bool sharded = s->o->keep_train;
	for (int g = 0; g < s->ngroup && !sharded; g++)
		sharded = s->group[g].ch.a[c->pick[g]].wus == WUS_ON + 1;
	if (!sharded)
		c->gather = GATHER_AFTER;
}

/* Empty top list t. */
static void top_clear(Top *t)
{
	for (int i = 0; i < t->n; i++)
		free(t->a[i].pick);
	t->n = 0;
}

/* Keep e in top list t of at most cap plans, fastest first (ties: the first). */
static void top_put(Search *s, Top *t, int cap, const Eval *e)
{
	int i = t->n;
	while (i > 0 && e->t < t->a[i - 1].t)
		i--;
	if (i >= cap)
		return;
	if (t->n == cap)
		free(t->a[cap - 1].pick), t->n--;
	memmove(&t->a[i + 1], &t->a[i], sizeof(Cand) * (size_t)(t->n - i));
	t->a[i].pick = NULL;
	cand_set(s, &t->a[i], e);
	t->n++;
}

/* Keep e among the candidates to price exactly: the NCAND fastest
 * estimates within the budget, and the smallest peak. */
static void note(Search *s, const Eval *e)
{
	if (e->ok && (s->smallest_est < 0 || e->peak < s->smallest_est))
		s->smallest_est = e->peak, cand_set(s, &s->smallest_cand, e);
	if (fits(s, e))
		top_put(s, &s->cand, NCAND, e);
}

/* The cache's slot for pick: its entry, or the empty slot it would take. */
static Eval **slot_of(const Search *s, const int *pick)
{
	size_t n = sizeof(int) * (size_t)s->ngroup;
	for (uint64_t i = pick_hash(pick, s->ngroup);; i++) {
		Eval **e = &s->cache[i & (uint64_t)(s->cap - 1)];
		if (!*e || !memcmp((*e)->pick, pick, n))
			return e;
	}
}

static void eval_free(Eval *e)
{
	free(e->pick), free(e->part), free(e);
}

/* Rebuild the cache with cap slots; with drop, leave out (and free) the
 * plans still pending. */
static void cache_rehash(Search *s, int cap, bool drop)
{
	Eval **old = s->cache;
	int n = s->cap;
	s->cap = cap;
	s->cache = xcalloc((size_t)s->cap, sizeof *s->cache);
	s->ncache = 0;
	for (int i = 0; i < n; i++)
		if (old[i] && old[i]->pending && drop)
			eval_free(old[i]);
		else if (old[i])
			*slot_of(s, old[i]->pick) = old[i], s->ncache++;
	free(old);
}

/* Enter plan pick in the cache, to be estimated on `need` proxies (NPROXY:
 * the estimate; 2: the rough one) by the next run_batch(), unless it is
 * there already so far. */
static void want_as(Search *s, const int *pick, int need)
{
	if (!roughly(s))
		need = NPROXY;
	if (2 * (s->ncache + 1) > s->cap)
		cache_rehash(s, s->cap ? 2 * s->cap : 1024, false);
	Eval **slot = slot_of(s, pick);
	Eval *e = *slot;
	if (e) {
		if (need <= e->level || need <= e->need)
			return;
		e->need = (int8_t)need;
		if (!e->pending) {
			e->pending = true;
			vec_push(&s->batch, e);
		}
		return;
	}
	size_t n = sizeof(int) * (size_t)s->ngroup;
	e = xcalloc(1, sizeof *e);
	e->pick = xmalloc(n + 1);
	memcpy(e->pick, pick, n);
	e->pending = true, e->need = (int8_t)need;
	*slot = e;
	s->ncache++;
	vec_push(&s->batch, e);
}

static void want(Search *s, const int *pick) { want_as(s, pick, NPROXY); }

/* Plan c with group g at choice k (and h at l when h >= 0), malloc'd. */
static int *moved(const Search *s, const int *c, int g, int k, int h, int l)
{
	int *p = xmalloc(sizeof(int) * (size_t)(s->ngroup + 1));
	memcpy(p, c, sizeof(int) * (size_t)s->ngroup);
	p[g] = k;
	if (h >= 0)
		p[h] = l;
	return p;
}

/* want_as() plan c with group g at choice k (and h at l when h >= 0). */
static void want_at(Search *s, const int *c, int g, int k, int h, int l, int need)
{
	int *p = moved(s, c, g, k, h, l);
	want_as(s, p, need);
	free(p);
}

typedef struct {
	Search *s;
	int *job; /* the parts to price: plan i of the batch, proxy k as i * NPROXY + k */
} Batch;

/* Part j of the batch (the largest proxy of a plan first, so that the
 * threads run out of work together: a batch of one plan runs its three
 * proxies on two threads). */
static void estimate_one(void *ctx, int j)
{
	Batch *b = ctx;
	Search *s = b->s;
	int i = b->job[j] / NPROXY, k = b->job[j] % NPROXY;
	if (time_left(s) <= 0 && (s->evaluations > 0 || i >= s->jobs))
		return; /* left pending: dropped (but a search always estimates its first plans) */
	Eval *e = s->batch.a[i];
	estimate_part(s, e, k, &e->part[k]);
}

/* Estimate the plans wanted since the last batch, on s->jobs threads
 * (a part reads the search and writes only its own slot and its plan's
 * entry), then take them in the order they were wanted: the search sees
 * the same sequence of estimates whatever the thread count.  A plan is
 * counted once, at its first estimate (rough or not), and kept among
 * the candidates (note) once estimated on every proxy.  Plans the time
 * limit stopped are dropped from the cache (a rough estimate made
 * before stays). */
static void run_batch(Search *s)
{
	if (s->batch.n == 0)
		return;
	make_templates(s);
	int nj = 0, *job = xmalloc(sizeof(int) * ((size_t)s->batch.n * NPROXY + 1));
	for (int i = 0; i < s->batch.n; i++) {
		Eval *e = s->batch.a[i];
		if (!e->part)
			e->part = xcalloc(NPROXY, sizeof *e->part);
		for (int k = e->need - 1; k >= 0; k--)
			if (!e->part[k].done)
				job[nj++] = i * NPROXY + k;
	}
	Batch b = {s, job};
	if (!out_of_time(s) || s->evaluations == 0)
		parallel_for(nj, s->jobs, estimate_one, &b);
	free(job);
	bool dropped = false;
	for (int i = 0; i < s->batch.n; i++) {
		Eval *e = s->batch.a[i];
		bool done = true, first = e->level == 0;
		for (int k = 0; k < e->need; k++)
			done &= e->part[k].done;
		if (!done) {
			e->need = e->level; /* what it has: a rough estimate stays, else the plan is dropped */
			e->pending = e->level == 0;
			dropped = true;
			continue;
		}
		e->pending = false;
		if (e->level < 2 && roughly(s))
			e->ok2 = rough(s, e, e->part);
		if (e->need == NPROXY)
			e->ok = estimate(s, e, e->part);
		if (!roughly(s)) /* the terms take the estimate */
			e->ok2 = e->ok, e->t2 = e->t, e->peak2 = e->peak;
		e->level = e->need;
		if (e->level == NPROXY) {
			free(e->part), e->part = NULL;
			if (e->ok)
				autopipe_note(&s->pipe, &s->mesh, &e->pipe, s->o->budget);
			s->exact_s = fmax(s->exact_s, e->exact_s);
			note(s, e);
		}
		if (first) {
			s->evaluations++;
			if (s->o->progress)
				progress_set(&s->bar, s->evaluations);
		}
	}
	s->batch.n = 0;
	if (dropped) {
		s->cut = true;
		cache_rehash(s, s->cap, true);
	}
}

/* The estimate of plan pick (cached); NULL when the time limit has passed. */
static const Eval *price(Search *s, const int *pick)
{
	want(s, pick);
	run_batch(s);
	const Eval *e = *slot_of(s, pick);
	return e && e->level == NPROXY ? e : NULL;
}

/* The rough estimate of plan pick (cached; see rough()), or NULL. */
static const Eval *price_rough(Search *s, const int *pick)
{
	want_as(s, pick, 2);
	run_batch(s);
	const Eval *e = *slot_of(s, pick);
	return e && e->level >= 2 ? e : NULL;
}

static void clear_cache(Search *s)
{
	for (int i = 0; i < s->cap; i++)
		if (s->cache[i]) {
			eval_free(s->cache[i]);
			s->cache[i] = NULL;
		}
	s->ncache = 0;
}

/* ---- the integer program ---- */

typedef struct {
	glp_prob *lp;
	int *col;          /* per group: its first column (choices in order) */
	VEC(int) ri;       /* constraint matrix triplets */
	VEC(int) ci;
	VEC(double) v;
	int mem_row;
	double *mem;       /* per column x[g][k]: its unary memory term */
	double mscale;     /* bytes are given to GLPK divided by this ... */
	double oscale;     /* ... and the objective divided by this */
} Ilp;

static void put(Ilp *p, int r, int c, double v)
{
	if (r == p->mem_row)
		v /= p->mscale;
	vec_push(&p->ri, r);
	vec_push(&p->ci, c);
	vec_push(&p->v, v);
}

/* Objective coefficients and the memory row are scaled to about one:
 * seconds of 1e-6 beside bytes of 1e11 break the simplex's tolerances. */
static void set_obj(Ilp *p, int col, double v)
{
	glp_set_obj_coef(p->lp, col, v / p->oscale);
}

static int add_row(Ilp *p, int type, double lo, double hi)
{
	int r = glp_add_rows(p->lp, 1);
	glp_set_row_bnds(p->lp, r, type, lo, hi);
	return r;
}

/* Price of centre c with group g at choice k (and h at l when h >= 0):
 * the estimate, or with rough the rough one. */
static const Eval *price_at(Search *s, const int *c, int g, int k, int h, int l, bool rough)
{
	int *p = moved(s, c, g, k, h, l);
	const Eval *e = rough ? price_rough(s, p) : price(s, p);
	free(p);
	return e;
}

/* Kind g keeps its centre's choice in this search's integer programs. */
static bool frozen(const Search *s, int g) { return (s->group[g].role != ROLE_NONE) != s->acts_free; }

/* Would choice k of tiny kind g change the sharding centre c gives it?
 * Tiny kinds (a norm's scale, a bias) move only their weight-update
 * sharding in the rounds; their sharding is the seed's (seed_choice: a
 * norm's scale replicated, a Megatron seed's first MLP bias split like
 * its weight's columns): a split vector of d_model elements saves
 * nothing, and its choices were a fifth of the estimates of a search on
 * a 2-D mesh (the 12-layer 16-H100 one: 442 to 395, the same plans on
 * every row of the benchmark). */
static bool moves_spec(const Search *s, const int *c, int g, int k)
{
	const Group *G = &s->group[g];
	/* whole is allowed: the seed's split may not be its weight's (see above) */
	return G->tiny && G->ch.a[k].twin != G->ch.a[c[g]].twin && spec_dim_axes(&G->ch.a[k].spec);
}

/* Columns x[g][k] with their unary terms around centre c. */
static void unary_terms(Search *s, Ilp *p, const int *c, const Eval *ec, bool by_memory)
{
	int ncol = 0;
	for (int g = 0; g < s->ngroup; g++)
		ncol += s->group[g].ch.n;
	glp_add_cols(p->lp, ncol);
	p->mem = xcalloc((size_t)ncol + 2, sizeof *p->mem);
	/* estimated together first, in the order the loop below asks: the
	 * choices without weight-update sharding (or without that choice),
	 * then those with it whose twin (the same spec without) could be
	 * estimated.  The twin's conflict is the forward's and backward's,
	 * which the update does not change: on the 12-layer 8-H100 model,
	 * of 51 twins not estimable, 50 were not with the update sharded
	 * either. */
	for (int pass = 0; pass < 2; pass++) {
		for (int g = 0; g < s->ngroup; g++)
			for (int k = 0; k < s->group[g].ch.n && !frozen(s, g); k++) {
				Choice *ch = &s->group[g].ch.a[k];
				if ((ch->twin != k) != pass || k == c[g] || ch->dead)
					continue;
				if (moves_spec(s, c, g, k))
					continue;
				bool twin_bad = false;
				if (pass && ch->twin != c[g]) { /* the twin was asked in pass 0 unless dead: cached */
					const Choice *tw = &s->group[g].ch.a[ch->twin];
					const Eval *t = tw->dead ? NULL : price_at(s, c, g, ch->twin, -1, 0, true);
					twin_bad = tw->dead || (t && !t->ok2);
				}
				if (twin_bad)
					ch->dead = true;
				else
					want_at(s, c, g, k, -1, 0, 2);
			}
		run_batch(s);
	}
	/* the choices the rough estimates call a gain (faster, or with
	 * by_memory smaller) estimated on the third proxy too: the rough
	 * estimate cannot tell a plan whose layers are not steady (see
	 * estimate()), and its error is largest there (on the 12-layer
	 * 16-H100 model within 2 GB, 101 of 193 such changes, some 14 ms
	 * faster roughly, 3 ms from the centre's 31); they are forbidden as
	 * before, and the rest of the gains get their estimates' terms */
	for (int g = 0; g < s->ngroup && roughly(s); g++)
		for (int k = 0; k < s->group[g].ch.n && !frozen(s, g); k++) {
			const Choice *ch = &s->group[g].ch.a[k];
			const Eval *e = k == c[g] || ch->dead || moves_spec(s, c, g, k) ? NULL : price_at(s, c, g, k, -1, 0, true);
			if (e && e->ok2 && (by_memory ? e->peak2 < ec->peak2 : e->t2 < ec->t2))
				want_at(s, c, g, k, -1, 0, NPROXY);
		}
	run_batch(s);
	for (int g = 0, col = 1; g < s->ngroup; g++) {
		p->col[g] = col;
		int r = add_row(p, GLP_FX, 1, 1);
		for (int k = 0; k < s->group[g].ch.n; k++, col++) {
			glp_set_col_kind(p->lp, col, GLP_BV);
			put(p, r, col, 1);
			Choice *ch = &s->group[g].ch.a[k];
			const Eval *e = k == c[g] ? ec : frozen(s, g) || ch->dead || moves_spec(s, c, g, k) ? NULL :
			                price_at(s, c, g, k, -1, 0, true);
			bool whole = e && e->level == NPROXY; /* estimated (a gain, above): its terms */
			bool ok = e && (whole ? e->ok : e->ok2);
			if (e && !ok && k != c[g])
				ch->dead = true;
			if (!ok) {
				glp_set_col_bnds(p->lp, col, GLP_FX, 0, 0);
				continue;
			}
			p->mem[col] = whole ? (double)(e->peak - ec->peak) : (double)(e->peak2 - ec->peak2);
			set_obj(p, col, by_memory ? p->mem[col] : whole ? e->t - ec->t : e->t2 - ec->t2);
			put(p, p->mem_row, col, p->mem[col]);
		}
	}
}

/* Per column, its class for the pair terms: the twins (weight update
 * off) of PAIR_WIDTH choices of a kind — the centre's, then by turns the
 * fastest alone and the smallest alone of the rest — are classes 0..; a
 * choice is in its twin's class; every other choice is in class
 * PAIR_WIDTH, whose interactions are taken as none.  Ties go to the
 * earlier choice. */
static int *classes(Search *s, const Ilp *p, const int *c)
{
	int ncol = glp_get_num_cols(p->lp);
	int *cls = xmalloc(sizeof(int) * (size_t)(ncol + 2));
	for (int i = 0; i <= ncol; i++)
		cls[i] = PAIR_WIDTH;
	for (int g = 0; g < s->ngroup; g++) {
		const Group *G = &s->group[g];
		cls[p->col[g] + G->ch.a[c[g]].twin] = 0;
		for (int n = 1; n < PAIR_WIDTH; n++) {
			int best = -1;
			double bt = INFINITY;
			for (int k = 0; k < G->ch.n; k++) {
				int col = p->col[g] + k;
				double t = n % 2 ? glp_get_obj_coef(p->lp, col) : p->mem[col];
				if (G->ch.a[k].twin == k && cls[col] == PAIR_WIDTH && glp_get_col_type(p->lp, col) != GLP_FX && t < bt)
					best = col, bt = t;
			}
			if (best >= 0)
				cls[best] = n;
		}
		for (int k = 0; k < G->ch.n; k++)
			cls[p->col[g] + k] = cls[p->col[g] + G->ch.a[k].twin];
	}
	return cls;
}

/* The representative choice of class a of group g, or -1. */
static int class_choice(const Search *s, const Ilp *p, const int *cls, int g, int a)
{
	for (int k = 0; k < s->group[g].ch.n; k++)
		if (cls[p->col[g] + k] == a && s->group[g].ch.a[k].twin == k)
			return k;
	return -1;
}

/* The representatives k of class a of g and l of class b of h, when
 * their interaction is priced: classes other than the centre's and the
 * rest (PAIR_WIDTH), with a representative each. */
static bool pair_priced(const Search *s, const Ilp *p, const int *cls, int g, int h, int a, int b, int *k, int *l)
{
	*k = class_choice(s, p, cls, g, a), *l = class_choice(s, p, cls, h, b);
	return a != 0 && b != 0 && a != PAIR_WIDTH && b != PAIR_WIDTH && *k >= 0 && *l >= 0;
}

/* The pair terms of g and h around centre c: y[a][b], the share of the
 * plan in class a of g and class b of h (rows: the y of a class sum to its
 * choices' x, on both sides, so y is their product at integer x), priced
 * with the interaction of the two classes' representatives. */
static void pair_terms(Search *s, Ilp *p, const int *c, const Eval *ec, int g, int h, const int *cls, bool by_memory)
{
	enum { W = PAIR_WIDTH + 1 };
	int y0 = glp_add_cols(p->lp, W * W), rg[W], rh[W];
	for (int a = 0; a < W; a++) {
		rg[a] = add_row(p, GLP_FX, 0, 0), rh[a] = add_row(p, GLP_FX, 0, 0);
		for (int k = 0; k < s->group[g].ch.n; k++)
			if (cls[p->col[g] + k] == a)
				put(p, rg[a], p->col[g] + k, -1);
		for (int l = 0; l < s->group[h].ch.n; l++)
			if (cls[p->col[h] + l] == a)
				put(p, rh[a], p->col[h] + l, -1);
	}
	for (int a = 0; a < W; a++)
		for (int b = 0; b < W; b++) {
			int y = y0 + a * W + b, k, l;
			glp_set_col_bnds(p->lp, y, GLP_DB, 0, 1);
			put(p, rg[a], y, 1), put(p, rh[b], y, 1);
			if (!pair_priced(s, p, cls, g, h, a, b, &k, &l))
				continue;
			const Eval *ea = price_at(s, c, g, k, -1, 0, true), *eb = price_at(s, c, h, l, -1, 0, true),
			           *ab = price_at(s, c, g, k, h, l, true);
			if (!ab || !ea || !eb || !ab->ok2 || !ea->ok2 || !eb->ok2) { /* unknown or cannot partition: not both */
				glp_set_col_bnds(p->lp, y, GLP_FX, 0, 0);
				continue;
			}
			double dm = (double)(ab->peak2 - ea->peak2 - eb->peak2 + ec->peak2);
			set_obj(p, y, by_memory ? dm : ab->t2 - ea->t2 - eb->t2 + ec->t2);
			put(p, p->mem_row, y, dm);
		}
}

/* want() the plans pair_terms() prices, in its order. */
static void want_pairs(Search *s, const Ilp *p, const int *c, int g, int h, const int *cls)
{
	for (int a = 0; a <= PAIR_WIDTH; a++)
		for (int b = 0, k, l; b <= PAIR_WIDTH; b++)
			if (pair_priced(s, p, cls, g, h, a, b, &k, &l)) {
				want_at(s, c, g, k, -1, 0, 2);
				want_at(s, c, h, l, -1, 0, 2);
				want_at(s, c, g, k, h, l, 2);
			}
}

/* Build the program around centre c (priced ec): least step time
 * within the budget, or with by_memory the least peak. */
static void build_ilp(Search *s, Ilp *p, const int *c, const Eval *ec, bool by_memory)
{
	memset(p, 0, sizeof *p);
	p->lp = glp_create_prob();
	glp_set_obj_dir(p->lp, GLP_MIN);
	p->mscale = fmax(1, fmax((double)ec->peak, s->o->budget < INFINITY ? s->o->budget : 0));
	p->oscale = by_memory ? p->mscale : fmax(ec->t, 1e-30);
	set_obj(p, 0, by_memory ? (double)ec->peak : ec->t);
	p->col = xcalloc((size_t)s->ngroup + 1, sizeof *p->col);
	p->mem_row = by_memory ? add_row(p, GLP_FR, 0, 0) : add_row(p, GLP_UP, 0, (s->o->budget - (double)ec->peak) / p->mscale);
	unary_terms(s, p, c, ec, by_memory);
	int *cls = classes(s, p, c);
	for (int pass = 0; pass < 2; pass++) { /* the plans estimated together, then the terms */
		for (int g = 0; g < s->ngroup; g++)
			for (int h = g + 1; h < s->ngroup; h++)
				if (s->adj[g * s->ngroup + h] && !frozen(s, g) && !frozen(s, h)) {
					if (pass)
						pair_terms(s, p, c, ec, g, h, cls, by_memory);
					else
						want_pairs(s, p, c, g, h, cls);
				}
		run_batch(s);
	}
	free(cls);
}

static void load_matrix(Ilp *p)
{
	/* GLPK's arrays are 1-based: a dummy first entry */
	int n = p->ri.n;
	int *ri = xmalloc(sizeof(int) * (size_t)(n + 1)), *ci = xmalloc(sizeof(int) * (size_t)(n + 1));
	double *v = xmalloc(sizeof(double) * (size_t)(n + 1));
	memcpy(ri + 1, p->ri.a, sizeof(int) * (size_t)n);
	memcpy(ci + 1, p->ci.a, sizeof(int) * (size_t)n);
	memcpy(v + 1, p->v.a, sizeof(double) * (size_t)n);
	glp_load_matrix(p->lp, n, ri, ci, v);
	free(ri), free(ci), free(v);
}

static void ilp_free(Ilp *p)
{
	if (p->lp)
		glp_delete_prob(p->lp);
	free(p->col);
	free(p->mem);
	vec_free(&p->ri), vec_free(&p->ci), vec_free(&p->v);
}

static bool solve_lp(Search *s, Ilp *p, glp_smcp *smp, glp_iocp *iop, int *pick, double *bound);

/* GLPK reports an internal error by calling this hook, and aborts if it
 * returns: jump back to solve() instead. */
static jmp_buf glpk_jump;

static void glpk_failed(void *info)
{
	(void)info;
	longjmp(glpk_jump, 1);
}

/* Solve; pick gets the solution, *bound the proven bound.  False when no
 * integer solution was found. */
static bool solve(Search *s, Ilp *p, int *pick, double *bound)
{
	load_matrix(p);
	glp_smcp sm;
	glp_init_smcp(&sm);
	sm.msg_lev = GLP_MSG_OFF;
	glp_iocp io;
	glp_init_iocp(&io);
	io.msg_lev = GLP_MSG_OFF;
	double left = time_left(s);
	if (s->o->time_limit > 0)
		io.tm_lim = left > 0.001 ? (int)(left * 1000) : 1;
	int term = glp_term_out(GLP_OFF); /* the scaling's and the branch and cut's messages too */
	glp_scale_prob(p->lp, GLP_SF_AUTO);
	s->solves++;
	bool ok = false;
	glp_error_hook(glpk_failed, NULL);
	if (setjmp(glpk_jump) == 0)
		ok = solve_lp(s, p, &sm, &io, pick, bound);
	else {
		/* GLPK stopped on an internal error (a failed assertion in its
		 * simplex, say): its environment is gone with every problem in
		 * it.  The search goes on without this program's answer. */
		glp_free_env();
		p->lp = NULL;
		s->proven = false;
		s->solver_failed++;
	}
	glp_error_hook(NULL, NULL);
	if (p->lp)
		glp_term_out(term);
	return ok;
}

/* solve() with GLPK's terminal output off. */
static bool solve_lp(Search *s, Ilp *p, glp_smcp *smp, glp_iocp *iop, int *pick, double *bound)
{
	glp_smcp sm = *smp;
	glp_iocp io = *iop;
	if (glp_simplex(p->lp, &sm) != 0 || glp_get_status(p->lp) != GLP_OPT)
		return false;
	*bound = glp_get_obj_val(p->lp) * p->oscale;
	int rc = glp_intopt(p->lp, &io), st = glp_mip_status(p->lp);
	if (st == GLP_OPT && rc == 0)
		*bound = glp_mip_obj_val(p->lp) * p->oscale;
	else
		s->proven = false;
	if (st != GLP_OPT && st != GLP_FEAS)
		return false;
	for (int g = 0; g < s->ngroup; g++)
		for (int k = 0; k < s->group[g].ch.n; k++)
			if (glp_mip_col_val(p->lp, p->col[g] + k) > 0.5)
				pick[g] = k;
	return true;
}

/* Forbid the plan pick (priced already) in p. */
static void cut_off(Search *s, Ilp *p, const int *pick)
{
	int r = add_row(p, GLP_UP, 0, s->ngroup - 1);
	for (int g = 0; g < s->ngroup; g++)
		put(p, r, p->col[g] + pick[g], 1);
}

/* One round around centre c: build the program, solve, price the
 * solution; while it is not a faster plan that fits (by_memory: a plan
 * with a smaller peak), cut it off and solve again, at most MAX_CUTS
 * times, then as many again over the plans that add no memory.  True (next: that plan) when one was found; else *bound gets the
 * program's bound over the plans not priced (INFINITY: none is left). */
static bool round_at(Search *s, const int *c, int *next, double *bound, bool by_memory)
{
	const Eval *ec = price(s, c);
	*bound = INFINITY;
	if (!ec || !ec->ok)
		return false;
	Eval centre = *ec;
	Ilp p;
	build_ilp(s, &p, c, &centre, by_memory);
	bool better = false, spent = false;
	for (int pass = 0; pass < 2 && !better; pass++) {
		/* the second pass, where the first proposed MAX_CUTS plans and
		 * none was better: the moves that add no memory to the centre's
		 * (the program's terms err more the further a plan moves, and the
		 * room a budget leaves invites far moves: the 12-layer d1024 model
		 * on 8 TPU v4s as 1 x 8 within 2.06 GB, the first round's plan is
		 * estimated 44.5 ms; within 2.2 GB every plan proposed was slower
		 * than the 55.1 ms seed, and the answer 44.0 ms against 42.2) */
		if (pass == 1 && (!spent || by_memory || !fits(s, &centre) || !p.lp || out_of_time(s)))
			break;
		if (pass == 1)
			glp_set_row_bnds(p.lp, p.mem_row, GLP_UP, 0, 0);
		for (int tries = 0; tries < MAX_CUTS && !better; tries++) {
			double b;
			if (!solve(s, &p, next, &b)) {
				if (s->cut || !p.lp)
					*bound = -INFINITY; /* stopped: nothing proven */
				break;
			}
			if (pass == 0)
				*bound = b; /* the second pass's is over fewer plans */
			if (!by_memory && fits(s, &centre) && b >= centre.t * (1 - 1e-12))
				break; /* no plan left beats the centre */
			const Eval *e = price(s, next);
			if (!e) {
				*bound = fmin(*bound, centre.t);
				break;
			}
			better = by_memory ? e->ok && e->peak < centre.peak
			                   : fits(s, e) && (!fits(s, &centre) || e->t < centre.t);
			if (!better)
				cut_off(s, &p, next);
			if (!better && tries == MAX_CUTS - 1) /* the bound is the last program's, over plans some of which were cut */
				s->proven = false, spent = true;
		}
	}
	ilp_free(&p);
	return better;
}

/* Does a tensor-parallel seed split a dim of size n of some param that
 * is not tiny (its first dim whose size is not the model's width)? */
static bool split_size(const Search *s, int64_t n)
{
	for (int i = 0; i < s->nsplit; i++)
		if (s->split[i] == n)
			return true;
	return false;
}

static void find_split_sizes(Search *s)
{
	for (int i = 0; i < s->nleaf; i++) {
		const Group *G = &s->group[s->leaf[i].group];
		const Value *v = &s->base.values.a[s->leaf[i].value];
		int d = 0;
		while (G->param && !G->tiny && d < v->shape.rank && v->shape.dim[d] == s->width)
			d++;
		if (!G->param || G->tiny || d == v->shape.rank || split_size(s, v->shape.dim[d]))
			continue;
		if (s->nsplit == NSPLIT)
			break;
		s->split[s->nsplit++] = v->shape.dim[d];
	}
}

/* The choice of leaf group G (value v) in a seed: the batch axes on an
 * input's first dim; the tensor axes on a param's first dim whose size is
 * not the model's width (the heads of an attention weight, the hidden
 * dim of an MLP's, the vocabulary of an embedding) — a tiny param's only
 * where that size is one the other params split (an MLP's first bias
 * like its weight's columns, not the last bias, whose weight is split on
 * its rows); weight-update sharding as asked when the param is
 * replicated somewhere.  The replicated choice when that split is not
 * tried (split_ok). */
static int seed_choice(const Search *s, const Group *G, const Value *v, unsigned batch, unsigned tensor, bool wus)
{
	int dim = -1;
	unsigned axes = 0;
	if (!G->param && v->shape.rank > 0)
		dim = 0, axes = batch;
	for (int d = 0; G->param && d < v->shape.rank && dim < 0; d++)
		if (v->shape.dim[d] != s->width && (!G->tiny || split_size(s, v->shape.dim[d])))
			dim = d, axes = tensor;
	Spec sp = {.rank = (uint8_t)v->shape.rank};
	for (int a = 0; dim >= 0 && a < s->mesh.naxes; a++)
		if (axes >> a & 1)
			sp.ax[dim][sp.nax[dim]++] = (uint8_t)a;
	int any = 0;
	for (int k = G->ch.n - 1; k >= 0; k--)
		if (spec_eq(&G->ch.a[k].spec, &sp)) {
			any = k;
			if (G->ch.a[k].wus == 0 || (G->ch.a[k].wus == WUS_ON + 1) == wus)
				return k;
		}
	return any;
}

/* The choice of activation kind G in a seed: with sequence parallelism
 * over the tensor axes, the stream's sequence dim split over them and the
 * gather point's whole; else (or when that split is not tried) follow. */
static int seed_act(const Group *G, unsigned tensor, bool sp)
{
	for (int k = 1; sp && k < G->ch.n; k++) {
		const Spec *c = &G->ch.a[k].spec;
		unsigned set = 0;
		for (int i = 0; i < c->nax[G->seq]; i++)
			set |= 1u << c->ax[G->seq][i];
		if (set == (G->role == ROLE_STREAM ? tensor : 0))
			return k;
	}
	return 0;
}

/* Better: fits the budget where b does not, or as fits and faster. */
static bool better(const Search *s, const Eval *a, const Eval *b)
{
	return a && a->ok && (!b || !b->ok || fits(s, a) > fits(s, b) || (fits(s, a) == fits(s, b) && a->t < b->t));
}

/* Weight-update sharding in a seed: off, on for every param, on for all
 * but the tiny kinds (a tiny param's update is small, and sharding it
 * costs two latency-bound collectives a param where its all_reduce joins
 * a combined one: on 16 TPU v4s that was a fifth of a data-parallel step;
 * but its gathers can also be what lets ZeRO-3 prefetch fit, so both). */
enum { SEED_WUS_OFF, SEED_WUS_ALL, SEED_WUS_BIG, NSEEDWUS };

/* The seeds of the current mesh, estimated: the replicated plan, and
 * every split of the mesh's axes into batch axes and tensor axes (data parallelism, Megatron
 * tensor parallelism, the grids between), each with weight-update
 * sharding off, on, and on but for the tiny kinds, and with tensor axes,
 * with and without sequence parallelism over them.  c gets the best; the best over every mesh is
 * kept to be priced exactly, so the answer is never slower than these
 * plans. */
/* Seeds per tensor axes t: q < 2 * NSEEDWUS, the batch over the other
 * live axes (weight-update sharding q % NSEEDWUS, sequence parallelism
 * q / NSEEDWUS); then q = IDLE + b, the batch over axes b only, the rest
 * idle (every tensor replicated over them, nothing sharded in the update):
 * a device group too large for a small model's collectives to pay for
 * (a two-layer MLP on a 2 x 2 mesh: Megatron over one axis, the other
 * idle, 4.19e-5 s a step; over both 4.35e-5, the grid 5.07e-5). */
enum { IDLE = 2 * NSEEDWUS, NSEEDQ = IDLE + (1 << MESH_MAX_AXES) };

/* Seed t (the tensor axes), q of the current mesh into p: false when it
 * is not listed (the same program as another seed). */
static bool seed_plan(const Search *s, unsigned t, int q, int *p)
{
	unsigned live = live_axes(s), batch = live & ~t;
	int nw = s->base.train && !s->o->keep_train ? NSEEDWUS : 1;
	int w = q % nw, sp = q / nw, pinned = 0;
	/* with all_gather before_use, a seed without weight-update sharding
	 * is the same program as with after_update, listed first: priced there */
	bool dup = s->gather && !s->o->keep_train;
	if (q >= IDLE) { /* some axes idle */
		unsigned b = (unsigned)(q - IDLE);
		if (dup || (b & ~batch) || b == batch || !(t | b))
			return false;
		batch = b, w = SEED_WUS_OFF, sp = 0;
	} else if (q >= 2 * nw)
		return false;
	if ((t & ~live) || (dup && w == 0) || (sp && (!t || !s->nact)))
		return false;
	for (int g = 0; g < s->ngroup; g++) {
		const Group *G = &s->group[g];
		if (G->role)
			pinned += (p[g] = seed_act(G, t, sp)) != 0;
		else
			p[g] = G->fixed ? 0 : seed_choice(s, G, &s->base.values.a[s->leaf[G->first].value], batch, t,
			                                  w == SEED_WUS_ALL || (w == SEED_WUS_BIG && !G->tiny));
	}
	return !sp || pinned; /* else the same plan as without */
}

/* Do estimates a and b differ (so their plans are other programs)? */
static bool other_program(const Eval *a, const Eval *b) { return a->t != b->t || a->peak != b->peak; }

static void seeds(Search *s, int *c, Eval *est, int *c2, Eval *est2)
{
	unsigned live = live_axes(s);
	int *p = xcalloc((size_t)s->ngroup + 1, sizeof *p);
	bool dup = s->gather && !s->o->keep_train; /* the replicated plan is priced with after_update */
	if (!dup)
		want(s, p); /* everything replicated (p is zeros: every kind's first choice) */
	for (unsigned t = 0; t <= live; t++) /* estimated together first */
		for (int q = 0; q < NSEEDQ; q++)
			if (seed_plan(s, t, q, p))
				want(s, p);
	run_batch(s);
	memset(p, 0, sizeof(int) * (size_t)s->ngroup);
	const Eval *best = dup ? NULL : price(s, p), *other = NULL; /* other: the best estimated otherwise than best */
	if (best && fits(s, best))
		top_put(s, &s->seed, NSEED, best);
	for (unsigned t = 0; t <= live; t++)
		for (int q = 0; q < NSEEDQ; q++) {
			if (!seed_plan(s, t, q, p))
				continue;
			const Eval *e = price(s, p);
			if (e && fits(s, e))
				top_put(s, &s->seed, NSEED, e);
			if (e && e->ok && (!s->smallest_seed.pick || e->peak < s->smallest_seed.peak))
				cand_set(s, &s->smallest_seed, e);
			if (better(s, e, best)) {
				if (best && other_program(e, best))
					other = best, memcpy(c2, c, sizeof(int) * (size_t)s->ngroup);
				best = e, memcpy(c, p, sizeof(int) * (size_t)s->ngroup);
			} else if (e && best && other_program(e, best) && better(s, e, other)) {
				other = e, memcpy(c2, p, sizeof(int) * (size_t)s->ngroup);
			}
		}
	if (best)
		*est = *best;
	if (other)
		*est2 = *other;
	free(p);
}

static void search_rounds(Search *s, int *c);
static void settle_texts(Search *s, const Cand *const *c, char **text, int n);
static const Cand *settled_find(const Search *s, const Cand *x);

/* Is plan next, which the estimates find faster than centre c, faster
 * when both are priced exactly on the whole model (together, on both
 * threads)?  Both are settled as answers and kept, so that settle_all
 * does not price them again.  The estimates err by some percent, and
 * more on plans far from the seeds (the first layers' overlap, a
 * conflict deeper than the proxies): a round centred on an estimate's
 * error only follows it further. */
static bool confirm(Search *s, const int *c, const int *next)
{
	if (priced_whole(s))
		return true; /* the estimates are the exact prices */
	if (time_left(s) <= s->exact_s)
		return !(s->cut = true); /* no time to price them: the limit cut the search */
	Cand x[2] = {{.mesh = s->mesh, .gather = s->gather, .recompute = s->train_recompute, .pick = (int *)c},
	             {.mesh = s->mesh, .gather = s->gather, .recompute = s->train_recompute, .pick = (int *)next}};
	const Cand *todo[2];
	char *text[2];
	int n = 0;
	for (int i = 0; i < 2; i++)
		if (!settled_find(s, &x[i]))
			text[n] = plan_of(s, s->doc.root, x[i].pick, s->gather), todo[n++] = &x[i];
	settle_texts(s, todo, text, n);
	const Cand *a = settled_find(s, &x[0]), *b = settled_find(s, &x[1]);
	bool fa = isfinite(a->t) && (double)a->peak <= s->o->budget, fb = isfinite(b->t) && (double)b->peak <= s->o->budget;
	return fb && (!fa || b->t < a->t);
}

/* Search the current mesh and gather mode: rounds from the start plan c,
 * each centred on the last round's faster plan, until a round finds
 * none.  While no plan found fits, a round that finds no plan within the
 * budget looks for a smaller peak instead.  The inputs and params move
 * first with the activations kept as the start plan has them, then the
 * activations with the rest kept: one program over both would be larger
 * and, its second-order estimate erring more, lead elsewhere. */
/* A space small enough to price every plan of: a model priced whole (no
 * chain of layers, not pipelined), where an estimate is the exact price,
 * with at most ENUM_MAX plans (the product of its kinds' choices).  The
 * rounds move a few kinds at a time on second-order estimates, and a
 * small model's best plan can be three changes from every seed (a
 * two-layer MLP on a 2 x 4 mesh: its hidden dim split over data and its
 * output's over model, 5.69 us, against the grid's 6.09). */
enum { ENUM_MAX = 1024 };

static bool enumerable(const Search *s)
{
	if (s->layers.n || s->pipe.axis >= 0)
		return false;
	double n = 1;
	for (int g = 0; g < s->ngroup; g++)
		n *= s->group[g].fixed ? 1 : s->group[g].ch.n;
	return n <= ENUM_MAX;
}

/* Price every plan of the space (enumerable), in batches. */
static void enumerate_plans(Search *s)
{
	int *p = xcalloc((size_t)s->ngroup + 1, sizeof *p);
	for (;;) {
		want(s, p);
		if (s->batch.n >= 64)
			run_batch(s);
		int g = 0;
		for (; g < s->ngroup; g++) /* the next plan: the kinds' choices as digits */
			if (!s->group[g].fixed && ++p[g] < s->group[g].ch.n)
				break;
			else
				p[g] = 0;
		if (g == s->ngroup || out_of_time(s))
			break;
	}
	run_batch(s);
	free(p);
}

static void search_mesh(Search *s, int *c)
{
	make_choices(s);
	clear_cache(s);
	if (enumerable(s)) {
		enumerate_plans(s);
		s->enumerated = true, s->enum_mesh = s->mesh, s->enum_gather = s->gather;
		s->enum_recompute = s->train_recompute;
		return;
	}
	for (int phase = 0; phase < (s->nact ? 2 : 1); phase++) {
		s->acts_free = phase == 1;
		search_rounds(s, c);
	}
	s->acts_free = false;
}

static void search_rounds(Search *s, int *c)
{
	int *next = xcalloc((size_t)s->ngroup + 1, sizeof *next);
	for (int r = 0; r < MAX_ROUNDS && !out_of_time(s); r++) {
		const Eval *ec = price(s, c);
		bool over = ec && ec->ok && !fits(s, ec);
		double b;
		if (over && !round_at(s, c, next, &b, false) && round_at(s, c, next, &b, true)) {
			memcpy(c, next, sizeof(int) * (size_t)s->ngroup); /* nothing fits: first the least peak */
			continue;
		}
		if (!round_at(s, c, next, &b, false) || !confirm(s, c, next))
			break;
		memcpy(c, next, sizeof(int) * (size_t)s->ngroup);
	}
	free(next);
}

/* Space a before b: its seed fits where b's does not, or is faster (ties: the first listed). */
static bool space_before(const Search *s, const Space *a, const Space *b)
{
	bool fa = fits(s, &a->est), fb = fits(s, &b->est);
	return a->est.ok > b->est.ok || (a->est.ok == b->est.ok && (fa > fb || (fa == fb && a->est.t < b->est.t)));
}

/* Space i is a leaner prefetch (one weight ahead, or off) where a deeper
 * one of the same mesh, listed just before it (try_modes), has a seed
 * that fits: a leaner prefetch only saves memory (the same shardings, the
 * collectives more exposed), so it is tried only where the deeper ones
 * have no seed that fits. */
static bool leaner_fits(const Search *s, int i)
{
	const Space *sp = s->spaces.a;
	if (sp[i].gather != GATHER_NEAR && sp[i].gather != GATHER_AT_USE)
		return false;
	for (int j = i - 1; j >= 0 && sp[j].gather != GATHER_AFTER && sp[j].gather < sp[i].gather; j--)
		if (sp[j].seed && fits(s, &sp[j].est))
			return true;
	return false;
}

static int live_sizes(const Mesh *m, bool sorted, int *out);

/* The spaces from `from` on: each one's seeds (spaces of a leaner prefetch skipped: leaner_fits). */
static void seed_spaces(Search *s, int from)
{
	for (int i = from; i < s->spaces.n && (!out_of_time(s) || s->evaluations == 0); i++) { /* the first seeds whatever the time */
		Space *sp = &s->spaces.a[i];
		if (leaner_fits(s, i))
			continue;
		s->mesh = sp->mesh, s->gather = sp->gather, s->train_recompute = sp->recompute;
		make_choices(s);
		clear_cache(s);
		sp->seed = xcalloc((size_t)s->ngroup + 1, sizeof(int));
		sp->other = xcalloc((size_t)s->ngroup + 1, sizeof(int));
		sp->est_other.ok = false;
		seeds(s, sp->seed, &sp->est, sp->other, &sp->est_other);
		sp->est.pick = sp->est_other.pick = NULL;
		if (!sp->est_other.ok)
			free(sp->other), sp->other = NULL;
	}
}

/* The spaces from `from` on, seeded: ranked by their best seeds, and the
 * integer programs on the leading ones (NSEARCH), the first only when its
 * seed fits and is no more than SEARCH_CLOSE_PCT percent slower than beat
 * (the seeds' estimates err by about that much, and a search from a seed
 * can end far below it); true when a space was searched. */
static bool search_from(Search *s, int from, double beat, int nsearch)
{
	seed_spaces(s, from);
	Space *sp = s->spaces.a + from;
	int n = s->spaces.n - from, searched = 0;
	for (int i = 1; i < n; i++) /* insertion sort: stable, so ties keep the listed order */
		for (int j = i; j > 0 && sp[j].seed && (!sp[j - 1].seed || space_before(s, &sp[j], &sp[j - 1])); j--) {
			Space t = sp[j];
			sp[j] = sp[j - 1], sp[j - 1] = t;
		}
	/* of the spaces as good as the first within the seeds' error, the one
	 * on the fewest live mesh axes first: its search is the cheaper (the
	 * 12-layer model on 8 TPU v4s within 2.06 GB: 1 x 8 in 0.26 s, 2 x 4 in
	 * 0.60), and a search far from the bound goes on to the next */
	int first = 0, dims[MESH_MAX_AXES], fewest = n && sp[0].seed ? live_sizes(&sp[0].mesh, false, dims) : 0;
	for (int i = 1; i < n && sp[i].seed && fits(s, &sp[i].est) == fits(s, &sp[0].est) &&
	                100 * sp[i].est.t <= (100 + SEARCH_CLOSE_PCT) * sp[0].est.t;
	     i++) {
		int live = live_sizes(&sp[i].mesh, false, dims);
		if (live < fewest)
			first = i, fewest = live;
	}
	if (first > 0) {
		Space t = sp[first];
		memmove(&sp[1], &sp[0], sizeof *sp * (size_t)first);
		sp[0] = t;
	}
	if (n && sp[0].seed && isfinite(beat) && (!fits(s, &sp[0].est) || 100 * sp[0].est.t > (100 + SEARCH_CLOSE_PCT) * beat))
		return false;
	for (int i = 0; i < n && searched < nsearch && sp[i].seed && !out_of_time(s); i++) {
		if (i > 0 && (fits(s, &sp[i].est) != fits(s, &sp[0].est) ||
		              100 * sp[i].est.t > (100 + SEARCH_FAR_PCT) * sp[0].est.t ||
		              (s->cand.n && 100 * (s->cand.a[0].t - s->lower) < SEARCH_FAR_PCT * s->cand.a[0].t)))
			break;
		int *from_seed = sp[i].seed;
		if (i > 0 && !other_program(&sp[i].est, &sp[i - 1].est)) {
			/* the same best seed as the space before: searched there when only the
			 * mesh differs (its axes swapped, one idle); in another mode (a plan
			 * whose updates are not sharded, or whose params are split over every
			 * device, is one program in every all_gather mode), from the mode's
			 * best seed of another program */
			if ((sp[i].gather == sp[i - 1].gather && sp[i].recompute == sp[i - 1].recompute) || !sp[i].other)
				continue;
			from_seed = sp[i].other;
		}
		searched++;
		s->mesh = sp[i].mesh, s->gather = sp[i].gather, s->train_recompute = sp[i].recompute;
		search_mesh(s, from_seed);
	}
	return searched > 0;
}

/* Every space's seeds, then the integer programs on the spaces whose best
 * seeds are best (search_from).  s->lower: the compute bound. */
static void search_spaces(Search *s) { search_from(s, 0, INFINITY, NSEARCH); }

/* Candidate c written out on its mesh (s->mesh and the choices set to it). */
static char *cand_text(Search *s, const Cand *c)
{
	s->mesh = c->mesh, s->gather = c->gather, s->train_recompute = c->recompute;
	make_choices(s);
	return plan_of(s, s->doc.root, c->pick, c->gather);
}

/* Keep candidate c, priced exactly (e, from text), as the answer when it
 * fits and is faster (ties: the first).  Takes text. */
static void settle(Search *s, const Cand *c, char *text, Eval *e)
{
	s->exact++;
	if (e->ok && s->pipe.axis >= 0) { /* written with its best microbatch count; the program does not depend on it */
		free(text);
		s->micro = e->pipe.microbatches, s->sched = e->pipe.schedule, s->recomp = e->pipe.recompute;
		s->virt = e->pipe.virtual_stages;
		text = cand_text(s, c);
		s->micro = 0;
	}
	if (e->ok && (s->smallest < 0 || e->peak < s->smallest))
		s->smallest = e->peak, s->smallest_recompute = c->recompute != RECOMPUTE_OFF;
	if (fits(s, e) && (!s->found || e->t < s->best_t)) {
		s->found = true, s->best_t = e->t, s->best_serial = e->serial, s->best_peak = e->peak;
		s->best_busy = e->busy[0];
		s->best_mesh = c->mesh, s->best_gather = c->gather, s->best_recompute = c->recompute, s->best_pipe = e->pipe;
		memcpy(s->best_pick, c->pick, sizeof(int) * (size_t)s->ngroup);
		free(s->best_text);
		s->best_text = text;
		return;
	}
	free(text);
}

typedef struct {
	const Search *s;
	char **text;
	Eval *e;
} Exact;

static void exact_one(void *ctx, int i)
{
	Exact *x = ctx;
	x->e[i].ok = price_text(x->s, x->text[i], &x->e[i]);
}

/* Price candidates c[0..n) exactly from their texts (taken), on the
 * whole model as `spmd cost` will (together, on s->jobs threads), settle
 * them in order and keep them, exact prices, in s->settled. */
static void settle_texts(Search *s, const Cand *const *c, char **text, int n)
{
	Eval *e = xcalloc((size_t)n + 1, sizeof *e);
	for (int i = 0; i < n; i++)
		e[i].pick = c[i]->pick;
	parallel_for(n, s->jobs, exact_one, &(Exact){s, text, e});
	for (int i = 0; i < n; i++) {
		Cand k = *c[i];
		k.pick = xmalloc(sizeof(int) * ((size_t)s->ngroup + 1));
		memcpy(k.pick, c[i]->pick, sizeof(int) * (size_t)s->ngroup);
		k.t = e[i].ok ? e[i].t : INFINITY, k.peak = e[i].ok ? e[i].peak : INT64_MAX;
		vec_push(&s->settled, k);
		settle(s, c[i], text[i], &e[i]);
	}
	free(e);
}

/* Price candidates c[0..n) exactly and settle them in order. */
static void settle_many(Search *s, const Cand **c, int n)
{
	char **text = xcalloc((size_t)n + 1, sizeof *text);
	for (int i = 0; i < n; i++)
		text[i] = cand_text(s, c[i]);
	settle_texts(s, c, text, n);
	free(text);
}

static bool same_cand(const Search *s, const Cand *a, const Cand *b)
{
	return a->gather == b->gather && a->recompute == b->recompute && !memcmp(a->mesh.size, b->mesh.size, sizeof a->mesh.size) &&
	       !memcmp(a->pick, b->pick, sizeof(int) * (size_t)s->ngroup);
}

/* Plan x as priced exactly so far (its exact t and peak), or NULL. */
static const Cand *settled_find(const Search *s, const Cand *x)
{
	for (int j = 0; j < s->settled.n; j++)
		if (same_cand(s, &s->settled.a[j], x))
			return &s->settled.a[j];
	return NULL;
}

/* The exact prices: the fastest estimates, the best seeds, and when none
 * of them fits, the smallest estimated peak. */
static void settle_all(Search *s)
{
	const Cand *c[NCAND + NSEED];
	int n = 0;
	for (int i = 0; i < s->cand.n + s->seed.n; i++) {
		/* the fastest estimate and the fastest seed first: when the time
		 * limit cut the search, only one a thread is priced */
		int k = i / 2, seed = i % 2;
		if (i >= 2 * NCAND)
			k = i - NCAND, seed = 1;
		if (k >= (seed ? s->seed.n : s->cand.n))
			continue;
		const Cand *x = seed ? &s->seed.a[k] : &s->cand.a[k];
		bool dup = false; /* a seed can be among the fastest estimates too: priced once */
		for (int j = 0; j < n && !dup; j++)
			dup = same_cand(s, c[j], x);
		dup = dup || settled_find(s, x); /* priced by confirm */
		if (!dup)
			c[n++] = x;
	}
	if (s->cut && n > s->jobs)
		n = s->jobs;
	settle_many(s, c, n);
	/* none fits: the smallest peaks, the estimates' and the seeds' (an
	 * estimate can miss a conflict that starts deeper than three layers) */
	n = 0;
	if (!s->found && s->smallest_cand.pick)
		c[n++] = &s->smallest_cand;
	if (!s->found && s->smallest_seed.pick && !(n && same_cand(s, c[0], &s->smallest_seed)))
		c[n++] = &s->smallest_seed;
	settle_many(s, c, n);
}

/* The passes on the answer (keep_whole, hold_weights, tune_prefetch):
 * plans text[0..n) priced exactly at once into e (each e[i].pick set),
 * and the first that fits and is faster than the answer (first) or the
 * fastest such (!first), or -1. */
static int price_tries(Search *s, char **text, Eval *e, int n, bool first)
{
	if (n > 0)
		parallel_for(n, s->jobs, exact_one, &(Exact){s, text, e});
	s->exact += n;
	int took = -1;
	for (int i = 0; i < n && !(first && took >= 0); i++)
		if (fits(s, &e[i]) && e[i].t < (took < 0 ? s->best_t : e[took].t))
			took = i;
	return took;
}

/* Plan `took` of price_tries as the answer's price and text (every other text freed). */
static void adopt(Search *s, char **text, const Eval *e, int n, int took)
{
	for (int i = 0; i < n; i++)
		if (i != took)
			free(text[i]);
	if (took < 0)
		return;
	s->best_t = e[took].t, s->best_serial = e[took].serial, s->best_peak = e[took].peak;
	s->best_busy = e[took].busy[0];
	free(s->best_text);
	s->best_text = text[took];
}

/* Some weights whole in a ZeRO-3 answer: when the answer gathers its
 * weights before each use, each param kind whose update it shards, the
 * largest first, is priced exactly with its own `all_gather:
 * after_update` (its weights whole between steps, gathered once, after the
 * update, instead of at each use in the forward and the backward) when
 * the bytes its whole copies add would keep the answer's peak within the
 * budget; kept when faster and within the budget, so the answer is never
 * slower.  One pass, in a fixed order: deterministic; at most KEEP_TRIES
 * kinds, each an exact price of the whole model (with --per-layer every
 * layer's weight is a kind), two priced at once. */
/* A kind kept whole with room made must make the step KEEP_ROOM_PCT
 * percent faster: the room costs the kinds sharded for it their update's
 * collectives, and the budget it takes is what the passes after it
 * (weights gathered once, a deeper prefetch) would spend.  On the 4-layer
 * d512 model with a vocabulary of 8192 on 8 H100s (2 x 4) within 120 MB,
 * the MLP's second weights kept whole with room made by sharding the
 * attention's output projection's update was 0.01% faster, and the
 * answer from there 2.631 ms, against 2.577 from the unembedding
 * gathered once in that room. */
enum { KEEP_TRIES = 8, KEEP_ROOM_PCT = 1 };
typedef struct {
	double add; /* the bytes the kind's whole copies add */
	int g;
	int to;     /* the kind's choice when kept whole: its own, or the replicated one with its update sharded */
} Keep;

/* Group G's choice of no split with its update sharded, or -1. */
static int replicated_wus(const Group *G)
{
	for (int k = 0; k < G->ch.n; k++) {
		const Choice *c = &G->ch.a[k];
		if (c->wus == WUS_ON + 1 && !c->follow && !spec_dim_axes(&c->spec))
			return k;
	}
	return -1;
}

static int by_add(const void *a, const void *b)
{
	const Keep *x = a, *y = b;
	return x->add != y->add ? (x->add < y->add) - (x->add > y->add) : (x->g > y->g) - (x->g < y->g);
}

/* Whether the passes on a ZeRO-3 answer apply (keep_whole, hold_weights,
 * tune_prefetch); when they do, its mesh's choices are made, s->own is
 * there and *ndev is its device count. */
static bool on_zero3(Search *s, int64_t *ndev)
{
	if (!s->found || s->cut || s->best_gather == GATHER_AFTER || s->pipe.axis >= 0 || !s->base.train ||
	    s->o->keep_train)
		return false;
	at_best(s);
	if (!s->own)
		s->own = xcalloc((size_t)s->ngroup + 1, 1);
	*ndev = 1;
	for (int a = 0; a < s->mesh.naxes; a++)
		*ndev *= s->mesh.size[a];
	return true;
}

/* Leaf v's local elements under choice c, and into *split its shards. */
static int64_t local_numel(const Search *s, const Value *v, const Choice *c, int64_t *split)
{
	int64_t local[MAX_RANK], numel = 1;
	spec_shard_shape(&c->spec, &s->mesh, v->shape.dim, local);
	*split = 1;
	for (int d = 0; d < v->shape.rank; d++) {
		numel *= local[d];
		for (int j = 0; j < c->spec.nax[d]; j++)
			*split *= s->mesh.size[c->spec.ax[d][j]];
	}
	return numel;
}

typedef struct {
	double bytes; /* hold: the bytes its whole copies add; room: the bytes its sharded update frees */
	double key;   /* the order: hold, the bytes of one of its tensors; room, bytes */
	int g;
} Hold;

static int by_key(const void *a, const void *b)
{
	const Hold *x = a, *y = b;
	return x->key != y->key ? (x->key < y->key) - (x->key > y->key) : (x->g > y->g) - (x->g < y->g);
}

/* The choice of group G with choice k's spec and its update sharded, or -1. */
static int sharded_twin(const Group *G, int k)
{
	return k + 1 < G->ch.n && G->ch.a[k + 1].twin == k && G->ch.a[k + 1].wus == WUS_ON + 1 ? k + 1 : -1;
}

/* Into pick (the answer's), room of at least need bytes from room[0..n)
 * (largest first): the smallest kind that covers it alone, else the
 * largest ones until they do.  False when they cannot. */
static bool make_room(const Search *s, const Hold *room, int n, double need, int *pick)
{
	int one = -1;
	for (int i = 0; i < n && room[i].bytes >= need; i++)
		one = i;
	for (int i = 0; i < n && need > 0; i++) {
		const Hold *r = one >= 0 ? &room[one] : &room[i];
		pick[r->g] = sharded_twin(&s->group[r->g], pick[r->g]);
		need -= r->bytes;
		if (one >= 0)
			break;
	}
	return need <= 0;
}

/* The room the answer's param kinds can make (make_room): each kind
 * split or whole whose update is not sharded and could be (not a user's
 * sharding), but not kind except, with the bytes sharding it frees (the
 * param and two moments: Adam's; fewer elsewhere, which the exact price
 * shows), largest first, into room; *spare gets their sum.  Returns how
 * many. */
static int room_kinds(const Search *s, int64_t ndev, int except, Hold *room, double *spare)
{
	double *free_ = xcalloc((size_t)s->ngroup + 1, sizeof(double));
	for (int i = 0; i < s->nleaf; i++) {
		int g = s->leaf[i].group;
		const Group *G = &s->group[g];
		const Choice *c = &G->ch.a[s->best_pick[g]];
		if (!G->param || c->follow || G->fixed || g == except || c->wus != WUS_OFF + 1 ||
		    sharded_twin(G, s->best_pick[g]) < 0)
			continue;
		int64_t split, numel = local_numel(s, &s->base.values.a[s->leaf[i].value], c, &split);
		free_[g] += 3 * (double)(numel * dtype_size(s->base.values.a[s->leaf[i].value].dtype)) *
		            (1 - (double)split / (double)ndev);
	}
	int n = 0;
	*spare = 0;
	for (int g = 0; g < s->ngroup; g++)
		if (free_[g] > 0)
			room[n++] = (Hold){free_[g], free_[g], g}, *spare += free_[g];
	free(free_);
	qsort(room, (size_t)n, sizeof *room, by_key);
	return n;
}

static void keep_whole(Search *s)
{
	int64_t ndev;
	if (!on_zero3(s, &ndev))
		return;
	double *add = xcalloc((size_t)s->ngroup + 1, sizeof(double)); /* per group: the bytes its whole copies add */
	Keep *order = xmalloc(sizeof *order * ((size_t)s->ngroup + 1));
	int n = 0;
	int *to = xmalloc(sizeof(int) * ((size_t)s->ngroup + 1)); /* per group: the choice kept whole */
	for (int g = 0; g < s->ngroup; g++)
		to[g] = s->best_pick[g];
	for (int i = 0; i < s->nleaf; i++) {
		int g = s->leaf[i].group;
		const Group *G = &s->group[g];
		const Choice *c = &G->ch.a[s->best_pick[g]];
		const Value *v = &s->base.values.a[s->leaf[i].value];
		if (!G->param || G->tiny || c->follow || s->own[g]) /* own: kept whole already (try_selective runs it again) */
			continue;
		int64_t split, numel = local_numel(s, v, c, &split);
		if (c->wus != WUS_ON + 1) {
			/* split, its update not sharded: whole instead, its update
			 * sharded, the whole copy gathered once after the update (a
			 * vocabulary-parallel unembedding against ZeRO-3's); not a
			 * user's sharding, which is kept */
			int r = G->fixed || !spec_dim_axes(&c->spec) ? -1 : replicated_wus(G);
			if (r >= 0)
				to[g] = r, add[g] += (double)((shape_numel(&v->shape) - numel) * dtype_size(v->dtype));
			continue;
		}
		double shards = (double)ndev / (double)split; /* the replicas its update is sharded over */
		add[s->leaf[i].group] += (double)(numel * dtype_size(v->dtype)) * (1 - 1 / shards);
	}
	Hold *room = xmalloc(sizeof *room * ((size_t)s->ngroup + 1));
	double spare, *freed = xcalloc((size_t)s->ngroup + 1, sizeof(double)); /* per group: the room it makes */
	for (int i = 0, nr = room_kinds(s, ndev, -1, room, &spare); i < nr; i++)
		freed[room[i].g] = room[i].bytes;
	for (int g = 0; g < s->ngroup; g++)
		if (add[g] > 0 && (double)s->best_peak + add[g] - s->o->budget <= spare - freed[g])
			order[n++] = (Keep){add[g], g, to[g]};
	free(to), free(freed);
	qsort(order, (size_t)n, sizeof *order, by_add); /* the largest first (ties: the first group) */
	if (n > KEEP_TRIES)
		n = KEEP_TRIES;
	/* Two tries at a time (on two threads where s->jobs allows): the next
	 * kind is priced as if this one were not kept; the faster that fits is
	 * kept when faster than the answer, and when that is the first, the
	 * second is priced again on top of it (the answer is the one pass's, on
	 * any number of threads).  A kind whose copies would take the answer's
	 * peak over the budget is priced with room made (make_room), or passed
	 * over when the answer has no more to make. */
	for (int i = 0; i < n && !out_of_time(s);) {
		char *text[2];
		int *pick[2], at[2], m = 0, j = i;
		bool made[2];
		for (; j < n && m < 2; j++) {
			int g = order[j].g, nr;
			double need = (double)s->best_peak + order[j].add - s->o->budget;
			pick[m] = xmalloc(sizeof(int) * ((size_t)s->ngroup + 1));
			memcpy(pick[m], s->best_pick, sizeof(int) * (size_t)s->ngroup);
			pick[m][g] = order[j].to;
			if (need > 0 && ((nr = room_kinds(s, ndev, g, room, &spare)) == 0 || need > spare ||
			                 !make_room(s, room, nr, need, pick[m]))) {
				free(pick[m]);
				continue;
			}
			s->own[g] = AG_AFTER_UPDATE;
			text[m] = plan_of(s, s->doc.root, pick[m], s->best_gather);
			s->own[g] = 0;
			made[m] = need > 0, at[m++] = j;
		}
		if (m == 0)
			break;
		Eval e[2] = {{.pick = pick[0]}, {.pick = pick[m - 1]}};
		price_tries(s, text, e, m, false);
		int took = -1; /* the faster that fits and gains (KEEP_ROOM_PCT where room was made) */
		for (int k = 0; k < m; k++)
			if (fits(s, &e[k]) && e[k].t < s->best_t * (made[k] ? 1 - KEEP_ROOM_PCT / 100.0 : 1) &&
			    (took < 0 || e[k].t < e[took].t))
				took = k;
		adopt(s, text, e, m, took);
		if (took >= 0) {
			s->own[order[at[took]].g] = AG_AFTER_UPDATE;
			memcpy(s->best_pick, pick[took], sizeof(int) * (size_t)s->ngroup);
		}
		for (int k = 0; k < m; k++)
			free(pick[k]);
		i = took == 0 && m == 2 ? at[1] : j; /* kept the first: the second again, on top of it */
	}
	free(add), free(order), free(room);
}

/* Weights gathered once a step: when the answer gathers its weights
 * before each use, a param kind whose update it shards, gathered at each
 * use in the forward and again in the backward, is priced exactly with
 * its own `all_gather: first_use` instead: the forward's gathered copy is
 * held for the backward, one gather of it a step fewer, its whole copy
 * held from its first use to its last (FSDP's root: the unembedding,
 * which the forward reads last and the backward first, otherwise gathered
 * again just after the loss, with nothing left to hide that gather
 * behind).  The kinds go by the bytes of one tensor's gather, the
 * largest first (the longest gathers are the ones least hidden).  Each is
 * priced as it is when its copies' bytes are at most twice the room the
 * answer leaves in the budget (they add at most those bytes to the peak,
 * often less: the peak may lie outside the span they are held); where
 * they would take the answer's peak over the budget, it is priced
 * (again) with room made by sharding the update of kinds the answer keeps
 * whole without it (wq of a tight 12-layer plan: 170 MB of params and
 * Adam's moments for a 131 MB unembedding held): the fewest bytes that
 * cover it, one kind if one does.  A kind keep_whole kept whole between
 * steps is a candidate too (gathered at its first use instead of after
 * its update: the same bytes, held for less of the step).  HOLD_PRICES
 * plans priced at once; the fastest within the budget is kept when
 * faster than the answer, so the answer is never slower. */
enum { HOLD_PRICES = 3 };

static void hold_weights(Search *s)
{
	int64_t ndev;
	if (!on_zero3(s, &ndev))
		return;
	double *hold = xcalloc((size_t)s->ngroup + 1, sizeof(double));
	for (int i = 0; i < s->nleaf; i++) {
		int g = s->leaf[i].group;
		const Group *G = &s->group[g];
		const Choice *c = &G->ch.a[s->best_pick[g]];
		const Value *v = &s->base.values.a[s->leaf[i].value];
		if (!G->param || c->follow || (s->own[g] && s->own[g] != AG_AFTER_UPDATE) || c->wus != WUS_ON + 1 || G->tiny)
			continue;
		int64_t split, numel = local_numel(s, v, c, &split);
		/* (kept whole by keep_whole: its bytes are already held, at most) */
		hold[g] += (double)(numel * dtype_size(v->dtype)) * (1 - (double)split / (double)ndev);
	}
	Hold *cand = xmalloc(sizeof *cand * ((size_t)s->ngroup + 1)), *room = xmalloc(sizeof *room * ((size_t)s->ngroup + 1));
	int nc = 0;
	for (int g = 0; g < s->ngroup; g++)
		if (hold[g] > 0)
			cand[nc++] = (Hold){hold[g], hold[g] / s->group[g].members, g};
	qsort(cand, (size_t)nc, sizeof *cand, by_key);
	double spare;
	int nr = room_kinds(s, ndev, -1, room, &spare);
	char *text[HOLD_PRICES];
	int *pick[HOLD_PRICES], tried[HOLD_PRICES], m = 0;
	for (int i = 0; i < nc && m < HOLD_PRICES; i++) {
		bool whole = s->own[cand[i].g] == AG_AFTER_UPDATE; /* whole between steps: held less at first use */
		double need = whole ? 0 : (double)s->best_peak + cand[i].bytes - s->o->budget;
		/* as it is when at most twice the room left; with room made when over it */
		bool as_is = whole || cand[i].bytes <= 2 * (s->o->budget - (double)s->best_peak);
		for (int with_room = !as_is; with_room < 1 + (need > 0 && need <= spare) && m < HOLD_PRICES; with_room++) {
			pick[m] = xmalloc(sizeof(int) * ((size_t)s->ngroup + 1));
			memcpy(pick[m], s->best_pick, sizeof(int) * (size_t)s->ngroup);
			if (with_room && !make_room(s, room, nr, need, pick[m])) {
				free(pick[m]);
				break;
			}
			int8_t was = s->own[cand[i].g];
			s->own[cand[i].g] = AG_FIRST_USE;
			text[m] = plan_of(s, s->doc.root, pick[m], s->best_gather);
			s->own[cand[i].g] = was;
			tried[m++] = cand[i].g;
		}
	}
	Eval e[HOLD_PRICES];
	for (int j = 0; j < m; j++)
		e[j] = (Eval){.pick = pick[j]};
	int took = price_tries(s, text, e, m, false);
	adopt(s, text, e, m, took);
	if (took >= 0) {
		s->own[tried[took]] = AG_FIRST_USE;
		memcpy(s->best_pick, pick[took], sizeof(int) * (size_t)s->ngroup);
	}
	for (int j = 0; j < m; j++)
		free(pick[j]);
	free(hold), free(cand), free(room);
}

/* Sibling choices: choice k of param kind g is one the answer gives
 * another param kind of the same shape (the value projection split as the
 * query's): the projections of one attention are alike, and the rounds,
 * moving a few kinds at a time on estimates, can leave one of them apart
 * (96 layers on 256 H100s within 24.5 GB: the value projection's heads
 * over data and its update sharded, 2.461 s a step; split as the query's,
 * 2.386 s).  Marked in sib[off[g] + k] for every kind at once: the kinds
 * sorted by shape, each run's distinct chosen shardings listed once, so
 * that --per-layer's thousand kinds cost no quadratic pass. */
typedef struct {
	const Shape *shape;
	int g;
} ByShape;

static int by_shape(const void *a, const void *b)
{
	const ByShape *x = a, *y = b;
	if (x->shape->rank != y->shape->rank)
		return x->shape->rank - y->shape->rank;
	for (int d = 0; d < x->shape->rank; d++)
		if (x->shape->dim[d] != y->shape->dim[d])
			return x->shape->dim[d] < y->shape->dim[d] ? -1 : 1;
	return x->g - y->g;
}

static void mark_siblings(const Search *s, const int *off, uint8_t *sib)
{
	memset(sib, 0, (size_t)off[s->ngroup]);
	ByShape *ord = xmalloc(sizeof *ord * ((size_t)s->ngroup + 1));
	const Choice **seen = xmalloc(sizeof *seen * ((size_t)s->ngroup + 1));
	int n = 0;
	for (int g = 0; g < s->ngroup; g++)
		if (s->group[g].param && !s->group[g].fixed)
			ord[n++] = (ByShape){&s->base.values.a[s->leaf[s->group[g].first].value].shape, g};
	qsort(ord, (size_t)n, sizeof *ord, by_shape);
	for (int i = 0, j; i < n; i = j) {
		int nseen = 0;
		for (j = i; j < n && shape_eq(ord[j].shape, ord[i].shape); j++) { /* the run's chosen shardings */
			const Choice *b = &s->group[ord[j].g].ch.a[s->best_pick[ord[j].g]];
			bool dup = false;
			for (int q = 0; q < nseen && !dup; q++)
				dup = seen[q]->wus == b->wus && spec_eq(&seen[q]->spec, &b->spec);
			if (!dup)
				seen[nseen++] = b;
		}
		for (int r = i; r < j && nseen > 1; r++) { /* one alone is the kinds' own choice */
			const Group *G = &s->group[ord[r].g];
			for (int k = 0; !G->tiny && k < G->ch.n; k++) {
				const Choice *a = &G->ch.a[k];
				for (int q = 0; q < nseen && !a->follow && !sib[off[ord[r].g] + k]; q++)
					sib[off[ord[r].g] + k] = seen[q]->wus == a->wus && spec_eq(&seen[q]->spec, &a->spec);
			}
		}
	}
	free(ord), free(seen);
}

/* Is choice k of kind g, whose choice in pick is c, a neighbour of the
 * answer for polish: any other choice on a model priced whole, else
 * (a chain of layers) the same sharding with the other weight-update
 * sharding, of a kind not tiny (whose update is next to nothing either
 * way), any other choice of a param outside the layers (an embedding
 * table, the output projection, the last norm's scale and shift: a kind
 * of one tensor), and a sibling choice (sib, mark_siblings). */
static bool neighbour(const Search *s, int g, int c, int k, const uint8_t *sib)
{
	const Group *G = &s->group[g];
	const Choice *ch = G->ch.a;
	return k != c && !G->fixed &&
	       (!s->layers.n || (!G->tiny && ch[k].twin == ch[c].twin && ch[k].wus != ch[c].wus) ||
	        (G->param && G->members == 1) || sib[k]);
}

/* Pair neighbour: a param outside the layers (a kind of one tensor, not
 * tiny) at choice k, with the start of the stream it meets (h, a source
 * kind) pinned to the batch split of the answer's inputs, over some axis
 * k splits too (where propagation must choose between the two), its
 * first dim (a lookup table's rows) whole and its update sharded as
 * before.  Each alone may change nothing or be slow
 * (the embedding table split on its model dim, the lookup left to
 * propagation, carries that split into the layers); together they are
 * the table split on its model dim and the lookup sent to the batch's
 * devices. */
static bool pair_neighbour(const Search *s, int g, int k, int h, int l, unsigned batch)
{
	const Group *G = &s->group[g], *H = &s->group[h];
	int n = s->ngroup, a = g < h ? g : h, b = g < h ? h : g;
	const Spec *p = &H->ch.a[l].spec;
	unsigned pin = 0;
	for (int j = 0; j < p->nax[0]; j++)
		pin |= 1u << p->ax[0][j];
	return k != s->best_pick[g] && l != s->best_pick[h] && G->param && !G->tiny && !G->fixed && G->members == 1 &&
	       H->source && s->adj[a * n + b] && !H->ch.a[l].follow && pin == batch &&
	       (spec_dim_axes(&G->ch.a[k].spec) & pin) && !G->ch.a[k].spec.nax[0] &&
	       G->ch.a[k].wus == G->ch.a[s->best_pick[g]].wus;
}

/* The axes splitting the batch (the first dim) of the answer's inputs. */
static unsigned batch_axes(const Search *s)
{
	unsigned m = 0;
	for (int g = 0; g < s->ngroup; g++) {
		const Group *G = &s->group[g];
		const Choice *c = &G->ch.a[s->best_pick[g]];
		if (G->param || G->role || c->follow)
			continue;
		for (int j = 0; j < c->spec.nax[0]; j++)
			m |= 1u << c->spec.ax[0][j];
	}
	return m;
}

/* The answer made 1-optimal over its neighbours (neighbour): each is
 * estimated with the rest of the answer kept; the one estimated fastest,
 * if faster than the answer's own estimate and within the budget, is
 * priced exactly (from its YAML, as every answer is) and taken when
 * faster there too; then again from the new answer, at most MAX_POLISH
 * times.  The rounds' programs move kinds together on second-order
 * estimates and can stop one change short: a three-layer MLP on 4 TPU
 * v4s within 300,000 bytes, its last bias's update sharded, 62.3 us a
 * step, whole 59.3; the 96-layer benchmark model on 256 H100s, every
 * attention output weight's update whole, 2.234 s, sharded 2.204.  On a
 * model priced whole an estimate is the exact price and costs little,
 * so every choice is a neighbour; on a chain of layers only the other
 * weight-update sharding of each param kind not tiny (all choices would
 * cost half as many estimates again as the search), every choice of the
 * params outside the layers, and the pairs of pair_neighbour. */
enum { MAX_POLISH = 4 };

/* The answer with every activation it pins left to follow propagation
 * instead, priced exactly and kept when faster (settle): the pins are
 * chosen kind by kind, and pins that paid for themselves one at a time
 * can cost more together than propagation's own choice (the 4-layer d64
 * model on 4 TPU v4s, its train: section kept: the residual stream's
 * sequence split pinned, 0.748 ms; left to propagation, 0.741 and less
 * memory).  Polish's first move. */
static void unpin(Search *s)
{
	int *pick = xmalloc(sizeof(int) * ((size_t)s->ngroup + 1));
	bool any = false;
	for (int g = 0; g < s->ngroup; g++) {
		pick[g] = s->best_pick[g];
		if (s->group[g].role && !s->group[g].fixed && pick[g] != 0)
			pick[g] = 0, any = true; /* an activation kind's first choice follows propagation */
	}
	Cand c = {.mesh = s->best_mesh, .gather = s->best_gather, .recompute = s->best_recompute, .pick = pick};
	if (any && !settled_find(s, &c)) {
		char *text = plan_of(s, s->doc.root, pick, c.gather);
		Eval e = {.pick = pick};
		e.ok = price_text(s, text, &e);
		settle(s, &c, text, &e);
	}
	free(pick);
}

static void polish(Search *s)
{
	if (!s->found || s->pipe.axis >= 0)
		return;
	bool kept = false; /* keep_whole changed the answer's own gathers, which the enumeration did not */
	for (int g = 0; s->own && g < s->ngroup; g++)
		kept |= s->own[g] != 0;
	if (s->enumerated && !s->cut && !kept && s->best_gather == s->enum_gather &&
	    s->best_recompute == s->enum_recompute && same_mesh(&s->best_mesh, &s->enum_mesh))
		return; /* every neighbour was priced there: none is faster */
	at_best(s);
	if (!out_of_time(s))
		unpin(s);
	clear_cache(s);
	int *off = xmalloc(sizeof(int) * ((size_t)s->ngroup + 1)); /* sib's start per kind */
	off[0] = 0;
	for (int g = 0; g < s->ngroup; g++)
		off[g + 1] = off[g] + s->group[g].ch.n;
	uint8_t *sib = xmalloc((size_t)off[s->ngroup] + 1);
	int *src = xmalloc(sizeof(int) * ((size_t)s->ngroup + 1)), nsrc = 0; /* the source kinds */
	for (int h = 0; h < s->ngroup; h++)
		if (s->group[h].source)
			src[nsrc++] = h;
	for (int it = 0; it < MAX_POLISH && !out_of_time(s); it++) {
		unsigned batch = batch_axes(s);
		mark_siblings(s, off, sib);
		want(s, s->best_pick);
		for (int g = 0; g < s->ngroup; g++) /* estimated together first */
			for (int k = 0; k < s->group[g].ch.n; k++) {
				if (neighbour(s, g, s->best_pick[g], k, sib + off[g]))
					want_at(s, s->best_pick, g, k, -1, 0, NPROXY);
				for (int j = 0; j < nsrc; j++)
					for (int l = 0; l < s->group[src[j]].ch.n; l++)
						if (pair_neighbour(s, g, k, src[j], l, batch))
							want_at(s, s->best_pick, g, k, src[j], l, NPROXY);
			}
		run_batch(s);
		const Eval *self = price(s, s->best_pick);
		if (!self || !self->ok)
			break;
		int bg = -1, bk = -1, bh = -1, bl = 0;
		double bt = self->t;
		for (int g = 0; g < s->ngroup; g++)
			for (int k = 0; k < s->group[g].ch.n; k++) {
				if (neighbour(s, g, s->best_pick[g], k, sib + off[g])) {
					const Eval *e = price_at(s, s->best_pick, g, k, -1, 0, false);
					if (e && e->ok && fits(s, e) && e->t < bt)
						bg = g, bk = k, bh = -1, bt = e->t;
				}
				for (int j = 0; j < nsrc; j++)
					for (int l = 0; l < s->group[src[j]].ch.n; l++) {
						if (!pair_neighbour(s, g, k, src[j], l, batch))
							continue;
						const Eval *e = price_at(s, s->best_pick, g, k, src[j], l, false);
						if (e && e->ok && fits(s, e) && e->t < bt)
							bg = g, bk = k, bh = src[j], bl = l, bt = e->t;
					}
			}
		if (bg < 0)
			break;
		Cand c = {.mesh = s->best_mesh, .gather = s->best_gather, .recompute = s->best_recompute, .pick = moved(s, s->best_pick, bg, bk, bh, bl)};
		char *text = plan_of(s, s->doc.root, c.pick, c.gather);
		Eval e = {.pick = c.pick};
		e.ok = price_text(s, text, &e);
		double before = s->best_t;
		settle(s, &c, text, &e);
		free(c.pick);
		if (!(s->best_t < before))
			break;
	}
	free(off), free(sib), free(src);
}

/* The answer's prefetch depth: when it gathers its weights before use
 * three ahead, it is priced exactly with each of three deeper
 * depths (more gathered weights alive, the gathers started sooner; one
 * ahead, with two); the fastest within the budget is kept when faster.
 * Last, after every choice of the shardings: the depth changes no
 * sharding, and the estimates before it keep the mode's depth. */
static void tune_prefetch(Search *s)
{
	int64_t ndev;
	if (!on_zero3(s, &ndev))
		return;
	/* the mode's own depth first: the answer's when try_selective runs this again */
	static const int deeper[] = {0, 4, 6, 8}, near[] = {0, 2};
	const int *all = s->best_gather == GATHER_BEFORE ? deeper : near;
	int d[4], n = 0, was = s->depth;
	char *text[4];
	Eval e[4];
	for (int i = 0; i < (s->best_gather == GATHER_BEFORE ? 4 : 2); i++)
		if (all[i] != was)
			d[n++] = all[i];
	for (int i = 0; i < n; i++) {
		s->depth = d[i];
		text[i] = plan_of(s, s->doc.root, s->best_pick, s->best_gather);
		e[i] = (Eval){.pick = s->best_pick};
	}
	s->depth = was;
	int took = price_tries(s, text, e, n, false);
	adopt(s, text, e, n, took);
	s->depth = took >= 0 ? d[took] : was;
}

/* Step 9, the forward's cheap results made again: `recompute: selective`
 * (train/train.c: the backward makes again the forward's results cheap
 * for their size, the attention's probabilities and the norms' and
 * activations' results, from the values it keeps) takes memory off the
 * step for a little compute.  That pays where the budget made a ZeRO-3
 * answer wait on its gathers: the room it makes lets steps 5 and 7
 * keep more weights whole, hold more gathered copies and prefetch
 * deeper.  So when the answer (not step 8's) gathers its weights before use and is
 * SELECT_GAP_PCT percent or more above the bound (the compute bound of
 * the step without it, which no plan of it beats), and the step may be
 * written with it and has results to make again (s->sel_floor: its
 * memory floor falls with it), the answer is priced
 * exactly with it and those steps run again from there; the outcome is
 * kept when faster than the answer, so the answer is never slower.
 * Last: every price in it is exact (the passes before estimate on
 * proxies of the step without it). */
enum { SELECT_GAP_PCT = 5 };

/* The answer as it is, to go back to (answer_back) when passes tried from
 * another plan end slower, or to drop (answer_drop). */
typedef struct {
	char *text;
	double t, serial, busy;
	int64_t peak;
	Mesh mesh;
	int gather, recompute, depth;
	int *pick;
	int8_t *own; /* a copy of s->own, or NULL */
} Answer;

/* The answer into a: its pick and own copied, its text taken (s->best_text NULL). */
static void answer_keep(Search *s, Answer *a)
{
	*a = (Answer){.text = s->best_text, .t = s->best_t, .serial = s->best_serial, .busy = s->best_busy,
	              .peak = s->best_peak, .mesh = s->best_mesh, .gather = s->best_gather,
	              .recompute = s->best_recompute, .depth = s->depth,
	              .pick = xmalloc(sizeof(int) * ((size_t)s->ngroup + 1))};
	memcpy(a->pick, s->best_pick, sizeof(int) * (size_t)s->ngroup);
	if (s->own) {
		a->own = xmalloc((size_t)s->ngroup + 1);
		memcpy(a->own, s->own, (size_t)s->ngroup);
	}
	s->best_text = NULL;
}

/* The answer kept in a made the answer again (a consumed). */
static void answer_back(Search *s, Answer *a)
{
	free(s->best_text), free(s->own);
	s->best_text = a->text, s->best_t = a->t, s->best_serial = a->serial, s->best_busy = a->busy;
	s->best_peak = a->peak, s->best_mesh = a->mesh, s->best_gather = a->gather, s->best_recompute = a->recompute;
	s->depth = a->depth, s->own = a->own;
	memcpy(s->best_pick, a->pick, sizeof(int) * (size_t)s->ngroup);
	free(a->pick);
	at_best(s);
}

static void answer_drop(Answer *a) { free(a->text), free(a->pick), free(a->own); }

static void try_selective(Search *s, double bound)
{
	int64_t ndev;
	if (s->sel_floor < 0 || 100 * (s->best_t - bound) < SELECT_GAP_PCT * s->best_t || out_of_time(s) ||
	    !on_zero3(s, &ndev))
		return;
	Answer was;
	answer_keep(s, &was);
	s->train_recompute = s->best_recompute = RECOMPUTE_SELECTIVE;
	char *sel = plan_of(s, s->doc.root, s->best_pick, s->best_gather);
	Eval e = {.pick = s->best_pick};
	s->best_t = INFINITY;
	int took = price_tries(s, &sel, &e, 1, true);
	adopt(s, &sel, &e, 1, took);
	if (took == 0) { /* within the budget: the passes from it */
		keep_whole(s);
		hold_weights(s);
		tune_prefetch(s);
	}
	if (took == 0 && s->best_t < was.t)
		answer_drop(&was);
	else
		answer_back(s, &was);
}

/* Step 5 on the other kind of plan: when the answer does not gather its
 * weights before use and is SEARCH_FAR_PCT percent or more above the
 * bound, keep_whole on the fastest plan priced exactly that does (and
 * fits), kept when that makes it faster than the answer.  Keeping kinds
 * whole changes a ZeRO-3 plan most, and the searches end on either kind
 * by their seeds: on the 4-layer d256 model with a 4096-word vocabulary
 * on 8 TPU v4s within 40 MB, Megatron's plan 1.11 ms, ZeRO-3's 1.28, with
 * its unembedding kept whole (and six weights prefetched) 0.98. */
static void keep_whole_other(Search *s)
{
	if (!s->found || s->cut || s->best_gather != GATHER_AFTER || s->pipe.axis >= 0 || !s->base.train ||
	    s->o->keep_train || out_of_time(s) || 100 * (s->best_t - s->lower) < SEARCH_FAR_PCT * s->best_t)
		return;
	const Cand *z = NULL;
	for (int i = 0; i < s->settled.n; i++) {
		const Cand *k = &s->settled.a[i];
		if (k->gather != GATHER_AFTER && (double)k->peak <= s->o->budget && k->t < INFINITY && (!z || k->t < z->t))
			z = k;
	}
	if (!z)
		return;
	Answer was;
	answer_keep(s, &was);
	free(s->own), s->own = NULL; /* z's kinds kept whole: none yet */
	s->best_mesh = z->mesh, s->best_gather = z->gather, s->best_recompute = z->recompute;
	s->best_t = z->t, s->best_peak = z->peak;
	memcpy(s->best_pick, z->pick, sizeof(int) * (size_t)s->ngroup);
	keep_whole(s);
	if (s->best_t < was.t) /* a plan keep_whole priced (adopt) */
		answer_drop(&was);
	else
		answer_back(s, &was);
}

/* The passes on an answer: steps 5 to 7. */
static void improve(Search *s)
{
	keep_whole(s);
	hold_weights(s);
	polish(s);
	tune_prefetch(s);
}

/* Whether to search the step recomputing selectively too: the step may be
 * so written and that takes memory off it (s->sel_floor), a plan of it
 * can fit, and the answer is SEARCH_FAR_PCT percent or more above the
 * compute bound, or none was found: the budget squeezes the step, and the
 * room the backward's making again frees may buy more than the compute
 * it costs. */
static bool select_spaces(Search *s)
{
	if (s->sel_floor < 0 || (double)s->sel_floor > s->o->budget || s->cut || out_of_time(s))
		return false;
	return !s->found || 100 * (s->best_t - s->lower) >= SEARCH_FAR_PCT * s->best_t;
}

/* Step 8, after step 5: the step recomputing selectively searched
 * (select_spaces).  Every mesh shape seeded again with the step
 * recomputing selectively, in the answer's gather mode (prefetching
 * where it gathers before use; every mode when no answer was found); the
 * space whose best seed fits and is faster than the answer (NSEARCH of
 * them when none was found) searched, the plans found priced exactly,
 * and steps 5 to 7 run from the best of them when it is faster than the
 * answer: then true, and the answer's own steps 6, 7 and 9 are not run.
 * On 96 layers d8192 over 256 H100s within 24.5 GB, the answer after
 * step 5 is 2451 ms on 2 x 128 (2371 after steps 6 and 7) and the best
 * seed recomputing 2300 on 4 x 64 (the room made holds a model axis half
 * as wide), searched to 2283 and passed to 2218.  The two steps are
 * searched one after the other, each with its passes (the first's up to
 * step 5, which changes a ZeRO-3 answer most), not ranked together by
 * their seeds: a seed that recomputes can look faster than every one
 * that does not where the passes of the step without it make a plan
 * faster still (the 12-layer d1024 model on 8 TPU v4s within 2.2 GB: a
 * seed of 51.3 ms against 42.2). */
static bool search_selective(Search *s)
{
	if (!select_spaces(s))
		return false;
	int plain = s->spaces.n;
	int8_t *own = NULL;
	if (s->own) { /* the answer's own gathers: the selective plans are written without them */
		own = xmalloc((size_t)s->ngroup + 1);
		memcpy(own, s->own, (size_t)s->ngroup);
		memset(s->own, 0, (size_t)s->ngroup);
	}
	/* the answer's gather mode, prefetching where it gathers before use:
	 * the room made goes to plans of its kind on other meshes, or deeper */
	int mode = s->best_gather == GATHER_AFTER ? GATHER_AFTER : GATHER_BEFORE;
	for (int i = 0; i < plain; i++) {
		Space x = {.mesh = s->spaces.a[i].mesh, .gather = s->spaces.a[i].gather, .recompute = RECOMPUTE_SELECTIVE};
		if (!s->found || x.gather == mode)
			vec_push(&s->spaces, x);
	}
	top_clear(&s->cand); /* the estimates left are the other step's: priced already */
	top_clear(&s->seed);
	bool was = s->found;
	double t = s->best_t;
	if (search_from(s, plain, s->found ? s->best_t : INFINITY, s->found ? 1 : NSEARCH))
		settle_all(s);
	bool won = s->found && (!was || s->best_t < t);
	if (won) { /* a plan of the selective step is the answer */
		s->sel_needed = !was;
		improve(s);
	} else if (own) {
		memcpy(s->own, own, (size_t)s->ngroup);
	}
	free(own);
	return won;
}

/* The step as this search builds its plans, recomputing as recompute (a
 * RECOMPUTE_* mode, or the model's with RECOMPUTE_OFF): into *lower a lower bound on the overlapped
 * step time of every plan over ndev devices, the compute stream's least
 * busy time (cost_compute_bound; docs/autoshard.md says why it is a
 * bound), and into *floor a floor under every plan's peak per device
 * (cost_step_floor; -1 for a pipelined model, whose stages and
 * microbatches hold other things). */
static void step_bounds(const Search *s, int recompute, int ndev, double *lower, int64_t *floor)
{
	Graph g;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	*lower = 0, *floor = -1;
	if (model_load_string(&g, s->text, s->file, &d) == 0) {
		if (g.train && recompute)
			g.train->recompute = (int8_t)recompute;
		if (!g.train || train_build(&g, &d) == 0) {
			*lower = cost_compute_bound(&g, s->o->hw, ndev);
			*floor = g.pipeline ? -1 : cost_step_floor(&g, ndev);
		}
	}
	graph_free(&g);
}

/* ---- meshes ---- */

/* The model names no mesh axis: no sharding, no axis rules, no pipeline,
 * the short mesh form (no device list or links per axis). */
static bool axis_blind(const Search *s)
{
	if (s->base.rules.n || s->pipe.axis >= 0 || s->mesh_long || s->mesh.devices)
		return false;
	for (int v = 0; v < s->base.values.n; v++)
		if (s->base.values.a[v].has_spec)
			return false;
	return true;
}

/* Does the devices' order leave every price as it is: one switch holds
 * them all, so that every group of k devices has the same links whatever
 * their stride (cost_model/collective_cost.c)? */
static bool order_free(const Search *s)
{
	const HwProfile *hw = s->o->hw;
	int64_t in = hw->ndims > 0 ? 1 : 0, n = 1;
	for (int j = 0; j < hw->ndims; j++)
		in *= hw->dims[j];
	for (int a = 0; a < s->mesh.naxes; a++) /* the sizes being tried: ndev may be the model's mesh's */
		n *= s->mesh.size[a];
	return (hw->topo == TOPO_SWITCH || hw->topo == TOPO_THREADS) && n <= in;
}

/* The sizes > 1 of mesh m, in order or (sorted) not, into out; their count. */
static int live_sizes(const Mesh *m, bool sorted, int *out)
{
	int n = 0;
	for (int i = 0; i < m->naxes; i++)
		if (m->size[i] > 1) {
			int j = n++;
			for (; sorted && j > 0 && out[j - 1] > m->size[i]; j--)
				out[j] = out[j - 1];
			out[j] = m->size[i];
		}
	return n;
}

/* Is mesh b mesh a with its axes renamed (and, when the order of the
 * devices does not matter, permuted)? */
static bool same_live(const Mesh *a, const Mesh *b, bool any_order)
{
	int x[MESH_MAX_AXES], y[MESH_MAX_AXES], n = live_sizes(a, any_order, x);
	return n == live_sizes(b, any_order, y) && !memcmp(x, y, sizeof(int) * (size_t)n);
}

/* List the current mesh with all_gather after_update, before_use, and
 * before_use with one weight prefetched and with prefetch off (unless the
 * train: section is kept).  A
 * mesh whose axes of size > 1 are an earlier one's under other names
 * (8x1 after 1x8) is that mesh when the model names no axis: the devices
 * are in the same order, so every plan has its twin at the same price,
 * and ties go to the earlier.  When one switch holds every device, their
 * order does not change a price either, and a mesh whose sizes are an
 * earlier one's in another order (4x2 after 2x4) is that mesh too. */
static void try_modes(Search *s)
{
	int modes = s->base.train && !s->o->keep_train ? NGATHER : 1;
	if (!autopipe_mesh_ok(&s->pipe, &s->base, &s->mesh))
		return; /* more stages than the layers fill */
	bool blind = s->spaces.n && axis_blind(s), any_order = order_free(s);
	for (int i = 0; i < s->spaces.n && blind; i++)
		if (same_live(&s->spaces.a[i].mesh, &s->mesh, any_order))
			return;
	for (int m = 0; m < modes; m++) {
		const Train *t = s->base.train;
		int kept = !t || !t->gather_before_use ? GATHER_AFTER
		           : t->prefetch == 0           ? GATHER_AT_USE
		           : t->prefetch == 1           ? GATHER_NEAR
		                                        : GATHER_BEFORE;
		int gather = !t ? GATHER_AFTER : s->o->keep_train ? kept : m;
		vec_push(&s->spaces, ((Space){.mesh = s->mesh, .gather = gather, .recompute = s->train_recompute}));
	}
}

/* Every ordered factorization of n over the axes from a on. */
static void try_meshes(Search *s, int64_t n, int a)
{
	if (a == s->mesh.naxes) {
		if (n == 1)
			try_modes(s);
		return;
	}
	if (s->mesh.pre[a] > 0) { /* a piece of an axis the annotations cut (a sub-axis): its size is its name's */
		if (n % s->mesh.size[a] == 0)
			try_meshes(s, n / s->mesh.size[a], a + 1);
		return;
	}
	for (int64_t f = 1; f <= n; f++)
		if (n % f == 0) {
			s->mesh.size[a] = (int)f;
			try_meshes(s, n / f, a + 1);
		}
}

/* The signature of one layer: the sum of a hash of every value's name
 * (its layer number as '#') and shape; count: how many values. */
typedef struct {
	uint64_t sum;
	long count;
} Sig;

static uint64_t value_hash(const Value *v, size_t at, size_t len)
{
	uint64_t h = 14695981039346656037u;
	for (size_t i = 0; v->name[i]; i++)
		if (i < at || i >= at + len)
			h = (h ^ (unsigned char)v->name[i]) * 1099511628211u;
	for (int d = 0; d < v->shape.rank; d++)
		h = (h ^ (uint64_t)v->shape.dim[d]) * 1099511628211u;
	return (h ^ (uint64_t)v->kind) * 1099511628211u;
}

/* A value the model names: an input, a param or an op's result (a
 * constant's name is its number). */
static bool named(const Value *v) { return v->kind == VK_INPUT || v->kind == VK_PARAM || v->kind == VK_INTER; }

/* A chain of at least three layers whose values have the same names (up
 * to the layer number: the first run of digits) and shapes, numbered
 * without a hole: the estimates then price one and two of them.  The two
 * proxies must load; else every estimate prices the whole model. */
static void find_layers(Search *s)
{
	const Graph *b = &s->base;
	long lo = -1, hi = -1;
	size_t at, len;
	for (int v = 0; v < b->values.n; v++) {
		long k = named(&b->values.a[v]) ? layer_of(b->values.a[v].name, &at, &len) : -1;
		if (k >= 0)
			lo = lo < 0 || k < lo ? k : lo, hi = k > hi ? k : hi;
	}
	if (lo < 0 || hi - lo + 1 < 3 || hi - lo + 1 > b->values.n)
		return;
	long n = hi - lo + 1;
	Sig *sig = xcalloc((size_t)n, sizeof *sig);
	for (int v = 0; v < b->values.n; v++) {
		long k = named(&b->values.a[v]) ? layer_of(b->values.a[v].name, &at, &len) : -1;
		if (k >= 0)
			sig[k - lo].sum += value_hash(&b->values.a[v], at, len), sig[k - lo].count++;
	}
	bool same = true;
	for (long k = 1; k < n; k++)
		same &= sig[k].sum == sig[0].sum && sig[k].count == sig[0].count;
	free(sig);
	if (!same)
		return;
	LayerRange r = {lo, n};
	bool ok = true;
	s->pbase = n >= DEEP ? 2 : 1;
	for (int k = 0; k < NPROXY && ok; k++) {
		char *text = proxy_text(s->doc.root, &r, k + s->pbase);
		Diag d;
		diag_init(&d);
		d.quiet = true;
		ok = ydoc_parse_string(&s->proxy[k], text, s->file, &d) == 0;
		if (ok) {
			Graph g;
			ok = model_load_string(&g, text, s->file, &d) == 0;
			graph_free(&g);
		}
		free(text);
	}
	if (ok)
		s->layers = r;
}

/* The model's width, the size tensor-parallel seeds leave whole: the dim
 * its layer_norms normalise (d_model, the residual stream's), else the
 * last dim of its first float input (the features entering a plain MLP,
 * whose hidden dim is then split, Megatron's way, in both weights), else
 * the most common size of a param's dim (the smaller on a tie). */
static int64_t width_of(const Search *s)
{
	const Graph *b = &s->base;
	for (int i = 0; i < b->ops.n; i++)
		if (b->ops.a[i].kind == OP_LAYER_NORM) {
			const Shape *sh = &b->values.a[b->ops.a[i].out].shape;
			int axis = b->ops.a[i].attr->axes[0];
			axis += axis < 0 ? sh->rank : 0;
			if (axis >= 0 && axis < sh->rank)
				return sh->dim[axis];
		}
	for (int v = 0; v < b->values.n; v++) {
		const Value *x = &b->values.a[v];
		if (x->kind == VK_INPUT && x->shape.rank >= 2 && dtype_is_float(x->dtype))
			return x->shape.dim[x->shape.rank - 1];
	}
	int64_t best = 0;
	int most = 0;
	for (int i = 0; i < s->nleaf; i++) {
		const Value *v = &s->base.values.a[s->leaf[i].value];
		for (int d = 0; v->kind == VK_PARAM && d < v->shape.rank; d++) {
			int64_t x = v->shape.dim[d];
			int n = 0;
			for (int j = 0; j < s->nleaf; j++) {
				const Value *u = &s->base.values.a[s->leaf[j].value];
				for (int e = 0; u->kind == VK_PARAM && e < u->shape.rank; e++)
					n += u->shape.dim[e] == x;
			}
			if (n > most || (n == most && x < best))
				best = x, most = n;
		}
		if (i > 64 && s->layers.n) /* the first layers hold every size a layer has */
			break;
	}
	return best;
}

/* Model text loaded into g (free it whatever the result), on mesh (NULL:
 * its own): the model's axes as written with other sizes, set as
 * graph_set_mesh sets them, or, where the annotations cut an axis into
 * pieces (sub-axes), loaded on it as spmd partition --mesh loads, to be
 * cut alike.  0, or -1 after errors. */
static int load_on_mesh(Graph *g, const char *text, const char *file, const char *mesh, Diag *d)
{
	if (model_load_string(g, text, file, d) != 0)
		return -1;
	if (!mesh)
		return 0;
	if (!mesh_has_pieces(&g->mesh))
		return graph_set_mesh(g, mesh, d);
	if (graph_check_mesh(g, mesh, d) != 0)
		return -1;
	graph_free(g);
	LoadOpts lo = {mesh, NULL};
	return model_load_string_opts(g, text, file, &lo, d);
}

static int setup(Search *s, Diag *d)
{
	const AutoOpts *o = s->o;
	if (ydoc_parse_string(&s->doc, s->text, s->file, d) != 0 || load_on_mesh(&s->base, s->text, s->file, o->mesh, d) != 0)
		return -1;
	const YNode *m = s->doc.root ? ynode_get(s->doc.root, "mesh") : NULL;
	s->mesh_long = m && m->kind == YN_MAP && ynode_get(m, "axes");
	const YNode *hw = s->mesh_long ? ynode_get(m, "hardware") : NULL;
	s->hardware = o->hardware ? o->hardware : hw && hw->kind == YN_SCALAR ? hw->str : NULL;
	s->mesh = s->base.mesh;
	if (o->ndev > 0 && s->mesh.naxes == 0) { /* a model without a mesh: data and model axes */
		s->mesh.naxes = 2, s->mesh.name[0] = "data", s->mesh.name[1] = "model";
		s->mesh.size[0] = s->mesh.size[1] = 1;
	}
	if (s->mesh.naxes == 0) {
		diag_error(d, (Pos){s->file, 1, 1}, "expected a model with a mesh, or --mesh or --devices, found none");
		return -1;
	}
	make_groups(s);
	make_pairs(s);
	if (!o->whole)
		find_layers(s);
	autopipe_init(&s->pipe, &s->base, s->layers.n);
	s->width = width_of(s);
	find_split_sizes(s);
	return 0;
}

/* The bound lower on the answer r's step, and the gap to it (lower < 0:
 * no bound, a pipelined model's). */
static void set_bound(AutoResult *r, double lower)
{
	if (lower < 0) { /* the compute bound is of the overlapped step, not of a schedule: none */
		r->bound_holds = r->proven = false, r->bound = r->gap = r->gap_compute = r->gap_exposed = 0;
		return;
	}
	/* the estimate's four simulated steps can overlap independent steps
	 * (a program without carried params) more than a long run would:
	 * then it may fall below the compute stream's busy time */
	r->bound_holds = lower <= r->step_s * (1 + 1e-12);
	r->bound = fmin(lower, r->step_s);
	r->gap = r->step_s > 0 ? (r->step_s - r->bound) / r->step_s : 0;
	r->proven = r->bound_holds && r->gap <= 1e-12;
	/* the gap in two: the compute stream's busy time above the bound, and
	 * the time it waits (collectives and latency not hidden) */
	double busy = fmin(fmax(r->compute_s, r->bound), r->step_s);
	r->gap_compute = r->step_s > 0 ? (busy - r->bound) / r->step_s : 0;
	r->gap_exposed = r->gap - r->gap_compute;
}

static void fill_result(Search *s, AutoResult *r)
{
	r->found = s->found, r->cut = s->cut, r->solves = s->solves;
	r->selective = s->found && s->best_recompute == RECOMPUTE_SELECTIVE;
	r->solver_failed = s->solver_failed;
	r->smallest_peak = s->smallest, r->smallest_recompute = s->smallest_recompute;
	r->layers = s->layers.n;
	r->proxy_layers = s->pbase;
	r->proxies = !priced_whole(s);
	if (!s->found)
		return;
	r->text = s->best_text, s->best_text = NULL;
	r->mesh_naxes = 0;
	for (int a = 0, n; a < s->best_mesh.naxes; a += n) { /* as written: an axis cut into pieces (sub-axes) whole */
		char name[256];
		n = mesh_written_axis(&s->best_mesh, a, name, sizeof name, &r->mesh_size[r->mesh_naxes]);
		r->mesh_name[r->mesh_naxes++] = arena_strdup(&r->arena, name);
	}
	r->gather_before_use = s->best_gather != GATHER_AFTER;
	r->prefetch = r->gather_before_use ? gather_depth(s, s->best_gather) : 0;
	r->step_s = s->best_t, r->serial_s = s->best_serial, r->peak = s->best_peak;
	r->compute_s = s->best_busy;
	set_bound(r, s->pipe.axis < 0 ? s->lower : -1);
	r->programs_optimal = s->proven && !s->cut;
	r->enumerated = s->enumerated && !s->cut;
	if (s->pipe.axis >= 0)
		autopipe_result(&s->pipe, &s->best_mesh, &s->best_pipe, &r->pipe);
}

/* Describe choice k of group g. */
static void choice_text(const Search *s, const Group *g, int k, char *buf, size_t n)
{
	const Choice *c = &g->ch.a[k];
	if (c->follow) {
		snprintf(buf, n, "follow");
		return;
	}
	spec_format(&c->spec, &s->mesh, buf, n);
	size_t l = strlen(buf);
	if (c->wus)
		snprintf(buf + l, n - l, " wus %s", c->wus == WUS_ON + 1 ? "on" : "off");
	l = strlen(buf);
	if (s->own && s->own[g - s->group] && k == s->best_pick[g - s->group])
		snprintf(buf + l, n - l, s->own[g - s->group] == AG_AFTER_UPDATE ? ", gathered after update" : ", gathered at first use");
}

/* The runner-up k of kind g was estimated faster than the answer, which
 * is priced exactly: estimates err by some percent, so price it exactly
 * too, as the answer was, and give the exact differences. */
static void runner_exact(Search *s, int g, int k, AutoGroup *ag)
{
	int *pick = moved(s, s->best_pick, g, k, -1, 0);
	char *text = plan_of(s, s->doc.root, pick, s->gather);
	Eval e = {.pick = pick};
	if ((e.ok = price_text(s, text, &e))) {
		s->exact++;
		ag->runner_ds = e.t - s->best_t, ag->runner_dbytes = (double)(e.peak - s->best_peak);
		ag->runner_exact = true, ag->runner_fits = fits(s, &e);
	}
	free(text);
	free(pick);
}

/* Per layer kind: the choice made and, with explain, the best other one
 * with the rest of the plan kept (priced on the best plan's mesh): the
 * fastest that fits, else the fastest. */
static void explain(Search *s, AutoResult *r)
{
	r->ngroups = s->ngroup;
	r->group = xcalloc((size_t)s->ngroup + 1, sizeof *r->group);
	if (!s->found)
		return;
	at_best(s);
	clear_cache(s);
	const Eval *best = price(s, s->best_pick);
	for (int g = 0; g < s->ngroup && s->o->explain && best; g++) /* estimated together first */
		for (int k = 0; k < s->group[g].ch.n; k++)
			if (k != s->best_pick[g])
				want_at(s, s->best_pick, g, k, -1, 0, NPROXY);
	run_batch(s);
	/* the runner-ups' estimates against the answer's, or where that is not
	 * steady (a prefetch as deep as the proxies: their peaks grow unevenly),
	 * against its exact price */
	double base_t = best && best->ok ? best->t : s->best_t;
	int64_t base_peak = best && best->ok ? best->peak : s->best_peak;
	for (int g = 0; g < s->ngroup; g++) {
		AutoGroup *ag = &r->group[g];
		const Group *G = &s->group[g];
		ag->name = arena_strdup(&r->arena, G->label);
		ag->fixed = G->fixed;
		for (int i = 0; i < s->nleaf; i++)
			ag->members += s->leaf[i].group == g;
		choice_text(s, G, s->best_pick[g], ag->chosen, sizeof ag->chosen);
		int run = -1;
		bool rfit = false;
		double rt = INFINITY;
		int64_t rp = 0;
		for (int k = 0; s->o->explain && best && k < G->ch.n; k++) {
			const Eval *e = k == s->best_pick[g] ? NULL : price_at(s, s->best_pick, g, k, -1, 0, false);
			if (e && e->ok && (fits(s, e) > rfit || (fits(s, e) == rfit && e->t < rt)))
				run = k, rt = e->t, rp = e->peak, rfit = fits(s, e);
		}
		if (run >= 0) {
			choice_text(s, G, run, ag->runner, sizeof ag->runner);
			ag->runner_ds = rt - base_t, ag->runner_dbytes = (double)(rp - base_peak), ag->runner_fits = rfit;
			if (rfit && rt < base_t)
				runner_exact(s, g, run, ag);
		}
	}
}

/* No mesh was tried: every one has more stages than the layers fill (a
 * pipelined model whose stage axis --mesh or --devices makes too long),
 * or --devices is no multiple of the pieces of the axes the model cut. */
static int no_stages(const Search *s, Diag *d)
{
	if (s->pipe.axis < 0) { /* no mesh shape at all: the pieces of a cut axis keep their sizes */
		diag_usage(d, "expected --devices a multiple of %d (the axes the model's sub-axis annotations cut keep "
		           "their sizes), found %d", mesh_pieces_size(&s->mesh), s->o->ndev);
		return -1;
	}
	const Pipeline *pl = s->base.pipeline;
	int most = s->pipe.limit / (pl && pl->virtual_stages > 0 ? pl->virtual_stages : 1);
	const char *what = s->layers.n ? "repeated layers" : "ops";
	if (s->o->mesh)
		diag_usage(d, "expected a mesh with at most %d stages on the pipeline's axis '%s' (the model's %d %s fill %d), found %s=%d",
		           most, s->mesh.name[s->pipe.axis], s->pipe.limit, what, most, s->mesh.name[s->pipe.axis],
		           s->mesh.size[s->pipe.axis]);
	else
		diag_usage(d, "expected --devices at most %d: the pipeline's axis '%s' is the mesh's only axis and the model's %d %s fill %d stages, found %d",
		           most, s->mesh.name[s->pipe.axis], s->pipe.limit, what, most, s->o->ndev);
	return -1;
}

/* One search, its plans written with the train: section's recompute:
 * true where train_recompute; *can_recompute: whether a search with it
 * could differ (a training step, not pipelined, whose section the search
 * may change and which does not recompute already). */
static int search(const char *text, const char *file, const AutoOpts *o, int train_recompute, double start,
                  AutoResult *r, bool *can_recompute, double *lower, Diag *d)
{
	memset(r, 0, sizeof *r);
	arena_init(&r->arena);
	r->smallest_peak = r->memory_floor = r->plain_floor = -1;
	Search s = {.text = text, .file = file, .o = o, .start = start, .proven = true, .smallest = -1,
	            .smallest_est = -1, .jobs = o->jobs > 0 ? o->jobs : cpu_count(), .plans = reshard_cache_new(),
	            .train_recompute = train_recompute};
	s.firsts = xcalloc(1, sizeof *s.firsts);
	pthread_mutex_init(&s.firsts->lock, NULL);
	graph_init(&s.base);
	int rc = setup(&s, d);
	*can_recompute = rc == 0 && s.base.train && !s.base.train->recompute && !s.base.pipeline && !o->keep_train;
	*lower = 0;
	if (rc == 0) { /* every mesh shape searched has the same devices */
		r->ndev = o->ndev > 0 ? o->ndev : s.mesh.ndev;
		step_bounds(&s, s.train_recompute, r->ndev, lower, &r->memory_floor);
		/* no plan of this step fits, but one recomputing (more of) the forward might: search those instead */
		if (*can_recompute && train_recompute != RECOMPUTE_ALL && (double)r->memory_floor > o->budget) {
			r->recompute_forced = true;
			rc = 1;
		}
	}
	s.sel_floor = -1;
	if (rc == 0 && *can_recompute && !train_recompute) {
		double sel_lower;
		step_bounds(&s, RECOMPUTE_SELECTIVE, r->ndev, &sel_lower, &s.sel_floor);
		if (s.sel_floor >= r->memory_floor)
			s.sel_floor = -1; /* nothing the backward reads is made again */
	}
	if (rc == 0) {
		s.best_pick = xcalloc((size_t)s.ngroup + 1, sizeof(int));
		if (o->ndev > 0)
			try_meshes(&s, o->ndev, 0);
		else
			try_modes(&s);
		if (s.spaces.n == 0)
			rc = no_stages(&s, d);
	}
	if (rc == 0) {
		if (o->progress)
			progress_begin(&s.bar, "autoshard", 0, "plans priced");
		s.lower = *lower;
		search_spaces(&s);
		settle_all(&s);
		keep_whole_other(&s);
		keep_whole(&s);
		hold_weights(&s);
		if (!search_selective(&s)) {
			polish(&s);
			tune_prefetch(&s);
			try_selective(&s, *lower);
		}
		if (s.sel_needed) /* the floors of both steps, as autoshard() reports them */
			r->recompute_needed = true, r->plain_floor = r->memory_floor, r->memory_floor = s.sel_floor;
		s.lower = s.found && s.pipe.axis < 0 ? *lower : 0;
		fill_result(&s, r);
		explain(&s, r);
		r->evaluations = s.evaluations, r->exact = s.exact;
		if (o->progress)
			progress_end(&s.bar);
	}
	if (s.cap)
		clear_cache(&s);
	free(s.cache);
	reshard_cache_free(s.plans);
	vec_free(&s.batch);
	top_clear(&s.cand);
	top_clear(&s.seed);
	free(s.smallest_cand.pick);
	free(s.smallest_seed.pick);
	for (int i = 0; i < s.settled.n; i++)
		free(s.settled.a[i].pick);
	vec_free(&s.settled);
	for (int i = 0; i < s.spaces.n; i++)
		free(s.spaces.a[i].seed), free(s.spaces.a[i].other);
	vec_free(&s.spaces);
	for (int k = 0; k < NPROXY; k++)
		ydoc_free(&s.proxy[k]);
	free_templates(&s);
	pthread_mutex_destroy(&s.firsts->lock);
	free(s.firsts);
	for (int g = 0; g < s.ngroup; g++)
		vec_free(&s.group[g].ch);
	free(s.group), free(s.leaf), free(s.adj), free(s.best_pick), free(s.best_text), free(s.own);
	graph_free(&s.base);
	ydoc_free(&s.doc);
	return rc > 0 ? 0 : rc; /* 1: skipped */
}

/* The model as written (its own annotations, on its mesh or o->mesh)
 * partitioned, its errors to d: why no plan could be priced, when its
 * annotations are what cannot be (a pending sum annotated on a max, say).
 * -1 on an error; 0 too for a model with no mesh (--devices gives it one). */
static int as_written(const char *text, const char *file, const AutoOpts *o, Diag *d)
{
	Graph g, prog;
	graph_init(&prog);
	LoadOpts lo = {o->mesh, NULL}; /* loaded on it as spmd partition --mesh loads: a pipeline's checked on it */
	int rc = model_load_string_opts(&g, text, file, &lo, d);
	if (rc == 0 && g.mesh.naxes > 0) {
		if (g.train)
			rc = train_build(&g, d);
		if (rc == 0 && !g.pipeline) {
			rc = pipeline_partition(&g, o->pass_hw, &prog, NULL, NULL, d);
		} else if (rc == 0) { /* stages: auto are cut by the commands' cost model: the annotations propagated */
			Propagation p;
			rc = pipeline_propagate(&g, o->pass_hw, &p, NULL, d);
			propagation_free(&p);
		}
	}
	graph_free(&prog), graph_free(&g);
	return rc == 0 ? 0 : -1;
}

/* r becomes search result again, counting the plans and programs of both. */
static void take_over(AutoResult *r, AutoResult *again)
{
	again->evaluations += r->evaluations, again->exact += r->exact, again->solves += r->solves;
	again->solver_failed += r->solver_failed;
	autoshard_free(r);
	*r = *again;
}

/* When no plan fits, the search again with the backward making again the
 * forward's results cheap for their size (train: recompute: selective),
 * and when none fits with that either, with it recomputing the whole
 * forward (recompute: true; train/train.c): less memory for more compute.
 * A step whose memory floor proves that none of its plans fits is not
 * searched; the bound is the least compute bound of the steps searched
 * or not ruled out so. */
int autoshard(const char *text, const char *file, const AutoOpts *o, AutoResult *r, Diag *d)
{
	double start = now_seconds(), lower, lower_m;
	bool can;
	int rc = search(text, file, o, RECOMPUTE_OFF, start, r, &can, &lower, d);
	AutoOpts whole;
	if (rc == 0 && !r->found && r->smallest_peak < 0 && !r->cut) { /* no plan could be priced */
		if (as_written(text, file, o, d) != 0) { /* the model's own annotations cannot be: said */
			autoshard_free(r);
			return -1;
		}
		if (r->proxies) { /* the proxies estimated none (no layer adds about the same): each plan on the whole */
			whole = *o, whole.whole = true, o = &whole;
			AutoResult again;
			rc = search(text, file, o, RECOMPUTE_OFF, start, &again, &can, &lower, d);
			take_over(r, &again);
			r->proxies_failed = true;
		}
	}
	if (rc != 0 || r->found || !can || r->cut)
		return rc;
	bool forced = r->recompute_forced;
	int64_t floor = r->memory_floor;
	/* the bound: the least compute bound of the steps whose floor admits a plan */
	double bound = forced ? INFINITY : lower;
	static const int modes[] = {RECOMPUTE_SELECTIVE, RECOMPUTE_ALL};
	for (int i = 0; i < 2; i++) {
		AutoResult again;
		rc = search(text, file, o, modes[i], start, &again, &can, &lower_m, d);
		if (rc == 0 && !again.recompute_forced)
			bound = fmin(bound, lower_m);
		if (rc == 0 && again.found) {
			take_over(r, &again);
			r->recompute = modes[i] == RECOMPUTE_ALL, r->selective = modes[i] == RECOMPUTE_SELECTIVE;
			r->recompute_needed = true;
			set_bound(r, bound);
			break;
		}
		if (rc == 0 && again.smallest_peak >= 0 && (r->smallest_peak < 0 || again.smallest_peak < r->smallest_peak))
			r->smallest_peak = again.smallest_peak, r->smallest_recompute = true;
		r->evaluations += again.evaluations, r->exact += again.exact, r->solves += again.solves;
		r->cut |= again.cut, r->recompute_tried |= rc == 0;
		if (rc == 0 && again.memory_floor >= 0 && again.memory_floor < r->memory_floor)
			r->memory_floor = again.memory_floor; /* the floor of every plan of these steps */
		autoshard_free(&again);
		if (rc != 0 || r->cut)
			break;
	}
	r->recompute_forced = forced;
	r->plain_floor = floor;
	return rc;
}

void autoshard_free(AutoResult *r)
{
	free(r->text);
	free(r->group);
	arena_free(&r->arena);
	memset(r, 0, sizeof *r);
}
