/* test_spec.c: sharding specs — parse/format, errors, and tile-math properties on random meshes and specs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "../sharding_spec/spec.h"
#include "../base/yaml.h"

static const char *const axis_names[] = {"data", "model", "pipe", "seq"};

/* A mesh of n axes with the given sizes; devices may be NULL (identity). */
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

/* Parse text as a spec for rank dims; returns spec_parse's status, message in d->last. */
static int parse(Spec *s, const char *text, const Mesh *m, int rank, Diag *d)
{
	YDoc doc;
	diag_init(d);
	d->quiet = true;
	int rc = ydoc_parse_string(&doc, text, "<spec>", d);
	if (rc == 0)
		rc = spec_parse(s, doc.root, m, rank, d);
	ydoc_free(&doc);
	return rc;
}

static void check_roundtrip(const char *text, const char *want, const Mesh *m, int rank)
{
	Spec s, t;
	Diag d;
	char buf[256];
	if (parse(&s, text, m, rank, &d) != 0)
		fail_msg("%s: %s", text, d.last);
	spec_format(&s, m, buf, sizeof buf);
	assert_string_equal(buf, want);
	assert_int_equal(parse(&t, buf, m, rank, &d), 0);
	assert_true(spec_eq(&s, &t));
}

static void test_parse_forms(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	arena_init(&a);
	mesh_make(&m, &a, 2, (int[]){2, 4}, NULL);
	check_roundtrip("[data, null]", "[data, null]", &m, 2);
	check_roundtrip("[[data, model], null]", "[[data, model], null]", &m, 2);
	check_roundtrip("[[model], ~]", "[model, null]", &m, 2);
	check_roundtrip("[[], model]", "[null, model]", &m, 2);
	check_roundtrip("[_, model]", "[_, model]", &m, 2);
	check_roundtrip("['?', model]", "[_, model]", &m, 2);
	check_roundtrip("[[data, _], null]", "[[data, _], null]", &m, 2);
	check_roundtrip("{dims: [null, model], partial: [data]}", "{dims: [null, model], partial: [data]}", &m, 2);
	check_roundtrip("{dims: [null, null], partial: [model, data]}", "{dims: [null, null], partial: [data, model]}", &m, 2);
	check_roundtrip("{dims: [null], partial: {axes: [data], reduce: max}}",
	                "{dims: [null], partial: {axes: [data], reduce: max}}", &m, 1);
	check_roundtrip("{dims: [model], partial: {axes: data}}", "{dims: [model], partial: [data]}", &m, 1);
	check_roundtrip("[]", "[]", &m, 0);
	check_roundtrip("{partial: [data]}", "{dims: [], partial: [data]}", &m, 0);
	Spec s;
	Diag d;
	assert_int_equal(parse(&s, "[[data, model], _]", &m, 2, &d), 0);
	assert_int_equal(s.nax[0], 2);
	assert_int_equal(s.ax[0][0], 0);
	assert_int_equal(s.ax[0][1], 1);
	assert_int_equal(s.open, 2);
	assert_int_equal(spec_dim_shards(&s, &m, 0), 8);
	assert_int_equal(spec_dim_shards(&s, &m, 1), 1);
	assert_int_equal(parse(&s, "{dims: [null, null], partial: {axes: [model], reduce: max}}", &m, 2, &d), 0);
	assert_int_equal(s.partial, 2);
	assert_int_equal(s.reduce, REDUCE_MAX);
	arena_free(&a);
}

static void check_error(const char *text, int rank, const char *want, const Mesh *m)
{
	Spec s;
	Diag d;
	assert_int_equal(parse(&s, text, m, rank, &d), -1);
	if (!strstr(d.last, want))
		fail_msg("%s: got \"%s\", want \"%s\"", text, d.last, want);
}

