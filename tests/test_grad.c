/* test_grad.c: every gradient rule against central finite differences, the new kernels against naive loops, and the optimizers against a hand-written step.
 *
 * A case is a small model whose params feed the op under test, giving y;
 * the test appends loss = reduce_sum(y * r) (r a fixed random input, so the
 * gradient arriving at y is not uniform), differentiates it, and compares
 * every param's gradient, element by element, with
 * (L(x + h) - L(x - h)) / 2h computed by the reference executor on the
 * forward ops alone.  The data are deterministic (seed, name, index), so a
 * case either always passes or always fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "../runtime/data.h"
#include "../runtime/exec.h"
#include "../train/autodiff.h"
#include "../spmd/load.h"
#include "../train/train.h"

/* ---- the finite-difference harness ---- */

typedef struct {
	Graph g;
	int loss, nfwd_ops;
	int *grad;
	Tensor *vals;
	Diag d;
} Case;

static void case_load(Case *c, const char *yaml)
{
	diag_init(&c->d);
	c->d.quiet = true;
	int rc = model_load_string(&c->g, yaml, "case.yaml", &c->d);
	if (rc != 0)
		print_error("load: %s\n", c->d.last);
	assert_int_equal(rc, 0);
}

/* loss = reduce_sum(y * r) with r a random input of y's shape and dtype. */
static void case_loss(Case *c, const char *yname)
{
	Graph *g = &c->g;
	int y = graph_find(g, yname);
	assert_true(y >= 0);
	Shape ys = g->values.a[y].shape, scalar = {0};
	DType dt = g->values.a[y].dtype;
	Pos p = {"case.yaml", 99, 1};
	int r = graph_value(g, "r_weights", dt, &ys, VK_INPUT, p);
	int m = graph_value(g, "r_product", dt, &ys, VK_INTER, p);
	graph_op(g, OP_MUL, (int[]){y, r}, 2, m, p);
	c->loss = graph_value(g, "r_loss", dt, &scalar, VK_INTER, p);
	int op = graph_op(g, OP_REDUCE_SUM, &m, 1, c->loss, p);
	Attr *at = g->ops.a[op].attr;
	for (int d = 0; d < ys.rank; d++)
		at->axes[at->naxes++] = d;
}

/* The loss of the forward ops on the current leaves. */
static double forward_loss(Case *c)
{
	Graph fwd = c->g; /* the same arrays, the forward ops only */
	fwd.ops.n = c->nfwd_ops;
	bool *keep = xcalloc((size_t)fwd.values.n, 1);
	keep[c->loss] = true;
	ExecOpts o = {.seed = 7};
	int rc = exec_run(&fwd, c->vals, keep, &o, &c->d);
	if (rc != 0)
		print_error("forward: %s\n", c->d.last);
	assert_int_equal(rc, 0);
	free(keep);
	return tensor_f32(&c->vals[c->loss])[0];
}

/* Compare the gradient of param p with central differences on at most 60 of its elements. */
static void check_param(Case *c, int p, const Tensor *an, double tol)
{
	Tensor *x = &c->vals[p];
	int64_t n = shape_numel(&x->shape), step = n > 60 ? n / 60 + 1 : 1;
	double scale = 0;
	for (int64_t i = 0; i < n; i++)
		scale = fmax(scale, fabs(tensor_f32(an)[i]));
	for (int64_t i = 0; i < n; i += step) {
		float x0 = tensor_f32(x)[i];
		double h = 1e-3 * fmax(1.0, fabs(x0));
		tensor_f32(x)[i] = (float)(x0 + h);
		double hp = (double)tensor_f32(x)[i] - x0, lp = forward_loss(c);
		tensor_f32(x)[i] = (float)(x0 - h);
		double hm = x0 - (double)tensor_f32(x)[i], lm = forward_loss(c);
		tensor_f32(x)[i] = x0;
		double fd = (lp - lm) / (hp + hm), a = tensor_f32(an)[i];
		if (!(fabs(fd - a) <= tol * scale + 2e-3)) {
			print_error("d loss / d %s[%lld]: autodiff %.6g, finite differences %.6g (largest gradient %.4g)\n",
			            c->g.values.a[p].name, (long long)i, a, fd, scale);
			fail();
		}
	}
}

