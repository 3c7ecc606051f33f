/* test_hash.c: the string index every table of names is (base.h), and
 * names crafted to collide in the tables' former unseeded hashes (FNV-1a,
 * 64-bit for value names, 32-bit for mapping keys) load within 5x the CPU
 * time of ordinary names of the same length (docs/testing.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>
#include <time.h>

#include "../spmd/load.h"

enum { NNAMES = 8192, STAGES = 13, BLOCK = 3, BITS = 16, NAMELEN = STAGES * BLOCK + 2 }; /* "v", the blocks, NUL */

typedef struct {
	uint64_t basis, prime;
} Fnv;

static const Fnv FNV64 = {14695981039346656037u, 1099511628211u};
static const Fnv FNV32 = {2166136261u, 16777619u};

/* FNV-1a of n bytes from state h, in the low BITS bits (which depend only on
 * the low bits before: multiplication and xor carry upward only). */
static uint64_t fnv(const Fnv *f, uint64_t h, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * f->prime;
	return h & ((1u << BITS) - 1);
}

static void block_of(int k, char *b)
{
	for (int i = 0; i < BLOCK; i++, k /= 26)
		b[i] = (char)('a' + k % 26);
}

/* Joux's multicollision: per stage, two 3-letter blocks that take the low
 * bits of the state to the same value; any choice of one block per stage then
 * gives the same low bits, so 2^STAGES names all land in one slot. */
static void colliding_names(const Fnv *f, char (*names)[NAMELEN])
{
	static int seen[1u << BITS];
	char pair[STAGES][2][BLOCK];
	uint64_t h = fnv(f, f->basis, "v", 1);
	for (int s = 0; s < STAGES; s++) {
		memset(seen, -1, sizeof seen);
		bool found = false;
		for (int k = 0; k < 26 * 26 * 26 && !found; k++) {
			char b[BLOCK];
			block_of(k, b);
			uint64_t x = fnv(f, h, b, BLOCK);
			if (seen[x] < 0) {
				seen[x] = k;
				continue;
			}
			block_of(seen[x], pair[s][0]);
			memcpy(pair[s][1], b, BLOCK);
			h = x, found = true;
		}
		assert_true(found);
	}
	for (int i = 0; i < NNAMES; i++) {
		names[i][0] = 'v';
		for (int s = 0; s < STAGES; s++)
			memcpy(names[i] + 1 + s * BLOCK, pair[s][(i >> s) & 1], BLOCK);
		names[i][NAMELEN - 1] = 0;
	}
}

/* Ordinary names of the same length. */
static void ordinary_names(char (*names)[NAMELEN])
{
	uint64_t r = 88172645463325252u;
	for (int i = 0; i < NNAMES; i++) {
		names[i][0] = 'v';
		for (int j = 1; j < NAMELEN - 1; j++) {
			r ^= r << 13, r ^= r >> 7, r ^= r << 17;
			names[i][j] = (char)('a' + r % 26);
		}
		names[i][NAMELEN - 1] = 0;
	}
}

/* A model whose ops (a chain of negations) define and use the names, or
 * whose params mapping has them as keys. */
static char *model_text(char (*names)[NAMELEN], bool as_keys)
{
	size_t cap = (size_t)NNAMES * (2 * NAMELEN + 64) + 256, len = 0;
	char *t = malloc(cap);
	len += (size_t)snprintf(t + len, cap - len, "name: h\nmesh: {d: 1}\ninputs:\n  x: {shape: [2], dtype: f32}\n");
	if (as_keys) {
		len += (size_t)snprintf(t + len, cap - len, "params:\n");
		for (int i = 0; i < NNAMES; i++)
			len += (size_t)snprintf(t + len, cap - len, "  %s: {shape: [2]}\n", names[i]);
		len += (size_t)snprintf(t + len, cap - len, "ops:\n  - {out: y, op: neg, in: [x]}\noutputs: [y]\n");
		return t;
	}
	len += (size_t)snprintf(t + len, cap - len, "ops:\n");
	for (int i = 0; i < NNAMES; i++)
		len += (size_t)snprintf(t + len, cap - len, "  - {out: %s, op: neg, in: [%s]}\n", names[i],
		                        i ? names[i - 1] : "x");
	snprintf(t + len, cap - len, "outputs: [%s]\n", names[NNAMES - 1]);
	return t;
}

