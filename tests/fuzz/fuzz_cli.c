/* fuzz_cli.c: the small parsers of the command line.  The first byte picks
 * one, the rest is its text:
 *   0  `spmd reshard` with the lines of the text as its arguments (the
 *      option parser, --mesh, --shape, --from/--to specs, the planner;
 *      --check is dropped: it runs threads)
 *   1  a sharding spec (YAML) for a tensor of rank byte 1 % 9 on the mesh
 *      data=2,model=4,pipe=3
 *   2  the --mesh text form
 *   3  the option parser alone, on a table with valued and flag options */
#include "fuzz.h"

#include <string.h>

#include "../../base/yaml.h"
#include "../../mesh/mesh.h"
#include "../../sharding_spec/spec.h"
#include "../../cli/cli.h"
#include "../../cli/commands.h"

enum { MAX_ARGS = 64 };

/* Split text at newlines into argv (at most MAX_ARGS, --check left out). */
static int split(char *text, char **argv)
{
	int argc = 0;
	for (char *line = text; line && argc < MAX_ARGS;) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		if (strcmp(line, "--check") != 0)
			argv[argc++] = line;
		line = nl ? nl + 1 : NULL;
	}
	argv[argc] = NULL;
	return argc;
}

static void spec(const char *text, int rank)
{
	Diag d;
	fuzz_diag(&d);
	Arena a;
	arena_init(&a);
	Mesh m;
	if (mesh_parse_text(&m, &a, "data=2,model=4,pipe=3", &d) != 0)
		FUZZ_FINDING("the fixed mesh does not parse: %s", d.last);
	YDoc doc;
	if (ydoc_parse_string(&doc, text, "spec.yaml", &d) == 0 && doc.root) {
		Spec s;
		if (spec_parse(&s, doc.root, &m, rank, &d) == 0) {
			if (!spec_is_valid(&s, &m))
				FUZZ_FINDING("spec_parse accepted an invalid spec");
			char buf[512];
			spec_format(&s, &m, buf, sizeof buf);
		}
	}
	ydoc_free(&doc);
	arena_free(&a);
}

static void options(int argc, char **argv)
{
	static const CliOpt opts[] = {{"mesh", "AXES", "x"}, {"check", NULL, "x"}, {"o", "FILE", "x"},
	                              {"steps", "N", "x"}, {"json", NULL, "x"}};
	CliParse p;
	if (cli_parse("fuzz", argc, argv, opts, 5, &p) != 0)
		return;
	uint64_t n;
	double s;
	if (cli_get(&p, 3))
		cli_uint("fuzz", "steps", cli_get(&p, 3), &n), cli_seconds("fuzz", "steps", cli_get(&p, 3), &s);
	cli_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	char *text = fuzz_text(data + 2, size - 2), *argv[MAX_ARGS + 1];
	Diag d;
	fuzz_diag(&d);
	switch (data[0] % 4) {
	case 0:
		cmd_reshard(split(text, argv), argv);
		break;
	case 1:
		spec(text, data[1] % 9);
		break;
	case 2: {
		Arena a;
		arena_init(&a);
		Mesh m;
		if (mesh_parse_text(&m, &a, text, &d) == 0 && (m.ndev < 1 || m.ndev > MESH_MAX_DEVICES))
			FUZZ_FINDING("a mesh of %d devices", m.ndev);
		arena_free(&a);
		break;
	}
	default:
		options(split(text, argv), argv);
	}
	free(text);
	return 0;
}
