/* test_load.c: the YAML reader, the model loader, attribute parsers, shape rules and the bad-input catalogue. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "../spmd/load.h"
#include "../base/yaml.h"

/* ---- helpers ---- */

/* A load whose messages are captured in memory. */
typedef struct {
	Graph g;
	Diag d;
	char *buf;
	size_t len;
	FILE *out;
	int rc;
} Load;

static void load_begin(Load *L)
{
	diag_init(&L->d);
	L->buf = NULL, L->len = 0;
	L->out = open_memstream(&L->buf, &L->len);
	assert_non_null(L->out);
	L->d.out = L->out;
}

static void load_text(Load *L, const char *text)
{
	load_begin(L);
	L->rc = model_load_string(&L->g, text, "<t>", &L->d);
	fflush(L->out);
}

static void load_file(Load *L, const char *path)
{
	load_begin(L);
	L->rc = model_load(&L->g, path, &L->d);
	fflush(L->out);
}

static void load_end(Load *L)
{
	fclose(L->out);
	free(L->buf);
	graph_free(&L->g);
}

/* The first message printed, without its newline, in buf. */
static const char *first_line(const Load *L, char *buf, size_t n)
{
	snprintf(buf, n, "%s", L->buf ? L->buf : "");
	buf[strcspn(buf, "\n")] = 0;
	return buf;
}

/* Load text that must fail; its first message is at pos ("LINE:COL") and
 * contains frag.  Counts a mismatch in *nbad (after printing it). */
static void try_error(const char *text, const char *pos, const char *frag, int *nbad)
{
	Load L;
	load_text(&L, text);
	char line[600], want[64];
	first_line(&L, line, sizeof line);
	snprintf(want, sizeof want, "<t>:%s: error: expected", pos);
	if (L.rc != -1 || L.d.nerr == 0 || strncmp(line, want, strlen(want)) != 0 || !strstr(line, frag)) {
		print_error("model:\n%s\nwanted %s ... %s\ngot rc %d: %s\n\n", text, want, frag, L.rc, line);
		++*nbad;
	}
	load_end(&L);
}

static void check_error(const char *text, const char *pos, const char *frag)
{
	int nbad = 0;
	try_error(text, pos, frag, &nbad);
	assert_int_equal(nbad, 0);
}

/* Load text that must succeed and pass the graph verifier. */
static void load_ok(Load *L, const char *text)
{
	load_text(L, text);
	if (L->rc != 0) {
		print_error("model:\n%s\nfailed: %s\n", text, L->buf);
		fail();
	}
	assert_int_equal(L->d.nerr, 0);
	assert_int_equal(graph_verify(&L->g, &L->d), 0);
}

static const Value *val(const Graph *g, const char *name)
{
	int id = graph_find(g, name);
	if (id < 0) {
		print_error("no value '%s'\n", name);
		fail();
	}
	return &g->values.a[id];
}

static const Op *producer(const Graph *g, const char *name)
{
	const Value *v = val(g, name);
	assert_true(v->producer >= 0);
	return &g->ops.a[v->producer];
}

/* Shape of a value equals dims[0..n). */
static void check_shape(const Graph *g, const char *name, int n, const int64_t *dims)
{
	const Value *v = val(g, name);
	Shape s = {n, {0}};
	for (int i = 0; i < n; i++)
		s.dim[i] = dims[i];
	if (!shape_eq(&s, &v->shape)) {
		char a[128], b[128];
		shape_format(&s, a, sizeof a), shape_format(&v->shape, b, sizeof b);
		print_error("%s: wanted %s, got %s\n", name, a, b);
		fail();
	}
}
#define SHAPE(g, name, ...) \
	check_shape(g, name, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})
#define SCALAR(g, name) check_shape(g, name, 0, NULL)

/* ---- good models ---- */

static const char *const mlp =
	"name: mlp                        # optional\n"
	"mesh: {data: 2, model: 4}\n"
	"inputs:\n"
	"  x: {shape: [32, 512], dtype: f32, sharding: [data, null]}\n"
	"params:\n"
	"  w1: {shape: [512, 2048], sharding: [null, model], init: {normal: 0.02}}\n"
	"  w2: {shape: [2048, 512], sharding: [model, null]}\n"
	"ops:\n"
	"  - {out: h, op: einsum, eq: \"bd,df->bf\", in: [x, w1]}\n"
	"  - {out: a, op: gelu, in: [h]}\n"
	"  - {out: y, op: einsum, eq: \"bf,fd->bd\", in: [a, w2], sharding: [data, null]}\n"
	"outputs: [y]\n";

