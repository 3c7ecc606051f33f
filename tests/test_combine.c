/* test_combine.c: combining small collectives (partitioner/combine.c) — same results bit for bit, fewer collectives, no cycles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include "../partitioner/combine.h"
#include "../runtime/spmd_run.h"
#include "../spmd/emit.h"
#include "../spmd/load.h"
#include "../spmd/ops.h"

/* Every device holds different data (the inputs are split over both axes),
 * and the tensors are split on different dims (rb and ge on the last of
 * three, whose perm to the front is not its own inverse): a block landing
 * on the wrong member, or a transpose undone wrongly, changes an output.  s1
 * and s3 are sums that a consumer (t) reads between them in program
 * order; s2 is a max, which may not join them. */
static const char prog_text[] =
	"spmd: true\n"
	"mesh: {x: 2, y: 2}\n"
	"inputs:\n"
	"  a: {shape: [4, 8], global: [16, 8], sharding: [[x, y], null]}\n"
	"  b: {shape: [2, 3, 4], global: [8, 3, 4], sharding: [[x, y], null, null]}\n"
	"  c: {shape: [4], global: [16], sharding: [[x, y]]}\n"
	"  e: {shape: [2, 3, 2], global: [2, 3, 8], sharding: [null, null, [x, y]]}\n"
	"ops:\n"
	"  - {out: pa, op: mul, in: [a, 2], sharding: {dims: [null, null], partial: [x, y]}, global: [4, 8]}\n"
	"  - {out: ra, op: reduce_scatter, in: [pa], axes: [x, y], dim: 1, sharding: [null, [x, y]]}\n"
	"  - {out: pb, op: mul, in: [b, 3], sharding: {dims: [null, null, null], partial: [x, y]}, global: [2, 3, 4]}\n"
	"  - {out: rb, op: reduce_scatter, in: [pb], axes: [x, y], dim: 2, sharding: [null, null, [x, y]]}\n"
	"  - {out: pc, op: neg, in: [c], sharding: {dims: [null], partial: [x, y]}, global: [4]}\n"
	"  - {out: rc, op: reduce_scatter, in: [pc], axes: [x, y], dim: 0, sharding: [[x, y]]}\n"
	"  - {out: ga, op: all_gather, in: [a], axes: [x, y], dim: 0, sharding: [null, null]}\n"
	"  - {out: gb, op: all_gather, in: [b], axes: [x, y], dim: 0, sharding: [null, null, null]}\n"
	"  - {out: ge, op: all_gather, in: [e], axes: [x, y], dim: 2, sharding: [null, null, null]}\n"
	"  - {out: s1p, op: reduce_sum, in: [a], axes: [0, 1], sharding: {dims: [], partial: [x, y]}, global: []}\n"
	"  - {out: s1, op: all_reduce, in: [s1p], axes: [x, y], sharding: []}\n"
	"  - {out: t, op: add, in: [s1, 1]}\n"
	"  - {out: s2p, op: reduce_max, in: [b], axes: [0, 1, 2], sharding: {dims: [], partial: {axes: [x, y], reduce: max}}, global: []}\n"
	"  - {out: s2, op: all_reduce, in: [s2p], axes: [x, y], reduce: max, sharding: []}\n"
	"  - {out: s3p, op: reduce_sum, in: [c], axes: [0], sharding: {dims: [], partial: [x, y]}, global: []}\n"
	"  - {out: s3, op: all_reduce, in: [s3p], axes: [x, y], sharding: []}\n"
	"outputs: [ra, rb, rc, ga, gb, ge, t, s2, s3]\n";

static void load(Graph *g, const char *text)
{
	Diag d;
	diag_init(&d);
	LoadKind k;
	int rc = program_load_string(g, text, "prog.yaml", &k, &d);
	if (rc != 0)
		fail_msg("does not load: %s", d.last);
	assert_true(k.spmd);
}

static int count_collectives(const Graph *g, OpKind kind)
{
	int n = 0;
	for (int i = 0; i < g->ops.n; i++)
		n += g->ops.a[i].kind == kind;
	return n;
}

/* Run both programs on threads; every output the same, bit for bit. */
static void same_outputs(const Graph *a, const Graph *b)
{
	int n = a->outputs.n;
	Tensor *x = calloc((size_t)n, sizeof *x), *y = calloc((size_t)n, sizeof *y);
	SpmdOpts o = {.seed = 7};
	Diag d;
	diag_init(&d);
	assert_int_equal(spmd_run(a, &o, x, NULL, &d), 0);
	assert_int_equal(spmd_run(b, &o, y, NULL, &d), 0);
	for (int i = 0; i < n; i++) {
		assert_true(shape_eq(&x[i].shape, &y[i].shape));
		int64_t numel = shape_numel(&x[i].shape);
		if (memcmp(x[i].data, y[i].data, (size_t)numel * 4) != 0)
			fail_msg("output %s differs after combining", a->values.a[a->outputs.a[i]].name);
		tensor_free(&x[i]), tensor_free(&y[i]);
	}
	free(x), free(y);
}

