/* bench_rank.c: does the cost model rank plans the way the thread backend runs them?
 *
 *   bench_rank PROFILE.yaml RUNS MODEL.yaml...
 *   bench_rank --list MODEL.yaml          (the plans: MESH WUS a line, for bench/rank_mpi.sh)
 *
 * For every model, every mesh of 2, 4 and 8 devices over its mesh axes
 * (every ordered product, as spmd explore writes them) and, for a training
 * step, weight-update sharding off and on: partition it, estimate its step
 * on PROFILE (a local profile from spmd calibrate: the thread backend's
 * devices sharing the host's cores) and run it RUNS times on the thread
 * backend (cli/measure.h, cost_run: the wall-clock step of the fastest
 * run).  Prints one row per plan — predicted and measured step and error,
 * predicted and measured peak memory per device (measured: the most bytes
 * a device's tensor buffers held at once, tensor_mem_peak) — then per model
 * Kendall's tau between the predicted and the measured order and the median
 * and worst absolute step error, and the same over all plans.  Plans that
 * cannot be partitioned are skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/measure.h"
#include "../spmd/load.h"
#include "../spmd/train_section.h"

typedef struct {
	char mesh[128];
	int wus;
	double pred, meas;
	int64_t pred_peak, meas_peak;
} Row;

typedef struct {
	Row *a;
	int n, cap;
} Rows;

static double rel(double p, double m) { return m > 0 ? (p - m) / m : 0; }

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Kendall's tau-b between the predicted and the measured steps of r[0..n). */
static double kendall(const Row *r, int n)
{
	double c = 0, dis = 0, tp = 0, tm = 0, pairs = 0;
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) {
			double dp = r[i].pred - r[j].pred, dm = r[i].meas - r[j].meas;
			pairs++;
			tp += dp == 0, tm += dm == 0;
			c += dp * dm > 0, dis += dp * dm < 0;
		}
	double den = sqrt((pairs - tp) * (pairs - tm));
	return den > 0 ? (c - dis) / den : 1;
}

/* Median and largest of |error| over r[0..n) (peak: of the memory). */
static void errors(const Row *r, int n, bool peak, double *median, double *worst)
{
	double *e = xmalloc(sizeof(double) * ((size_t)n + 1));
	for (int i = 0; i < n; i++)
		e[i] = fabs(peak ? rel((double)r[i].pred_peak, (double)r[i].meas_peak) : rel(r[i].pred, r[i].meas));
	qsort(e, (size_t)n, sizeof *e, cmp_double);
	*median = n ? (n % 2 ? e[n / 2] : (e[n / 2 - 1] + e[n / 2]) / 2) : 0;
	*worst = n ? e[n - 1] : 0;
	free(e);
}

/* Estimate and run one plan; false when it cannot be partitioned or run. */
static bool plan(const char *path, const char *mesh, int wus, const HwProfile *hw, int runs, Row *row)
{
	Graph model, prog;
	CostStep st;
	Diag d;
	diag_init(&d);
	d.quiet = true;
	bool ok = cost_prepare_step(path, mesh, wus, &model, &prog, &st, &d) == 0;
	if (ok) {
		CostEstimate e;
		cost_estimate_step(&prog, hw, &st, &e);
		CostRun r;
		ok = cost_run(&model, &prog, runs, &r, &d) == 0;
		*row = (Row){.wus = wus, .pred = e.overlapped_s, .meas = r.step, .pred_peak = e.mem.peak};
		snprintf(row->mesh, sizeof row->mesh, "%s", mesh);
		for (int dev = 0; ok && dev < r.ndev; dev++)
			row->meas_peak = r.peak[dev] > row->meas_peak ? r.peak[dev] : row->meas_peak;
		cost_run_free(&r);
		cost_estimate_free(&e);
	}
	cost_step_free(&st);
	graph_free(&prog), graph_free(&model);
	return ok;
}

