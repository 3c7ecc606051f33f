/* test_op_rules.c: the partitioner's op rules against the reference — local reshapes, fallback reasons, and the op-rule validator.
 *
 * Each case is a tiny model written as YAML text, propagated, partitioned,
 * verified and run on threads; its outputs are compared with the reference
 * executor's.  What the program may communicate is decided independently of
 * the rules: a reshape needs no collective exactly when every device's block
 * of the result holds the same elements (in row-major order) as its block of
 * the operand; an op may run on pending operands locally exactly when the
 * reference says op(a + b) == op(a) + op(b) (or max).
 *
 * The validator (test_op_rules_validator) runs every op of spmd/ops.def with
 * every placement of each operand on 2 and 3 devices, fails on any wrong
 * answer, and keeps docs/op_rules.md — the placements accepted and the
 * missed opportunities, each with its reason — current:
 * `build/tests/test_op_rules --write` (from the repository root) rewrites it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
	int reshards;    /* of them, reshards of the validated op's operands */
	bool why_missing; /* a collective without a reason */
} Outcome;

/* |got - want| <= tol * max |want| everywhere (tol 0: bit for bit); else
 * false with the worst element in why. */
static bool tensors_close(const Tensor *got, const Tensor *want, double tol, char *why, size_t n)
{
	if (!shape_eq(&got->shape, &want->shape)) {
		snprintf(why, n, "shape differs");
		return false;
	}
	int64_t count = shape_numel(&want->shape), at = -1;
	double scale = 0, worst = 0;
	for (int64_t i = 0; i < count; i++)
		scale = fmax(scale, fabs(tensor_f32(want)[i]));
	for (int64_t i = 0; i < count; i++) {
		double e = fabs((double)tensor_f32(got)[i] - tensor_f32(want)[i]);
		if (!(e <= worst) || (tol == 0 && tensor_f32(got)[i] != tensor_f32(want)[i] && at < 0))
			worst = e, at = i;
	}
	if (at < 0 || (tol > 0 && worst <= tol * (scale > 0 ? scale : 1)))
		return true;
	snprintf(why, n, "element %lld: got %.9g, want %.9g", (long long)at, tensor_f32(got)[at], tensor_f32(want)[at]);
	return false;
}

/* Collectives of prog that reshard an operand of the op written on `line`
 * of the model (their reason says "operand ... of OP at FILE:LINE:"). */
static int operand_reshards(const Graph *prog, const char *op, int line)
{
	char key[96];
	snprintf(key, sizeof key, " of %s at case.yaml:%d:", op, line);
	int n = 0;
	for (int i = 0; i < prog->ops.n; i++) {
		const Op *o = &prog->ops.a[i];
		n += (op_table[o->kind].flags & OPF_COLLECTIVE) && o->why && strncmp(o->why, "operand ", 8) == 0 &&
		     strstr(o->why, key);
	}
	return n;
}

/* Load, propagate, partition, verify and run text; compare every output with
 * the reference within tol.  False with the reason in why.  `op`/`line`:
 * count into o->reshards the collectives resharding that op's operands. */