static void test_mlp(void **state)
{
	Load L;
	load_ok(&L, mlp);
	const Graph *g = &L.g;
	assert_string_equal(g->name, "mlp");
	assert_int_equal(g->mesh.naxes, 2);
	assert_string_equal(g->mesh.name[0], "data");
	assert_string_equal(g->mesh.name[1], "model");
	assert_int_equal(g->mesh.size[1], 4);
	assert_int_equal(g->mesh.ndev, 8);
	assert_int_equal(g->mesh.pos[1].line, 2);
	assert_int_equal(g->mesh.pos[1].col, 17);
	const Value *x = val(g, "x"), *w1 = val(g, "w1"), *w2 = val(g, "w2");
	assert_int_equal(x->kind, VK_INPUT);
	assert_int_equal(w1->kind, VK_PARAM);
	assert_int_equal(x->pos.line, 4);
	assert_int_equal(x->pos.col, 3);
	assert_true(x->has_spec);
	assert_int_equal(x->spec.nax[0], 1);
	assert_int_equal(x->spec.ax[0][0], 0);
	assert_int_equal(x->spec.nax[1], 0);
	assert_int_equal(w1->spec.ax[1][0], 1);
	assert_int_equal(w1->init.kind, INIT_NORMAL);
	assert_true(w1->init.a == 0.02);
	assert_int_equal(w2->init.kind, INIT_DEFAULT);
	SHAPE(g, "h", 32, 2048);
	SHAPE(g, "a", 32, 2048);
	SHAPE(g, "y", 32, 512);
	assert_true(val(g, "y")->has_spec);
	assert_false(val(g, "h")->has_spec);
	const Op *op = producer(g, "h");
	assert_int_equal(op->kind, OP_EINSUM);
	assert_string_equal(op->attr->eq, "bd,df->bf");
	assert_int_equal(op->attr->nlet[2], 2);
	assert_memory_equal(op->attr->let[1], "df", 2);
	assert_int_equal(op->pos.line, 9);
	assert_int_equal(g->ops.n, 3);
	assert_int_equal(g->outputs.n, 1);
	assert_int_equal(g->outputs.a[0], graph_find(g, "y"));
	double flops = 2.0 * 32 * 512 * 2048 + 32.0 * 2048 + 2.0 * 32 * 2048 * 512;
	assert_true(graph_flops(g) == flops);
	assert_int_equal(graph_param_count(g), 2 * 512 * 2048);
	load_end(&L);
}

static void test_constants(void **state)
{
	Load L;
	load_ok(&L, "inputs: {x: {shape: [3], dtype: bf16}}\n"
	            "ops:\n"
	            "  - {out: y, op: mul, in: [x, 0.5]}\n"
	            "  - {out: z, op: sub, in: [-2, y]}\n"
	            "  - {out: w, op: add, in: [1e-3, 3]}\n"
	            "outputs: [z, w]\n");
	const Graph *g = &L.g;
	const Op *op = producer(g, "y");
	const Value *c = &g->values.a[op->in[1]];
	assert_int_equal(c->kind, VK_CONST);
	assert_int_equal(c->shape.rank, 0);
	assert_int_equal(c->dtype, DT_F32);
	assert_true(c->cval == 0.5);
	assert_int_equal(c->name[0], '%');
	assert_int_equal(val(g, "y")->dtype, DT_BF16);
	op = producer(g, "z");
	assert_true(g->values.a[op->in[0]].cval == -2);
	assert_int_equal(val(g, "z")->dtype, DT_BF16);
	assert_int_equal(val(g, "w")->dtype, DT_F32);
	SCALAR(g, "w");
	op = producer(g, "w");
	assert_string_not_equal(g->values.a[op->in[0]].name, g->values.a[op->in[1]].name);
	load_end(&L);
}

static void test_mesh_long_form(void **state)
{
	Load L;
	load_ok(&L, "mesh:\n"
	            "  axes: {data: 2, model: 4}\n"
	            "  devices: [0, 2, 4, 6, 1, 3, 5, 7]\n"
	            "  hardware: tpu-v3\n"
	            "inputs: {x: {shape: [4, 8], sharding: [data, model]}}\n"
	            "ops: [{out: y, op: relu, in: [x]}]\n"
	            "outputs: [y]\n");
	const Mesh *m = &L.g.mesh;
	static const int dev[8] = {0, 2, 4, 6, 1, 3, 5, 7};
	assert_int_equal(m->naxes, 2);
	assert_int_equal(m->ndev, 8);
	assert_string_equal(m->hardware, "tpu-v3");
	assert_non_null(m->devices);
	for (int p = 0; p < 8; p++) {
		assert_int_equal(m->devices[p], dev[p]);
		assert_int_equal(m->position[dev[p]], p);
	}
	assert_int_equal(m->pos[0].line, 2);
	load_end(&L);
	/* a short-form axis may be called "axes" */
	load_ok(&L, "mesh: {axes: 2}\ninputs: {}\nops: []\nparams: {w: {shape: [2]}}\noutputs: [w]\n");
	assert_string_equal(L.g.mesh.name[0], "axes");
	assert_null(L.g.mesh.devices);
	load_end(&L);
}

static void test_value_entries(void **state)
{
	Load L;
	load_ok(&L, "inputs:\n"
	            "params:\n"
	            "  _w.0: {shape: [2], dtype: f64, init: zeros}\n"
	            "  b: {shape: [2], dtype: f16, init: ones}\n"
	            "  u: {shape: [2], init: {uniform: [-1, 1]}}\n"
	            "ops: [{out: layer1.h, op: copy, in: [_w.0]}]\n"
	            "outputs: [layer1.h, b, u]\n");
	const Graph *g = &L.g;
	assert_int_equal(val(g, "_w.0")->init.kind, INIT_ZEROS);
	assert_int_equal(val(g, "_w.0")->dtype, DT_F64);
	assert_int_equal(val(g, "b")->init.kind, INIT_ONES);
	assert_int_equal(val(g, "b")->dtype, DT_F16);
	assert_int_equal(val(g, "u")->init.kind, INIT_UNIFORM);
	assert_true(val(g, "u")->init.a == -1 && val(g, "u")->init.b == 1);
	assert_int_equal(val(g, "layer1.h")->dtype, DT_F64);
	assert_null(g->name);
	assert_int_equal(g->mesh.naxes, 0);
	assert_int_equal(g->mesh.ndev, 1);
	assert_int_equal(g->outputs.n, 3);
	load_end(&L);
}

