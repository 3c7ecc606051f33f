/* test_shard_roll.c: the device-dependent roll of partitioned programs —
 * its kernel against a naive index formula written here, its round trip
 * through the writer and the loader (with the per-device fact `roll`), and
 * the loader's errors, message and place exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include "../runtime/kernels.h"
#include "../spmd/emit.h"
#include "../spmd/load.h"

/* ---- the kernel ---- */

/* A mesh of the given axes; devices: the device at each position, or NULL. */
static void make_mesh(Mesh *m, Arena *a, int naxes, const char *const *names, const int *sizes, const int *devices)
{
	memset(m, 0, sizeof *m);
	m->naxes = naxes;
	for (int i = 0; i < naxes; i++)
		m->name[i] = names[i], m->size[i] = sizes[i];
	assert_int_equal(mesh_finish(m, a, devices), 0);
}

/* c, computed here from the mesh's sizes and device order alone: the
 * device's position, its row-major coordinates, and those of the listed
 * axes read as one row-major number. */
static int64_t naive_index(const Mesh *m, const int *devices, int device, const int *axes, int nax)
{
	int pos = device, coord[MESH_MAX_AXES];
	for (int p = 0; devices && p < m->ndev; p++)
		if (devices[p] == device)
			pos = p;
	for (int a = m->naxes - 1; a >= 0; a--)
		coord[a] = pos % m->size[a], pos /= m->size[a];
	int64_t c = 0;
	for (int i = 0; i < nax; i++)
		c = c * m->size[axes[i]] + coord[axes[i]];
	return c;
}

/* y[i] = x[i with i[dim] = (i[dim] - k * c * S / n) mod S], element by element. */
static void naive_roll(const Shape *s, int dim, int64_t shift, const int32_t *x, int32_t *y)
{
	int64_t idx[MAX_RANK] = {0}, numel = shape_numel(s), size = s->dim[dim];
	for (int64_t i = 0; i < numel; i++) {
		int64_t src = 0;
		for (int d = 0; d < s->rank; d++) {
			int64_t j = d == dim ? ((idx[d] - shift) % size + size) % size : idx[d];
			src = src * s->dim[d] + j;
		}
		y[i] = x[src];
		for (int d = s->rank - 1; d >= 0 && ++idx[d] == s->dim[d]; d--)
			idx[d] = 0;
	}
}

/* Run the kernel on every device of m and compare with naive_roll. */
static void check_roll(const Mesh *m, const int *devices, const int *axes, int nax, const Shape *s, int dim,
                       int64_t k, DType dt)
{
	Attr at = {.ncax = nax, .dim = dim, .shift = k};
	memcpy(at.cax, axes, sizeof(int) * (size_t)nax);
	Op op = {.kind = OP_SHARD_ROLL, .nin = 1, .attr = &at};
	int64_t n = 1, numel = shape_numel(s);
	for (int i = 0; i < nax; i++)
		n *= m->size[axes[i]];
	Tensor x, y;
	tensor_alloc(&x, dt, s);
	tensor_alloc(&y, dt, s);
	for (int64_t i = 0; i < numel; i++)
		((int32_t *)x.data)[i] = (int32_t)(i * 7 + 1); /* distinct bit patterns, f32 or i32 */
	int32_t *want = xmalloc(sizeof(int32_t) * (size_t)numel);
	const Tensor *in[1] = {&x};
	for (int dev = 0; dev < m->ndev; dev++) {
		KernCtx kc = {.mesh = m, .device = dev};
		int64_t c = naive_index(m, devices, dev, axes, nax);
		assert_int_equal(c, mesh_group_index(m, dev, axes, nax));
		naive_roll(s, dim, k * c * (s->dim[dim] / n), x.data, want);
		memset(y.data, 0xAB, 4 * (size_t)numel);
		assert_int_equal(op_kernels[OP_SHARD_ROLL](&kc, &op, in, &y), 0);
		if (memcmp(y.data, want, 4 * (size_t)numel) != 0)
			fail_msg("shard_roll: rank %d, dim %d, shift %lld, %d axes, device %d differs", s->rank, dim,
			         (long long)k, nax, dev);
	}
	free(want);
	tensor_free(&x), tensor_free(&y);
}

/* Every rank 1..4, every dim (its size 1, 2 or 3 times the group's), every
 * shift of a few, on each mesh and choice of axes. */
