/* base.h: arenas, source positions, diagnostics and small helpers shared by every module. */
#ifndef SPMD_BASE_H
#define SPMD_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { MAX_RANK = 8 };

/* A place in a source file; line and col are 1-based, 0 means "unknown". */
typedef struct {
	const char *file;
	int line, col;
} Pos;

/* ---- allocation ----
 * Every allocation goes through xmalloc/xrealloc so that tests can make the Nth
 * one fail (alloc_fail_after).  Out of memory calls the handler the program
 * installed (the spmd command's reports the error and exits 2), else aborts:
 * there is nothing useful a partitioner can do without memory. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
void alloc_fail_after(long n); /* tests: fail allocation number n (-1: never) */
/* What to do when an allocation of n bytes fails: fn must not return. */
void alloc_on_failure(void (*fn)(size_t n));

/* ---- arenas ----
 * One arena per lifetime (a graph, a pass's scratch); freed with one call. */
typedef struct ArenaBlock ArenaBlock;
typedef struct {
	ArenaBlock *head;
	size_t used; /* bytes handed out, for reports */
} Arena;

void arena_init(Arena *a);
void *arena_alloc(Arena *a, size_t n);           /* zeroed, 16-byte aligned */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
/* A formatted string in the arena (at most 1023 characters, cut beyond). */
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *arena_vprintf(Arena *a, const char *fmt, va_list ap);
void arena_free(Arena *a);

/* ---- diagnostics ----
 * Errors accumulate in a Diag; library code never exits.  An error prints
 *   FILE:LINE:COL: error: MESSAGE
 * followed by the source line and a caret under the column when the file can
 * be read.  Messages follow "expected X, found Y". */
typedef struct {
	FILE *out;   /* where messages go (stderr by default) */
	int nerr;
	int nwarn;
	bool quiet;  /* count, but print nothing (tests) */
	bool terse;  /* the caller reads no explanations: passes may leave them out (partition's reasons) */
	char last[512]; /* text of the last message, for tests */
	Pos last_pos;   /* its position (a backend repeats a device's error at the op's place) */
	/* warnings by shape (their text with each run of digits as one '#'):
	 * DIAG_REPEATS of a shape are printed, then a note, then none; a model's
	 * layers repeat one warning as often as it has layers */
	int nshape;
	uint64_t shape[64];
	int shape_n[64];
	/* where the last source line shown starts (show_source reads on from
	 * there): a copy of the file's name ("" none), its line and offset */
	char src_file[256];
	int src_line;
	long src_off;
} Diag;

enum { DIAG_REPEATS = 3 };

void diag_init(Diag *d);
void diag_error(Diag *d, Pos p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_warn(Diag *d, Pos p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_verror(Diag *d, Pos p, const char *kind, const char *fmt, va_list ap);
/* An error with no position (command-line usage): "spmd: error: ..." */
void diag_usage(Diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- dynamic arrays of plain values ---- */
#define VEC(T) struct { T *a; int n, cap; }
#define vec_push(v, x)                                                         \
	do {                                                                   \
		if ((v)->n == (v)->cap) {                                      \
			(v)->cap = (v)->cap ? 2 * (v)->cap : 16;               \
			(v)->a = xrealloc((v)->a, (size_t)(v)->cap * sizeof *(v)->a); \
		}                                                              \
		(v)->a[(v)->n++] = (x);                                        \
	} while (0)
#define vec_free(v) (free((v)->a), (v)->a = NULL, (v)->n = (v)->cap = 0)
/* Room for at least m elements without moving (a pass that knows how much it adds). */
#define vec_reserve(v, m)                                                      \
	do {                                                                   \
		if ((v)->cap < (m)) {                                          \
			(v)->cap = (m);                                        \
			(v)->a = xrealloc((v)->a, (size_t)(v)->cap * sizeof *(v)->a); \
		}                                                              \
	} while (0)

/* ---- hashing ----
 * Every hash table of names and keys (model values, mapping keys, reshard
 * plans, collective groups) hashes with SipHash-1-3 under a key drawn once
 * per process from the system's random source, so no input can be crafted
 * to make the tables collide (docs/testing.md).  Not stable across runs:
 * nothing may depend on the order of a table's slots. */
uint64_t hash_bytes(const void *p, size_t n);
uint64_t hash_str(const char *s);

/* ---- a string index ----
 * Strings to ints by open addressing (hash_str): the first value put
 * under a string stays.  Keys are not copied: each must outlive the
 * index.  A zeroed StrIndex is empty and ready. */
typedef struct {
	const char **key; /* NULL: an empty slot */
	int *val;
	size_t cap, n; /* cap: 0 or a power of two above 2n */
} StrIndex;

void strindex_init(StrIndex *x, size_t n); /* empty, with room for n keys */
int strindex_get(const StrIndex *x, const char *key); /* its value, or -1 when absent */
int strindex_put(StrIndex *x, const char *key, int val); /* the value key has: val when it had none */
void strindex_free(StrIndex *x);

/* ---- files ----
 * Write a whole file atomically: to NAME.tmp.PID, then rename over NAME.
 * Returns 0, or -1 with errno set. */
int file_write_atomic(const char *path, const void *data, size_t n);
/* Could file_write_atomic(path) write there: path is no directory and the
 * directory to hold it exists and takes new files?  0, or -1 with errno
 * set.  Commands that work long before they write check it first. */
int file_writable(const char *path);
/* Read a whole file; NULL with errno set on failure.  *n gets its size. */
char *file_read(const char *path, size_t *n);
/* mkdir -p; 0 or -1 */
int dir_make(const char *path);

/* Timing for benchmarks and --profile: seconds from a monotonic clock. */
double now_seconds(void);

/* ---- parallel loops ----
 * parallel_for calls fn(ctx, i) once for every i in [0, n), on up to jobs
 * threads (the caller's among them), in no set order; it returns when all
 * are done.  fn must touch only what item i owns.  cpu_count: the
 * processors online (1 to PARALLEL_MAX). */
enum { PARALLEL_MAX = 64 };
int cpu_count(void);
void parallel_for(int n, int jobs, void (*fn)(void *ctx, int i), void *ctx);

/* ---- floating-point formats ----
 * Round a float to bf16 (8 significant bits) or IEEE binary16, to nearest
 * even; the result is a float holding the rounded value. */
float round_bf16(float x);
float round_f16(float x);

/* a and b are the same special value (NaN, +inf or -inf), or both finite:
 * how results are compared where only the special values must agree. */
bool same_special(double a, double b);

#endif
