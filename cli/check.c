/* check.c: --check's comparison of a run with the reference, within the rounding noise the reference itself shows. */
#include "check.h"

#include <math.h>
#include <stdio.h>

#include "../runtime/spmd_run.h"

#define U32 0x1p-24 /* the unit roundoff of f32 */
#define NOISE_FACTOR 4 /* the tolerance: 4 times the noise runs' largest difference ... */
#define FLOOR_ULPS 64  /* ... plus 64 f32 ulps of the value's scale */

static double elem(const Tensor *t, int64_t i)
{
	return t->dtype == DT_I32 ? tensor_i32(t)[i] : tensor_f32(t)[i];
}

/* The unit roundoff of dtype (f64 and i32: f32's). */
static double unit_roundoff(DType dt)
{
	return dt == DT_BF16 ? 0x1p-8 : dt == DT_F16 ? 0x1p-11 : U32;
}

double check_roundoff(const Graph *g)
{
	double u = U32;
	for (int v = 0; v < g->values.n; v++)
		if (unit_roundoff(g->values.a[v].dtype) > u)
			u = unit_roundoff(g->values.a[v].dtype);
	return u;
}

/* The largest difference between want and the noise runs made (the
 * first CHECK_NOISE_RUNS, or all CHECK_MAX_RUNS after a near miss or
 * unexplained special values), over the elements finite in both. */
static double noise_of(const CheckItem *c, int64_t n)
{
	double noise = 0;
	for (int r = 0; r < CHECK_MAX_RUNS; r++)
		for (int64_t i = 0; c->noise[r] && i < n; i++) {
			double e = fabs(elem(c->want, i) - elem(c->noise[r], i));
			if (isfinite(e) && e > noise)
				noise = e;
		}
	return noise;
}

/* The tolerance: NOISE_FACTOR times the noise, plus FLOOR_ULPS f32 ulps of
 * the change the steps made (init) or of the value's size, plus one unit of
 * roundoff of the least precise dtype (c->roundoff, or the value's own) at
 * the value's largest magnitude; 0 for integers. */
static double tolerance(const CheckItem *c, int64_t n)
{
	if (c->want->dtype == DT_I32)
		return 0;
	double change = 0, size = 0;
	for (int64_t i = 0; i < n; i++) {
		double a = elem(c->want, i), d = c->init ? fabs(a - elem(c->init, i)) : fabs(a);
		if (isfinite(d) && d > change)
			change = d;
		if (isfinite(a) && fabs(a) > size)
			size = fabs(a);
	}
	double u = unit_roundoff(c->want->dtype) > c->roundoff ? unit_roundoff(c->want->dtype) : c->roundoff;
	return NOISE_FACTOR * noise_of(c, n) + FLOOR_ULPS * U32 * change + u * size;
}

/* Element i is special (NaN or inf) in the reference or finite in it by
 * chance: a noise run disagrees with the reference there (sqrt or log of a
 * value within rounding of 0, the sum of a layer_norm's outputs, say). */
static bool undetermined(const CheckItem *c, int64_t i)
{
	for (int r = 0; r < CHECK_MAX_RUNS; r++)
		if (c->noise[r] && !same_special(elem(c->want, i), elem(c->noise[r], i)))
			return true;
	return false;
}

int64_t check_measure(const CheckItem *c, double *err, double *tol, int64_t *at)
{
	int64_t n = shape_numel(&c->want->shape), special = 0;
	*err = 0, *at = 0;
	for (int64_t i = 0; i < n; i++) {
		double a = elem(c->want, i), b = elem(c->got, i);
		if (!same_special(a, b) && !undetermined(c, i)) {
			if (special++ == 0)
				*err = INFINITY, *at = i;
		} else if (isfinite(a) && fabs(a - b) - (c->allow ? c->allow[i] : 0) > *err) {
			*err = fabs(a - b) - (c->allow ? c->allow[i] : 0), *at = i;
		}
	}
	*tol = tolerance(c, n);
	return special;
}