/* Differentiate the case and check every param; free everything. */
static void case_check(Case *c, double tol)
{
	Graph *g = &c->g;
	c->nfwd_ops = g->ops.n;
	int nv = g->values.n;
	c->grad = xmalloc(sizeof(int) * (size_t)nv);
	int rc = autodiff(g, c->loss, c->grad, &c->d);
	if (rc != 0)
		print_error("autodiff: %s\n", c->d.last);
	assert_int_equal(rc, 0);
	assert_int_equal(graph_verify(g, &c->d), 0);
	c->vals = xcalloc((size_t)g->values.n + 1, sizeof(Tensor));
	bool *keep = xcalloc((size_t)g->values.n, 1);
	for (int v = 0; v < nv; v++)
		if (g->values.a[v].kind == VK_PARAM)
			keep[c->grad[v]] = true;
	ExecOpts o = {.seed = 7};
	rc = exec_run(g, c->vals, keep, &o, &c->d);
	if (rc != 0)
		print_error("run: %s\n", c->d.last);
	assert_int_equal(rc, 0);
	for (int v = 0; v < nv; v++)
		if (g->values.a[v].kind == VK_PARAM) {
			char want[300];
			snprintf(want, sizeof want, "d%%%s", g->values.a[v].name);
			assert_string_equal(g->values.a[c->grad[v]].name, want);
			Tensor an = c->vals[c->grad[v]];
			c->vals[c->grad[v]].data = NULL; /* keep it past the finite-difference runs */
			check_param(c, v, &an, tol);
			tensor_free(&an);
		}
	free(keep);
	exec_free_values(g, c->vals);
	free(c->vals);
	free(c->grad);
	graph_free(g);
}

/* One case: a model text whose result `y` is checked. */
static void grad_case(const char *yaml, double tol)
{
	Case c;
	case_load(&c, yaml);
	case_loss(&c, "y");
	case_check(&c, tol);
}

#define MODEL(params, ops) "inputs: {}\nparams: " params "\nops: " ops "\noutputs: [y]\n"
#define U(lo, hi) "init: {uniform: [" #lo ", " #hi "]}"

/* ---- cases ---- */

static void test_einsum(void **state)
{
	static const char *const eqs[][4] = {
		/* eq, shape a, shape b (NULL: one operand) */
		{"ij,jk->ik", "[3, 4]", "[4, 2]"},
		{"bij,bjk->bik", "[2, 3, 4]", "[2, 4, 2]"},
		{"bqhd,bkhd->bhqk", "[2, 3, 2, 2]", "[2, 4, 2, 2]"},
		{"ij,jk->ki", "[3, 4]", "[4, 2]"},
		{"ij,jk->k", "[3, 4]", "[4, 2]"},     /* i only in a: summed out */
		{"ij,ij", "[3, 4]", "[3, 4]"},        /* full contraction */
		{"i,j->ij", "[3]", "[4]"},            /* outer product */
		{"ii,i->i", "[3, 3]", "[3]"},         /* a diagonal */
		{"iij,jk->ik", "[3, 3, 2]", "[2, 4]"},
		{"ij->ji", "[3, 4]", NULL},
		{"ij->i", "[3, 4]", NULL},
		{"ii->i", "[4, 4]", NULL},
		{"iji->j", "[3, 2, 3]", NULL},
		{"ij", "[3, 4]", NULL},
	};
	for (size_t i = 0; i < sizeof eqs / sizeof eqs[0]; i++) {
		char yaml[1024];
		if (eqs[i][2])
			snprintf(yaml, sizeof yaml,
			         MODEL("{a: {shape: %s, " U(-1, 1) "}, b: {shape: %s, " U(-1, 1) "}}",
			               "[{out: y, op: einsum, in: [a, b], eq: \"%s\"}]"),
			         eqs[i][1], eqs[i][2], eqs[i][0]);
		else
			snprintf(yaml, sizeof yaml,
			         MODEL("{a: {shape: %s, " U(-1, 1) "}}", "[{out: y, op: einsum, in: [a], eq: \"%s\"}]"),
			         eqs[i][1], eqs[i][0]);
		grad_case(yaml, 1e-2);
	}
}

