/* cmd_check.c: `spmd check MODEL.yaml` — validate a model and summarize it. */
#include <string.h>

#include "cli.h"
#include "pipeline_report.h"
#include "commands.h"
#include "../spmd/load.h"
#include "../spmd/ops.h"

enum { O_QUIET, O_MESH, O_AXIS_RULES, NCHECK_OPTS };

static const CliOpt check_opts[NCHECK_OPTS] = {
	[O_QUIET] = {"quiet", NULL, "print nothing on success; only the exit status tells"},
	[O_MESH] = CLI_MESH_OPT,
	[O_AXIS_RULES] = CLI_AXIS_RULES_OPT,
};

/* Human-readable count: 1234567 -> "1.23M". */
static void format_count(double x, char *buf, size_t n)
{
	static const char *unit[] = {"", "K", "M", "G", "T", "P"};
	int u = 0;
	while (x >= 1000 && u < 5)
		x /= 1000, u++;
	snprintf(buf, n, u ? "%.3g%s" : "%.0f%s", x, unit[u]);
}

static void print_summary(const Graph *g, const char *path)
{
	int count[VK_STATE + 1] = {0};
	int64_t param_bytes = 0;
	for (int i = 0; i < g->values.n; i++) {
		const Value *v = &g->values.a[i];
		count[v->kind]++;
		if (v->kind == VK_PARAM)
			param_bytes += shape_numel(&v->shape) * dtype_size(v->dtype);
	}
	char mesh[128] = "none (one device)", params[32], flops[32], bytes[32];
	if (g->mesh.naxes)
		mesh_format(&g->mesh, mesh, sizeof mesh);
	format_count((double)graph_param_count(g), params, sizeof params);
	format_count(graph_flops(g), flops, sizeof flops);
	format_count((double)param_bytes, bytes, sizeof bytes);
	printf("%s: ok\n", path);
	printf("  model       %s\n", g->name ? g->name : "(unnamed)");
	printf("  mesh        %s (%d device%s)\n", mesh, g->mesh.ndev, g->mesh.ndev == 1 ? "" : "s");
	printf("  values      %d (%d inputs, %d params, %d constants, %d results)\n", g->values.n, count[VK_INPUT],
	       count[VK_PARAM], count[VK_CONST], count[VK_INTER]);
	printf("  ops         %d\n", g->ops.n);
	printf("  parameters  %s (%sB)\n", params, bytes);
	printf("  FLOPs       %s per evaluation\n", flops);
	if (g->pipeline)
		pipeline_summary(g);
	for (int i = 0; i < g->outputs.n; i++) {
		const Value *v = &g->values.a[g->outputs.a[i]];
		char shape[128];
		shape_format(&v->shape, shape, sizeof shape);
		printf("  output      %s %s %s\n", v->name, dtype_names[v->dtype], shape);
	}
}

static int check_model(const CliParse *p, const char *path)
{
	Graph g;
	Diag d;
	diag_init(&d);
	int rc = 0;
	LoadOpts lo = {cli_get(p, O_MESH), cli_get(p, O_AXIS_RULES)};
	if (model_load_opts(&g, path, &lo, &d) != 0 || graph_verify(&g, &d) != 0)
		rc = 2;
	else if (!cli_flag(p, O_QUIET))
		print_summary(&g, path);
	graph_free(&g);
	return rc;
}

int cmd_check(int argc, char **argv)
{
	static const CliCommand c = {"check", "MODEL.yaml", "MODEL.yaml [--quiet] [--mesh AXES] [--axis-rules FILE]",
	                             "Load and validate a model: its YAML, names, shapes, dtypes and sharding\n"
	                             "annotations.  Prints a summary, or every error found as FILE:LINE:COL.",
	                             check_opts, NCHECK_OPTS, check_model};
	return cli_main(&c, argc, argv);
}
