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

/* a and b are the same special value (NaN, +inf or -inf), or both finite. */
static bool same_special(double a, double b)
{
	if (isfinite(a) || isfinite(b))
		return isfinite(a) && isfinite(b);
	return isnan(a) ? isnan(b) : a == b;
}

/* The largest difference between want and the noise runs, over the
 * elements finite in both. */
static double noise_of(const CheckItem *c, int64_t n)
{
	double noise = 0;
	for (int r = 0; r < CHECK_NOISE_RUNS; r++)
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

int64_t check_measure(const CheckItem *c, double *err, double *tol, int64_t *at)
{
	int64_t n = shape_numel(&c->want->shape), special = 0;
	*err = 0, *at = 0;
	for (int64_t i = 0; i < n; i++) {
		double a = elem(c->want, i), b = elem(c->got, i);
		if (!same_special(a, b)) {
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

bool check_output(const Graph *g, int i, const Tensor *got, const Tensor *ref, const Tensor *noise)
{
	CheckItem c = {g->values.a[g->outputs.a[i]].name, &got[i], &ref[i], {NULL}, NULL, NULL, check_roundoff(g)};
	for (int r = 0; r < CHECK_NOISE_RUNS; r++)
		c.noise[r] = &noise[r * g->outputs.n + i];
	return check_value(&c);
}

int check_run_status(int rc)
{
	return rc == 0 ? 0 : rc == SPMD_RUN_DISAGREE ? 1 : 2;
}
