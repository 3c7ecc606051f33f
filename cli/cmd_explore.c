/* cmd_explore.c: `spmd explore MODEL.yaml --devices N` — every mesh shape for N devices, ranked by estimated step time. */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "../base/progress.h"
#include "commands.h"
#include "../spmd/load.h"
#include "../train/train.h"
#include "../cost_model/cost.h"
#include "measure.h"
#include "pipeline_report.h"
#include "../partitioner/autoshard.h"


enum { O_DEVICES, O_HARDWARE, O_JSON, O_SEARCH, O_TIME_LIMIT, O_MAX_PLANS, NEXP_OPTS };

static const CliOpt exp_opts[NEXP_OPTS] = {
	[O_DEVICES] = {"devices", "N", "the number of devices to spread the model's mesh axes over (required)"},
	[O_HARDWARE] = {"hardware", "NAME|FILE", "hardware profile (default: the model's mesh hardware, else tpu-v3)"},
	[O_JSON] = {"json", NULL, "print the plans as JSON"},
	[O_SEARCH] = {"search", NULL, "also auto-shard every mesh shape (spmd autoshard) and show its plan beside"},
	[O_TIME_LIMIT] = {"time-limit", "SECONDS", "stop trying plans after this long (default 30); the best found is shown"},
	[O_MAX_PLANS] = {"max-plans", "N", "try at most N plans (default: no limit but the time)"},
};

static const char exp_desc[] =
	"Try every way of writing N as a product of the model's mesh axis sizes\n"
	"(in the model's axis order) and, for a model with a train: section,\n"
	"weight-update sharding on and off; partition the model for each and\n"
	"estimate its step on the hardware profile; rank the plans that fit in\n"
	"memory by estimated step time (communication overlapped; a model with\n"
	"a pipeline: section by its scheduled step, with the best microbatch\n"
	"count for each mesh: docs/pipeline.md).  With\n"
	"--search, each mesh shape is also auto-sharded (docs/autoshard.md) and\n"
	"its plan's overlapped step time and peak are shown beside.  The search\n"
	"stops at --time-limit (checked between plans) or --max-plans and says\n"
	"how many plans it skipped.";

typedef struct {
	int size[MESH_MAX_AXES];
	int wus;            /* WUS_OFF, WUS_ON, or -1: no train: section */
	bool ok;            /* partitioned */
	bool pruned;        /* not partitioned: its memory floor is over the capacity and a plan that fits exists */
	int64_t floor;      /* pruned: the floor (cost_memory_floor, times the devices on a local profile) */
	char err[512];      /* why not */
	double serial, overlapped, compute, comm;
	int64_t peak;
	bool fits;
	bool searched, auto_found; /* --search: autoshard ran on this mesh; found a plan that fits */
	double auto_s;             /* its overlapped step time */
	int64_t auto_peak;
	char auto_err[512];        /* why autoshard could not search this mesh ("": it searched) */
	PipeBest pipe;             /* a pipelined model: the best microbatch count and its scheduled step */
	double rank_s;             /* what plans are ranked by: the scheduled step of a pipeline, else overlapped */
} Plan;

typedef VEC(Plan) PlanVec;

/* Plan p's mesh as written, "data=2,model=4": an axis the model cut into
 * pieces (sub-axes) by its whole name and size. */
static void mesh_text(const Graph *g, const Plan *p, char *buf, size_t n)
{
	Mesh m = g->mesh;
	memcpy(m.size, p->size, sizeof m.size);
	mesh_format(&m, buf, n);
}