static void sweep(const Mesh *m, const int *devices, const int *axes, int nax)
{
	static const int64_t shifts[] = {1, -1, 2, 0, 7, -5};
	static const int64_t base[MAX_RANK] = {2, 3, 1, 2};
	int64_t n = 1;
	for (int i = 0; i < nax; i++)
		n *= m->size[axes[i]];
	for (int rank = 1; rank <= 4; rank++)
		for (int dim = 0; dim < rank; dim++)
			for (size_t k = 0; k < sizeof shifts / sizeof *shifts; k++) {
				Shape s = {.rank = rank};
				memcpy(s.dim, base, sizeof s.dim);
				s.dim[dim] = n * (1 + (rank + dim + (int)k) % 3);
				check_roll(m, devices, axes, nax, &s, dim, shifts[k], k % 2 ? DT_I32 : DT_F32);
			}
}

static void test_kernel(void **state)
{
	Arena a;
	Mesh m;
	arena_init(&a);
	static const char *const names[] = {"a", "b"};
	make_mesh(&m, &a, 1, names, (int[]){4}, NULL);
	sweep(&m, NULL, (int[]){0}, 1);
	make_mesh(&m, &a, 2, names, (int[]){2, 3}, NULL);
	sweep(&m, NULL, (int[]){0}, 1);
	sweep(&m, NULL, (int[]){1}, 1);
	sweep(&m, NULL, (int[]){0, 1}, 2);
	sweep(&m, NULL, (int[]){1, 0}, 2);
	/* a device order: the index comes from the device's position */
	static const int order[] = {5, 3, 1, 0, 2, 4};
	make_mesh(&m, &a, 2, names, (int[]){2, 3}, order);
	sweep(&m, order, (int[]){0, 1}, 2);
	sweep(&m, order, (int[]){1}, 1);
	arena_free(&a);
}

/* A negative dim (as a pass may build it) rolls the dim it counts from the end. */
static void test_kernel_negative_dim(void **state)
{
	Arena a;
	Mesh m;
	arena_init(&a);
	make_mesh(&m, &a, 1, (const char *const[]){"a"}, (int[]){4}, NULL);
	Shape s = {3, {2, 8, 3}};
	Attr neg = {.ncax = 1, .cax = {0}, .dim = -2, .shift = 3};
	assert_int_equal(op_roll_dim(&neg, &s), 1);
	for (int dev = 0; dev < 4; dev++)
		assert_int_equal(op_roll_elems(&m, &neg, &s, dev), 3 * dev * 2 % 8);
	check_roll(&m, NULL, (int[]){0}, 1, &s, 1, 3, DT_F32);
	arena_free(&a);
}

/* ---- the writer and the loader ---- */

/* A program: x split on a, gathered, then rolled over [b, a] along its
 * columns by -1, and x rolled over [a] along its rows by the default 1. */
static const char *const program =
	"spmd: true\n"
	"name: rolls\n"
	"mesh: {a: 2, b: 2}\n"
	"inputs:\n"
	"  x: {shape: [2, 8], global: [4, 8], dtype: f32, sharding: [a, null]}\n"
	"ops:\n"
	"  - {out: g, op: all_gather, in: [x], axes: [a], dim: 0, sharding: [null, null], global: [4, 8]}\n"
	"  - {out: r, op: shard_roll, in: [g], axes: [b, a], dim: 1, shift: -1, why: \"chunks in this device's order\"}\n"
	"  - {out: s, op: shard_roll, in: [x], axes: [a], dim: 0}\n"
	"outputs: [s]\n";

/* Load text as a program into g; the first message, if any, into msg. */
static int load_program(Graph *g, const char *text, LoadKind *kind, char *msg, size_t n)
{
	Diag d;
	char *buf = NULL;
	size_t len = 0;
	diag_init(&d);
	d.out = open_memstream(&buf, &len);
	assert_non_null(d.out);
	int rc = program_load_string(g, text, "<t>", kind, &d);
	fclose(d.out);
	snprintf(msg, n, "%s", buf ? buf : "");
	msg[strcspn(msg, "\n")] = 0;
	free(buf);
	return rc;
}

static void load_ok(Graph *g, const char *text, LoadKind *kind)
{
	char msg[512];
	if (load_program(g, text, kind, msg, sizeof msg) != 0)
		fail_msg("does not load: %s\n%s", msg, text);
}

/* Writing what was read gives the same text. */
static char *fixed_point(const char *text, int device)
{
	Graph g;
	LoadKind kind;
	size_t n;
	load_ok(&g, text, &kind);
	assert_int_equal(kind.device, device);
	char *again = emit_text(&g, device, &n);
	assert_string_equal(again, text);
	graph_free(&g);
	return again;
}

