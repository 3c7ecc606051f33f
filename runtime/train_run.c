/* train_run.c: K steps of a training step graph (reference) or program (threads), carrying params and state. */
#include "train_run.h"

#include <string.h>

#include "exec.h"
#include "threads.h"

/* Move each carried value's tensor to its leaf. */
static void carry(const StepOpts *s, Tensor *vals)
{
	for (int i = 0; i < s->ncarry; i++) {
		tensor_free(&vals[s->to[i]]);
		vals[s->to[i]] = vals[s->from[i]];
		vals[s->from[i]] = (Tensor){0};
	}
}

/* The graph's outputs, copied (the originals may be carried away). */
static void copy_outputs(const Graph *g, const Tensor *vals, Tensor *outputs)
{
	for (int i = 0; i < g->outputs.n; i++) {
		const Tensor *t = &vals[g->outputs.a[i]];
		tensor_free(&outputs[i]);
		tensor_alloc(&outputs[i], t->dtype, &t->shape);
		memcpy(outputs[i].data, t->data, 4 * (size_t)shape_numel(&t->shape));
	}
}

int train_run_ref(const Graph *g, Tensor *vals, uint64_t seed, const StepOpts *s, Tensor *outputs, Diag *d)
{
	ExecOpts o = {.seed = seed, .jitter = s->jitter};
	for (int step = 0; step < s->steps; step++) {
		o.jitter_seed = s->jitter_seed + 0x9e3779b97f4a7c15ull * (uint64_t)step;
		if (exec_run(g, vals, NULL, &o, d) != 0)
			return -1;
		copy_outputs(g, vals, outputs);
		if (s->on_step)
			s->on_step(s->arg, step, outputs);
		carry(s, vals);
	}
	return 0;
}

/* ---- threads ---- */

typedef struct {
	const Graph *prog;
	const SpmdOpts *o;
	Tensor **vals;  /* per device */
	Diag *diag;     /* per device, quiet */
	bool made;      /* the leaves exist (every step after the first) */
	ExecStats *stats; /* per device, the last step's */
} Steps;

static int step_device(int device, void *arg, Backend *b)
{
	Steps *r = arg;
	const Graph *g = r->prog;
	Tensor *vals = r->vals[device];
	Diag *d = &r->diag[device];
	bool *used = r->made ? NULL : exec_used_on(g, graph_stage_coord(g, device));
	int rc = 0;
	for (int v = 0; v < g->values.n && !r->made && rc == 0; v++)
		if (g->values.a[v].producer < 0 && (!used || used[v]))
			rc = spmd_make_leaf(g, r->o, device, v, &vals[v], d);
	free(used);
	if (rc != 0)
		return -1;
	ExecOpts eo = {.seed = r->o->seed, .backend = b, .device = device, .stats = &r->stats[device]};
	return exec_run(g, vals, NULL, &eo, d) == 0 ? 0 : -1;
}

typedef struct {
	Steps *r;
	int v;
} Fetch;

static const Tensor *fetch(void *arg, int device)
{
	Fetch *f = arg;
	return &f->r->vals[device][f->v];
}

/* Report the first device that failed (not one that only saw another abort). */
static void report(const Steps *r, Diag *d)
{
	for (int dev = 0; dev < r->prog->mesh.ndev; dev++)
		if (r->diag[dev].nerr && !strstr(r->diag[dev].last, "aborted")) {
			diag_error(d, r->diag[dev].last_pos, "device %d: %s", dev, r->diag[dev].last);
			return;
		}
	diag_error(d, (Pos){r->prog->file, 0, 0}, "the run on threads failed");
}

/* One step on every device, then the outputs gathered.  0 or -1. */
static int one_step(Steps *r, Tensor *outputs, Diag *d)
{
	const Graph *g = r->prog;
	for (int dev = 0; dev < g->mesh.ndev; dev++) {
		diag_init(&r->diag[dev]);
		r->diag[dev].quiet = true;
	}
	int rc = threads_run(&g->mesh, step_device, r);
	r->made = true;
	if (rc != 0) {
		report(r, d);
		return -1;
	}
	for (int i = 0; i < g->outputs.n && rc == 0; i++) {
		tensor_free(&outputs[i]);
		rc = spmd_gather_value(g, g->outputs.a[i], fetch, &(Fetch){r, g->outputs.a[i]}, &outputs[i], d);
	}
	return rc;
}

int train_run_threads(const Graph *prog, const SpmdOpts *o, const StepOpts *s, Tensor *outputs, Diag *d)
{
	int ndev = prog->mesh.ndev, rc = 0;
	Steps r = {prog, o, xcalloc((size_t)ndev, sizeof(Tensor *)), xcalloc((size_t)ndev, sizeof(Diag)), false,
	           xcalloc((size_t)ndev, sizeof(ExecStats))};
	for (int dev = 0; dev < ndev; dev++)
		r.vals[dev] = xcalloc((size_t)prog->values.n + 1, sizeof(Tensor));
	for (int step = 0; step < s->steps && rc == 0; step++) {
		rc = one_step(&r, outputs, d);
		if (rc == 0 && s->on_step)
			s->on_step(s->arg, step, outputs);
		for (int dev = 0; dev < ndev && rc == 0; dev++)
			carry(s, r.vals[dev]);
	}
	for (int dev = 0; dev < ndev; dev++) {
		if (s->mem)
			s->mem[dev] = (DeviceMemory){spmd_persistent_bytes(prog), r.stats[dev].peak};
		exec_free_values(prog, r.vals[dev]);
		free(r.vals[dev]);
	}
	free(r.vals), free(r.diag), free(r.stats);
	return rc;
}