static bool run_text(const char *text, double tol, const char *op, int line, Outcome *o, char *why, size_t n)
{
	Graph g, prog;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	Propagation p = {0};
	graph_init(&prog);
	memset(o, 0, sizeof *o);
	bool ok = false;
	if (model_load_string(&g, text, "case.yaml", &d) != 0) {
		snprintf(why, n, "%s", d.last);
		return false;
	}
	int *map = calloc((size_t)g.values.n, sizeof *map);
	Tensor *given = NULL;
	int64_t *range = NULL;
	if (propagate(&g, NULL, &p, &d) != 0 || partition(&g, &prog, map, NULL, &d) != 0 || graph_verify(&prog, &d) != 0) {
		snprintf(why, n, "%s", d.last);
		goto out;
	}
	for (int i = 0; i < prog.ops.n; i++)
		if (op_table[prog.ops.a[i].kind].flags & OPF_COLLECTIVE) {
			o->ncoll++;
			o->why_missing |= !prog.ops.a[i].why || !prog.ops.a[i].why[0];
			o->nfallback += prog.ops.a[i].why && strstr(prog.ops.a[i].why, "(fallback: ") != NULL;
		}
	if (op)
		o->reshards = operand_reshards(&prog, op, line);
	int nout = g.outputs.n;
	Tensor *got = calloc((size_t)nout, sizeof *got), *vals = calloc((size_t)g.values.n, sizeof *vals);
	spmd_leaf_opts(&g, &prog, map, NULL, 0, &given, &range); /* the reference's id ranges */
	SpmdOpts so = {.seed = 7, .given = given, .id_range = range};
	ExecOpts eo = {.seed = 7};
	if (spmd_run(&prog, &so, got, NULL, &d) != 0 || exec_run(&g, vals, NULL, &eo, &d) != 0)
		snprintf(why, n, "%s", d.last);
	else
		ok = true;
	for (int i = 0; i < nout && ok; i++)
		ok = tensors_close(&got[i], &vals[g.outputs.a[i]], tol, why, n);
	for (int i = 0; i < nout; i++)
		tensor_free(&got[i]);
	exec_free_values(&g, vals);
	free(got), free(vals);
out:
	free(map), free(given), free(range);
	propagation_free(&p);
	graph_free(&prog);
	graph_free(&g);
	return ok;
}

