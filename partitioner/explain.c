/* explain.c: printing propagation results and the chains behind them. */
#include <string.h>

#include "../spmd/ops.h"
#include "../spmd/train_section.h"
#include "propagate.h"

static void pos_format(Pos p, char *buf, size_t n)
{
	snprintf(buf, n, "%s:%d:%d", p.file ? p.file : "?", p.line, p.col);
}

static void axes_format(const Graph *g, const uint8_t *ax, int n, char *buf, size_t len)
{
	int a[MESH_MAX_AXES] = {0};
	char names[100];
	for (int i = 0; i < n; i++)
		a[i] = ax[i];
	mesh_axes_text(&g->mesh, a, n, names, sizeof names);
	if (n == 0)
		snprintf(buf, len, "null");
	else if (!strchr(names, ','))
		snprintf(buf, len, "%s", names);
	else
		snprintf(buf, len, "[%s]", names);
}

/* "; like x in sharding group G" when dims of v came from another member
 * of its group (the first such member), appended at buf[k]. */
static void group_origin(const Graph *g, const Propagation *p, int v, char *buf, size_t len, size_t k)
{
	const Value *val = &g->values.a[v];
	for (int d = 0; d < val->shape.rank && k < len; d++) {
		const Origin *o = &p->origin[v][d];
		if (o->op >= 0 || o->src < 0 || (val->spec.nax[d] == 0 && !(p->closed[v] >> d & 1)))
			continue;
		snprintf(buf + k, len - k, "%slike %s in sharding group %s", k ? "; " : "", g->values.a[o->src].name,
		         val->shard_as);
		return;
	}
}

/* "from x (b) and w1 (f) through einsum at FILE:L:C" for the dims of v that
 * propagation set; the ops are listed once each. */
static void origin_format(const Graph *g, const Propagation *p, int v, char *buf, size_t len)
{
	const Value *val = &g->values.a[v];
	size_t k = 0;
	int ops[MAX_RANK], nops = 0;
	buf[0] = 0;
	for (int d = 0; d < val->shape.rank; d++) {
		const Origin *o = &p->origin[v][d];
		if (o->op < 0 || val->spec.nax[d] == 0)
			continue;
		int seen = 0;
		for (int i = 0; i < nops; i++)
			seen |= ops[i] == o->op;
		if (!seen)
			ops[nops++] = o->op;
	}
	for (int i = 0; i < nops && k < len; i++) {
		const char *sep = "from ";
		k += (size_t)snprintf(buf + k, len - k, "%s", i ? "; " : "");
		bool done[MAX_RANK] = {0};
		for (int d = 0; d < val->shape.rank && k < len; d++) {
			const Origin *o = &p->origin[v][d];
			if (done[d] || o->op != ops[i] || val->spec.nax[d] == 0 || o->src < 0)
				continue;
			k += (size_t)snprintf(buf + k, len - k, "%s%s (", sep, g->values.a[o->src].name);
			sep = " and ";
			const char *comma = "";
			for (int e = d; e < val->shape.rank && k < len; e++) {
				const Origin *q = &p->origin[v][e];
				if (done[e] || q->op != o->op || q->src != o->src || val->spec.nax[e] == 0)
					continue;
				done[e] = true;
				if (q->factor)
					k += (size_t)snprintf(buf + k, len - k, "%s%c", comma, q->factor);
				else
					k += (size_t)snprintf(buf + k, len - k, "%sdim %d", comma, q->dim);
				comma = ", ";
			}
			if (k < len)
				k += (size_t)snprintf(buf + k, len - k, ")");
		}
		char at[256];
		pos_format(g->ops.a[ops[i]].pos, at, sizeof at);
		if (k < len)
			k += (size_t)snprintf(buf + k, len - k, " through %s at %s", op_table[g->ops.a[ops[i]].kind].name, at);
	}
	group_origin(g, p, v, buf, len, k);
}