static void try_plan(const char *path, const Graph *model, const HwProfile *hw, Plan *p)
{
	char mesh[256];
	mesh_text(model, p, mesh, sizeof mesh);
	Graph g, prog;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	CostStep step;
	if (cost_prepare_step(path, mesh, p->wus, &g, &prog, &step, &d) == 0) {
		CostEstimate e;
		cost_estimate_step(&prog, hw, &step, &e); /* ranked on the steady state of a long run */
		*p = (Plan){.wus = p->wus, .ok = true, .serial = e.serial_s, .overlapped = e.overlapped_s,
		            .compute = e.compute_s, .comm = e.comm_s, .peak = e.mem.peak, .fits = e.fits,
		            .rank_s = e.overlapped_s};
		memcpy(p->size, prog.mesh.size, sizeof p->size);
		/* a pipeline: a device holds its stages' params and the activations in
		 * flight, not the replicated program's peak; the fastest count within
		 * the capacity (on a local profile the devices share it, as for fits) */
		double cap = hw->mem_capacity / (hw->topo == TOPO_THREADS ? (double)prog.mesh.ndev : 1);
		if (g.pipeline && cost_pipeline_best(&g, &prog, hw, &e, cap, false, 0, &p->pipe) == 0)
			p->rank_s = p->pipe.step_s, p->peak = (int64_t)p->pipe.peak, p->fits = p->pipe.peak <= cap;
		else if (g.pipeline) {
			p->ok = false;
			snprintf(p->err, sizeof p->err, "no microbatch count that the batch and the schedule allow");
		}
		cost_estimate_free(&e);
	} else
		snprintf(p->err, sizeof p->err, "%s", d.last[0] ? d.last : "cannot partition");
	cost_step_free(&step);
	graph_free(&prog);
	graph_free(&g);
}

/* --search: auto-shard the model on p's mesh, in budget of hw's capacity. */
static void search_plan(const char *path, const char *text, const Graph *model, const HwProfile *hw, Plan *p)
{
	char mesh[256];
	mesh_text(model, p, mesh, sizeof mesh);
	AutoOpts o = {.hw = hw, .pass_hw = hw, .budget = hw->mem_capacity, .mesh = mesh}; /* as spmd autoshard --hardware */
	AutoResult r;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	p->searched = true;
	if (autoshard(text, path, &o, &r, &d) != 0)
		snprintf(p->auto_err, sizeof p->auto_err, "%s", d.last[0] ? d.last : "cannot search");
	else if (r.found)
		p->auto_found = true, p->auto_s = r.step_s, p->auto_peak = r.peak;
	autoshard_free(&r);
}

/* The number of ordered factorizations of n into k factors: per prime p^e
 * of n, C(e + k - 1, k - 1) ways to spread e over k factors. */
static double count_factorizations(int64_t n, int k)
{
	double total = 1;
	for (int64_t p = 2; n > 1; p++) {
		if (p * p > n)
			p = n;
		int e = 0;
		for (; n % p == 0; n /= p)
			e++;
		for (int i = 1; i <= e; i++)
			total = total * (k - 1 + i) / i;
	}
	return total;
}

typedef struct {
	const char *path;
	const Graph *model;
	const HwProfile *hw;
	PlanVec plans;    /* those tried */
	double total;     /* plans in all */
	double t0, limit; /* start, --time-limit */
	uint64_t max;     /* --max-plans */
	const char *stop; /* why the search stopped early, or NULL */
	const char *text; /* --search: the model's text, else NULL */
	bool fit_found;   /* some plan tried fits: plans that cannot fit are provably worse */
	int pruned;       /* plans pruned by their memory floor */
	Progress bar;
} Search;

/* The memory floor of mesh `size` with weight-update sharding w (-1: the
 * model does not train): cost_memory_floor of the model loaded on that
 * mesh, per device, times the devices on a local profile (the rule of
 * `fits`); -1 when the model does not load on it. */
static int64_t plan_floor(const Search *S, const int *size, int w)
{
	Plan p = {.wus = w};
	memcpy(p.size, size, sizeof p.size);
	char mesh[256];
	mesh_text(S->model, &p, mesh, sizeof mesh);
	Graph g;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	LoadOpts o = {mesh, NULL};
	int64_t floor = -1;
	if (model_load_opts(&g, S->path, &o, &d) == 0) {
		floor = cost_memory_floor(&g, w == WUS_ON);
		if (S->hw->topo == TOPO_THREADS)
			floor *= g.mesh.ndev;
	}
	graph_free(&g);
	return floor;
}

/* Try the plans of one mesh (weight-update sharding off and on when the
 * model trains); false once the search must stop.  Once a plan fits, a
 * plan whose memory floor is over the capacity cannot rank above it: it is
 * pruned (listed, not partitioned). */
