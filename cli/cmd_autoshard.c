/* cmd_autoshard.c: `spmd autoshard MODEL.yaml` — choose the shardings, prove a bound, write the annotated model. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "../partitioner/autoshard.h"
#include "../spmd/load.h"
#include "resources.h"

enum {
	O_DEVICES, O_MESH, O_HARDWARE, O_MEMORY, O_TIME, O_OUT, O_JSON, O_EXPLAIN, O_KEEP, O_PER_LAYER, O_WHOLE, O_JOBS,
	NAUTO_OPTS
};

static const CliOpt auto_opts[NAUTO_OPTS] = {
	[O_DEVICES] = {"devices", "N", "choose the mesh shape too: every way of writing N over the model's axes (else data, model)"},
	[O_MESH] = {"mesh", "AXES", "this mesh, e.g. data=2,model=4 (default: the model's)"},
	[O_HARDWARE] = {"hardware", "NAME|FILE", "hardware profile that prices the plans and the passes' choices, named in the plan's mesh (default: the model's mesh hardware, else tpu-v3)"},
	[O_MEMORY] = {"memory", "BYTES", "peak memory a device may hold: 8e9, 16GB, 16GiB (default: the profile's capacity)"},
	[O_TIME] = {"time-limit", "S", "stop searching after S seconds and return the best plan so far (default: none)"},
	[O_OUT] = {"o", "OUT.yaml", "write the model with the chosen mesh, shardings and weight-update sharding"},
	[O_JSON] = {"json", NULL, "print the result as JSON (docs/autoshard.md)"},
	[O_EXPLAIN] = {"explain", NULL, "per layer kind, also price the best other choice"},
	[O_KEEP] = {"keep-train", NULL, "keep the train: section's weight_update_sharding, all_gather, prefetch and recompute, and the params' own"},
	[O_PER_LAYER] = {"per-layer", NULL, "one choice per tensor, not one per layer kind"},
	[O_WHOLE] = {"whole", NULL, "price every plan on the whole model, not estimate it on a few repeated layers (slower)"},
	[O_JOBS] = {"jobs", "N", "price plans on N threads (default: one per processor); the plan does not depend on it"},
};

static const char auto_desc[] =
	"Choose a sharding for every input and param of the model (and, for a\n"
	"training step, weight-update sharding per param, all_gather and\n"
	"prefetch) that minimises the estimated overlapped step time with peak\n"
	"memory per device within the budget.  The choice is an integer program\n"
	"(GLPK) over per-dim shardings, estimated by partitioning one, two and\n"
	"three of the model's repeated layers (two, three and four from 16 layers\n"
	"on); the best estimates are priced exactly, and a ZeRO-3 answer keeps a\n"
	"param kind whole between steps (its own all_gather: after_update) or\n"
	"gathers it once a step (all_gather: first_use, the forward's copy held\n"
	"for the backward) where that is faster and fits.  Where the answer is\n"
	"then 10% or more above the bound, the step with train: recompute:\n"
	"selective (the forward's results cheap for their size made again in the\n"
	"backward) is searched too, from the mesh shapes' seeds, and its best plan\n"
	"taken with those passes when faster.  Then the single change the\n"
	"estimates call fastest (any choice of one kind on a model without\n"
	"repeated layers; a param kind's other weight-update sharding, and any\n"
	"choice of a param outside the layers, on one with them) is priced\n"
	"exactly and taken when faster, while one is; last, a ZeRO-3 answer's\n"
	"prefetch depth (4, 6 or 8 weights ahead where the fastest fits); and a\n"
	"ZeRO-3 answer without recompute 5% or more above the bound is priced\n"
	"with recompute: selective and those passes run again from it, kept when\n"
	"faster.  When no plan of a training step fits, the search runs again\n"
	"with recompute: selective, then with the backward recomputing the whole\n"
	"forward (recompute: true): less memory for more compute; a step whose\n"
	"memory floor (what every plan holds at once: the forward's results the\n"
	"backward reads, the params, optimizer state and inputs, over the\n"
	"devices) is over the budget is not searched.\n"
	"Tensors named alike with the same shape share one choice.  The model's\n"
	"own sharding: annotations are kept.  Prints the plan's estimate, a lower\n"
	"bound on the step time of every plan (the compute bound) and the gap,\n"
	"split into compute above the bound and waiting on collectives; exit\n"
	"status 1 when no plan fits (with the smallest peak found).  The written\n"
	"model names the profile in its mesh and reproduces the estimate: spmd\n"
	"cost OUT.yaml.  On a model with a pipeline: section the stage count and\n"
	"the microbatch count are searched too (and the schedule, interleaved\n"
	"included, and recompute where it leaves them open), plans ranked by the\n"
	"scheduled step.  See\n"
	"docs/autoshard.md.";


static void mesh_str(const AutoResult *r, char *buf, size_t n)
{
	size_t k = 0;
	buf[0] = 0;
	for (int a = 0; a < r->mesh_naxes && k < n; a++)
		k += (size_t)snprintf(buf + k, n - k, "%s%s=%d", a ? "," : "", r->mesh_name[a], r->mesh_size[a]);
}

/* How a runner-up's differences were priced: both plans estimated alike,
 * or (a runner-up estimated faster) both exactly; a runner-up that is
 * exactly faster and fits is a single change the search did not make. */
