/* npy.c: .npy files: the header (a Python dict literal) parsed by hand, payload little-endian.
 *
 * Layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.0, u32 LE
 * for 2.0 and 3.0), then the header text, e.g.
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and a newline, then the elements in C order.  Every
 * byte read is bounds-checked: a truncated or malformed file is an error
 * with the file name, never a crash. */
#include "npy.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

static int npy_fail(Diag *d, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Report "PATH: error: ..." and return -1. */
static int npy_fail(Diag *d, const char *path, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	d->nerr++;
	diag_verror(d, (Pos){path, 0, 0}, "error", fmt, ap);
	va_end(ap);
	return -1;
}

static uint32_t get_u16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t get_u32(const unsigned char *p) { return get_u16(p) | get_u16(p + 2) << 16; }
static uint64_t get_u64(const unsigned char *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

/* ---- the header dict ---- */

typedef struct {
	const char *s, *end;
	char descr[16];
	int fortran;      /* -1 missing, 0, 1 */
	bool have_shape;
	Shape shape;
} Header;

static void skip_ws(Header *h)
{
	while (h->s < h->end && (*h->s == ' ' || *h->s == '\t' || *h->s == '\n' || *h->s == '\r'))
		h->s++;
}

/* "what is at the cursor", for messages. */
static void near(const Header *h, char *buf, size_t n)
{
	if (h->s >= h->end) {
		snprintf(buf, n, "the end of the header");
		return;
	}
	size_t k = 0;
	buf[k++] = '\'';
	for (const char *p = h->s; p < h->end && k + 3 < n && p - h->s < 12 && *p != '\n'; p++)
		buf[k++] = (*p >= 32 && *p < 127) ? *p : '?';
	buf[k++] = '\'';
	buf[k] = 0;
}

/* A quoted string ('x' or "x") into buf. 0 or -1. */
static int parse_str(Header *h, char *buf, size_t n)
{
	if (h->s >= h->end || (*h->s != '\'' && *h->s != '"'))
		return -1;
	char q = *h->s++;
	size_t k = 0;
	while (h->s < h->end && *h->s != q) {
		if (k + 1 >= n)
			return -1;
		buf[k++] = *h->s++;
	}
	if (h->s >= h->end)
		return -1;
	h->s++;
	buf[k] = 0;
	return 0;
}

static bool take_word(Header *h, const char *w)
{
	size_t n = strlen(w);
	if ((size_t)(h->end - h->s) < n || memcmp(h->s, w, n) != 0)
		return false;
	h->s += n;
	return true;
}

/* (d0, d1, ...) with an optional trailing comma; () is rank 0. 0 or -1. */
static int parse_shape(Header *h)
{
	if (!take_word(h, "("))
		return -1;
	Shape s = {0};
	bool comma = false; /* after the last dim: "(3)" is not a tuple */
	for (;;) {
		skip_ws(h);
		if (take_word(h, ")"))
			break;
		if (s.rank == MAX_RANK || h->s >= h->end || *h->s < '0' || *h->s > '9')
			return -1;
		int64_t v = 0;
		while (h->s < h->end && *h->s >= '0' && *h->s <= '9') {
			if (v > ((int64_t)SHAPE_MAX_NUMEL - 9) / 10)
				return -1;
			v = v * 10 + (*h->s++ - '0');
		}
		take_word(h, "L"); /* Python 2 longs */
		s.dim[s.rank++] = v;
		skip_ws(h);
		comma = take_word(h, ",");
		if (!comma && !(h->s < h->end && *h->s == ')'))
			return -1;
	}
	if (s.rank == 1 && !comma)
		return -1;
	h->shape = s;
	h->have_shape = true;
	return 0;
}

/* One `'key': value` entry. 0, or -1 after reporting. */
static int parse_entry(Header *h, const char *path, Diag *d)
{
	char key[32], what[32];
	if (parse_str(h, key, sizeof key) != 0)
		return near(h, what, sizeof what), npy_fail(d, path, "expected a quoted header key, found %s", what);
	skip_ws(h);
	if (!take_word(h, ":"))
		return near(h, what, sizeof what), npy_fail(d, path, "expected ':' after '%s', found %s", key, what);
	skip_ws(h);
	int rc = -1;
	if (strcmp(key, "descr") == 0)
		rc = parse_str(h, h->descr, sizeof h->descr);
	else if (strcmp(key, "fortran_order") == 0)
		rc = take_word(h, "True") ? (h->fortran = 1, 0) : take_word(h, "False") ? (h->fortran = 0, 0) : -1;
	else if (strcmp(key, "shape") == 0)
		rc = parse_shape(h);
	else
		return npy_fail(d, path, "expected header key 'descr', 'fortran_order' or 'shape', found '%s'", key);
	if (rc != 0)
		return near(h, what, sizeof what), npy_fail(d, path, "expected a valid value for '%s', found %s", key, what);
	return 0;
}

/* The whole dict, then only padding. 0 or -1 (reported). */
static int parse_header(Header *h, const char *path, Diag *d)
{
	char what[32];
	h->fortran = -1;
	skip_ws(h);
	if (!take_word(h, "{"))
		return near(h, what, sizeof what), npy_fail(d, path, "expected '{' opening the header, found %s", what);
	for (;;) {
		skip_ws(h);
		if (take_word(h, "}"))
			break;
		if (parse_entry(h, path, d) != 0)
			return -1;
		skip_ws(h);
		if (!take_word(h, ",") && !(h->s < h->end && *h->s == '}'))
			return near(h, what, sizeof what), npy_fail(d, path, "expected ',' or '}' in the header, found %s", what);
	}
	skip_ws(h);
	if (h->s != h->end)
		return near(h, what, sizeof what), npy_fail(d, path, "expected the end of the header, found %s", what);
	if (!h->descr[0] || h->fortran < 0 || !h->have_shape)
		return npy_fail(d, path, "expected header keys 'descr', 'fortran_order' and 'shape', found %s missing",
		                !h->descr[0] ? "'descr'" : h->fortran < 0 ? "'fortran_order'" : "'shape'");
	if (h->fortran)
		return npy_fail(d, path, "expected fortran_order False (C order), found True");
	return 0;
}

/* ---- payload ---- */

static float half_to_float(uint32_t h)
{
	uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
	float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 0x400), (int)e - 25);
	return (h & 0x8000) ? -v : v;
}

