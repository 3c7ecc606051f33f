/* test_exec.c: the reference executor end to end, and deterministic data (shards equal slices of the whole). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "../runtime/data.h"
#include "../runtime/exec.h"
#include "../spmd/ops.h"

static Shape shape_of(const int64_t *d, int n)
{
	Shape s = {.rank = n};
	for (int i = 0; i < n; i++)
		s.dim[i] = d[i];
	return s;
}
#define SH(...) shape_of((int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

static int value(Graph *g, const char *name, DType t, Shape s, ValueKind k)
{
	return graph_value(g, name, t, &s, k, (Pos){"model.yaml", 1, 1});
}

static int op(Graph *g, OpKind k, const int *in, int nin, int out)
{
	return graph_op(g, k, in, nin, out, (Pos){"model.yaml", 3 + g->ops.n, 5});
}

/* The whole of value v as data_fill makes it. */
static Tensor whole(const Graph *g, int v, uint64_t seed)
{
	Tensor t;
	const Value *val = &g->values.a[v];
	tensor_alloc(&t, val->dtype, &val->shape);
	data_fill(&t, val, &val->shape, NULL, seed, data_id_range(g, v));
	return t;
}

/* x [4,6] input, w [6,5] param, b [5] uniform param, c = 0.5 constant:
 * s = reduce_sum(relu(einsum(x, w) + b) * c, axis 1). */
typedef struct {
	Graph g;
	int x, w, b, c, h, y, z, m, s;
} Mlp;

static void mlp_build(Mlp *m, DType dt)
{
	Graph *g = &m->g;
	graph_init(g);
	m->x = value(g, "x", dt, SH(4, 6), VK_INPUT);
	m->w = value(g, "w", dt, SH(6, 5), VK_PARAM);
	m->b = value(g, "b", dt, SH(5), VK_PARAM);
	g->values.a[m->b].init = (Init){INIT_UNIFORM, 0.1, 0.2};
	m->c = value(g, "c", dt, (Shape){0}, VK_CONST);
	g->values.a[m->c].cval = 0.5;
	m->h = value(g, "h", dt, SH(4, 5), VK_INTER);
	m->y = value(g, "y", dt, SH(4, 5), VK_INTER);
	m->z = value(g, "z", dt, SH(4, 5), VK_INTER);
	m->m = value(g, "m", dt, SH(4, 5), VK_INTER);
	m->s = value(g, "s", dt, SH(4), VK_INTER);
	int e = op(g, OP_EINSUM, (int[]){m->x, m->w}, 2, m->h);
	Attr *a = g->ops.a[e].attr;
	a->eq = "ij,jk->ik";
	a->nlet[0] = a->nlet[1] = a->nlet[2] = 2;
	memcpy(a->let[0], "ij", 2), memcpy(a->let[1], "jk", 2), memcpy(a->let[2], "ik", 2);
	op(g, OP_ADD, (int[]){m->h, m->b}, 2, m->y);
	op(g, OP_RELU, (int[]){m->y}, 1, m->z);
	op(g, OP_MUL, (int[]){m->z, m->c}, 2, m->m);
	e = op(g, OP_REDUCE_SUM, (int[]){m->m}, 1, m->s);
	a = g->ops.a[e].attr;
	a->naxes = 1, a->axes[0] = 1;
	vec_push(&g->outputs, m->s);
}

/* s computed here from data_fill'd leaves with plain loops. */
static void mlp_expect(const Mlp *m, uint64_t seed, double *want)
{
	Tensor x = whole(&m->g, m->x, seed), w = whole(&m->g, m->w, seed), b = whole(&m->g, m->b, seed);
	for (int i = 0; i < 4; i++) {
		want[i] = 0;
		for (int k = 0; k < 5; k++) {
			double acc = tensor_f32(&b)[k];
			for (int j = 0; j < 6; j++)
				acc += (double)tensor_f32(&x)[i * 6 + j] * tensor_f32(&w)[j * 5 + k];
			want[i] += 0.5 * (acc > 0 ? acc : 0);
		}
	}
	tensor_free(&x), tensor_free(&w), tensor_free(&b);
}