static void test_round_trip(void **state)
{
	Graph g;
	LoadKind kind;
	size_t n;
	load_ok(&g, program, &kind);
	const Op *r = &g.ops.a[1], *s = &g.ops.a[2];
	assert_int_equal(r->kind, OP_SHARD_ROLL);
	assert_int_equal(r->attr->ncax, 2);
	assert_int_equal(r->attr->cax[0], 1);
	assert_int_equal(r->attr->cax[1], 0);
	assert_int_equal(r->attr->dim, 1);
	assert_true(r->attr->shift == -1);
	assert_true(s->attr->shift == 1);
	const Value *sv = &g.values.a[s->out];
	assert_true(spec_eq(&sv->spec, &g.values.a[s->in[0]].spec)); /* the operand's layout and global shape */
	assert_int_equal(sv->global.dim[0], 4);
	char *text = emit_text(&g, -1, &n);
	assert_non_null(strstr(text, "  - {out: r, op: shard_roll, in: [g], axes: [b, a], dim: 1, shift: -1, sharding: "
	                             "[null, null], global: [4, 8], why: \"chunks in this device's order\"}\n"));
	assert_non_null(strstr(text, "  - {out: s, op: shard_roll, in: [x], axes: [a], dim: 0, shift: 1, sharding: "
	                             "[a, null], global: [4, 8]}\n"));
	free(fixed_point(text, -1));
	/* per device: c = 2 b + a over [b, a] (device d: a = d / 2, b = d % 2);
	 * r turns 8 columns by -1 * c * 2, s turns 2 rows by a */
	static const int64_t want_r[4] = {0, 4, 6, 2}, want_s[4] = {0, 0, 1, 1};
	for (int dev = 0; dev < 4; dev++) {
		char *dt = emit_text(&g, dev, &n), fact[64];
		snprintf(fact, sizeof fact, "global: [4, 8], roll: %lld, why:", (long long)want_r[dev]);
		assert_non_null(strstr(dt, fact));
		snprintf(fact, sizeof fact, "global: [4, 8], roll: %lld}", (long long)want_s[dev]);
		assert_non_null(strstr(dt, fact));
		free(fixed_point(dt, dev));
		free(dt);
	}
	free(text);
	graph_free(&g);
}

/* An op a pass builds (not read from a file) is written so that it reads back. */
static void test_built_op(void **state)
{
	Graph g, back;
	LoadKind kind;
	size_t n;
	load_ok(&g, program, &kind);
	int x = g.ops.a[2].in[0];
	int y = graph_value(&g, "t", DT_F32, &g.values.a[x].shape, VK_INTER, (Pos){0});
	g.values.a[y].spec = g.values.a[x].spec, g.values.a[y].global = g.values.a[x].global;
	int id = graph_op(&g, OP_SHARD_ROLL, &x, 1, y, (Pos){0});
	*g.ops.a[id].attr = (Attr){.ncax = 2, .cax = {0, 1}, .dim = -1, .shift = 6};
	assert_int_equal(graph_verify(&g, NULL), 0);
	char *text = emit_text(&g, 3, &n); /* c = 3 of 4, S = 8: 6 * 3 * 2 mod 8 = 4 */
	assert_non_null(strstr(text, "{out: t, op: shard_roll, in: [x], axes: [a, b], dim: -1, shift: 6, sharding: [a, null], "
	                             "global: [4, 8], roll: 4}"));
	load_ok(&back, text, &kind);
	free(text);
	graph_free(&back);
	graph_free(&g);
}

/* ---- errors ---- */

/* The program prefix the error cases complete with one op line (line 6). */
static const char *const head =
	"spmd: true\n"
	"mesh: {a: 4, b: 2}\n"
	"inputs:\n"
	"  x: {shape: [2, 6], global: [8, 6], dtype: f32, sharding: [a, null]}\n"
	"ops:\n";

/* Loading text fails with want as its first line; a mismatch is printed
 * and counted in *nbad. */
static void try_error(const char *text, const char *want, int *nbad)
{
	Graph g;
	LoadKind kind;
	char msg[512];
	int rc = load_program(&g, text, &kind, msg, sizeof msg);
	graph_free(&g);
	if (rc == 0 || strcmp(msg, want) != 0) {
		print_error("program:\n%s\nwanted: %s\ngot rc %d: %s\n\n", text, want, rc, msg);
		++*nbad;
	}
}