static bool visit(Search *S, const int *size)
{
	bool train = S->model->train != NULL;
	for (int w = train ? WUS_OFF : -1; w <= (train ? WUS_ON : -1); w++) {
		if ((uint64_t)S->plans.n >= S->max)
			S->stop = "--max-plans";
		else if (S->plans.n > 0 && now_seconds() - S->t0 >= S->limit) /* at least one plan */
			S->stop = "--time-limit";
		if (S->stop)
			return false;
		Plan p = {.wus = w};
		memcpy(p.size, size, sizeof p.size);
		/* the floor is of the model with every stage on every device: no floor of a pipeline's */
		int64_t floor = S->fit_found && !S->model->pipeline ? plan_floor(S, size, w) : -1;
		if (floor > S->hw->mem_capacity) {
			p.pruned = true, p.floor = floor, S->pruned++;
			vec_push(&S->plans, p);
			progress_set(&S->bar, S->plans.n);
			continue;
		}
		try_plan(S->path, S->model, S->hw, &p);
		S->fit_found |= p.ok && p.fits;
		if (S->text && p.wus <= WUS_OFF) /* one search per mesh: the first plan of it */
			search_plan(S->path, S->text, S->model, S->hw, &p);
		vec_push(&S->plans, p);
		progress_set(&S->bar, S->plans.n);
	}
	return true;
}

/* Visit every ordered factorization of n into k factors (in the model's axis
 * order, lexicographically) until the search stops. */
static bool factorize(Search *S, int64_t n, int k, int at, int *size)
{
	const Mesh *m = &S->model->mesh;
	if (at == k)
		return n != 1 || visit(S, size);
	if (m->pre[at] > 0) { /* a piece of an axis the annotations cut (a sub-axis): its size is its name's */
		size[at] = m->size[at];
		return n % m->size[at] != 0 || factorize(S, n / m->size[at], k, at + 1, size);
	}
	for (int64_t f = 1; f <= n; f++)
		if (n % f == 0) {
			size[at] = (int)f;
			if (!factorize(S, n / f, k, at + 1, size))
				return false;
		}
	return true;
}

/* Fitting plans first, by overlapped step time; then the rest. */
static int plan_cmp(const void *a, const void *b)
{
	const Plan *x = a, *y = b;
	int rx = x->ok ? (x->fits ? 0 : 1) : x->pruned ? 2 : 3, ry = y->ok ? (y->fits ? 0 : 1) : y->pruned ? 2 : 3;
	if (rx != ry)
		return rx - ry;
	if (!x->ok)
		return 0;
	return x->rank_s < y->rank_s ? -1 : x->rank_s > y->rank_s;
}

static const char *wus_text(int w) { return w == WUS_ON ? "on" : w == WUS_OFF ? "off" : "n/a"; }

static void print_table(const Graph *g, const HwProfile *hw, const Plan *p, int n, int64_t ndev)
{
	printf("explore %s on %lld devices, hardware %s%s\n\n", g->name ? g->name : "(unnamed)", (long long)ndev,
	       hw->name, g->train ? "" : "; weight-update sharding: n/a (the model has no train: section)");
	printf("%4s  %-28s %-4s %14s %14s %12s %12s %12s  %s\n", "rank", "mesh", "wus", "step (s)", "overlapped (s)",
	       "compute (s)", "comm (s)", "peak (B)", "fits");
	for (int i = 0; i < n; i++) {
		char mesh[256];
		mesh_text(g, &p[i], mesh, sizeof mesh);
		if (p[i].pruned) {
			printf("%4s  %-28s %-4s pruned: cannot fit, its annotated params and inputs alone need %lld B\n", "-",
			       mesh, wus_text(p[i].wus), (long long)p[i].floor);
			continue;
		}
		if (!p[i].ok) {
			printf("%4s  %-28s %-4s cannot partition: %s\n", "-", mesh, wus_text(p[i].wus), p[i].err);
			continue;
		}
		char rank[16] = "-";
		if (p[i].fits)
			snprintf(rank, sizeof rank, "%d", i + 1);
		printf("%4s  %-28s %-4s %14.4g %14.4g %12.4g %12.4g %12lld  %-4s", rank, mesh, wus_text(p[i].wus),
		       p[i].serial, p[i].overlapped, p[i].compute, p[i].comm, (long long)p[i].peak, p[i].fits ? "yes" : "NO");
		if (p[i].pipe.microbatches)
			printf("  pipelined: %.4g s with %lld microbatches, bubble %.1f%%", p[i].pipe.step_s,
			       (long long)p[i].pipe.microbatches, 100 * p[i].pipe.bubble_fraction);
		if (p[i].searched && p[i].auto_found)
			printf("  auto: %.4g s, peak %lld", p[i].auto_s, (long long)p[i].auto_peak);
		else if (p[i].searched && p[i].auto_err[0])
			printf("  auto: %s", p[i].auto_err);
		else if (p[i].searched)
			printf("  auto: no plan fits");
		printf("\n");
	}
}

