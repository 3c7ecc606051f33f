/* base.c: allocation hooks, arenas, diagnostics, atomic file writes, timing. */
#define _POSIX_C_SOURCE 200809L
#include "base.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- allocation ---- */

static long alloc_countdown = -1; /* tests only; single-threaded use */

void alloc_fail_after(long n) { alloc_countdown = n; }

static void (*on_failure)(size_t n);

void alloc_on_failure(void (*fn)(size_t n)) { on_failure = fn; }

static void *checked(void *p, size_t n)
{
	if (!p && n) {
		if (on_failure)
			on_failure(n);
		fprintf(stderr, "spmd: error: out of memory (%zu bytes)\n", n);
		abort();
	}
	return p;
}

static bool alloc_should_fail(void)
{
	if (alloc_countdown < 0)
		return false;
	return alloc_countdown-- == 0;
}

void *xmalloc(size_t n)
{
	return checked(alloc_should_fail() ? NULL : malloc(n ? n : 1), n ? n : 1);
}

void *xcalloc(size_t n, size_t size)
{
	if (size && n > SIZE_MAX / size)
		return checked(NULL, SIZE_MAX);
	return checked(alloc_should_fail() ? NULL : calloc(n ? n : 1, size ? size : 1), n * size + 1);
}

void *xrealloc(void *p, size_t n)
{
	return checked(alloc_should_fail() ? NULL : realloc(p, n ? n : 1), n ? n : 1);
}

char *xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	return memcpy(xmalloc(n), s, n);
}

/* ---- arenas ---- */

struct ArenaBlock {
	ArenaBlock *next;
	size_t size, used;
	_Alignas(16) unsigned char data[];
};

enum { ARENA_BLOCK = 64 * 1024 };

void arena_init(Arena *a) { a->head = NULL, a->used = 0; }

void *arena_alloc(Arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	ArenaBlock *b = a->head;
	if (!b || b->size - b->used < n) {
		size_t size = n > ARENA_BLOCK ? n : ARENA_BLOCK;
		b = xmalloc(sizeof *b + size);
		b->size = size, b->used = 0;
		b->next = a->head;
		a->head = b;
	}
	void *p = b->data + b->used;
	b->used += n;
	a->used += n;
	return memset(p, 0, n);
}

