/* test_pipeline.c: the pipeline schedules as simulated by the cost model —
 * bubbles against the closed form, activations in flight, step orders,
 * unbalanced stages and sends — and the loader's stage placement. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "../cost_model/pipeline_cost.h"
#include "../spmd/load.h"

/* Simulate schedule sch on p devices, V stages each, m microbatches, every
 * stage taking f forward, b backward, c to send, one byte kept. */
static void run_sends(PipeSchedule sch, int p, int V, int m, double f, double b, double c, bool sync, PipeSim *out)
{
	int n = p * V;
	double *fwd = test_calloc((size_t)n, sizeof *fwd), *bwd = test_calloc((size_t)n, sizeof *bwd);
	double *send = test_calloc((size_t)n, sizeof *send), *act = test_calloc((size_t)n, sizeof *act);
	for (int s = 0; s < n; s++)
		fwd[s] = f, bwd[s] = b, send[s] = c, act[s] = 1;
	PipeSimIn in = {sch, p, V, m, fwd, bwd, send, act, b == 0, sync};
	assert_int_equal(pipe_simulate(&in, out), 0);
	test_free(fwd), test_free(bwd), test_free(send), test_free(act);
}

static void run(PipeSchedule sch, int p, int V, int m, double f, double b, double c, PipeSim *out)
{
	run_sends(sch, p, V, m, f, b, c, false, out);
}

/* Sends that hold their sender (threads, MPI) against sends on a link:
 * GPipe on 2 devices, 4 microbatches, f = b = 1, a send 0.5.  On a link
 * the sender goes on: the first stage's forwards end at 1, 2, 3, 4, the
 * last stage's at 2.5 ... 5.5, its backwards at 6.5 ... 9.5 and the first
 * stage's at 8 ... 11.  Held, each sending step costs its device 1.5: the
 * forwards end at 1, 2.5, 4, 5.5 and 2.5, 4, 5.5, 7, the last stage's
 * backwards at 8, 9.5, 11, 12.5, the first stage's at 9.5, 11, 12.5, 14;
 * busy time is the same, so the bubble is 1 - 16 / 28. */
static void test_sync_sends(void **state)
{
	(void)state;
	PipeSim a, h;
	run_sends(PIPE_GPIPE, 2, 1, 4, 1.0, 1.0, 0.5, false, &a);
	run_sends(PIPE_GPIPE, 2, 1, 4, 1.0, 1.0, 0.5, true, &h);
	assert_float_equal(a.makespan, 11.0, 1e-12);
	assert_float_equal(h.makespan, 14.0, 1e-12);
	assert_float_equal(h.busy[0], 8.0, 1e-12);
	assert_float_equal(h.bubble_fraction, 1 - 16.0 / 28.0, 1e-12);
	assert_float_equal(h.task[0][7].end, 14.0, 1e-12);
	pipe_sim_free(&a), pipe_sim_free(&h);
}

/* GPipe and 1F1B on balanced stages without sends: (p - 1) / (m + p - 1),
 * and the step is (m + p - 1) (f + b). */
static void test_bubble_formula(void **state)
{
	(void)state;
	static const int ps[] = {2, 4, 8}, ms[] = {1, 4, 8, 32};
	for (int sch = PIPE_GPIPE; sch <= PIPE_1F1B; sch++)
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 4; j++) {
				PipeSim s;
				run((PipeSchedule)sch, ps[i], 1, ms[j], 1.0, 2.0, 0, &s);
				double want = pipe_bubble_formula(ps[i], 1, ms[j]);
				assert_true(fabs(s.bubble_fraction - want) <= 0.01 * want + 1e-12);
				assert_true(fabs(s.makespan - (ms[j] + ps[i] - 1) * 3.0) < 1e-9);
				pipe_sim_free(&s);
			}
}

/* Interleaving divides the bubble by V. */
static void test_interleaved_bubble(void **state)
{
	(void)state;
	for (int V = 2; V <= 4; V++) {
		PipeSim s;
		run(PIPE_INTERLEAVED, 4, V, 8, 1.0, 2.0, 0, &s);
		double want = pipe_bubble_formula(4, V, 8);
		assert_true(fabs(s.bubble_fraction - want) <= 0.01 * want);
		PipeSim g;
		run(PIPE_1F1B, 4, 1, 8, V * 1.0, V * 2.0, 0, &g); /* the same work in one stage per device */
		assert_true(s.bubble_fraction < g.bubble_fraction);
		pipe_sim_free(&s), pipe_sim_free(&g);
	}
}

/* GPipe holds every microbatch's activations; 1F1B at most p - d on device d. */
static void test_in_flight(void **state)
{
	(void)state;
	PipeSim g, o;
	run(PIPE_GPIPE, 4, 1, 8, 1, 2, 0.1, &g);
	run(PIPE_1F1B, 4, 1, 8, 1, 2, 0.1, &o);
	for (int d = 0; d < 4; d++) {
		assert_int_equal(g.in_flight[d], 8);
		assert_int_equal(o.in_flight[d], 4 - d);
		assert_true(fabs(o.act_peak[d] - (4 - d)) < 1e-12);
	}
	pipe_sim_free(&g), pipe_sim_free(&o);
}

/* Every device runs each microbatch's forward and backward of each of its
 * stages once, a forward before its backward. */