bool check_value(const CheckItem *c)
{
	double err, tol;
	int64_t at, special = check_measure(c, &err, &tol, &at);
	bool ok = special == 0 && err <= tol;
	printf("check %-16s error %-10.3g tolerance %-10.3g (at element %lld", c->name, err, tol, (long long)at);
	if (special)
		printf("; %lld NaN or inf where the reference has none or another", (long long)special);
	printf(")  %s\n", ok ? "ok" : "MISMATCH");
	return ok;
}

/* Output i's item: got[i] against ref[i] and noise[r][i], r < nruns. */
static CheckItem output_item(const Graph *g, int i, const Tensor *got, const Tensor *ref, Tensor *const *noise,
                             int nruns)
{
	CheckItem c = {g->values.a[g->outputs.a[i]].name, &got[i], &ref[i], {NULL}, NULL, NULL, check_roundoff(g)};
	for (int r = 0; r < nruns && r < CHECK_MAX_RUNS; r++)
		c.noise[r] = &noise[r][i];
	return c;
}

bool check_output(const Graph *g, int i, const Tensor *got, const Tensor *ref, Tensor *const *noise, int nruns)
{
	CheckItem c = output_item(g, i, got, ref, noise, nruns);
	return check_value(&c);
}

/* Output i of g measured (check_measure) when got and ref are alike in
 * size and dtype: its special values unexplained, else -1. */
static int64_t measure_output(const Graph *g, int i, const Tensor *got, const Tensor *ref, Tensor *const *noise,
                              int nruns, double *err, double *tol)
{
	if (shape_numel(&got[i].shape) != shape_numel(&ref[i].shape) || got[i].dtype != ref[i].dtype)
		return -1;
	CheckItem c = output_item(g, i, got, ref, noise, nruns);
	int64_t at;
	return check_measure(&c, err, tol, &at);
}

bool check_specials_unexplained(const Graph *g, const Tensor *got, const Tensor *ref, Tensor *const *noise,
                                int nruns)
{
	double err, tol;
	for (int i = 0; i < g->outputs.n; i++)
		if (measure_output(g, i, got, ref, noise, nruns, &err, &tol) > 0)
			return true;
	return false;
}

bool check_near_miss(const Graph *g, const Tensor *got, const Tensor *ref, Tensor *const *noise, int nruns)
{
	double err, tol;
	for (int i = 0; i < g->outputs.n; i++)
		if (measure_output(g, i, got, ref, noise, nruns, &err, &tol) == 0 && err > tol && err <= CHECK_NEAR_MISS * tol)
			return true;
	return false;
}

int check_run_status(int rc)
{
	return rc == 0 ? 0 : rc == SPMD_RUN_DISAGREE ? 1 : 2;
}

int check_noise_runs(const Graph *g, const Tensor *got, const Tensor *ref, Tensor *const *noise, CheckRunFn run,
                     void *ctx, int *nruns)
{
	int rc = 0;
	*nruns = 0;
	for (int k = 0; k < CHECK_NOISE_RUNS && rc == 0; k++)
		if ((rc = run(ctx, noise[k], k + 1)) == 0)
			*nruns = k + 1;
	if (rc != 0)
		return rc;
	if (check_specials_unexplained(g, got, ref, noise, *nruns))
		fprintf(stderr, "check: NaN or inf differ from the reference where the noise runs do not explain it; "
		        "%d more noise runs say whether rounding decides them\n", CHECK_MORE_RUNS);
	else if (check_near_miss(g, got, ref, noise, *nruns))
		fprintf(stderr, "check: an output is off by more than its tolerance, at most %d times it; %d more noise "
		        "runs measure the noise again\n", CHECK_NEAR_MISS, CHECK_MORE_RUNS);
	else
		return rc;
	for (int k = CHECK_NOISE_RUNS; k < CHECK_MAX_RUNS && rc == 0; k++)
		if ((rc = run(ctx, noise[k], k + 1)) == 0)
			*nruns = k + 1;
	return rc;
}
