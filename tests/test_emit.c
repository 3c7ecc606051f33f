/* test_emit.c: writing partitioned programs (emit.c) and reading them back (load.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "../partitioner/partition.h"
#include "../partitioner/propagate.h"
#include "../runtime/collectives.h"
#include "../spmd/emit.h"
#include "../spmd/load.h"

/* Partition a model file (loaded into g, which prog borrows strings from) into prog. */
static void partition_file(const char *path, Graph *g, Graph *prog)
{
	Diag d;
	Propagation p;
	diag_init(&d);
	assert_int_equal(model_load(g, path, &d), 0);
	assert_int_equal(propagate(g, NULL, &p, &d), 0);
	assert_int_equal(partition(g, prog, NULL, NULL, &d), 0);
	propagation_free(&p);
}

/* Load text as a program, named as its source so that headers agree. */
static void load_text(const char *text, const char *name, Graph *g, LoadKind *kind)
{
	Diag d;
	diag_init(&d);
	int rc = program_load_string(g, text, name, kind, &d);
	if (rc != 0)
		fail_msg("%s does not load back: %s\n%s", name, d.last, text);
	assert_true(kind->spmd);
}

/* Writing what was read gives the same text, for the program and for
 * one device's file; the device files load with their facts checked. */
static void check_fixed_point(const char *path)
{
	Graph model, prog, back;
	LoadKind kind;
	size_t n, m;
	partition_file(path, &model, &prog);
	for (int dev = -1; dev < prog.mesh.ndev && dev < 2; dev++) {
		char *text = emit_text(&prog, dev, &n);
		load_text(text, path, &back, &kind);
		assert_int_equal(kind.device, dev);
		char *again = emit_text(&back, dev, &m);
		assert_string_equal(again, text);
		assert_int_equal(n, m);
		free(text), free(again);
		graph_free(&back);
	}
	graph_free(&prog);
	graph_free(&model);
}

static void test_fixed_points(void **state)
{
	static const char *const models[] = {"examples/mlp.yaml", "examples/transformer_block.yaml",
	                                     "examples/embedding.yaml", "examples/convnet.yaml"};
	for (size_t i = 0; i < sizeof models / sizeof *models; i++)
		check_fixed_point(models[i]);
}

/* ---- a hand-made program: mesh {a: 4, b: 2}, x [2] of global [8] on a ---- */

static void small_program(Graph *g)
{
	graph_init(g);
	g->file = "small.yaml";
	Mesh *m = &g->mesh;
	m->naxes = 2;
	m->name[0] = "a", m->size[0] = 4;
	m->name[1] = "b", m->size[1] = 2;
	mesh_finish(m, &g->arena, NULL);
	Shape local = {1, {2}};
	int x = graph_value(g, "x", DT_F32, &local, VK_INPUT, (Pos){0});
	g->values.a[x].spec = (Spec){.rank = 1, .nax = {1}, .ax = {{0}}};
	g->values.a[x].global = (Shape){1, {8}};
}

/* Add y = collective_permute(last value) with target map t (NULL: shift 1 along a). */
static void add_permute(Graph *g, const char *name, const int *t)
{
	int in = g->values.n - 1;
	Shape s = g->values.a[in].shape;
	int y = graph_value(g, name, DT_F32, &s, VK_INTER, (Pos){0});
	g->values.a[y].spec = g->values.a[in].spec;
	g->values.a[y].global = g->values.a[in].global;
	int id = graph_op(g, OP_COLLECTIVE_PERMUTE, &in, 1, y, (Pos){0});
	Attr *a = g->ops.a[id].attr;
	a->ncax = t ? 2 : 1;
	a->cax[0] = 0, a->cax[1] = 1;
	a->shift = 1;
	a->target = t;
}

static void test_permutes(void **state)
{
	Graph g, back;
	LoadKind kind;
	size_t n;
	int shift[8], swap[8] = {1, 0, 2, 3, 4, 5, -1, 6};
	small_program(&g);
	mesh_shift_targets(&g.mesh, 0, 3, shift);
	add_permute(&g, "p", shift); /* an explicit map that is a shift: written as one */
	g.ops.a[0].attr->ncax = 1;
	add_permute(&g, "q", swap);
	vec_push(&g.outputs, g.values.n - 1);
	char *text = emit_text(&g, -1, &n);
	assert_non_null(strstr(text, "{out: p, op: collective_permute, in: [x], axes: [a], shift: 3,"));
	assert_non_null(strstr(text, "axes: [a, b], targets: [[0, 1], [1, 0], [6, -1], [7, 6]],"));
	load_text(text, "small.yaml", &back, &kind);
	int t[8];
	for (int i = 0; i < 2; i++) {
		emit_permute_targets(&back.mesh, back.ops.a[i].attr, t);
		assert_memory_equal(t, i ? swap : shift, sizeof t);
	}
	free(text);
	text = emit_text(&g, 6, &n); /* device 6 sends to nobody; 7 sends to it */
	assert_non_null(strstr(text, "send_to: -1, recv_from: 7"));
	assert_non_null(strstr(text, "x: {shape: [2], global: [8], dtype: f32, sharding: [a], offset: [6], extent: [2]}"));
	graph_free(&back);
	load_text(text, "small.yaml", &back, &kind);
	assert_int_equal(kind.device, 6);
	free(text);
	graph_free(&back);
	graph_free(&g);
}

/* Constants and fills come back as the same doubles, whatever they are. */
static void test_numbers(void **state)
{
	static const double nums[] = {0.1, 1.0 / 3, -2.5e-300, 5e-324, 1e300, 123456789.0, -0.0, INFINITY, -INFINITY, NAN};
	enum { N = sizeof nums / sizeof *nums };
	Graph g, back;
	LoadKind kind;
	size_t n;
	small_program(&g);
	for (int i = 0; i < N; i++) {
		int in[2] = {g.values.n - 1, 0};
		Shape s0 = {0};
		in[1] = graph_value(&g, "%const", DT_F32, &s0, VK_CONST, (Pos){0});
		g.values.a[in[1]].cval = nums[i];
		char name[16];
		snprintf(name, sizeof name, "v%d", i);
		Shape s = g.values.a[0].shape;
		int y = graph_value(&g, name, DT_F32, &s, VK_INTER, (Pos){0});
		g.values.a[y].spec = g.values.a[0].spec;
		g.values.a[y].global = g.values.a[0].global;
		graph_op(&g, OP_MUL, in, 2, y, (Pos){0});
	}
	vec_push(&g.outputs, g.values.n - 1);
	char *text = emit_text(&g, -1, &n);
	load_text(text, "small.yaml", &back, &kind);
	for (int i = 0; i < N; i++) {
		double got = back.values.a[back.ops.a[i].in[1]].cval;
		if (isnan(nums[i]))
			assert_true(isnan(got));
		else
			assert_memory_equal(&got, &nums[i], sizeof got);
	}
	free(text);
	graph_free(&back);
	graph_free(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixed_points),
		cmocka_unit_test(test_permutes),
		cmocka_unit_test(test_numbers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
