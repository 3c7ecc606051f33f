/* test_npy.c: .npy round trips for every dtype and rank, hand-made files, malformed files, and numpy when present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "../spmd/npy.h"

static char dir[64];

static const char *path_in(const char *name)
{
	static char buf[4][128];
	static int k;
	k = (k + 1) % 4;
	snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
	return buf[k];
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/spmd_npy_XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, n, f), n);
	fclose(f);
}

/* A .npy file from a header text (padding added) and payload bytes. */
static size_t make_npy(unsigned char *buf, int major, const char *hdr, const void *payload, size_t n)
{
	size_t pre = major == 1 ? 10 : 12, hlen = strlen(hdr);
	memcpy(buf, "\x93NUMPY", 6);
	buf[6] = (unsigned char)major, buf[7] = 0;
	size_t total = hlen + 1;
	while ((pre + total) % 64)
		total++;
	for (int i = 0; i < (major == 1 ? 2 : 4); i++)
		buf[8 + i] = (unsigned char)(total >> (8 * i));
	memcpy(buf + pre, hdr, hlen);
	memset(buf + pre + hlen, ' ', total - hlen - 1);
	buf[pre + total - 1] = '\n';
	memcpy(buf + pre + total, payload, n);
	return pre + total + n;
}

static void fill(Tensor *t)
{
	for (int64_t i = 0; i < shape_numel(&t->shape); i++)
		if (t->dtype == DT_I32)
			tensor_i32(t)[i] = (int32_t)(i * 7919 % 2001) - 1000;
		else
			tensor_f32(t)[i] = (float)(sin((double)i) * 100);
	tensor_round(t);
}

static void test_round_trip(void **state)
{
	(void)state;
	Shape shapes[] = {{0}, {1, {5}}, {2, {3, 4}}, {3, {2, 1, 3}}, {4, {2, 3, 0, 2}}, {8, {1, 2, 1, 2, 1, 2, 1, 2}}};
	DType want[DT_COUNT] = {DT_F32, DT_F32, DT_F32, DT_F64, DT_I32}; /* bf16 and f16 are written as f4 */
	for (int dt = 0; dt < DT_COUNT; dt++)
		for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
			Tensor t, r;
			tensor_alloc(&t, (DType)dt, &shapes[s]);
			fill(&t);
			const char *p = path_in("rt.npy");
			assert_int_equal(npy_write(p, &t), 0);
			Diag d;
			diag_init(&d);
			assert_int_equal(npy_read(p, &r, &d), 0);
			assert_int_equal(r.dtype, want[dt]);
			assert_true(shape_eq(&r.shape, &t.shape));
			assert_memory_equal(r.data, t.data, (size_t)shape_numel(&t.shape) * 4);
			size_t n;
			char *raw = file_read(p, &n);
			assert_int_equal((10 + (raw[8] & 0xff) + 256 * (raw[9] & 0xff)) % 64, 0);
			if (s <= 2) /* the header text starts at byte 10 (the version bytes hold a 0) */
				assert_non_null(strstr(raw + 10, s == 0 ? "'shape': ()" : s == 1 ? "'shape': (5,)" : "'shape': (3, 4)"));
			free(raw);
			tensor_free(&t), tensor_free(&r);
		}
	assert_int_equal(access(path_in("rt.npy.tmp.0"), F_OK), -1);
}

static void test_hand_made(void **state)
{
	(void)state;
	unsigned char buf[512];
	Diag d;
	diag_init(&d);
	Tensor t;
	/* '<f2': 1, -2, 2^-24 (smallest subnormal), inf */
	unsigned char half[] = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0x00, 0x7c};
	size_t n = make_npy(buf, 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }", half, sizeof half);
	write_bytes(path_in("h.npy"), buf, n);
	assert_int_equal(npy_read(path_in("h.npy"), &t, &d), 0);
	assert_int_equal(t.dtype, DT_F16);
	float wh[4] = {1, -2, 0x1p-24f, INFINITY};
	assert_memory_equal(t.data, wh, sizeof wh);
	tensor_free(&t);
	/* version 2.0, double quotes, keys in another order, no trailing comma; '<f8' */
	double dv[3] = {0.5, -1e300, 3.25};
	n = make_npy(buf, 2, "{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<f8\"}", dv, sizeof dv);
	write_bytes(path_in("v2.npy"), buf, n);
	assert_int_equal(npy_read(path_in("v2.npy"), &t, &d), 0);
	assert_int_equal(t.dtype, DT_F64);
	assert_true(tensor_f32(&t)[0] == 0.5f && isinf(tensor_f32(&t)[1]) && tensor_f32(&t)[2] == 3.25f);
	tensor_free(&t);
	/* version 3.0, Python 2 long dims */
	int32_t iv[2] = {-5, 70000};
	n = make_npy(buf, 3, "{'descr': '<i4', 'fortran_order': False, 'shape': (1L, 2L), }", iv, sizeof iv);
	write_bytes(path_in("v3.npy"), buf, n);
	assert_int_equal(npy_read(path_in("v3.npy"), &t, &d), 0);
	assert_int_equal(t.dtype, DT_I32);
	assert_int_equal(t.shape.rank, 2);
	assert_memory_equal(t.data, iv, sizeof iv);
	tensor_free(&t);
	assert_int_equal(d.nerr, 0);
}

/* The file must be refused with a message naming it. */
static void expect_error(const char *name, const void *data, size_t n, const char *msg)
{
	const char *p = path_in(name);
	write_bytes(p, data, n);
	Diag d;
	diag_init(&d);
	d.quiet = true;
	Tensor t = {.data = NULL};
	assert_int_equal(npy_read(p, &t, &d), -1);
	assert_int_equal(d.nerr, 1);
	assert_null(t.data);
	if (!strstr(d.last, "expected") || (msg && !strstr(d.last, msg)))
		fail_msg("%s: message '%s' lacks '%s'", name, d.last, msg ? msg : "expected");
}

