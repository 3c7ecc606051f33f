/* test_ir.c: graph construction and the verifier. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_op_table_names),
		cmocka_unit_test(test_arena),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
