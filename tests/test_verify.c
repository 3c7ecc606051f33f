/* test_verify.c: the collective-matching check (partitioner/verify.c) against a naive simulation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include "../partitioner/verify.h"
#include "../spmd/load.h"
#include "../spmd/ops.h"

/* The mesh {a: 3, b: 2}: device d at coordinates (d / 2, d % 2). */
enum { NDEV = 6, MAXSEQ = 12 };
static const int size[2] = {3, 2};

/* One collective of a made-up per-device program. */
typedef struct {
	bool permute;
	int nax, ax[2]; /* axes, in order */
	int reduce;     /* all_reduce: 0 sum, 1 max */
	int input;      /* operand: 1 is x1 [2], 2 is x2 [3] */
	int shift;      /* permute along ax[0] */
	int name;       /* result yNAME */
} Coll;

typedef struct {
	int n[NDEV];
	Coll c[NDEV][MAXSEQ];
} Progs;

static unsigned long rng = 12345;
static int rnd(int n)
{
	rng = rng * 6364136223846793005UL + 1442695040888963407UL;
	return (int)((rng >> 33) % (unsigned long)n);
}

static Coll random_coll(int name)
{
	static const int axes[4][2] = {{0, -1}, {1, -1}, {0, 1}, {1, 0}};
	Coll c = {.permute = rnd(3) == 0, .input = 1 + rnd(2), .name = name};
	int k = c.permute ? rnd(2) : rnd(4);
	c.nax = k >= 2 ? 2 : 1, c.ax[0] = axes[k][0], c.ax[1] = axes[k][1];
	c.reduce = rnd(2);
	c.shift = 1 + rnd(size[c.ax[0]] - 1);
	return c;
}

/* Break device dev's sequence in one of the ways a hand edit would. */
static void perturb(Progs *p, int dev)
{
	int n = p->n[dev], i = rnd(n);
	Coll *c = p->c[dev];
	switch (rnd(6)) {
	case 0: memmove(&c[i], &c[i + 1], sizeof *c * (size_t)(n - i - 1)), p->n[dev]--; break;
	case 1: if (i + 1 < n) { Coll t = c[i]; c[i] = c[i + 1], c[i + 1] = t; } break;
	case 2: c[i].nax = 1, c[i].ax[0] = !c[i].ax[0]; if (c[i].permute) c[i].shift = 1; break;
	case 3: c[i].input = 3 - c[i].input; break;
	case 4: c[i].reduce = !c[i].reduce; break;
	default: c[i].shift = 1 + (c[i].shift % (size[c[i].ax[0]] - 1 + (size[c[i].ax[0]] == 2))); break;
	}
}

static void gen(Progs *p)
{
	int n = 1 + rnd(6);
	memset(p, 0, sizeof *p);
	for (int k = 0; k < n; k++) {
		Coll c = random_coll(k);
		for (int d = 0; d < NDEV; d++)
			p->c[d][k] = c;
	}
	for (int d = 0; d < NDEV; d++)
		p->n[d] = n;
	for (int k = rnd(3); k > 0; k--)
		perturb(p, rnd(NDEV));
}

/* ---- the naive simulation: scan every device until nothing moves ---- */

static void coords(int d, int *c) { c[0] = d / 2, c[1] = d % 2; }

/* Is m in the group of d over the axes of c (equal on the other axis)? */
static bool member(int d, int m, const Coll *c)
{
	int cd[2], cm[2];
	coords(d, cd), coords(m, cm);
	for (int a = 0; a < 2; a++)
		if (!(a == c->ax[0] || (c->nax == 2 && a == c->ax[1])) && cd[a] != cm[a])
			return false;
	return true;
}

static bool same_axes(const Coll *x, const Coll *y)
{
	return x->nax == y->nax && x->ax[0] == y->ax[0] && (x->nax == 1 || x->ax[1] == y->ax[1]);
}

static bool same_coll(const Coll *x, const Coll *y)
{
	return x->permute == y->permute && same_axes(x, y) && x->input == y->input && x->name == y->name &&
	       (x->permute || x->reduce == y->reduce);
}

/* Device d's permute partner at offset +shift (dir 1) or -shift (dir -1). */
static int partner(int d, const Coll *c, int dir)
{
	int cd[2], a = c->ax[0];
	coords(d, cd);
	cd[a] = ((cd[a] + dir * c->shift) % size[a] + size[a]) % size[a];
	return cd[0] * 2 + cd[1];
}

/* True: every collective goes through with members that agree. */
static bool naive(const Progs *p)
{
	int head[NDEV] = {0};
	for (bool moved = true; moved;) {
		moved = false;
		for (int d = 0; d < NDEV; d++) {
			if (head[d] == p->n[d])
				continue;
			const Coll *c = &p->c[d][head[d]];
			bool all = true;
			for (int m = 0; m < NDEV; m++)
				if (member(d, m, c) && (head[m] == p->n[m] || !same_axes(c, &p->c[m][head[m]])))
					all = false;
			if (!all)
				continue;
			for (int m = 0; m < NDEV; m++) {
				if (!member(d, m, c))
					continue;
				const Coll *o = &p->c[m][head[m]];
				if (!same_coll(c, o))
					return false;
				if (c->permute && (p->c[partner(m, o, 1)][head[partner(m, o, 1)]].shift != o->shift))
					return false; /* whom m sends to receives from another */
			}
			for (int m = 0; m < NDEV; m++)
				if (member(d, m, c))
					head[m]++;
			moved = true;
		}
	}
	for (int d = 0; d < NDEV; d++)
		if (head[d] < p->n[d])
			return false;
	return true;
}

/* ---- the same programs through the loader and verify_devices ---- */