static void test_numbers_and_bools(void **state)
{
	Load L;
	load_ok(&L, "inputs: {x: {shape: [2, 0x3, 0o2, 1_0]}, s: {shape: []}}\n"
	            "params: {g: {shape: [10], init: {uniform: [-.5, +0.5]}}}\n"
	            "ops:\n"
	            "  - {out: a, op: layer_norm, eps: 1e-05, in: [x]}\n"
	            "  - {out: b, op: layer_norm, eps: 1.0e-5, axis: 0, in: [x]}\n"
	            "  - {out: c, op: reduce_sum, keepdims: True, axes: [1], in: [a]}\n"
	            "  - {out: d, op: reduce_sum, keepdims: FALSE, axes: [1], in: [b]}\n"
	            "  - {out: e, op: mul, in: [s, .5]}\n"
	            "outputs: [c, d, e]\n");
	const Graph *g = &L.g;
	SHAPE(g, "x", 2, 3, 2, 10);
	SCALAR(g, "s");
	SCALAR(g, "e");
	SHAPE(g, "c", 2, 1, 2, 10);
	SHAPE(g, "d", 2, 2, 10);
	assert_true(producer(g, "a")->attr->eps == 1e-5);
	assert_true(producer(g, "b")->attr->eps == 1e-5);
	assert_int_equal(producer(g, "a")->attr->axes[0], 3);
	assert_true(val(g, "g")->init.a == -0.5 && val(g, "g")->init.b == 0.5);
	load_end(&L);
}

/* Read each scalar of a YAML list and check the readers. */
static void test_yaml_scalars(void **state)
{
	YDoc doc;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	const char *text = "[0x1F, 0o17, 1_000, -3, +3, 0b101, -9223372036854775808, 9223372036854775808, 1.5, '3', "
	                   ".inf, -.inf, .nan, 1e-05, .5, ~, null, '', \"null\", True, FALSE, yes, 2.]";
	assert_int_equal(ydoc_parse_string(&doc, text, "<s>", &d), 0);
	YNode **it = doc.root->items;
	static const int64_t ints[] = {31, 15, 1000, -3, 3, 5, INT64_MIN};
	for (int i = 0; i < 7; i++) {
		int64_t v;
		assert_int_equal(ynode_int(it[i], &v, &d), 0);
		assert_true(v == ints[i]);
	}
	int64_t v;
	double x;
	bool b;
	assert_int_equal(ynode_int(it[7], &v, &d), -1);
	assert_non_null(strstr(d.last, "fits in 64 bits"));
	assert_int_equal(ynode_double(it[7], &x, &d), 0);
	assert_true(x == 9223372036854775808.0);
	assert_int_equal(ynode_int(it[8], &v, &d), -1);
	assert_string_equal(d.last, "expected an integer, found '1.5'");
	assert_int_equal(ynode_int(it[9], &v, &d), -1);
	assert_false(ynode_is_number(it[9]));
	assert_true(ynode_is_number(it[8]));
	assert_int_equal(ynode_double(it[10], &x, &d), 0);
	assert_true(isinf(x) && x > 0);
	assert_int_equal(ynode_double(it[11], &x, &d), 0);
	assert_true(isinf(x) && x < 0);
	assert_int_equal(ynode_double(it[12], &x, &d), 0);
	assert_true(isnan(x));
	assert_int_equal(ynode_double(it[13], &x, &d), 0);
	assert_true(x == 1e-5);
	assert_int_equal(ynode_double(it[14], &x, &d), 0);
	assert_true(x == 0.5);
	assert_true(ynode_is_null(it[15]) && ynode_is_null(it[16]));
	assert_false(ynode_is_null(it[17]) || ynode_is_null(it[18]));
	assert_int_equal(ynode_bool(it[19], &b, &d), 0);
	assert_true(b);
	assert_int_equal(ynode_bool(it[20], &b, &d), 0);
	assert_false(b);
	assert_int_equal(ynode_bool(it[21], &b, &d), -1);
	assert_int_equal(ynode_double(it[22], &x, &d), 0);
	assert_true(x == 2.0);
	const char *s;
	assert_int_equal(ynode_string(it[16], &s, &d), -1);
	assert_int_equal(ynode_string(it[18], &s, &d), 0);
	assert_string_equal(s, "null");
	assert_int_equal(it[3]->pos.line, 1);
	assert_int_equal(it[3]->pos.col, 21);
	ydoc_free(&doc);
}

static void test_einsum(void **state)
{
	Load L;
	load_ok(&L, "inputs: {x: {shape: [2, 3]}, w: {shape: [3, 4]}, q: {shape: [5, 5]}, u: {shape: [2, 7]}}\n"
	            "ops:\n"
	            "  - {out: a, op: einsum, eq: 'ij,jk', in: [x, w]}\n"
	            "  - {out: b, op: einsum, eq: ba, in: [x]}\n"
	            "  - {out: c, op: einsum, eq: ii, in: [q]}\n"
	            "  - {out: d, op: einsum, eq: ii->i, in: [q]}\n"
	            "  - {out: e, op: einsum, eq: 'aB,aC', in: [x, u]}\n"
	            "  - {out: f, op: einsum, eq: 'ab, ac -> cb', in: [x, u]}\n"
	            "outputs: [a, b, c, d, e, f]\n");
	const Graph *g = &L.g;
	SHAPE(g, "a", 2, 4);
	assert_string_equal(producer(g, "a")->attr->eq, "ij,jk->ik");
	SHAPE(g, "b", 3, 2);
	assert_string_equal(producer(g, "b")->attr->eq, "ba->ab");
	SCALAR(g, "c");
	SHAPE(g, "d", 5);
	SHAPE(g, "e", 3, 7); /* ASCII order: B before C */
	assert_string_equal(producer(g, "e")->attr->eq, "aB,aC->BC");
	SHAPE(g, "f", 7, 3);
	/* flops: 2 * product of distinct letter sizes; one operand: the product */
	double want = 2.0 * 2 * 3 * 4 + 2 * 3 + 5 + 5 + 2.0 * 2 * 3 * 7 + 2.0 * 2 * 3 * 7;
	assert_true(graph_flops(g) == want);
	load_end(&L);
}