static void test_unary(void **state)
{
	static const char *const ops[] = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh",
	                                  "sigmoid", "relu", "gelu", "square", "reciprocal"};
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		bool positive = !strcmp(ops[i], "log") || !strcmp(ops[i], "sqrt") || !strcmp(ops[i], "rsqrt") ||
		                !strcmp(ops[i], "reciprocal");
		char yaml[1024];
		snprintf(yaml, sizeof yaml, MODEL("{a: {shape: [3, 5], init: {uniform: [%s, 2]}}}", "[{out: y, op: %s, in: [a]}]"),
		         positive ? "0.5" : "-2", ops[i]);
		grad_case(yaml, 1e-2);
	}
}

static void test_binary(void **state)
{
	static const char *const ops[] = {"add", "sub", "mul", "div", "max", "min", "pow"};
	static const char *const shapes[][2] = {{"[3, 4]", "[3, 4]"}, {"[3, 4]", "[4]"}, {"[2, 1, 4]", "[3, 1]"}, {"[3, 4]", "[]"}};
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
		for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
			bool positive = !strcmp(ops[i], "pow") || !strcmp(ops[i], "div");
			char yaml[1024];
			snprintf(yaml, sizeof yaml,
			         MODEL("{a: {shape: %s, init: {uniform: [%s, 2]}}, b: {shape: %s, init: {uniform: [%s, 2]}}}",
			               "[{out: y, op: %s, in: [a, b]}]"),
			         shapes[k][0], positive ? "0.5" : "-2", shapes[k][1], positive ? "0.5" : "-2", ops[i]);
			grad_case(yaml, 1e-2);
		}
	/* a constant operand on either side */
	grad_case(MODEL("{a: {shape: [3, 4], " U(0.5, 2) "}}", "[{out: y, op: pow, in: [a, 3.0]}]"), 1e-2);
	grad_case(MODEL("{a: {shape: [3, 4], " U(-1, 1) "}}", "[{out: y, op: pow, in: [2.0, a]}]"), 1e-2);
	grad_case(MODEL("{a: {shape: [3, 4], " U(0.5, 2) "}}", "[{out: y, op: div, in: [1.5, a]}]"), 1e-2);
}

static void test_reductions(void **state)
{
	static const char *const ops[] = {"reduce_sum", "reduce_mean", "reduce_max"};
	static const char *const attrs[] = {"axes: [1]", "axes: [0, 2]", "axes: [-1], keepdims: true", "keepdims: false", ""};
	for (size_t i = 0; i < 3; i++)
		for (size_t k = 0; k < sizeof attrs / sizeof attrs[0]; k++) {
			char yaml[1024];
			snprintf(yaml, sizeof yaml, MODEL("{a: {shape: [3, 4, 2], " U(-2, 2) "}}", "[{out: y, op: %s, in: [a], %s}]"),
			         ops[i], attrs[k]);
			grad_case(yaml, 1e-2);
		}
	/* reduce_max with ties: the gradient is shared by the tied elements
	 * (finite differences cannot see ties; the rule is checked by value) */
	Case c;
	case_load(&c, MODEL("{a: {shape: [2, 3], init: ones}}", "[{out: y, op: reduce_max, in: [a], axes: [1]}]"));
	case_loss(&c, "y");
	c.nfwd_ops = c.g.ops.n;
	int nv = c.g.values.n, *grad = xmalloc(sizeof(int) * (size_t)nv);
	assert_int_equal(autodiff(&c.g, c.loss, grad, &c.d), 0);
	Tensor *vals = xcalloc((size_t)c.g.values.n, sizeof(Tensor));
	bool *keep = xcalloc((size_t)c.g.values.n, 1);
	keep[grad[graph_find(&c.g, "a")]] = keep[graph_find(&c.g, "r_weights")] = true;
	assert_int_equal(exec_run(&c.g, vals, keep, &(ExecOpts){.seed = 7}, &c.d), 0);
	const float *ga = tensor_f32(&vals[grad[graph_find(&c.g, "a")]]), *r = tensor_f32(&vals[graph_find(&c.g, "r_weights")]);
	for (int i = 0; i < 6; i++)
		assert_float_equal(ga[i], r[i / 3] / 3, 1e-6);
	exec_free_values(&c.g, vals);
	free(vals), free(keep), free(grad);
	graph_free(&c.g);
}

