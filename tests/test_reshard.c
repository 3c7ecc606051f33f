/* test_reshard.c: the reshard planner and the thread backend — every pair of specs run and checked, pinned cheapest plans, collective semantics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include <jansson.h>
#include <unistd.h>

#include "../runtime/threads.h"
#include "../cli/commands.h"
#include "../base/yaml.h"

static const char *const axis_names[] = {"data", "model", "pipe", "seq"};

static void mesh_make(Mesh *m, Arena *a, int n, const int *size, const int *devices)
{
	memset(m, 0, sizeof *m);
	m->naxes = n;
	for (int i = 0; i < n; i++) {
		m->name[i] = axis_names[i];
		m->size[i] = size[i];
	}
	assert_int_equal(mesh_finish(m, a, devices), 0);
}

static void spec_of(Spec *s, const char *text, const Mesh *m, int rank)
{
	YDoc doc;
	Diag d;
	diag_init(&d);
	assert_int_equal(ydoc_parse_string(&doc, text, "<spec>", &d), 0);
	if (spec_parse(s, doc.root, m, rank, &d) != 0)
		fail_msg("%s: %s", text, d.last);
	ydoc_free(&doc);
}

/* ---- plan invariants and running ---- */

static void print_plan(const ReshardPlan *p, const Spec *a, const Spec *b, const Mesh *m)
{
	char sa[256], sb[256], st[256];
	spec_format(a, m, sa, sizeof sa);
	spec_format(b, m, sb, sizeof sb);
	fprintf(stderr, "plan %s -> %s (dims", sa, sb);
	for (int d = 0; d < p->rank; d++)
		fprintf(stderr, " %lld", (long long)p->dims[d]);
	fprintf(stderr, "):\n");
	for (int i = 0; i < p->nsteps; i++) {
		reshard_step_format(&p->steps[i], m, st, sizeof st);
		fprintf(stderr, "  %s  sent %lld%s\n", st, (long long)p->steps[i].bytes_sent_per_device,
		        p->steps[i].fallback ? " (fallback)" : "");
	}
}

/* Steps chain from the source layout to the target's; totals add up. */
static void check_chain(const ReshardPlan *p)
{
	const ReshardLayout *cur = &p->from;
	int64_t sent = 0, handed = 0;
	for (int i = 0; i < p->nsteps; i++) {
		const ReshardStep *s = &p->steps[i];
		assert_memory_equal(&s->before, cur, sizeof *cur);
		assert_true(s->kind == RS_SLICE ? s->bytes_per_device == 0 : s->bytes_per_device > 0 || p->ndev == 1);
		sent += s->bytes_sent_per_device;
		handed += s->bytes_per_device;
		cur = &s->after;
	}
	if (!(p->nsteps && p->steps[p->nsteps - 1].to_target_mesh) && p->mesh == p->mesh_to)
		assert_memory_equal(cur, &p->to, sizeof *cur);
	assert_int_equal(sent, p->bytes_sent_per_device);
	assert_int_equal(handed, p->bytes_per_device);
}

static int nfallback;

/* ---- enumerating specs ---- */

typedef VEC(Spec) SpecVec;

/* Every valid spec: each axis unused, partial, or inserted at any position of any dim. */
static void enum_specs(Spec *s, const Mesh *m, int axis, bool partial, SpecVec *out)
{
	if (axis == m->naxes) {
		vec_push(out, *s);
		return;
	}
	enum_specs(s, m, axis + 1, partial, out);
	if (partial) {
		s->partial |= (uint8_t)(1u << axis);
		enum_specs(s, m, axis + 1, partial, out);
		s->partial &= (uint8_t)~(1u << axis);
	}
	for (int d = 0; d < s->rank; d++)
		for (int pos = 0; pos <= s->nax[d]; pos++) {
			Spec t = *s;
			memmove(&t.ax[d][pos + 1], &t.ax[d][pos], (size_t)(t.nax[d] - pos));
			t.ax[d][pos] = (uint8_t)axis;
			t.nax[d]++;
			enum_specs(&t, m, axis + 1, partial, out);
		}
}

/* Plans with their source and target specs, to run in one go. */
typedef struct {
	VEC(ReshardPlan) plans;
	SpecVec from, to;
} Batch;

static void batch_add(Batch *b, const ReshardPlan *p, const Spec *from, const Spec *to)
{
	vec_push(&b->plans, *p);
	vec_push(&b->from, *from);
	vec_push(&b->to, *to);
}

/* Run every plan of b on the thread backend, check each shard, free b;
 * returns the number of plans. */
static int batch_run(Batch *b, const Mesh *m, DType dt)
{
	char msg[256];
	int bad, n = b->plans.n;
	if (threads_check_plans(n, b->plans.a, b->from.a, b->to.a, dt, &bad, msg, sizeof msg) != 0) {
		if (bad >= 0)
			print_plan(&b->plans.a[bad], &b->from.a[bad], &b->to.a[bad], m);
		fail_msg("%s", msg);
	}
	for (int i = 0; i < n; i++)
		reshard_plan_free(&b->plans.a[i]);
	vec_free(&b->plans);
	vec_free(&b->from);
	vec_free(&b->to);
	return n;
}

/* Every pair (source with any partial axes, target keeping a subset of
 * them), every `stride`-th one when stride > 1: planned, then all run in one
 * go on the thread backend and checked.  Returns the number of pairs. */
static int all_pairs(const Mesh *m, const Mesh *mb, const int64_t *dims, int rank, int stride, DType dt)
{
	SpecVec specs = {0};
	Batch batch = {0};
	Spec s = {.rank = (uint8_t)rank};
	enum_specs(&s, m, 0, true, &specs);
	for (int i = 0, k = 0; i < specs.n; i++)
		for (int j = 0; j < specs.n; j++) {
			const Spec *a = &specs.a[i], *b = &specs.a[j];
			if ((b->partial & ~a->partial) || k++ % stride)
				continue;
			ReshardPlan p;
			Diag d;
			diag_init(&d);
			assert_int_equal(reshard_plan_meshes(&p, a, m, b, mb, dims, 4, &d), 0);
			check_chain(&p);
			nfallback += p.fallback;
			batch_add(&batch, &p, a, b);
		}
	vec_free(&specs);
	return batch_run(&batch, m, dt);
}

