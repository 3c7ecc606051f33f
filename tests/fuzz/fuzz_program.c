/* fuzz_program.c: a partitioned program (or a model) through the program
 * loader and `spmd verify`'s checks: the collectives of one program, or
 * a per-device program among its mesh's devices (the others missing). */
#include "fuzz.h"

#include "../../spmd/load.h"
#include "../../partitioner/verify.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = fuzz_text(data, size);
	Graph g;
	Diag d;
	fuzz_diag(&d);
	LoadKind kind;
	if (program_load_string(&g, text, "fuzz.spmd.yaml", &kind, &d) == 0 && kind.spmd && g.mesh.ndev <= 64) {
		verify_program(&g, &d);
		if (kind.device >= 0 && kind.device < g.mesh.ndev) { /* the others missing */
			const Graph *progs[64] = {0};
			progs[kind.device] = &g;
			VerifyResult r;
			if (verify_devices(progs, g.mesh.ndev, &r) != 0)
				verify_report(&r, &d);
		}
	}
	graph_free(&g);
	free(text);
	return 0;
}