static void test_normalizations(void **state)
{
	static const char *const ops[] = {"softmax", "log_softmax", "layer_norm"};
	static const char *const axes[] = {"-1", "0", "1"};
	for (size_t i = 0; i < 3; i++)
		for (size_t k = 0; k < 3; k++) {
			char yaml[1024];
			snprintf(yaml, sizeof yaml, MODEL("{a: {shape: [3, 4, 2], " U(-2, 2) "}}", "[{out: y, op: %s, in: [a], axis: %s}]"),
			         ops[i], axes[k]);
			grad_case(yaml, 1e-2);
		}
}

static void test_movement(void **state)
{
	static const char *const ops[] = {
		"[{out: y, op: transpose, in: [a], perm: [2, 0, 1]}]",
		"[{out: y, op: transpose, in: [a]}]",
		"[{out: y, op: reshape, in: [a], shape: [4, -1]}]",
		"[{out: y, op: broadcast_to, in: [a], shape: [2, 3, 4, 2]}]",
		"[{out: y, op: slice, in: [a], start: [1, 0, 0], limit: [3, 4, 2]}]",
		"[{out: y, op: slice, in: [a], start: [0, 1, 1], limit: [3, 4, 2], stride: [2, 2, 1]}]",
		"[{out: y, op: slice, in: [a], start: [0, 0, 0], limit: [3, 4, 2], stride: [3, 3, 2]}]",
		"[{out: y, op: concat, in: [a, b, a], axis: 1}]",
		"[{out: y, op: pad, in: [a], low: [1, 0, 2], high: [0, 3, 1], value: 5.0}]",
		"[{out: y, op: copy, in: [a]}]",
		"[{out: y, op: cast, in: [a], dtype: f64}]",
		"[{out: c, op: cast, in: [a], dtype: f64}, {out: y, op: cast, in: [c], dtype: f32}]",
	};
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		char yaml[1024];
		snprintf(yaml, sizeof yaml,
		         MODEL("{a: {shape: [3, 4, 2], " U(-2, 2) "}, b: {shape: [3, 1, 2], " U(-2, 2) "}}", "%s"), ops[i]);
		if (!strstr(ops[i], "[a, b"))
			snprintf(yaml, sizeof yaml, MODEL("{a: {shape: [3, 4, 2], " U(-2, 2) "}}", "%s"), ops[i]);
		grad_case(yaml, 1e-2);
	}
}

static void test_conv2d(void **state)
{
	static const char *const attrs[] = {
		"padding: valid",
		"padding: same",
		"padding: same, strides: [2, 2]",
		"padding: valid, strides: [2, 1]",
		"padding: [[1, 0], [2, 1]], strides: [1, 2]",
		"padding: [[0, 2], [1, 1]], strides: [3, 2]",
	};
	for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
		char yaml[1024];
		snprintf(yaml, sizeof yaml,
		         MODEL("{x: {shape: [2, 5, 6, 3], " U(-1, 1) "}, k: {shape: [3, 2, 3, 2], " U(-1, 1) "}}",
		               "[{out: y, op: conv2d, in: [x, k], %s}]"),
		         attrs[i]);
		grad_case(yaml, 1e-2);
	}
}