static void value_line(const Graph *g, const Propagation *p, int v, FILE *out)
{
	const Value *val = &g->values.a[v];
	char spec[256], why[1024], at[256];
	spec_format(&val->spec, &g->mesh, spec, sizeof spec);
	origin_format(g, p, v, why, sizeof why);
	if (val->has_spec && !val->spec_pos.line && g->train) { /* fixed by a pass, not written by the user */
		pos_format(g->train->pos, at, sizeof at);
		fprintf(out, "%-16s %-24s fixed by weight-update sharding (train: at %s)%s%s\n", val->name, spec, at,
		        why[0] ? "; " : "", why);
	} else if (val->has_spec) {
		pos_format(val->spec_pos, at, sizeof at);
		fprintf(out, "%-16s %-24s annotated at %s%s%s\n", val->name, spec, at, why[0] ? "; " : "", why);
	} else if (why[0]) {
		fprintf(out, "%-16s %-24s %s\n", val->name, spec, why);
	} else {
		fprintf(out, "%-16s %-24s %s\n", val->name, spec,
		        val->kind == VK_CONST ? "constant" : "replicated: no sharding reaches it");
	}
}

void propagation_print(const Graph *g, const Propagation *p, FILE *out)
{
	for (int v = 0; v < g->values.n; v++)
		if (g->values.a[v].kind != VK_CONST)
			value_line(g, p, v, out);
	if (p->conflicts.n)
		fprintf(out, "\n%d conflict%s resolved (spmd propagate --explain NAME tells more)\n", p->conflicts.n,
		        p->conflicts.n == 1 ? "" : "s");
}

static void conflict_line(const Graph *g, const Conflict *c, FILE *out)
{
	static const char *rule[] = {
		[CONFLICT_USER] = "an annotation beats an inferred sharding",
		[CONFLICT_BYTES] = "the losing tensor is the cheaper to reshard (cost model; fewer bytes)",
		[CONFLICT_AXES] = "equal sizes: the split over more devices wins",
		[CONFLICT_ORDER] = "equal sizes and splits: the earlier mesh axis wins",
	};
	char w[128], l[128], at[256], factor[32];
	axes_format(g, c->win_axes, c->nwin, w, sizeof w);
	axes_format(g, c->lose_axes, c->nlose, l, sizeof l);
	pos_format(g->ops.a[c->op].pos, at, sizeof at);
	if (c->factor)
		snprintf(factor, sizeof factor, "factor %c", c->factor);
	else
		snprintf(factor, sizeof factor, "dim %d of %s", c->win_dim, g->values.a[c->winner].name);
	fprintf(out, "  conflict at %s (%s) over %s: %s from %s (%lld bytes) beat %s from %s (%lld bytes): %s\n", at,
	        op_table[g->ops.a[c->op].kind].name, factor, w, g->values.a[c->winner].name, (long long)c->win_bytes, l,
	        g->values.a[c->loser].name, (long long)c->lose_bytes, rule[c->rule]);
}

/* With priorities: the round that decided each split or fixed dim of v. */
static void priority_line(const Graph *g, const Propagation *p, int v, FILE *out)
{
	const Value *val = &g->values.a[v];
	const char *sep = "  decided at";
	for (int d = 0; p->max_priority && d < val->shape.rank; d++)
		if (val->spec.nax[d] || (p->closed[v] >> d & 1)) {
			fprintf(out, "%s dim %d: priority %d", sep, d, p->origin[v][d].prio);
			sep = ",";
		}
	if (sep[0] == ',')
		fprintf(out, "\n");
}

void propagation_explain(const Graph *g, const Propagation *p, int v, FILE *out)
{
	char *seen = xcalloc((size_t)g->values.n + 1, 1);
	int *stack = xmalloc(sizeof(int) * ((size_t)g->values.n + 1));
	int n = 0;
	stack[n++] = v;
	seen[v] = 1;
	while (n) {
		int u = stack[--n];
		value_line(g, p, u, out);
		priority_line(g, p, u, out);
		for (int d = 0; d < g->values.a[u].shape.rank; d++) {
			int s = p->origin[u][d].src;
			if (s >= 0 && !seen[s] && g->values.a[u].spec.nax[d])
				seen[s] = 1, stack[n++] = s;
		}
	}
	for (int i = 0; i < p->conflicts.n; i++) {
		const Conflict *c = &p->conflicts.a[i];
		if (seen[c->winner] || seen[c->loser])
			conflict_line(g, c, out);
	}
	free(stack);
	free(seen);
}
