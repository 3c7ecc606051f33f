/* cli.c: command-line option parsing shared by the subcommands. */
#include "cli.h"
#include "measure.h"
#include "../spmd/load.h"
#include "../train/train.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static int find_opt(const CliOpt *opts, int nopts, const char *name, size_t len)
{
	for (int i = 0; i < nopts; i++)
		if (strlen(opts[i].name) == len && memcmp(opts[i].name, name, len) == 0)
			return i;
	return -1;
}

/* Parse one option word at argv[*i]; advances *i past its argument. */
static int parse_option(const char *cmd, int argc, char **argv, int *i, const CliOpt *opts, int nopts, CliParse *p)
{
	const char *w = argv[*i];
	const char *name = w + (w[1] == '-' ? 2 : 1);
	const char *eq = strchr(name, '=');
	size_t len = eq ? (size_t)(eq - name) : strlen(name);
	int o = find_opt(opts, nopts, name, len);
	if (o < 0) {
		fprintf(stderr, "spmd %s: error: expected an option of 'spmd %s --help', found '%s'\n", cmd, cmd, w);
		return 2;
	}
	const char *val = NULL;
	if (opts[o].arg) {
		if (eq)
			val = eq + 1;
		else if (*i + 1 < argc)
			val = argv[++*i];
		else {
			fprintf(stderr, "spmd %s: error: expected %s after --%s, found the end of the command\n", cmd,
			        opts[o].arg, opts[o].name);
			return 2;
		}
	} else if (eq) {
		fprintf(stderr, "spmd %s: error: expected no value for --%s, found '%s'\n", cmd, opts[o].name, eq + 1);
		return 2;
	}
	vec_push(&p->args, ((CliArg){o, val}));
	return 0;
}

int cli_parse(const char *cmd, int argc, char **argv, const CliOpt *opts, int nopts, CliParse *p)
{
	memset(p, 0, sizeof *p);
	bool options = true;
	for (int i = 0; i < argc; i++) {
		const char *w = argv[i];
		if (options && (strcmp(w, "-h") == 0 || strcmp(w, "--help") == 0)) {
			p->help = true;
		} else if (options && strcmp(w, "--") == 0) {
			options = false;
		} else if (options && w[0] == '-' && w[1]) {
			if (parse_option(cmd, argc, argv, &i, opts, nopts, p) != 0) {
				cli_free(p);
				return 2;
			}
		} else {
			vec_push(&p->args, ((CliArg){-1, w}));
		}
	}
	return 0;
}

void cli_free(CliParse *p) { vec_free(&p->args); }

const char *cli_get(const CliParse *p, int i)
{
	const char *v = NULL;
	for (int k = 0; k < p->args.n; k++)
		if (p->args.a[k].opt == i)
			v = p->args.a[k].value;
	return v;
}

bool cli_flag(const CliParse *p, int i)
{
	for (int k = 0; k < p->args.n; k++)
		if (p->args.a[k].opt == i)
			return true;
	return false;
}

void cli_help(FILE *out, const char *cmd, const char *synopsis, const char *desc, const CliOpt *opts, int nopts)
{
	fprintf(out, "usage: spmd %s %s\n\n%s\n", cmd, synopsis, desc);
	if (nopts)
		fprintf(out, "\noptions:\n");
	for (int i = 0; i < nopts; i++) {
		char left[64];
		snprintf(left, sizeof left, "%s%s %s", strlen(opts[i].name) == 1 ? "-" : "--", opts[i].name,
		         opts[i].arg ? opts[i].arg : "");
		fprintf(out, "  %-24s %s\n", left, opts[i].help);
	}
	fprintf(out, "  %-24s %s\n", "-h, --help", "show this help");
}

int cli_uint(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (!*s || *end || errno || s[0] == '-') {
		fprintf(stderr, "spmd %s: error: expected a non-negative integer after --%s, found '%s'\n", cmd, opt, s);
		return 2;
	}
	*out = v;
	return 0;
}

int cli_seconds(const char *cmd, const char *opt, const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (!*s || *end || errno || !(v > 0 && v <= 31536000)) {
		fprintf(stderr, "spmd %s: error: expected a number of seconds above 0, at most 31536000, after --%s, found '%s'\n",
		        cmd, opt, s);
		return 2;
	}
	*out = v;
	return 0;
}

int cli_load_model(Graph *g, const char *path, const LoadOpts *o, bool step, Diag *d)
{
	if (model_load_opts(g, path, o, d) != 0 || cost_pipeline_cut(g, path, o, d) != 0) /* stages: auto: as priced */
		return -1;
	return step && g->train ? train_build(g, d) : 0;
}