static void test_all_pairs_small(void **state)
{
	(void)state;
	static const int64_t shapes[][2] = {{8, 16}, {6, 10}, {5, 3}, {1, 7}};
	Arena a;
	Mesh m2, m22, m24, m22x;
	arena_init(&a);
	mesh_make(&m2, &a, 1, (int[]){2}, NULL);
	mesh_make(&m22, &a, 2, (int[]){2, 2}, NULL);
	mesh_make(&m24, &a, 2, (int[]){2, 4}, NULL);
	mesh_make(&m22x, &a, 2, (int[]){2, 2}, (int[]){3, 1, 0, 2});
	int n = 0;
	for (int i = 0; i < 4; i++) {
		int before = nfallback;
		n += all_pairs(&m2, &m2, shapes[i], 2, 1, DT_F32);
		n += all_pairs(&m22, &m22, shapes[i], 2, 1, DT_F32);
		n += all_pairs(&m24, &m24, shapes[i], 2, 1, i == 2 ? DT_I32 : DT_F32);
		n += all_pairs(&m22x, &m22x, shapes[i], 2, 1, DT_F32);
		if (i == 0) /* even shapes never need a fallback gather */
			assert_int_equal(nfallback, before);
	}
	/* odd sizes and a size-1 axis */
	Mesh m3, m21, m32;
	mesh_make(&m3, &a, 1, (int[]){3}, NULL);
	mesh_make(&m21, &a, 2, (int[]){2, 1}, NULL);
	mesh_make(&m32, &a, 2, (int[]){3, 2}, (int[]){5, 0, 3, 2, 4, 1});
	n += all_pairs(&m3, &m3, (int64_t[]){7, 4}, 2, 1, DT_F32);
	n += all_pairs(&m21, &m21, (int64_t[]){5, 3}, 2, 1, DT_F32);
	n += all_pairs(&m32, &m32, (int64_t[]){6, 12}, 2, 1, DT_F32);
	n += all_pairs(&m32, &m32, (int64_t[]){7, 5}, 2, 1, DT_F32);
	/* rank 1 and 3 on 2x2, and a target on another device order */
	n += all_pairs(&m22, &m22, (int64_t[]){7}, 1, 1, DT_F32);
	n += all_pairs(&m22, &m22, (int64_t[]){4, 3, 2}, 3, 3, DT_F32);
	n += all_pairs(&m22, &m22x, (int64_t[]){6, 5}, 2, 1, DT_F32);
	print_message("%d pairs run, %d plans with a fallback gather\n", n, nfallback);
	arena_free(&a);
}

static void test_all_pairs_2x2x2(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	arena_init(&a);
	mesh_make(&m, &a, 3, (int[]){2, 2, 2}, NULL);
	int before = nfallback;
	int n = all_pairs(&m, &m, (int64_t[]){8, 16}, 2, 1, DT_F32);
	assert_int_equal(nfallback, before);
	n += all_pairs(&m, &m, (int64_t[]){6, 5}, 2, 9, DT_F32);
	n += all_pairs(&m, &m, (int64_t[]){1, 7}, 2, 9, DT_F32);
	print_message("2x2x2: %d sampled pairs run\n", n);
	arena_free(&a);
}

/* ---- moving a split between mesh axes: no plan beats the planner's ---- */

static int64_t plan_cost(const Spec *a, const Mesh *ma, const Spec *b, const Mesh *mb, const int64_t *dims)
{
	ReshardPlan p;
	Diag d;
	diag_init(&d);
	assert_int_equal(reshard_plan_meshes(&p, a, ma, b, mb, dims, 4, &d), 0);
	int64_t c = p.bytes_sent_per_device;
	reshard_plan_free(&p);
	return c;
}

static bool replicated(const Spec *s, const Mesh *m)
{
	for (int d = 0; d < s->rank; d++)
		for (int i = 0; i < s->nax[d]; i++)
			if (m->size[s->ax[d][i]] > 1)
				return false;
	return true;
}

static void print_via(const Spec *a, const Mesh *m, const Spec *v, const Spec *b, const Mesh *mb, const int64_t *dims)
{
	ReshardPlan p;
	Diag d;
	diag_init(&d);
	assert_int_equal(reshard_plan_meshes(&p, a, m, v, m, dims, 4, &d), 0);
	print_plan(&p, a, v, m);
	reshard_plan_free(&p);
	assert_int_equal(reshard_plan_meshes(&p, v, m, b, mb, dims, 4, &d), 0);
	print_plan(&p, v, b, m);
	reshard_plan_free(&p);
}

/* Every move of dim 0's split between two sets of axes (dim 1 whole) on mesh
 * m, target on mb: the planner's plan runs right, and no two-step plan
 * through any layout (any axes on either dim) moves fewer bytes — but for
 * another device order, not through the replicated layout: a plan switches
 * device order only at its start or with a final permute, while two plans
 * can switch in the middle, where the data is the same in both orders.  Even
 * sizes never need a fallback gather.  `via`: compare with the two-step
 * plans (the bulk of the time).  Returns the number of plans run. */
