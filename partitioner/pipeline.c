/* pipeline.c: the passes from a loaded model to its partitioned program, in order. */
#include "pipeline.h"

#include <string.h>

#include "../spmd/pipeline_section.h"
#include "../train/train.h"
#include "chunk.h"
#include "combine.h"
#include "order.h"
#include "partition.h"
#include "pipe_program.h"
#include "window.h"
#if SPMD_VERIFY_PARTITION
#include "verify.h"
#endif

/* Propagate; with a training step, shard the weight updates and propagate
 * again from the annotations the pass added.  share (or NULL): the factor
 * rules (as propagate_shared) and the first run to take or keep
 * (PassShare.first, keep_first). */
static int propagate_twice(Graph *g, const HwProfile *hw, const PassShare *share, Propagation *p, WusReport *wus,
                           Diag *d)
{
	WusReport local;
	if (!wus)
		wus = &local;
	memset(wus, 0, sizeof *wus);
	const FactorRules *rules = share ? share->rules : NULL;
	if (share && share->first) { /* the first run's result, remembered: the shardings it leaves, priorities consumed */
		memset(p, 0, sizeof *p);
		for (int v = 0; v < g->values.n; v++)
			g->values.a[v].spec = share->first[v], g->values.a[v].priority = 0;
	} else {
		int naxes = g->mesh.naxes;
		if (propagate_shared(g, hw, rules, p, d) != 0)
			return -1;
		if (share && share->keep_first) {
			*share->keep_first = NULL;
			if (g->mesh.naxes == naxes) { /* a cut mesh renames the axes: nothing kept */
				Spec *s = xmalloc(sizeof *s * ((size_t)g->values.n + 1));
				for (int v = 0; v < g->values.n; v++)
					s[v] = g->values.a[v].spec;
				*share->keep_first = s;
			}
		}
	}
	if (g->train && g->train->built) {
		if (wus_apply(g, hw, wus, d) != 0)
			return -1;
		propagation_free(p);
		if (propagate_shared(g, hw, rules, p, d) != 0)
			return -1;
		train_tie_specs(g);
	}
	return 0;
}

int pipeline_propagate(Graph *g, const HwProfile *hw, Propagation *p, WusReport *wus, Diag *d)
{
	return propagate_twice(g, hw, NULL, p, wus, d);
}

int pipeline_partition(Graph *g, const HwProfile *hw, Graph *prog, int **map, WusReport *wus, Diag *d)
{
	if (!g->pipeline)
		return pipeline_partition_replicated(g, hw, NULL, prog, map, wus, d);
	int rc = pipe_partition(g, hw, prog, map, wus, d);
#if SPMD_VERIFY_PARTITION /* test builds: the collectives of every device match (verify.h) */
	if (rc == 0 && verify_program(prog, d) != 0)
		rc = -1;
#endif
	return rc;
}

int pipeline_partition_replicated(Graph *g, const HwProfile *hw, const PassShare *share, Graph *prog, int **map,
                                  WusReport *wus, Diag *d)
{
	Propagation p;
	HwProfile def;
	if (!hw) /* the passes' default */
		hw_profile_builtin(&def, "tpu-v3"), hw = &def;
	graph_init(prog);
	if (map)
		*map = NULL;
	int rc = propagate_twice(g, hw, share, &p, wus, d);
	propagation_free(&p);
	if (rc != 0)
		return -1;
	int *m = xcalloc((size_t)g->values.n + 1, sizeof *m); /* sized now: the passes add values */
	rc = partition_shared(g, prog, m, hw, share, d);
	if (rc == 0 && g->train && g->train->built) /* a training program: its carries, in prog's ids */
		train_map(g, m, prog);
	CombineOpts co = {.group_bytes = g->train ? g->train->group_bytes : 0}; /* models: scalar all_reduces only */
	if (rc == 0)
		rc = combine_collectives(prog, &co, d);
	if (rc == 0) /* as the program written out reads back (spmd/emit.c) */
		graph_unshare_consts(prog);
	/* est: the estimate of prog as it is, once a pass made one (op NULL: none) */
	CostEstimate est;
	memset(&est, 0, sizeof est);
	/* gathers and scatters next to einsums overlapped with them, where faster */
	if (rc == 0)
		window_einsums(prog, g, m, hw, !(share && share->keep_order), &est, wus ? &wus->window : NULL);
	/* a training step's gradient reductions and updates into its backward pass, where faster */
	if (rc == 0 && g->train && g->train->built && !g->pipeline && !(share && share->keep_order))
		order_updates(prog, g, m, hw, &est, wus ? &wus->order : NULL);
	/* a long collective that holds back one needed sooner, in chunks, where faster (not on the search's proxies,
	 * as the step's order) */
	if (rc == 0 && !(share && share->keep_order))
		chunk_collectives(prog, g, m, hw, &est, wus ? &wus->chunk : NULL);
	if (share && share->priced && rc == 0)
		*share->priced = est;
	else if (est.op)
		cost_estimate_free(&est);
	if (map)
		*map = m;
	else
		free(m);
#if SPMD_VERIFY_PARTITION /* test builds: the collectives of every device match (verify.h) */
	if (rc == 0 && verify_program(prog, d) != 0)
		rc = -1;
#endif
	return rc;
}
