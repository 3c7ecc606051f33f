/* cmd_propagate.c: `spmd propagate MODEL.yaml` — every value's sharding and where it came from. */
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "../spmd/load.h"
#include "../partitioner/pipeline.h"

enum { O_EXPLAIN, O_MESH, NPROP_OPTS };

static const CliOpt prop_opts[NPROP_OPTS] = {
	[O_EXPLAIN] = {"explain", "NAME", "print the chain from NAME back to the annotations, and its conflicts"},
	[O_MESH] = CLI_MESH_OPT,
};

static const char prop_desc[] =
	"Infer a sharding for every value from the annotations and print each with\n"
	"its origin: the values, factors (einsum letters) and op it came through.\n"
	"Annotated dims are never changed; `null` is a fixed \"not split\"; `_` or\n"
	"'?' leaves a dim open for propagation.";

static int propagate_model(const char *path, const char *explain, const char *mesh)
{
	Graph g;
	Diag d;
	diag_init(&d);
	int rc = 0;
	if (cli_load_model(&g, path, mesh, true, &d) != 0) {
		graph_free(&g);
		return 2;
	}
	int target = explain ? graph_find(&g, explain) : -1;
	if (explain && target < 0) {
		fprintf(stderr, "spmd propagate: error: expected a value of %s after --explain, found '%s'\n", path, explain);
		graph_free(&g);
		return 2;
	}
	Propagation p;
	HwProfile hw;
	cli_pass_prices(&g, &hw);
	if (pipeline_propagate(&g, &hw, &p, NULL, &d) != 0)
		rc = 2;
	else if (explain)
		propagation_explain(&g, &p, target, stdout);
	else
		propagation_print(&g, &p, stdout);
	propagation_free(&p);
	graph_free(&g);
	return rc;
}

static int propagate_body(const CliParse *p, const char *path)
{
	return propagate_model(path, cli_get(p, O_EXPLAIN), cli_get(p, O_MESH));
}

int cmd_propagate(int argc, char **argv)
{
	static const CliCommand c = {"propagate", "MODEL.yaml", "MODEL.yaml [--explain NAME]", prop_desc, prop_opts, NPROP_OPTS, propagate_body};
	return cli_main(&c, argc, argv);
}
