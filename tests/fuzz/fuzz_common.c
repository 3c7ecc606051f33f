/* fuzz_common.c: helpers of the harnesses (fuzz.h). */
#include "fuzz.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

char *fuzz_text(const uint8_t *data, size_t size)
{
	char *t = xmalloc(size + 1);
	memcpy(t, data, size);
	t[size] = 0;
	return t;
}

void fuzz_diag(Diag *d)
{
	diag_init(d);
	d->quiet = true;
}

const char *fuzz_path(const char *name)
{
	static char buf[4096];
	const char *tmp = getenv("TMPDIR");
	snprintf(buf, sizeof buf, "%s/spmd-fuzz-%ld", tmp && *tmp ? tmp : "/tmp", (long)getpid());
	dir_make(buf);
	size_t n = strlen(buf);
	snprintf(buf + n, sizeof buf - n, "/%s", name);
	return buf;
}

void fuzz_write(const char *path, const void *data, size_t size)
{
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
		FUZZ_FINDING("cannot write %s", path);
}