static void test_lookups_and_losses(void **state)
{
	grad_case("inputs: {ids: {shape: [2, 3], dtype: i32}}\nparams: {t: {shape: [5, 4], " U(-1, 1) "}}\n"
	          "ops: [{out: y, op: take, in: [t, ids]}]\noutputs: [y]\n", 1e-2);
	grad_case("inputs: {ids: {shape: [], dtype: i32}}\nparams: {t: {shape: [5, 2, 3], " U(-1, 1) "}}\n"
	          "ops: [{out: y, op: take, in: [t, ids]}]\noutputs: [y]\n", 1e-2);
	grad_case("inputs: {labels: {shape: [3, 2], dtype: i32}}\nparams: {z: {shape: [3, 2, 5], " U(-2, 2) "}}\n"
	          "ops: [{out: y, op: softmax_cross_entropy, in: [z, labels]}]\noutputs: [y]\n", 1e-2);
	grad_case(MODEL("{p: {shape: [4, 3], " U(-2, 2) "}, t: {shape: [4, 3], " U(-2, 2) "}}",
	                "[{out: y, op: mse, in: [p, t]}]"), 1e-2);
}

/* A small network: a value used twice, einsum, layer_norm, gelu, softmax_cross_entropy. */
static void test_composite(void **state)
{
	grad_case("inputs: {x: {shape: [4, 6]}, labels: {shape: [4], dtype: i32}}\n"
	          "params: {w1: {shape: [6, 5], " U(-1, 1) "}, b1: {shape: [5], " U(-1, 1) "},"
	          " w2: {shape: [5, 3], " U(-1, 1) "}}\n"
	          "ops:\n"
	          "  - {out: h, op: einsum, in: [x, w1], eq: \"bd,df->bf\"}\n"
	          "  - {out: hb, op: add, in: [h, b1]}\n"
	          "  - {out: n, op: layer_norm, in: [hb]}\n"
	          "  - {out: a, op: gelu, in: [n]}\n"
	          "  - {out: r, op: add, in: [a, hb]}\n"
	          "  - {out: z, op: einsum, in: [r, w2], eq: \"bf,fc->bc\"}\n"
	          "  - {out: y, op: softmax_cross_entropy, in: [z, labels]}\n"
	          "outputs: [y]\n", 1e-2);
}

/* A param the loss does not reach: a warning at its position and zeros;
 * one that reaches it only through greater: zeros, no warning needed. */
static void test_unreached(void **state)
{
	Case c;
	case_load(&c, "inputs: {}\nparams: {a: {shape: [3]}, b: {shape: [2, 2]}}\n"
	              "ops: [{out: y, op: exp, in: [a]}, {out: u, op: neg, in: [b]}]\noutputs: [y]\n");
	case_loss(&c, "y");
	int *grad = xmalloc(sizeof(int) * (size_t)c.g.values.n);
	assert_int_equal(autodiff(&c.g, c.loss, grad, &c.d), 0);
	assert_int_equal(c.d.nwarn, 1);
	assert_non_null(strstr(c.d.last, "param 'b' does not reach the loss"));
	int b = graph_find(&c.g, "b");
	assert_string_equal(c.g.values.a[grad[b]].name, "d%b");
	Tensor *vals = xcalloc((size_t)c.g.values.n, sizeof(Tensor));
	bool *keep = xcalloc((size_t)c.g.values.n, 1);
	keep[grad[b]] = true;
	assert_int_equal(exec_run(&c.g, vals, keep, NULL, &c.d), 0);
	assert_true(shape_eq(&vals[grad[b]].shape, &c.g.values.a[b].shape));
	for (int i = 0; i < 4; i++)
		assert_true(tensor_f32(&vals[grad[b]])[i] == 0.0f);
	exec_free_values(&c.g, vals);
	free(vals), free(keep), free(grad);
	graph_free(&c.g);
}

/* ---- the new kernels against naive loops ---- */

