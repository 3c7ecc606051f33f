/* check_train.c: --check of training steps: the loss, the params by their change, the optimizer state, the gradients. */
#include "check.h"

#include <math.h>
#include <string.h>

#include "../spmd/train_section.h"
#include "../runtime/data.h"

void check_train_outputs(Graph *g)
{
	const Train *t = g->train;
	for (int i = 0; i < t->nparams; i++)
		vec_push(&g->outputs, t->params[i].reduced);
}

/* Param v before the first step: the user's tensor, or made from seed as the reference makes it. */
static void param_before(const Graph *g, int v, const Tensor *given, int ngiven, uint64_t seed, Tensor *t)
{
	const Value *val = &g->values.a[v];
	if (v < ngiven && given[v].data) {
		tensor_alloc(t, given[v].dtype, &given[v].shape);
		memcpy(t->data, given[v].data, 4 * (size_t)shape_numel(&given[v].shape));
		return;
	}
	tensor_alloc(t, val->dtype, &val->shape);
	data_fill(t, val, &val->shape, NULL, seed, 1000);
}

/* Output i's name: the param or state it is carried to, else the value's own. */
static const char *output_name(const Graph *g, int i)
{
	const Train *t = g->train;
	int v = g->outputs.a[i];
	for (int k = 0; k < t->ncarry; k++)
		if (t->carry_from[k] == v)
			return g->values.a[t->carry_to[k]].name;
	return g->values.a[v].name;
}

/* The output index of value v in g, or -1. */
static int output_of(const Graph *g, int v)
{
	for (int i = 0; i < g->outputs.n; i++)
		if (g->outputs.a[i] == v)
			return i;
	return -1;
}

/* Output i's CheckItem against the reference and its noise runs. */
static CheckItem item(const Graph *g, int i, const Tensor *got, const Tensor *ref, Tensor *const *noise, int nruns)
{
	CheckItem c = {output_name(g, i), &got[i], &ref[i], {NULL}, NULL, NULL, check_roundoff(g)};
	for (int r = 0; r < nruns && r < CHECK_MAX_RUNS; r++)
		c.noise[r] = &noise[r][i];
	return c;
}

/* The tolerance of output j (check_measure's). */
static double tolerance_of(const Graph *g, int j, const Tensor *got, const Tensor *ref, Tensor *const *noise)
{
	CheckItem c = item(g, j, got, ref, noise, CHECK_NOISE_RUNS);
	double err, tol;
	int64_t at;
	check_measure(&c, &err, &tol, &at);
	return tol;
}

/* Adam, AdamW, LAMB: per element of param tp, the error its updates may
 * have without a fault (NULL for other optimizers).  The direction
 * m^/(sqrt(v^)+eps) (bias-corrected moments after `steps` steps) moves by
 * about dm^/(s+eps) + |m^| dv^/(2 s (s+eps)^2), s = sqrt(v^), when m and v
 * move by their own tolerances dm, dv: large where the gradient is near
 * rounding noise.  Each step moves the element by lr times that, at most
 * 2 lr (LAMB: times max(1, ||w||) for the trust ratio), either way. */
static double *adam_allowance(const Graph *g, const TrainParam *tp, int steps, const Tensor *got, const Tensor *ref,
                              Tensor *const *noise)
{
	const Train *t = g->train;
	bool adam = t->opt == OPT_ADAM || t->opt == OPT_ADAMW || t->opt == OPT_LAMB;
	int jm = adam ? output_of(g, tp->next_state[0]) : -1, jv = adam ? output_of(g, tp->next_state[1]) : -1;
	int k = output_of(g, tp->next);
	if (jm < 0 || jv < 0 || k < 0)
		return NULL;
	double bm = 1 - pow(t->beta1, steps), bv = 1 - pow(t->beta2, steps), norm = 0;
	double dm = tolerance_of(g, jm, got, ref, noise) / bm, dv = tolerance_of(g, jv, got, ref, noise) / bv;
	int64_t n = shape_numel(&ref[jm].shape);
	for (int64_t e = 0; e < n; e++)
		norm += (double)tensor_f32(&ref[k])[e] * tensor_f32(&ref[k])[e];
	double lr = t->lr * (t->opt == OPT_LAMB && sqrt(norm) > 1 ? sqrt(norm) : 1);
	double *allow = xcalloc((size_t)n + 1, sizeof *allow);
	for (int64_t e = 0; e < n; e++) {
		double m = fabs(tensor_f32(&ref[jm])[e]) / bm, s = sqrt(fabs(tensor_f32(&ref[jv])[e]) / bv);
		double moved = s > 0 ? dm / (s + t->eps) + m * dv / (2 * s * (s + t->eps) * (s + t->eps)) : 2;
		allow[e] = steps * lr * (moved < 2 && isfinite(moved) ? moved : 2);
	}
	return allow;
}

