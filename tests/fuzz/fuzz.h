/* fuzz.h: what the libFuzzer harnesses of tests/fuzz/ share (docs/testing.md).
 * Every harness takes untrusted bytes through one entry point of spmd; an
 * error report is a fine outcome, a crash, a sanitizer report, a hang or a
 * broken invariant (trapped here) is a finding. */
#ifndef SPMD_FUZZ_H
#define SPMD_FUZZ_H
#include <stddef.h>
#include <stdint.h>

#include "../../base/base.h"

/* The input as a NUL-terminated string (freed by the caller). */
char *fuzz_text(const uint8_t *data, size_t size);
/* A quiet Diag: errors are counted, not printed. */
void fuzz_diag(Diag *d);
/* A file path private to this process under $TMPDIR, for harnesses whose
 * entry point reads a file: name is the file's base name. */
const char *fuzz_path(const char *name);
/* Write data to path (whole); traps if it cannot. */
void fuzz_write(const char *path, const void *data, size_t size);
/* Stop the run: a finding (abort, so that libFuzzer saves the input). */
#define FUZZ_FINDING(...) (fprintf(stderr, "finding: " __VA_ARGS__), fputc('\n', stderr), abort())

/* The generating harnesses (fuzz_diff, fuzz_train): the input's bytes as
 * choices, and the text of the model they build. */
typedef struct {
	const uint8_t *p;
	size_t n;
} FuzzBytes;
/* The next choice in [0, k); zeros once the input is used up. */
int fuzz_pick(FuzzBytes *b, int k);
typedef struct {
	char *t;
	size_t len, cap;
} FuzzText;
/* ", sharding: [...]" of a tensor of rank 1 or 2 on mesh axes a and b:
 * each dim null, a, b or [a, b], no axis twice. */
void fuzz_sharding(FuzzBytes *b, int rank, char *out, size_t n);
/* Append to t; a finding when it is full. */
void fuzz_put(FuzzText *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A small model with a train: section, from the bytes (a static buffer;
 * fuzz_train's, which its header describes). */
const char *fuzz_train_model(FuzzBytes *b);
/* Its train: section (the loss is `loss`): optimizer, weight-update
 * sharding, all_gather, prefetch, group_bytes, clipping. */
void fuzz_train_section(FuzzBytes *b, FuzzText *m);
/* A param's own training keys: ", weight_update_sharding: ...", ", all_gather: ...", or none. */
void fuzz_param_keys(FuzzBytes *b, char *out, size_t n);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#endif