static const char *runner_how(const AutoOpts *o, const AutoGroup *a)
{
	(void)o;
	if (!a->runner_exact)
		return "estimate";
	return a->runner_ds < 0 && a->runner_fits ? "exact: faster, not reached by the search" : "exact";
}

/* A pipelined model: the scheduled step, the stage count and microbatches, their runners-up. */
static void print_pipe(const AutoResult *r)
{
	const AutoPipeResult *p = &r->pipe;
	char virt[48] = "";
	if (p->virtual_stages > 1)
		snprintf(virt, sizeof virt, " (%d virtual stages a device)", p->virtual_stages);
	printf("step %.6g s scheduled: %d stage%s%s, %s%s%s, %lld microbatches; peak %lld bytes with the activations in "
	       "flight\n", r->step_s, p->stages, p->stages > 1 ? "s" : "", p->stages_auto ? " (stages: auto)" : "",
	       pipe_schedule_names[p->schedule], virt, p->recompute ? " with recompute" : "", (long long)p->microbatches,
	       (long long)r->peak);
	if (p->runner_m)
		printf("runner-up microbatches: %lld, step %.6g s, peak %.0f bytes (this plan)\n", (long long)p->runner_m,
		       p->runner_m_s, p->runner_m_peak);
	if (p->runner_s) {
		char v[32] = "";
		if (p->runner_s_virtual > 1)
			snprintf(v, sizeof v, " (%d virtual stages)", p->runner_s_virtual);
		printf("runner-up schedule: %s%s%s, %lld microbatches, step %.6g s, peak %.0f bytes (this plan)\n",
		       pipe_schedule_names[p->runner_s_schedule], v, p->runner_s_recompute ? ", recompute" : "",
		       (long long)p->runner_s_m, p->runner_s_s, p->runner_s_peak);
	}
	if (p->runner_p)
		printf("runner-up stages: %d with %lld microbatches, step %.6g s, peak %.0f bytes%s (the best plan priced there)\n", p->runner_p,
		       (long long)p->runner_p_m, p->runner_p_s, p->runner_p_peak, p->runner_p_fits ? "" : ", over the budget");
}

