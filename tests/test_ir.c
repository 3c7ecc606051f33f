/* test_ir.c: graph construction and the verifier. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_op_table_names),
		cmocka_unit_test(test_arena),
		cmocka_unit_test(test_parallel_for),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
