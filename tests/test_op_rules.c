/* test_op_rules.c: the partitioner's op rules against the reference — reshapes that keep every device's block stay local.
 *
 * Each case is a tiny model written as YAML text, propagated, partitioned,
 * verified and run on threads; its outputs must equal the reference
 * executor's bit for bit (the ops here only move data).  What the program
 * may communicate is decided independently of the rules: a reshape needs no
 * collective exactly when every device's block of the result holds the same
 * elements (in row-major order) as its block of the operand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include "../partitioner/partition.h"
#include "../partitioner/propagate.h"
#include "../runtime/exec.h"
#include "../runtime/spmd_run.h"
#include "../spmd/load.h"

/* ---- running a model ---- */

typedef struct {
	int ncoll;       /* collectives in the partitioned program */
	int nfallback;   /* of them, fallback gathers (their reason says so) */
	bool why_missing; /* a collective without a reason */
} Outcome;

static void tensors_equal(const Tensor *got, const Tensor *want, const char *name, const char *text)
{
	if (!shape_eq(&got->shape, &want->shape) ||
	    memcmp(got->data, want->data, (size_t)shape_numel(&want->shape) * sizeof(float)) != 0)
		fail_msg("output %s differs from the reference:\n%s", name, text);
}

/* Load, propagate, partition, verify and run text; compare every output with
 * the reference exactly.  Fails the test on any problem. */
static Outcome run_model(const char *text)
{
	Graph g, prog;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	Propagation p = {0};
	graph_init(&prog);
	if (model_load_string(&g, text, "case.yaml", &d) != 0 || propagate(&g, NULL, &p, &d) != 0 ||
	    partition(&g, &prog, NULL, NULL, &d) != 0 || graph_verify(&prog, &d) != 0)
		fail_msg("%s\n%s", d.last, text);
	Outcome o = {0};
	for (int i = 0; i < prog.ops.n; i++)
		if (op_table[prog.ops.a[i].kind].flags & OPF_COLLECTIVE) {
			o.ncoll++;
			o.why_missing |= !prog.ops.a[i].why || !prog.ops.a[i].why[0];
			o.nfallback += prog.ops.a[i].why && strstr(prog.ops.a[i].why, "(fallback: ") != NULL;
		}
	int nout = g.outputs.n;
	Tensor *got = calloc((size_t)nout, sizeof *got), *vals = calloc((size_t)g.values.n, sizeof *vals);
	SpmdOpts so = {.seed = 7};
	ExecOpts eo = {.seed = 7};
	if (spmd_run(&prog, &so, got, NULL, &d) != 0 || exec_run(&g, vals, NULL, &eo, &d) != 0)
		fail_msg("%s\n%s", d.last, text);
	for (int i = 0; i < nout; i++) {
		tensors_equal(&got[i], &vals[g.outputs.a[i]], g.values.a[g.outputs.a[i]].name, text);
		tensor_free(&got[i]);
	}
	exec_free_values(&g, vals);
	free(got), free(vals);
	propagation_free(&p);
	graph_free(&prog);
	graph_free(&g);
	return o;
}

/* ---- reshapes ---- */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Elements [lo, hi) (row-major) of block k of a dim of size D split n ways,
 * each row `row` elements long. */
static void block_elems(int64_t D, int64_t n, int64_t row, int64_t k, int64_t *lo, int64_t *hi)
{
	int64_t c = cdiv(D, n), a = k * c < D ? k * c : D, b = (k + 1) * c < D ? (k + 1) * c : D;
	*lo = a * row, *hi = b * row;
}

/* Does every shard hold the same elements when dim 0 of size Da (rows of
 * ra elements) and dim 0 of size Db (rows of rb) are split n ways? */
static bool same_blocks(int64_t Da, int64_t ra, int64_t Db, int64_t rb, int64_t n)
{
	for (int64_t k = 0; k < n; k++) {
		int64_t a0, a1, b0, b1;
		block_elems(Da, n, ra, k, &a0, &a1);
		block_elems(Db, n, rb, k, &b0, &b1);
		if ((a1 > a0 || b1 > b0) && (a0 != b0 || a1 != b1))
			return false;
	}
	return true;
}

static void put_shape(char *buf, size_t n, const int64_t *s, int rank)
{
	size_t k = (size_t)snprintf(buf, n, "[");
	for (int i = 0; i < rank; i++)
		k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)s[i]);
	snprintf(buf + k, n - k, "]");
}

/* x [D, 3] split on dim 0 over `split` (a mesh text, ways in all) reshaped
 * to `to` (its dim 0 split the same way) and back: no collective exactly
 * when the blocks agree, else collectives with reasons; the data always
 * right.  Returns 1 if the case was local. */