char *arena_strndup(Arena *a, const char *s, size_t n)
{
	char *p = arena_alloc(a, n + 1);
	memcpy(p, s, n);
	return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_vprintf(Arena *a, const char *fmt, va_list ap)
{
	char buf[1024];
	vsnprintf(buf, sizeof buf, fmt, ap);
	return arena_strdup(a, buf);
}

char *arena_printf(Arena *a, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s = arena_vprintf(a, fmt, ap);
	va_end(ap);
	return s;
}

void arena_free(Arena *a)
{
	for (ArenaBlock *b = a->head, *next; b; b = next) {
		next = b->next;
		free(b);
	}
	arena_init(a);
}

/* ---- diagnostics ---- */

void diag_init(Diag *d)
{
	memset(d, 0, sizeof *d);
	d->out = stderr;
}

/* Print line `line` of `file` and a caret under column `col`, if readable.
 * The file is read on from where the last message's line was (d->src_*)
 * when this one is no earlier in the same file: messages come in file
 * order, so a model with many errors is read once, not once a message. */
static void show_source(Diag *d, const char *file, int line, int col)
{
	FILE *f = fopen(file, "r");
	if (!f)
		return;
	char buf[4096];
	int n = 1;
	if (d->src_file[0] && !strcmp(d->src_file, file) && d->src_line <= line && fseek(f, d->src_off, SEEK_SET) == 0)
		n = d->src_line;
	while (n < line && fgets(buf, sizeof buf, f))
		if (strchr(buf, '\n'))
			n++;
	long at = ftell(f);
	if (n == line && at >= 0 && strlen(file) < sizeof d->src_file) { /* the line's start: the next message may read on from it */
		memcpy(d->src_file, file, strlen(file) + 1);
		d->src_line = line, d->src_off = at;
	}
	if (n == line && fgets(buf, sizeof buf, f)) {
		buf[strcspn(buf, "\r\n")] = 0;
		fprintf(d->out, "  %s\n  ", buf);
		for (int i = 1; i < col && buf[i - 1]; i++)
			fputc(buf[i - 1] == '\t' ? '\t' : ' ', d->out);
		fputs("^\n", d->out);
	}
	fclose(f);
}

void diag_verror(Diag *d, Pos p, const char *kind, const char *fmt, va_list ap)
{
	char msg[sizeof d->last];
	vsnprintf(msg, sizeof msg, fmt, ap);
	snprintf(d->last, sizeof d->last, "%s", msg);
	d->last_pos = p;
	if (d->quiet)
		return;
	if (p.file && p.line > 0)
		fprintf(d->out, "%s:%d:%d: %s: %s\n", p.file, p.line, p.col, kind, msg);
	else if (p.file)
		fprintf(d->out, "%s: %s: %s\n", p.file, kind, msg);
	else
		fprintf(d->out, "spmd: %s: %s\n", kind, msg);
	if (p.file && p.line > 0)
		show_source(d, p.file, p.line, p.col);
}

static void diag_error_at(Diag *d, Pos p, const char *kind, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	diag_verror(d, p, kind, fmt, ap);
	va_end(ap);
}

void diag_error(Diag *d, Pos p, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	d->nerr++;
	diag_verror(d, p, "error", fmt, ap);
	va_end(ap);
}

/* The shape of a message: a hash of its text with each run of digits
 * read as one '#' (layer numbers, places, byte counts). */
static uint64_t msg_shape(const char *m)
{
	uint64_t h = 14695981039346656037u;
	for (; *m; m++) {
		unsigned char c = (unsigned char)*m;
		if (c >= '0' && c <= '9') {
			while (m[1] >= '0' && m[1] <= '9')
				m++;
			c = '#';
		}
		h = (h ^ c) * 1099511628211u;
	}
	return h;
}

void diag_warn(Diag *d, Pos p, const char *fmt, ...)
{
	va_list ap;
	d->nwarn++;
	char msg[sizeof d->last];
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	uint64_t h = msg_shape(msg);
	int k = 0;
	while (k < d->nshape && d->shape[k] != h)
		k++;
	if (k == d->nshape && k < (int)(sizeof d->shape / sizeof d->shape[0]))
		d->shape[d->nshape] = h, d->shape_n[d->nshape++] = 0;
	int n = k < d->nshape ? ++d->shape_n[k] : 0; /* 0: the table is full, every one printed */
	if (n > DIAG_REPEATS + 1) {
		snprintf(d->last, sizeof d->last, "%s", msg), d->last_pos = p;
		return;
	}
	diag_error_at(d, p, "warning", "%s", msg);
	if (n == DIAG_REPEATS + 1 && !d->quiet)
		fprintf(d->out, "%s: note: more warnings like this one (the same but for numbers: other layers, "
		                "places, sizes) are not shown\n", p.file ? p.file : "spmd");
}

void diag_usage(Diag *d, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	d->nerr++;
	diag_verror(d, (Pos){0}, "error", fmt, ap);
	va_end(ap);
}

/* ---- hashing ---- */

static uint64_t hash_key[2];
static pthread_once_t hash_once = PTHREAD_ONCE_INIT;

/* The per-process key: the system's random bytes, or (no getrandom) the
 * clock, the process id and an address, which an input cannot predict. */
static void hash_seed(void)
{
	if (getrandom(hash_key, sizeof hash_key, GRND_NONBLOCK) == (ssize_t)sizeof hash_key)
		return;
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	hash_key[0] = (uint64_t)t.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)t.tv_sec;
	hash_key[1] = (uint64_t)getpid() * 0xc2b2ae3d27d4eb4full ^ (uint64_t)(uintptr_t)&t;
}

static uint64_t rotl(uint64_t x, int b) { return x << b | x >> (64 - b); }

static void sip_round(uint64_t v[4])
{
	v[0] += v[1], v[1] = rotl(v[1], 13), v[1] ^= v[0], v[0] = rotl(v[0], 32);
	v[2] += v[3], v[3] = rotl(v[3], 16), v[3] ^= v[2];
	v[0] += v[3], v[3] = rotl(v[3], 21), v[3] ^= v[0];
	v[2] += v[1], v[1] = rotl(v[1], 17), v[1] ^= v[2], v[2] = rotl(v[2], 32);
}

