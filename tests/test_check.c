/* test_check.c: --check finds broken training programs (cli/check.h) and passes the same programs unbroken.
 *
 * Each case partitions examples/train_mlp.yaml (mesh {data: 2, model: 2})
 * with SGD or Adam, weight-update sharding off or on, breaks the program as
 * a faulty partitioner could — a dropped collective, a wrong replica group,
 * a gradient summed twice, a shard off by one — runs 3 steps on threads and
 * judges them as `spmd run --check` does: the broken program must mismatch
 * (1: replicas that differ, or outputs beyond the tolerance), the same
 * program unbroken must not (0); the same for a pipelined step whose send
 * goes to the wrong replica.  And the rule on special values: NaN and
 * inf agree in the same places only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "../cli/check.h"
#include "../partitioner/pipeline.h"
#include "../runtime/exec.h"
#include "../runtime/train_run.h"
#include "../spmd/load.h"
#include "../spmd/ops.h"
#include "../train/train.h"

enum { STEPS = 3 };
typedef enum { INTACT, DROP, WRONG_GROUP, TWICE, OFF_BY_ONE, WRONG_PARTNER } Fault;

/* The first collective of kind k over the mesh axis 0 (data) that reduces
 * gradients (not the loss, value `loss` of p), or -1. */
static int find_collective(const Graph *p, int loss, OpKind k)
{
	for (int i = 0; i < p->ops.n; i++)
		if (p->ops.a[i].kind == k && p->ops.a[i].attr->ncax == 1 && p->ops.a[i].attr->cax[0] == 0 &&
		    p->ops.a[i].out != loss)
			return i;
	return -1;
}

/* Insert after op i an op of kind k (attributes a) reading op i's result;
 * every later reader of that result, and the outputs, read the new one. */
static void insert_after(Graph *p, int i, OpKind k, const Attr *a)
{
	int v = p->ops.a[i].out;
	int nv = graph_value(p, "broken", p->values.a[v].dtype, &p->values.a[v].shape, VK_INTER, p->ops.a[i].pos);
	Value keep = p->values.a[nv];
	p->values.a[nv] = p->values.a[v];
	p->values.a[nv].name = keep.name;
	for (int j = i + 1; j < p->ops.n; j++)
		for (int q = 0; q < p->ops.a[j].nin; q++)
			p->ops.a[j].in[q] = p->ops.a[j].in[q] == v ? nv : p->ops.a[j].in[q];
	for (int j = 0; j < p->outputs.n; j++)
		p->outputs.a[j] = p->outputs.a[j] == v ? nv : p->outputs.a[j];
	int o = graph_op(p, k, &v, 1, nv, p->ops.a[i].pos);
	*p->ops.a[o].attr = *a;
	Op moved = p->ops.a[o];
	memmove(&p->ops.a[i + 2], &p->ops.a[i + 1], sizeof moved * (size_t)(o - i - 1));
	p->ops.a[i + 1] = moved;
	for (int j = 0; j < p->ops.n; j++)
		p->values.a[p->ops.a[j].out].producer = j;
}

/* Break prog as fault says (the gradients' reduction: an all_reduce, or
 * with weight-update sharding a reduce_scatter); false when it has no op
 * to break. */
static bool corrupt(Graph *p, int loss, Fault fault)
{
	int ar = find_collective(p, loss, OP_ALL_REDUCE), rs = find_collective(p, loss, OP_REDUCE_SCATTER);
	int c = rs >= 0 ? rs : ar;
	Attr shift = {.ncax = 1, .shift = 1};
	switch (fault) {
	case INTACT: return true;
	case DROP: /* the gradients' all_reduce becomes a copy */
		if (ar < 0)
			return false;
		p->ops.a[ar].kind = OP_COPY;
		return true;
	case WRONG_GROUP: /* reduced over model instead of data */
		if (c < 0)
			return false;
		p->ops.a[c].attr->cax[0] = 1;
		return true;
	case TWICE:
		if (c < 0)
			return false;
		insert_after(p, c, OP_ALL_REDUCE, &(Attr){.ncax = 1, .cax = {0}, .reduce = p->ops.a[c].attr->reduce});
		return true;
	case OFF_BY_ONE: /* each data replica holds its neighbour's shard of the reduced gradient */
		if (rs < 0)
			return false;
		insert_after(p, rs, OP_COLLECTIVE_PERMUTE, &shift);
		return true;
	case WRONG_PARTNER: /* a pipeline's first send reaches the next stage's other data replica */
		for (int i = 0; i < p->ops.n; i++)
			if (p->ops.a[i].stage_to >= 0) {
				int *t = (int *)p->ops.a[i].attr->target;
				for (int d = 0; d < p->mesh.ndev; d++)
					t[d] = t[d] >= 0 ? t[d] ^ 1 : -1; /* {stage: 2, data: 2}: data is the low bit */
				return true;
			}
		return false;
	}
	return false;
}