static json_t *pipe_json(const AutoPipeResult *p)
{
	json_t *o = json_object();
	json_object_set_new(o, "stages", json_integer(p->stages));
	json_object_set_new(o, "microbatches", json_integer(p->microbatches));
	json_object_set_new(o, "schedule", json_string(pipe_schedule_names[p->schedule]));
	json_object_set_new(o, "virtual_stages", json_integer(p->virtual_stages));
	json_object_set_new(o, "recompute", json_boolean(p->recompute));
	json_object_set_new(o, "stages_auto", json_boolean(p->stages_auto));
	if (p->runner_m) {
		json_object_set_new(o, "runner_up_microbatches", json_integer(p->runner_m));
		json_object_set_new(o, "runner_up_microbatches_step_s", cli_jnum(p->runner_m_s));
		json_object_set_new(o, "runner_up_microbatches_peak_bytes", cli_jnum(p->runner_m_peak));
	}
	if (p->runner_s) {
		json_object_set_new(o, "runner_up_schedule", json_string(pipe_schedule_names[p->runner_s_schedule]));
		json_object_set_new(o, "runner_up_schedule_virtual_stages", json_integer(p->runner_s_virtual));
		json_object_set_new(o, "runner_up_schedule_recompute", json_boolean(p->runner_s_recompute));
		json_object_set_new(o, "runner_up_schedule_microbatches", json_integer(p->runner_s_m));
		json_object_set_new(o, "runner_up_schedule_step_s", cli_jnum(p->runner_s_s));
		json_object_set_new(o, "runner_up_schedule_peak_bytes", cli_jnum(p->runner_s_peak));
	}
	if (p->runner_p) {
		json_object_set_new(o, "runner_up_stages", json_integer(p->runner_p));
		json_object_set_new(o, "runner_up_stages_microbatches", json_integer(p->runner_p_m));
		json_object_set_new(o, "runner_up_stages_step_s", cli_jnum(p->runner_p_s));
		json_object_set_new(o, "runner_up_stages_peak_bytes", cli_jnum(p->runner_p_peak));
		json_object_set_new(o, "runner_up_stages_fits", json_boolean(p->runner_p_fits));
	}
	return o;
}

/* The fewest devices on which the floor (a sum over the devices, r->ndev
 * of them) is within the budget: no plan fits on fewer. */
static int64_t min_devices(const AutoResult *r, const AutoOpts *o)
{
	return (int64_t)ceil((double)r->memory_floor * r->ndev / o->budget);
}

static void print_result(const char *path, const HwProfile *hw, const AutoOpts *o, const AutoResult *r)
{
	char mesh[256];
	mesh_str(r, mesh, sizeof mesh);
	printf("autoshard %s on %s, budget %.0f bytes per device\n", path, hw->name, o->budget);
	if (!r->found) {
		if (r->smallest_peak < 0)
			printf("no plan fits: no plan tried could be priced%s\n", r->cut ? " (the time limit cut the search)" : "");
		else
			printf("no plan fits: the smallest peak found is %lld bytes%s%s\n", (long long)r->smallest_peak,
			       r->smallest_recompute ? ", with the backward recomputing the forward" : "",
			       r->cut ? " (the time limit cut the search)" : "");
		if (r->memory_floor > o->budget)
			printf("nor can one: every plan%s holds at least %lld bytes per device at once (none fits on fewer "
			       "than %lld devices)\n",
			       r->recompute_tried ? ", recomputing the forward or not," : "", (long long)r->memory_floor,
			       (long long)min_devices(r, o));
		else if (r->memory_floor >= 0)
			printf("the floor is %lld bytes per device: a plan within the budget may exist that the search did "
			       "not find\n", (long long)r->memory_floor);
		return;
	}
	printf("mesh %s%s", mesh, r->gather_before_use ? ", all_gather before_use" : "");
	if (r->gather_before_use && r->prefetch == 0)
		printf(", prefetch off");
	else if (r->gather_before_use)
		printf(", prefetch %d weight%s ahead", r->prefetch, r->prefetch == 1 ? "" : "s");
	const char *rec = r->recompute ? "recompute" : "recompute selective";
	if (r->recompute_needed && r->recompute_forced)
		printf(", %s (every plan without recompute holds at least %lld bytes per device)", rec,
		       (long long)r->plain_floor);
	else if (r->recompute_needed)
		printf(", %s (no plan without recompute fits)", rec);
	else if (r->selective)
		printf(", recompute selective (the forward's results cheap for their size made again in the backward)");
	putchar('\n');
	if (r->pipe.stages)
		print_pipe(r);
	else
		printf("step %.6g s overlapped, %.6g s serial; peak %lld bytes\n", r->step_s, r->serial_s, (long long)r->peak);
	if (r->pipe.stages)
		printf("no bound: the compute bound is of the unpipelined step; optimum not proven%s\n",
		       r->cut ? "; the time limit cut the search" : "");
	else if (r->bound_holds)
		printf("bound %.6g s (compute%s), gap %.2f%% (%.2f%% compute above the bound, %.2f%% waiting on "
		       "collectives), %s; %s\n",
		       r->bound, r->recompute_forced ? ", recomputing" : "", 100 * r->gap, 100 * r->gap_compute, 100 * r->gap_exposed,
		       r->proven ? "optimum proven" : "optimum not proven",
	       r->cut          ? "the time limit cut the search"
	       : r->enumerated ? "every plan of its mesh and mode priced"
	       : r->programs_optimal ? "integer programs solved to optimality"
	                             : "integer programs not solved to optimality");
	else
		printf("no bound: the estimate is below the compute bound; optimum not "
		       "proven%s\n", r->cut ? "; the time limit cut the search" : "");
	if (r->layers)
		printf("%ld repeated layers: plans estimated on %s\n", r->layers,
		       r->proxy_layers == 1 ? "one, two and three" : "two, three and four");
	if (r->proxies_failed)
		printf("repeated layers whose proxies estimated no plan (no layer added about the same): every plan priced "
		       "on the whole model\n");
	printf("%d plans estimated, %d priced exactly, %d integer programs", r->evaluations, r->exact, r->solves);
	if (r->solver_failed)
		printf(" (%d stopped by a solver error: their plans were skipped)", r->solver_failed);
	printf("\n\n");
	printf("%-28s %7s  %-32s", "layer kind", "tensors", "chosen");
	if (o->explain)
		printf("  %-32s %12s %14s  %s", "runner-up", "+seconds", "+bytes", "priced");
	printf("\n");
	for (int g = 0; g < r->ngroups; g++) {
		const AutoGroup *a = &r->group[g];
		printf("%-28s %7d  %-32s", a->name, a->members, a->chosen);
		if (o->explain && a->runner[0])
			printf("  %-32s %12.4g %14.0f  %s", a->runner, a->runner_ds, a->runner_dbytes, runner_how(o, a));
		else if (o->explain)
			printf("  %-32s", a->fixed ? "(the user's sharding)" : "(no other)");
		printf("%s\n", a->fixed ? "  [kept]" : "");
	}
}