/* Run a one-op model (its result `y`) on the reference; vals kept. */
static Tensor *run_model(Graph *g, const char *yaml)
{
	Diag d;
	diag_init(&d);
	d.quiet = true;
	assert_int_equal(model_load_string(g, yaml, "k.yaml", &d), 0);
	Tensor *vals = xcalloc((size_t)g->values.n, sizeof(Tensor));
	bool *keep = xcalloc((size_t)g->values.n, 1);
	memset(keep, 1, (size_t)g->values.n);
	assert_int_equal(exec_run(g, vals, keep, &(ExecOpts){.seed = 3}, &d), 0);
	free(keep);
	return vals;
}

static const float *val(const Graph *g, Tensor *vals, const char *name) { return tensor_f32(&vals[graph_find(g, name)]); }

static void test_loss_kernels(void **state)
{
	Graph g;
	Tensor *v = run_model(&g, "inputs: {z: {shape: [3, 4, 5]}, l: {shape: [3, 4], dtype: i32}, p: {shape: [3, 4, 5]}}\n"
	                          "ops: [{out: ce, op: softmax_cross_entropy, in: [z, l]}, {out: m, op: mse, in: [z, p]},"
	                          " {out: y, op: greater, in: [z, p]}]\noutputs: [ce, m, y]\n");
	const float *z = val(&g, v, "z"), *p = val(&g, v, "p"), *gt = val(&g, v, "y");
	const int32_t *l = tensor_i32(&v[graph_find(&g, "l")]);
	double ce = 0, m = 0;
	for (int i = 0; i < 12; i++) {
		double s = 0;
		assert_true(l[i] >= 0 && l[i] < 5);
		for (int k = 0; k < 5; k++)
			s += exp(z[i * 5 + k]);
		ce += log(s) - z[i * 5 + l[i]];
	}
	for (int i = 0; i < 60; i++) {
		m += (z[i] - p[i]) * (z[i] - p[i]);
		assert_true(gt[i] == (z[i] > p[i] ? 1.0f : 0.0f));
	}
	assert_float_equal(val(&g, v, "ce")[0], ce / 12, 1e-5);
	assert_float_equal(val(&g, v, "m")[0], m / 60, 1e-5);
	exec_free_values(&g, v);
	free(v);
	graph_free(&g);
}

static void test_take_grad_kernel(void **state)
{
	Graph g;
	Tensor *v = run_model(&g, "inputs: {x: {shape: [2, 3, 4]}, ids: {shape: [2, 3], dtype: i32}}\n"
	                          "ops: [{out: t, op: take, in: [e, ids]}, {out: y, op: take_grad, in: [x, ids], num_rows: 5}]\n"
	                          "params: {e: {shape: [5, 4]}}\noutputs: [y]\n");
	const float *x = val(&g, v, "x"), *y = val(&g, v, "y");
	const int32_t *ids = tensor_i32(&v[graph_find(&g, "ids")]);
	float want[20] = {0};
	for (int i = 0; i < 6; i++)
		for (int j = 0; j < 4; j++)
			want[ids[i] * 4 + j] += x[i * 4 + j];
	for (int i = 0; i < 20; i++)
		assert_float_equal(y[i], want[i], 1e-6);
	exec_free_values(&g, v);
	free(v);
	graph_free(&g);
}