static void check_error(const char *text, const char *want)
{
	int nbad = 0;
	try_error(text, want, &nbad);
	assert_int_equal(nbad, 0);
}

static void test_errors(void **state)
{
	char text[1024];
	int nbad = 0;
#define ERR(op, want)                                                                \
	do {                                                                         \
		snprintf(text, sizeof text, "%s  - %s\noutputs: [y]\n", head, op); \
		try_error(text, want, &nbad);                                        \
	} while (0)
	ERR("{out: y, op: shard_roll, in: [x], axes: [a], dim: 1}",
	               "<t>:6:5: error: expected dim 1's size divisible by 4 (the devices over [a]) for shard_roll, found 6");
	ERR("{out: y, op: shard_roll, in: [x], axes: [a, b], dim: -1}",
	               "<t>:6:5: error: expected dim 1's size divisible by 8 (the devices over [a, b]) for shard_roll, "
	               "found 6");
	ERR("{out: y, op: shard_roll, in: [x], axes: [a], dim: 2}",
	               "<t>:6:55: error: expected an axis in -2..1, found '2'");
	ERR("{out: y, op: shard_roll, in: [x], axes: [c], dim: 0}",
	               "<t>:6:46: error: expected a mesh axis (a, b), found 'c'");
	ERR("{out: y, op: shard_roll, in: [x], axes: [a, a], dim: 0}",
	               "<t>:6:49: error: expected each mesh axis once, found 'a'");
	ERR("{out: y, op: shard_roll, in: [x], dim: 0}",
	               "<t>:6:5: error: expected key 'axes' in shard_roll, found none");
	ERR("{out: y, op: shard_roll, in: [x], axes: [a]}",
	               "<t>:6:5: error: expected key 'dim' in shard_roll, found none");
	ERR("{out: y, op: shard_roll, in: [x], axes: [a], dim: 0, shift: 0.5}",
	               "<t>:6:65: error: expected an integer, found '0.5'");
	ERR("{out: y, op: shard_roll, in: [x], axes: [b], dim: 0, sharding: [b, null]}",
	               "<t>:6:68: error: expected the operand's layout [a, null] as the shard_roll's sharding, found a list");
	ERR("{out: y, op: shard_roll, in: [x], axes: [b], dim: 0, global: [8, 12]}",
	               "<t>:6:66: error: expected the operand's global shape [8, 6] for shard_roll, found [8, 12]");
	/* the fact belongs to per-device files */
	ERR("{out: y, op: shard_roll, in: [x], axes: [a], dim: 0, roll: 0}",
	               "<t>:6:58: error: expected one of out, op, in, sharding, global, why, stage, axes, dim, shift, "
	               "found 'roll'");
#undef ERR
	assert_int_equal(nbad, 0);
}

/* A model may not name it: it is an op of partitioned programs. */
static void test_in_model(void **state)
{
	static const char *const model = "mesh: {a: 4}\n"
	                                 "inputs: {x: {shape: [8, 4]}}\n"
	                                 "ops: [{out: y, op: shard_roll, in: [x], axes: [a], dim: 1}]\n"
	                                 "outputs: [y]\n";
	check_error(model, "<t>:3:20: error: expected an op name, found 'shard_roll' (an internal op of partitioned programs)");
	Graph g;
	Diag d;
	diag_init(&d);
	d.out = fopen("/dev/null", "w");
	assert_int_equal(model_load_string(&g, model, "<t>", &d), -1);
	fclose(d.out);
	graph_free(&g);
}

/* A device's file whose roll disagrees with what the program implies. */
static void test_wrong_fact(void **state)
{
	Graph g;
	LoadKind kind;
	size_t n;
	load_ok(&g, program, &kind);
	char *text = emit_text(&g, 1, &n), *at = strstr(text, "roll: 4,");
	assert_non_null(at);
	at[6] = '3';
	int line = 1, col = 1;
	for (const char *p = text; p < at + 6; p++)
		col = *p == '\n' ? (line++, 1) : col + 1;
	char want[160];
	snprintf(want, sizeof want, "<t>:%d:%d: error: expected 4 (the roll of device 1), found '3'", line, col);
	check_error(text, want);
	free(text);
	graph_free(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kernel),
		cmocka_unit_test(test_kernel_negative_dim),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_built_op),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_in_model),
		cmocka_unit_test(test_wrong_fact),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