static json_t *result_json(const HwProfile *hw, const AutoOpts *o, const AutoResult *r)
{
	json_t *j = json_object(), *mesh = json_object(), *kinds = json_array();
	json_object_set_new(j, "hardware", json_string(hw->name));
	json_object_set_new(j, "budget_bytes", json_real(o->budget));
	json_object_set_new(j, "found", json_boolean(r->found));
	json_object_set_new(j, "time_limit_cut", json_boolean(r->cut));
	json_object_set_new(j, "plans_priced", json_integer(r->evaluations));
	json_object_set_new(j, "plans_priced_exactly", json_integer(r->exact));
	json_object_set_new(j, "repeated_layers", json_integer(r->layers));
	json_object_set_new(j, "proxies_failed", json_boolean(r->proxies_failed));
	if (r->layers)
		json_object_set_new(j, "proxy_layers", json_integer(r->proxy_layers));
	json_object_set_new(j, "integer_programs", json_integer(r->solves));
	json_object_set_new(j, "solver_errors", json_integer(r->solver_failed));
	json_object_set_new(j, "recompute", json_boolean(r->recompute));
	json_object_set_new(j, "recompute_forced", json_boolean(r->recompute_forced));
	json_object_set_new(j, "recompute_selective", json_boolean(r->selective));
	if (r->memory_floor >= 0)
		json_object_set_new(j, "memory_floor_bytes", json_integer(r->memory_floor));
	if (r->plain_floor >= 0 && (r->recompute_needed || r->recompute_tried))
		json_object_set_new(j, "memory_floor_without_recompute_bytes", json_integer(r->plain_floor));
	if (!r->found) {
		json_object_set_new(j, "recompute_tried", json_boolean(r->recompute_tried));
		if (r->memory_floor > o->budget)
			json_object_set_new(j, "min_devices", json_integer(min_devices(r, o)));
		if (r->smallest_peak >= 0) {
			json_object_set_new(j, "smallest_peak_bytes", json_integer(r->smallest_peak));
			json_object_set_new(j, "smallest_peak_recompute", json_boolean(r->smallest_recompute));
		}
		json_decref(mesh), json_decref(kinds);
		return j;
	}
	for (int a = 0; a < r->mesh_naxes; a++)
		json_object_set_new(mesh, r->mesh_name[a], json_integer(r->mesh_size[a]));
	json_object_set_new(j, "mesh", mesh);
	json_object_set_new(j, "all_gather", json_string(r->gather_before_use ? "before_use" : "after_update"));
	json_object_set_new(j, "prefetch", json_boolean(r->gather_before_use && r->prefetch > 0));
	json_object_set_new(j, "prefetch_weights", json_integer(r->gather_before_use ? r->prefetch : 0));
	json_object_set_new(j, "step_time_overlapped_s", cli_jnum(r->step_s));
	json_object_set_new(j, "peak_bytes", json_integer(r->peak));
	json_object_set_new(j, "step_time_s", cli_jnum(r->serial_s));
	if (r->pipe.stages) /* step_time_overlapped_s and peak_bytes are then the scheduled step's */
		json_object_set_new(j, "pipeline", pipe_json(&r->pipe));
	json_object_set_new(j, "bound_s", cli_jnum(r->bound));
	json_object_set_new(j, "gap", cli_jnum(r->gap));
	json_object_set_new(j, "compute_busy_s", cli_jnum(r->compute_s));
	json_object_set_new(j, "gap_compute", cli_jnum(r->gap_compute));
	json_object_set_new(j, "gap_exposed", cli_jnum(r->gap_exposed));
	json_object_set_new(j, "proven", json_boolean(r->proven));
	json_object_set_new(j, "bound_holds", json_boolean(r->bound_holds));
	json_object_set_new(j, "integer_programs_optimal", json_boolean(r->programs_optimal));
	json_object_set_new(j, "enumerated", json_boolean(r->enumerated));
	for (int g = 0; g < r->ngroups; g++) {
		const AutoGroup *a = &r->group[g];
		json_t *k = json_object();
		json_object_set_new(k, "kind", json_string(a->name));
		json_object_set_new(k, "tensors", json_integer(a->members));
		json_object_set_new(k, "kept", json_boolean(a->fixed));
		json_object_set_new(k, "chosen", json_string(a->chosen));
		if (a->runner[0]) {
			json_object_set_new(k, "runner_up", json_string(a->runner));
			json_object_set_new(k, "runner_up_extra_s", cli_jnum(a->runner_ds));
			json_object_set_new(k, "runner_up_extra_bytes", cli_jnum(a->runner_dbytes));
			json_object_set_new(k, "runner_up_exact", json_boolean(a->runner_exact));
			json_object_set_new(k, "runner_up_fits", json_boolean(a->runner_fits));
		}
		json_array_append_new(kinds, k);
	}
	json_object_set_new(j, "kinds", kinds);
	return j;
}