static int cross_axes(const Mesh *m, const Mesh *mb, const int64_t *dims, bool via)
{
	SpecVec all = {0}, moves = {0};
	Batch batch = {0};
	Spec s = {.rank = 2};
	enum_specs(&s, m, 0, false, &all);
	for (int i = 0; i < all.n; i++)
		if (all.a[i].nax[1] == 0)
			vec_push(&moves, all.a[i]);
	int64_t *via_a = xmalloc(sizeof *via_a * (size_t)(moves.n * all.n));
	int64_t *via_b = xmalloc(sizeof *via_b * (size_t)(moves.n * all.n));
	for (int i = 0; i < moves.n; i++)
		for (int k = 0; k < all.n && via; k++) {
			via_a[i * all.n + k] = plan_cost(&moves.a[i], m, &all.a[k], m, dims);
			via_b[i * all.n + k] = plan_cost(&all.a[k], m, &moves.a[i], mb, dims);
		}
	bool even = dims[0] % m->ndev == 0;
	for (int i = 0; i < moves.n; i++)
		for (int j = 0; j < moves.n; j++) {
			const Spec *a = &moves.a[i], *b = &moves.a[j];
			ReshardPlan p;
			Diag d;
			diag_init(&d);
			assert_int_equal(reshard_plan_meshes(&p, a, m, b, mb, dims, 4, &d), 0);
			check_chain(&p);
			for (int k = 0; k < all.n && via; k++)
				if (p.bytes_sent_per_device > via_a[i * all.n + k] + via_b[j * all.n + k] &&
				    (m == mb || !replicated(&all.a[k], m))) {
					print_plan(&p, a, b, m);
					print_via(a, m, &all.a[k], b, mb, dims);
					fail_msg("a plan through %d moves %lld B, fewer", k,
					         (long long)(via_a[i * all.n + k] + via_b[j * all.n + k]));
				}
			if (even && p.fallback) {
				print_plan(&p, a, b, m);
				fail_msg("a fallback gather on an even shape");
			}
			batch_add(&batch, &p, a, b);
		}
	free(via_a);
	free(via_b);
	vec_free(&moves);
	vec_free(&all);
	return batch_run(&batch, m, DT_F32);
}

/* Every mesh of 1 to 3 axes of sizes 2-4 (sizes non-increasing: the specs
 * try every axis order anyway) and one of each rank with a size-1 axis
 * (1, 2x1, 3x2x1), the target in the same and in the reversed
 * device order, an even and an uneven dim.  For time, on 3 axes the
 * two-step bound is checked for the uneven dim on meshes of up to 24
 * devices only; every plan still runs. */
static void test_cross_axes(void **state)
{
	(void)state;
	int n = 0, sizes[3];
	for (int naxes = 1; naxes <= 3; naxes++)
		for (int code = 0; code < 64; code++) {
			bool ok = true;
			for (int i = 0, c = code; i < naxes; i++, c /= 4) {
				sizes[i] = c % 4 + 1;
				ok &= i == 0 || sizes[i] <= sizes[i - 1];
			}
			/* a size-1 axis drops out: one mesh of each rank has one */
			int ones = 0;
			for (int i = 0; i < naxes; i++)
				ones += sizes[i] == 1;
			ok &= ones == 0 || (code == (naxes == 3 ? 2 + 4 * 1 : naxes == 2 ? 1 : 0));
			if (!ok || code >= 1 << (2 * naxes))
				continue;
			Arena a;
			Mesh m, mr;
			arena_init(&a);
			mesh_make(&m, &a, naxes, sizes, NULL);
			int rev[64];
			for (int i = 0; i < m.ndev; i++)
				rev[i] = m.ndev - 1 - i;
			mesh_make(&mr, &a, naxes, sizes, rev);
			n += cross_axes(&m, &m, (int64_t[]){2 * m.ndev, 3}, naxes < 3);
			n += cross_axes(&m, &m, (int64_t[]){m.ndev + 1, 2}, naxes < 3 || m.ndev <= 24);
			n += cross_axes(&m, &mr, (int64_t[]){m.ndev, 2}, naxes < 3);
			arena_free(&a);
		}
	print_message("cross-axes: %d plans run\n", n);
}

/* ---- pinned cheapest plans (the moves of docs/sharding.md, "The reshard planner") ---- */

typedef struct {
	const char *from, *to;
	int nsteps;            /* expected number of steps */
	ReshardKind kinds[3];
	const char *axes[3];   /* names of each step's axes, comma-separated */
} Pin;

static void axes_text(const ReshardStep *s, const Mesh *m, char *buf, size_t n)
{
	size_t k = 0;
	buf[0] = 0;
	for (int i = 0; i < s->nax && k < n; i++)
		k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? "," : "", m->name[s->axes[i]]);
}

static void check_pin(const Pin *pin, const Mesh *m, const int64_t *dims, int rank)
{
	Spec a, b;
	ReshardPlan p;
	Diag d;
	char buf[64], msg[256];
	diag_init(&d);
	spec_of(&a, pin->from, m, rank);
	spec_of(&b, pin->to, m, rank);
	assert_int_equal(reshard_plan(&p, &a, &b, m, dims, 4, &d), 0);
	if (p.nsteps != pin->nsteps)
		print_plan(&p, &a, &b, m);
	assert_int_equal(p.nsteps, pin->nsteps);
	for (int i = 0; i < p.nsteps; i++) {
		assert_int_equal(p.steps[i].kind, pin->kinds[i]);
		axes_text(&p.steps[i], m, buf, sizeof buf);
		assert_string_equal(buf, pin->axes[i]);
	}
	assert_false(p.fallback);
	assert_int_equal(threads_check_plan(&p, &a, &b, DT_F32, msg, sizeof msg), 0);
	reshard_plan_free(&p);
}