static void bad_header(const char *hdr, const char *msg, size_t payload)
{
	unsigned char buf[512], zeros[64] = {0};
	size_t n = make_npy(buf, 1, hdr, zeros, payload);
	expect_error("bad.npy", buf, n, msg);
}

static void test_malformed(void **state)
{
	(void)state;
	unsigned char buf[512];
	float f[6] = {0};
	size_t n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f, sizeof f);
	expect_error("empty.npy", "", 0, "magic");
	expect_error("short.npy", buf, 7, "magic");
	expect_error("magic.npy", "\x93NUMPZ\x01\x00\x10\x00{}", 12, "magic");
	unsigned char v4[512];
	memcpy(v4, buf, n);
	v4[6] = 4;
	expect_error("v4.npy", v4, n, "version");
	expect_error("trunc_header.npy", buf, 40, "header of");
	expect_error("trunc_data.npy", buf, n - 1, "bytes of data");
	unsigned char more[600];
	memcpy(more, buf, n), memcpy(more + n, "xxxx", 4);
	expect_error("long_data.npy", more, n + 4, "bytes of data");
	bad_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", "fortran_order False", 24);
	bad_header("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", "'>f4'", 24);
	bad_header("{'descr': '<u1', 'fortran_order': False, 'shape': (2, 3), }", "'<u1'", 6);
	bad_header("{'descr': '<f4', 'fortran_order': False, }", "'shape'", 24);
	bad_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", "'x'", 24);
	bad_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", "'shape'", 12);
	bad_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", "'shape'", 4);
	bad_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", "'shape'", 4);
	bad_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", "elements", 4);
	bad_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3) ", "',' or '}'", 24);
	bad_header("['descr', '<f4']", "'{'", 24);
	bad_header("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 3), }", "'fortran_order'", 24);
	bad_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } junk", "end of the header", 24);
	Diag d;
	diag_init(&d);
	d.quiet = true;
	Tensor t;
	assert_int_equal(npy_read(path_in("missing.npy"), &t, &d), -1);
	assert_non_null(strstr(d.last, "expected a readable"));
	/* every prefix of a good file is refused, none crashes */
	for (size_t k = 0; k < n; k++) {
		write_bytes(path_in("prefix.npy"), buf, k);
		assert_int_equal(npy_read(path_in("prefix.npy"), &t, &d), -1);
	}
	/* and every single-byte corruption of the header is refused or read cleanly */
	for (size_t k = 0; k < n - sizeof f; k++) {
		unsigned char c[512];
		memcpy(c, buf, n);
		c[k] ^= 0x5a;
		write_bytes(path_in("flip.npy"), c, n);
		if (npy_read(path_in("flip.npy"), &t, &d) == 0)
			tensor_free(&t);
	}
}

/* With numpy at hand: numpy reads what we write and we read what numpy writes. */
static void test_numpy(void **state)
{
	(void)state;
	if (system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0)
		skip();
	Tensor t;
	Shape s = {2, {3, 4}};
	DType dts[3] = {DT_F32, DT_F64, DT_I32};
	const char *names[3] = {"np_f4.npy", "np_f8.npy", "np_i4.npy"};
	for (int i = 0; i < 3; i++) {
		tensor_alloc(&t, dts[i], &s);
		fill(&t);
		assert_int_equal(npy_write(path_in(names[i]), &t), 0);
		tensor_free(&t);
	}
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	         "cd '%s' && /usr/bin/python3 -c \"\nimport numpy as np, sys\n"
	         "i = np.arange(12)\nf = (np.sin(i) * 100).astype(np.float32).reshape(3, 4)\n"
	         "a, b, c = np.load('np_f4.npy'), np.load('np_f8.npy'), np.load('np_i4.npy')\n"
	         "ok = a.dtype == np.float32 and b.dtype == np.float64 and c.dtype == np.int32 and a.shape == (3, 4)\n"
	         "ok = ok and (a == f).all() and (b == f).all() and (c == (i * 7919 %% 2001 - 1000).reshape(3, 4)).all()\n"
	         "np.save('py_f2.npy', np.array([[1.5, -0.25]], dtype=np.float16))\n"
	         "np.save('py_s.npy', np.float64(2.5))\n"
	         "np.save('py_i.npy', np.arange(24, dtype=np.int32).reshape(2, 3, 4))\n"
	         "np.save('py_fo.npy', np.asfortranarray(np.ones((2, 3), dtype=np.float32)))\n"
	         "sys.exit(0 if ok else 1)\n\"",
	         dir);
	assert_int_equal(system(cmd), 0);
	Diag d;
	diag_init(&d);
	d.quiet = true;
	assert_int_equal(npy_read(path_in("py_f2.npy"), &t, &d), 0);
	assert_true(t.dtype == DT_F16 && t.shape.rank == 2 && tensor_f32(&t)[0] == 1.5f && tensor_f32(&t)[1] == -0.25f);
	tensor_free(&t);
	assert_int_equal(npy_read(path_in("py_s.npy"), &t, &d), 0);
	assert_true(t.dtype == DT_F64 && t.shape.rank == 0 && tensor_f32(&t)[0] == 2.5f);
	tensor_free(&t);
	assert_int_equal(npy_read(path_in("py_i.npy"), &t, &d), 0);
	for (int i = 0; i < 24; i++)
		assert_int_equal(tensor_i32(&t)[i], i);
	tensor_free(&t);
	assert_int_equal(npy_read(path_in("py_fo.npy"), &t, &d), -1);
	assert_non_null(strstr(d.last, "fortran_order"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_hand_made),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_numpy),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