static void test_reduce_and_axis_attrs(void **state)
{
	Load L;
	load_ok(&L, "inputs: {x: {shape: [2, 3, 4]}}\n"
	            "ops:\n"
	            "  - {out: a, op: reduce_max, axes: [-1, 0], in: [x]}\n"
	            "  - {out: b, op: reduce_mean, axes: [-1, 0], keepdims: true, in: [x]}\n"
	            "  - {out: c, op: reduce_sum, in: [x]}\n"
	            "  - {out: d, op: reduce_sum, axes: [], in: [x]}\n"
	            "  - {out: e, op: softmax, in: [x]}\n"
	            "  - {out: f, op: log_softmax, axis: -3, in: [x]}\n"
	            "outputs: [a, b, c, d, e, f]\n");
	const Graph *g = &L.g;
	const Attr *a = producer(g, "a")->attr;
	assert_int_equal(a->naxes, 2);
	assert_int_equal(a->axes[0], 0);
	assert_int_equal(a->axes[1], 2);
	SHAPE(g, "a", 3);
	SHAPE(g, "b", 1, 3, 1);
	SCALAR(g, "c");
	assert_int_equal(producer(g, "c")->attr->naxes, 3);
	SHAPE(g, "d", 2, 3, 4);
	assert_int_equal(producer(g, "e")->attr->axes[0], 2);
	assert_int_equal(producer(g, "f")->attr->axes[0], 0);
	load_end(&L);
}

static void test_movement(void **state)
{
	Load L;
	load_ok(&L, "inputs: {x: {shape: [2, 3, 4]}, y: {shape: [2, 5, 4]}, v: {shape: [3, 1]}}\n"
	            "ops:\n"
	            "  - {out: t0, op: transpose, in: [x]}\n"
	            "  - {out: t1, op: transpose, perm: [-1, 0, 1], in: [x]}\n"
	            "  - {out: r, op: reshape, shape: [4, -1], in: [x]}\n"
	            "  - {out: s, op: reshape, shape: [], in: [v2]}\n"
	            "  - {out: bc, op: broadcast_to, shape: [2, 3, 7], in: [v]}\n"
	            "  - {out: cc, op: concat, axis: -2, in: [x, y, x]}\n"
	            "  - {out: p, op: pad, low: [0, 1, 2], high: [3, 0, 1], value: -1, in: [x]}\n"
	            "  - {out: c8, op: cast, dtype: i32, in: [x]}\n"
	            "  - {out: cp, op: copy, in: [c8]}\n"
	            "outputs: [t0, t1, r, bc, cc, p, cp]\n"
	            "params: {v2: {shape: [1, 1, 1]}}\n");
	const Graph *g = &L.g;
	SHAPE(g, "t0", 4, 3, 2);
	assert_int_equal(producer(g, "t0")->attr->axes[0], 2);
	SHAPE(g, "t1", 4, 2, 3);
	assert_int_equal(producer(g, "t1")->attr->axes[0], 2);
	SHAPE(g, "r", 4, 6);
	assert_true(producer(g, "r")->attr->shape.dim[1] == 6);
	SCALAR(g, "s");
	SHAPE(g, "bc", 2, 3, 7);
	SHAPE(g, "cc", 2, 11, 4);
	assert_int_equal(producer(g, "cc")->attr->axis, 1);
	SHAPE(g, "p", 5, 4, 7);
	assert_true(producer(g, "p")->attr->value == -1);
	assert_int_equal(val(g, "c8")->dtype, DT_I32);
	assert_int_equal(val(g, "cp")->dtype, DT_I32);
	assert_true(graph_flops(g) == 0);
	load_end(&L);
}

/* Slice output sizes against counting the kept indices. */
static void test_slice(void **state)
{
	static const int cases[][4] = {{0, 10, 1, 10}, {1, 10, 3, 10}, {2, 9, 4, 9}, {0, 1, 5, 7}, {3, 7, 2, 7}, {6, 7, 1, 7}};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		int lo = cases[c][0], hi = cases[c][1], st = cases[c][2], n = cases[c][3];
		char text[256];
		snprintf(text, sizeof text,
		         "inputs: {x: {shape: [%d, 2]}}\nops: [{out: y, op: slice, start: [%d, 0], limit: [%d, 2], stride: [%d, 1], in: [x]}]\noutputs: [y]\n",
		         n, lo, hi, st);
		int64_t count = 0;
		for (int i = lo; i < hi; i += st)
			count++;
		Load L;
		load_ok(&L, text);
		SHAPE(&L.g, "y", count, 2);
		load_end(&L);
	}
}