/* DType and element size of a descr; -1 if unsupported. */
static int descr_dtype(const char *s, int *size)
{
	static const struct { const char *name; DType t; int size; } known[] = {
		{"<f4", DT_F32, 4}, {"<f8", DT_F64, 8}, {"<f2", DT_F16, 2}, {"<i4", DT_I32, 4}};
	for (size_t i = 0; i < sizeof known / sizeof *known; i++)
		if (strcmp(s, known[i].name) == 0)
			return *size = known[i].size, (int)known[i].t;
	return -1;
}

static void decode(DType t, const unsigned char *p, int64_t n, void *out)
{
	float *f = out;
	int32_t *q = out;
	for (int64_t i = 0; i < n; i++) {
		if (t == DT_F32) {
			uint32_t u = get_u32(p + 4 * i);
			memcpy(&f[i], &u, 4);
		} else if (t == DT_I32)
			q[i] = (int32_t)get_u32(p + 4 * i);
		else if (t == DT_F16)
			f[i] = half_to_float(get_u16(p + 2 * i));
		else {
			uint64_t u = get_u64(p + 8 * i);
			double x;
			memcpy(&x, &u, 8);
			f[i] = (float)x;
		}
	}
}

/* The magic, version and header bounds: *hdr, *hlen get the header text. */
static int parse_preamble(const unsigned char *b, size_t n, const char *path, size_t *hdr, size_t *hlen, Diag *d)
{
	if (n < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
		return npy_fail(d, path, "expected a .npy file (magic \\x93NUMPY), found %s",
		                n < 10 ? "a file too short for it" : "other bytes");
	if (b[6] < 1 || b[6] > 3)
		return npy_fail(d, path, "expected .npy format version 1.0, 2.0 or 3.0, found %d.%d", b[6], b[7]);
	*hdr = b[6] == 1 ? 10 : 12;
	if (n < *hdr)
		return npy_fail(d, path, "expected a header length, found the end of the file");
	*hlen = b[6] == 1 ? get_u16(b + 8) : get_u32(b + 8);
	if (*hlen > n - *hdr)
		return npy_fail(d, path, "expected a header of %zu bytes, found %zu", *hlen, n - *hdr);
	return 0;
}

/* The dtype, element size and count of a parsed header, and whether the
 * payload of `have` bytes holds exactly those elements.  0 or -1 (reported). */
static int check_payload(const Header *h, size_t have, const char *path, int *dt, int *size, int64_t *numel,
                         Diag *d)
{
	*dt = descr_dtype(h->descr, size);
	if (*dt < 0)
		return npy_fail(d, path, "expected dtype '<f4', '<f8', '<f2' or '<i4', found '%s'", h->descr);
	int64_t n = 1, max = (int64_t)SHAPE_MAX_NUMEL;
	for (int i = 0; i < h->shape.rank; i++) {
		int64_t k = h->shape.dim[i] ? h->shape.dim[i] : 1;
		if (n > max / k)
			return npy_fail(d, path, "expected at most %lld elements, found more", (long long)max);
		n *= k;
	}
	*numel = shape_numel(&h->shape);
	if ((uint64_t)*numel * (uint64_t)*size != have) {
		char s[128];
		shape_format(&h->shape, s, sizeof s);
		return npy_fail(d, path, "expected %lld bytes of data for shape %s '%s', found %zu",
		                (long long)*numel * *size, s, h->descr, have);
	}
	return 0;
}

int npy_read(const char *path, Tensor *t, Diag *d)
{
	size_t n, hdr = 0, hlen = 0;
	unsigned char *b = (unsigned char *)file_read(path, &n);
	if (!b)
		return npy_fail(d, path, "expected a readable .npy file, found %s", strerror(errno));
	Header h = {0};
	int rc = parse_preamble(b, n, path, &hdr, &hlen, d);
	if (rc == 0) {
		h.s = (const char *)b + hdr, h.end = h.s + hlen;
		rc = parse_header(&h, path, d);
	}
	int size = 0, dt = -1;
	int64_t numel = 0;
	if (rc == 0)
		rc = check_payload(&h, n - hdr - hlen, path, &dt, &size, &numel, d);
	if (rc == 0) {
		tensor_alloc(t, (DType)dt, &h.shape);
		decode((DType)dt, b + hdr + hlen, numel, t->data);
	}
	free(b);
	return rc;
}

/* ---- reading a box ---- */

/* The preamble and header of the open file f of `size` bytes into h (the
 * header text in *text, to free).  0 or -1 (reported). */
static int read_header(FILE *f, size_t size, const char *path, Header *h, char **text, NpyInfo *info, Diag *d)
{
	unsigned char pre[12] = {0};
	size_t hdr = 0, hlen = 0, want = size < 12 ? size : 12;
	if (fread(pre, 1, want, f) != want)
		return npy_fail(d, path, "expected a readable .npy file, found a read error");
	if (parse_preamble(pre, size, path, &hdr, &hlen, d) != 0)
		return -1;
	*text = xmalloc(hlen + 1);
	if (fseek(f, (long)hdr, SEEK_SET) != 0 || fread(*text, 1, hlen, f) != hlen)
		return npy_fail(d, path, "expected a header of %zu bytes, found a read error", hlen);
	h->s = *text, h->end = *text + hlen;
	if (parse_header(h, path, d) != 0)
		return -1;
	info->data_offset = (int64_t)(hdr + hlen);
	return 0;
}

int npy_info(const char *path, NpyInfo *info, Diag *d)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return npy_fail(d, path, "expected a readable .npy file, found %s", strerror(errno));
	struct stat st = {0};
	int rc = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) ? 0 : -1;
	if (rc != 0)
		npy_fail(d, path, "expected a readable .npy file, found %s", S_ISDIR(st.st_mode) ? "a directory" : "no regular file");
	Header h = {0};
	char *text = NULL;
	int dt = -1;
	int64_t numel = 0;
	if (rc == 0)
		rc = read_header(f, (size_t)st.st_size, path, &h, &text, info, d);
	if (rc == 0)
		rc = check_payload(&h, (size_t)st.st_size - (size_t)info->data_offset, path, &dt, &info->elem_size, &numel, d);
	if (rc == 0)
		info->shape = h.shape, info->dtype = (DType)dt;
	free(text);
	fclose(f);
	return rc;
}

