/* fuzz_npy.c: a .npy file through npy_read, and through npy_info and
 * npy_read_box (a device's shard: the upper half of dim 0) when its header
 * is good; what npy_read returns must write back and read again the same. */
#include "fuzz.h"

#include <string.h>

#include "../../spmd/npy.h"

static void read_half(const char *path)
{
	Diag d;
	fuzz_diag(&d);
	NpyInfo info;
	if (npy_info(path, &info, &d) != 0 || shape_numel(&info.shape) > (1 << 20))
		return;
	int64_t off[MAX_RANK] = {0}, ext[MAX_RANK];
	for (int k = 0; k < info.shape.rank; k++)
		ext[k] = info.shape.dim[k];
	if (info.shape.rank > 0)
		off[0] = info.shape.dim[0] / 2, ext[0] -= off[0];
	Shape box = info.shape;
	for (int k = 0; k < box.rank; k++)
		box.dim[k] = ext[k];
	void *dst = xcalloc((size_t)shape_numel(&box) + 1, 4);
	npy_read_box(path, &info, off, ext, dst, box.dim, &d);
	free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *path = fuzz_path("x.npy");
	fuzz_write(path, data, size);
	Diag d;
	fuzz_diag(&d);
	Tensor t;
	if (npy_read(path, &t, &d) == 0) {
		char again[4096];
		snprintf(again, sizeof again, "%s.again.npy", path);
		Tensor u;
		if (npy_write(again, &t) != 0 || npy_read(again, &u, &d) != 0)
			FUZZ_FINDING("a tensor read from .npy does not write back: %s", d.last);
		if (u.dtype != (t.dtype == DT_F16 ? DT_F32 : t.dtype) && u.dtype != t.dtype)
			FUZZ_FINDING("dtype %d read back as %d", t.dtype, u.dtype);
		if (memcmp(t.data, u.data, 4 * (size_t)shape_numel(&t.shape)) != 0)
			FUZZ_FINDING("a tensor read back differs");
		tensor_free(&u);
		tensor_free(&t);
	}
	read_half(path);
	return 0;
}