/* conv2d_grad_input and conv2d_grad_filter against the definition (sums over taps). */
static void test_conv_grad_kernels(void **state)
{
	Graph g;
	Tensor *v = run_model(&g, "inputs: {x: {shape: [2, 5, 4, 3]}, k: {shape: [3, 2, 3, 2]}, dy: {shape: [2, 3, 2, 2]}}\n"
	                          "ops: [{out: gx, op: conv2d_grad_input, in: [dy, k], input_size: [5, 4], strides: [2, 2], padding: [[1, 1], [0, 1]]},\n"
	                          "      {out: gk, op: conv2d_grad_filter, in: [x, dy], kernel_size: [3, 2], strides: [2, 2], padding: [[1, 1], [0, 1]]}]\n"
	                          "outputs: [gx, gk]\n");
	const float *x = val(&g, v, "x"), *k = val(&g, v, "k"), *dy = val(&g, v, "dy");
	const float *gx = val(&g, v, "gx"), *gk = val(&g, v, "gk");
	double wx[2 * 5 * 4 * 3] = {0}, wk[3 * 2 * 3 * 2] = {0};
	for (int n = 0; n < 2; n++)
		for (int oy = 0; oy < 3; oy++)
			for (int ox = 0; ox < 2; ox++)
				for (int ky = 0; ky < 3; ky++)
					for (int kx = 0; kx < 2; kx++) {
						int iy = oy * 2 + ky - 1, ix = ox * 2 + kx;
						if (iy < 0 || iy >= 5 || ix >= 4)
							continue;
						for (int c = 0; c < 3; c++)
							for (int o = 0; o < 2; o++) {
								double d = dy[((n * 3 + oy) * 2 + ox) * 2 + o];
								wx[((n * 5 + iy) * 4 + ix) * 3 + c] += d * k[((ky * 2 + kx) * 3 + c) * 2 + o];
								wk[((ky * 2 + kx) * 3 + c) * 2 + o] += d * x[((n * 5 + iy) * 4 + ix) * 3 + c];
							}
					}
	for (int i = 0; i < 120; i++)
		assert_float_equal(gx[i], wx[i], 1e-5);
	for (int i = 0; i < 36; i++)
		assert_float_equal(gk[i], wk[i], 1e-5);
	exec_free_values(&g, v);
	free(v);
	graph_free(&g);
}

/* ---- the optimizers against a step written out by hand ---- */

/* loss = mse(x * w, t) for w [4]: d loss / d w = 2 (x w - t) x / 4. */
static const char opt_model[] =
	"inputs: {x: {shape: [4]}, t: {shape: [4]}}\n"
	"params: {w: {shape: [4], init: {uniform: [-1, 1]}}}\n"
	"ops: [{out: p, op: mul, in: [x, w]}, {out: loss, op: mse, in: [p, t]}]\n"
	"outputs: [loss]\n"
	"train: {loss: loss, optimizer: %s%s}\n";

typedef struct {
	const char *opt, *extra;
	int kind;              /* OptKind */
	double lr, b1, b2, eps, wd, clip;
} OptCase;

/* One step of the optimizer on w (f64), with state m, v and step number t. */
static void hand_step(const OptCase *oc, const double *x, const double *tg, double *w, double *m, double *v, int t)
{
	double g[4], ss = 0;
	for (int i = 0; i < 4; i++)
		g[i] = 2 * (x[i] * w[i] - tg[i]) * x[i] / 4, ss += g[i] * g[i];
	double s = oc->clip > 0 ? fmin(1, oc->clip / (sqrt(ss) + 1e-6)) : 1, u[4], nw = 0, nu = 0;
	for (int i = 0; i < 4; i++) {
		double gi = g[i] * s;
		if (oc->kind == OPT_SGD || oc->kind == OPT_MOMENTUM || oc->kind == OPT_ADAM)
			gi += oc->wd * w[i];
		if (oc->kind == OPT_SGD) {
			u[i] = gi;
		} else if (oc->kind == OPT_MOMENTUM) {
			m[i] = oc->b1 * m[i] + gi;
			u[i] = m[i];
		} else {
			m[i] = oc->b1 * m[i] + (1 - oc->b1) * gi;
			v[i] = oc->b2 * v[i] + (1 - oc->b2) * gi * gi;
			u[i] = m[i] / (1 - pow(oc->b1, t)) / (sqrt(v[i] / (1 - pow(oc->b2, t))) + oc->eps);
			if (oc->kind != OPT_ADAM)
				u[i] += oc->wd * w[i];
		}
		nw += w[i] * w[i], nu += u[i] * u[i];
	}
	double ratio = oc->kind == OPT_LAMB && nw > 0 && nu > 0 ? sqrt(nw) / sqrt(nu) : 1;
	for (int i = 0; i < 4; i++)
		w[i] -= oc->lr * ratio * u[i];
}