static void test_exec_mlp(void **state)
{
	(void)state;
	/* the real kernels */
	assert_ptr_equal(op_kernels[OP_EINSUM], kern_einsum);
	Mlp m;
	mlp_build(&m, DT_F32);
	Tensor *vals = xcalloc((size_t)m.g.values.n, sizeof *vals);
	double secs[5] = {-1, -1, -1, -1, -1}, want[4];
	ExecOpts o = {.seed = 7, .profile = true, .op_seconds = secs};
	Diag d;
	diag_init(&d);
	assert_int_equal(exec_run(&m.g, vals, NULL, &o, &d), 0);
	assert_int_equal(d.nerr, 0);
	mlp_expect(&m, 7, want);
	for (int i = 0; i < 4; i++)
		assert_true(fabs(tensor_f32(&vals[m.s])[i] - want[i]) < 1e-4 * (1 + fabs(want[i])));
	for (int i = 0; i < 5; i++)
		assert_true(secs[i] >= 0);
	assert_null(vals[m.h].data); /* intermediates freed after their last use */
	assert_null(vals[m.z].data);
	assert_non_null(vals[m.x].data);
	exec_free_values(&m.g, vals);

	bool *keep = xcalloc((size_t)m.g.values.n, 1);
	keep[m.h] = true;
	assert_int_equal(exec_run(&m.g, vals, keep, NULL, &d), 0);
	assert_non_null(vals[m.h].data);
	assert_null(vals[m.s].data); /* not kept this time */
	exec_free_values(&m.g, vals);
	free(keep);
	free(vals);
	graph_free(&m.g);
}

/* bf16 values: results rounded after every op. */
static void test_exec_rounds(void **state)
{
	(void)state;
	Mlp m;
	mlp_build(&m, DT_BF16);
	Tensor *vals = xcalloc((size_t)m.g.values.n, sizeof *vals);
	Diag d;
	diag_init(&d);
	double want[4];
	assert_int_equal(exec_run(&m.g, vals, NULL, NULL, &d), 0);
	mlp_expect(&m, 0, want);
	for (int i = 0; i < 4; i++) {
		float v = tensor_f32(&vals[m.s])[i];
		assert_true(round_bf16(v) == v);
		assert_true(fabs(v - want[i]) < 0.03 * (1 + fabs(want[i])));
	}
	Tensor w = whole(&m.g, m.w, 0);
	for (int i = 0; i < 30; i++)
		assert_true(round_bf16(tensor_f32(&w)[i]) == tensor_f32(&w)[i]);
	tensor_free(&w);
	exec_free_values(&m.g, vals);
	free(vals);
	graph_free(&m.g);
}

static void test_exec_errors(void **state)
{
	(void)state;
	Graph g;
	graph_init(&g);
	int t = value(&g, "table", DT_F32, SH(5, 2), VK_PARAM);
	int ids = value(&g, "ids", DT_I32, SH(3), VK_INPUT);
	int y = value(&g, "y", DT_F32, SH(3, 2), VK_INTER);
	op(&g, OP_TAKE, (int[]){t, ids}, 2, y);
	vec_push(&g.outputs, y);
	Tensor *vals = xcalloc((size_t)g.values.n, sizeof *vals);
	Diag d;
	diag_init(&d);
	d.quiet = true;
	assert_int_equal(exec_run(&g, vals, NULL, NULL, &d), 0); /* made ids are in range */
	for (int i = 0; i < 3; i++)
		assert_true(tensor_i32(&vals[ids])[i] >= 0 && tensor_i32(&vals[ids])[i] < 5);
	tensor_i32(&vals[ids])[2] = 9; /* supplied data is used as given */
	assert_int_equal(exec_run(&g, vals, NULL, NULL, &d), -1);
	assert_int_equal(d.nerr, 1);
	assert_non_null(strstr(d.last, "found 9 at index [2]"));
	exec_free_values(&g, vals);
	free(vals);
	graph_free(&g);

	graph_init(&g);
	int x = value(&g, "x", DT_F32, SH(4), VK_INPUT);
	y = value(&g, "y", DT_F32, SH(4), VK_INTER);
	op(&g, OP_ALL_REDUCE, (int[]){x}, 1, y);
	vals = xcalloc((size_t)g.values.n, sizeof *vals);
	assert_int_equal(exec_run(&g, vals, NULL, NULL, &d), -1);
	assert_non_null(strstr(d.last, "multi-device backend"));
	assert_non_null(strstr(d.last, "expected"));
	exec_free_values(&g, vals);
	free(vals);
	graph_free(&g);
}