static json_t *pipe_best_json(const PipeBest *b)
{
	json_t *o = json_object();
	json_object_set_new(o, "microbatches", json_integer(b->microbatches));
	json_object_set_new(o, "step_time_s", cli_jnum(b->step_s));
	json_object_set_new(o, "bubble_fraction", cli_jnum(b->bubble_fraction));
	json_object_set_new(o, "peak_bytes", cli_jnum(b->peak));
	return o;
}

static json_t *plans_json(const Graph *g, const HwProfile *hw, const Plan *p, int n, int64_t ndev)
{
	json_t *root = json_object(), *arr = json_array();
	json_object_set_new(root, "devices", json_integer(ndev));
	json_object_set_new(root, "hardware", json_string(hw->name));
	for (int i = 0; i < n; i++) {
		json_t *o = json_object(), *mesh = json_object();
		Mesh m = g->mesh;
		memcpy(m.size, p[i].size, sizeof m.size);
		for (int a = 0, r; a < m.naxes; a += r) { /* as written, as mesh_text */
			char name[128];
			int size;
			r = mesh_written_axis(&m, a, name, sizeof name, &size);
			json_object_set_new(mesh, name, json_integer(size));
		}
		json_object_set_new(o, "mesh", mesh);
		json_object_set_new(o, "weight_update_sharding", p[i].wus < 0 ? json_null() : json_boolean(p[i].wus == WUS_ON));
		json_object_set_new(o, "partitioned", json_boolean(p[i].ok));
		json_object_set_new(o, "pruned", json_boolean(p[i].pruned));
		if (p[i].pruned)
			json_object_set_new(o, "memory_floor_bytes", json_integer(p[i].floor));
		else if (!p[i].ok)
			json_object_set_new(o, "error", json_string(p[i].err));
		else {
			json_object_set_new(o, "rank", p[i].fits ? json_integer(i + 1) : json_null());
			json_object_set_new(o, "step_time_s", cli_jnum(p[i].serial));
			json_object_set_new(o, "step_time_overlapped_s", cli_jnum(p[i].overlapped));
			json_object_set_new(o, "compute_s", cli_jnum(p[i].compute));
			json_object_set_new(o, "communication_s", cli_jnum(p[i].comm));
			json_object_set_new(o, "peak_bytes", json_integer(p[i].peak));
			json_object_set_new(o, "fits", json_boolean(p[i].fits));
			if (p[i].pipe.microbatches)
				json_object_set_new(o, "pipeline", pipe_best_json(&p[i].pipe));
		}
		if (p[i].searched) {
			json_t *a = json_object();
			json_object_set_new(a, "found", json_boolean(p[i].auto_found));
			if (p[i].auto_err[0])
				json_object_set_new(a, "error", json_string(p[i].auto_err));
			if (p[i].auto_found) {
				json_object_set_new(a, "step_time_overlapped_s", cli_jnum(p[i].auto_s));
				json_object_set_new(a, "peak_bytes", json_integer(p[i].auto_peak));
			}
			json_object_set_new(o, "autoshard", a);
		}
		json_array_append_new(arr, o);
	}
	json_object_set_new(root, "plans", arr);
	return root;
}