/* Combine a copy of the program with threshold bytes; check it. */
static void combine_and_compare(int64_t bytes, int nrs, int nag, int nar)
{
	Graph ref, g;
	Diag d;
	diag_init(&d);
	load(&ref, prog_text), load(&g, prog_text);
	int nvalues = g.values.n;
	CombineOpts o = {.group_bytes = bytes};
	assert_int_equal(combine_collectives(&g, &o, &d), 0);
	assert_int_equal(graph_verify(&g, &d), 0);
	for (int v = 0; v < nvalues; v++) /* ids, names and layouts kept */
		assert_string_equal(g.values.a[v].name, ref.values.a[v].name), assert_true(spec_eq(&g.values.a[v].spec, &ref.values.a[v].spec));
	assert_int_equal(count_collectives(&g, OP_REDUCE_SCATTER), nrs);
	assert_int_equal(count_collectives(&g, OP_ALL_GATHER), nag);
	assert_int_equal(count_collectives(&g, OP_ALL_REDUCE), nar);
	for (int i = 0; i < g.ops.n; i++) {
		const Op *op = &g.ops.a[i];
		bool combined = op->why && strncmp(op->why, "combined: ", 10) == 0;
		if ((op_table[op->kind].flags & OPF_COLLECTIVE) && combined)
			assert_int_equal(op->attr->dim, 0);
	}
	same_outputs(&ref, &g);
	for (int dev = -1; dev < 1; dev++) { /* written out, it reads back (device facts checked) and runs alike */
		size_t n;
		char *text = emit_text(&g, dev, &n);
		Graph back;
		load(&back, text);
		if (dev < 0)
			same_outputs(&ref, &back);
		graph_free(&back);
		free(text);
	}
	graph_free(&ref), graph_free(&g);
}

/* Everything small: one reduce_scatter, one all_gather, the two sums as one. */
static void test_combine_all(void **state)
{
	(void)state;
	combine_and_compare(1 << 20, 1, 1, 2);
}

/* Nothing grouped but the scalar sums. */
static void test_combine_scalars_only(void **state)
{
	(void)state;
	combine_and_compare(0, 3, 3, 2);
}

/* Thresholds between the sizes.  Buffers: ra 128 bytes, rb 96, rc 16; ga
 * 512, gb 384, ge 192.  At 100: rb with rc; at 400: the reduce_scatters
 * together, gb with ge. */
static void test_combine_threshold(void **state)
{
	(void)state;
	combine_and_compare(100, 2, 3, 2);
	combine_and_compare(400, 1, 2, 2);
}

/* Groups of two classes that would wait for each other (a1 feeds b1, b2
 * feeds a2): combining must notice and not deadlock the program.  Splitting
 * {a1, a2} breaks the cycle; b1 and b2 may then still run as one. */
static void test_combine_no_cycle(void **state)
{
	(void)state;
	static const char text[] =
		"spmd: true\n"
		"mesh: {x: 2, y: 3}\n"
		"inputs:\n"
		"  p: {shape: [2], global: [4], sharding: [x]}\n"
		"  q: {shape: [2], global: [6], sharding: [y]}\n"
		"ops:\n"
		"  - {out: a1p, op: reduce_sum, in: [p], axes: [0], sharding: {dims: [], partial: [x]}, global: []}\n"
		"  - {out: a1, op: all_reduce, in: [a1p], axes: [x], sharding: []}\n"
		"  - {out: b2p, op: reduce_sum, in: [q], axes: [0], sharding: {dims: [], partial: [y]}, global: []}\n"
		"  - {out: b2, op: all_reduce, in: [b2p], axes: [y], sharding: []}\n"
		"  - {out: a2p, op: mul, in: [a1p, b2], sharding: {dims: [], partial: [x]}, global: []}\n"
		"  - {out: a2, op: all_reduce, in: [a2p], axes: [x], sharding: []}\n"
		"  - {out: b1p, op: mul, in: [b2p, a1], sharding: {dims: [], partial: [y]}, global: []}\n"
		"  - {out: b1, op: all_reduce, in: [b1p], axes: [y], sharding: []}\n"
		"outputs: [a2, b1]\n";
	Graph ref, g;
	Diag d;
	diag_init(&d);
	load(&ref, text), load(&g, text);
	CombineOpts o = {.group_bytes = 1 << 20};
	assert_int_equal(combine_collectives(&g, &o, &d), 0);
	assert_int_equal(graph_verify(&g, &d), 0);
	assert_int_equal(count_collectives(&g, OP_ALL_REDUCE), 3);
	same_outputs(&ref, &g);
	graph_free(&ref), graph_free(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_combine_all),
		cmocka_unit_test(test_combine_scalars_only),
		cmocka_unit_test(test_combine_threshold),
		cmocka_unit_test(test_combine_no_cycle),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