/* The training step of g on the reference; noise > 0: a noise run. */
static void run_ref(const Graph *g, int noise, Tensor *outs)
{
	const Train *t = g->train;
	Diag d;
	diag_init(&d);
	Tensor *vals = xcalloc((size_t)g->values.n + 1, sizeof *vals);
	StepOpts s = {STEPS, t->ncarry, t->carry_from, t->carry_to, NULL, NULL, NULL, noise ? CHECK_JITTER : 0,
	              (uint64_t)noise};
	assert_int_equal(train_run_ref(g, vals, 0, &s, outs, &d), 0);
	exec_free_values(g, vals);
	free(vals);
}

/* The partitioned step on threads: 0, or SPMD_RUN_DISAGREE (replicas of an output differ). */
static int run_prog(const Graph *g, Graph *prog, const int *map, Tensor *outs)
{
	const Train *t = g->train;
	Diag d;
	diag_init(&d);
	Tensor *given;
	int64_t *range;
	spmd_leaf_opts(g, prog, map, NULL, 0, &given, &range);
	int *from = xmalloc(sizeof(int) * (size_t)(t->ncarry + 1)), *to = xmalloc(sizeof(int) * (size_t)(t->ncarry + 1));
	for (int i = 0; i < t->ncarry; i++)
		from[i] = map[t->carry_from[i]], to[i] = map[t->carry_to[i]];
	SpmdOpts o = {.seed = 0, .given = given, .id_range = range};
	StepOpts s = {STEPS, t->ncarry, from, to, NULL, NULL, NULL, 0, 0};
	d.quiet = true;
	int rc = train_run_threads(prog, &o, &s, outs, &d);
	assert_true(rc == 0 || rc == SPMD_RUN_DISAGREE);
	free(given), free(range), free(from), free(to);
	return rc;
}

/* A noise run of the reference (check_noise_runs' CheckRunFn). */
static int noise_run(void *g, Tensor *outs, int noise)
{
	run_ref(g, noise, outs);
	return 0;
}

/* check_train's verdict on model (train_mlp, or a pipeline) with optimizer opt, weight-update sharding wus,
 * broken by fault. */
static int verdict_of(const char *model, OptKind opt, WusMode wus, Fault fault)
{
	Graph g, prog;
	Diag d;
	diag_init(&d);
	assert_int_equal(model_load(&g, model, &d), 0);
	g.train->opt = opt;
	g.train->lr = opt == OPT_SGD ? 0.1 : 0.01;
	g.train->wus = wus;
	assert_int_equal(train_build(&g, &d), 0);
	check_train_outputs(&g);
	int *map, n = g.outputs.n, rc = -1;
	assert_int_equal(pipeline_partition(&g, NULL, &prog, &map, NULL, &d), 0);
	Tensor *got = xcalloc((size_t)n, sizeof *got), *ref = xcalloc((size_t)n, sizeof *ref);
	Tensor *noise[CHECK_MAX_RUNS];
	int nruns = 0;
	for (int r = 0; r < CHECK_MAX_RUNS; r++)
		noise[r] = xcalloc((size_t)n, sizeof(Tensor));
	if (corrupt(&prog, map[g.train->loss], fault) && (rc = check_run_status(run_prog(&g, &prog, map, got))) == 0) {
		run_ref(&g, 0, ref);
		assert_int_equal(check_noise_runs(&g, got, ref, noise, noise_run, &g, &nruns), 0); /* as spmd run --check */
		rc = check_train(&g, NULL, 0, 0, STEPS, got, ref, noise, nruns);
	}
	for (int i = 0; i < n; i++) {
		tensor_free(&got[i]), tensor_free(&ref[i]);
		for (int r = 0; r < CHECK_MAX_RUNS; r++)
			tensor_free(&noise[r][i]);
	}
	for (int r = 0; r < CHECK_MAX_RUNS; r++)
		free(noise[r]);
	free(got), free(ref), free(map);
	graph_free(&prog);
	graph_free(&g);
	return rc;
}

static int verdict(OptKind opt, WusMode wus, Fault fault)
{
	return verdict_of("examples/train_mlp.yaml", opt, wus, fault);
}

/* A [4] f32 tensor of the values a. */
static Tensor vec4(const float *a)
{
	Tensor t;
	Shape s = {.rank = 1, .dim = {4}};
	tensor_alloc(&t, DT_F32, &s);
	memcpy(t.data, a, sizeof(float) * 4);
	return t;
}