/* Momentum, Adam's m and v (state i of param tp): per element, the error
 * the state may have when the gradients it sums are off by no more than
 * the gradient's own tolerance dg (the last step's, for every step).  A
 * moment s_k = beta s_(k-1) + coef x_k is linear in x, so it may be off by
 * coef (1 - beta^k) / (1 - beta) times x's error: dg for momentum and m,
 * 2 |g| dg + dg^2 for v (x = g^2), |g| the larger of the last gradient and
 * the root of v's bias-corrected mean.  Without it a moment is held to
 * the rounding of its own noise runs, which can be smaller than what a
 * gradient within its tolerance carries into it (NULL: not a moment). */
static double *moment_allowance(const Graph *g, const TrainParam *tp, int i, int steps, const Tensor *got,
                                const Tensor *ref, Tensor *const *noise)
{
	const Train *t = g->train;
	bool adam = t->opt == OPT_ADAM || t->opt == OPT_ADAMW || t->opt == OPT_LAMB;
	if (t->opt != OPT_MOMENTUM && !adam)
		return NULL;
	int js = output_of(g, tp->next_state[i]), jg = output_of(g, tp->reduced);
	int jv = adam ? output_of(g, tp->next_state[1]) : -1;
	if (js < 0 || jg < 0 || (adam && jv < 0))
		return NULL;
	double beta = i == 0 ? t->beta1 : t->beta2, coef = t->opt == OPT_MOMENTUM ? 1 : 1 - beta;
	double sum = coef * (1 - pow(beta, steps)) / (1 - beta), dg = tolerance_of(g, jg, got, ref, noise);
	int64_t n = shape_numel(&ref[js].shape);
	if (shape_numel(&ref[jg].shape) != n)
		return NULL;
	double *allow = xcalloc((size_t)n + 1, sizeof *allow);
	for (int64_t e = 0; e < n; e++) {
		double x = dg;
		if (i == 1) {
			double last = fabs(tensor_f32(&ref[jg])[e]), rms = sqrt(fabs(tensor_f32(&ref[jv])[e]) / (1 - pow(beta, steps)));
			x = 2 * fmax(last, rms) * dg + dg * dg;
		}
		allow[e] = isfinite(x) ? sum * x : 0;
	}
	return allow;
}

int check_train(const Graph *g, const Tensor *given, int ngiven, uint64_t seed, int steps, const Tensor *got,
                const Tensor *ref, Tensor *const *noise, int nruns)
{
	const Train *t = g->train;
	int rc = 0;
	int *owner = xmalloc(sizeof(int) * ((size_t)g->values.n + 1)); /* per state value: 2 param + its index, or -1 */
	for (int v = 0; v < g->values.n; v++)
		owner[v] = -1;
	for (int p = 0; p < t->nparams; p++)
		for (int k = 0; k < t->params[p].nstate && k < 2; k++)
			owner[t->params[p].next_state[k]] = 2 * p + k;
	for (int i = 0; i < g->outputs.n; i++) {
		Tensor before = {0};
		CheckItem c = item(g, i, got, ref, noise, nruns);
		if (i >= 1 && i <= t->nparams) {
			param_before(g, t->params[i - 1].param, given, ngiven, seed, &before);
			c.init = &before;
			c.allow = adam_allowance(g, &t->params[i - 1], steps, got, ref, noise);
		}
		int sv = g->outputs.a[i], p = i > t->nparams ? owner[sv] : -1;
		if (p >= 0)
			c.allow = moment_allowance(g, &t->params[p / 2], p % 2, steps, got, ref, noise);
		if (!check_value(&c))
			rc = 1;
		tensor_free(&before);
		free((double *)c.allow);
	}
	free(owner);
	return rc;
}
