/* cmd_show.c: `spmd show MODEL.yaml VALUE` — one value's tiles on the mesh, in the terminal or as SVG. */
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "svg.h"
#include "tilemap.h"
#include "measure.h"

enum { O_SVG, O_COLOR, O_MESH, O_AXIS_RULES, NSHOW_OPTS };

static const CliOpt show_opts[NSHOW_OPTS] = {
	[O_SVG] = {"svg", "FILE", "also write the tile map as a standalone SVG"},
	[O_COLOR] = {"color", "WHEN", "colour the cells: auto (default: on a terminal, unless NO_COLOR is set), always, never"},
	[O_MESH] = CLI_MESH_OPT,
	[O_AXIS_RULES] = CLI_AXIS_RULES_OPT,
};

static const char show_desc[] =
	"Draw how one value is laid out on the mesh: every tile of the global\n"
	"tensor with the devices that hold it (replicas together, with their mesh\n"
	"coordinates), padding of uneven splits, partial sums.  VALUE is any value\n"
	"of the partitioned program: a param, an input, an op's result, or a\n"
	"temporary the partitioner made (spmd partition lists them).  MODEL.yaml may\n"
	"also be a partitioned program (spmd partition -o).  Rank 0-2 is\n"
	"one grid; rank 3 and up a grid per slice of the leading dims.  Pictures:\n"
	"docs/pictures.md.";

/* The program's value names, for the error: "x, w1, h, ..." (capped). */
static void value_names(const Graph *g, char *buf, size_t n)
{
	size_t k = 0;
	buf[0] = 0;
	for (int v = 0, shown = 0; v < g->values.n && k < n; v++) {
		if (g->values.a[v].kind == VK_CONST)
			continue;
		if (shown++ == 8) {
			snprintf(buf + k, n - k, ", ...");
			break;
		}
		k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", g->values.a[v].name);
	}
}

/* --color: 1 on, 0 off, -1 after a usage error. */
static int colour_choice(const char *when)
{
	if (!when || strcmp(when, "auto") == 0)
		return tilemap_colour_auto(stdout);
	if (strcmp(when, "always") == 0)
		return 1;
	if (strcmp(when, "never") == 0)
		return 0;
	fprintf(stderr, "spmd show: error: expected --color auto, always or never, found '%s'\n", when);
	return -1;
}

static void fill_svg(FILE *out, void *ctx)
{
	const TileMap *t = ctx;
	double w, h;
	tilemap_svg_size(t, &w, &h);
	svg_begin(out, w + 24, h + 24);
	tilemap_svg(t, out, 12, 12);
	svg_end(out);
}

static int show_value(const Graph *prog, int v, const CliParse *p, int colour, Diag *d)
{
	const Value *val = &prog->values.a[v];
	TileMap t;
	tilemap_init(&t, val->name, val->dtype, &val->global, &val->spec, &prog->mesh);
	const char *svg = cli_get(p, O_SVG);
	int rc = svg && picture_write(svg, fill_svg, &t, d) != 0 ? 2 : 0;
	if (rc == 0)
		tilemap_text(&t, stdout, colour != 0);
	tilemap_free(&t);
	return rc;
}

static int show_main(const CliParse *p, const char *path, const char *name)
{
	int colour = colour_choice(cli_get(p, O_COLOR));
	if (colour < 0)
		return 2;
	Graph g, prog;
	Diag d;
	diag_init(&d);
	LoadOpts lo = {cli_get(p, O_MESH), cli_get(p, O_AXIS_RULES)};
	int rc = cost_prepare_opts(path, &lo, -1, &g, &prog, NULL, NULL, NULL, &d) == 0 ? 0 : 2;
	int v = rc == 0 ? graph_find(&prog, name) : -1;
	if (rc == 0 && (v < 0 || prog.values.a[v].kind == VK_CONST)) {
		char names[512];
		value_names(&prog, names, sizeof names);
		diag_usage(&d, "expected a value of %s (%s), found '%s'", path, names, name);
		rc = 2;
	} else if (rc == 0)
		rc = show_value(&prog, v, p, colour, &d);
	graph_free(&prog);
	graph_free(&g);
	return rc;
}

int cmd_show(int argc, char **argv)
{
	CliParse p;
	if (cli_parse("show", argc, argv, show_opts, NSHOW_OPTS, &p) != 0)
		return 2;
	const char *pos[2];
	int npos = 0, rc = 0;
	for (int i = 0; i < p.args.n; i++)
		if (p.args.a[i].opt == -1 && npos++ < 2)
			pos[npos - 1] = p.args.a[i].value;
	if (p.help)
		cli_help(stdout, "show", "MODEL.yaml VALUE [--svg FILE] [--color WHEN] [--mesh AXES]", show_desc, show_opts,
		         NSHOW_OPTS);
	else if (npos != 2) {
		fprintf(stderr, "spmd show: error: expected MODEL.yaml and VALUE, found %d argument%s (see spmd show --help)\n",
		        npos, npos == 1 ? "" : "s");
		rc = 2;
	} else
		rc = show_main(&p, pos[0], pos[1]);
	cli_free(&p);
	return rc;
}