static int reshape_case(const char *mesh, const char *split, int64_t ways, int64_t D, const int64_t *to, int rank)
{
	char text[1024], ts[64], nulls[64] = "";
	put_shape(ts, sizeof ts, to, rank);
	for (int i = 1; i < rank; i++)
		strcat(nulls, ", null");
	snprintf(text, sizeof text,
	         "name: reshape_case\nmesh: %s\ninputs:\n  x: {shape: [%lld, 3], dtype: f32, sharding: [%s, null]}\n"
	         "ops:\n  - {out: y, op: reshape, shape: %s, in: [x], sharding: [%s%s]}\n"
	         "  - {out: z, op: reshape, shape: [%lld, 3], in: [y], sharding: [%s, null]}\noutputs: [y, z]\n",
	         mesh, (long long)D, split, ts, split, nulls, (long long)D, split);
	int64_t row = 1;
	for (int i = 1; i < rank; i++)
		row *= to[i];
	bool local = same_blocks(D, 3, to[0], row, ways);
	Outcome o = run_model(text);
	if (local && o.ncoll)
		fail_msg("the blocks agree, yet %d collectives:\n%s", o.ncoll, text);
	if (!local && (!o.ncoll || o.why_missing))
		fail_msg("the blocks differ: expected collectives with reasons, found %d:\n%s", o.ncoll, text);
	return local;
}

/* Every D in 1..13 with each divisor F: [D, 3] -> [F, D/F, 3] (split of the
 * major dim), -> [F, 3 D/F] (split and merge), -> [3 D] (merge into one
 * dim), on 2, 3 and 4 devices and on 2x3 split [[data, model], null]. */
static void test_reshape_blocks(void **state)
{
	(void)state;
	static const struct {
		const char *mesh, *split;
		int64_t ways;
	} meshes[] = {
		{"{data: 2}", "data", 2},
		{"{data: 3}", "data", 3},
		{"{data: 4}", "data", 4},
		{"{data: 2, model: 3}", "[data, model]", 6},
	};
	int n = 0, local = 0;
	for (size_t m = 0; m < sizeof meshes / sizeof *meshes; m++)
		for (int64_t D = 1; D <= 13; D++) {
			local += reshape_case(meshes[m].mesh, meshes[m].split, meshes[m].ways, D, (int64_t[]){3 * D}, 1);
			n++;
			for (int64_t F = 2; F < D; F++) {
				if (D % F)
					continue;
				local += reshape_case(meshes[m].mesh, meshes[m].split, meshes[m].ways, D,
				                      (int64_t[]){F, D / F, 3}, 3);
				local += reshape_case(meshes[m].mesh, meshes[m].split, meshes[m].ways, D,
				                      (int64_t[]){F, 3 * (D / F)}, 2);
				n += 2;
			}
		}
	print_message("%d reshapes, %d local\n", n, local);
}

/* The case: [10, 6] -> [5, 2, 6] over 3 devices (blocks of 4, 4, 2
 * rows either way) is local. */
static void test_reshape_uneven_pinned(void **state)
{
	(void)state;
	Outcome o = run_model("name: r\nmesh: {data: 3}\ninputs:\n  x: {shape: [10, 6], dtype: f32, sharding: [data, null]}\n"
	                      "ops:\n  - {out: y, op: reshape, shape: [5, 2, 6], in: [x]}\noutputs: [y]\n");
	assert_int_equal(o.ncoll, 0);
}

/* A gather that a later slice cuts again is a fallback, and the partition
 * report's reason says so ([data] -> [[data, model]] on 5 rows: no
 * collective lines the blocks up); moving a split between axes of other
 * sizes on an even dim is not. */
static void test_fallback_reported(void **state)
{
	(void)state;
	Outcome o = run_model("name: f\nmesh: {data: 2, model: 4}\ninputs:\n"
	                      "  x: {shape: [5, 16], dtype: f32, sharding: [data, null]}\n"
	                      "ops:\n  - {out: y, op: neg, in: [x], sharding: [[data, model], null]}\noutputs: [y]\n");
	assert_true(o.ncoll > 0);
	assert_true(o.nfallback > 0);
	o = run_model("name: f\nmesh: {data: 2, model: 4}\ninputs:\n"
	              "  x: {shape: [8, 16], dtype: f32, sharding: [data, null]}\n"
	              "ops:\n  - {out: y, op: neg, in: [x], sharding: [model, null]}\noutputs: [y]\n");
	assert_true(o.ncoll > 0);
	assert_int_equal(o.nfallback, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reshape_uneven_pinned),
		cmocka_unit_test(test_reshape_blocks),
		cmocka_unit_test(test_fallback_reported),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