static void test_pinned_plans(void **state)
{
	(void)state;
	static const Pin pins[] = {
		{"{dims: [null, null], partial: [data]}", "[null, null]", 1, {RS_ALL_REDUCE}, {"data"}},
		{"{dims: [null, null], partial: [data, model]}", "[null, null]", 1, {RS_ALL_REDUCE}, {"data,model"}},
		{"{dims: [null, null], partial: [model]}", "[model, null]", 1, {RS_REDUCE_SCATTER}, {"model"}},
		{"{dims: [null, null], partial: [model]}", "[null, model]", 1, {RS_REDUCE_SCATTER}, {"model"}},
		{"{dims: [null, null], partial: [data, model]}", "[[data, model], null]", 1, {RS_REDUCE_SCATTER},
		 {"data,model"}},
		{"{dims: [data, null], partial: [model]}", "[data, model]", 1, {RS_REDUCE_SCATTER}, {"model"}},
		{"{dims: [data, null], partial: [model]}", "{dims: [data, null], partial: [model]}", 0, {0}, {""}},
		{"[data, null]", "[null, null]", 1, {RS_ALL_GATHER}, {"data"}},
		{"[[data, model], null]", "[null, null]", 1, {RS_ALL_GATHER}, {"data,model"}},
		{"[[data, model], null]", "[data, null]", 1, {RS_ALL_GATHER}, {"model"}},
		{"[null, null]", "[data, model]", 1, {RS_SLICE}, {""}},
		{"[data, null]", "[[data, model], null]", 1, {RS_SLICE}, {""}},
		{"[data, null]", "[null, data]", 1, {RS_ALL_TO_ALL}, {"data"}},
		{"[data, model]", "[model, data]", 1, {RS_PERMUTE}, {"data,model"}},
		{"[[data, model], null]", "[[model, data], null]", 1, {RS_PERMUTE}, {"data,model"}},
		{"[[data, model], null]", "[data, model]", 1, {RS_ALL_TO_ALL}, {"model"}},
		{"[null, [data, model]]", "[[data, model], null]", 1, {RS_ALL_TO_ALL}, {"data,model"}},
	};
	Arena a;
	Mesh m22, m24;
	arena_init(&a);
	mesh_make(&m22, &a, 2, (int[]){2, 2}, NULL);
	mesh_make(&m24, &a, 2, (int[]){2, 4}, NULL);
	for (size_t i = 0; i < sizeof pins / sizeof pins[0]; i++) {
		check_pin(&pins[i], &m22, (int64_t[]){8, 16}, 2);
		if (strcmp(pins[i].to, "[model, data]") != 0) /* sizes differ on 2x4: not a permute */
			check_pin(&pins[i], &m24, (int64_t[]){8, 16}, 2);
	}
	arena_free(&a);
}

/* Byte counts of the single-step cases, from the ring formulas. */
static void test_pinned_bytes(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	arena_init(&a);
	mesh_make(&m, &a, 2, (int[]){2, 4}, NULL);
	static const struct {
		const char *from, *to;
		int64_t handed, sent;
	} cases[] = {
		/* local [8,16] f32 = 512 B; all_reduce over 4: 2*3/4 * 512 */
		{"{dims: [null, null], partial: [model]}", "[null, null]", 512, 768},
		/* reduce_scatter over 4: 3/4 * 512 */
		{"{dims: [null, null], partial: [model]}", "[model, null]", 512, 384},
		/* all_gather over 4 from [2,16] = 128 B: 3/4 of 512 */
		{"[model, null]", "[null, null]", 128, 384},
		/* all_to_all over 2 on [4,16] = 256 B: 1/2 of 256 */
		{"[data, null]", "[null, data]", 256, 128},
		{"[null, null]", "[model, data]", 0, 0},
		/* permute: the whole local buffer [4,4] = 64 B */
		{"[[data, model], null]", "[[model, data], null]", 64, 64},
		/* split moved from data (2) to model (4): slice to [[data, model]]
		 * ([1,16] = 64 B), permute 64 B, all_gather data 64 B — each
		 * device sends its [2,16] target block once, not the gathered
		 * dim (all_gather data sends 256 B) */
		{"[data, null]", "[model, null]", 128, 128},
		/* model (4) to data (2): permute 64 B, all_gather model sends 3 x 64 */
		{"[model, null]", "[data, null]", 128, 256},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		Spec sa, sb;
		ReshardPlan p;
		Diag d;
		diag_init(&d);
		spec_of(&sa, cases[i].from, &m, 2);
		spec_of(&sb, cases[i].to, &m, 2);
		assert_int_equal(reshard_plan(&p, &sa, &sb, &m, (int64_t[]){8, 16}, 4, &d), 0);
		assert_int_equal(p.bytes_per_device, cases[i].handed);
		assert_int_equal(p.bytes_sent_per_device, cases[i].sent);
		reshard_plan_free(&p);
	}
	arena_free(&a);
}

/* No all_gather when resharding [[data, model], null] -> [model, data]. */
static void test_no_full_gather(void **state)
{
	(void)state;
	Arena a;
	Mesh m22, m24;
	arena_init(&a);
	mesh_make(&m22, &a, 2, (int[]){2, 2}, NULL);
	mesh_make(&m24, &a, 2, (int[]){2, 4}, NULL);
	const Mesh *meshes[] = {&m22, &m24};
	for (int i = 0; i < 2; i++) {
		Spec sa, sb;
		ReshardPlan p;
		Diag d;
		char msg[256];
		diag_init(&d);
		spec_of(&sa, "[[data, model], null]", meshes[i], 2);
		spec_of(&sb, "[model, data]", meshes[i], 2);
		assert_int_equal(reshard_plan(&p, &sa, &sb, meshes[i], (int64_t[]){16, 16}, 4, &d), 0);
		for (int k = 0; k < p.nsteps; k++)
			assert_int_not_equal(p.steps[k].kind, RS_ALL_GATHER);
		/* cheaper than gathering dim 0 (3x the local buffer on 2x4) */
		assert_true(p.bytes_sent_per_device < 2 * 16 * 16 * 4 / meshes[i]->ndev);
		assert_int_equal(threads_check_plan(&p, &sa, &sb, DT_F32, msg, sizeof msg), 0);
		reshard_plan_free(&p);
	}
	arena_free(&a);
}

/* A different device order is one collective_permute. */
static void test_device_order(void **state)
{
	(void)state;
	Arena a;
	Mesh m, mr;
	Spec s;
	ReshardPlan p;
	Diag d;
	char msg[256];
	arena_init(&a);
	diag_init(&d);
	mesh_make(&m, &a, 2, (int[]){2, 2}, NULL);
	mesh_make(&mr, &a, 2, (int[]){2, 2}, (int[]){3, 2, 1, 0});
	spec_of(&s, "[data, model]", &m, 2);
	assert_int_equal(reshard_plan_meshes(&p, &s, &m, &s, &mr, (int64_t[]){4, 6}, 4, &d), 0);
	assert_int_equal(p.nsteps, 1);
	assert_int_equal(p.steps[0].kind, RS_PERMUTE);
	for (int dev = 0; dev < 4; dev++)
		assert_int_equal(p.steps[0].target[dev], 3 - dev);
	assert_int_equal(threads_check_plan(&p, &s, &s, DT_F32, msg, sizeof msg), 0);
	reshard_plan_free(&p);
	/* replicated: nothing to move */
	spec_of(&s, "[null, null]", &m, 2);
	assert_int_equal(reshard_plan_meshes(&p, &s, &m, &s, &mr, (int64_t[]){4, 6}, 4, &d), 0);
	assert_int_equal(p.nsteps, 0);
	reshard_plan_free(&p);
	arena_free(&a);
}

