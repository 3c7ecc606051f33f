/* autoshard_text.c: a model's YAML written back with a sharding plan in it.
 *
 * The model is written from its parsed tree, key order kept: top-level
 * sections in block style, each entry of inputs, params, ops and train on
 * one line in flow style.  Only the mesh, the `sharding:` of inputs and
 * params, their `weight_update_sharding:`, the `sharding:` of the ops
 * whose results the plan pins, the train: section's two weight-update
 * keys and the pipeline: section's microbatches (and with stages: auto
 * the ops' stage: keys) are replaced; comments are not kept. */
#include "autoshard_text.h"

#include <string.h>

#include "../spmd/pipeline_section.h"
#include "../spmd/train_section.h"

/* True when a plain scalar can be written in flow style as it is. */
static bool flow_safe(const char *s)
{
	return s[0] && !strpbrk(s, ",[]{}#:\"'&*!|>%@`") && s[0] != '-' && s[0] != '?' && s[0] != ' ' &&
	       s[strlen(s) - 1] != ' ';
}

/* s as a flow-style scalar: plain when it reads back as itself, else double-quoted */
static void put_str(FILE *f, const char *s, bool plain)
{
	if (plain) {
		fputs(s, f);
		return;
	}
	fputc('"', f);
	for (const char *c = s; *c; c++) {
		if (*c == '"' || *c == '\\')
			fputc('\\', f);
		if (*c == '\n')
			fputs("\\n", f);
		else
			fputc(*c, f);
	}
	fputc('"', f);
}

static void put_scalar(FILE *f, const YNode *n) { put_str(f, n->str, !n->quoted && (flow_safe(n->str) || ynode_is_number(n))); }

static void put_flow(FILE *f, const YNode *n)
{
	if (n->kind == YN_SCALAR) {
		put_scalar(f, n);
		return;
	}
	fputc(n->kind == YN_SEQ ? '[' : '{', f);
	for (int i = 0; i < n->n; i++) {
		fputs(i ? ", " : "", f);
		if (n->kind == YN_MAP) {
			put_scalar(f, n->keys[i]);
			fputs(": ", f);
		}
		put_flow(f, n->items[i]);
	}
	fputc(n->kind == YN_SEQ ? ']' : '}', f);
}

static void put_spec(FILE *f, const Spec *s, const Mesh *m)
{
	char buf[256];
	spec_format(s, m, buf, sizeof buf);
	fputs(buf, f);
}

static const char *const wus_words[] = {"off", "on", "auto"};

/* One input or param entry: its keys but sharding and
 * weight_update_sharding (and a param's all_gather when the plan sets the
 * train: section's), then the plan's. */
static void put_leaf(FILE *f, const YNode *key, const YNode *v, PlanText *p, bool param)
{
	/* the leaves come in the document's order: look from the last one
	 * found, so writing a plan is linear in the model */
	int k = p->nleaf;
	for (int i = 0; i < p->nleaf && k == p->nleaf; i++) {
		int j = (p->hint + i) % p->nleaf;
		if (!strcmp(p->leaf[j], key->str))
			k = j, p->hint = j + 1;
	}
	fputs("  ", f);
	put_scalar(f, key);
	fputs(": {", f);
	bool first = true;
	for (int i = 0; v->kind == YN_MAP && i < v->n; i++) {
		const char *kk = v->keys[i]->str;
		bool as = k < p->nleaf && p->as_group && p->as_group[k];
		if (k < p->nleaf && ((!as && !strcmp(kk, "sharding")) || !strcmp(kk, "weight_update_sharding")))
			continue;
		if (param && p->set_train && !strcmp(kk, "all_gather")) /* the step's, chosen */
			continue;
		fprintf(f, "%s%s: ", first ? "" : ", ", kk);
		put_flow(f, v->items[i]);
		first = false;
	}
	if (k < p->nleaf) {
		if (!(p->as_group && p->as_group[k])) {
			fprintf(f, "%ssharding: ", first ? "" : ", ");
			put_spec(f, &p->spec[k], p->mesh);
			first = false;
		}
		if (param && p->wus[k])
			fprintf(f, ", weight_update_sharding: %s", wus_words[p->wus[k] - 1]);
		if (param && p->gather && p->gather[k])
			fprintf(f, ", all_gather: %s", ag_names[p->gather[k] - AG_AFTER_UPDATE]);
	}
	fputs("}\n", f);
}

/* The pinned op results by name (the proxies leave some out, so no
 * cursor in order would do): their indices in p->act. */
static void act_index(StrIndex *x, const PlanText *p)
{
	strindex_init(x, (size_t)p->nact);
	for (int i = 0; i < p->nact; i++)
		strindex_put(x, p->act[i], i);
}

/* One op entry, with the plan's sharding in place of its own when the
 * plan pins its result. */
