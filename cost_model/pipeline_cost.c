/* pipeline_cost.c: the pipeline schedule as a list schedule, and its price.
 *
 * Schedules.  Device d holds stages d, d + p, ..., d + (V-1) p (V = 1 but
 * for interleaving).  GPipe runs every microbatch's forward, then every
 * backward.  1F1B runs p - d - 1 forwards (warm-up), then one forward and
 * one backward in turn, then the remaining backwards: a device holds at most
 * p - d microbatches' activations.  Interleaved 1F1B (Narayanan et al.,
 * "Efficient Large-Scale Language Model Training on GPU Clusters", 2021)
 * takes the microbatches in groups of p, each group through chunk 0 of
 * every device, then chunk 1, ...; its warm-up is 2 (p - d - 1) + (V - 1) p
 * forwards, and backwards go through the chunks in reverse.
 *
 * Simulation.  Each device runs its steps in that order, one at a time.  A
 * step starts when its device is free and its input is there: a forward
 * needs the previous stage's forward of the same microbatch, sent over the
 * stage axis; a backward the next stage's backward (the last stage: its own
 * forward).  A send starts when its step ends and its sender's link is free
 * and occupies the link, not the device: compute overlaps it.  Devices are
 * swept in turn, each running as many of its steps as have their inputs,
 * until all ran; the built-in orders always finish, an order that waits on
 * itself is reported. */
#include "pipeline_cost.h"

#include <string.h>

double pipe_bubble_formula(int p, int V, int m) { return (double)(p - 1) / ((double)V * m + p - 1); }

/* Interleaved: the k-th forward (or backward) of a device, as microbatch and chunk. */
static PipeTask interleaved_step(const PipeSimIn *in, int d, int k, bool bwd)
{
	int group = k / (in->p * in->V), r = k % (in->p * in->V), c = r / in->p;
	if (bwd)
		c = in->V - 1 - c;
	return (PipeTask){.mb = group * in->p + r % in->p, .stage = c * in->p + d, .bwd = bwd};
}

/* The k-th forward or backward of device d. */
static PipeTask nth_step(const PipeSimIn *in, int d, int k, bool bwd)
{
	if (in->schedule == PIPE_INTERLEAVED)
		return interleaved_step(in, d, k, bwd);
	return (PipeTask){.mb = k, .stage = d, .bwd = bwd};
}

/* Forwards a device runs before its first backward. */
static int warmup(const PipeSimIn *in, int d)
{
	int n = in->m * in->V, w = n;
	if (in->forward_only) /* nothing to interleave the forwards with */
		return n;
	if (in->schedule == PIPE_1F1B)
		w = in->p - d - 1;
	else if (in->schedule == PIPE_INTERLEAVED)
		w = 2 * (in->p - d - 1) + (in->V - 1) * in->p;
	return w < n ? w : n;
}

void pipe_order(const PipeSimIn *in, int d, PipeTask *order)
{
	int n = in->m * in->V, w = warmup(in, d), k = 0, f = 0, b = 0;
	while (f < w)
		order[k++] = nth_step(in, d, f++, false);
	while (f < n) {
		order[k++] = nth_step(in, d, f++, false);
		order[k++] = nth_step(in, d, b++, true);
	}
	while (b < n)
		order[k++] = nth_step(in, d, b++, true);
}

typedef struct {
	const PipeSimIn *in;
	PipeSim *out;
	int nv;
	double *fdone, *bdone; /* per microbatch and stage: when its forward (backward) ended, -1: not yet */
	double *farr, *barr;   /* when its activations reached the next stage (its gradient the previous) */
	double *link;          /* per device: when its link is free */
	double *clock;         /* per device: when it is free */
	int *next;             /* per device: its next step */
	int *held;             /* per device: microbatch-stages it holds */
	double *bytes;         /* per device: activation bytes it holds */
} Sim;

static double at(const double *a, const Sim *S, int mb, int v) { return a[(size_t)mb * (size_t)S->nv + (size_t)v]; }

/* When step t's input is there, or -1 when it is not yet made. */
static double input_ready(const Sim *S, const PipeTask *t)
{
	if (!t->bwd)
		return t->stage == 0 ? 0 : at(S->fdone, S, t->mb, t->stage - 1) < 0 ? -1 : at(S->farr, S, t->mb, t->stage - 1);
	if (at(S->fdone, S, t->mb, t->stage) < 0)
		return -1;
	if (t->stage == S->nv - 1)
		return at(S->fdone, S, t->mb, t->stage);
	return at(S->bdone, S, t->mb, t->stage + 1) < 0 ? -1 : at(S->barr, S, t->mb, t->stage + 1);
}