/* ---- data_fill ---- */

/* Fill shards of `local` shape at every block offset; each must equal the
 * whole tensor's elements there, and 0 past the global shape. */
static void check_shards(Graph *g, int v, Shape local)
{
	const Value *val = &g->values.a[v];
	Tensor all = whole(g, v, 3);
	int64_t nblk[MAX_RANK], nb = 1;
	for (int d = 0; d < local.rank; d++)
		nb *= nblk[d] = (val->shape.dim[d] + local.dim[d] - 1) / local.dim[d];
	for (int64_t b = 0; b < nb; b++) {
		int64_t off[MAX_RANK], r = b;
		for (int d = local.rank - 1; d >= 0; d--)
			off[d] = (r % nblk[d]) * local.dim[d], r /= nblk[d];
		Tensor t;
		tensor_alloc(&t, val->dtype, &local);
		memset(t.data, 0xff, (size_t)shape_numel(&local) * 4); /* garbage: padding must be written */
		data_fill(&t, val, &val->shape, off, 3, data_id_range(g, v));
		for (int64_t i = 0; i < shape_numel(&local); i++) {
			int64_t gi = 0, k = i;
			bool inside = true;
			int64_t idx[MAX_RANK];
			for (int d = local.rank - 1; d >= 0; d--)
				idx[d] = k % local.dim[d], k /= local.dim[d];
			for (int d = 0; d < local.rank; d++) {
				inside &= off[d] + idx[d] < val->shape.dim[d];
				gi = gi * val->shape.dim[d] + off[d] + idx[d];
			}
			uint32_t got = ((uint32_t *)t.data)[i], want = inside ? ((uint32_t *)all.data)[gi] : 0;
			if (got != want)
				fail_msg("%s: shard at block %lld, element %lld: %08x, want %08x", val->name, (long long)b,
				         (long long)i, got, want);
		}
		tensor_free(&t);
	}
	tensor_free(&all);
}

static void test_data_shards(void **state)
{
	(void)state;
	Graph g;
	graph_init(&g);
	int w = value(&g, "w", DT_F32, SH(7, 10), VK_PARAM);
	int x = value(&g, "x", DT_F32, SH(3, 5, 4), VK_INPUT);
	int u = value(&g, "u", DT_F32, SH(9, 3), VK_PARAM);
	g.values.a[u].init = (Init){INIT_UNIFORM, -1, 3};
	int ids = value(&g, "ids", DT_I32, SH(11, 6), VK_INPUT);
	int hb = value(&g, "hb", DT_BF16, SH(5, 33), VK_INPUT);
	int one = value(&g, "one", DT_F32, SH(3, 3), VK_PARAM);
	g.values.a[one].init.kind = INIT_ONES;
	check_shards(&g, w, SH(4, 5));    /* uneven rows: the last shard has a padded row */
	check_shards(&g, w, SH(7, 3));    /* uneven columns */
	check_shards(&g, w, SH(2, 10));
	check_shards(&g, x, SH(3, 2, 4)); /* trailing whole dims */
	check_shards(&g, x, SH(2, 5, 4));
	check_shards(&g, x, SH(1, 1, 3));
	check_shards(&g, u, SH(4, 2));
	check_shards(&g, ids, SH(4, 4));
	check_shards(&g, hb, SH(3, 8));
	check_shards(&g, one, SH(2, 2));
	graph_free(&g);
}