/* conv2d: output sizes against counting the window positions that fit. */
static int64_t count_windows(int64_t in, int64_t k, int64_t st, int64_t lo, int64_t hi)
{
	int64_t n = 0;
	for (int64_t p = -lo; p + k <= in + hi; p += st)
		n++;
	return n;
}

static void test_conv2d(void **state)
{
	static const int cases[][3] = {{8, 3, 1}, {8, 3, 2}, {7, 3, 2}, {5, 4, 3}, {9, 1, 4}, {4, 5, 1}, {6, 2, 2}};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		int h = cases[c][0], k = cases[c][1], st = cases[c][2];
		char text[512];
		snprintf(text, sizeof text,
		         "inputs: {x: {shape: [2, %d, 5, 3]}, w: {shape: [%d, 2, 3, 4]}}\n"
		         "ops:\n"
		         "  - {out: s, op: conv2d, strides: [%d, 1], padding: same, in: [x, w]}\n"
		         "  - {out: e, op: conv2d, strides: [%d, 2], padding: [[1, 2], [0, 1]], in: [x, w]}\n"
		         "outputs: [s, e]\n",
		         h, k, st, st);
		Load L;
		load_ok(&L, text);
		const Attr *a = producer(&L.g, "s")->attr;
		int64_t out = (h + st - 1) / st; /* SAME: ceil(h / stride) */
		SHAPE(&L.g, "s", 2, out, 5, 4);
		int64_t t = a->padding[0][0], b = a->padding[0][1];
		assert_int_equal(a->pad_mode, CONV_PAD_SAME);
		assert_true(b == t || b == t + 1); /* the odd one at the bottom */
		assert_int_equal(count_windows(h, k, st, t, b), out);
		assert_true(count_windows(h, k, st, t > 0 ? t - 1 : 0, t > 0 ? b - 1 : 0) < out || t == 0);
		assert_true(a->padding[1][0] == 0 && a->padding[1][1] == 1); /* width 5, kernel 2, stride 1 */
		SHAPE(&L.g, "e", 2, count_windows(h, k, st, 1, 2), count_windows(5, 2, 2, 0, 1), 4);
		double want = 0;
		for (int i = 0; i < 2; i++) {
			const Shape *o = &val(&L.g, i ? "e" : "s")->shape;
			want += 2.0 * o->dim[0] * o->dim[1] * o->dim[2] * k * 2 * 3 * 4;
		}
		assert_true(graph_flops(&L.g) == want);
		load_end(&L);
	}
}

static void test_lookups(void **state)
{
	Load L;
	load_ok(&L, "inputs: {ids: {shape: [4, 6], dtype: i32}}\n"
	            "params: {emb: {shape: [100, 16, 2], dtype: bf16}}\n"
	            "ops:\n"
	            "  - {out: e, op: take, in: [emb, ids]}\n"
	            "  - {out: o, op: one_hot, depth: 10, in: [ids]}\n"
	            "outputs: [e, o]\n");
	SHAPE(&L.g, "e", 4, 6, 16, 2);
	assert_int_equal(val(&L.g, "e")->dtype, DT_BF16);
	SHAPE(&L.g, "o", 4, 6, 10);
	assert_int_equal(val(&L.g, "o")->dtype, DT_F32);
	assert_true(producer(&L.g, "o")->attr->depth == 10);
	load_end(&L);
}

static void test_binary_broadcast(void **state)
{
	Load L;
	load_ok(&L, "inputs: {a: {shape: [3, 1]}, b: {shape: [4]}, c: {shape: [2, 1, 1]}}\n"
	            "ops:\n"
	            "  - {out: x, op: add, in: [a, b]}\n"
	            "  - {out: y, op: max, in: [c, x]}\n"
	            "outputs: [y]\n");
	SHAPE(&L.g, "x", 3, 4);
	SHAPE(&L.g, "y", 2, 3, 4);
	assert_true(graph_flops(&L.g) == 12 + 24);
	load_end(&L);
}

static void test_collectives(void **state)
{
	Load L;
	load_ok(&L, "mesh: {data: 2, model: 4}\n"
	            "inputs: {x: {shape: [8, 3]}, y: {shape: [2, 8]}}\n"
	            "ops:\n"
	            "  - {out: g, op: all_gather, axes: [model, data], dim: 0, in: [x]}\n"
	            "  - {out: r, op: reduce_scatter, axes: [model], dim: -1, reduce: max, in: [y]}\n"
	            "  - {out: t, op: all_to_all, axes: [model], split_dim: 0, concat_dim: 1, in: [x]}\n"
	            "  - {out: s, op: all_reduce, axes: [data], in: [x]}\n"
	            "  - {out: p, op: collective_permute, axes: [model], shift: -1, in: [x]}\n"
	            "outputs: [g, r, t, s, p]\n");
	const Graph *g = &L.g;
	SHAPE(g, "g", 64, 3);
	const Attr *a = producer(g, "g")->attr;
	assert_int_equal(a->ncax, 2);
	assert_int_equal(a->cax[0], 1);
	assert_int_equal(a->cax[1], 0);
	SHAPE(g, "r", 2, 2);
	assert_int_equal(producer(g, "r")->attr->reduce, REDUCE_MAX);
	assert_int_equal(producer(g, "r")->attr->dim, 1);
	SHAPE(g, "t", 2, 12);
	assert_int_equal(producer(g, "t")->attr->dim2, 1);
	SHAPE(g, "s", 8, 3);
	assert_int_equal(producer(g, "s")->attr->reduce, REDUCE_SUM);
	assert_true(producer(g, "p")->attr->shift == -1);
	load_end(&L);
}