int cli_main(const CliCommand *c, int argc, char **argv)
{
	CliParse p;
	if (cli_parse(c->name, argc, argv, c->opts, c->nopts, &p) != 0)
		return 2;
	int rc = 0, npos = 0;
	const char *path = NULL;
	for (int i = 0; i < p.args.n; i++)
		if (p.args.a[i].opt == -1)
			path = p.args.a[i].value, npos++;
	if (p.help)
		cli_help(stdout, c->name, c->synopsis, c->desc, c->opts, c->nopts);
	else if (npos != 1) {
		fprintf(stderr, "spmd %s: error: expected one %s, found %d (see spmd %s --help)\n", c->name, c->arg, npos,
		        c->name);
		rc = 2;
	} else
		rc = c->body(&p, path);
	cli_free(&p);
	return rc;
}

int cli_hardware(const Graph *g, const char *arg, HwProfile *hw, const char **note, Diag *d)
{
	if (note)
		*note = "";
	if (arg)
		return hw_profile_resolve(hw, arg, NULL, (Pos){0}, d);
	if (g->mesh.hardware)
		return hw_profile_resolve(hw, g->mesh.hardware, g->file, (Pos){g->file, g->mesh.pos[0].line, 1}, d);
	if (note)
		*note = " (the default; choose with --hardware)";
	return hw_profile_builtin(hw, "tpu-v3");
}

void cli_pass_prices(const Graph *g, HwProfile *hw)
{
	Diag quiet;
	diag_init(&quiet);
	quiet.quiet = true;
	if (!g->mesh.hardware || hw_profile_resolve(hw, g->mesh.hardware, g->file, (Pos){0}, &quiet) != 0)
		hw_profile_builtin(hw, "tpu-v3");
}

const char *cli_order_why(const OrderReport *o, char *buf, size_t n)
{
	char a[32], b[32], c[32];
	fmt_seconds(o->before_s, a, sizeof a), fmt_seconds(o->after_s, b, sizeof b);
	fmt_seconds(o->hoist_s, c, sizeof c);
	if (!o->hw[0])
		return "";
	char fills[160] = "", hoists[224] = "", delays[224] = "", d[32];
	fmt_seconds(o->delay_s, d, sizeof d);
	if (o->delays)
		snprintf(delays, sizeof delays, "; then %d update%s that waited for %s put off, with the %d op%s "
		         "reading %s, past the ops that fill the wait%s: %s", o->delays, o->delays == 1 ? "" : "s",
		         o->delays == 1 ? "its gradient's collective" : "their gradients' collectives", o->delayed - o->delays,
		         o->delayed - o->delays == 1 ? "" : "s", o->delays == 1 ? "it" : "them", o->delays == 1 ? "" : "s", d);
	if (o->fills)
		snprintf(fills, sizeof fills, "; %d of them then moved later, into %d wait%s of the compute stream for "
		         "a gradient's collective", o->filled, o->fills, o->fills == 1 ? "" : "s");
	if (o->hoists)
		snprintf(hoists, sizeof hoists, "; then %d collective%s the compute stream waited for issued sooner, with "
		         "the %d op%s making %s operands: %s", o->hoists, o->hoists == 1 ? "" : "s", o->hoisted - o->hoists,
		         o->hoisted - o->hoists == 1 ? "" : "s", o->hoists == 1 ? "its" : "their", c);
	if (o->kept)
		snprintf(buf, n, "%d ops moved into the backward pass, where their operands are ready (of %d params, %d "
		                 "gradients reduced and %d updated there)%s: the steady step %s -> %s on %s%s%s",
		         o->ops, o->params, o->grads, o->moved, fills, a, b, o->hw, hoists, delays);
	else if (o->tried && o->after_s >= o->before_s * (1 - 1e-3))
		snprintf(buf, n, "as built, the gradients' reductions and the updates after the backward pass: moved into it, "
		                 "the steady step would take %s instead of %s on %s (not 0.1%% faster)%s", b, a, o->hw, hoists);
	else if (o->tried)
		snprintf(buf, n, "as built, the gradients' reductions and the updates after the backward pass: moved into it, "
		                 "the peak would be %lld bytes instead of %lld on %s (over 1%% more)%s",
		         (long long)o->after_peak, (long long)o->before_peak, o->hw, hoists);
	else
		snprintf(buf, n, "as built, the gradients' reductions and the updates after the backward pass: the steady "
		                 "step (%s on %s) waits on collectives under 1%% of it%s", a, o->hw, hoists);
	return buf;
}