/* Read the box's rows over dims [d, rank) into dst (shape dd); at and to are
 * the flat indices, in the file and in dst, of the dims before d.  0 or -1. */
static int read_rows(FILE *f, const NpyInfo *info, const int64_t *off, const int64_t *ext, int d, int64_t at,
                     void *dst, const int64_t *dd, int64_t to, unsigned char *row)
{
	int rank = info->shape.rank;
	if (rank > 0) {
		at = at * info->shape.dim[d] + off[d];
		to = to * dd[d];
	}
	if (rank == 0 || d == rank - 1) {
		int64_t n = rank ? ext[d] : 1;
		if (fseek(f, (long)(info->data_offset + at * info->elem_size), SEEK_SET) != 0 ||
		    fread(row, (size_t)info->elem_size, (size_t)n, f) != (size_t)n)
			return -1;
		decode(info->dtype, row, n, (char *)dst + 4 * to);
		return 0;
	}
	for (int64_t i = 0; i < ext[d]; i++)
		if (read_rows(f, info, off, ext, d + 1, at + i, dst, dd, to + i, row) != 0)
			return -1;
	return 0;
}

int npy_read_box(const char *path, const NpyInfo *info, const int64_t *off, const int64_t *ext, void *dst,
                 const int64_t *dst_dims, Diag *d)
{
	int rank = info->shape.rank;
	for (int k = 0; k < rank; k++)
		if (ext[k] <= 0)
			return 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return npy_fail(d, path, "expected a readable .npy file, found %s", strerror(errno));
	unsigned char *row = xmalloc((size_t)(rank ? ext[rank - 1] : 1) * (size_t)info->elem_size);
	int rc = read_rows(f, info, off, ext, 0, 0, dst, dst_dims, 0, row);
	free(row);
	fclose(f);
	if (rc != 0)
		return npy_fail(d, path, "expected the data its header describes, found a read error or a shorter file");
	return 0;
}