/* ---- errors ---- */

static void test_errors(void **state)
{
	const char *in = "inputs: {x: {shape: [2, 3]}, i: {shape: [2], dtype: i32}}\n";
	char text[1024];
	int nbad = 0;
#define ERR(ops, pos, frag)                                                                  \
	do {                                                                                 \
		snprintf(text, sizeof text, "%sops:\n%soutputs: [x]\n", in, ops);           \
		try_error(text, pos, frag, &nbad);                                                \
	} while (0)
	ERR("  - {out: y, op: einsum, eq: 'ab,bc,cd->ad', in: [x, x]}\n", "3:30", "at most 2 operands");
	ERR("  - {out: y, op: einsum, eq: 'ab,bc->ac', in: [x]}\n", "3:5", "expected 2 operands for einsum 'ab,bc->ac'");
	ERR("  - {out: y, op: einsum, eq: 'abc->a', in: [x]}\n", "3:5", "to have rank 3");
	ERR("  - {out: y, op: einsum, eq: 'ab->aa', in: [x]}\n", "3:30", "found 'a' twice");
	ERR("  - {out: y, op: einsum, eq: 'a1->a', in: [x]}\n", "3:30", "found '1'");
	ERR("  - {out: y, op: einsum, in: [x]}\n", "3:5", "expected key 'eq' in einsum");
	ERR("  - {out: y, op: relu, in: ['3']}\n", "3:29", "found the quoted string '3'");
	ERR("  - {out: y, op: relu, in: x}\n", "3:28", "expected a list of operands");
	ERR("  - {out: y, op: relu}\n", "3:5", "expected key 'in' in an op");
	ERR("  - {op: relu, in: [x]}\n", "3:5", "expected key 'out' in an op");
	ERR("  - {out: x, op: relu, in: [x]}\n", "3:11", "already defined at <t>:1:10");
	ERR("  - {out: y, op: relu, in: [y]}\n", "3:29", "defined at <t>:3:11");
	ERR("  - {out: y, op: reduce_sum, axes: [1, -1], in: [x]}\n", "3:40", "each axis once");
	ERR("  - {out: y, op: transpose, perm: [0], in: [x]}\n", "3:35", "permutation of the 2 axes");
	ERR("  - {out: y, op: transpose, perm: [1, 1], in: [x]}\n", "3:39", "each axis once");
	ERR("  - {out: y, op: reshape, shape: [-1, -1], in: [x]}\n", "3:39", "a dimension >= 1 (or one -1)");
	ERR("  - {out: y, op: reshape, shape: [4, -1], in: [x]}\n", "3:34", "-1 can be inferred from 6 elements");
	ERR("  - {out: y, op: broadcast_to, shape: [3, 3], in: [x]}\n", "3:5", "that [2, 3] broadcasts to");
	ERR("  - {out: y, op: slice, start: [0], limit: [2, 3], in: [x]}\n", "3:32", "a list of 2 integers");
	ERR("  - {out: y, op: slice, start: [1, 1], limit: [1, 3], in: [x]}\n", "3:5", "start < limit");
	ERR("  - {out: y, op: slice, start: [0, 0], limit: [2, 3], stride: [1, 0], in: [x]}\n", "3:67", "a stride in 1..");
	ERR("  - {out: y, op: pad, low: [0, -1], high: [0, 0], in: [x]}\n", "3:32", "a padding in 0..");
	ERR("  - {out: y, op: concat, axis: 2, in: [x, x]}\n", "3:32", "an axis in -2..1");
	ERR("  - {out: y, op: concat, axis: 0, in: [x, i]}\n", "3:5", "shapes equal except in axis 0");
	ERR("  - {out: y, op: one_hot, depth: 0, in: [i]}\n", "3:34", "a depth in 1..");
	ERR("  - {out: y, op: one_hot, depth: 3, in: [x]}\n", "3:5", "expected i32 ids for one_hot, found f32 'x'");
	ERR("  - {out: y, op: take, in: [x, x]}\n", "3:5", "expected i32 ids for take");
	ERR("  - {out: y, op: cast, dtype: f8, in: [x]}\n", "3:31", "expected a dtype");
	ERR("  - {out: y, op: add, in: [x, i]}\n", "3:5", "operands of one dtype for add, found f32 and i32");
	ERR("  - {out: y, op: add, in: [i, 1]}\n", "3:5", "floating-point operand for add");
	ERR("  - {out: y, op: softmax, in: [3]}\n", "3:5", "rank >= 1 for softmax");
	ERR("  - {out: y, op: layer_norm, eps: 0, in: [x]}\n", "3:35", "an eps > 0");
	ERR("  - {out: y, op: conv2d, in: [x, x]}\n", "3:5", "rank 4");
	ERR("  - {out: y, op: conv2d, padding: full, in: [x, x]}\n", "3:35", "padding same, valid or");
	ERR("  - {out: y, op: all_reduce, axes: [data], in: [x]}\n", "3:37", "the model has no mesh");
	ERR("  - {out: y, op: all_gather, in: [x]}\n", "3:5", "expected key 'axes' in all_gather");
	ERR("  - {out: y, op: relu, in: [x], sharding: [null, data]}\n", "3:50", "no mesh");
	ERR("  - {out: y, op: reduce_sum, keepdims: 1, in: [x]}\n", "3:40", "true or false");
	ERR("  - [y, relu, x]\n", "3:5", "expected an op (a mapping with out, op and in), found a list");
	ERR("  - {out: y, op: [relu], in: [x]}\n", "3:18", "expected an op name, found a list");
	ERR("  - {out: y, op: softmax, axis: 1, eps: 2, in: [x]}\n", "3:36", "one of out, op, in, sharding, shard_as, stage, axis, found 'eps'");
#undef ERR
	try_error("mesh: {data: 2, model: 2}\ninputs: {x: {shape: [4]}}\n"
	            "ops: [{out: y, op: collective_permute, axes: [data, model], in: [x]}]\noutputs: [y]\n",
	            "3:46", "one mesh axis for collective_permute", &nbad);
	try_error("mesh: {data: 2}\ninputs: {x: {shape: [4]}}\n"
	            "ops: [{out: y, op: all_gather, axes: [data, data], dim: 0, in: [x]}]\noutputs: [y]\n",
	            "3:45", "each mesh axis once", &nbad);
	try_error("mesh: {a: 1, b: 1, c: 1, d: 1, e: 1}\ninputs: {}\nops: []\noutputs: []\n", "1:32",
	            "at most 4 mesh axes, found 5", &nbad);
	try_error("mesh: {}\ninputs: {}\nops: []\noutputs: []\n", "1:7", "1 to 4 mesh axes, found none", &nbad);
	try_error("mesh: {1data: 2}\ninputs: {}\nops: []\noutputs: []\n", "1:8", "a mesh axis name", &nbad);
	try_error("mesh: {_data: 2}\ninputs: {}\nops: []\noutputs: []\n", "1:8", "a mesh axis name", &nbad);
	try_error("inputs: {a-b: {shape: [1]}}\nops: []\noutputs: []\n", "1:10", "a value name", &nbad);
	try_error("mesh: {axes: {data: 2}, devices: [0, 2]}\ninputs: {}\nops: []\noutputs: []\n", "1:38",
	            "a device id in 0..1", &nbad);
	try_error("mesh: {axes: {data: 2}, device: [0, 1]}\ninputs: {}\nops: []\noutputs: []\n", "1:25",
	            "one of axes, devices, hardware, found 'device'", &nbad);
	try_error("inputs: {x: {shape: [2]}}\nops: []\noutputs: []\n", "3:10", "a non-empty list of output names", &nbad);
	try_error("inputs: {x: {shape: [2]}}\nops: []\noutputs: [z]\n", "3:11", "found 'z'", &nbad);
	try_error("inputs: {x: {shape: [2], init: zeros}}\nops: []\noutputs: [x]\n", "1:26", "found 'init'", &nbad);
	try_error("inputs: {x: {dtype: f32}}\nops: []\noutputs: [x]\n", "1:13", "expected key 'shape' in an input", &nbad);
	try_error("inputs: {x: [2, 3]}\nops: []\noutputs: [x]\n", "1:13", "a mapping with shape, dtype and sharding", &nbad);
	try_error("inputs: []\nops: []\noutputs: [x]\n", "1:9", "a mapping of input names", &nbad);
	try_error("params: {w: {shape: [2], init: {normal: -1}}}\ninputs: {}\nops: []\noutputs: [w]\n", "1:41",
	            "a standard deviation >= 0", &nbad);
	try_error("params: {w: {shape: [2], init: random}}\ninputs: {}\nops: []\noutputs: [w]\n", "1:32",
	            "an init (zeros, ones", &nbad);
	try_error("inputs: {x: {shape: [2]}}\nops: []\n", "1:1", "expected key 'outputs' in the model", &nbad);
	try_error("x: [1, 2\n", "2:1", "expected valid YAML", &nbad);
	try_error("a: 1\n\tb: 2\n", "2:1", "expected valid YAML", &nbad);
	try_error("{a: 1, [b]: 2}\n", "1:8", "expected a plain key, found a list", &nbad);
	try_error("inputs: !foo {}\nops: []\noutputs: [x]\n", "1:9", "found a tag !foo", &nbad);
	try_error("", "1:1", "found an empty file", &nbad);
	try_error("---\n", "2:1", "found nothing", &nbad);
	try_error("# only a comment\n", "1:1", "found an empty file", &nbad);
	assert_int_equal(nbad, 0);
}