static int explore(const CliParse *cp, const char *path)
{
	uint64_t ndev = 0;
	if (!cli_get(cp, O_DEVICES)) {
		fprintf(stderr, "spmd explore: error: expected --devices N, found none (see spmd explore --help)\n");
		return 2;
	}
	if (cli_uint("explore", "devices", cli_get(cp, O_DEVICES), &ndev) != 0)
		return 2;
	if (ndev < 1 || ndev > MESH_MAX_DEVICES) {
		fprintf(stderr, "spmd explore: error: expected --devices from 1 to %d, found %llu\n", MESH_MAX_DEVICES,
		        (unsigned long long)ndev);
		return 2;
	}
	Graph model;
	Diag d;
	diag_init(&d);
	HwProfile hw;
	int rc = model_load(&model, path, &d) == 0 && cli_hardware(&model, cli_get(cp, O_HARDWARE), &hw, NULL, &d) == 0 ? 0 : 2;
	if (rc == 0 && model.mesh.naxes == 0) {
		diag_error(&d, (Pos){path, 1, 1}, "expected a model with a mesh (explore sizes its axes; "
		           "`mesh: {data: 1, model: 1}` names two), found none; spmd autoshard --devices N chooses "
		           "axes and sizes");
		rc = 2;
	}
	if (rc != 0) {
		graph_free(&model);
		return rc;
	}
	Search S = {.path = path, .model = &model, .hw = &hw, .t0 = now_seconds(), .limit = 30, .max = UINT64_MAX};
	if ((cli_get(cp, O_TIME_LIMIT) && cli_seconds("explore", "time-limit", cli_get(cp, O_TIME_LIMIT), &S.limit)) ||
	    (cli_get(cp, O_MAX_PLANS) && cli_uint("explore", "max-plans", cli_get(cp, O_MAX_PLANS), &S.max))) {
		graph_free(&model);
		return 2;
	}
	int pieces = mesh_pieces_size(&model.mesh), free_axes = 0; /* the pieces keep their sizes */
	for (int a = 0; a < model.mesh.naxes; a++)
		free_axes += model.mesh.pre[a] == 0;
	S.total = ndev % (uint64_t)pieces ? 0
	                                  : count_factorizations((int64_t)ndev / pieces, free_axes) * (model.train ? 2 : 1);
	int size[MESH_MAX_AXES] = {0};
	size_t len;
	char *text = cli_flag(cp, O_SEARCH) ? file_read(path, &len) : NULL;
	S.text = text;
	progress_begin(&S.bar, "explore", (int64_t)(S.total < 1e9 ? S.total : 1e9), "plans");
	factorize(&S, (int64_t)ndev, model.mesh.naxes, 0, size);
	progress_end(&S.bar);
	if (S.plans.n == 0) {
		fprintf(stderr, "spmd explore: error: expected --devices a multiple of %d (the axes the model's sub-axis "
		        "annotations cut keep their sizes), found %llu\n", pieces, (unsigned long long)ndev);
		free(text), vec_free(&S.plans), graph_free(&model);
		return 2;
	}
	free(text);
	PlanVec plans = S.plans;
	qsort(plans.a, (size_t)plans.n, sizeof *plans.a, plan_cmp);
	if (cli_flag(cp, O_JSON)) {
		json_t *j = plans_json(&model, &hw, plans.a, plans.n, (int64_t)ndev);
		json_object_set_new(j, "plans_total", json_real(S.total));
		json_object_set_new(j, "plans_skipped", json_real(S.total - plans.n));
		json_object_set_new(j, "plans_pruned", json_integer(S.pruned));
		json_object_set_new(j, "stopped_by", S.stop ? json_string(S.stop) : json_null());
		json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
		fputc('\n', stdout);
		json_decref(j);
	} else
		print_table(&model, &hw, plans.a, plans.n, (int64_t)ndev);
	fflush(stdout);
	if (S.pruned)
		fprintf(stderr, "spmd explore: note: pruned %d plan%s that cannot fit in %lld bytes per device (their "
		        "annotated params and inputs alone need more) without partitioning them: a plan that fits "
		        "ranks above them\n", S.pruned, S.pruned == 1 ? "" : "s", (long long)hw.mem_capacity);
	if (S.stop)
		fprintf(stderr, "spmd explore: note: tried %d of %.0f plans; skipped %.0f (%s reached after %.1f s); "
		        "the best of those tried is shown\n", plans.n, S.total, S.total - plans.n,
		        strcmp(S.stop, "--max-plans") == 0 ? "--max-plans" : "the time limit", now_seconds() - S.t0);
	vec_free(&plans);
	graph_free(&model);
	return 0;
}

int cmd_explore(int argc, char **argv)
{
	static const CliCommand c = {"explore", "MODEL.yaml", "MODEL.yaml --devices N [--hardware NAME|FILE] [--search] [--time-limit S] [--max-plans N] [--json]", exp_desc, exp_opts, NEXP_OPTS, explore};
	return cli_main(&c, argc, argv);
}
