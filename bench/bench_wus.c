/* bench_wus.c: weight-update sharding off against on, per device: the update's time, the
 * optimizer state bytes and the bytes collectives send.
 *
 *   bench_wus [MODEL.yaml [MESH [REPS]]]    (default: examples/train_transformer.yaml data=8,model=1 5)
 *
 * The update's time is the time of the program ops made for the optimizer's
 * ops (Op.src_op in TrainParam's update ranges), measured on the thread
 * backend (the mean over devices, the best of REPS runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cost_model/cost.h"
#include "../partitioner/pipeline.h"
#include "../runtime/spmd_run.h"
#include "../sharding_spec/reshard.h"
#include "../spmd/load.h"
#include "../spmd/ops.h"
#include "../train/train.h"

typedef struct {
	double update_s;   /* the optimizer's ops, seconds per device */
	int64_t state;     /* optimizer state bytes per device */
	int64_t sent;      /* bytes each device sends in collectives */
	int nupdate_ops;
} Figures;

/* Is model op i part of some param's update? */
static bool in_update(const Train *t, int i)
{
	for (int p = 0; p < t->nparams; p++)
		if (i >= t->params[p].first_op && i < t->params[p].first_op + t->params[p].nops)
			return true;
	return false;
}

static int64_t sent_bytes(const Graph *prog)
{
	int64_t total = 0;
	for (int i = 0; i < prog->ops.n; i++) {
		const Op *op = &prog->ops.a[i];
		if (!(op_table[op->kind].flags & OPF_COLLECTIVE))
			continue;
		const Value *in = &prog->values.a[op->in[0]];
		int64_t n = 1, bytes = shape_numel(&in->shape) * dtype_size(in->dtype);
		for (int k = 0; k < op->attr->ncax; k++)
			n *= prog->mesh.size[op->attr->cax[k]];
		total += reshard_bytes_sent(op_reshard_kind(op->kind), bytes, n);
	}
	return total;
}

/* Build, partition and time one variant; 0 or -1. */
static int measure(const char *path, const char *mesh, WusMode mode, int reps, Figures *f)
{
	Graph g, prog;
	Diag d;
	diag_init(&d);
	int *map = NULL, rc = -1;
	memset(f, 0, sizeof *f);
	if (model_load(&g, path, &d) != 0 || graph_set_mesh(&g, mesh, &d) != 0 || !g.train || train_build(&g, &d) != 0)
		goto out;
	g.train->wus = mode;
	if (pipeline_partition(&g, NULL, &prog, &map, NULL, &d) != 0)
		goto out_prog;
	int ndev = prog.mesh.ndev;
	double *sec = xcalloc((size_t)ndev * (size_t)prog.ops.n + 1, sizeof *sec);
	Tensor *outs = xcalloc((size_t)prog.outputs.n + 1, sizeof *outs);
	f->update_s = 1e30;
	Tensor *given;
	int64_t *range;
	spmd_leaf_opts(&g, &prog, map, NULL, 0, &given, &range);
	for (int r = 0; r < reps; r++) {
		SpmdOpts o = {.seed = 1, .op_seconds = sec, .id_range = range};
		if (spmd_run(&prog, &o, outs, NULL, &d) != 0)
			goto out_run;
		double t = 0;
		for (int dev = 0; dev < ndev; dev++)
			for (int i = 0; i < prog.ops.n; i++)
				if (prog.ops.a[i].src_op >= 0 && in_update(g.train, prog.ops.a[i].src_op))
					t += sec[(size_t)dev * (size_t)prog.ops.n + (size_t)i] / ndev;
		f->update_s = t < f->update_s ? t : f->update_s;
		for (int i = 0; i < prog.outputs.n; i++)
			tensor_free(&outs[i]);
	}
	for (int i = 0; i < prog.ops.n; i++)
		f->nupdate_ops += prog.ops.a[i].src_op >= 0 && in_update(g.train, prog.ops.a[i].src_op);
	f->state = spmd_state_bytes(&prog);
	f->sent = sent_bytes(&prog);
	rc = 0;
out_run:
	free(sec), free(outs), free(given), free(range);
out_prog:
	graph_free(&prog);
out:
	free(map);
	graph_free(&g);
	return rc;
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "examples/train_transformer.yaml";
	const char *mesh = argc > 2 ? argv[2] : "data=8,model=1";
	int reps = argc > 3 ? atoi(argv[3]) : 5;
	Figures off, on;
	if (measure(path, mesh, WUS_OFF, reps, &off) != 0 || measure(path, mesh, WUS_ON, reps, &on) != 0)
		return 2;
	printf("weight-update sharding on %s, mesh %s, best of %d runs; per device:\n\n", path, mesh, reps);
	printf("%-26s %14s %14s %10s\n", "", "off", "on", "on / off");
	printf("%-26s %14.3g %14.3g %10.3f\n", "update time (s)", off.update_s, on.update_s, on.update_s / off.update_s);
	printf("%-26s %14lld %14lld %10.3f\n", "optimizer state (bytes)", (long long)off.state, (long long)on.state,
	       (double)on.state / (double)off.state);
	printf("%-26s %14lld %14lld %10.3f\n", "collective bytes sent", (long long)off.sent, (long long)on.sent,
	       (double)on.sent / (double)off.sent);
	printf("%-26s %14d %14d\n", "update ops in the program", off.nupdate_ops, on.nupdate_ops);
	return 0;
}
