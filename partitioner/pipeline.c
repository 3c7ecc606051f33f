/* pipeline.c: the passes from a loaded model to its partitioned program, in order. */
#include "pipeline.h"

#include <string.h>

#include "../spmd/pipeline_section.h"
#include "../train/train.h"
#include "combine.h"
#include "partition.h"
#include "pipe_program.h"
#if SPMD_VERIFY_PARTITION
#include "verify.h"
#endif

/* Per op of g before a pass that adds ops and moves them (wus_apply), its
 * kind and result, to find it again afterwards (op_map). */
typedef struct {
	int out;
	OpKind kind;
} OpMark;

/* The op marked m, now: the producer of its result, or — when the pass
 * renamed the result (split_next: `next = copy(w%shard)`) — the producer
 * of that copy's operand. */
static int op_now(const Graph *g, OpMark m)
{
	int op = g->values.a[m.out].producer;
	if (op >= 0 && g->ops.a[op].kind != m.kind && g->ops.a[op].kind == OP_COPY)
		op = g->values.a[g->ops.a[op].in[0]].producer;
	return op >= 0 && g->ops.a[op].kind == m.kind ? op : -1;
}

/* Propagate; with a training step, shard the weight updates and propagate
 * again, continued from the first run (propagate_seeded): the added
 * annotations spread through the updates, and the forward and backward
 * passes keep the first run's shardings.  rules: as propagate_shared. */
static int propagate_twice(Graph *g, const HwProfile *hw, const FactorRules *rules, Propagation *p, WusReport *wus,
                           Diag *d)
{
	WusReport local;
	if (!wus)
		wus = &local;
	memset(wus, 0, sizeof *wus);
	if (propagate_shared(g, hw, rules, p, d) != 0)
		return -1;
	if (!g->train || !g->train->built)
		return 0;
	int nv = g->values.n, nops = g->ops.n;
	Spec *spec = xmalloc(sizeof *spec * ((size_t)nv + 1));
	OpMark *mark = xmalloc(sizeof *mark * ((size_t)nops + 1));
	for (int v = 0; v < nv; v++)
		spec[v] = g->values.a[v].spec;
	for (int i = 0; i < nops; i++)
		mark[i] = (OpMark){g->ops.a[i].out, g->ops.a[i].kind};
	int rc = wus_apply(g, hw, wus, d);
	if (rc == 0) {
		int *map = xmalloc(sizeof(int) * ((size_t)nops + 1));
		for (int i = 0; i < nops; i++)
			map[i] = op_now(g, mark[i]);
		Propagation first = *p;
		PropSeed seed = {spec, nv, &first, map, nops};
		rc = propagate_seeded(g, hw, rules, &seed, p, d);
		propagation_free(&first);
		free(map);
	} else {
		propagation_free(p);
		memset(p, 0, sizeof *p);
	}
	free(spec), free(mark);
	if (rc != 0)
		return -1;
	train_tie_specs(g);
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
	graph_init(prog);
	if (map)
		*map = NULL;
	int rc = propagate_twice(g, hw, share ? share->rules : NULL, &p, wus, d);
	propagation_free(&p);
	if (rc != 0)
		return -1;
	int *m = xcalloc((size_t)g->values.n + 1, sizeof *m); /* sized now: the passes add values */
	rc = partition_shared(g, prog, m, hw, share, d);
	if (rc == 0 && g->train && g->train->built) /* a training program: its carries, in prog's ids */
		train_map(g, m, prog);
	if (map)
		*map = m;
	else
		free(m);
	CombineOpts co = {.group_bytes = g->train ? g->train->group_bytes : 0}; /* models: scalar all_reduces only */
	if (rc == 0)
		rc = combine_collectives(prog, &co, d);
	if (rc == 0) /* as the program written out reads back (spmd/emit.c) */
		graph_unshare_consts(prog);
#if SPMD_VERIFY_PARTITION /* test builds: the collectives of every device match (verify.h) */
	if (rc == 0 && verify_program(prog, d) != 0)
		rc = -1;
#endif
	return rc;
}