static char *device_text(const Progs *p, int d)
{
	static const char *const ax[2] = {"a", "b"};
	size_t cap = 4096, k = 0;
	char *t = malloc(cap);
	k += (size_t)snprintf(t + k, cap - k,
	                      "spmd: true\ndevice: %d\nmesh: {a: 3, b: 2}\ninputs:\n  x1: {shape: [2]}\n  x2: {shape: [3]}\nops:%s\n", d,
	                      p->n[d] ? "" : " []");
	for (int i = 0; i < p->n[d]; i++) {
		const Coll *c = &p->c[d][i];
		char axes[16];
		snprintf(axes, sizeof axes, c->nax == 2 ? "%s, %s" : "%s", ax[c->ax[0]], ax[c->nax == 2 ? c->ax[1] : 0]);
		if (c->permute)
			k += (size_t)snprintf(t + k, cap - k, "  - {out: y%d, op: collective_permute, in: [x%d], axes: [%s], shift: %d}\n",
			                      c->name, c->input, axes, c->shift);
		else
			k += (size_t)snprintf(t + k, cap - k, "  - {out: y%d, op: all_reduce, in: [x%d], axes: [%s], reduce: %s}\n",
			                      c->name, c->input, axes, c->reduce ? "max" : "sum");
	}
	snprintf(t + k, cap - k, "outputs: [x1]\n");
	return t;
}

static bool checked(const Progs *p, VerifyResult *r)
{
	Graph g[NDEV];
	const Graph *progs[NDEV];
	for (int d = 0; d < NDEV; d++) {
		Diag diag;
		LoadKind kind;
		diag_init(&diag);
		diag.quiet = true;
		char *text = device_text(p, d);
		if (program_load_string(&g[d], text, "dev.yaml", &kind, &diag) != 0)
			fail_msg("does not load: %s\n%s", diag.last, text);
		free(text);
		progs[d] = &g[d];
	}
	int rc = verify_devices(progs, NDEV, r);
	assert_int_equal(rc, r->ok ? 0 : 1);
	for (int d = 0; d < NDEV; d++)
		graph_free(&g[d]);
	return r->ok;
}

static void test_random_programs(void **state)
{
	(void)state;
	int nok = 0, nbad = 0;
	for (int t = 0; t < 400; t++) {
		Progs p;
		VerifyResult r;
		gen(&p);
		bool want = naive(&p), got = checked(&p, &r);
		if (want != got)
			fail_msg("case %d: the naive simulation says %s, verify_devices %s: %s", t, want ? "ok" : "not ok",
			         got ? "ok" : "not ok", r.problem.msg);
		if (!got) {
			assert_true(r.problem.device >= 0 && r.problem.device < NDEV);
			assert_true(strncmp(r.problem.msg, "device ", 7) == 0);
			assert_non_null(r.problem.op);
		}
		nok += got, nbad += !got;
	}
	assert_true(nok > 50 && nbad > 50); /* both verdicts are exercised */
}

/* ---- verify_program: one program, every device of its mesh ---- */

static const char program[] =
	"spmd: true\nmesh: {a: 3, b: 2}\ninputs:\n  x: {shape: [2]}\nops:\n"
	"  - {out: y, op: all_reduce, in: [x], axes: [a, b], reduce: sum}\n"
	"  - {out: z, op: collective_permute, in: [y], axes: [a], targets: [[0, 2], [2, 4], [4, 0]]}\n"
	"outputs: [x]\n";

static void test_program(void **state)
{
	(void)state;
	Graph g;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	assert_int_equal(program_load_string(&g, program, "p.yaml", NULL, &d), 0);
	assert_int_equal(verify_program(&g, &d), 0);
	Op *op = &g.ops.a[1];
	assert_int_equal(op->kind, OP_COLLECTIVE_PERMUTE);
	int *t = arena_alloc(&g.arena, sizeof(int) * NDEV);
	memcpy(t, op->attr->target, sizeof(int) * NDEV);
	t[2] = 0; /* 0 and 2 both send to 0: 2's target 4 receives from nobody */
	op->attr->target = t;
	assert_int_equal(verify_program(&g, &d), -1);
	assert_non_null(strstr(d.last, "collective #2 collective_permute [a]"));
	t[2] = 5, t[3] = 3; /* 2 sends to 5, across axis b */
	assert_int_equal(verify_program(&g, &d), -1);
	assert_non_null(strstr(d.last, "device 2: collective #2"));
	assert_non_null(strstr(d.last, "sends to device 5: expected a device of its group [0, 2, 4]"));
	graph_free(&g);
}

/* A device without a program, in programs without collectives. */
static void test_missing(void **state)
{
	(void)state;
	Graph g[2];
	Diag d;
	diag_init(&d);
	for (int i = 0; i < 2; i++) {
		char text[200];
		snprintf(text, sizeof text, "spmd: true\ndevice: %d\nmesh: {a: 3}\ninputs: {x: {shape: [2]}}\nops: []\noutputs: [x]\n",
		         2 * i);
		assert_int_equal(program_load_string(&g[i], text, "m.yaml", NULL, &d), 0);
	}
	const Graph *progs[3] = {&g[0], NULL, &g[1]};
	VerifyResult r;
	assert_int_equal(verify_devices(progs, 3, &r), 1);
	assert_int_equal(r.problem.device, 1);
	assert_null(r.problem.pos.file);
	assert_non_null(strstr(r.problem.msg, "found none for device 1"));
	progs[1] = &g[0]; /* device 0's program standing in: no collectives, so nothing to disagree on */
	assert_int_equal(verify_devices(progs, 3, &r), 0);
	assert_int_equal(r.ncoll, 0);
	graph_free(&g[0]), graph_free(&g[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_programs),
		cmocka_unit_test(test_program),
		cmocka_unit_test(test_missing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