/* Uneven partial -> split: still one collective (after a local re-pad). */
static void test_uneven_reduce_scatter(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	Spec sa, sb;
	ReshardPlan p;
	Diag d;
	char msg[256];
	arena_init(&a);
	diag_init(&d);
	mesh_make(&m, &a, 2, (int[]){2, 4}, NULL);
	spec_of(&sa, "{dims: [null, null], partial: [model]}", &m, 2);
	spec_of(&sb, "[model, null]", &m, 2);
	assert_int_equal(reshard_plan(&p, &sa, &sb, &m, (int64_t[]){5, 3}, 4, &d), 0);
	int ncoll = 0;
	for (int i = 0; i < p.nsteps; i++)
		if (p.steps[i].kind != RS_SLICE) {
			assert_int_equal(p.steps[i].kind, RS_REDUCE_SCATTER);
			ncoll++;
		}
	assert_int_equal(ncoll, 1);
	assert_int_equal(threads_check_plan(&p, &sa, &sb, DT_F32, msg, sizeof msg), 0);
	reshard_plan_free(&p);
	arena_free(&a);
}

static void test_plan_errors(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	Spec sa, sb;
	ReshardPlan p;
	Diag d;
	arena_init(&a);
	diag_init(&d);
	d.quiet = true;
	mesh_make(&m, &a, 2, (int[]){2, 4}, NULL);
	spec_of(&sa, "[data, null]", &m, 2);
	spec_of(&sb, "{dims: [null, null], partial: [model]}", &m, 2);
	assert_int_equal(reshard_plan(&p, &sa, &sb, &m, (int64_t[]){8, 8}, 4, &d), -1);
	assert_non_null(strstr(d.last, "'model' partial only in the target"));
	spec_of(&sa, "{dims: [null, null], partial: {axes: [model], reduce: max}}", &m, 2);
	assert_int_equal(reshard_plan(&p, &sa, &sb, &m, (int64_t[]){8, 8}, 4, &d), -1);
	assert_non_null(strstr(d.last, "same pending reduction"));
	spec_of(&sb, "[null]", &m, 1);
	assert_int_equal(reshard_plan(&p, &sa, &sb, &m, (int64_t[]){8, 8}, 4, &d), -1);
	/* partial max reduces with max */
	spec_of(&sb, "[model, null]", &m, 2);
	char msg[256];
	assert_int_equal(reshard_plan(&p, &sa, &sb, &m, (int64_t[]){8, 8}, 4, &d), 0);
	assert_int_equal(threads_check_plan(&p, &sa, &sb, DT_F32, msg, sizeof msg), 0);
	reshard_plan_free(&p);
	arena_free(&a);
}

/* ---- plans shared through a cache ---- */

typedef struct {
	ReshardCache *c;
	const Mesh *m;
	const SpecVec *specs;
	const int64_t *dims;
	const ReshardPlan **got; /* per pair */
} CacheRun;

static void cache_pair(void *ctx, int i)
{
	CacheRun *r = ctx;
	int n = r->specs->n;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	r->got[i] = reshard_cache_plan(r->c, &r->specs->a[i / n], &r->specs->a[i % n], r->m, r->dims, 4, &d);
}

/* Every pair of specs on a 2 x 4 mesh, asked from two threads at once and
 * then again: the cache's plan is the planner's, step for step; a mesh
 * with other names but the same sizes shares it; other sizes and another
 * device order get their own, the latter on a copy of that order that
 * runs on threads; a refusal is reported and not remembered. */