/* ---- writing ---- */

static void put_u32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* The 1.0 header, padded so the data starts at a multiple of 64; returns its length. */
static size_t header_text(const Tensor *t, const char *descr, char *buf, size_t n)
{
	char shape[256];
	size_t k = (size_t)snprintf(shape, sizeof shape, "(");
	for (int i = 0; i < t->shape.rank; i++)
		k += (size_t)snprintf(shape + k, sizeof shape - k, "%lld,%s", (long long)t->shape.dim[i],
		                      i + 1 < t->shape.rank ? " " : "");
	if (t->shape.rank > 1)
		k--; /* numpy: (3,) but (3, 4) */
	snprintf(shape + k, sizeof shape - k, ")");
	size_t len = (size_t)snprintf(buf, n, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
	while ((10 + len + 1) % 64 != 0)
		buf[len++] = ' ';
	buf[len++] = '\n';
	return len;
}

int npy_write(const char *path, const Tensor *t)
{
	bool f64 = t->dtype == DT_F64, i32 = t->dtype == DT_I32;
	int64_t numel = shape_numel(&t->shape);
	size_t esize = f64 ? 8 : 4;
	char hdr[512];
	size_t hlen = header_text(t, f64 ? "<f8" : i32 ? "<i4" : "<f4", hdr, sizeof hdr);
	size_t total = 10 + hlen + (size_t)numel * esize;
	unsigned char *b = xmalloc(total);
	memcpy(b, "\x93NUMPY\x01\x00", 8);
	b[8] = (unsigned char)(hlen & 0xff), b[9] = (unsigned char)(hlen >> 8);
	memcpy(b + 10, hdr, hlen);
	unsigned char *p = b + 10 + hlen;
	for (int64_t i = 0; i < numel; i++) {
		uint32_t u;
		memcpy(&u, (const char *)t->data + 4 * i, 4);
		if (!f64) {
			put_u32(p + 4 * i, u);
			continue;
		}
		double x = tensor_f32(t)[i];
		uint64_t w;
		memcpy(&w, &x, 8);
		put_u32(p + 8 * i, (uint32_t)w);
		put_u32(p + 8 * i + 4, (uint32_t)(w >> 32));
	}
	int rc = file_write_atomic(path, b, total);
	free(b);
	return rc;
}
