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
static CheckItem item(const Graph *g, int i, const Tensor *got, const Tensor *ref,
                      Tensor *const noise[CHECK_NOISE_RUNS])
{
	CheckItem c = {output_name(g, i), &got[i], &ref[i], {NULL}, NULL, NULL, check_roundoff(g)};
	for (int r = 0; r < CHECK_NOISE_RUNS; r++)
		c.noise[r] = &noise[r][i];
	return c;
}

/* Adam, AdamW, LAMB: per element of param tp, the error its updates may
 * have without a fault (NULL for other optimizers).  Where the reference's
 * first moment m is within m's own tolerance of 0, the gradient is rounding
 * noise and the sign of m / (sqrt(v) + eps) is undetermined: each step may
 * move the element by up to 2 lr (Adam), or lr max(2, ||w||) with LAMB's
 * trust ratio, either way. */
static double *adam_allowance(const Graph *g, const TrainParam *tp, int steps, const Tensor *got, const Tensor *ref,
                              Tensor *const noise[CHECK_NOISE_RUNS])
{
	const Train *t = g->train;
	int j = t->opt == OPT_ADAM || t->opt == OPT_ADAMW || t->opt == OPT_LAMB ? output_of(g, tp->next_state[0]) : -1;
	int k = output_of(g, tp->next);
	if (j < 0 || k < 0)
		return NULL;
	CheckItem m = item(g, j, got, ref, noise);
	double err, tol, norm = 0;
	int64_t at, n = shape_numel(&ref[j].shape);
	check_measure(&m, &err, &tol, &at);
	for (int64_t e = 0; e < n; e++)
		norm += (double)tensor_f32(&ref[k])[e] * tensor_f32(&ref[k])[e];
	double step = t->lr * (t->opt == OPT_LAMB && sqrt(norm) > 2 ? sqrt(norm) : 2);
	double *allow = xcalloc((size_t)n + 1, sizeof *allow);
	for (int64_t e = 0; e < n; e++)
		allow[e] = fabs(tensor_f32(&ref[j])[e]) <= tol ? steps * step : 0;
	return allow;
}

int check_train(const Graph *g, const Tensor *given, int ngiven, uint64_t seed, int steps, const Tensor *got,
                const Tensor *ref, Tensor *const noise[CHECK_NOISE_RUNS])
{
	const Train *t = g->train;
	int rc = 0;
	for (int i = 0; i < g->outputs.n; i++) {
		Tensor before = {0};
		CheckItem c = item(g, i, got, ref, noise);
		if (i >= 1 && i <= t->nparams) {
			param_before(g, t->params[i - 1].param, given, ngiven, seed, &before);
			c.init = &before;
			c.allow = adam_allowance(g, &t->params[i - 1], steps, got, ref, noise);
		}
		if (!check_value(&c))
			rc = 1;
		tensor_free(&before);
		free((double *)c.allow);
	}
	return rc;
}