/* run_text exactly, failing the test on any problem. */
static Outcome run_model(const char *text)
{
	Outcome o;
	char why[512];
	if (!run_text(text, 0, NULL, 0, &o, why, sizeof why))
		fail_msg("%s\n%s", why, text);
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

/* The issue's case: [10, 6] -> [5, 2, 6] over 3 devices (blocks of 4, 4, 2
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

/* ---- the op-rule validator ---- */

/* An op instance to validate: its attributes and operands. */
typedef struct {
	const char *op, *attrs; /* attrs: YAML after the operands, "" for none */
	int nin;
	const char *shape[3];   /* YAML shapes */
	const char *dtype[3];   /* "f32" or "i32" */
	unsigned positive;      /* bit i: operand i must be positive (log, div's divisor) */
	double tol;             /* relative tolerance, 0: 1e-4 */
} OpCase;

static const OpCase op_cases[] = {
	{"neg", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"abs", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"exp", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"log", "", 1, {"[5, 4]"}, {"f32"}, 1, 0},
	{"sqrt", "", 1, {"[5, 4]"}, {"f32"}, 1, 0},
	{"rsqrt", "", 1, {"[5, 4]"}, {"f32"}, 1, 0},
	{"tanh", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"sigmoid", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"relu", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"gelu", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"square", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"reciprocal", "", 1, {"[5, 4]"}, {"f32"}, 1, 0},
	{"add", "", 2, {"[5, 4]", "[5, 4]"}, {"f32", "f32"}, 0, 0},
	{"sub", "", 2, {"[5, 4]", "[5, 4]"}, {"f32", "f32"}, 0, 0},
	{"mul", "", 2, {"[5, 4]", "[5, 4]"}, {"f32", "f32"}, 0, 0},
	{"div", "", 2, {"[5, 4]", "[5, 4]"}, {"f32", "f32"}, 2, 0},
	{"max", "", 2, {"[5, 4]", "[5, 4]"}, {"f32", "f32"}, 0, 0},
	{"min", "", 2, {"[5, 4]", "[5, 4]"}, {"f32", "f32"}, 0, 0},
	{"pow", "", 2, {"[5, 4]", "[5, 4]"}, {"f32", "f32"}, 1, 0},
	{"greater", "", 2, {"[5, 4]", "[5, 4]"}, {"f32", "f32"}, 0, 0},
	{"einsum", ", eq: \"ij,jk->ik\"", 2, {"[5, 4]", "[4, 3]"}, {"f32", "f32"}, 0, 0},
	{"reduce_sum", ", axes: [1]", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"reduce_max", ", axes: [1]", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"reduce_mean", ", axes: [1]", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"softmax", ", axis: 1", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"log_softmax", ", axis: 1", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"layer_norm", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"transpose", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"reshape", ", shape: [2, 12]", 1, {"[6, 4]"}, {"f32"}, 0, 0},
	{"broadcast_to", ", shape: [5, 4]", 1, {"[1, 4]"}, {"f32"}, 0, 0},
	{"slice", ", start: [1, 0], limit: [4, 4]", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"concat", ", axis: 1", 2, {"[5, 4]", "[5, 3]"}, {"f32", "f32"}, 0, 0},
	{"pad", ", low: [1, 0], high: [0, 2]", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"conv2d", ", padding: same", 2, {"[2, 5, 5, 3]", "[3, 3, 3, 2]"}, {"f32", "f32"}, 0, 0},
	{"take", "", 2, {"[6, 4]", "[5]"}, {"f32", "i32"}, 0, 0},
	{"one_hot", ", depth: 4", 1, {"[5]"}, {"i32"}, 0, 0},
	/* a pending sum cast to bf16 is reduced in bf16 by design (partition.c,
	 * linear_partial): each summand rounds, so allow a few bf16 ulps */
	{"cast", ", dtype: bf16", 1, {"[5, 4]"}, {"f32"}, 0, 2e-2},
	{"copy", "", 1, {"[5, 4]"}, {"f32"}, 0, 0},
	{"softmax_cross_entropy", "", 2, {"[5, 4]", "[5]"}, {"f32", "i32"}, 0, 0},
	{"mse", "", 2, {"[5, 4]", "[5, 4]"}, {"f32", "f32"}, 0, 0},
	{"softmax_cross_entropy_grad", "", 3, {"[5, 4]", "[5]", "[]"}, {"f32", "i32", "f32"}, 0, 0},
	{"take_grad", ", num_rows: 6", 2, {"[5, 4]", "[5]"}, {"f32", "i32"}, 0, 0},
	{"conv2d_grad_input", ", input_size: [5, 5], padding: same", 2, {"[2, 5, 5, 2]", "[3, 3, 3, 2]"},
	 {"f32", "f32"}, 0, 0},
	{"conv2d_grad_filter", ", kernel_size: [3, 3], padding: same", 2, {"[2, 5, 5, 3]", "[2, 5, 5, 2]"},
	 {"f32", "f32"}, 0, 0},
};

/* A placement of one operand: replicated, split on dim k, pending sum or max. */
enum { PL_REP = -1, PL_SUM = -2, PL_MAX = -3 };

static int shape_rank(const char *shape)
{
	int r = shape[1] != ']';
	for (const char *c = shape; *c; c++)
		r += *c == ',';
	return r;
}

/* Placements of operand i: replicated, each dim, and (floats) sum and max. */
static int placements(const OpCase *c, int i, int *out)
{
	int n = 0, rank = shape_rank(c->shape[i]);
	out[n++] = PL_REP;
	for (int d = 0; d < rank; d++)
		out[n++] = d;
	if (strcmp(c->dtype[i], "f32") == 0)
		out[n++] = PL_SUM, out[n++] = PL_MAX;
	return n;
}

static void placement_name(int pl, char *buf, size_t n)
{
	if (pl == PL_REP)
		snprintf(buf, n, "R");
	else if (pl == PL_SUM)
		snprintf(buf, n, "sum");
	else if (pl == PL_MAX)
		snprintf(buf, n, "max");
	else
		snprintf(buf, n, "S%d", pl);
}

/* "[null, data, null]": dim k of a tensor of rank `rank` split on data (k < 0: none). */
static void dims_text(int rank, int k, char *buf, size_t n)
{
	size_t w = (size_t)snprintf(buf, n, "[");
	for (int d = 0; d < rank; d++)
		w += (size_t)snprintf(buf + w, n - w, "%s%s", d ? ", " : "", d == k ? "data" : "null");
	snprintf(buf + w, n - w, "]");
}

/* The shape with one more trailing dim of size extra: "[5, 4]" -> "[5, 4, 3]". */
static void shape_plus(const char *shape, int extra, char *buf, size_t n)
{
	if (shape[1] == ']')
		snprintf(buf, n, "[%d]", extra);
	else
		snprintf(buf, n, "%.*s, %d]", (int)strlen(shape) - 1, shape, extra);
}

/* Append to t the YAML making operand i (value o<i>) with placement pl on a
 * mesh of ndev devices: an input (made positive if needed), or, for a
 * pending sum or max, a reduction over a trailing dim of size ndev split
 * on data.  Inputs go to `ins`, ops to `ops`. */
static void operand_text(const OpCase *c, int i, int pl, int ndev, char *ins, char *ops, size_t n)
{
	int rank = shape_rank(c->shape[i]);
	char dims[96], shape[64];
	bool pos = c->positive >> i & 1, pending = pl == PL_SUM || pl == PL_MAX;
	const char *src = "p";
	if (pending) {
		char sdims[96];
		shape_plus(c->shape[i], ndev, shape, sizeof shape);
		dims_text(rank + 1, rank, sdims, sizeof sdims);
		snprintf(ins + strlen(ins), n - strlen(ins), "  i%d: {shape: %s, dtype: f32, sharding: %s}\n", i, shape,
		         sdims);
	} else {
		dims_text(rank, pl, dims, sizeof dims);
		snprintf(ins + strlen(ins), n - strlen(ins), "  %c%d: {shape: %s, dtype: %s, sharding: %s}\n",
		         pos ? 'i' : 'o', i, c->shape[i], c->dtype[i], dims);
	}
	if (pos) {
		snprintf(ops + strlen(ops), n - strlen(ops), "  - {out: a%d, op: abs, in: [i%d]}\n", i, i);
		snprintf(ops + strlen(ops), n - strlen(ops), "  - {out: p%d, op: add, in: [a%d, 0.5]}\n", i, i);
	}
	dims_text(rank, -1, dims, sizeof dims);
	if (pending)
		snprintf(ops + strlen(ops), n - strlen(ops),
		         "  - {out: o%d, op: %s, in: [%s%d], axes: [-1], sharding: {dims: %s, partial: %s}}\n", i,
		         pl == PL_SUM ? "reduce_sum" : "reduce_max", pos ? src : "i", i, dims,
		         pl == PL_SUM ? "[data]" : "{axes: [data], reduce: max}");
	else if (pos) {
		dims_text(rank, pl, dims, sizeof dims);
		snprintf(ops + strlen(ops), n - strlen(ops), "  - {out: o%d, op: copy, in: [%s%d], sharding: %s}\n", i,
		         src, i, dims);
	}
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* The model running op case c on operands placed pl[] on `ndev` devices;
 * returns the line of the op (y). */
static int case_text(const OpCase *c, const int *pl, int ndev, char *text, size_t n)
{
	char ins[1024] = "", ops[1024] = "", args[64] = "";
	for (int i = 0; i < c->nin; i++) {
		operand_text(c, i, pl[i], ndev, ins, ops, sizeof ins);
		snprintf(args + strlen(args), sizeof args - strlen(args), "%so%d", i ? ", " : "", i);
	}
	snprintf(text, n, "name: rule\nmesh: {data: %d}\ninputs:\n%sops:\n%s  - {out: y, op: %s, in: [%s]%s}\noutputs: [y]\n",
	         ndev, ins, ops, c->op, args, c->attrs);
	return 4 + count_lines(ins) + count_lines(ops) + 1;
}

/* The reference model asking whether op c is correct computed locally on
 * the summands of its pending operands (the others as they are): y = op on
 * the reduced operands, z = the reduction of op on each summand.  Only for
 * pending operands all of one kind; false otherwise. */
static bool oracle_text(const OpCase *c, const int *pl, char *text, size_t n)
{
	char ins[1024] = "", ops[2048] = "", arg[3][64] = {"", "", ""};
	int kind = 0;
	for (int i = 0; i < c->nin; i++) {
		if (pl[i] >= 0)
			return false; /* a split on the mesh's one axis: the result cannot be both split and pending */
		if (pl[i] == PL_SUM || pl[i] == PL_MAX) {
			if (kind && kind != pl[i])
				return false;
			kind = pl[i];
		}
	}
	if (!kind)
		return false;
	const char *red = kind == PL_SUM ? "add" : "max";
	for (int i = 0; i < c->nin; i++) {
		bool pos = c->positive >> i & 1, pending = pl[i] == PL_SUM || pl[i] == PL_MAX;
		static const char *const part[3] = {"", "a", "b"};
		for (int k = pending ? 1 : 0; k < (pending ? 3 : 1); k++) {
			size_t w = strlen(ins), v = strlen(ops);
			/* the input itself unless made positive: take's ids keep their range */
			snprintf(ins + w, sizeof ins - w, "  %c%d%s: {shape: %s, dtype: %s}\n", pos ? 'i' : 'u', i, part[k],
			         c->shape[i], c->dtype[i]);
			if (pos)
				snprintf(ops + v, sizeof ops - v,
				         "  - {out: q%d%s, op: abs, in: [i%d%s]}\n  - {out: u%d%s, op: add, in: [q%d%s, 0.5]}\n", i,
				         part[k], i, part[k], i, part[k], i, part[k]);
		}
		if (pending) {
			size_t v = strlen(ops);
			snprintf(ops + v, sizeof ops - v, "  - {out: u%d, op: %s, in: [u%da, u%db]}\n", i, red, i, i);
		}
		for (int k = 0; k < 3; k++) {
			size_t w = strlen(arg[k]);
			snprintf(arg[k] + w, sizeof arg[k] - w, "%su%d%s", i ? ", " : "", i, pending ? part[k] : "");
		}
	}
	snprintf(text, n,
	         "name: oracle\ninputs:\n%sops:\n%s  - {out: y, op: %s, in: [%s]%s}\n  - {out: y1, op: %s, in: [%s]%s}\n"
	         "  - {out: y2, op: %s, in: [%s]%s}\n  - {out: z, op: %s, in: [y1, y2]}\noutputs: [y, z]\n",
	         ins, ops, c->op, arg[0], c->attrs, c->op, arg[1], c->attrs, c->op, arg[2], c->attrs, red);
	return true;
}

/* Is op c correct computed locally on its operands' summands (oracle_text)? */
static bool local_ok(const OpCase *c, const int *pl)
{
	char text[4096], why[256];
	if (!oracle_text(c, pl, text, sizeof text))
		return false;
	Graph g;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	if (model_load_string(&g, text, "oracle.yaml", &d) != 0)
		fail_msg("%s\n%s", d.last, text);
	Tensor *vals = calloc((size_t)g.values.n, sizeof *vals);
	ExecOpts eo = {.seed = 11};
	if (exec_run(&g, vals, NULL, &eo, &d) != 0)
		fail_msg("%s\n%s", d.last, text);
	bool ok = tensors_close(&vals[g.outputs.a[0]], &vals[g.outputs.a[1]], 1e-4, why, sizeof why);
	exec_free_values(&g, vals);
	free(vals);
	graph_free(&g);
	return ok;
}

/* Why the rules reshard where a local computation would be right.  Every
 * missed opportunity the validator finds must fall under one of these (its
 * op listed for the kind of its pending operands), else the test fails. */
static const char *const sum_linear[] = {
	"einsum", "conv2d", "conv2d_grad_input", "conv2d_grad_filter", "reduce_sum", "reduce_mean", "transpose",
	"reshape", "broadcast_to", "slice", "pad", "concat", "take", "take_grad",
	"softmax_cross_entropy_grad", /* in its scalar g: reduced first, 4 bytes */
	NULL,
};
static const char *const max_monotone[] = {
	"exp", "log", "sqrt", "tanh", "sigmoid", "relu", "add", "sub", "div", "max", "min", "greater", "copy",
	"cast", "transpose", "reshape", "broadcast_to", "slice", "pad", "concat", "reduce_max", "take", "take_grad",
	NULL,
};

static bool listed(const char *const *list, const char *op)
{
	for (; *list; list++)
		if (strcmp(*list, op) == 0)
			return true;
	return false;
}

static const char *explanation(const char *op, const int *pl, int nin)
{
	bool sum = false;
	for (int i = 0; i < nin; i++)
		sum |= pl[i] == PL_SUM;
	if (sum && listed(sum_linear, op))
		return "linear";
	if (!sum && listed(max_monotone, op))
		return "monotone";
	return NULL;
}

static bool write_table; /* --write: rewrite docs/op_rules.md instead of comparing */

/* Text builders are open_memstream streams (wrong answers, the missed
 * opportunities, the table). */

/* Per op: counts over every placement and mesh. */
typedef struct {
	int run, accepted, wrong;
} OpCount;

/* One placement of op case c's operands on ndev devices: a wrong answer
 * goes to `wrong`; returns whether it is a missed opportunity. */
static bool validate_one(const OpCase *c, const int *pl, const char *names, int ndev, OpCount *cnt, FILE *wrong)
{
	char text[4096], why[512];
	int line = case_text(c, pl, ndev, text, sizeof text);
	Outcome o;
	cnt->run++;
	if (!run_text(text, c->tol > 0 ? c->tol : 1e-4, c->op, line, &o, why, sizeof why)) {
		cnt->wrong++;
		fprintf(wrong, "%s (%s) on %d devices: %s\n%s\n", c->op, names, ndev, why, text);
		return false;
	}
	cnt->accepted += o.reshards == 0;
	return o.reshards > 0 && local_ok(c, pl);
}

/* Op case c, every combination of operand placements, on 2 and 3 devices:
 * wrong answers go to `wrong`, missed opportunities to `missed`. */
static void validate_case(const OpCase *c, OpCount *cnt, FILE *wrong, FILE *missed, int *nunexplained)
{
	int pls[3][8], np[3] = {1, 1, 1}, pl[3] = {0};
	for (int i = 0; i < c->nin; i++)
		np[i] = placements(c, i, pls[i]);
	for (int k = 0; k < np[0] * np[1] * np[2]; k++) {
		char names[64] = "", devices[16] = "";
		for (int i = 0, r = k; i < c->nin; r /= np[i], i++) {
			char nm[16];
			pl[i] = pls[i][r % np[i]];
			placement_name(pl[i], nm, sizeof nm);
			snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", nm);
		}
		for (int ndev = 2; ndev <= 3; ndev++)
			if (validate_one(c, pl, names, ndev, cnt, wrong))
				snprintf(devices + strlen(devices), sizeof devices - strlen(devices), "%s%d",
				         devices[0] ? ", " : "", ndev);
		if (!devices[0])
			continue;
		const char *e = explanation(c->op, pl, c->nin);
		*nunexplained += e == NULL;
		fprintf(missed, "| `%s` | %s | %s | %s |\n", c->op, names, devices, e ? e : "**unexplained**");
	}
}

static void table_text(FILE *out, const OpCount *cnt, const char *missed)
{
	fprintf(out, "# Op rules: placements and missed opportunities\n\n"
	          "Generated by `tests/test_op_rules.c` (`test_op_rules_validator`): run\n"
	          "`build/tests/test_op_rules --write` from the repository root to rewrite\n"
	          "this file; the test fails when it is stale.\n\n"
	          "For every op of `spmd/ops.def` that a model may use (one instance each,\n"
	          "shapes that split unevenly over 2 and 3 devices) and every placement of\n"
	          "each operand — `R` replicated, `S<d>` split on dim d, `sum` a pending\n"
	          "sum, `max` a pending max — on meshes of 2 and 3 devices, the validator\n"
	          "partitions a model whose operands are annotated so, runs it on threads\n"
	          "and compares the output with the reference executor (within 1e-4 of\n"
	          "the largest value; 2e-2 for `cast` to bf16, since a pending sum cast\n"
	          "to bf16 is reduced in bf16 by design, each summand rounded).\n\n"
	          "A placement is *accepted* when the partitioner emits no collective\n"
	          "to reshard the op's operands (it may still communicate inside the\n"
	          "op, as split softmax statistics do).\n\n"
	          "A *missed opportunity* is a placement the rules reshard although the op\n"
	          "computed locally on each device's summands, with the result pending in\n"
	          "the same reduction, is right: the reference executor checks\n"
	          "`op(a + b) == op(a) + op(b)` (or `max`) with the other operands as they\n"
	          "are. Splits are the factor rules' business (docs/algorithms.md §1):\n"
	          "a split they reshard lies on a replicated-kind factor, whose local\n"
	          "computation would need per-device attributes or halos; this table\n"
	          "does not search those.\n\n"
	          "Wrong answers: 0 (the test fails on any).\n\n"
	          "| op | placements run | accepted |\n| --- | --- | --- |\n");
	for (size_t i = 0; i < sizeof op_cases / sizeof *op_cases; i++)
		fprintf(out, "| `%s` | %d | %d |\n", op_cases[i].op, cnt[i].run, cnt[i].accepted);
	fprintf(out, "\n## Missed opportunities\n\n"
	          "Why the rules reshard first, by the reason named in the table:\n\n"
	          "- **linear**: the op is linear in its pending operand, but the rules\n"
	          "  carry a pending sum only through neg, copy, cast, add, sub, mul and\n"
	          "  div (`linear_partial` in partitioner/partition.c, which the\n"
	          "  pending-sum rule of issue 11 item 1 extends): the sum is reduced\n"
	          "  first, one all_reduce that a later one would have covered.\n"
	          "- **monotone**: a pending max passes unchanged through a\n"
	          "  non-decreasing op (and through data movement, and `max`/`add`/`sub`\n"
	          "  with a replicated operand), but the rules carry no pending max past\n"
	          "  any op: it is reduced first. Pending maxes arise only from\n"
	          "  `reduce_max` over a split dim, so this costs one all_reduce(max)\n"
	          "  placed earlier than needed, never extra data.\n\n"
	          "The oracle checks one random sample; `take_grad (max, R)` holds\n"
	          "only while no id repeats.\n\n");
	if (missed[0])
		fprintf(out, "| op | operands | devices | reason |\n| --- | --- | --- | --- |\n%s", missed);
	else
		fprintf(out, "None.\n");
}

/* A stream into a growing buffer. */
typedef struct {
	char *a;
	size_t n;
	FILE *f;
} Text;

static void text_open(Text *t)
{
	t->a = NULL, t->n = 0;
	t->f = open_memstream(&t->a, &t->n);
	assert_non_null(t->f);
}

/* Compare path's contents with t (or, with --write, write t there). */
static void table_check(const char *path, const Text *t)
{
	if (write_table) {
		FILE *f = fopen(path, "w");
		assert_non_null(f);
		fputs(t->a, f);
		fclose(f);
		return;
	}
	FILE *f = fopen(path, "r");
	char *have = calloc(1, t->n + 2);
	size_t got = f ? fread(have, 1, t->n + 1, f) : 0;
	if (f)
		fclose(f);
	bool same = got == t->n && memcmp(have, t->a, t->n) == 0;
	free(have);
	if (!same)
		fail_msg("%s is stale: run build/tests/test_op_rules --write from the repository root", path);
}

static void test_op_rules_validator(void **state)
{
	(void)state;
	enum { NCASES = sizeof op_cases / sizeof *op_cases };
	OpCount cnt[NCASES];
	Text wrong, missed, table;
	int nunexplained = 0;
	memset(cnt, 0, sizeof cnt);
	text_open(&wrong), text_open(&missed), text_open(&table);
	for (int i = 0; i < NCASES; i++)
		validate_case(&op_cases[i], &cnt[i], wrong.f, missed.f, &nunexplained);
	fclose(wrong.f), fclose(missed.f);
	if (wrong.n) {
		fputs(wrong.a, stderr);
		fail_msg("wrong answers (above)");
	}
	table_text(table.f, cnt, missed.a);
	fclose(table.f);
	table_check("docs/op_rules.md", &table);
	if (nunexplained) {
		fputs(missed.a, stderr);
		fail_msg("%d missed opportunities without an explanation (above)", nunexplained);
	}
	free(wrong.a), free(missed.a), free(table.a);
}

int main(int argc, char **argv)
{
	write_table = argc > 1 && strcmp(argv[1], "--write") == 0;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reshape_uneven_pinned),
		cmocka_unit_test(test_reshape_blocks),
		cmocka_unit_test(test_fallback_reported),
		cmocka_unit_test(test_op_rules_validator),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