static void test_parse_errors(void **state)
{
	(void)state;
	Arena a;
	Mesh m, none = {0};
	arena_init(&a);
	mesh_make(&m, &a, 2, (int[]){2, 4}, NULL);
	mesh_finish(&none, &a, NULL);
	check_error("[foo, null]", 2, "expected a mesh axis (one of data, model), found 'foo'", &m);
	check_error("[data, data]", 2, "expected each mesh axis at most once, found 'data' twice", &m);
	check_error("[[data, model, data], null]", 2, "found 'data' twice", &m);
	check_error("[data, null, null]", 2, "expected 2 entries (one per dimension), found 3", &m);
	check_error("[data]", 2, "expected 2 entries (one per dimension), found 1", &m);
	check_error("[data, null]", 1, "expected 1 entry (one per dimension), found 2", &m);
	check_error("{dims: [data, null], partial: [data]}", 2, "found a partial axis also used on a dimension", &m);
	check_error("{dims: [null, null], partial: [model, model]}", 2, "found 'model' twice", &m);
	check_error("{dims: [null, null], partial: [pipe]}", 2, "expected a mesh axis (one of data, model), found 'pipe'", &m);
	check_error("{dims: [null, null], partial: {axes: [data], reduce: min}}", 2,
	            "expected a reduction (sum or max), found 'min'", &m);
	check_error("{dims: [null, null], partial: {reduce: max}}", 2, "expected the partial axes", &m);
	check_error("{dims: [null, null], partail: [data]}", 2, "expected a sharding key (dims or partial), found 'partail'",
	            &m);
	check_error("{partial: [data]}", 2, "expected dims", &m);
	check_error("data", 2, "expected a sharding", &m);
	check_error("[[data, [model]], null]", 2, "expected a mesh axis (one of data, model), found a", &m);
	check_error("[[_, data], null]", 2, "found '_'", &m);
	check_error("[data]", 1, "expected no sharding (the model has no mesh), found 'data'", &none);
	/* every error is reported at a position */
	Spec s;
	Diag d;
	assert_int_equal(parse(&s, "[data,\n  foo]", &m, 2, &d), -1);
	arena_free(&a);
}

/* ---- random meshes and specs ---- */

static uint64_t rng = 88172645463325252ull;
static unsigned rnd(unsigned n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (unsigned)(rng % n);
}

/* A random mesh: 1..4 axes of sizes 1..4, half the time with a shuffled device order. */
static void random_mesh(Mesh *m, Arena *a)
{
	int n = 1 + (int)rnd(4), size[4], devices[256], nd = 1;
	for (int i = 0; i < n; i++) {
		size[i] = 1 + (int)rnd(4);
		nd *= size[i];
	}
	for (int i = 0; i < nd; i++)
		devices[i] = i;
	for (int i = nd - 1; i > 0; i--) {
		int j = (int)rnd((unsigned)i + 1), t = devices[i];
		devices[i] = devices[j];
		devices[j] = t;
	}
	mesh_make(m, a, n, size, rnd(2) ? devices : NULL);
}

/* A random valid spec of the given rank: axes in random order, each unused,
 * partial or appended to a random dim. */