static void test_data_distributions(void **state)
{
	(void)state;
	Graph g;
	graph_init(&g);
	int x = value(&g, "x", DT_F32, SH(256, 256), VK_INPUT);
	int w = value(&g, "w", DT_F32, SH(256, 256), VK_PARAM);
	int u = value(&g, "u", DT_F32, SH(256, 256), VK_PARAM);
	g.values.a[u].init = (Init){INIT_UNIFORM, 2, 5};
	int z = value(&g, "z", DT_F32, SH(10), VK_STATE);
	int ids = value(&g, "ids", DT_I32, SH(1000), VK_INPUT);
	int x2 = value(&g, "x2", DT_F32, SH(256, 256), VK_INPUT);
	int s = value(&g, "s", DT_F32, (Shape){0}, VK_INPUT);
	Tensor tx = whole(&g, x, 1), tw = whole(&g, w, 1), tu = whole(&g, u, 1), tz = whole(&g, z, 1);
	Tensor ti = whole(&g, ids, 1), tx2 = whole(&g, x2, 1), tx9 = whole(&g, x, 9), ts = whole(&g, s, 1);
	double n = 65536, mx = 0, vx = 0, mw = 0, vw = 0, umin = 1e9, umax = -1e9, same = 0, same9 = 0;
	for (int i = 0; i < 65536; i++) {
		double a = tensor_f32(&tx)[i], b = tensor_f32(&tw)[i], c = tensor_f32(&tu)[i];
		mx += a, vx += a * a, mw += b, vw += b * b;
		umin = c < umin ? c : umin, umax = c > umax ? c : umax;
		same += a == tensor_f32(&tx2)[i];
		same9 += a == tensor_f32(&tx9)[i];
	}
	assert_true(fabs(mx / n) < 0.02 && fabs(sqrt(vx / n) - 1) < 0.02);
	assert_true(fabs(mw / n) < 0.0005 && fabs(sqrt(vw / n) - 0.02) < 0.0005);
	assert_true(umin >= 2 && umin < 2.01 && umax < 5 && umax > 4.99);
	assert_true(same < 5 && same9 < 5); /* names and seeds give different data */
	for (int i = 0; i < 10; i++)
		assert_true(tensor_f32(&tz)[i] == 0); /* optimizer state starts at zero */
	bool hit[1000] = {false};
	for (int i = 0; i < 1000; i++) {
		int32_t v = tensor_i32(&ti)[i];
		assert_true(v >= 0 && v < 1000);
		hit[v] = true;
	}
	int nhit = 0;
	for (int i = 0; i < 1000; i++)
		nhit += hit[i];
	assert_true(nhit > 550); /* about 1 - 1/e of them */
	assert_true(isfinite(tensor_f32(&ts)[0]) && tensor_f32(&ts)[0] != 0);
	Tensor all[] = {tx, tw, tu, tz, ti, tx2, tx9, ts};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		tensor_free(&all[i]);
	graph_free(&g);
}

static void test_data_id_range(void **state)
{
	(void)state;
	Graph g;
	graph_init(&g);
	int table = value(&g, "table", DT_F32, SH(11, 4), VK_PARAM);
	int a = value(&g, "a", DT_I32, SH(3), VK_INPUT);
	int b = value(&g, "b", DT_I32, SH(2, 3), VK_INPUT);
	int c = value(&g, "c", DT_I32, SH(3), VK_INPUT);
	int t1 = value(&g, "t1", DT_F32, SH(3, 4), VK_INTER);
	int oh = value(&g, "oh", DT_F32, SH(3, 7), VK_INTER);
	int rb = value(&g, "rb", DT_I32, SH(6), VK_INTER);
	int t2 = value(&g, "t2", DT_F32, SH(6, 4), VK_INTER);
	op(&g, OP_TAKE, (int[]){table, a}, 2, t1);
	int k = op(&g, OP_ONE_HOT, (int[]){a}, 1, oh);
	g.ops.a[k].attr->depth = 7;
	k = op(&g, OP_RESHAPE, (int[]){b}, 1, rb);
	g.ops.a[k].attr->shape = SH(6);
	op(&g, OP_TAKE, (int[]){table, rb}, 2, t2);
	assert_int_equal(data_id_range(&g, a), 7);     /* min of take (11) and one_hot (7) */
	assert_int_equal(data_id_range(&g, b), 11);    /* through a reshape */
	assert_int_equal(data_id_range(&g, c), 1000);  /* no reader */
	graph_free(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exec_mlp),
		cmocka_unit_test(test_exec_rounds),
		cmocka_unit_test(test_exec_errors),
		cmocka_unit_test(test_data_shards),
		cmocka_unit_test(test_data_distributions),
		cmocka_unit_test(test_data_id_range),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