/* check_value of got against want, noise runs equal to want. */
static bool judged(const float *got, const float *want)
{
	Tensor g = vec4(got), w = vec4(want);
	CheckItem c = {"v", &g, &w, {&w, &w}, NULL, NULL, 0x1p-24};
	bool ok = check_value(&c);
	tensor_free(&g), tensor_free(&w);
	return ok;
}

/* NaN and inf agree in the same places, with the same sign; elsewhere, and a
 * finite error beyond the floor, mismatch. */
static void test_special_values(void **state)
{
	const float nan = NAN, inf = INFINITY;
	assert_true(judged((float[]){1, nan, inf, -inf}, (float[]){1, nan, inf, -inf}));
	assert_false(judged((float[]){1, 2, inf, -inf}, (float[]){1, nan, inf, -inf}));
	assert_false(judged((float[]){1, nan, inf, -inf}, (float[]){1, 2, inf, -inf}));
	assert_false(judged((float[]){1, nan, -inf, -inf}, (float[]){1, nan, inf, -inf}));
	assert_false(judged((float[]){1, nan, nan, -inf}, (float[]){1, nan, inf, -inf}));
	assert_true(judged((float[]){1, 2, 3, 4.0000005f}, (float[]){1, 2, 3, 4}));
	assert_false(judged((float[]){1, 2, 3, 4.001f}, (float[]){1, 2, 3, 4}));
}

/* Where a noise run's special values differ from the reference's, rounding
 * decides them: either outcome passes there, and only there. */
static void test_special_values_rounding_decides(void **state)
{
	const float nan = NAN;
	float want[4] = {1, nan, 3, 4}, quiet[4] = {1, nan, 3, 4}, flip[4] = {1, 0.001f, 3, 4};
	Tensor w = vec4(want), n0 = vec4(quiet), n1 = vec4(flip);
	Tensor g1 = vec4((float[]){1, 0.002f, 3, 4}), g2 = vec4((float[]){1, nan, 3, 4}), g3 = vec4((float[]){nan, nan, 3, 4});
	CheckItem c = {"v", &g1, &w, {&n0, &n1}, NULL, NULL, 0x1p-24};
	double err, tol;
	int64_t at;
	assert_int_equal(check_measure(&c, &err, &tol, &at), 0); /* NaN in the reference, a number here: n1 has one too */
	c.got = &g2;
	assert_int_equal(check_measure(&c, &err, &tol, &at), 0);
	c.got = &g3;
	assert_int_equal(check_measure(&c, &err, &tol, &at), 1); /* element 0 is determined */
	c.noise[1] = &n0;                                          /* no run explains element 1 now */
	c.got = &g1;
	assert_int_equal(check_measure(&c, &err, &tol, &at), 1);
	tensor_free(&w), tensor_free(&n0), tensor_free(&n1), tensor_free(&g1), tensor_free(&g2), tensor_free(&g3);
}

static void test_intact_programs_pass(void **state)
{
	for (OptKind opt = OPT_SGD; opt <= OPT_ADAM; opt += OPT_ADAM - OPT_SGD)
		for (WusMode wus = WUS_OFF; wus <= WUS_ON; wus++)
			assert_int_equal(verdict(opt, wus, INTACT), 0);
}

static void test_broken_programs_mismatch(void **state)
{
	for (OptKind opt = OPT_SGD; opt <= OPT_ADAM; opt += OPT_ADAM - OPT_SGD) {
		assert_int_equal(verdict(opt, WUS_OFF, DROP), 1);
		assert_int_equal(verdict(opt, WUS_OFF, WRONG_GROUP), 1);
		assert_int_equal(verdict(opt, WUS_OFF, TWICE), 1);
		assert_int_equal(verdict(opt, WUS_ON, WRONG_GROUP), 1);
		assert_int_equal(verdict(opt, WUS_ON, TWICE), 1);
		assert_int_equal(verdict(opt, WUS_ON, OFF_BY_ONE), 1);
	}
}

/* A pipelined step (tests/pipeline/two.yaml): intact it passes; a send to
 * the wrong data replica of the next stage mixes microbatch rows up. */
static void test_pipeline_programs(void **state)
{
	for (WusMode wus = WUS_OFF; wus <= WUS_ON; wus++) {
		assert_int_equal(verdict_of("tests/pipeline/two.yaml", OPT_ADAM, wus, INTACT), 0);
		assert_int_equal(verdict_of("tests/pipeline/two.yaml", OPT_ADAM, wus, WRONG_PARTNER), 1);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_special_values),
		cmocka_unit_test(test_special_values_rounding_decides),
		cmocka_unit_test(test_intact_programs_pass),
		cmocka_unit_test(test_broken_programs_mismatch),
		cmocka_unit_test(test_pipeline_programs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