static void test_cache(void **state)
{
	(void)state;
	Arena a;
	Mesh m, same, other, order;
	arena_init(&a);
	mesh_make(&m, &a, 2, (int[]){2, 4}, NULL);
	mesh_make(&other, &a, 2, (int[]){4, 2}, NULL);
	mesh_make(&order, &a, 2, (int[]){2, 4}, (int[]){7, 6, 5, 4, 3, 2, 1, 0});
	same = m;
	same.name[0] = "rows", same.name[1] = "cols";
	SpecVec specs = {0};
	Spec s;
	memset(&s, 0, sizeof s);
	s.rank = 2;
	enum_specs(&s, &m, 0, false, &specs);
	int64_t dims[2] = {8, 12};
	int n = specs.n, np = n * n;
	const ReshardPlan **got = xcalloc((size_t)np, sizeof *got), **again = xcalloc((size_t)np, sizeof *again);
	ReshardCache *c = reshard_cache_new();
	CacheRun r = {c, &m, &specs, dims, got};
	parallel_for(np, 2, cache_pair, &r);
	r.got = again, r.m = &same;
	parallel_for(np, 2, cache_pair, &r);
	Diag d;
	diag_init(&d);
	d.quiet = true;
	for (int i = 0; i < np; i++) {
		ReshardPlan p;
		assert_int_equal(reshard_plan(&p, &specs.a[i / n], &specs.a[i % n], &m, dims, 4, &d), 0);
		assert_non_null(got[i]);
		assert_ptr_equal(got[i], again[i]);
		assert_int_equal(got[i]->nsteps, p.nsteps);
		assert_int_equal(got[i]->bytes_sent_per_device, p.bytes_sent_per_device);
		assert_memory_equal(&got[i]->from, &p.from, sizeof p.from);
		assert_memory_equal(&got[i]->to, &p.to, sizeof p.to);
		for (int k = 0; k < p.nsteps; k++) {
			const ReshardStep *x = &got[i]->steps[k], *y = &p.steps[k];
			assert_int_equal(x->kind, y->kind);
			assert_int_equal(x->nax, y->nax);
			assert_memory_equal(x->axes, y->axes, sizeof x->axes);
			assert_int_equal(x->dim, y->dim);
			assert_int_equal(x->dim2, y->dim2);
			assert_memory_equal(&x->after, &y->after, sizeof x->after);
			assert_int_equal(x->bytes_sent_per_device, y->bytes_sent_per_device);
		}
		assert_ptr_equal(got[i]->mesh_to, got[i]->mesh);
		assert_int_equal(got[i]->mesh->size[1], 4);
		reshard_plan_free(&p);
	}
	const ReshardPlan *q = reshard_cache_plan(c, &specs.a[0], &specs.a[1], &other, dims, 4, &d);
	assert_non_null(q);
	assert_ptr_not_equal(q, got[1]); /* other sizes: its own plan */
	Spec from, to;
	spec_of(&from, "[data, model]", &m, 2);
	spec_of(&to, "[model, data]", &m, 2);
	const ReshardPlan *o = reshard_cache_plan(c, &from, &to, &order, dims, 4, &d);
	const ReshardPlan *mo = reshard_cache_plan(c, &from, &to, &m, dims, 4, &d);
	assert_non_null(o);
	assert_non_null(mo);
	assert_ptr_not_equal(o, mo); /* another device order: its own plan */
	assert_ptr_equal(reshard_cache_plan(c, &from, &to, &order, dims, 4, &d), o);
	assert_true(mesh_same_order(o->mesh, &order));
	assert_null(o->mesh->name[0]);
	char msg[256];
	assert_int_equal(threads_check_plan(o, &from, &to, DT_F32, msg, sizeof msg), 0);
	spec_of(&from, "[data, null]", &m, 2);
	spec_of(&to, "{dims: [null, null], partial: [model]}", &m, 2);
	for (int k = 0; k < 2; k++) { /* refused each time: nothing remembered */
		d.last[0] = 0;
		assert_null(reshard_cache_plan(c, &from, &to, &m, dims, 4, &d));
		assert_non_null(strstr(d.last, "'model' partial only in the target"));
	}
	reshard_cache_free(c);
	reshard_cache_free(NULL);
	free(got), free(again);
	vec_free(&specs);
	arena_free(&a);
}

/* ---- collectives against naive loops ---- */

typedef struct {
	float in[6][12], out[6][48];
	int target[6];
} CollRun;

/* Device buffers [2, 3] on a 2x3 mesh; element (i, j) of device v is v*100 + i*10 + j + 0.5. */
static int coll_body(int device, void *arg, Backend *b)
{
	CollRun *r = arg;
	for (int k = 0; k < 6; k++)
		r->in[device][k] = (float)(device * 100 + (k / 3) * 10 + k % 3) + 0.5f;
	Coll c = {.nax = 1, .axes = {1}, .dtype = DT_F32, .rank = 2, .shape = {2, 3}, .dim = 1, .dim2 = 0};
	float tmp[36];
	if (b->all_gather(b, device, &c, r->in[device], r->out[device]) != 0)
		return -1;
	c.dim = 0;
	c.shape[0] = 6; /* gathered dim 0 = [2*3, 3]... use a [6, 3] input built from the device's values */
	for (int k = 0; k < 18; k++)
		tmp[k] = (float)(device * 1000 + k);
	if (b->reduce_scatter(b, device, &c, tmp, r->out[device] + 18) != 0) /* [2, 3] */
		return -1;
	c.shape[0] = 2;
	c.nax = 2;
	c.axes[0] = 0;
	c.axes[1] = 1;
	if (b->all_reduce(b, device, &c, r->in[device], r->out[device] + 24) != 0)
		return -1;
	Coll t = {.nax = 1, .axes = {1}, .dtype = DT_F32, .rank = 2, .shape = {2, 3}, .dim = 1, .dim2 = 0};
	if (b->all_to_all(b, device, &t, r->in[device], r->out[device] + 30) != 0) /* [6, 1] */
		return -1;
	t.target = r->target;
	if (b->permute(b, device, &t, r->in[device], r->out[device] + 36) != 0)
		return -1;
	return b->barrier(b, device);
}

static void test_collectives_semantics(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	arena_init(&a);
	mesh_make(&m, &a, 2, (int[]){2, 3}, NULL);
	CollRun r;
	memset(&r, 0, sizeof r);
	mesh_shift_targets(&m, 1, 1, r.target);
	assert_int_equal(threads_run(&m, coll_body, &r), 0);
	for (int dev = 0; dev < 6; dev++) {
		int row = dev / 3, col = dev % 3; /* data, model coordinates */
		/* all_gather over model along dim 1: out[i][3*j + c] = member j's in[i][c] */
		for (int i = 0; i < 2; i++)
			for (int j = 0; j < 3; j++)
				for (int c = 0; c < 3; c++)
					assert_true(r.out[dev][i * 9 + j * 3 + c] == r.in[row * 3 + j][i * 3 + c]);
		/* reduce_scatter over model of [6, 3]: member col keeps rows 2col..2col+1, summed in order */
		for (int k = 0; k < 6; k++) {
			float want = 0;
			for (int j = 0; j < 3; j++)
				want += (float)((row * 3 + j) * 1000 + col * 6 + k);
			assert_true(r.out[dev][18 + k] == want);
		}
		/* all_reduce over both axes: left to right over devices 0..5 */
		for (int k = 0; k < 6; k++) {
			float want = r.in[0][k];
			for (int v = 1; v < 6; v++)
				want += r.in[v][k];
			assert_true(r.out[dev][24 + k] == want);
		}
		/* all_to_all over model, split dim 1, concat dim 0: out [6, 1],
		 * out[2j + i][0] = member j's in[i][col] */
		for (int j = 0; j < 3; j++)
			for (int i = 0; i < 2; i++)
				assert_true(r.out[dev][30 + 2 * j + i] == r.in[row * 3 + j][i * 3 + col]);
		/* permute shift +1 along model: device receives from model coordinate col - 1 */
		int src = row * 3 + (col + 2) % 3;
		for (int k = 0; k < 6; k++)
			assert_true(r.out[dev][36 + k] == r.in[src][k]);
	}
	arena_free(&a);
}

