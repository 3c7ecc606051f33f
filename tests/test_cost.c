/* test_cost.c: the cost model — every formula against its closed form, topology mapping, memory by hand and against the runtime. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "../cost_model/cost.h"
#include "../cli/measure.h"
#include "../runtime/exec.h"
#include "../runtime/spmd_run.h"
#include "../spmd/load.h"
#include "../spmd/ops.h"
#include "../spmd/train_section.h"
#include "../train/train.h"

#define NEAR(a, b) near((double)(a), (double)(b))

static void near(double a, double b)
{
	if (!(fabs(a - b) <= 1e-9 * fabs(b) + 1e-18))
		fail_msg("%.12g is not %.12g", a, b);
}

/* A profile with round numbers: peak 1e12, vector 1e11, trans 1e10,
 * memory 1e11 B/s, overhead 1e-6, link 1e10, alpha 1e-5. */
static const char toy_text[] =
	"name: toy\n"
	"compute: {f32: 1e12}\n"
	"vector: 1e11\n"
	"transcendentals: 1e10\n"
	"kernel_overhead: 1e-6\n"
	"fusion: false\n"
	"memory: {bandwidth: 1e11, capacity: 1e6}\n"
	"interconnect: {topology: switch, dims: [64], link_bandwidth: 1e10, latency: 1e-5,\n"
	"               dcn: {bandwidth: 1e9, latency: 1e-4}}\n";

static HwProfile toy(bool fusion)
{
	HwProfile hw;
	Diag d;
	diag_init(&d);
	assert_int_equal(hw_profile_parse(&hw, toy_text, "toy.yaml", &d), 0);
	hw.fusion = fusion;
	return hw;
}

static void load_prog(Graph *g, const char *text)
{
	Diag d;
	diag_init(&d);
	LoadKind k;
	int rc = program_load_string(g, text, "prog.yaml", &k, &d);
	if (rc != 0)
		fprintf(stderr, "%s\n", d.last);
	assert_int_equal(rc, 0);
}

/* ---- profiles ---- */

static void test_profiles_builtin(void **state)
{
	HwProfile p;
	for (const char *const *n = hw_profile_names(); *n; n++) {
		assert_int_equal(hw_profile_builtin(&p, *n), 0);
		assert_string_equal(p.name, *n);
		assert_true(p.mem_bw > 0 && p.mem_capacity > 0 && p.link_bw > 0 && p.flops[DT_BF16] > 0);
	}
	/* the figures docs/hardware.md cites */
	assert_int_equal(hw_profile_builtin(&p, "tpu-v3"), 0);
	NEAR(p.flops[DT_BF16], 123e12), NEAR(p.mem_bw, 900e9), NEAR(p.mem_capacity, 32.0 * (1 << 30));
	assert_int_equal(p.topo, TOPO_TORUS), assert_int_equal(p.ndims, 2), assert_int_equal(p.dims[0], 32);
	assert_int_equal(hw_profile_builtin(&p, "tpu-v4"), 0);
	NEAR(p.flops[DT_BF16], 275e12), NEAR(p.mem_bw, 1200e9), assert_int_equal(p.ndims, 3);
	assert_int_equal(hw_profile_builtin(&p, "a100-nvlink"), 0);
	NEAR(p.flops[DT_F16], 312e12), NEAR(p.mem_bw, 2039e9), NEAR(p.link_bw, 300e9), assert_int_equal(p.topo, TOPO_SWITCH);
	assert_int_equal(hw_profile_builtin(&p, "h100-nvlink"), 0);
	NEAR(p.flops[DT_BF16], 989e12), NEAR(p.mem_bw, 3.35e12), NEAR(p.link_bw, 450e9);
	assert_int_equal(hw_profile_builtin(&p, "tpu-v9"), -1);
}

static void test_profiles_round_trip(void **state)
{
	HwProfile a = toy(true), b;
	a.host_cores = 2;
	a.comm_streams = COMM_ONE;
	a.op_rate[OP_SOFTMAX] = 3e7;
	a.matrix_overhead = 7e-7;
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	hw_profile_write(&a, f);
	fclose(f);
	Diag d;
	diag_init(&d);
	assert_int_equal(hw_profile_parse(&b, buf, "rt.yaml", &d), 0);
	free(buf);
	for (int t = 0; t < DT_COUNT; t++)
		NEAR(b.flops[t], a.flops[t]);
	NEAR(b.mem_bw, a.mem_bw), NEAR(b.link_bw, a.link_bw), NEAR(b.latency, a.latency), NEAR(b.dcn_bw, a.dcn_bw);
	assert_int_equal(b.host_cores, 2), assert_int_equal(b.topo, a.topo), assert_int_equal(b.dims[0], 64);
	NEAR(b.op_rate[OP_SOFTMAX], 3e7), NEAR(b.matrix_overhead, 7e-7), NEAR(b.op_rate[OP_ADD], 0);
	assert_true(b.fusion);
	assert_int_equal(b.comm_streams, COMM_ONE);
	assert_int_equal(toy(true).comm_streams, COMM_LINKS); /* the default */
}

/* A bad profile gives FILE:LINE:COL and "expected". */
static void bad_profile(const char *text, const char *want)
{
	HwProfile p;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	assert_int_equal(hw_profile_parse(&p, text, "bad.yaml", &d), -1);
	assert_true(d.nerr > 0);
	if (!strstr(d.last, want))
		fprintf(stderr, "got: %s\n", d.last);
	assert_non_null(strstr(d.last, want));
}

