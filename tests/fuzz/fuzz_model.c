/* fuzz_model.c: a model file through the loader, the training-step builder,
 * propagation, partitioning (verified in the Debug build), emission, and the
 * program loader on what was emitted: an emitted program that does not load
 * back is a finding. */
#include "fuzz.h"

#include "../../spmd/load.h"
#include "../../spmd/emit.h"
#include "../../train/train.h"
#include "../../partitioner/pipeline.h"
#include "../../partitioner/verify.h"
#include "../../cli/cli.h"

/* Big meshes and tensors only cost time: partitioning is linear in them. */
static bool small(const Graph *g)
{
	if (g->mesh.ndev > 64)
		return false;
	for (int v = 0; v < g->values.n; v++)
		if (shape_numel(&g->values.a[v].global) > (1 << 22))
			return false;
	return true;
}

static void round_trip(const Graph *prog)
{
	Diag d;
	fuzz_diag(&d);
	const char *path = fuzz_path("program.yaml");
	if (emit_program(prog, path, &d) != 0)
		return;
	Graph back;
	LoadKind kind;
	if (program_load(&back, path, &kind, &d) != 0 || !kind.spmd)
		FUZZ_FINDING("an emitted program does not load back: %s", d.last);
	graph_free(&back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = fuzz_text(data, size);
	Graph g, prog;
	Diag d;
	fuzz_diag(&d);
	graph_init(&prog);
	if (model_load_string(&g, text, "fuzz.yaml", &d) == 0 && small(&g) && (!g.train || train_build(&g, &d) == 0)) {
		HwProfile hw;
		cli_pass_prices(&g, &hw);
		graph_free(&prog);
		if (pipeline_partition(&g, &hw, &prog, NULL, NULL, &d) == 0) {
			if (verify_program(&prog, &d) != 0)
				FUZZ_FINDING("a partitioned program fails verification: %s", d.last);
			round_trip(&prog);
		}
	}
	graph_free(&prog);
	graph_free(&g);
	free(text);
	return 0;
}