static void put_op(FILE *f, const YNode *op, const PlanText *p, const StrIndex *x)
{
	const YNode *out = op->kind == YN_MAP ? ynode_get(op, "out") : NULL;
	int k = out && out->kind == YN_SCALAR ? strindex_get(x, out->str) : -1;
	fputs("  - ", f);
	if (op->kind != YN_MAP || (k < 0 && !p->stages_auto)) {
		put_flow(f, op);
		fputc('\n', f);
		return;
	}
	/* a pinned result gets the plan's sharding; with stages: auto no op keeps a stage: */
	fputc('{', f);
	const char *sep = "";
	for (int i = 0; i < op->n; i++) {
		const char *key = op->keys[i]->str;
		if ((k >= 0 && !strcmp(key, "sharding")) || (p->stages_auto && !strcmp(key, "stage")))
			continue;
		fputs(sep, f);
		put_scalar(f, op->keys[i]);
		fputs(": ", f);
		put_flow(f, op->items[i]);
		sep = ", ";
	}
	if (k >= 0) {
		fprintf(f, "%ssharding: ", sep);
		put_spec(f, &p->act_spec[k], p->mesh);
	}
	fputs("}\n", f);
}

static void put_mesh(FILE *f, const PlanText *p)
{
	bool long_form = p->mesh_long || p->hardware;
	fputs(long_form ? "mesh: {axes: {" : "mesh: {", f);
	for (int a = 0, n; a < p->mesh->naxes; a += n) { /* as written: an axis cut into pieces (sub-axes) whole */
		char name[256];
		int size;
		n = mesh_written_axis(p->mesh, a, name, sizeof name, &size);
		fprintf(f, "%s%s: %d", a ? ", " : "", name, size);
	}
	fputs(long_form ? "}" : "", f);
	if (p->hardware) {
		fputs(", hardware: ", f);
		put_str(f, p->hardware, flow_safe(p->hardware));
	}
	fputs("}\n", f);
}

static void put_train(FILE *f, const YNode *v, const PlanText *p)
{
	fputs("train:\n", f);
	for (int i = 0; v->kind == YN_MAP && i < v->n; i++) {
		const char *k = v->keys[i]->str;
		if (p->set_train && (!strcmp(k, "weight_update_sharding") || !strcmp(k, "all_gather") || !strcmp(k, "prefetch") ||
		                     (p->train_recompute && !strcmp(k, "recompute"))))
			continue;
		fprintf(f, "  %s: ", k);
		put_flow(f, v->items[i]);
		fputc('\n', f);
	}
	if (p->set_train) {
		fprintf(f, "  weight_update_sharding: off\n  all_gather: %s\n", p->gather_before_use ? "before_use" : "after_update");
		if (p->gather_before_use && p->prefetch == 0)
			fputs("  prefetch: off\n", f);
		else if (p->gather_before_use && p->prefetch != PREFETCH_DEFAULT)
			fprintf(f, "  prefetch: %d\n", p->prefetch);
		if (p->train_recompute)
			fprintf(f, "  recompute: %s\n", p->train_recompute == RECOMPUTE_SELECTIVE ? "selective" : "true");
	}
}

/* The pipeline: section with the plan's microbatches (and stages: auto,
 * and the schedule and recompute it chose). */
static void put_pipeline(FILE *f, const YNode *v, const PlanText *p)
{
	fputs("pipeline: {", f);
	const char *sep = "";
	for (int i = 0; v->kind == YN_MAP && i < v->n; i++) {
		const char *k = v->keys[i]->str;
		if ((p->microbatches > 0 && !strcmp(k, "microbatches")) || (p->stages_auto && !strcmp(k, "stages")) ||
		    (p->set_schedule && (!strcmp(k, "schedule") || !strcmp(k, "virtual_stages"))) ||
		    (p->set_recompute && !strcmp(k, "recompute")))
			continue;
		fprintf(f, "%s%s: ", sep, k);
		put_flow(f, v->items[i]);
		sep = ", ";
	}
	if (p->microbatches > 0)
		fprintf(f, "%smicrobatches: %lld", sep, (long long)p->microbatches), sep = ", ";
	if (p->set_schedule)
		fprintf(f, "%sschedule: %s", sep, pipe_schedule_names[p->schedule]), sep = ", ";
	if (p->set_schedule && p->schedule == PIPE_INTERLEAVED)
		fprintf(f, "%svirtual_stages: %d", sep, p->virtual_stages), sep = ", ";
	if (p->set_recompute)
		fprintf(f, "%srecompute: %s", sep, p->recompute ? "true" : "false"), sep = ", ";
	if (p->stages_auto)
		fprintf(f, "%sstages: auto", sep);
	fputs("}\n", f);
}