static void check_optimizer(const OptCase *oc)
{
	char yaml[1024];
	snprintf(yaml, sizeof yaml, opt_model, oc->opt, oc->extra);
	Graph g;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	assert_int_equal(model_load_string(&g, yaml, "opt.yaml", &d), 0);
	assert_int_equal(train_build(&g, &d), 0);
	assert_int_equal(g.train->nparams, 1);
	Tensor *vals = xcalloc((size_t)g.values.n, sizeof(Tensor));
	int w = graph_find(&g, "w"), next = g.train->params[0].next;
	double x[4], tg[4], hw[4], m[4] = {0}, v[4] = {0};
	for (int step = 1; step <= 3; step++) {
		assert_int_equal(exec_run(&g, vals, NULL, &(ExecOpts){.seed = 5}, &d), 0);
		for (int i = 0; i < 4 && step == 1; i++) {
			x[i] = val(&g, vals, "x")[i], tg[i] = val(&g, vals, "t")[i];
			hw[i] = val(&g, vals, "w")[i];
		}
		hand_step(oc, x, tg, hw, m, v, step);
		for (int i = 0; i < 4; i++)
			if (!(fabs(tensor_f32(&vals[next])[i] - hw[i]) <= 1e-5 * fmax(1, fabs(hw[i])))) { /* NaN fails */
				print_error("%s%s step %d: w[%d] = %.8g, by hand %.8g\n", oc->opt, oc->extra, step, i,
				            tensor_f32(&vals[next])[i], hw[i]);
				fail();
			}
		train_carry(&g, vals);
		assert_non_null(vals[w].data);
	}
	exec_free_values(&g, vals);
	free(vals);
	graph_free(&g);
}

static void test_optimizers(void **state)
{
	static const OptCase cases[] = {
		{"{type: sgd}", "", OPT_SGD, 0.01, 0, 0, 0, 0, 0},
		{"{type: sgd, lr: 0.5, weight_decay: 0.1}", "", OPT_SGD, 0.5, 0, 0, 0, 0.1, 0},
		{"{type: momentum, lr: 0.3}", "", OPT_MOMENTUM, 0.3, 0.9, 0, 0, 0, 0},
		{"{type: momentum, lr: 0.3, beta1: 0.5}", ", clip_global_norm: 0.1", OPT_MOMENTUM, 0.3, 0.5, 0, 0, 0, 0.1},
		{"{type: adam}", "", OPT_ADAM, 0.001, 0.9, 0.999, 1e-8, 0, 0},
		{"{type: adam, lr: 0.1, beta1: 0.8, beta2: 0.9, eps: 0.01, weight_decay: 0.2}", "", OPT_ADAM, 0.1, 0.8, 0.9, 0.01, 0.2, 0},
		{"{type: adamw, lr: 0.1}", "", OPT_ADAMW, 0.1, 0.9, 0.999, 1e-8, 0.01, 0},
		{"{type: adamw, lr: 0.1, weight_decay: 0.5}", ", clip_global_norm: 0.05", OPT_ADAMW, 0.1, 0.9, 0.999, 1e-8, 0.5, 0.05},
		{"{type: lamb, lr: 0.1}", "", OPT_LAMB, 0.1, 0.9, 0.999, 1e-6, 0, 0},
		{"{type: lamb, lr: 0.1, weight_decay: 0.3}", ", clip_global_norm: 0.1, grad_dtype: f32", OPT_LAMB, 0.1, 0.9, 0.999, 1e-6, 0.3, 0.1},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		check_optimizer(&cases[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_einsum),
		cmocka_unit_test(test_unary),
		cmocka_unit_test(test_binary),
		cmocka_unit_test(test_reductions),
		cmocka_unit_test(test_normalizations),
		cmocka_unit_test(test_movement),
		cmocka_unit_test(test_conv2d),
		cmocka_unit_test(test_lookups_and_losses),
		cmocka_unit_test(test_composite),
		cmocka_unit_test(test_unreached),
		cmocka_unit_test(test_loss_kernels),
		cmocka_unit_test(test_take_grad_kernel),
		cmocka_unit_test(test_conv_grad_kernels),
		cmocka_unit_test(test_optimizers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