/* Run step t on device d from `ready`; send its result on d's link. */
static void run_step(Sim *S, int d, PipeTask *t, double ready)
{
	const PipeSimIn *in = S->in;
	double dur = t->bwd ? in->bwd[t->stage] : in->fwd[t->stage];
	t->start = ready > S->clock[d] ? ready : S->clock[d];
	t->end = S->clock[d] = t->start + dur;
	size_t k = (size_t)t->mb * (size_t)S->nv + (size_t)t->stage;
	int to = t->bwd ? t->stage - 1 : t->stage + 1; /* the stage its result goes to */
	bool away = to >= 0 && to < S->nv && to % in->p != d; /* consecutive chunks of one device: no send */
	double c = away && in->send && !(t->bwd && in->forward_only) ? in->send[t->bwd ? to : t->stage] : 0;
	double go = t->end > S->link[d] ? t->end : S->link[d];
	if (c > 0)
		S->link[d] = go + c;
	if (c > 0 && in->sync_sends) /* the sender waits in the send until the value is across */
		S->clock[d] = go + c;
	(t->bwd ? S->bdone : S->fdone)[k] = t->end;
	(t->bwd ? S->barr : S->farr)[k] = c > 0 ? go + c : t->end;
	double a = in->act ? in->act[t->stage] : 0;
	S->held[d] += t->bwd ? -1 : 1;
	S->bytes[d] += t->bwd ? -a : a;
	if (S->held[d] > S->out->in_flight[d])
		S->out->in_flight[d] = S->held[d];
	if (S->bytes[d] > S->out->act_peak[d])
		S->out->act_peak[d] = S->bytes[d];
	S->out->busy[d] += dur;
	if (t->end > S->out->makespan)
		S->out->makespan = t->end;
}

/* Run every step of device d whose input is there; whether any ran. */
static bool sweep(Sim *S, int d)
{
	bool ran = false;
	while (S->next[d] < S->out->ntask[d]) {
		PipeTask *t = &S->out->task[d][S->next[d]];
		double ready = input_ready(S, t);
		if (ready < 0)
			break;
		run_step(S, d, t, ready);
		S->next[d]++, ran = true;
	}
	return ran;
}

static void sim_alloc(Sim *S, const PipeSimIn *in, PipeSim *out)
{
	int p = in->p, n = in->m * in->V;
	size_t cells = (size_t)in->m * (size_t)S->nv + 1;
	memset(out, 0, sizeof *out);
	out->p = p;
	out->ntask = xcalloc((size_t)p, sizeof *out->ntask);
	out->task = xcalloc((size_t)p, sizeof *out->task);
	out->busy = xcalloc((size_t)p, sizeof *out->busy);
	out->in_flight = xcalloc((size_t)p, sizeof *out->in_flight);
	out->act_peak = xcalloc((size_t)p, sizeof *out->act_peak);
	for (int d = 0; d < p; d++) {
		out->ntask[d] = 2 * n;
		out->task[d] = xcalloc((size_t)(2 * n), sizeof *out->task[d]);
		pipe_order(in, d, out->task[d]);
	}
	double *cell = xmalloc(4 * cells * sizeof *cell);
	for (size_t i = 0; i < 4 * cells; i++)
		cell[i] = -1;
	S->fdone = cell, S->bdone = cell + cells, S->farr = cell + 2 * cells, S->barr = cell + 3 * cells;
	S->link = xcalloc((size_t)p, sizeof *S->link);
	S->clock = xcalloc((size_t)p, sizeof *S->clock);
	S->bytes = xcalloc((size_t)p, sizeof *S->bytes);
	S->next = xcalloc((size_t)p, sizeof *S->next);
	S->held = xcalloc((size_t)p, sizeof *S->held);
}

static void sim_free(Sim *S)
{
	free(S->fdone), free(S->link), free(S->clock), free(S->bytes), free(S->next), free(S->held);
}

int pipe_simulate(const PipeSimIn *in, PipeSim *out)
{
	Sim S = {.in = in, .out = out, .nv = in->p * in->V};
	sim_alloc(&S, in, out);
	bool ran = true;
	while (ran) {
		ran = false;
		for (int d = 0; d < in->p; d++)
			ran |= sweep(&S, d);
	}
	int rc = 0;
	double busy = 0;
	for (int d = 0; d < in->p; d++) {
		rc |= S.next[d] < out->ntask[d] ? -1 : 0;
		busy += out->busy[d];
	}
	out->bubble_fraction = out->makespan > 0 ? 1 - busy / (in->p * out->makespan) : 0;
	sim_free(&S);
	return rc;
}

void pipe_sim_free(PipeSim *s)
{
	for (int d = 0; s->task && d < s->p; d++)
		free(s->task[d]);
	free(s->task), free(s->ntask), free(s->busy), free(s->in_flight), free(s->act_peak);
	memset(s, 0, sizeof *s);
}
