/* fuzz_common.c: helpers of the harnesses (fuzz.h). */
#include "fuzz.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int fuzz_pick(FuzzBytes *b, int k)
{
	if (!b->n)
		return 0;
	b->n--;
	return *b->p++ % k;
}

void fuzz_sharding(FuzzBytes *b, int rank, char *out, size_t n)
{
	static const char *const dims[] = {"null", "a", "b", "[a, b]", "[b, a]"};
	int d0 = fuzz_pick(b, 5), d1 = rank > 1 ? fuzz_pick(b, 5) : 0;
	if ((d0 >= 3 && d1 != 0) || (d1 >= 3 && d0 != 0) || (d0 == d1 && d0 != 0))
		d1 = 0;
	if (rank == 1)
		snprintf(out, n, ", sharding: [%s]", dims[d0]);
	else
		snprintf(out, n, ", sharding: [%s, %s]", dims[d0], dims[d1]);
}

void fuzz_put(FuzzText *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	t->len += (size_t)vsnprintf(t->t + t->len, t->cap - t->len, fmt, ap);
	va_end(ap);
	if (t->len >= t->cap)
		FUZZ_FINDING("the generated model is too long");
}

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
