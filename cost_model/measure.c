/* measure.c: preparing a model's SPMD program for the cost model, and timing it on the thread backend. */
#include "cost.h"

#include <cblas.h>
#include <string.h>

#include "../partitioner/partition.h"
#include "../partitioner/pipeline.h"
#include "../runtime/data.h"
#include "../runtime/spmd_run.h"
#include "../spmd/load.h"
#include "../spmd/train.h"

int cost_prepare(const char *path, const char *mesh, int wus, Graph *model, Graph *prog, Diag *d)
{
	LoadKind kind = {0};
	graph_init(prog);
	if (program_load(model, path, &kind, d) != 0)
		return -1;
	if (kind.spmd) { /* already partitioned: estimate it as it is */
		Graph t = *model;
		*model = *prog, *prog = t;
		if (kind.device >= 0 || mesh) {
			diag_error(d, (Pos){path, 1, 1}, "expected a model or an SPMD program for every device%s, found %s",
			           mesh ? " (without --mesh)" : "", kind.device >= 0 ? "a per-device program" : "a program");
			return -1;
		}
		return 0;
	}
	if (mesh && graph_set_mesh(model, mesh, d) != 0)
		return -1;
	if (model->train && wus >= 0)
		model->train->wus = (WusMode)wus;
	if (model->train && train_build(model, d) != 0)
		return -1;
	graph_free(prog);
	return pipeline_partition(model, prog, NULL, NULL, d);
}

/* The id range of every i32 leaf of prog: that of the model's value of the
 * same name (programs keep the names of inputs and params). */
static int64_t *leaf_ranges(const Graph *model, const Graph *prog)
{
	int64_t *range = xcalloc((size_t)prog->values.n + 1, sizeof *range);
	for (int w = 0; w < prog->values.n; w++) {
		const Value *pv = &prog->values.a[w];
		int v = pv->producer < 0 && pv->dtype == DT_I32 ? graph_find(model, pv->name) : -1;
		range[w] = v >= 0 ? data_id_range(model, v) : 1000;
	}
	return range;
}

/* The device whose ops took longest in one run (the one that sets the step). */
static int critical_device(const double *all, int ndev, int nops, double *total)
{
	int worst = 0;
	*total = -1;
	for (int dev = 0; dev < ndev; dev++) {
		double s = 0;
		for (int i = 0; i < nops; i++)
			s += all[(size_t)dev * (size_t)nops + (size_t)i];
		if (s > *total)
			*total = s, worst = dev;
	}
	return worst;
}

int cost_measure(const Graph *model, const Graph *prog, int runs, double *sec, Diag *d)
{
	int nops = prog->ops.n, ndev = prog->mesh.ndev, rc = 0;
	double *all = xcalloc((size_t)ndev * (size_t)nops + 1, sizeof *all), best = -1;
	int64_t *range = leaf_ranges(model->values.n ? model : prog, prog);
	Tensor *outs = xcalloc((size_t)prog->outputs.n + 1, sizeof *outs);
	int blas = openblas_get_num_threads();
	openblas_set_num_threads(1); /* a device is one thread, as calibrate measures it */
	for (int r = 0; r < runs && rc == 0; r++) {
		SpmdOpts o = {.seed = 0, .id_range = range, .op_seconds = all};
		rc = spmd_run(prog, &o, outs, NULL, d);
		for (int i = 0; i < prog->outputs.n; i++)
			tensor_free(&outs[i]);
		double total;
		int dev = critical_device(all, ndev, nops, &total);
		if (rc == 0 && (best < 0 || total < best)) {
			best = total;
			memcpy(sec, all + (size_t)dev * (size_t)nops, sizeof *sec * (size_t)nops);
		}
	}
	openblas_set_num_threads(blas);
	free(all), free(range), free(outs);
	return rc;
}
