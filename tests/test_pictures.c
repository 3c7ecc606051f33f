/* test_pictures.c: tile maps' tiles, regions and replicas; the progress bar; measured schedules; memory over time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "../base/progress.h"
#include "../cli/tilemap.h"
#include "../cli/trace.h"
#include "../spmd/load.h"

static void mesh_of(Mesh *m, Arena *a, const char *text)
{
	Diag d;
	diag_init(&d);
	assert_int_equal(mesh_parse_text(m, a, text, &d), 0);
	assert_int_equal(mesh_finish(m, a, NULL), 0);
}

/* [10, 8] as [data, null] on data=4,model=2: chunks of 3 rows, the last
 * tile 1 row (2 padding); each tile on the 2 devices of one data row. */
static void test_uneven_replicated(void **state)
{
	(void)state;
	Arena a;
	arena_init(&a);
	Mesh m;
	mesh_of(&m, &a, "data=4,model=2");
	Spec s = {.rank = 2, .nax = {1, 0}, .ax = {{0}}};
	Shape g = {2, {10, 8}};
	TileMap t;
	tilemap_init(&t, "x", DT_F32, &g, &s, &m);
	assert_int_equal(t.ntiles, 4);
	assert_int_equal(t.chunk[0], 3);
	int64_t off[2], ext[2];
	tilemap_tile_region(&t, 3, off, ext);
	assert_int_equal(off[0], 9);
	assert_int_equal(ext[0], 1);
	assert_int_equal(ext[1], 8);
	int dev[8];
	assert_int_equal(tilemap_tile_devices(&t, 2, dev), 2);
	assert_int_equal(dev[0], 4);
	assert_int_equal(dev[1], 5);
	assert_int_equal(t.nsummand, 1);
	tilemap_free(&t);
	arena_free(&a);
}

/* 5 over 4 shards of 2: the last shard starts past the end (all padding). */
static void test_empty_tile(void **state)
{
	(void)state;
	Arena a;
	arena_init(&a);
	Mesh m;
	mesh_of(&m, &a, "x=4");
	Spec s = {.rank = 1, .nax = {1}, .ax = {{0}}};
	Shape g = {1, {5}};
	TileMap t;
	tilemap_init(&t, "v", DT_F32, &g, &s, &m);
	int64_t off[1], ext[1];
	tilemap_tile_region(&t, 3, off, ext);
	assert_int_equal(off[0], 6);
	assert_int_equal(ext[0], 0);
	tilemap_free(&t);
	arena_free(&a);
}

/* Partial over model: one tile per data row, each device a summand; the
 * legend says which. */
static void test_partial_text(void **state)
{
	(void)state;
	Arena a;
	arena_init(&a);
	Mesh m;
	mesh_of(&m, &a, "data=2,model=2");
	Spec s = {.rank = 1, .nax = {1}, .ax = {{0}}, .partial = 2};
	Shape g = {1, {4}};
	TileMap t;
	tilemap_init(&t, "p", DT_F32, &g, &s, &m);
	assert_int_equal(t.nsummand, 2);
	char *buf = NULL;
	size_t n = 0;
	FILE *out = open_memstream(&buf, &n);
	tilemap_text(&t, out, false);
	fclose(out);
	assert_non_null(strstr(buf, "T1   [2:4] on 2 (data=1, model=0; summand 0), 3 (data=1, model=1; summand 1)"));
	assert_null(strstr(buf, "\x1b["));
	free(buf);
	tilemap_free(&t);
	arena_free(&a);
}

static void test_progress(void **state)
{
	(void)state;
	Progress p;
	char buf[256];
	progress_begin_on(&p, "explore", 40, "plans", NULL, 0);
	p.done = 10;
	progress_format(&p, 3.0, buf, sizeof buf);
	assert_string_equal(buf, "explore [=======>                      ] 10/40 plans, 9 s left");
	p.total = 0;
	progress_format(&p, 3.0, buf, sizeof buf);
	assert_string_equal(buf, "explore 10 plans");
	/* drawn onto a stream with no delay, erased at the end */
	char *text = NULL;
	size_t n = 0;
	FILE *out = open_memstream(&text, &n);
	progress_begin_on(&p, "run", 2, "steps", out, 0);
	progress_set(&p, 1);
	progress_end(&p);
	fclose(out);
	assert_non_null(strstr(text, "\rrun [===============>              ] 1/2 steps"));
	assert_non_null(strstr(text + strlen(text) - 4, "\r\x1b[K"));
	free(text);
	/* a long delay draws nothing */
	text = NULL;
	out = open_memstream(&text, &n);
	progress_begin_on(&p, "run", 2, "steps", out, 1e9);
	progress_set(&p, 1);
	progress_end(&p);
	fclose(out);
	assert_int_equal(n, 0);
	free(text);
}

static const char model[] = "mesh: {x: 2}\n"
                            "inputs: {a: {shape: [4, 4], sharding: [x, null]}}\n"
                            "ops:\n"
                            "  - {out: b, op: relu, in: [a]}\n"
                            "  - {out: c, op: exp, in: [b]}\n"
                            "outputs: [c]\n";

/* Measured seconds laid end to end per device; memory by liveness. */
static void test_measured_schedule_and_memory(void **state)
{
	(void)state;
	Graph g;
	Diag d;
	diag_init(&d);
	assert_int_equal(model_load_string(&g, model, "m.yaml", &d), 0);
	double sec[4] = {1, 2, 3, 5};
	Schedule s;
	schedule_from_measured(&g, sec, 2, &s);
	assert_int_equal(s.n, 4);
	assert_true(s.s[1].start == 1 && s.s[1].end == 3);
	assert_true(s.s[3].device == 1 && s.s[3].start == 3 && s.s[3].end == 8);
	assert_true(s.span == 8);
	schedule_free(&s);
	int64_t held[2];
	cost_memory_timeline(&g, held);
	assert_int_equal(held[0], 2 * 64); /* a, b (a model: global shapes, 64 bytes each) */
	assert_int_equal(held[1], 3 * 64); /* a, b and c: b is freed only after c is made */
	int live[8];
	assert_int_equal(cost_live_values(&g, 1, live), 2);
	graph_free(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_uneven_replicated),
		cmocka_unit_test(test_empty_tile),
		cmocka_unit_test(test_partial_text),
		cmocka_unit_test(test_progress),
		cmocka_unit_test(test_measured_schedule_and_memory),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