/* SipHash-1-3 of n bytes under the per-process key. */
uint64_t hash_bytes(const void *p, size_t n)
{
	pthread_once(&hash_once, hash_seed);
	const unsigned char *b = p;
	uint64_t v[4] = {hash_key[0] ^ 0x736f6d6570736575ull, hash_key[1] ^ 0x646f72616e646f6dull,
	                 hash_key[0] ^ 0x6c7967656e657261ull, hash_key[1] ^ 0x7465646279746573ull};
	uint64_t m;
	for (; n >= 8; n -= 8, b += 8) {
		memcpy(&m, b, 8);
		v[3] ^= m, sip_round(v), v[0] ^= m;
	}
	uint64_t last = (uint64_t)n << 56;
	for (size_t i = 0; i < n; i++)
		last |= (uint64_t)b[i] << (8 * i);
	v[3] ^= last, sip_round(v), v[0] ^= last;
	v[2] ^= 0xff;
	for (int r = 0; r < 3; r++)
		sip_round(v);
	return v[0] ^ v[1] ^ v[2] ^ v[3];
}

uint64_t hash_str(const char *s) { return hash_bytes(s, strlen(s)); }

/* ---- a string index ---- */

static size_t strindex_slot(const StrIndex *x, const char *key)
{
	size_t i = (size_t)hash_str(key) & (x->cap - 1);
	while (x->key[i] && strcmp(x->key[i], key) != 0)
		i = (i + 1) & (x->cap - 1);
	return i;
}

/* Room for n keys: at least 2n + 2 slots. */
static void strindex_room(StrIndex *x, size_t n)
{
	size_t cap = x->cap ? x->cap : 16;
	while (cap < 2 * n + 2)
		cap *= 2;
	if (cap == x->cap)
		return;
	StrIndex old = *x;
	x->cap = cap, x->key = xcalloc(cap, sizeof *x->key), x->val = xmalloc(cap * sizeof *x->val);
	for (size_t i = 0; i < old.cap; i++)
		if (old.key[i]) {
			size_t j = strindex_slot(x, old.key[i]);
			x->key[j] = old.key[i], x->val[j] = old.val[i];
		}
	free(old.key), free(old.val);
}

void strindex_init(StrIndex *x, size_t n)
{
	*x = (StrIndex){0};
	strindex_room(x, n);
}

int strindex_get(const StrIndex *x, const char *key)
{
	if (!x->cap)
		return -1;
	size_t i = strindex_slot(x, key);
	return x->key[i] ? x->val[i] : -1;
}

int strindex_put(StrIndex *x, const char *key, int val)
{
	strindex_room(x, x->n + 1);
	size_t i = strindex_slot(x, key);
	if (x->key[i])
		return x->val[i];
	x->key[i] = key, x->val[i] = val, x->n++;
	return val;
}

void strindex_free(StrIndex *x)
{
	free(x->key), free(x->val);
	*x = (StrIndex){0};
}

/* ---- files ---- */

int file_write_atomic(const char *path, const void *data, size_t n)
{
	size_t len = strlen(path) + 32;
	char *tmp = xmalloc(len);
	snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
	FILE *f = fopen(tmp, "wb");
	int rc = -1;
	if (f) {
		bool ok = fwrite(data, 1, n, f) == n;
		ok = (fclose(f) == 0) && ok;
		if (ok && rename(tmp, path) == 0)
			rc = 0;
		else {
			int e = errno;
			remove(tmp);
			errno = e;
		}
	}
	free(tmp);
	return rc;
}

int file_writable(const char *path)
{
	struct stat st;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		errno = EISDIR;
		return -1;
	}
	const char *slash = strrchr(path, '/');
	size_t len = slash ? (size_t)(slash - path) : 1;
	char *dir = xmalloc(len + 1);
	if (!slash)
		memcpy(dir, ".", 2);
	else if (slash == path)
		memcpy(dir, "/", 2);
	else
		memcpy(dir, path, len), dir[len] = 0;
	int rc = access(dir, W_OK | X_OK);
	free(dir);
	return rc;
}

