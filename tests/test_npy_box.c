/* test_npy_box.c: npy_info and npy_read_box (a device's shard of a .npy file) against npy_read and a naive slice. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>
#include <unistd.h>

#include "../spmd/npy.h"

static char dir[64];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/spmd_npybox_XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* A tensor of shape dims whose element i is distinct (as float or int). */
static void make(Tensor *t, DType dt, int rank, const int64_t *dims)
{
	Shape s = {.rank = rank};
	if (rank > 0)
		memcpy(s.dim, dims, sizeof(int64_t) * (size_t)rank);
	tensor_alloc(t, dt, &s);
	for (int64_t i = 0; i < shape_numel(&s); i++) {
		if (dt == DT_I32)
			tensor_i32(t)[i] = (int32_t)(i * 7 - 100);
		else
			tensor_f32(t)[i] = (float)i * 0.25f - 3.0f;
	}
}

/* Element at multi-index idx of a C-order buffer of shape dims. */
static int64_t at(int rank, const int64_t *dims, const int64_t *idx)
{
	int64_t k = 0;
	for (int d = 0; d < rank; d++)
		k = k * dims[d] + idx[d];
	return k;
}

/* Read the box (off, ext) of the file into a buffer of shape dst (box at the
 * origin, the rest a marker) and compare each element with the whole file. */
static void check_box(const char *path, const int64_t *off, const int64_t *ext, const int64_t *dst)
{
	Diag d;
	diag_init(&d);
	d.quiet = true;
	Tensor whole;
	assert_int_equal(npy_read(path, &whole, &d), 0);
	NpyInfo info;
	assert_int_equal(npy_info(path, &info, &d), 0);
	assert_true(shape_eq(&info.shape, &whole.shape));
	assert_int_equal(info.dtype, whole.dtype);
	int rank = info.shape.rank;
	int64_t n = 1;
	for (int k = 0; k < rank; k++)
		n *= dst[k];
	uint32_t *buf = malloc((size_t)n * 4 + 4);
	for (int64_t i = 0; i < n; i++)
		buf[i] = 0xdeadbeef;
	assert_int_equal(npy_read_box(path, &info, off, ext, buf, dst, &d), 0);
	const uint32_t *w = whole.data;
	for (int64_t i = 0; i < n; i++) {
		int64_t idx[MAX_RANK], src[MAX_RANK], r = i;
		bool inside = true;
		for (int k = rank - 1; k >= 0; k--) {
			idx[k] = r % dst[k], r /= dst[k];
			src[k] = off[k] + idx[k];
			inside &= idx[k] < ext[k];
		}
		assert_int_equal(buf[i], inside ? w[at(rank, info.shape.dim, src)] : 0xdeadbeef);
	}
	free(buf);
	tensor_free(&whole);
}

static void test_boxes_of_every_dtype(void **state)
{
	(void)state;
	static const DType dts[] = {DT_F32, DT_I32, DT_F64};
	for (int i = 0; i < 3; i++) {
		char path[128];
		snprintf(path, sizeof path, "%s/t%d.npy", dir, i);
		Tensor t;
		make(&t, dts[i], 3, (int64_t[]){4, 5, 6});
		assert_int_equal(npy_write(path, &t), 0);
		tensor_free(&t);
		check_box(path, (int64_t[]){0, 0, 0}, (int64_t[]){4, 5, 6}, (int64_t[]){4, 5, 6}); /* all */
		check_box(path, (int64_t[]){2, 1, 3}, (int64_t[]){2, 3, 3}, (int64_t[]){2, 3, 3}); /* a corner */
		check_box(path, (int64_t[]){1, 0, 0}, (int64_t[]){1, 5, 6}, (int64_t[]){2, 5, 6}); /* padded */
		check_box(path, (int64_t[]){3, 4, 5}, (int64_t[]){1, 1, 1}, (int64_t[]){1, 1, 1}); /* one */
		check_box(path, (int64_t[]){4, 0, 0}, (int64_t[]){0, 5, 6}, (int64_t[]){1, 5, 6}); /* empty */
	}
}

static void test_rank_0_and_1(void **state)
{
	(void)state;
	char path[128];
	Tensor t;
	snprintf(path, sizeof path, "%s/s.npy", dir);
	make(&t, DT_F32, 0, NULL);
	assert_int_equal(npy_write(path, &t), 0);
	tensor_free(&t);
	check_box(path, NULL, NULL, NULL);
	snprintf(path, sizeof path, "%s/v.npy", dir);
	make(&t, DT_I32, 1, (int64_t[]){9});
	assert_int_equal(npy_write(path, &t), 0);
	tensor_free(&t);
	check_box(path, (int64_t[]){6}, (int64_t[]){3}, (int64_t[]){4});
}

/* A file cut short, a missing file, a directory: errors naming the file. */
static void test_bad_files(void **state)
{
	(void)state;
	char path[128], cut[128];
	Tensor t;
	snprintf(path, sizeof path, "%s/w.npy", dir);
	snprintf(cut, sizeof cut, "%s/cut.npy", dir);
	make(&t, DT_F32, 2, (int64_t[]){8, 8});
	assert_int_equal(npy_write(path, &t), 0);
	tensor_free(&t);
	size_t n;
	char *bytes = file_read(path, &n);
	assert_non_null(bytes);
	FILE *f = fopen(cut, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(bytes, 1, n - 10, f), n - 10);
	fclose(f);
	free(bytes);
	Diag d;
	diag_init(&d);
	d.quiet = true;
	NpyInfo info;
	assert_int_equal(npy_info(cut, &info, &d), -1);
	assert_non_null(strstr(d.last, "bytes of data"));
	assert_int_equal(npy_info(dir, &info, &d), -1);
	assert_non_null(strstr(d.last, "directory"));
	snprintf(cut, sizeof cut, "%s/none.npy", dir);
	assert_int_equal(npy_info(cut, &info, &d), -1);
	assert_non_null(strstr(d.last, "No such file"));
	/* the file shrinks between npy_info and npy_read_box */
	assert_int_equal(npy_info(path, &info, &d), 0);
	assert_int_equal(truncate(path, (off_t)info.data_offset + 16), 0);
	float box[16];
	assert_int_equal(npy_read_box(path, &info, (int64_t[]){4, 0}, (int64_t[]){2, 8}, box, (int64_t[]){2, 8}, &d), -1);
	assert_non_null(strstr(d.last, "read error"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_boxes_of_every_dtype),
		cmocka_unit_test(test_rank_0_and_1),
		cmocka_unit_test(test_bad_files),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