/* --time-limit S: a number > 0.  0, or 2 after a usage error. */
static int time_limit(const char *s, double *out)
{
	char *end;
	errno = 0;
	*out = s ? strtod(s, &end) : 0;
	if (s && (errno || end == s || *end || !(*out > 0) || !isfinite(*out))) {
		fprintf(stderr, "spmd autoshard: error: expected --time-limit seconds > 0, found '%s'\n", s);
		return 2;
	}
	return 0;
}

/* Read the options into o (hw from the loaded model, or --hardware).  0, or 2. */
static int options(const CliParse *cp, const char *path, AutoOpts *o, HwProfile *hw, Diag *d)
{
	uint64_t ndev = 0, jobs = 0;
	double mem = 0;
	if (cli_get(cp, O_DEVICES) && cli_get(cp, O_MESH)) {
		fprintf(stderr, "spmd autoshard: error: expected --devices or --mesh, found both\n");
		return 2;
	}
	if ((cli_get(cp, O_DEVICES) && cli_uint("autoshard", "devices", cli_get(cp, O_DEVICES), &ndev) != 0) ||
	    (cli_get(cp, O_MEMORY) && memory_parse("autoshard", cli_get(cp, O_MEMORY), &mem) != 0) ||
	    (cli_get(cp, O_JOBS) && cli_uint("autoshard", "jobs", cli_get(cp, O_JOBS), &jobs) != 0) ||
	    time_limit(cli_get(cp, O_TIME), &o->time_limit) != 0)
		return 2;
	if (cli_get(cp, O_JOBS) && (jobs < 1 || jobs > PARALLEL_MAX)) {
		fprintf(stderr, "spmd autoshard: error: expected --jobs from 1 to %d, found %llu\n", PARALLEL_MAX,
		        (unsigned long long)jobs);
		return 2;
	}
	o->jobs = (int)jobs;
	if (cli_get(cp, O_DEVICES) && (ndev < 1 || ndev > MESH_MAX_DEVICES)) {
		fprintf(stderr, "spmd autoshard: error: expected --devices from 1 to %d, found %llu\n", MESH_MAX_DEVICES,
		        (unsigned long long)ndev);
		return 2;
	}
	Graph g;
	const char *harg = cli_get(cp, O_HARDWARE);
	int rc = model_load(&g, path, d) == 0 && cli_hardware(&g, harg, hw, NULL, d) == 0 ? 0 : 2;
	graph_free(&g);
	if (rc == 0 && harg) { /* the plan names its profile: the passes price the written model as the search did */
		static char abs[PATH_MAX];
		HwProfile b;
		o->hardware = hw_profile_builtin(&b, harg) == 0 || !realpath(harg, abs) ? harg : abs;
	}
	/* the passes price their own choices on it too: without --hardware it
	 * is the model's mesh hardware (else tpu-v3), as for `spmd cost` */
	o->hw = o->pass_hw = hw, o->ndev = (int)ndev, o->mesh = cli_get(cp, O_MESH);
	o->budget = mem ? mem : hw->mem_capacity;
	o->keep_train = cli_flag(cp, O_KEEP), o->per_layer = cli_flag(cp, O_PER_LAYER), o->whole = cli_flag(cp, O_WHOLE);
	o->explain = cli_flag(cp, O_EXPLAIN);
	return rc;
}