static void random_spec(Spec *s, const Mesh *m, int rank, bool partial)
{
	int order[MESH_MAX_AXES];
	memset(s, 0, sizeof *s);
	s->rank = (uint8_t)rank;
	for (int i = 0; i < m->naxes; i++)
		order[i] = i;
	for (int i = m->naxes - 1; i > 0; i--) {
		int j = (int)rnd((unsigned)i + 1), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	for (int i = 0; i < m->naxes; i++) {
		unsigned c = rnd((unsigned)rank + 2);
		if (c < (unsigned)rank)
			s->ax[c][s->nax[c]++] = (uint8_t)order[i];
		else if (c == (unsigned)rank && partial)
			s->partial |= (uint8_t)(1u << order[i]);
	}
	s->reduce = s->partial && rnd(2) ? REDUCE_MAX : REDUCE_SUM;
	s->open = (uint8_t)(rnd(1u << rank));
	assert_true(spec_is_valid(s, m));
}

/* Coordinates of a device found the slow way: search every position. */
static void slow_coords(const Mesh *m, int device, int *coord)
{
	int pos = 0;
	while ((m->devices ? m->devices[pos] : pos) != device)
		pos++;
	for (int a = m->naxes - 1; a >= 0; a--) {
		coord[a] = pos % m->size[a];
		pos /= m->size[a];
	}
}

/* Per replica group (devices equal on every axis that splits no dim), the
 * valid regions cover every element of the global shape exactly once. */
static void check_cover(const Spec *s, const Mesh *m, const int64_t *dims)
{
	int64_t numel = 1;
	for (int d = 0; d < s->rank; d++)
		numel *= dims[d];
	unsigned used = spec_dim_axes(s);
	int ngroups = m->ndev / mesh_axes_size(m, used);
	unsigned char *count = calloc((size_t)(numel * ngroups) + 1, 1);
	int64_t local[MAX_RANK], want_local[MAX_RANK];
	spec_shard_shape(s, m, dims, local);
	for (int dev = 0; dev < m->ndev; dev++) {
		int coord[MESH_MAX_AXES];
		int64_t off[MAX_RANK], ext[MAX_RANK], idx[MAX_RANK], total = 1;
		slow_coords(m, dev, coord);
		int group = 0;
		for (int a = 0; a < m->naxes; a++)
			if (!(used >> a & 1))
				group = group * m->size[a] + coord[a];
		spec_shard_region(s, m, dims, dev, off, ext);
		spec_shard_index(s, m, dev, idx);
		for (int d = 0; d < s->rank; d++) {
			int64_t k = 0, n = 1;
			for (int i = 0; i < s->nax[d]; i++) {
				k = k * m->size[s->ax[d][i]] + coord[s->ax[d][i]];
				n *= m->size[s->ax[d][i]];
			}
			want_local[d] = (dims[d] + n - 1) / n;
			assert_int_equal(idx[d], k);
			assert_int_equal(local[d], want_local[d]);
			assert_int_equal(off[d], k * local[d]);
			assert_true(ext[d] >= 0 && ext[d] <= local[d]);
			total *= ext[d];
		}
		/* walk the valid region and count each element */
		for (int64_t e = 0; e < total; e++) {
			int64_t rest = e, flat = 0;
			int64_t pos[MAX_RANK];
			for (int d = s->rank - 1; d >= 0; d--) {
				pos[d] = off[d] + rest % ext[d];
				rest /= ext[d];
			}
			for (int d = 0; d < s->rank; d++) {
				assert_true(pos[d] < dims[d]);
				flat = flat * dims[d] + pos[d];
			}
			count[group * numel + flat]++;
		}
	}
	for (int64_t i = 0; i < numel * ngroups; i++)
		assert_int_equal(count[i], 1);
	free(count);
}

static void check_format_parse(const Spec *s, const Mesh *m)
{
	char buf[512];
	Spec t;
	Diag d;
	spec_format(s, m, buf, sizeof buf);
	if (parse(&t, buf, m, s->rank, &d) != 0)
		fail_msg("'%s' does not parse: %s", buf, d.last);
	if (!spec_eq(s, &t))
		fail_msg("'%s' does not round-trip", buf);
}

static void test_tile_properties(void **state)
{
	(void)state;
	for (int iter = 0; iter < 600; iter++) {
		Arena a;
		Mesh m;
		Spec s;
		int64_t dims[MAX_RANK];
		arena_init(&a);
		random_mesh(&m, &a);
		int rank = (int)rnd(4);
		for (int d = 0; d < rank; d++)
			dims[d] = 1 + (int64_t)rnd(11);
		random_spec(&s, &m, rank, true);
		check_cover(&s, &m, dims);
		check_format_parse(&s, &m);
		arena_free(&a);
	}
}

static void test_spec_queries(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	Spec s, t;
	Diag d;
	arena_init(&a);
	mesh_make(&m, &a, 3, (int[]){2, 2, 3}, NULL);
	assert_int_equal(parse(&s, "{dims: [[model, data], null], partial: [pipe]}", &m, 2, &d), 0);
	assert_int_equal(spec_dim_axes(&s), 3);
	assert_false(spec_replicated_over(&s, 0));
	assert_false(spec_replicated_over(&s, 2));
	assert_int_equal(parse(&t, "[[model, data], null]", &m, 2, &d), 0);
	assert_false(spec_eq(&s, &t));
	assert_true(spec_replicated_over(&t, 2));
	assert_int_equal(parse(&t, "[[data, model], null]", &m, 2, &d), 0);
	assert_false(spec_eq(&s, &t));
	/* device 7 = (data 1, model 0, pipe 1): dim 0 index = model*2 + data = 1 */
	int64_t idx[2], off[2], ext[2];
	spec_shard_index(&s, &m, 7, idx);
	assert_int_equal(idx[0], 1);
	assert_int_equal(spec_partial_index(&s, &m, 7), 1);
	/* dim 0 of size 5 over 4 shards: c = 2; shard 3 is empty */
	spec_shard_region(&s, &m, (int64_t[]){5, 3}, 11 - 2, off, ext); /* device 9: data 1, model 1 -> shard 3 */
	assert_int_equal(off[0], 6);
	assert_int_equal(ext[0], 0);
	assert_int_equal(ext[1], 3);
	arena_free(&a);
}


/* ---- sub-axes ---- */

/* m cut for the sub-axes text names (as the loader does), then text parsed. */
static int parse_cut(Spec *s, const char *text, Mesh *m, Arena *a, int rank, Diag *d)
{
	YDoc doc;
	diag_init(d);
	d->quiet = true;
	int rc = ydoc_parse_string(&doc, text, "<spec>", d);
	if (rc == 0) {
		spec_cut_mesh(m, a, doc.root);
		rc = spec_parse(s, doc.root, m, rank, d);
	}
	ydoc_free(&doc);
	return rc;
}

/* On a fresh {data: 2, model: 8} cut for text: text prints as want. */
static void check_sub(const char *text, const char *want, int naxes)
{
	Arena a;
	Mesh m;
	Spec s, t;
	Diag d;
	char buf[256];
	arena_init(&a);
	mesh_make(&m, &a, 2, (int[]){2, 8}, NULL);
	if (parse_cut(&s, text, &m, &a, 2, &d) != 0)
		fail_msg("%s: %s", text, d.last);
	assert_int_equal(m.naxes, naxes);
	spec_format(&s, &m, buf, sizeof buf);
	assert_string_equal(buf, want);
	assert_int_equal(parse(&t, buf, &m, 2, &d), 0);
	assert_true(spec_eq(&s, &t));
	arena_free(&a);
}

static void check_sub_error(const char *text, const char *want)
{
	Arena a;
	Mesh m;
	Spec s;
	Diag d;
	arena_init(&a);
	mesh_make(&m, &a, 2, (int[]){2, 8}, NULL);
	assert_int_equal(parse_cut(&s, text, &m, &a, 2, &d), -1);
	if (!strstr(d.last, want))
		fail_msg("%s: got \"%s\", want \"%s\"", text, d.last, want);
	arena_free(&a);
}

static void test_subaxis_parse(void **state)
{
	(void)state;
	check_sub("[model:(1)4, model:(4)2]", "[model:(1)4, model:(4)2]", 3);
	check_sub("[[model:(1)4, model:(4)2], null]", "[model, null]", 3);
	check_sub("[[model:(4)2, model:(1)4], data]", "[[model:(4)2, model:(1)4], data]", 3);
	check_sub("[[data, model:(1)2], model:(2)4]", "[[data, model:(1)2], model:(2)4]", 3);
	check_sub("{dims: [model:(1)4, null], partial: [model:(4)2]}", "{dims: [model:(1)4, null], partial: [model:(4)2]}", 3);
	check_sub("{dims: [null, data], partial: [model:(1)2, model:(2)4]}", "{dims: [null, data], partial: [model]}", 3);
	check_sub("[model:(1)2, [model:(2)2, model:(4)2]]", "[model:(1)2, model:(2)4]", 4);
	check_sub("[model:(1)8, null]", "[model, null]", 2); /* the whole axis */
	check_sub_error("[model:(1)3, null]", "expected a sub-axis model:(P)S of 'model' (size 8) with P*S dividing 8, found 'model:(1)3'");
	check_sub_error("[model:(4)4, null]", "with P*S dividing 8, found 'model:(4)4'");
	check_sub_error("[model:(2)1, null]", "expected a sub-axis of size at least 2, found 'model:(2)1'");
	check_sub_error("[foo:(1)2, null]", "expected a mesh axis (one of data, model), found 'foo:(1)2'");
	check_sub_error("[model:(1)4, model:(2)4]", "expected sub-axes of 'model' that do not overlap, found 'model:(2)4' overlapping 'model:(1)4'");
	check_sub_error("[model, model:(4)2]", "expected sub-axes of 'model' that do not overlap, found 'model:(4)2' overlapping 'model'");
	check_sub_error("[model:(4)2, model:(4)2]", "expected each mesh axis at most once, found 'model:(4)2' twice");
	check_sub_error("{dims: [model:(1)4, null], partial: [model]}", "found a partial axis also used on a dimension ('model')");
	/* cuts that do not nest: 12 cut at 2 cannot be cut at 3 */
	Arena a;
	Mesh m;
	Spec s;
	Diag d;
	arena_init(&a);
	mesh_make(&m, &a, 1, (int[]){12}, NULL);
	assert_int_equal(parse_cut(&s, "[data:(1)2]", &m, &a, 1, &d), 0);
	assert_int_equal(parse_cut(&s, "[data:(1)3]", &m, &a, 1, &d), -1);
	assert_non_null(strstr(d.last, "expected a sub-axis made of the pieces the other sub-axes cut 'data' into (data:(1)2, "
	                                "data:(2)6), found 'data:(1)3'"));
	assert_int_equal(mesh_cut_name(&m, &a, "data:(1)3"), -1);
	assert_int_equal(m.naxes, 2);
	arena_free(&a);
}

/* Shardy's meaning: model:(P)S is the coordinate (c / (8 / (P*S))) % S of
 * model = 8, the major part first. */
static void test_subaxis_tiles(void **state)
{
	(void)state;
	Arena a;
	Mesh m;
	Spec s;
	Diag d;
	arena_init(&a);
	mesh_make(&m, &a, 2, (int[]){2, 8}, NULL);
	assert_int_equal(parse_cut(&s, "[model:(1)4, model:(4)2]", &m, &a, 2, &d), 0);
	assert_int_equal(spec_dim_shards(&s, &m, 0), 4);
	assert_int_equal(spec_dim_shards(&s, &m, 1), 2);
	for (int dev = 0; dev < m.ndev; dev++) {
		int64_t idx[2], off[2], ext[2];
		int c = dev % 8; /* data major: device = data * 8 + model */
		spec_shard_index(&s, &m, dev, idx);
		assert_int_equal(idx[0], c / 2);
		assert_int_equal(idx[1], c % 2);
		spec_shard_region(&s, &m, (int64_t[]){4, 8}, dev, off, ext);
		assert_int_equal(off[0], c / 2);
		assert_int_equal(off[1], 4 * (c % 2));
	}
	/* [32] over model, reshaped to [4, 8] over [model:(1)4, model:(4)2]: each
	 * device holds the same elements (the reshape is local) */
	Spec flat;
	assert_int_equal(parse(&flat, "[model]", &m, 1, &d), 0);
	for (int dev = 0; dev < m.ndev; dev++) {
		int64_t off1[1], ext1[1], off2[2], ext2[2];
		spec_shard_region(&flat, &m, (int64_t[]){32}, dev, off1, ext1);
		spec_shard_region(&s, &m, (int64_t[]){4, 8}, dev, off2, ext2);
		assert_int_equal(off1[0], off2[0] * 8 + off2[1]);
		assert_int_equal(ext1[0], ext2[0] * ext2[1]);
	}
	/* a spec on the uncut mesh carried to the cut one names the same layout */
	Mesh plain;
	Spec p;
	mesh_make(&plain, &a, 2, (int[]){2, 8}, NULL);
	assert_int_equal(parse(&p, "{dims: [model, data], partial: []}", &plain, 2, &d), 0);
	assert_int_equal(spec_remap(&p, &plain, &m), 0);
	assert_int_equal(p.nax[0], 2);
	char buf[128];
	spec_format(&p, &m, buf, sizeof buf);
	assert_string_equal(buf, "[model, data]");
	uint8_t ax[MESH_MAX_AXES];
	assert_int_equal(mesh_resolve(&m, "model", ax), 2);
	assert_int_equal(mesh_resolve(&m, "model:(2)2", ax), MESH_OFF_CUTS);
	assert_int_equal(mesh_resolve(&m, "model:(2)3", ax), MESH_BAD_SUB);
	assert_int_equal(mesh_resolve(&m, "modle", ax), MESH_UNKNOWN);
	mesh_format(&m, buf, sizeof buf);
	assert_string_equal(buf, "data=2,model=8");
	arena_free(&a);
}

/* The tile properties on random meshes whose axes are cut at random:
 * every piece is an axis of the tile math, and specs over pieces print and
 * parse back. */
static void test_subaxis_tile_properties(void **state)
{
	(void)state;
	for (int iter = 0; iter < 400; iter++) {
		Arena a;
		Mesh m;
		Spec s;
		int64_t dims[MAX_RANK];
		arena_init(&a);
		random_mesh(&m, &a);
		for (int k = 0; k < 3; k++) {
			int ax = (int)rnd((unsigned)m.naxes), at = 2 + (int)rnd(3);
			mesh_cut(&m, &a, ax, at); /* -1 (left uncut) when at does not divide */
		}
		if (m.naxes > 1 && rnd(2)) /* a larger axis to cut */
			mesh_cut(&m, &a, 0, 2);
		int rank = (int)rnd(4);
		for (int d = 0; d < rank; d++)
			dims[d] = 1 + (int64_t)rnd(11);
		random_spec(&s, &m, rank, true);
		check_cover(&s, &m, dims);
		check_format_parse(&s, &m);
		arena_free(&a);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_forms),
		cmocka_unit_test(test_parse_errors),
		cmocka_unit_test(test_tile_properties),
		cmocka_unit_test(test_spec_queries),
		cmocka_unit_test(test_subaxis_parse),
		cmocka_unit_test(test_subaxis_tiles),
		cmocka_unit_test(test_subaxis_tile_properties),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
