/* check.h: how --check judges a run against the reference (docs/partitioning.md, "How --check judges").
 *
 *   Tensor want, noise[CHECK_NOISE_RUNS];   // the reference, and the reference again with
 *                                           // ExecOpts.jitter = CHECK_JITTER, seeds 1..CHECK_NOISE_RUNS
 *   CheckItem c = {"w1", &got, &want, {&noise[0], &noise[1]}, &w1_before};
 *   if (!check_value(&c)) rc = 1;           // prints `check w1 error ... ok|MISMATCH`
 *
 * A correct partitioned program computes what the model computes, but sums
 * in another order: it differs from the reference by rounding noise, which
 * the computation may amplify (Adam's division by sqrt(v)+eps turns the noise
 * of a near-zero gradient into a full-size step).  The noise runs measure
 * that amplification for this very model, data and step count: each op's
 * result is perturbed by up to CHECK_JITTER units of roundoff of its dtype
 * (a sum of products also by that many at the scale of its terms'
 * magnitudes, where a reordered sum rounds), and the perturbation
 * propagates as a reordering's would.  The tolerance is a
 * multiple of the largest difference they show, plus a floor: a few f32
 * ulps, and one unit of roundoff of the least precise dtype of the model
 * (a partitioned program rounds partial results to it where the reference
 * rounds only the whole, a difference a scalar's noise runs may miss). */
#ifndef SPMD_CHECK_H
#define SPMD_CHECK_H

#include "../spmd/ir.h"
#include "../spmd/tensor.h"

#define CHECK_NOISE_RUNS 2
#define CHECK_JITTER 2 /* units of roundoff of each result's dtype (ExecOpts.jitter) */
/* Noise runs made only when NaN or inf differ from the reference at an
 * element the first CHECK_NOISE_RUNS do not explain (check_specials_unexplained):
 * whether rounding alone can decide them (a sqrt of a value that is zero up
 * to rounding is NaN or not by the noise's sign).  An element that is such a
 * coin toss goes unexplained by all of them with odds 2^-16.  (And on a
 * near miss: CHECK_NEAR_MISS.) */
#define CHECK_MORE_RUNS 14
#define CHECK_MAX_RUNS (CHECK_NOISE_RUNS + CHECK_MORE_RUNS)
/* An output off by more than its tolerance but at most CHECK_NEAR_MISS
 * times it (check_near_miss) may be the first runs' sampling of noise a
 * deep training step amplifies chaotically: the CHECK_MORE_RUNS are made
 * then too, and every tolerance is measured over all the runs made.  (The
 * faulty programs of tests/test_check.c are off by 3.7 times or more.) */
#define CHECK_NEAR_MISS 2

typedef struct {
	const char *name;
	const Tensor *got;   /* the run checked */
	const Tensor *want;  /* the reference's */
	const Tensor *noise[CHECK_MAX_RUNS]; /* the reference's noise runs (NULL: none) */
	const Tensor *init;  /* the value before the first step (a param): judged by
	                      * the change the steps made; NULL: by its size */
	const double *allow; /* per element, an error allowed on top of the
	                      * tolerance (an undetermined Adam step), or NULL */
	double roundoff;     /* the unit roundoff of the least precise float dtype
	                      * the value may depend on (check_roundoff) */
} CheckItem;

/* The unit roundoff of the least precise float dtype among g's values:
 * 2^-24 (f32), 2^-11 (f16) or 2^-8 (bf16). */
double check_roundoff(const Graph *g);

/* The tolerance of c and the worst error (beyond c->allow), into *tol,
 * *err; returns the number of elements where got and want are not the same
 * special value (NaN, +inf, -inf) while one of them is, leaving out the
 * elements where a noise run already disagrees with want in that way (its
 * special value is rounding's choice there); *at: the element of the worst
 * error. */
int64_t check_measure(const CheckItem *c, double *err, double *tol, int64_t *at);

/* Print `check NAME error E tolerance T (...) ok|MISMATCH` for c; true when
 * the error is within the tolerance and the special values agree. */
bool check_value(const CheckItem *c);

/* Output i of g (a model): got[i] against the reference ref[i] and its
 * noise runs noise[r][i], r < nruns; printed, true when it agrees. */
bool check_output(const Graph *g, int i, const Tensor *got, const Tensor *ref, Tensor *const *noise, int nruns);

/* Whether some output of g has NaN or inf in got where ref has another
 * value, or the reverse, at an element none of the nruns noise runs
 * explains; the caller then makes runs nruns..CHECK_MAX_RUNS-1 and judges
 * with all of them. */
bool check_specials_unexplained(const Graph *g, const Tensor *got, const Tensor *ref, Tensor *const *noise,
                                int nruns);

/* Whether some output of g differs from ref by more than its tolerance
 * over the nruns noise runs and at most CHECK_NEAR_MISS times it (and has
 * no special value unexplained). */
bool check_near_miss(const Graph *g, const Tensor *got, const Tensor *ref, Tensor *const *noise, int nruns);

/* --check's noise runs of the reference: run(ctx, noise[k], k + 1) for the
 * first CHECK_NOISE_RUNS, then the rest up to CHECK_MAX_RUNS when
 * check_specials_unexplained or check_near_miss (with a note on stderr);
 * *nruns gets how many were made.  0, or the first failing run's status. */
typedef int (*CheckRunFn)(void *ctx, Tensor *outs, int noise);
int check_noise_runs(const Graph *g, const Tensor *got, const Tensor *ref, Tensor *const *noise, CheckRunFn run,
                     void *ctx, int *nruns);

/* The exit status of a run that returned rc: 0; 1 when the replicas of an
 * output differ (SPMD_RUN_DISAGREE: the program is wrong, as a failed
 * check); else 2. */
int check_run_status(int rc);

/* ---- training (check_train.c) ---- */

/* Make every param's gradient, as its replicas reduce it (TrainParam.reduced),
 * an output of g's training step too, after the loss, params and state, so
 * that --check compares gradients: Adam and LAMB ignore a gradient's scale,
 * so the params alone cannot show a gradient summed twice. */
void check_train_outputs(Graph *g);

/* Compare every output of a training step, got against the reference ref
 * and its noise runs noise[r], r < nruns (each g->outputs.n tensors): the loss, each
 * param by the change from its value before the first step (given[v] when
 * the user gave it, v < ngiven, else made from seed), the optimizer state
 * and the gradients, after `steps` steps.  0, or 1 on a mismatch. */
int check_train(const Graph *g, const Tensor *given, int ngiven, uint64_t seed, int steps, const Tensor *got,
                const Tensor *ref, Tensor *const *noise, int nruns);

#endif