static int write_out(const char *out, const AutoResult *r)
{
	if (file_write_atomic(out, r->text, strlen(r->text)) == 0)
		return 0;
	fprintf(stderr, "spmd autoshard: error: expected a file to write, found %s: %s\n", out, strerror(errno));
	return 2;
}

static int run(const CliParse *cp, const char *path)
{
	AutoOpts o = {0};
	HwProfile hw;
	Diag d;
	diag_init(&d);
	int rc = options(cp, path, &o, &hw, &d);
	o.progress = true; /* on stderr, when it is a terminal */
	size_t n;
	char *text = rc == 0 ? file_read(path, &n) : NULL;
	if (rc != 0)
		return rc;
	if (!text) {
		fprintf(stderr, "spmd autoshard: error: expected a readable model, found %s: %s\n", path, strerror(errno));
		return 2;
	}
	const char *out = cli_get(cp, O_OUT);
	if (out && file_writable(out) != 0) { /* before the search, not after it */
		fprintf(stderr, "spmd autoshard: error: expected a file to write, found %s: %s\n", out, strerror(errno));
		free(text);
		return 2;
	}
	AutoResult r;
	double t0 = now_seconds();
	rc = autoshard(text, path, &o, &r, &d) == 0 ? 0 : 2;
	if (rc == 0) {
		fprintf(stderr, "autoshard: searched in %.3f s\n", now_seconds() - t0);
		if (r.found && out)
			rc = write_out(out, &r);
		if (cli_flag(cp, O_JSON)) {
			json_t *j = result_json(&hw, &o, &r);
			json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
			fputc('\n', stdout);
			json_decref(j);
		} else
			print_result(path, &hw, &o, &r);
		if (rc == 0 && !r.found)
			rc = 1;
	}
	autoshard_free(&r);
	free(text);
	return rc;
}

int cmd_autoshard(int argc, char **argv)
{
	static const CliCommand c = {
		"autoshard", "MODEL.yaml",
		"MODEL.yaml (--devices N | --mesh AXES) [--hardware NAME|FILE] [--memory BYTES] [--time-limit S] [-o OUT.yaml] "
		"[--json] [--explain] [--keep-train] [--per-layer] [--whole] [--jobs N]",
		auto_desc, auto_opts, NAUTO_OPTS, run};
	return cli_main(&c, argc, argv);
}