json_t *cli_order_json(const OrderReport *o)
{
	char why[1024];
	json_t *j = json_object();
	json_object_set_new(j, "moved", json_boolean(o->kept));
	json_object_set_new(j, "params_moved", json_integer(o->kept ? o->moved : 0));
	json_object_set_new(j, "params", json_integer(o->params));
	json_object_set_new(j, "gradients_moved", json_integer(o->kept ? o->grads : 0));
	json_object_set_new(j, "ops_moved", json_integer(o->kept ? o->ops : 0));
	json_object_set_new(j, "waits_filled", json_integer(o->kept ? o->fills : 0));
	json_object_set_new(j, "ops_filled", json_integer(o->kept ? o->filled : 0));
	json_object_set_new(j, "collectives_hoisted", json_integer(o->hoists));
	json_object_set_new(j, "ops_hoisted", json_integer(o->hoisted - o->hoists));
	json_object_set_new(j, "step_hoisted_s", o->hoists ? json_real(o->hoist_s) : json_null());
	json_object_set_new(j, "peak_hoisted_bytes", o->hoists ? json_integer(o->hoist_peak) : json_null());
	json_object_set_new(j, "waits_put_off", json_integer(o->delays));
	json_object_set_new(j, "ops_put_off", json_integer(o->delayed));
	json_object_set_new(j, "step_put_off_s", o->delays ? json_real(o->delay_s) : json_null());
	json_object_set_new(j, "peak_put_off_bytes", o->delays ? json_integer(o->delay_peak) : json_null());
	json_object_set_new(j, "hardware", json_string(o->hw));
	json_object_set_new(j, "step_s", json_real(o->before_s));
	json_object_set_new(j, "step_moved_s", o->tried ? json_real(o->after_s) : json_null());
	json_object_set_new(j, "peak_bytes", json_integer(o->before_peak));
	json_object_set_new(j, "peak_moved_bytes", o->tried ? json_integer(o->after_peak) : json_null());
	json_object_set_new(j, "reason", json_string(cli_order_why(o, why, sizeof why)));
	return j;
}

const char *cli_chunk_why(const ChunkReport *c, char *buf, size_t n)
{
	char a[32], b[32];
	fmt_seconds(c->before_s, a, sizeof a), fmt_seconds(c->after_s, b, sizeof b);
	if (!c->hw[0])
		return "";
	if (c->kept)
		snprintf(buf, n, "%d collective%s in %d chunks, which collectives needed sooner run between: the steady step "
		                 "%s -> %s on %s",
		         c->collectives, c->collectives == 1 ? "" : "s", c->chunks, a, b, c->hw);
	else if (c->tried && c->after_s >= c->before_s * (1 - 1e-3))
		snprintf(buf, n, "none: with %d collective%s in %d chunks the steady step would take %s instead of %s on %s "
		                 "(not 0.1%% faster)",
		         c->collectives, c->collectives == 1 ? "" : "s", c->chunks, b, a, c->hw);
	else if (c->tried)
		snprintf(buf, n, "none: with %d collective%s in %d chunks the peak would be %lld bytes instead of %lld on %s "
		                 "(over 1%% more)",
		         c->collectives, c->collectives == 1 ? "" : "s", c->chunks, (long long)c->after_peak,
		         (long long)c->before_peak, c->hw);
	else
		snprintf(buf, n, "none: the %d collective%s holding back ones needed sooner would save under 0.2%% of the "
		                 "steady step (%s on %s)",
		         c->collectives, c->collectives == 1 ? "" : "s", a, c->hw);
	return buf;
}

json_t *cli_chunk_json(const ChunkReport *c)
{
	char why[512];
	json_t *j = json_object();
	json_object_set_new(j, "chunked", json_boolean(c->kept));
	json_object_set_new(j, "collectives", json_integer(c->collectives));
	json_object_set_new(j, "chunks", json_integer(c->chunks));
	json_object_set_new(j, "hardware", json_string(c->hw));
	json_object_set_new(j, "step_s", json_real(c->before_s));
	json_object_set_new(j, "step_chunked_s", c->tried ? json_real(c->after_s) : json_null());
	json_object_set_new(j, "peak_bytes", json_integer(c->before_peak));
	json_object_set_new(j, "peak_chunked_bytes", c->tried ? json_integer(c->after_peak) : json_null());
	json_object_set_new(j, "reason", json_string(cli_chunk_why(c, why, sizeof why)));
	return j;
}