char *file_read(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	struct stat st;
	if (fstat(fileno(f), &st) != 0 || S_ISDIR(st.st_mode)) {
		fclose(f);
		errno = S_ISDIR(st.st_mode) ? EISDIR : errno;
		return NULL;
	}
	size_t cap = 4096, len = 0;
	char *buf = xmalloc(cap + 1);
	size_t got;
	while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
		len += got;
		if (len == cap)
			buf = xrealloc(buf, (cap *= 2) + 1);
	}
	bool err = ferror(f);
	fclose(f);
	if (err) {
		free(buf);
		errno = EIO;
		return NULL;
	}
	buf[len] = 0;
	if (n)
		*n = len;
	return buf;
}

int dir_make(const char *path)
{
	char *p = xstrdup(path);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0777) != 0 && errno != EEXIST) {
			free(p);
			return -1;
		}
		*s = '/';
	}
	int rc = mkdir(p, 0777);
	struct stat st;
	if (rc != 0 && errno == EEXIST && stat(p, &st) == 0 && S_ISDIR(st.st_mode))
		rc = 0;
	else if (rc != 0 && errno == EEXIST)
		errno = ENOTDIR;
	free(p);
	return rc;
}

double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- parallel loops ---- */

int cpu_count(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > PARALLEL_MAX ? PARALLEL_MAX : (int)n;
}

typedef struct {
	void (*fn)(void *ctx, int i);
	void *ctx;
	int n;
	atomic_int next;
} ParFor;

static void *par_worker(void *arg)
{
	ParFor *p = arg;
	for (int i; (i = atomic_fetch_add(&p->next, 1)) < p->n;)
		p->fn(p->ctx, i);
	return NULL;
}

void parallel_for(int n, int jobs, void (*fn)(void *ctx, int i), void *ctx)
{
	ParFor p = {.fn = fn, .ctx = ctx, .n = n};
	atomic_init(&p.next, 0);
	if (alloc_countdown >= 0)
		jobs = 1; /* a test failing the Nth allocation counts them on one thread */
	jobs = jobs < 1 ? 1 : jobs > PARALLEL_MAX ? PARALLEL_MAX : jobs;
	if (jobs > n)
		jobs = n;
	pthread_t th[PARALLEL_MAX];
	int started = 0;
	/* a thread that cannot start leaves its share to the others */
	while (started < jobs - 1 && pthread_create(&th[started], NULL, par_worker, &p) == 0)
		started++;
	par_worker(&p);
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
}

/* ---- floating-point formats ---- */

static uint32_t float_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof u);
	return u;
}

static float bits_float(uint32_t u)
{
	float x;
	memcpy(&x, &u, sizeof x);
	return x;
}

/* Round to 8 significant bits, to nearest even; NaN stays a (quiet) NaN and
 * values past the largest bf16 become infinities. */
float round_bf16(float x)
{
	uint32_t u = float_bits(x);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return bits_float((u | 0x00400000u) & 0xffff0000u);
	u += 0x7fffu + ((u >> 16) & 1);
	return bits_float(u & 0xffff0000u);
}

/* Round to IEEE binary16, to nearest even: 11 significant bits down to
 * 2^-14, multiples of 2^-24 below (subnormals), infinity from 65520 up. */
float round_f16(float x)
{
	uint32_t u = float_bits(x);
	uint32_t mag = u & 0x7fffffffu, sign = u & 0x80000000u;
	if (mag >= 0x7f800000u)
		return x; /* inf and NaN */
	if (mag < 0x38800000u) { /* below 2^-14: round to a multiple of 2^-24 */
		float t = bits_float(mag) * 16777216.0f; /* exact: < 1024 */
		t = (t + 8388608.0f) - 8388608.0f;       /* to an integer, ties to even */
		return bits_float(sign | float_bits(t * (1.0f / 16777216.0f)));
	}
	mag += 0xfffu + ((mag >> 13) & 1);
	mag &= ~0x1fffu;
	if (mag > 0x477fe000u) /* past 65504 */
		mag = 0x7f800000u;
	return bits_float(sign | mag);
}

bool same_special(double a, double b)
{
	if (isfinite(a) || isfinite(b))
		return isfinite(a) && isfinite(b);
	return isnan(a) ? isnan(b) : a == b;
}
