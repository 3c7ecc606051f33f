/* test_ir.c: graph construction and the verifier. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "../spmd/ops.h"

static void test_op_table_names(void **state)
{
	(void)state;
	assert_int_equal(op_find("einsum"), OP_EINSUM);
	assert_int_equal(op_find("nope"), -1);
	for (int i = 0; i < OP_COUNT; i++)
		assert_int_equal(op_find(op_table[i].name), i);
}

static void test_arena(void **state)
{
	(void)state;
	Arena a;
	arena_init(&a);
	for (int i = 0; i < 1000; i++) {
		char *p = arena_alloc(&a, (size_t)i * 7 + 1);
		assert_int_equal((uintptr_t)p % 16, 0);
		assert_int_equal(p[0], 0);
	}
	assert_string_equal(arena_strdup(&a, "abc"), "abc");
	arena_free(&a);
}

/* parallel_for visits every index once, whatever the thread count. */
static void visit(void *ctx, int i)
{
	int *seen = ctx;
	seen[i]++;
}

static void test_parallel_for(void **state)
{
	(void)state;
	enum { N = 1000 };
	static int seen[N];
	const int jobs[] = {1, 2, 3, PARALLEL_MAX + 5, 0, -1};
	for (size_t j = 0; j < sizeof jobs / sizeof *jobs; j++)
		for (int n = 0; n <= N; n += N / 2 + 1) {
			memset(seen, 0, sizeof seen);
			parallel_for(n, jobs[j], visit, seen);
			for (int i = 0; i < N; i++)
				assert_int_equal(seen[i], i < n);
		}
	assert_true(cpu_count() >= 1 && cpu_count() <= PARALLEL_MAX);
}

/* graph_find_many finds as graph_find does: the first value of a name,
 * -1 for a name no value has, on a table that grows past its start. */
static void test_find_many(void **state)
{
	(void)state;
	Graph g;
	graph_init(&g);
	Shape sh = {0};
	char name[32];
	enum { N = 300 };
	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof name, "v%d", i % 250); /* names 0..49 twice */
		graph_value(&g, name, DT_F32, &sh, VK_INPUT, (Pos){0});
	}
	const char *names[] = {"v0", "v49", "v50", "v249", "v250", "", "v", "v1x"};
	int n = (int)(sizeof names / sizeof *names), ids[8];
	graph_find_many(&g, names, n, ids);
	for (int k = 0; k < n; k++)
		assert_int_equal(ids[k], graph_find(&g, names[k]));
	assert_int_equal(ids[0], 0), assert_int_equal(ids[1], 49), assert_int_equal(ids[4], -1);
	graph_find_many(&g, names, 0, ids); /* none asked */
	graph_free(&g);
	Graph empty;
	graph_init(&empty);
	graph_find_many(&empty, names, n, ids);
	for (int k = 0; k < n; k++)
		assert_int_equal(ids[k], -1);
	graph_free(&empty);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_op_table_names),
		cmocka_unit_test(test_arena),
		cmocka_unit_test(test_parallel_for),
		cmocka_unit_test(test_find_many),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