static void test_orders(void **state)
{
	(void)state;
	for (int sch = 0; sch < PIPE_COUNT; sch++) {
		int p = 4, V = sch == PIPE_INTERLEAVED ? 3 : 1, m = 8, n = 2 * m * V;
		PipeSimIn in = {(PipeSchedule)sch, p, V, m, NULL, NULL, NULL, NULL, false, false};
		PipeTask *t = test_calloc((size_t)n, sizeof *t);
		for (int d = 0; d < p; d++) {
			int seen[8][3][2] = {{{0}}};
			pipe_order(&in, d, t);
			for (int k = 0; k < n; k++) {
				assert_int_equal(t[k].stage % p, d);
				int c = t[k].stage / p;
				assert_int_equal(seen[t[k].mb][c][t[k].bwd]++, 0);
				if (t[k].bwd)
					assert_int_equal(seen[t[k].mb][c][0], 1);
			}
		}
		test_free(t);
	}
}

/* Unbalanced stages: the slowest sets the pace and the bubble grows; sends
 * lengthen the step but run beside compute. */
static void test_unbalanced_and_sends(void **state)
{
	(void)state;
	double fwd[4] = {1, 1, 3, 1}, bwd[4] = {2, 2, 6, 2};
	PipeSimIn in = {PIPE_1F1B, 4, 1, 8, fwd, bwd, NULL, NULL, false, false};
	PipeSim s;
	assert_int_equal(pipe_simulate(&in, &s), 0);
	assert_true(s.makespan >= 8 * 9.0);
	assert_true(s.bubble_fraction > pipe_bubble_formula(4, 1, 8));
	pipe_sim_free(&s);
	PipeSim a, b;
	run(PIPE_1F1B, 4, 1, 8, 1, 2, 0, &a);
	run(PIPE_1F1B, 4, 1, 8, 1, 2, 0.25, &b);
	assert_true(b.makespan > a.makespan);
	assert_true(b.makespan < a.makespan + 2 * 3 * 0.25 + 1e-9 + 8 * 2 * 0.25); /* not every send on the path */
	pipe_sim_free(&a), pipe_sim_free(&b);
}

/* A forward-only pipeline (backward steps of no time): the textbook bubble
 * without sends; with sends, the forwards' alone lengthen the step, once
 * per boundary on the critical path: (m + p - 1) f + (p - 1) c. */
static void test_forward_only(void **state)
{
	(void)state;
	for (int sch = PIPE_GPIPE; sch <= PIPE_1F1B; sch++) {
		PipeSim a, b;
		run((PipeSchedule)sch, 4, 1, 8, 1, 0, 0, &a);
		assert_true(fabs(a.bubble_fraction - pipe_bubble_formula(4, 1, 8)) < 1e-12);
		run((PipeSchedule)sch, 4, 1, 8, 1, 0, 0.5, &b);
		assert_true(fabs(b.makespan - (11 + 3 * 0.5)) < 1e-12);
		pipe_sim_free(&a), pipe_sim_free(&b);
	}
}

/* Unannotated ops take the latest stage of what they read, or the stage of the op before. */
static void test_load_stages(void **state)
{
	(void)state;
	static const char text[] = "mesh: {stage: 2, data: 2}\n"
	                           "pipeline: {axis: stage, microbatches: 2, schedule: interleaved}\n"
	                           "inputs: {x: {shape: [8, 4]}}\n"
	                           "params: {w1: {shape: [4, 4]}, w2: {shape: [4, 4]}}\n"
	                           "ops:\n"
	                           "  - {out: h, op: einsum, eq: \"bd,df->bf\", in: [x, w1]}\n"
	                           "  - {out: a, op: relu, in: [h], stage: 2}\n"
	                           "  - {out: b, op: relu, in: [a]}\n"
	                           "  - {out: c, op: cast, dtype: f32, in: [w2]}\n"
	                           "  - {out: y, op: einsum, eq: \"bd,df->bf\", in: [b, c], stage: 3}\n"
	                           "outputs: [y]\n";
	Graph g;
	Diag d;
	diag_init(&d);
	assert_int_equal(model_load_string(&g, text, "t.yaml", &d), 0);
	const Pipeline *pl = g.pipeline;
	assert_non_null(pl);
	assert_int_equal(pl->nstages, 4);
	assert_int_equal(pl->virtual_stages, 2);
	static const int want[] = {0, 2, 2, 2, 3};
	for (int i = 0; i < 5; i++)
		assert_int_equal(pl->op_stage[i], want[i]);
	assert_int_equal(pipeline_stage_at(pl, g.values.a[graph_find(&g, "w2")].pos), 2); /* its first reader, c */
	assert_int_equal(pipeline_stage_at(pl, g.values.a[graph_find(&g, "x")].pos), 0); /* an input: its first reader's */
	assert_int_equal(pipeline_stage_device(pl, 3), 1);
	graph_free(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bubble_formula),  cmocka_unit_test(test_interleaved_bubble),
		cmocka_unit_test(test_in_flight),       cmocka_unit_test(test_orders),
		cmocka_unit_test(test_unbalanced_and_sends), cmocka_unit_test(test_sync_sends),
		cmocka_unit_test(test_load_stages),
		cmocka_unit_test(test_forward_only),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