/* "3 all_gathers, 1 reduce_scatter and 2 all_reduces" */
static const char *collectives_text(const WindowReport *w, char *buf, size_t n)
{
	const char *name[3] = {"all_gather", "reduce_scatter", "all_reduce"};
	int count[3] = {w->gathers, w->scatters, w->reduces}, left = (count[0] > 0) + (count[1] > 0) + (count[2] > 0);
	size_t at = 0;
	buf[0] = 0;
	for (int k = 0; k < 3 && at < n; k++) {
		if (!count[k])
			continue;
		left--;
		at += (size_t)snprintf(buf + at, n - at, "%d %s%s%s", count[k], name[k], count[k] == 1 ? "" : "s",
		                       left > 1 ? ", " : left == 1 ? " and " : "");
	}
	return buf;
}

const char *cli_window_why(const WindowReport *w, char *buf, size_t n)
{
	char a[32], b[32], c[96];
	fmt_seconds(w->before_s, a, sizeof a), fmt_seconds(w->after_s, b, sizeof b);
	if (!w->hw[0])
		return "";
	char ch[64] = "";
	if (w->chained)
		snprintf(ch, sizeof ch, ", the %d op%s after the all_reduces in their blocks", w->chained,
		         w->chained == 1 ? "" : "s");
	if (w->kept)
		snprintf(buf, n, "%s overlapped with the %d einsum%s next to them%s, in blocks: the "
		                 "steady step %s -> %s on %s",
		         collectives_text(w, c, sizeof c), w->einsums, w->einsums == 1 ? "" : "s", ch, a, b, w->hw);
	else if (w->tried && w->after_s >= w->before_s * (1 - 1e-3))
		snprintf(buf, n, "none: with %s overlapped with their einsums the steady step would take %s instead of %s "
		                 "on %s (not 0.1%% faster)", collectives_text(w, c, sizeof c), b, a, w->hw);
	else if (w->tried)
		snprintf(buf, n, "none: with %s overlapped with their einsums the peak would be %lld bytes instead of %lld "
		                 "on %s (over 1%% more)",
		         collectives_text(w, c, sizeof c), (long long)w->after_peak, (long long)w->before_peak, w->hw);
	else
		snprintf(buf, n, "none: no all_gather, reduce_scatter or all_reduce next to an einsum is expected to gain on %s (the "
		                 "collective hidden already, or its blocks' sends not hidden behind the einsum's blocks, or "
		                 "keeping the links busier than it did); the "
		                 "steady step %s", w->hw, a);
	return buf;
}

json_t *cli_window_json(const WindowReport *w)
{
	char why[512];
	json_t *j = json_object();
	json_object_set_new(j, "overlapped", json_boolean(w->kept));
	json_object_set_new(j, "all_gathers", json_integer(w->tried ? w->gathers : 0));
	json_object_set_new(j, "reduce_scatters", json_integer(w->tried ? w->scatters : 0));
	json_object_set_new(j, "all_reduces", json_integer(w->tried ? w->reduces : 0));
	json_object_set_new(j, "einsums", json_integer(w->tried ? w->einsums : 0));
	json_object_set_new(j, "chained_ops", json_integer(w->tried ? w->chained : 0));
	json_object_set_new(j, "hardware", json_string(w->hw));
	json_object_set_new(j, "step_s", json_real(w->before_s));
	json_object_set_new(j, "step_overlapped_s", w->tried ? json_real(w->after_s) : json_null());
	json_object_set_new(j, "peak_bytes", json_integer(w->before_peak));
	json_object_set_new(j, "peak_overlapped_bytes", w->tried ? json_integer(w->after_peak) : json_null());
	json_object_set_new(j, "reason", json_string(cli_window_why(w, why, sizeof why)));
	return j;
}

const char *fmt_seconds(double s, char *buf, size_t n)
{
	if (s < 1e-3)
		snprintf(buf, n, "%.3g us", s * 1e6);
	else if (s < 1)
		snprintf(buf, n, "%.3g ms", s * 1e3);
	else
		snprintf(buf, n, "%.3g s", s);
	return buf;
}

const char *fmt_size(double b, char *buf, size_t n)
{
	static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int u = 0;
	while (b >= 1024 && u < 4)
		b /= 1024, u++;
	snprintf(buf, n, u ? "%.3g %s" : "%.0f %s", b, unit[u]);
	return buf;
}

json_t *cli_jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

json_t *cli_jaxes(const Mesh *m, const int *ax, int n)
{
	json_t *a = json_array();
	uint8_t a8[MESH_MAX_AXES];
	for (int i = 0; i < n && i < MESH_MAX_AXES; i++)
		a8[i] = (uint8_t)ax[i];
	for (int i = 0; i < n;) {
		char name[128];
		i += mesh_run_name(m, a8 + i, n - i, name, sizeof name);
		json_array_append_new(a, json_string(name));
	}
	return a;
}
