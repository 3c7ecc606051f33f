/* cmd_propagate.c: `spmd propagate MODEL.yaml` — every value's sharding and where it came from. */
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "../spmd/load.h"
#include "../partitioner/pipeline.h"

enum { O_EXPLAIN, O_MESH, O_AXIS_RULES, NPROP_OPTS };

static const CliOpt prop_opts[NPROP_OPTS] = {
	[O_EXPLAIN] = {"explain", "NAME", "print the chain from NAME back to the annotations, its conflicts, and the "
	               "priority that decided each dim"},
	[O_MESH] = CLI_MESH_OPT,
	[O_AXIS_RULES] = CLI_AXIS_RULES_OPT,
};

static const char prop_desc[] =
	"Infer a sharding for every value from the annotations and print each with\n"
	"its origin: the values, factors (einsum letters) and op it came through.\n"
	"Annotated dims are never changed; `null` is a fixed \"not split\"; `_` or\n"
	"'?' leaves a dim open for propagation.  Annotations with a priority N\n"
	"({dims: [...], priority: N}) apply in round N, after the earlier rounds'\n"
	"fixed points; the values of one shard_as group take one sharding.";

/* The mesh axes each logical axis name resolved to. */
static void print_rules(const Graph *g)
{
	for (int i = 0; i < g->rules.n; i++) {
		const AxisRule *r = &g->rules.a[i];
		char axes[128] = "";
		int ax[MESH_MAX_AXES];
		for (int j = 0; j < r->n; j++)
			ax[j] = r->axes[j];
		mesh_axes_text(&g->mesh, ax, r->n, axes, sizeof axes);
		printf("logical %-8s -> %s%s%s   (axis_rules: %s)\n", r->name, r->n ? "[" : "not split", axes, r->n ? "]" : "",
		       g->rules_written[i]);
	}
	if (g->rules.n)
		printf("\n");
}

static int propagate_model(const char *path, const char *explain, const LoadOpts *o)
{
	Graph g;
	Diag d;
	diag_init(&d);
	int rc = 0;
	if (cli_load_model(&g, path, o, true, &d) != 0) {
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
	else {
		print_rules(&g);
		propagation_print(&g, &p, stdout);
	}
	propagation_free(&p);
	graph_free(&g);
	return rc;
}

static int propagate_body(const CliParse *p, const char *path)
{
	LoadOpts o = {cli_get(p, O_MESH), cli_get(p, O_AXIS_RULES)};
	return propagate_model(path, cli_get(p, O_EXPLAIN), &o);
}

int cmd_propagate(int argc, char **argv)
{
	static const CliCommand c = {"propagate", "MODEL.yaml", "MODEL.yaml [--explain NAME]", prop_desc, prop_opts, NPROP_OPTS, propagate_body};
	return cli_main(&c, argc, argv);
}
