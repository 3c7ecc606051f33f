/* cli.h: command-line option parsing shared by the subcommands. */
#ifndef SPMD_CLI_H
#define SPMD_CLI_H

#include <jansson.h>

#include "../spmd/ir.h"
#include "../spmd/tensor.h"
#include "../spmd/load.h"
#include "../cost_model/cost.h"
#include "../partitioner/chunk.h"
#include "../partitioner/order.h"
#include "../partitioner/window.h"

/* One option of a subcommand: "--name" (arg NULL: a flag) or "--name ARG". */
typedef struct {
	const char *name;  /* without the dashes */
	const char *arg;   /* metavariable, or NULL for a flag */
	const char *help;
} CliOpt;

/* One parsed occurrence, in command-line order. */
typedef struct {
	int opt;           /* index into the option table, -1 for a positional */
	const char *value; /* the argument, or the positional itself */
} CliArg;

typedef struct {
	VEC(CliArg) args;
	bool help;         /* -h or --help was given */
} CliParse;

/* Parse argv[0..argc) against opts[0..nopts).  Accepts --name ARG,
 * --name=ARG, -o ARG for an option called "o", and "--" ending options.
 * 0, or 2 after printing a usage error naming the command. */
int cli_parse(const char *cmd, int argc, char **argv, const CliOpt *opts, int nopts, CliParse *p);
void cli_free(CliParse *p);
/* The last value of option i, or NULL; cli_flag: was it given. */
const char *cli_get(const CliParse *p, int i);
bool cli_flag(const CliParse *p, int i);
/* Print "usage: spmd CMD SYNOPSIS\n\nDESCRIPTION\n\noptions:" and the table. */
void cli_help(FILE *out, const char *cmd, const char *synopsis, const char *desc, const CliOpt *opts, int nopts);
/* Parse a non-negative integer option value; 0, or 2 after a usage error. */
int cli_uint(const char *cmd, const char *opt, const char *s, uint64_t *out);

/* Figures for people: "12.3 us", "4.56 ms", "1.2 s"; "512 B", "3.5 KiB". */
const char *fmt_seconds(double s, char *buf, size_t n);
/* Where a training step's gradient reductions and updates run, and why
 * (partitioner/order.h), into buf: "" for a step the pass left alone. */
const char *cli_order_why(const OrderReport *o, char *buf, size_t n);
/* The same as the JSON object `step_order` (docs/partitioning.md). */
json_t *cli_order_json(const OrderReport *o);
/* Which collectives the partitioner overlapped with their einsums, and why
 * (partitioner/window.h), into buf: "" when it found none to try. */
const char *cli_window_why(const WindowReport *w, char *buf, size_t n);
/* The same as the JSON object `collective_matmul` (docs/partitioning.md). */
json_t *cli_window_json(const WindowReport *w);
/* Which long collectives the partitioner cut into chunks, and why
 * (partitioner/chunk.h), into buf: "" when it found none to cut. */
const char *cli_chunk_why(const ChunkReport *c, char *buf, size_t n);
/* The same as the JSON object `chunks` (docs/partitioning.md). */
json_t *cli_chunk_json(const ChunkReport *c);
const char *fmt_size(double bytes, char *buf, size_t n);
/* Parse a positive number of seconds (at most a year) for option opt; 0, or
 * 2 after a usage error. */
int cli_seconds(const char *cmd, const char *opt, const char *s, double *out);

/* What a command does with its one MODEL.yaml argument; returns the exit status. */
typedef struct {
	const char *name;     /* "run" */
	const char *arg;      /* the one argument: "MODEL.yaml" */
	const char *synopsis; /* "MODEL.yaml [options]" */
	const char *desc;
	const CliOpt *opts;
	int nopts;
	int (*body)(const CliParse *p, const char *path);
} CliCommand;

/* Parse argv for a command that takes one MODEL.yaml (or other file): print
 * its help, or a usage error (exit 2), or run its body. */
int cli_main(const CliCommand *c, int argc, char **argv);

/* Load a model with the options of --mesh and --axis-rules (o may be NULL;
 * model_load_opts); with step, turn a model with a train: section into its
 * training step (train_build).  0, or -1 after reporting. */
int cli_load_model(Graph *g, const char *path, const LoadOpts *o, bool step, Diag *d);
/* The --mesh option every model command takes. */
#define CLI_MESH_OPT {"mesh", "AXES", "replace the model's mesh, e.g. data=4,model=2 (annotations name its axes, or logical ones)"}
/* The --axis-rules option every model command takes. */
#define CLI_AXIS_RULES_OPT {"axis-rules", "FILE", "a YAML file whose axis_rules: mapping replaces the model's"}

/* The hardware profile --hardware names (arg, or NULL), else the mesh's
 * `hardware` (a built-in name or a profile file beside the model), else the
 * built-in tpu-v3 (*note then says so; note may be NULL).  0, or -1 after
 * reporting a profile that cannot be read. */
int cli_hardware(const Graph *g, const char *arg, HwProfile *hw, const char **note, Diag *d);
/* The profile the passes price their choices with: the mesh's `hardware`,
 * else tpu-v3 (a mesh profile that cannot be read falls back quietly). */
void cli_pass_prices(const Graph *g, HwProfile *hw);

/* A JSON number, or null when x is not finite (a profile with absurd figures). */
json_t *cli_jnum(double x);
/* The names of mesh axes ax[0..n) as a JSON array, pieces of one axis
 * joined ("model" for all of its pieces, mesh_run_name). */
json_t *cli_jaxes(const Mesh *m, const int *ax, int n);

#endif