/* Sums are bit-for-bit the left-to-right order, run after run. */
static int repro_body(int device, void *arg, Backend *b)
{
	float *buf = arg, *in = buf + device * 1000;
	uint32_t x = (uint32_t)device * 2654435761u + 1;
	for (int k = 0; k < 1000; k++) {
		x = x * 1664525u + 1013904223u;
		in[k] = (float)(x >> 8) / (float)(1 << 24) * 3.0f - 1.0f + (float)device * 1e-3f;
	}
	Coll c = {.nax = 1, .axes = {0}, .dtype = DT_F32, .rank = 1, .shape = {1000}};
	return b->all_reduce(b, device, &c, in, buf + 8000 + device * 1000);
}

static void test_reproducible(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	arena_init(&a);
	mesh_make(&m, &a, 1, (int[]){8}, NULL);
	float *buf = xcalloc(16000, sizeof(float)), *first = xcalloc(8000, sizeof(float));
	for (int run = 0; run < 3; run++) {
		assert_int_equal(threads_run(&m, repro_body, buf), 0);
		for (int k = 0; k < 1000; k++) {
			float want = buf[k];
			for (int v = 1; v < 8; v++)
				want += buf[v * 1000 + k];
			for (int v = 0; v < 8; v++)
				assert_memory_equal(&buf[8000 + v * 1000 + k], &want, sizeof want);
		}
		if (run == 0)
			memcpy(first, buf + 8000, 8000 * sizeof(float));
		assert_memory_equal(first, buf + 8000, 8000 * sizeof(float));
	}
	free(buf);
	free(first);
	arena_free(&a);
}

/* A failing device does not leave the others waiting. */
static int fail_body(int device, void *arg, Backend *b)
{
	float in[4] = {0}, out[4];
	Coll c = {.nax = 1, .axes = {0}, .dtype = DT_F32, .rank = 1, .shape = {4}};
	if (device == 2)
		return -1;
	for (int i = 0; i < 3; i++)
		if (b->all_reduce(b, device, &c, in, out) != 0)
			return -1;
	return 0;
}

/* A device that returns early (0) while others wait also ends the run. */
static int early_body(int device, void *arg, Backend *b)
{
	if (device == 0)
		return 0;
	return b->barrier(b, device);
}

static void test_abort(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	arena_init(&a);
	mesh_make(&m, &a, 1, (int[]){4}, NULL);
	assert_int_not_equal(threads_run(&m, fail_body, NULL), 0);
	assert_int_not_equal(threads_run(&m, early_body, NULL), 0);
	arena_free(&a);
}

/* Groups that share no device proceed on their own: on a 2 x 2 mesh the
 * devices of data row 0 run three all_reduces over model, those of row 1
 * one all_gather, and a permute links only devices 0 -> 2 (1 and 3 neither
 * send nor receive, so they wait for nobody and get zeros). */
static int split_body(int device, void *arg, Backend *b)
{
	float *out = arg, in[2] = {(float)device + 1, (float)device * 10};
	Coll c = {.nax = 1, .axes = {1}, .dtype = DT_F32, .rank = 1, .shape = {2}};
	int target[4] = {2, -1, -1, -1};
	if (device < 2) {
		float acc[2] = {in[0], in[1]}, tmp[2];
		for (int i = 0; i < 3; i++) {
			if (b->all_reduce(b, device, &c, acc, tmp) != 0)
				return -1;
			memcpy(acc, tmp, sizeof acc);
		}
		memcpy(out + device * 8, acc, sizeof acc);
	} else if (b->all_gather(b, device, &c, in, out + device * 8) != 0)
		return -1;
	c.target = target;
	return b->permute(b, device, &c, in, out + device * 8 + 4);
}

/* Each device waits on a group the next device never joins: a cycle of
 * waits that must end the run rather than hang it. */
static int cycle_body(int device, void *arg, Backend *b)
{
	float in[1] = {0}, out[2];
	static const int axis[4] = {1, 0, 0, 1}; /* 0:{0,1} 1:{1,3} 3:{2,3} 2:{0,2} */
	Coll c = {.nax = 1, .axes = {axis[device]}, .dtype = DT_F32, .rank = 1, .shape = {1}};
	if (b->all_gather(b, device, &c, in, out) != 0)
		return -1;
	c.axes[0] = 1 - c.axes[0];
	return b->all_gather(b, device, &c, in, out);
}

static void test_group_local(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	arena_init(&a);
	mesh_make(&m, &a, 2, (int[]){2, 2}, NULL);
	float out[32];
	for (int k = 0; k < 32; k++)
		out[k] = -7;
	assert_int_equal(threads_run(&m, split_body, out), 0);
	/* row 0: (1 + 2) then doubled twice; (0 + 10) likewise */
	for (int dev = 0; dev < 2; dev++) {
		assert_true(out[dev * 8] == 12 && out[dev * 8 + 1] == 40);
	}
	for (int dev = 2; dev < 4; dev++) /* row 1: devices 2 and 3 gathered */
		assert_true(out[dev * 8] == 3 && out[dev * 8 + 1] == 20 && out[dev * 8 + 2] == 4 && out[dev * 8 + 3] == 30);
	assert_true(out[2 * 8 + 4] == 1 && out[2 * 8 + 5] == 0); /* 2 got device 0's buffer */
	for (int dev = 0; dev < 4; dev++)
		if (dev != 2)
			assert_true(out[dev * 8 + 4] == 0 && out[dev * 8 + 5] == 0);
	assert_int_not_equal(threads_run(&m, cycle_body, NULL), 0);
	arena_free(&a);
}

/* ---- the command, called directly ---- */