/* Several mistakes in one file are all reported, and a failed op does not
 * make its users report "undefined". */
static void test_many_errors(void **state)
{
	Load L;
	load_text(&L, "inputs: {x: {shape: [2, 3]}}\n"
	              "ops:\n"
	              "  - {out: a, op: add, in: [x, 1], foo: 1}\n"
	              "  - {out: b, op: relu, in: [a]}\n"
	              "  - {out: c, op: relu, in: [nope]}\n"
	              "  - {out: d, op: tanh, in: [b, b]}\n"
	              "outputs: [b, c, d]\n");
	assert_int_equal(L.rc, -1);
	assert_int_equal(L.d.nerr, 3);
	load_end(&L);
	load_text(&L, "inputs: {x: {shape: [2, 3]}}\n"
	              "ops:\n"
	              "  - {out: a, op: add, in: [x, q]}\n"
	              "  - {out: b, op: relu, in: [a]}\n"
	              "outputs: [b]\n");
	assert_int_equal(L.d.nerr, 1);
	load_end(&L);
}

static void test_missing_file(void **state)
{
	Load L;
	load_file(&L, "tests/bad/does-not-exist.yaml");
	assert_int_equal(L.rc, -1);
	char line[256];
	assert_string_equal(first_line(&L, line, sizeof line),
	                    "tests/bad/does-not-exist.yaml: error: cannot open: No such file or directory");
	load_end(&L);
	load_file(&L, "tests");
	assert_int_equal(L.rc, -1);
	assert_non_null(strstr(L.buf, "cannot open: Is a directory"));
	load_end(&L);
}