static void test_profiles_errors(void **state)
{
	bad_profile("", "expected a hardware profile");
	bad_profile("compute: {f32: 1e12}\nmemory: {bandwidth: 1e9, capacity: 1e9}\n", "expected 'interconnect'");
	bad_profile("compute: {f33: 1}\n", "expected a dtype");
	bad_profile("compute: {f32: -1}\n", "expected a number of per second from 1000 to 1e+18 for 'f32'");
	/* Implausible figures (docs/hardware.md, Ranges): each is a positioned error. */
	const char *ok_head = "compute: {f32: 1e12}\n", *ok_ic = "interconnect: {topology: threads, dims: [2], ";
	char text[512];
	static const char *const bad[][3] = {
		{"memory: {bandwidth: 1e-300, capacity: 1e9}\n", "link_bandwidth: 1e9, latency: 0}\n", "expected a number of bytes per second"},
		{"memory: {bandwidth: 1e9, capacity: 1e300}\n", "link_bandwidth: 1e9, latency: 0}\n", "expected a number of bytes from 1000"},
		{"memory: {bandwidth: 1e9, capacity: 1e9}\n", "link_bandwidth: 1e9, latency: 1e9}\n", "expected 0 or a number of seconds"},
		{"memory: {bandwidth: 1e9, capacity: 1e9}\n", "link_bandwidth: .nan, latency: 0}\n", "expected"},
		{"memory: {bandwidth: 1e9, capacity: 1e9}\nvector: 1e-300\n", "link_bandwidth: 1e9, latency: 0}\n", "expected a number of per second"},
		{"memory: {bandwidth: 1e9, capacity: 1e9}\nhost_cores: 1e300\n", "link_bandwidth: 1e9, latency: 0}\n", "expected a whole number of cores"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		snprintf(text, sizeof text, "%s%s%s%s", ok_head, bad[i][0], ok_ic, bad[i][1]);
		bad_profile(text, bad[i][2]);
	}
	bad_profile("compute: {f32: 1e12}\nmemroy: {}\n", "expected a profile key");
	bad_profile("compute: {f32: 1e12}\nmemory: {bandwidth: 1e9, capacity: 1e9}\n"
	            "interconnect: {topology: threads, dims: [2], link_bandwidth: 1e9, latency: 0}\n"
	            "op_rates: {all_reduce: 1}\n", "expected the name of a local op");
	bad_profile("compute: {f32: 1e12}\nmemory: {bandwidth: 1e9, capacity: 1e9}\n"
	            "interconnect: {topology: mesh, dims: [2], link_bandwidth: 1e9, latency: 0}\n",
	            "expected a topology");
	bad_profile("compute: {f32: 1e12}\nmemory: {bandwidth: 1e9, capacity: 1e9}\n"
	            "interconnect: {topology: switch, dims: [2, 2], link_bandwidth: 1e9, latency: 0}\n",
	            "expected one size");
	bad_profile("compute: {f32: 1e12}\nmemory: {bandwidth: 1e9, capacity: 1e9}\n"
	            "interconnect: {topology: torus, dims: [2], wraparound: sometimes, link_bandwidth: 1e9, latency: 0}\n",
	            "expected full, always");
	bad_profile("compute: {f32: 1e12}\nmemory: {bandwidth: 1e9, capacity: 1e9}\n"
	            "interconnect: {topology: torus, dims: [2], streams: two, link_bandwidth: 1e9, latency: 0}\n",
	            "expected links (one collective at a time per set of links) or one");
	HwProfile p;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	assert_int_equal(hw_profile_resolve(&p, "nope", "m.yaml", (Pos){"m.yaml", 3, 5}, &d), -1);
	assert_non_null(strstr(d.last, "expected a hardware profile (tpu-v3"));
}

/* ---- collectives: closed forms ---- */

static void test_ring_formulas(void **state)
{
	CostRing r = {.n = 4, .bw = 1e9, .alpha = 1e-6, .sw = true, .hop = 1};
	double B = 1e6;
	NEAR(cost_ring_all_reduce(&r, B), 2 * 3 * 1e-6 + 2.0 * 3 / 4 * B / 1e9);
	NEAR(cost_ring_reduce_scatter(&r, B), 3 * 1e-6 + 3.0 / 4 * B / 1e9);
	NEAR(cost_ring_all_gather(&r, B), 3 * 1e-6 + 3 * B / 1e9); /* output 4B: (n-1)/n * 4B */
	NEAR(cost_ring_all_to_all(&r, B), 3 * 1e-6 + 3.0 / 4 * B / 1e9);
	/* torus ring of 8 closed: busiest link carries B/8 * (1+2+3+4+3+2+1) */
	CostRing w = {.n = 8, .bw = 2e9, .alpha = 0, .wrap = true, .hop = 1};
	NEAR(cost_ring_all_to_all(&w, B), B / 8 * 16 / 2e9);
	/* a line of 5: the middle cut carries 2*3/5 B */
	CostRing l = {.n = 5, .bw = 1e9, .alpha = 0, .hop = 1};
	NEAR(cost_ring_all_to_all(&l, B), 6.0 / 5 * B / 1e9);
	/* n = 1 costs nothing */
	CostRing one = {.n = 1, .bw = 1e9, .alpha = 1};
	NEAR(cost_ring_all_reduce(&one, B), 0);
}

static Mesh mesh_of(int n, const char *const *names, const int *sizes)
{
	Mesh m = {.naxes = n, .ndev = 1};
	for (int a = 0; a < n; a++)
		m.name[a] = names[a], m.size[a] = sizes[a], m.ndev *= sizes[a];
	return m;
}

/* tpu-v3, the whole pod 32x32: each axis one closed ring at 2 links. */
static void test_torus_2d(void **state)
{
	HwProfile hw;
	assert_int_equal(hw_profile_builtin(&hw, "tpu-v3"), 0);
	hw.collective_overhead = 0; /* the formulas alone; the call's overhead: test_collective_overhead */
	Mesh m = mesh_of(2, (const char *[]){"data", "model"}, (int[]){32, 32});
	CostRing r[8];
	int n = cost_rings(&hw, &m, (int[]){1}, 1, r);
	assert_int_equal(n, 1), assert_int_equal(r[0].n, 32), assert_true(r[0].wrap);
	NEAR(r[0].bw, 2e11);
	double B = 1 << 20, a = 1e-6, bw = 2e11;
	NEAR(cost_collective_seconds(&hw, &m, RS_ALL_REDUCE, (int[]){1}, 1, B, NULL, 0),
	     2 * 31 * a + 2.0 * 31 / 32 * B / bw);
	/* both axes: reduce_scatter on one, all_reduce on 1/32, all_gather back */
	double both = 2 * (31 * a + 31.0 / 32 * B / bw) + 2 * (31 * a + 31.0 / 32 * (B / 32) / bw);
	NEAR(cost_collective_seconds(&hw, &m, RS_ALL_REDUCE, (int[]){0, 1}, 2, B, NULL, 0), both);
	NEAR(cost_collective_seconds(&hw, &m, RS_REDUCE_SCATTER, (int[]){0, 1}, 2, B, NULL, 0), both / 2);
	/* all_gather of B/1024 per device back to B: the same as the reduce_scatter */
	NEAR(cost_collective_seconds(&hw, &m, RS_ALL_GATHER, (int[]){0, 1}, 2, B / 1024, NULL, 0), both / 2);
	/* all_to_all: per ring, on the full buffer */
	double hops = 0;
	for (int d = 1; d < 32; d++)
		hops += d < 32 - d ? d : 32 - d;
	NEAR(cost_collective_seconds(&hw, &m, RS_ALL_TO_ALL, (int[]){1}, 1, B, NULL, 0), 31 * a + B / 32 * hops / bw);
	/* a shift by 1 on a closed ring: one hop */
	NEAR(cost_collective_seconds(&hw, &m, RS_PERMUTE, (int[]){1}, 1, B, NULL, 1), a + B / 1e11);
	/* ... by 31: one hop the other way round */
	NEAR(cost_collective_seconds(&hw, &m, RS_PERMUTE, (int[]){1}, 1, B, NULL, 31), a + B / 1e11);
	/* a shift's time (its farthest send, remembered) is that of its targets given explicitly */
	int tg[1024];
	for (int sh = -3; sh <= 17; sh += 5)
		for (int ax = 0; ax < 2; ax++) {
			mesh_shift_targets(&m, ax, sh, tg);
			NEAR(cost_collective_seconds(&hw, &m, RS_PERMUTE, &ax, 1, B, NULL, sh),
			     cost_collective_seconds(&hw, &m, RS_PERMUTE, &ax, 1, B, tg, 0));
		}
}

/* 64 devices on tpu-v3 make an 8x8 slice without wraparound: one axis of 64
 * spans both dims; a 4x16 mesh shares them. */
static void test_torus_mapping(void **state)
{
	HwProfile hw;
	assert_int_equal(hw_profile_builtin(&hw, "tpu-v3"), 0);
	hw.collective_overhead = 0; /* the formulas alone; the call's overhead: test_collective_overhead */
	CostRing r[8];
	Mesh m = mesh_of(1, (const char *[]){"x"}, (int[]){64});
	int n = cost_rings(&hw, &m, (int[]){0}, 1, r);
	assert_int_equal(n, 2);
	for (int i = 0; i < 2; i++)
		assert_int_equal(r[i].n, 8), assert_false(r[i].wrap), NEAR(r[i].bw, 1e11);
	Mesh m2 = mesh_of(2, (const char *[]){"a", "b"}, (int[]){4, 16});
	n = cost_rings(&hw, &m2, (int[]){1}, 1, r); /* b: stride 1, size 16 = dim 1 (8) and 2 of dim 0 */
	assert_int_equal(n, 2);
	assert_int_equal(r[0].n * r[1].n, 16);
	n = cost_rings(&hw, &m2, (int[]){0}, 1, r); /* a: stride 16 = hop 2 in dim 0, size 4 */
	assert_int_equal(n, 1), assert_int_equal(r[0].n, 4), assert_int_equal(r[0].hop, 2);
	NEAR(r[0].bw, 1e11 / 2);
	/* a shift by 1 along b on a line of 8 wrapping round: 7 hops for the last */
	Mesh m3 = mesh_of(2, (const char *[]){"a", "b"}, (int[]){8, 8});
	NEAR(cost_collective_seconds(&hw, &m3, RS_PERMUTE, (int[]){1}, 1, 1000, NULL, 1), 7e-6 + 1000 / 1e11);
	/* tpu-v4: 64 devices are 4x4x4, and multiples of 4 wrap */
	assert_int_equal(hw_profile_builtin(&hw, "tpu-v4"), 0);
	hw.collective_overhead = 0; /* the formulas alone; the call's overhead: test_collective_overhead */
	Mesh m4 = mesh_of(3, (const char *[]){"a", "b", "c"}, (int[]){4, 4, 4});
	n = cost_rings(&hw, &m4, (int[]){2}, 1, r);
	assert_int_equal(n, 1), assert_true(r[0].wrap), NEAR(r[0].bw, 9e10);
}

/* a100: 8 per switch; a 2x8 mesh puts `node` on the DCN. */
static void test_switch_mapping(void **state)
{
	HwProfile hw;
	assert_int_equal(hw_profile_builtin(&hw, "a100-nvlink"), 0);
	hw.collective_overhead = 0; /* the formulas alone; the call's overhead: test_collective_overhead */
	Mesh m = mesh_of(2, (const char *[]){"node", "gpu"}, (int[]){2, 8});
	CostRing r[8];
	assert_int_equal(cost_rings(&hw, &m, (int[]){0, 1}, 2, r), 2);
	assert_int_equal(r[0].n, 8), NEAR(r[0].bw, 300e9); /* the fastest first */
	assert_int_equal(r[1].n, 2), NEAR(r[1].bw, 25e9);
	double B = 1e8;
	double want = 2 * (7 * 3e-6 + 7.0 / 8 * B / 300e9) + 2 * (1 * 5e-6 + 0.5 * (B / 8) / 25e9);
	NEAR(cost_collective_seconds(&hw, &m, RS_ALL_REDUCE, (int[]){0, 1}, 2, B, NULL, 0), want);
	/* the decomposition is cheaper than a flat ring at the DCN's speed */
	assert_true(want < 2 * (15 * 5e-6 + 15.0 / 16 * B / 25e9));
	/* a permute across nodes goes over the DCN */
	NEAR(cost_collective_seconds(&hw, &m, RS_PERMUTE, (int[]){0}, 1, B, NULL, 1), 5e-6 + B / 25e9);
}

/* The thread backend: barriers of all devices, the ring volume through memory. */
static void test_threads_topology(void **state)
{
	HwProfile hw = toy(false);
	hw.topo = TOPO_THREADS;
	Mesh m = mesh_of(2, (const char *[]){"a", "b"}, (int[]){2, 4});
	double B = 1e5, a = 1e-5, bw = 1e10;
	NEAR(cost_collective_seconds(&hw, &m, RS_ALL_REDUCE, (int[]){1}, 1, B, NULL, 0), 3 * a + 2.0 * 3 / 4 * B / bw);
	NEAR(cost_collective_seconds(&hw, &m, RS_ALL_GATHER, (int[]){0, 1}, 2, B, NULL, 0), 2 * a + 7 * B / bw);
	NEAR(cost_collective_seconds(&hw, &m, RS_REDUCE_SCATTER, (int[]){0}, 1, B, NULL, 0), 2 * a + 0.5 * B / bw);
	NEAR(cost_collective_seconds(&hw, &m, RS_PERMUTE, (int[]){1}, 1, B, NULL, 1), 2 * a + B / bw);
	/* 8 devices on 2 cores: a quarter of the machine each */
	hw.host_cores = 2;
	NEAR(cost_collective_seconds(&hw, &m, RS_ALL_REDUCE, (int[]){1}, 1, B, NULL, 0), 4 * (3 * a + 2.0 * 3 / 4 * B / bw));
}

/* Larger messages never cost less, for every kind, topology and mesh. */
static void test_monotone(void **state)
{
	const char *profiles[] = {"tpu-v3", "tpu-v4", "a100-nvlink", "h100-nvlink", "threads"};
	Mesh meshes[3] = {mesh_of(1, (const char *[]){"x"}, (int[]){6}),
	                  mesh_of(2, (const char *[]){"a", "b"}, (int[]){4, 8}),
	                  mesh_of(2, (const char *[]){"a", "b"}, (int[]){16, 3})};
	ReshardKind kinds[] = {RS_ALL_REDUCE, RS_REDUCE_SCATTER, RS_ALL_GATHER, RS_ALL_TO_ALL, RS_PERMUTE};
	for (int p = 0; p < 5; p++) {
		HwProfile hw = toy(false);
		if (p < 4)
			assert_int_equal(hw_profile_builtin(&hw, profiles[p]), 0);
		else
			hw.topo = TOPO_THREADS, hw.host_cores = 2;
		for (int mi = 0; mi < 3; mi++)
			for (int k = 0; k < 5; k++) {
				int axes[2] = {0, 1}, nax = k == 4 ? 1 : meshes[mi].naxes;
				double prev = -1;
				for (double B = 0; B <= 1e9; B = B ? B * 3 : 1) {
					double t = cost_collective_seconds(&hw, &meshes[mi], kinds[k], axes, nax, B, NULL, 1);
					assert_true(t >= prev);
					assert_true(isfinite(t));
					prev = t;
				}
			}
	}
}

/* A reshard plan costs the sum of its steps. */
static void test_reshard_cost(void **state)
{
	HwProfile hw = toy(false);
	Mesh m = mesh_of(1, (const char *[]){"x"}, (int[]){4});
	Spec from = {.rank = 1, .nax = {1}, .ax = {{0}}}, to = {.rank = 1};
	ReshardPlan p;
	Diag d;
	diag_init(&d);
	assert_int_equal(reshard_plan(&p, &from, &to, &m, (int64_t[]){1024}, 4, &d), 0);
	assert_int_equal(p.nsteps, 1), assert_int_equal(p.steps[0].kind, RS_ALL_GATHER);
	/* each device hands in 256 floats; all_gather on a switch ring of 4 */
	NEAR(cost_reshard_seconds(&hw, &m, &p), 3 * 1e-5 + 3 * 1024.0 / 1e10);
	reshard_plan_free(&p);
}

/* ---- ops ---- */

static void test_op_roofline(void **state)
{
	HwProfile hw = toy(false);
	Graph g;
	load_prog(&g, "spmd: true\ninputs: {x: {shape: [64, 128]}, w: {shape: [128, 32]}}\n"
	              "ops:\n  - {out: y, op: einsum, eq: \"ik,kj->ij\", in: [x, w]}\n"
	              "  - {out: t, op: tanh, in: [y]}\noutputs: [t]\n");
	OpWork w;
	cost_op_work(&g, 0, &w);
	NEAR(w.flops, 2.0 * 64 * 128 * 32);
	NEAR(w.bytes, 4.0 * (64 * 128 + 128 * 32 + 64 * 32));
	assert_true(w.matrix);
	/* compute-bound: 524288 / 1e12 = 5.2e-7 s; memory 57344 / 1e11 = 5.7e-7 s: memory wins */
	NEAR(cost_roofline(&hw, DT_F32, &w, 1), 4.0 * (64 * 128 + 128 * 32 + 64 * 32) / 1e11 + 1e-6);
	cost_op_work(&g, 1, &w);
	NEAR(w.flops, 2048), NEAR(w.trans, 2048), NEAR(w.bytes, 2 * 4 * 2048.0);
	NEAR(cost_roofline(&hw, DT_F32, &w, 1), 2048 / 1e11 + 2048 / 1e10 + 1e-6);
	/* einsum and conv2d kernels may cost more to start */
	hw.matrix_overhead = 5e-6;
	cost_op_work(&g, 0, &w);
	NEAR(cost_roofline(&hw, DT_F32, &w, 1), 4.0 * (64 * 128 + 128 * 32 + 64 * 32) / 1e11 + 5e-6);
	hw.matrix_overhead = 1e-6;
	/* a measured rate replaces the compute term: tanh at 1e6 elements/s */
	cost_op_work(&g, 1, &w);
	hw.op_rate[OP_TANH] = 1e6;
	NEAR(cost_roofline(&hw, DT_F32, &w, 1), 2048 / 1e6 + 1e-6);
	hw.op_rate[OP_TANH] = 1e15; /* ... but not the memory term */
	NEAR(cost_roofline(&hw, DT_F32, &w, 1), 2 * 4 * 2048.0 / 1e11 + 1e-6);
	hw.op_rate[OP_TANH] = 0;
	CostEstimate e;
	cost_estimate(&g, &hw, &e);
	NEAR(e.serial_s, e.op[0].seconds + e.op[1].seconds);
	NEAR(e.flops, 2.0 * 64 * 128 * 32 + 2048);
	cost_estimate_free(&e);
	graph_free(&g);
}

/* conv2d: 2 * N*Ho*Wo * KH*KW*Cin*Cout multiply-adds on the matrix unit. */
static void test_conv_work(void **state)
{
	Graph g;
	load_prog(&g, "spmd: true\ninputs: {x: {shape: [1, 4, 4, 2]}}\nparams: {k: {shape: [3, 3, 2, 5]}}\n"
	              "ops:\n  - {out: y, op: conv2d, in: [x, k], padding: valid}\noutputs: [y]\n");
	OpWork w;
	cost_op_work(&g, 0, &w);
	NEAR(w.flops, 2.0 * 1 * 2 * 2 * 3 * 3 * 2 * 5);
	NEAR(w.bytes, 4.0 * (32 + 90 + 20));
	assert_true(w.matrix);
	graph_free(&g);
}

/* x -> mul 2 -> add b -> relu: one kernel reading x and b, writing r once. */
static void test_fusion(void **state)
{
	HwProfile hw = toy(true);
	Graph g;
	load_prog(&g, "spmd: true\ninputs: {x: {shape: [1000]}, b: {shape: [1000]}}\n"
	              "ops:\n  - {out: m, op: mul, in: [x, 2.0]}\n  - {out: a, op: add, in: [m, b]}\n"
	              "  - {out: r, op: relu, in: [a]}\n  - {out: s, op: reduce_sum, in: [r], axes: [0]}\n"
	              "outputs: [s, r]\n");
	int group[4];
	assert_int_equal(cost_fusion_groups(&g, group), 2);
	assert_int_equal(group[1], 0), assert_int_equal(group[2], 0), assert_int_equal(group[3], 3);
	CostEstimate e;
	cost_estimate(&g, &hw, &e);
	assert_int_equal(e.nkernels, 2);
	/* reads x (4000), the constant (4) and b (4000), writes r (4000); 3000 FLOPs */
	double fused = fmax(3000 / 1e11, (4000 + 4 + 4000 + 4000) / 1e11) + 1e-6;
	NEAR(e.op[0].seconds + e.op[1].seconds + e.op[2].seconds, fused);
	cost_estimate_free(&e);
	/* without fusion: three kernels, each reading and writing */
	hw.fusion = false;
	cost_estimate(&g, &hw, &e);
	assert_int_equal(e.nkernels, 4);
	NEAR(e.op[0].seconds, (4000 + 4 + 4000) / 1e11 + 1e-6);
	cost_estimate_free(&e);
	graph_free(&g);
	/* a result read twice is not fused away */
	load_prog(&g, "spmd: true\ninputs: {x: {shape: [10]}}\n"
	              "ops:\n  - {out: e, op: exp, in: [x]}\n  - {out: a, op: add, in: [e, e]}\noutputs: [a]\n");
	assert_int_equal(cost_fusion_groups(&g, group), 2);
	graph_free(&g);
	/* a reduction between elementwise ops breaks the chain: three kernels, the product written to
	 * memory and read back, three overheads */
	load_prog(&g, "spmd: true\ninputs: {x: {shape: [10, 100]}}\n"
	              "ops:\n  - {out: m, op: mul, in: [x, 2.0]}\n  - {out: s, op: reduce_sum, in: [m], axes: [1]}\n"
	              "  - {out: y, op: exp, in: [s]}\noutputs: [y]\n");
	hw.fusion = true;
	assert_int_equal(cost_fusion_groups(&g, group), 3);
	cost_estimate(&g, &hw, &e);
	assert_int_equal(e.nkernels, 3);
	NEAR(e.op[0].seconds, (4000 + 4 + 4000) / 1e11 + 1e-6);
	NEAR(e.op[1].seconds, (4000 + 40) / 1e11 + 1e-6);
	cost_estimate_free(&e);
	graph_free(&g);
}

/* ---- the step ---- */

/* ar = all_reduce(x) runs beside t = exp(x); y = add(ar, t) waits for both. */
static void test_overlap(void **state)
{
	HwProfile hw = toy(false);
	Graph g;
	load_prog(&g, "spmd: true\nmesh: {x: 4}\ninputs: {a: {shape: [1000]}}\n"
	              "ops:\n  - {out: ar, op: all_reduce, in: [a], axes: [x]}\n"
	              "  - {out: t, op: exp, in: [a]}\n  - {out: y, op: add, in: [ar, t]}\noutputs: [y]\n");
	CostEstimate e;
	cost_estimate(&g, &hw, &e);
	double tar = 2 * 3 * 1e-5 + 2.0 * 3 / 4 * 4000 / 1e10;
	double texp = fmax(1000 / 1e11 + 1000 / 1e10, 8000 / 1e11) + 1e-6;
	double tadd = fmax(1000 / 1e11, 12000 / 1e11) + 1e-6;
	NEAR(e.op[0].seconds, tar), NEAR(e.op[1].seconds, texp), NEAR(e.op[2].seconds, tadd);
	NEAR(e.serial_s, tar + texp + tadd);
	/* one step: the add waits for the all_reduce; in a long run the next steps' all_reduces need nothing
	 * of this one, so the streams pipeline and the step is the busier stream's */
	NEAR(e.first_step_s, fmax(tar, texp) + tadd);
	NEAR(e.overlapped_s, fmax(tar, texp + tadd));
	assert_true(tar > texp + tadd);
	NEAR(e.op[0].hidden, texp + tadd); /* the all_reduce runs while the compute stream does the whole step */
	NEAR(e.comm_s, tar), NEAR(e.compute_s, texp + tadd);
	NEAR(e.axis_bytes[0], 2.0 * 3 / 4 * 4000);
	cost_estimate_free(&e);
	/* devices sharing one core: the all_reduce waits for the other three's work before it (none here),
	 * the second one for 3x the exp */
	hw.host_cores = 1;
	graph_free(&g);
	load_prog(&g, "spmd: true\nmesh: {x: 4}\ninputs: {a: {shape: [1000]}}\n"
	              "ops:\n  - {out: ar, op: all_reduce, in: [a], axes: [x]}\n"
	              "  - {out: t, op: exp, in: [ar]}\n  - {out: y, op: all_reduce, in: [t], axes: [x]}\noutputs: [y]\n");
	cost_estimate(&g, &hw, &e);
	NEAR(e.op[0].seconds, tar * 4);
	NEAR(e.op[1].seconds, texp);
	NEAR(e.op[2].seconds, tar * 4 + 3 * texp);
	NEAR(e.wait_s, 3 * texp);
	cost_estimate_free(&e);
	graph_free(&g);
}

/* Where the step waits: two all_reduces on one set of links, each read
 * by an exp; the links are the busier stream.  In the steady state the
 * compute stream waits only for the collectives the ops read, and the
 * waits add up to the step's time it is idle; each delay is behind the
 * other collective. */
static void test_waits(void **state)
{
	HwProfile hw = toy(false);
	Graph g;
	load_prog(&g, "spmd: true\nmesh: {x: 4}\ninputs: {a: {shape: [100000]}}\n"
	              "ops:\n  - {out: p, op: all_reduce, in: [a], axes: [x]}\n"
	              "  - {out: q, op: exp, in: [p]}\n  - {out: r, op: all_reduce, in: [q], axes: [x]}\n"
	              "  - {out: y, op: exp, in: [r]}\noutputs: [y]\n");
	CostEstimate e;
	cost_estimate(&g, &hw, &e);
	double ar = e.op[0].seconds, ex = e.op[1].seconds;
	assert_true(ar > 2 * ex);
	NEAR(e.overlapped_s, 2 * ar); /* the links' time */
	assert_true(e.op[1].wait > 0 || e.op[3].wait > 0);
	NEAR(e.op[1].wait + e.op[3].wait, e.overlapped_s - 2 * ex);
	for (int i = 1; i < 4; i += 2)
		if (e.op[i].wait > 0)
			assert_int_equal(e.op[i].wait_on, i - 1);
	for (int i = 0; i < 4; i += 2) {
		assert_int_equal(e.op[i].wait_on, -1);
		assert_true(e.op[i].delay >= 0);
		if (e.op[i].delay > 0)
			assert_int_equal(e.op[i].behind, 2 - i);
	}
	assert_int_equal(e.op[1].behind, -1);
	cost_estimate_free(&e);
	graph_free(&g);
}

/* Collectives on disjoint links run at once: on a 32 x 32 torus, an all_reduce over each axis uses
 * its own torus dim, so the two overlap; one over both axes waits for both.  With `streams: one`,
 * one at a time. */
static void test_link_lanes(void **state)
{
	HwProfile hw;
	assert_int_equal(hw_profile_builtin(&hw, "tpu-v3"), 0);
	assert_int_equal(hw.comm_streams, COMM_LINKS);
	Graph g;
	load_prog(&g, "spmd: true\nmesh: {data: 32, model: 32}\ninputs: {a: {shape: [100000]}, b: {shape: [100000]}}\n"
	              "ops:\n  - {out: x, op: all_reduce, in: [a], axes: [data]}\n"
	              "  - {out: y, op: all_reduce, in: [b], axes: [model]}\n"
	              "  - {out: z, op: all_reduce, in: [a], axes: [data, model]}\n"
	              "  - {out: s, op: add, in: [x, y]}\n  - {out: t, op: add, in: [s, z]}\noutputs: [t]\n");
	unsigned lx = cost_collective_links(&hw, &g, 0), ly = cost_collective_links(&hw, &g, 1);
	assert_true(lx && ly && !(lx & ly));
	assert_int_equal(cost_collective_links(&hw, &g, 2), lx | ly);
	CostEstimate e;
	cost_estimate(&g, &hw, &e);
	double x = e.op[0].seconds, y = e.op[1].seconds, z = e.op[2].seconds, add = e.op[3].seconds;
	assert_int_equal(e.nlanes, 3);
	assert_int_not_equal(e.op[0].lane, e.op[1].lane);
	/* x and y at once from 0; z (needed last) once both links are free; the adds after their operands */
	NEAR(e.first_step_s, fmax(fmax(x, y) + add, fmax(x, y) + z) + add);
	NEAR(e.link_busy_s, fmax(x, y) + z);
	assert_true(e.overlapped_s >= e.link_busy_s - 1e-15);
	cost_estimate_free(&e);
	hw.comm_streams = COMM_ONE; /* one at a time, in the order the adds need them */
	cost_estimate(&g, &hw, &e);
	assert_int_equal(e.nlanes, 1);
	NEAR(e.first_step_s, x + y + z + add);
	NEAR(e.link_busy_s, x + y + z), NEAR(e.link_busy_s, e.comm_s);
	cost_estimate_free(&e);
	graph_free(&g);
	/* a send one step round a closed ring uses one way of its links: the two ways at once, each within
	 * what the ring's all_reduce (both ways) occupies; on a switch both ways share the device's port */
	hw.comm_streams = COMM_LINKS;
	load_prog(&g, "spmd: true\nmesh: {data: 32, model: 32}\ninputs: {a: {shape: [1000]}}\n"
	              "ops:\n  - {out: p, op: collective_permute, in: [a], axes: [model], shift: 1}\n"
	              "  - {out: q, op: collective_permute, in: [a], axes: [model], shift: 31}\n"
	              "  - {out: r, op: all_reduce, in: [a], axes: [model]}\n"
	              "  - {out: s, op: add, in: [p, q]}\n  - {out: t, op: add, in: [s, r]}\noutputs: [t]\n");
	unsigned up = cost_collective_links(&hw, &g, 0), down = cost_collective_links(&hw, &g, 1);
	unsigned ring = cost_collective_links(&hw, &g, 2);
	assert_true(up && down && !(up & down) && (up | down) == ring);
	cost_estimate(&g, &hw, &e);
	/* p and q at once, then the all_reduce (needed last) once both ways are free, beside the first add */
	NEAR(e.first_step_s, fmax(e.op[0].seconds, e.op[1].seconds) + fmax(e.op[2].seconds, e.op[3].seconds) + e.op[4].seconds);
	cost_estimate_free(&e);
	HwProfile sw = toy(false);
	assert_int_equal(cost_collective_links(&sw, &g, 0), cost_collective_links(&sw, &g, 1));
	graph_free(&g);
}

/* Every collective call pays the profile's collective_overhead once, so one call on the bytes of two
 * small tensors costs less than two calls. */
static void test_collective_overhead(void **state)
{
	HwProfile hw;
	assert_int_equal(hw_profile_builtin(&hw, "a100-nvlink"), 0);
	assert_true(hw.collective_overhead > 0);
	Mesh m = mesh_of(1, (const char *[]){"x"}, (int[]){8});
	int ax[1] = {0};
	double one = cost_collective_seconds(&hw, &m, RS_ALL_REDUCE, ax, 1, 64, NULL, 0);
	double two = cost_collective_seconds(&hw, &m, RS_ALL_REDUCE, ax, 1, 128, NULL, 0);
	HwProfile bare = hw;
	bare.collective_overhead = 0;
	NEAR(one - cost_collective_seconds(&bare, &m, RS_ALL_REDUCE, ax, 1, 64, NULL, 0), hw.collective_overhead);
	assert_true(two < 2 * one);
}

/* A carried value chains the steps: w -> exp -> all_reduce -> add -> w of the next step, so nothing
 * overlaps (test_overlap: without such a chain, the steps pipeline). */
static void test_steady_state(void **state)
{
	HwProfile hw = toy(false);
	Graph g;
	load_prog(&g, "spmd: true\nmesh: {x: 4}\ninputs: {}\nparams: {w: {shape: [1000]}}\n"
	              "ops:\n  - {out: t, op: exp, in: [w]}\n  - {out: ar, op: all_reduce, in: [t], axes: [x]}\n"
	              "  - {out: n, op: add, in: [ar, w]}\noutputs: [n]\n");
	int from = graph_find(&g, "n"), to = graph_find(&g, "w");
	unsigned char phase[3] = {PHASE_BACKWARD, PHASE_GRAD_SYNC, PHASE_UPDATE};
	CostStep st = {.phase = phase, .ncarry = 1, .carry_from = &from, .carry_to = &to};
	CostEstimate e;
	cost_estimate_step(&g, &hw, &st, &e);
	NEAR(e.overlapped_s, e.serial_s), NEAR(e.first_step_s, e.serial_s);
	NEAR(e.phase_s[PHASE_BACKWARD], e.op[0].seconds), NEAR(e.phase_s[PHASE_GRAD_SYNC], e.op[1].seconds);
	NEAR(e.phase_hidden_s[PHASE_GRAD_SYNC], 0);
	NEAR(e.op[1].start, e.op[0].seconds), NEAR(e.op[2].end, e.serial_s);
	cost_estimate_free(&e);
	graph_free(&g);
}

/* A training step with weight-update sharding and gathers before use: every phase has time, they sum
 * to the serial step, the gathers overlap the next forward pass, and a long run is no slower per step
 * than its first step. */
static void test_training_phases(void **state)
{
	Graph model, prog;
	Diag d;
	diag_init(&d);
	CostStep st;
	assert_int_equal(cost_prepare_step("examples/train_transformer.yaml", "data=4,model=1", WUS_ON, &model, &prog,
	                                   &st, &d), 0);
	assert_true(st.ncarry > 0);
	HwProfile hw;
	hw_profile_builtin(&hw, "tpu-v3");
	CostEstimate e;
	cost_estimate_step(&prog, &hw, &st, &e);
	double sum = 0;
	for (int p = 0; p < PHASE_COUNT; p++) {
		assert_true(e.phase_s[p] > 0);
		assert_true(e.phase_hidden_s[p] <= e.phase_s[p] + 1e-15);
		sum += e.phase_s[p];
	}
	NEAR(sum, e.serial_s);
	/* each phase's peak is the most held after one of its ops (an independent walk of the timeline);
	 * the phase of the peak op has the whole peak */
	int64_t *held = malloc(sizeof(int64_t) * (size_t)(prog.ops.n + 1)), most[PHASE_COUNT] = {0};
	cost_memory_timeline(&prog, held);
	for (int i = 0; i < prog.ops.n; i++)
		most[e.op[i].phase] = held[i] > most[e.op[i].phase] ? held[i] : most[e.op[i].phase];
	free(held);
	for (int p = 0; p < PHASE_COUNT; p++)
		assert_true(e.phase_peak[p] == most[p] && e.phase_peak[p] > 0 && e.phase_peak[p] <= e.mem.peak);
	assert_true(e.mem.peak_op >= 0 && e.phase_peak[e.op[e.mem.peak_op].phase] == e.mem.peak);
	assert_true(e.overlapped_s <= e.first_step_s + 1e-12 && e.first_step_s <= e.serial_s + 1e-12);
	assert_true(e.overlapped_s >= e.compute_s - 1e-12);
	for (int i = 0; i < prog.ops.n; i++)
		if (prog.ops.a[i].kind == OP_ALL_GATHER && e.op[i].phase == PHASE_GATHER)
			assert_true(e.op[i].end <= e.overlapped_s + 1e-12);
	int top = cost_limit_top(e.phase_limit_s[PHASE_FORWARD]);
	assert_true(top >= 0);
	double lim = 0;
	for (int l = 0; l < LIMIT_COUNT; l++)
		lim += e.phase_limit_s[PHASE_FORWARD][l];
	NEAR(lim, e.phase_s[PHASE_FORWARD]);
	cost_estimate_free(&e);
	cost_step_free(&st);
	graph_free(&prog), graph_free(&model);
}

/* ---- memory ---- */

/* h = x @ w1 [4,16]; a = relu(h); y = a @ w2 [4,2]; leaves 4*(32+128+32) = 768 bytes. */
static void test_memory_by_hand(void **state)
{
	Graph g;
	load_prog(&g, "spmd: true\ninputs: {x: {shape: [4, 8]}}\nparams: {w1: {shape: [8, 16]}, w2: {shape: [16, 2]}}\n"
	              "ops:\n  - {out: h, op: einsum, eq: \"bi,io->bo\", in: [x, w1]}\n"
	              "  - {out: a, op: relu, in: [h]}\n  - {out: y, op: einsum, eq: \"bo,oc->bc\", in: [a, w2]}\n"
	              "outputs: [y]\n");
	MemoryEstimate m;
	cost_memory(&g, &m);
	assert_int_equal(m.params, 4 * (128 + 32));
	assert_int_equal(m.inputs, 4 * 32);
	/* after relu: leaves 768 + h 256 + a 256 */
	assert_int_equal(m.peak, 768 + 256 + 256);
	assert_int_equal(m.peak_op, 1);
	assert_int_equal(m.peak_activations, 512);
	graph_free(&g);
	/* bf16 halves every figure; a collective's result counts as a collective buffer */
	load_prog(&g, "spmd: true\nmesh: {x: 2}\ninputs: {x: {shape: [100], dtype: bf16}}\n"
	              "ops:\n  - {out: r, op: all_reduce, in: [x], axes: [x]}\n  - {out: e, op: exp, in: [r]}\n"
	              "outputs: [e]\n");
	cost_memory(&g, &m);
	assert_int_equal(m.inputs, 200);
	assert_int_equal(m.peak, 600), assert_int_equal(m.peak_op, 1);
	assert_int_equal(m.peak_collective, 200);
	graph_free(&g);
}

/* The executor's own accounting (ExecStats) agrees, op for op, on every example run on one device. */
static void test_memory_against_exec(void **state)
{
	const char *files[] = {"examples/mlp.yaml", "examples/convnet.yaml", "examples/transformer_block.yaml",
	                       "examples/embedding.yaml"};
	for (int i = 0; i < 4; i++) {
		Graph g;
		Diag d;
		diag_init(&d);
		assert_int_equal(model_load(&g, files[i], &d), 0);
		g.mesh = (Mesh){.ndev = 1};
		Tensor *vals = xcalloc((size_t)g.values.n + 1, sizeof *vals);
		ExecStats st;
		ExecOpts o = {.seed = 1, .stats = &st};
		assert_int_equal(exec_run(&g, vals, NULL, &o, &d), 0);
		MemoryEstimate m;
		cost_memory(&g, &m);
		assert_int_equal(m.peak, st.peak);
		assert_int_equal(m.peak_op, st.peak_op);
		assert_int_equal(m.params + m.state + m.inputs, st.leaves);
		exec_free_values(&g, vals);
		free(vals);
		graph_free(&g);
	}
}

/* ... and so does the thread backend's per-device accounting on the partitioned programs. */
static void test_memory_against_threads(void **state)
{
	const char *files[] = {"examples/mlp.yaml", "examples/transformer_block.yaml", "examples/embedding.yaml"};
	for (int i = 0; i < 3; i++) {
		Graph model, prog;
		Diag d;
		diag_init(&d);
		assert_int_equal(cost_prepare(files[i], NULL, -1, &model, &prog, &d), 0);
		DeviceMemory *mem = xcalloc((size_t)prog.mesh.ndev, sizeof *mem);
		Tensor *outs = xcalloc((size_t)prog.outputs.n + 1, sizeof *outs);
		SpmdOpts o = {.seed = 1};
		assert_int_equal(spmd_run(&prog, &o, outs, mem, &d), 0);
		MemoryEstimate m;
		cost_memory(&prog, &m);
		for (int dev = 0; dev < prog.mesh.ndev; dev++)
			assert_int_equal(mem[dev].peak, m.peak);
		/* and so do the allocator statistics of each device's tensor buffers (f32: 4 bytes an element) */
		CostRun r;
		assert_int_equal(cost_run(&model, &prog, 1, &r, &d), 0);
		for (int dev = 0; dev < prog.mesh.ndev; dev++)
			assert_int_equal(r.peak[dev], m.peak);
		cost_run_free(&r);
		for (int k = 0; k < prog.outputs.n; k++)
			tensor_free(&outs[k]);
		free(outs), free(mem);
		graph_free(&prog), graph_free(&model);
	}
}

/* The step's floor (cost_step_floor) is under the peak of every partitioned
 * program of the training examples, on any mesh, with weight-update
 * sharding off and on; it counts more than the leaves (the forward's
 * results the backward reads), and on one device it is what the unpartitioned
 * step holds just after its loss is made less what is read only up to it. */
static void test_step_floor(void **state)
{
	const char *files[] = {"examples/train_mlp.yaml", "examples/train_transformer.yaml"};
	const char *meshes[] = {"data=4,model=1", "data=2,model=2", "data=1,model=4"};
	for (int f = 0; f < 2; f++) {
		Graph g;
		Diag d;
		diag_init(&d);
		assert_int_equal(model_load(&g, files[f], &d), 0);
		assert_int_equal(train_build(&g, &d), 0);
		MemoryEstimate gm;
		cost_memory(&g, &gm);
		int64_t leaves = gm.params + gm.state + gm.inputs, floor4 = cost_step_floor(&g, 4);
		assert_true(floor4 > leaves / 4);
		for (int m = 0; m < 3; m++)
			for (int w = WUS_OFF; w <= WUS_ON; w++) {
				Graph model, prog;
				LoadOpts lo = {meshes[m], NULL};
				int64_t floor;
				assert_int_equal(cost_prepare_opts(files[f], &lo, w, &model, &prog, NULL, NULL, &floor, &d), 0);
				MemoryEstimate pm;
				cost_memory(&prog, &pm);
				assert_int_equal(floor, floor4);
				assert_true(floor <= pm.peak);
				graph_free(&prog), graph_free(&model);
			}
		/* one device: the values held at the loss by the step's own order, those read only by
		 * the loss's op left out (cost_live_values: made at or before it, read at or after) */
		int loss = g.values.a[g.train->loss].producer, *vals = xmalloc(sizeof(int) * (size_t)g.values.n);
		int n = cost_live_values(&g, loss, vals);
		int64_t held = leaves;
		for (int k = 0; k < n; k++) {
			bool later = false;
			for (int i = loss + 1; i < g.ops.n && !later; i++)
				for (int j = 0; j < g.ops.a[i].nin; j++)
					later |= g.ops.a[i].in[j] == vals[k];
			for (int o = 0; o < g.outputs.n; o++)
				later |= g.outputs.a[o] == vals[k];
			const Value *v = &g.values.a[vals[k]];
			held += later ? shape_numel(&v->shape) * dtype_size(v->dtype) : 0;
		}
		free(vals);
		assert_int_equal(cost_step_floor(&g, 1), held);
		graph_free(&g);
	}
}

/* Measured op times come back for every op (the thread backend's --profile). */
static void test_measure(void **state)
{
	Graph model, prog;
	Diag d;
	diag_init(&d);
	assert_int_equal(cost_prepare("examples/transformer_block.yaml", NULL, -1, &model, &prog, &d), 0);
	double *sec = xcalloc((size_t)prog.ops.n, sizeof *sec);
	assert_int_equal(cost_measure(&model, &prog, 1, sec, &d), 0);
	for (int i = 0; i < prog.ops.n; i++)
		assert_true(sec[i] > 0 && sec[i] < 10);
	free(sec);
	graph_free(&prog), graph_free(&model);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_profiles_builtin),
		cmocka_unit_test(test_profiles_round_trip),
		cmocka_unit_test(test_profiles_errors),
		cmocka_unit_test(test_ring_formulas),
		cmocka_unit_test(test_torus_2d),
		cmocka_unit_test(test_torus_mapping),
		cmocka_unit_test(test_switch_mapping),
		cmocka_unit_test(test_threads_topology),
		cmocka_unit_test(test_monotone),
		cmocka_unit_test(test_reshard_cost),
		cmocka_unit_test(test_op_roofline),
		cmocka_unit_test(test_conv_work),
		cmocka_unit_test(test_fusion),
		cmocka_unit_test(test_overlap),
		cmocka_unit_test(test_waits),
		cmocka_unit_test(test_link_lanes),
		cmocka_unit_test(test_collective_overhead),
		cmocka_unit_test(test_steady_state),
		cmocka_unit_test(test_training_phases),
		cmocka_unit_test(test_memory_by_hand),
		cmocka_unit_test(test_memory_against_exec),
		cmocka_unit_test(test_memory_against_threads),
		cmocka_unit_test(test_step_floor),
		cmocka_unit_test(test_measure),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