/* Every ordered product of n over the axes at..k of g's mesh, each plan run. */
static void meshes(const char *path, const Graph *g, int64_t n, int at, int *size, const HwProfile *hw, int runs,
                   Rows *rows)
{
	if (at < g->mesh.naxes - 1) {
		for (int64_t f = 1; f <= n; f++)
			if (n % f == 0)
				size[at] = (int)f, meshes(path, g, n / f, at + 1, size, hw, runs, rows);
		return;
	}
	size[at] = (int)n;
	char mesh[128];
	size_t k = 0;
	for (int a = 0; a < g->mesh.naxes; a++)
		k += (size_t)snprintf(mesh + k, sizeof mesh - k, "%s%s=%d", a ? "," : "", g->mesh.name[a], size[a]);
	for (int w = g->train ? WUS_OFF : -1; w <= (g->train ? WUS_ON : -1); w++) {
		if (rows->n == rows->cap)
			rows->cap = 2 * rows->cap + 8, rows->a = xrealloc(rows->a, sizeof(Row) * (size_t)rows->cap);
		Row *r = &rows->a[rows->n];
		if (!hw) /* --list: the plan only */
			*r = (Row){.wus = w}, snprintf(r->mesh, sizeof r->mesh, "%s", mesh), rows->n++;
		else if (plan(path, mesh, w, hw, runs, r))
			rows->n++;
	}
}

static void summary(const char *name, const Row *r, int n)
{
	double med, worst, pmed, pworst;
	errors(r, n, false, &med, &worst);
	errors(r, n, true, &pmed, &pworst);
	printf("| %s | %d | %.2f | %.1f%% | %.1f%% | %.1f%% | %.1f%% |\n", name, n, kendall(r, n), 100 * med, 100 * worst,
	       100 * pmed, 100 * pworst);
}

/* --list MODEL: the plans, one a line: MESH WUS (-1: not a training step). */
static int list_plans(const char *path)
{
	Graph g;
	Diag d;
	diag_init(&d);
	if (model_load(&g, path, &d) != 0)
		return 2;
	int size[MESH_MAX_AXES];
	Rows rows = {0};
	for (int n = 2; n <= 8 && g.mesh.naxes; n *= 2)
		meshes(path, &g, n, 0, size, NULL, 0, &rows);
	for (int i = 0; i < rows.n; i++)
		printf("%s %d\n", rows.a[i].mesh, rows.a[i].wus);
	free(rows.a);
	graph_free(&g);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--list") == 0)
		return list_plans(argv[2]);
	if (argc < 4) {
		fprintf(stderr, "usage: bench_rank PROFILE.yaml RUNS MODEL.yaml...\n");
		return 2;
	}
	HwProfile hw;
	Diag d;
	diag_init(&d);
	if (hw_profile_load(&hw, argv[1], &d) != 0)
		return 2;
	int runs = atoi(argv[2]);
	Rows all = {0};
	int *first = xcalloc((size_t)argc + 1, sizeof *first);
	printf("| model | mesh | wus | predicted | measured | error | peak predicted | peak measured | error |\n");
	printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
	for (int m = 3; m < argc; m++) {
		Graph g;
		if (model_load(&g, argv[m], &d) != 0)
			return 2;
		first[m] = all.n;
		int size[MESH_MAX_AXES];
		for (int n = 2; n <= 8 && g.mesh.naxes; n *= 2)
			meshes(argv[m], &g, n, 0, size, &hw, runs, &all);
		for (int i = first[m]; i < all.n; i++) {
			const Row *r = &all.a[i];
			printf("| %s | %s | %s | %.3g ms | %.3g ms | %+.1f%% | %lld | %lld | %+.1f%% |\n", argv[m], r->mesh,
			       r->wus < 0 ? "n/a" : r->wus ? "on" : "off", r->pred * 1e3, r->meas * 1e3, 100 * rel(r->pred, r->meas),
			       (long long)r->pred_peak, (long long)r->meas_peak,
			       100 * rel((double)r->pred_peak, (double)r->meas_peak));
		}
		graph_free(&g);
		fflush(stdout);
	}
	printf("\n| model | plans | Kendall tau | median error | worst error | median peak error | worst peak error |\n");
	printf("| --- | --- | --- | --- | --- | --- | --- |\n");
	for (int m = 3; m < argc; m++)
		summary(argv[m], all.a + first[m], (m + 1 < argc ? first[m + 1] : all.n) - first[m]);
	summary("all plans", all.a, all.n);
	free(all.a), free(first);
	return 0;
}
