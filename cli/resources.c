/* resources.c: memory a run needs (the cost model's liveness) against memory available. */
#include "resources.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../cost_model/cost.h"

double memory_available(void)
{
	double avail = 0;
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	while (f && fgets(line, sizeof line, f))
		if (strncmp(line, "MemAvailable:", 13) == 0)
			avail = strtod(line + 13, NULL) * 1024;
	if (f)
		fclose(f);
	if (avail <= 0)
		avail = 1e18; /* unknown: allocation failures still end in an error */
	int which[2] = {RLIMIT_AS, RLIMIT_DATA};
	for (int i = 0; i < 2; i++) {
		struct rlimit r;
		if (getrlimit(which[i], &r) == 0 && r.rlim_cur != RLIM_INFINITY && (double)r.rlim_cur < avail)
			avail = (double)r.rlim_cur;
	}
	return avail;
}

/* The multiple a unit after a number of bytes stands for: k, M, G, T
 * (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024), each with an
 * optional B, or B alone, in either case; 0 when u is none of them. */
static double unit_of(const char *u)
{
	static const char prefix[] = "kmgt";
	double scale = 1;
	const char *p = *u ? strchr(prefix, tolower((unsigned char)*u)) : NULL;
	if (p) {
		bool bin = u[1] == 'i' || u[1] == 'I';
		for (int k = 0; k <= p - prefix; k++)
			scale *= bin ? 1024 : 1000;
		u += 1 + bin;
	}
	if (*u == 'B' || *u == 'b')
		u++;
	return *u ? 0 : scale;
}

int memory_parse(const char *cmd, const char *s, double *out)
{
	char *end;
	double v = strtod(s, &end), scale = end == s ? 0 : unit_of(end);
	v *= scale;
	if (!*s || !scale || !(v >= 1e3 && v <= 1e18)) {
		fprintf(stderr,
		        "spmd %s: error: expected a number of bytes from 1000 to 1e18 after --memory (8e9, 16GB, 16GiB), "
		        "found '%s'\n", cmd, s);
		return 2;
	}
	*out = v;
	return 0;
}

static double value_bytes(const Value *v) { return (double)shape_numel(&v->shape) * dtype_size(v->dtype); }

/* "w1 (f32 [512, 2048], 4194304 bytes, at m.yaml:5:3)" for the n largest values of g. */
static void largest(const Graph *g, int n, char *buf, size_t cap, int *top)
{
	size_t len = 0;
	buf[0] = 0;
	bool *taken = xcalloc((size_t)g->values.n + 1, 1);
	for (int k = 0; k < n; k++) {
		int best = -1;
		for (int v = 0; v < g->values.n; v++)
			if (!taken[v] && (best < 0 || value_bytes(&g->values.a[v]) > value_bytes(&g->values.a[best])))
				best = v;
		if (best < 0)
			break;
		taken[best] = true;
		if (k == 0)
			*top = best;
		const Value *v = &g->values.a[best];
		char shape[128];
		shape_format(&v->shape, shape, sizeof shape);
		if (len < cap)
			len += (size_t)snprintf(buf + len, cap - len, "%s%s (%s %s, %.0f bytes, at %s:%d:%d)", k ? ", " : "",
			                        v->name, dtype_names[v->dtype], shape, value_bytes(v),
			                        v->pos.file ? v->pos.file : "?", v->pos.line, v->pos.col);
	}
	free(taken);
}

int memory_check(const Graph *prog, int ndev, const Graph *ref, double avail, Diag *d)
{
	MemoryEstimate m = {0}, r = {0};
	if (prog)
		cost_memory(prog, &m);
	if (ref)
		cost_memory(ref, &r);
	double need = (double)m.peak * ndev + (double)r.peak;
	if (need <= avail)
		return 0;
	const Graph *g = prog && (double)m.peak * ndev >= (double)r.peak ? prog : ref;
	char names[768];
	int top = 0;
	largest(g, 3, names, sizeof names, &top);
	char what[160];
	if (prog && ref)
		snprintf(what, sizeof what, "%d device%s x %lld bytes and the reference's %lld bytes", ndev, ndev == 1 ? "" : "s",
		         (long long)m.peak, (long long)r.peak);
	else if (prog)
		snprintf(what, sizeof what, "%d device%s x %lld bytes", ndev, ndev == 1 ? "" : "s", (long long)m.peak);
	else
		snprintf(what, sizeof what, "the reference executor's %lld bytes", (long long)r.peak);
	diag_error(d, g->values.n ? g->values.a[top].pos : (Pos){g->file, 1, 1},
	           "expected a run that fits in the %.0f bytes of memory available (--memory), found a peak of %.0f bytes "
	           "(%s, by liveness); the largest tensors%s: %s",
	           avail, need, what, g == prog ? " per device" : "", names);
	return 2;
}