/* A top-level section other than the mesh and train. */
static void put_section(FILE *f, const YNode *key, const YNode *v, PlanText *p, const StrIndex *x)
{
	bool leaves = !strcmp(key->str, "inputs") || !strcmp(key->str, "params"), ops = !strcmp(key->str, "ops");
	put_scalar(f, key);
	if (v->kind == YN_SCALAR || v->n == 0) {
		fputs(": ", f);
		put_flow(f, v);
		fputc('\n', f);
		return;
	}
	fputs(":\n", f);
	for (int i = 0; i < v->n; i++) {
		if (leaves && v->kind == YN_MAP)
			put_leaf(f, v->keys[i], v->items[i], p, !strcmp(key->str, "params"));
		else if (ops && v->kind == YN_SEQ)
			put_op(f, v->items[i], p, x);
		else if (v->kind == YN_MAP) {
			fputs("  ", f);
			put_scalar(f, v->keys[i]);
			fputs(": ", f);
			put_flow(f, v->items[i]);
			fputc('\n', f);
		} else {
			fputs("  - ", f);
			put_flow(f, v->items[i]);
			fputc('\n', f);
		}
	}
}

char *plan_text(const YNode *root, PlanText *p)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	bool mesh = false;
	StrIndex x;
	act_index(&x, p);
	for (int i = 0; root && root->kind == YN_MAP && i < root->n; i++) {
		const char *k = root->keys[i]->str;
		if (!strcmp(k, "mesh"))
			put_mesh(f, p), mesh = true;
		else if (!strcmp(k, "train"))
			put_train(f, root->items[i], p);
		else if (!strcmp(k, "pipeline") && (p->microbatches > 0 || p->stages_auto))
			put_pipeline(f, root->items[i], p);
		else {
			if (!mesh && (!strcmp(k, "inputs") || !strcmp(k, "params")))
				put_mesh(f, p), mesh = true; /* a model without a mesh gets one before its leaves */
			put_section(f, root->keys[i], root->items[i], p, &x);
		}
	}
	fclose(f);
	strindex_free(&x);
	return buf;
}

long layer_of(const char *name, size_t *at, size_t *len)
{
	size_t i = strcspn(name, "0123456789"), n = strspn(name + i, "0123456789");
	*at = i, *len = n;
	if (n == 0 || n > 7)
		return -1;
	long k = 0;
	for (size_t j = 0; j < n; j++)
		k = 10 * k + (name[i + j] - '0');
	return k;
}

/* Is name in a layer of r at or after first + keep? */
static bool dropped(const char *name, const LayerRange *r, long keep)
{
	size_t at, len;
	long k = layer_of(name, &at, &len);
	return k >= r->first + keep && k < r->first + r->n;
}

/* A scalar naming a value, renamed to the last layer kept when its layer is left out. */
static void put_ref(FILE *f, const YNode *n, const LayerRange *r, long keep)
{
	size_t at, len;
	if (n->kind != YN_SCALAR || !dropped(n->str, r, keep)) {
		put_flow(f, n);
		return;
	}
	layer_of(n->str, &at, &len);
	fprintf(f, "%.*s%ld%s", (int)at, n->str, r->first + keep - 1, n->str + at + len);
}

/* An op entry with its operands renamed, or nothing when its result is left out. */
static void put_proxy_op(FILE *f, const YNode *op, const LayerRange *r, long keep)
{
	const YNode *out = op->kind == YN_MAP ? ynode_get(op, "out") : NULL;
	if (out && out->kind == YN_SCALAR && dropped(out->str, r, keep))
		return;
	if (op->kind != YN_MAP) {
		fputs("  - ", f), put_flow(f, op), fputc('\n', f);
		return;
	}
	fputs("  - {", f);
	for (int i = 0; i < op->n; i++) {
		fprintf(f, "%s%s: ", i ? ", " : "", op->keys[i]->str);
		const YNode *v = op->items[i];
		if (!strcmp(op->keys[i]->str, "in") && v->kind == YN_SEQ) {
			fputc('[', f);
			for (int k = 0; k < v->n; k++)
				fputs(k ? ", " : "", f), put_ref(f, v->items[k], r, keep);
			fputc(']', f);
		} else
			put_flow(f, v);
	}
	fputs("}\n", f);
}

char *proxy_text(const YNode *root, const LayerRange *r, long keep)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	for (int i = 0; root && root->kind == YN_MAP && i < root->n; i++) {
		const char *k = root->keys[i]->str;
		const YNode *v = root->items[i];
		put_scalar(f, root->keys[i]);
		if (v->kind == YN_SCALAR || v->n == 0) {
			fputs(": ", f), put_flow(f, v), fputc('\n', f);
			continue;
		}
		bool leaves = !strcmp(k, "inputs") || !strcmp(k, "params"), ops = !strcmp(k, "ops"),
		     outs = !strcmp(k, "outputs");
		fputs(":\n", f);
		for (int j = 0; j < v->n; j++) {
			if (ops && v->kind == YN_SEQ)
				put_proxy_op(f, v->items[j], r, keep);
			else if (v->kind == YN_MAP) {
				if (leaves && dropped(v->keys[j]->str, r, keep))
					continue;
				fputs("  ", f), put_scalar(f, v->keys[j]), fputs(": ", f);
				put_flow(f, v->items[j]), fputc('\n', f);
			} else {
				fputs("  - ", f);
				if (outs)
					put_ref(f, v->items[j], r, keep);
				else
					put_flow(f, v->items[j]);
				fputc('\n', f);
			}
		}
	}
	fclose(f);
	return buf;
}