/* Run cmd_reshard on args with stdout and stderr in files; its status. */
static int run_cmd(const char *const *args, int n, char *out, size_t nout)
{
	char *argv[32];
	for (int i = 0; i < n; i++)
		argv[i] = (char *)args[i];
	FILE *fo = tmpfile(), *fe = tmpfile();
	fflush(stdout);
	fflush(stderr);
	int so = dup(1), se = dup(2);
	dup2(fileno(fo), 1);
	dup2(fileno(fe), 2);
	int rc = cmd_reshard(n, argv);
	fflush(stdout);
	fflush(stderr);
	dup2(so, 1);
	dup2(se, 2);
	close(so);
	close(se);
	rewind(fo);
	size_t k = fread(out, 1, nout - 1, fo);
	out[k] = 0;
	fclose(fo);
	fclose(fe);
	return rc;
}

static void test_cmd_reshard(void **state)
{
	(void)state;
	char out[8192];
	const char *ok[] = {"--mesh", "data=2,model=4", "--shape", "8,16", "--from", "[data, null]", "--to",
	                    "[null, data]", "--check", "--json"};
	assert_int_equal(run_cmd(ok, 10, out, sizeof out), 0);
	json_error_t err;
	json_t *j = json_loads(out, 0, &err);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "check")), "ok");
	assert_int_equal(json_integer_value(json_object_get(j, "bytes_sent_per_device")), 128);
	json_t *step = json_array_get(json_object_get(j, "steps"), 0);
	assert_string_equal(json_string_value(json_object_get(step, "op")), "all_to_all");
	json_decref(j);
	const char *bad[] = {"--mesh", "data=2,model=4", "--shape", "8,16", "--from", "[data, data]", "--to",
	                     "[null, null]"};
	assert_int_equal(run_cmd(bad, 8, out, sizeof out), 2);
	assert_string_equal(out, "");
	const char *zero[] = {"--mesh", "data=0", "--shape", "8", "--from", "[null]", "--to", "[null]"};
	assert_int_equal(run_cmd(zero, 8, out, sizeof out), 2);
	const char *help[] = {"--help"};
	assert_int_equal(run_cmd(help, 1, out, sizeof out), 0);
	assert_non_null(strstr(out, "usage: spmd reshard"));
}

/* ---- sub-axes: plans on a mesh whose axes are cut in pieces ---- */

/* {data: 2, model: 8} with model cut into model:(1)4 and model:(4)2, or
 * only {model: 8} cut so (data 0 axes), in the given device order. */
static void mesh_cut_make(Mesh *m, Arena *a, bool data, const int *devices)
{
	int sizes[2] = {2, 8};
	memset(m, 0, sizeof *m);
	m->naxes = data ? 2 : 1;
	for (int i = 0; i < m->naxes; i++)
		m->name[i] = axis_names[i + !data], m->size[i] = sizes[i + !data];
	assert_int_equal(mesh_cut(m, a, m->naxes - 1, 4), 0);
	assert_int_equal(mesh_finish(m, a, devices), 0);
}

static void test_subaxis_plans(void **state)
{
	(void)state;
	static const Pin pins[] = {
		{"[model, null]", "[model:(1)4, null]", 1, {RS_ALL_GATHER}, {"model:(4)2"}},
		{"[model:(1)4, null]", "[model, null]", 1, {RS_SLICE}, {""}},
		{"{dims: [null, null], partial: [model:(4)2]}", "[null, null]", 1, {RS_ALL_REDUCE}, {"model:(4)2"}},
		{"{dims: [null, null], partial: [model:(4)2]}", "[model:(4)2, null]", 1, {RS_REDUCE_SCATTER}, {"model:(4)2"}},
		{"[model:(4)2, null]", "[null, model:(4)2]", 1, {RS_ALL_TO_ALL}, {"model:(4)2"}},
		{"[model:(1)4, model:(4)2]", "[model, null]", 1, {RS_ALL_TO_ALL}, {"model:(4)2"}},
		{"[[data, model:(1)4], null]", "[data, model:(1)4]", 1, {RS_ALL_TO_ALL}, {"model:(1)4"}},
	};
	Arena a;
	Mesh m, mx, m8;
	arena_init(&a);
	mesh_cut_make(&m, &a, true, NULL);
	int rev[16];
	for (int i = 0; i < 16; i++)
		rev[i] = (i * 5 + 3) % 16;
	mesh_cut_make(&mx, &a, true, rev);
	mesh_cut_make(&m8, &a, false, NULL);
	for (size_t i = 0; i < sizeof pins / sizeof pins[0]; i++)
		check_pin(&pins[i], &m, (int64_t[]){16, 16}, 2);
	/* every pair on model = 8 cut 4 x 2; a sample on {data: 2, model: 8},
	 * also into another device order; even shapes need no fallback */
	int before = nfallback;
	int n = all_pairs(&m8, &m8, (int64_t[]){8, 16}, 2, 1, DT_F32);
	n += all_pairs(&m, &m, (int64_t[]){16, 8}, 2, 5, DT_F32);
	assert_int_equal(nfallback, before);
	n += all_pairs(&m8, &m8, (int64_t[]){5, 3}, 2, 1, DT_F32);
	n += all_pairs(&m, &m, (int64_t[]){6, 5}, 2, 9, DT_F32);
	n += all_pairs(&m, &mx, (int64_t[]){16, 8}, 2, 11, DT_F32);
	print_message("sub-axes: %d pairs run\n", n);
	arena_free(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_collectives_semantics),
		cmocka_unit_test(test_reproducible),
		cmocka_unit_test(test_abort),
		cmocka_unit_test(test_group_local),
		cmocka_unit_test(test_pinned_plans),
		cmocka_unit_test(test_pinned_bytes),
		cmocka_unit_test(test_no_full_gather),
		cmocka_unit_test(test_device_order),
		cmocka_unit_test(test_uneven_reduce_scatter),
		cmocka_unit_test(test_plan_errors),
		cmocka_unit_test(test_all_pairs_small),
		cmocka_unit_test(test_all_pairs_2x2x2),
		cmocka_unit_test(test_cmd_reshard),
		cmocka_unit_test(test_cross_axes),
		cmocka_unit_test(test_subaxis_plans),
		cmocka_unit_test(test_cache),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
