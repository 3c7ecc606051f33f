/* cmd_report.c: `spmd report MODEL.yaml -o report.html` — one self-contained HTML file about a model's plan. */
#include <stdlib.h>

#include "cli.h"
#include "commands.h"
#include "report.h"
#include "svg.h"
#include "../partitioner/pipeline.h"
#include "../partitioner/step.h"

enum { O_OUT, O_HARDWARE, O_MESH, O_AXIS_RULES, NREPORT_OPTS };

static const CliOpt report_opts[NREPORT_OPTS] = {
	[O_OUT] = {"o", "REPORT.html", "the file to write (required)"},
	[O_HARDWARE] = {"hardware", "NAME|FILE", "hardware profile for the cost sections (default: the model's mesh "
	                                         "hardware, else tpu-v3)"},
	[O_MESH] = CLI_MESH_OPT,
	[O_AXIS_RULES] = CLI_AXIS_RULES_OPT,
};

static const char report_desc[] =
	"Write one self-contained HTML file (inline SVG and CSS; nothing is\n"
	"fetched) about how the model is partitioned: a summary, the mesh, every\n"
	"param and annotated value with its tile map, the collectives with their\n"
	"reasons and bytes, the cost by op kind, by collective and by mesh axis,\n"
	"memory over the step with what is live at the peak, the timeline, and for\n"
	"a training model the weight-update sharding of each param.  Open it in\n"
	"any browser.  Sections: docs/pictures.md.";

static void fill(FILE *out, void *ctx) { report_html(ctx, out); }

static int report_model(const CliParse *p, const char *path)
{
	const char *out = cli_get(p, O_OUT);
	if (!out) {
		fprintf(stderr, "spmd report: error: expected -o REPORT.html, found none (see spmd report --help)\n");
		return 2;
	}
	Graph g, prog;
	Diag d;
	diag_init(&d);
	LoadOpts lo = {cli_get(p, O_MESH), cli_get(p, O_AXIS_RULES)};
	if (cli_load_model(&g, path, &lo, true, &d) != 0) {
		graph_free(&g);
		return 2;
	}
	HwProfile prices, hw;
	const char *note;
	WusReport wus = {0};
	int *map = NULL;
	cli_pass_prices(&g, &prices);
	graph_init(&prog);
	int rc = cli_hardware(&g, cli_get(p, O_HARDWARE), &hw, &note, &d) == 0 &&
	                         pipeline_partition(&g, &prices, &prog, &map, &wus, &d) == 0
	                 ? 0
	                 : 2;
	if (rc == 0) {
		CostEstimate e;
		CostStep step;
		step_describe(&g, &prog, map, &step); /* the steady state of a long run, as spmd cost prices it */
		cost_estimate_step(&prog, &hw, &step, &e);
		cost_step_free(&step);
		Report r = {.model = &g, .prog = &prog, .map = map, .wus = &wus, .hw = &hw, .est = &e, .path = path};
		rc = picture_write(out, fill, &r, &d) == 0 ? 0 : 2;
		cost_estimate_free(&e);
	}
	graph_free(&prog);
	free(map);
	graph_free(&g);
	return rc;
}

int cmd_report(int argc, char **argv)
{
	static const CliCommand c = {"report", "MODEL.yaml", "MODEL.yaml -o REPORT.html [--hardware NAME|FILE] [--mesh AXES]",
	                             report_desc, report_opts, NREPORT_OPTS, report_model};
	return cli_main(&c, argc, argv);
}