/* The least CPU time of three loads of text (the least is the least noisy). */
static double load_time(const char *text)
{
	double best = 1e30;
	for (int r = 0; r < 3; r++) {
		Graph g;
		Diag d;
		diag_init(&d);
		clock_t t0 = clock();
		int rc = model_load_string(&g, text, "h.yaml", &d);
		double t = (double)(clock() - t0) / CLOCKS_PER_SEC;
		if (rc != 0)
			fail_msg("the model did not load: %s", d.last);
		graph_free(&g);
		best = t < best ? t : best;
	}
	return best;
}

static void check_linear(const Fnv *f, bool as_keys)
{
	static char bad[NNAMES][NAMELEN], good[NNAMES][NAMELEN];
	colliding_names(f, bad);
	ordinary_names(good);
	uint64_t h0 = fnv(f, f->basis, bad[0], NAMELEN - 1);
	for (int i = 1; i < NNAMES; i++) /* the attack is real: one slot for all */
		assert_true(fnv(f, f->basis, bad[i], NAMELEN - 1) == h0 && strcmp(bad[i], bad[0]) != 0);
	char *tb = model_text(bad, as_keys), *tg = model_text(good, as_keys);
	double tbad = load_time(tb), tgood = load_time(tg);
	print_message("%s: colliding %.4f s, ordinary %.4f s\n", as_keys ? "mapping keys" : "value names", tbad, tgood);
	assert_true(tbad <= 5 * tgood + 0.01);
	free(tb), free(tg);
}

static void test_value_names(void **state) { check_linear(&FNV64, false); }

static void test_mapping_keys(void **state) { check_linear(&FNV32, true); }

static void test_hash_is_keyed(void **state)
{
	/* Equal input, equal hash; one byte apart (or one length apart), different. */
	assert_true(hash_str("weight") == hash_bytes("weight", 6));
	assert_true(hash_str("weight") != hash_str("weighu"));
	assert_true(hash_bytes("\0\0\0\0\0\0\0\0", 8) != hash_bytes("\0\0\0\0\0\0\0", 7));
}

/* The string index: the first value put stays, every key is found as put
 * through the growths, an absent key is -1, a zeroed index is empty. */
static void test_strindex(void **state)
{
	enum { N = 5000 };
	static char key[N][16], other[16];
	StrIndex x = {0};
	assert_int_equal(strindex_get(&x, "w"), -1);
	for (int i = 0; i < N; i++) {
		snprintf(key[i], sizeof key[i], "l%d.w", i);
		assert_int_equal(strindex_put(&x, key[i], i), i);
	}
	assert_int_equal((int)x.n, N);
	for (int i = 0; i < N; i++) {
		snprintf(other, sizeof other, "l%d.w", i); /* an equal string, not the key's pointer */
		assert_int_equal(strindex_get(&x, other), i);
		assert_int_equal(strindex_put(&x, other, -7), i);
	}
	assert_int_equal((int)x.n, N);
	assert_int_equal(strindex_get(&x, "l5000.w"), -1);
	assert_int_equal(strindex_get(&x, ""), -1);
	assert_true(x.cap > 2 * x.n && (x.cap & (x.cap - 1)) == 0);
	strindex_free(&x);
	assert_int_equal(strindex_get(&x, key[0]), -1);
	strindex_init(&x, 100);
	size_t cap = x.cap;
	for (int i = 0; i < 100; i++)
		strindex_put(&x, key[i], i);
	assert_true(x.cap == cap); /* room as asked: no growth */
	strindex_free(&x);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hash_is_keyed),
		cmocka_unit_test(test_strindex),
		cmocka_unit_test(test_value_names),
		cmocka_unit_test(test_mapping_keys),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