/* Every tests/bad/NAME.yaml: its first line says `# expect: LINE:COL: MESSAGE` or `# expect: ok`. */
static void check_catalogue_file(const char *path)
{
	char head[600] = "";
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	if (!fgets(head, sizeof head, f))
		head[0] = 0;
	fclose(f);
	head[strcspn(head, "\n")] = 0;
	assert_true(strncmp(head, "# expect: ", 10) == 0);
	const char *expect = head + 10;
	Load L;
	load_file(&L, path);
	char line[700], want[1200];
	first_line(&L, line, sizeof line);
	if (!strcmp(expect, "ok")) {
		if (L.rc != 0)
			print_error("%s: %s\n", path, line), fail();
		load_end(&L);
		return;
	}
	const char *msg = strstr(expect, ": ");
	assert_non_null(msg);
	snprintf(want, sizeof want, "%s:%.*s: error: expected", path, (int)(msg - expect), expect);
	if (L.rc != -1 || strncmp(line, want, strlen(want)) != 0 || !strstr(line, msg + 2)) {
		print_error("%s:\n  wanted: %s ... %s\n  got:    %s\n", path, want, msg + 2, line);
		fail();
	}
	load_end(&L);
}

static void test_catalogue(void **state)
{
	DIR *dir = opendir("tests/bad");
	assert_non_null(dir);
	int n = 0;
	for (struct dirent *e; (e = readdir(dir));) {
		size_t len = strlen(e->d_name);
		if (len < 5 || strcmp(e->d_name + len - 5, ".yaml") != 0)
			continue;
		char path[512];
		snprintf(path, sizeof path, "tests/bad/%s", e->d_name);
		check_catalogue_file(path);
		n++;
	}
	closedir(dir);
	assert_true(n >= 40);
}

/* ---- robustness and size ---- */

/* Every prefix of a model, and single-byte damage at every position: the
 * loader either succeeds with a verified graph or fails with a message. */
static void test_truncations(void **state)
{
	size_t n = strlen(mlp);
	char *text = xmalloc(n + 1);
	for (size_t k = 0; k <= n; k++) {
		for (int damage = 0; damage < 3; damage++) {
			memcpy(text, mlp, n + 1);
			if (damage == 0)
				text[k] = 0;
			else if (k < n)
				text[k] = damage == 1 ? '[' : ':';
			Load L;
			load_text(&L, text);
			if (L.rc == 0)
				assert_int_equal(graph_verify(&L.g, &L.d), 0);
			else
				assert_true(L.d.nerr > 0 && L.len > 0);
			load_end(&L);
		}
	}
	free(text);
}

static void test_deep_nesting(void **state)
{
	size_t n = 100000;
	char *text = xmalloc(n + 16);
	memcpy(text, "name: ", 6);
	memset(text + 6, '[', n);
	text[n + 6] = 0;
	check_error(text, "1:70", "at most 64 levels of nesting");
	free(text);
}

/* 100,000 ops and 20,000 inputs load in well under a second: the loader is linear. */
static void test_large_model(void **state)
{
	enum { NOPS = 100000, NIN = 20000 };
	size_t cap = (size_t)NOPS * 48 + (size_t)NIN * 40 + 256, k = 0;
	char *text = xmalloc(cap);
	k += (size_t)snprintf(text + k, cap - k, "inputs:\n");
	for (int i = 0; i < NIN; i++)
		k += (size_t)snprintf(text + k, cap - k, "  in%d: {shape: [4]}\n", i);
	k += (size_t)snprintf(text + k, cap - k, "ops:\n  - {out: v0, op: relu, in: [in0]}\n");
	for (int i = 1; i < NOPS; i++)
		k += (size_t)snprintf(text + k, cap - k, "  - {out: v%d, op: add, in: [v%d, in%d]}\n", i, i - 1, i % NIN);
	snprintf(text + k, cap - k, "outputs: [v%d]\n", NOPS - 1);
	clock_t t0 = clock(); /* CPU time: a busy shared machine does not stretch it */
	Load L;
	load_ok(&L, text);
	double dt = (double)(clock() - t0) / CLOCKS_PER_SEC;
	assert_int_equal(L.g.ops.n, NOPS);
	assert_int_equal(L.g.values.n, NOPS + NIN);
	print_message("loaded %d ops in %.3f s\n", NOPS, dt);
	assert_true(dt < 20);
	load_end(&L);
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mlp),
		cmocka_unit_test(test_constants),
		cmocka_unit_test(test_mesh_long_form),
		cmocka_unit_test(test_value_entries),
		cmocka_unit_test(test_numbers_and_bools),
		cmocka_unit_test(test_yaml_scalars),
		cmocka_unit_test(test_einsum),
		cmocka_unit_test(test_reduce_and_axis_attrs),
		cmocka_unit_test(test_movement),
		cmocka_unit_test(test_slice),
		cmocka_unit_test(test_conv2d),
		cmocka_unit_test(test_lookups),
		cmocka_unit_test(test_binary_broadcast),
		cmocka_unit_test(test_collectives),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_many_errors),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_catalogue),
		cmocka_unit_test(test_truncations),
		cmocka_unit_test(test_deep_nesting),
		cmocka_unit_test(test_large_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
