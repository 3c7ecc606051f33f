/* progress.h: the progress bar of long commands, on stderr when it is a terminal, nothing otherwise.
 *
 *   Progress p;
 *   progress_begin(&p, "explore", nplans, "plans"); // total units (0: unknown)
 *   for (int i = 0; i < nplans; i++) {
 *           try_plan(...);
 *           progress_set(&p, i + 1);
 *   }
 *   progress_end(&p);                                // erases the bar
 *
 * The bar appears only once the command has run PROGRESS_DELAY seconds,
 * so short runs print nothing, and redraws at most every PROGRESS_EVERY
 * seconds.  A command that prints lines on stdout while the bar shows
 * calls progress_clear first (the next progress_set draws it again).
 * Nothing is drawn when stderr is not a terminal, or when SPMD_PROGRESS=0.
 * Commands that use it: explore, calibrate, run --steps (docs/pictures.md,
 * "Progress"). */
#ifndef SPMD_PROGRESS_H
#define SPMD_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define PROGRESS_DELAY 2.0
#define PROGRESS_EVERY 0.1

typedef struct {
	const char *label, *unit;
	int64_t total, done;
	FILE *out;          /* NULL: draw nothing */
	double t0, delay, last;
	bool shown;         /* a bar is on the line now */
} Progress;

/* Start a bar of `total` units (0: a count without a bar) called label. */
void progress_begin(Progress *p, const char *label, int64_t total, const char *unit);
/* The same onto out (any stream, terminal or not) after `delay` seconds:
 * for tests, which pass a memory stream and 0. */
void progress_begin_on(Progress *p, const char *label, int64_t total, const char *unit, FILE *out, double delay);
/* done units so far; redraws when it is time. */
void progress_set(Progress *p, int64_t done);
/* Erase the bar from the line (when it shows). */
void progress_clear(Progress *p);
/* Erase the bar; p is finished. */
void progress_end(Progress *p);
/* The bar's text for done of total after `elapsed` seconds, without the
 * leading carriage return: "explore [=====>    ] 12/40 plans, 3 s left". */
void progress_format(const Progress *p, double elapsed, char *buf, size_t n);

#endif
