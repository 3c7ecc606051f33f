/* yaml.c: the YAML reader — libyaml's event stream to a tree of positioned nodes, and scalar readers.
 *
 * The tree is built from events (yaml_parser_parse), not from libyaml's
 * document API, so that every node keeps the line and column it starts at and
 * so that anchors, aliases and tags can be refused instead of expanded (an
 * alias bomb then costs nothing).  Nesting is limited to YAML_MAX_DEPTH so a
 * hostile file cannot exhaust the stack.  Positions point at the name string
 * given to the parse functions, which must outlive the nodes. */
#include "yaml.h"

#include <yaml.h>

#include <errno.h>
#include <math.h>
#include <string.h>

enum { YAML_MAX_DEPTH = 64 };

typedef struct {
	yaml_parser_t p;
	YDoc *doc;
	Diag *d;
	const char *text; /* the whole input, for positions of reader errors */
	size_t len;
	int nerr;         /* errors after which building went on */
} Builder;

static Pos mark_pos(const Builder *b, yaml_mark_t m)
{
	return (Pos){b->doc->file, (int)m.line + 1, (int)m.column + 1};
}

/* Position of a byte offset, for reader errors (which carry no mark). */
static Pos offset_pos(const Builder *b, size_t off)
{
	Pos p = {b->doc->file, 1, 1};
	for (size_t i = 0; i < off && i < b->len; i++) {
		if (b->text[i] == '\n')
			p.line++, p.col = 1;
		else if (((unsigned char)b->text[i] & 0xC0) != 0x80)
			p.col++;
	}
	return p;
}

/* Turn libyaml's failure into FILE:LINE:COL: error: expected valid YAML, found .... */
static void report_parser_error(Builder *b)
{
	yaml_parser_t *p = &b->p;
	if (p->error == YAML_MEMORY_ERROR) {
		diag_error(b->d, (Pos){b->doc->file, 0, 0}, "expected valid YAML, found a file too large to parse (out of memory)");
		return;
	}
	if (p->error == YAML_READER_ERROR) {
		Pos pos = offset_pos(b, p->problem_offset);
		if (p->problem_value != -1)
			diag_error(b->d, pos, "expected valid YAML, found %s (#%X)", p->problem, (unsigned)p->problem_value);
		else
			diag_error(b->d, pos, "expected valid YAML, found %s", p->problem);
		return;
	}
	Pos pos = mark_pos(b, p->problem_mark);
	const char *problem = p->problem ? p->problem : "a syntax error";
	if (p->context)
		diag_error(b->d, pos, "expected valid YAML, found a syntax error: %s (%s at %d:%d)", problem, p->context,
		           (int)p->context_mark.line + 1, (int)p->context_mark.column + 1);
	else
		diag_error(b->d, pos, "expected valid YAML, found a syntax error: %s", problem);
}

/* Next event into *ev; -1 after reporting a parse error. */
static int next_event(Builder *b, yaml_event_t *ev)
{
	if (yaml_parser_parse(&b->p, ev))
		return 0;
	report_parser_error(b);
	return -1;
}

static YNode *new_node(Builder *b, YKind k, yaml_mark_t m)
{
	YNode *n = arena_alloc(&b->doc->arena, sizeof *n);
	n->kind = k;
	n->pos = mark_pos(b, m);
	return n;
}

/* Refuse an anchor or a tag on a node (the node is still built). */
static void refuse_decorations(Builder *b, const yaml_event_t *ev, const yaml_char_t *anchor, const yaml_char_t *tag)
{
	Pos pos = mark_pos(b, ev->start_mark);
	if (anchor) {
		diag_error(b->d, pos, "expected a plain value, found an anchor &%s", (const char *)anchor);
		b->nerr++;
	}
	if (tag) {
		const char *t = (const char *)tag, *std = "tag:yaml.org,2002:";
		bool short_form = !strncmp(t, std, strlen(std));
		diag_error(b->d, pos, "expected a plain value, found a tag %s%s", short_form ? "!!" : "",
		           short_form ? t + strlen(std) : t);
		b->nerr++;
	}
}

static YNode *build_node(Builder *b, yaml_event_t *ev, int depth);

typedef VEC(YNode *) NodeVec;

static YNode **vec_to_arena(Builder *b, NodeVec *v)
{
	YNode **a = arena_alloc(&b->doc->arena, sizeof *a * (size_t)(v->n ? v->n : 1));
	if (v->n)
		memcpy(a, v->a, sizeof *a * (size_t)v->n);
	vec_free(v);
	return a;
}

/* Build the items of a sequence up to its end event.  -1 on a fatal error. */
static int build_seq(Builder *b, YNode *seq, int depth)
{
	NodeVec items = {0};
	for (;;) {
		yaml_event_t ev;
		if (next_event(b, &ev) != 0)
			break;
		if (ev.type == YAML_SEQUENCE_END_EVENT) {
			yaml_event_delete(&ev);
			seq->n = items.n;
			seq->items = vec_to_arena(b, &items);
			return 0;
		}
		YNode *item = build_node(b, &ev, depth + 1);
		if (!item)
			break;
		vec_push(&items, item);
	}
	vec_free(&items);
	return -1;
}

/* Report keys given twice in one mapping, at the second occurrence.  Linear. */
static void check_duplicate_keys(Builder *b, const YNode *m)
{
	if (m->n < 2)
		return;
	StrIndex seen;
	strindex_init(&seen, (size_t)m->n);
	for (int i = 0; i < m->n; i++) {
		const YNode *k = m->keys[i];
		if (k->kind != YN_SCALAR)
			continue;
		int at = strindex_put(&seen, k->str, i);
		if (at == i)
			continue;
		Pos first = m->keys[at]->pos;
		char desc[96];
		ynode_describe(k, desc, sizeof desc);
		diag_error(b->d, k->pos, "expected each key once in a mapping, found %s again (first at %s:%d:%d)", desc,
		           first.file, first.line, first.col);
		b->nerr++;
	}
	strindex_free(&seen);
}

/* Build the key/value pairs of a mapping up to its end event.  -1 on a fatal error. */
static int build_map(Builder *b, YNode *map, int depth)
{
	NodeVec keys = {0}, vals = {0};
	for (;;) {
		yaml_event_t ev;
		if (next_event(b, &ev) != 0)
			break;
		if (ev.type == YAML_MAPPING_END_EVENT) {
			yaml_event_delete(&ev);
			map->n = keys.n;
			map->keys = vec_to_arena(b, &keys);
			map->items = vec_to_arena(b, &vals);
			check_duplicate_keys(b, map);
			return 0;
		}
		YNode *k = build_node(b, &ev, depth + 1);
		if (!k || next_event(b, &ev) != 0)
			break;
		YNode *v = build_node(b, &ev, depth + 1);
		if (!v)
			break;
		if (k->kind != YN_SCALAR) {
			char desc[64];
			ynode_describe(k, desc, sizeof desc);
			diag_error(b->d, k->pos, "expected a plain key, found %s", desc);
			b->nerr++;
		}
		vec_push(&keys, k);
		vec_push(&vals, v);
	}
	vec_free(&keys);
	vec_free(&vals);
	return -1;
}

static YNode *build_scalar(Builder *b, const yaml_event_t *ev)
{
	YNode *n = new_node(b, YN_SCALAR, ev->start_mark);
	n->str = arena_strndup(&b->doc->arena, (const char *)ev->data.scalar.value, ev->data.scalar.length);
	n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
	refuse_decorations(b, ev, ev->data.scalar.anchor, ev->data.scalar.tag);
	return n;
}

/* Build the node that starts with event *ev (consumed), with its children.
 * NULL after a fatal error (parse error, nesting too deep). */
static YNode *build_node(Builder *b, yaml_event_t *ev, int depth)
{
	YNode *n = NULL;
	int rc = 0;
	if (depth > YAML_MAX_DEPTH && (ev->type == YAML_SEQUENCE_START_EVENT || ev->type == YAML_MAPPING_START_EVENT)) {
		diag_error(b->d, mark_pos(b, ev->start_mark), "expected at most %d levels of nesting, found more",
		           YAML_MAX_DEPTH);
		yaml_event_delete(ev);
		return NULL;
	}
	switch (ev->type) {
	case YAML_SCALAR_EVENT:
		n = build_scalar(b, ev);
		break;
	case YAML_ALIAS_EVENT:
		n = new_node(b, YN_SCALAR, ev->start_mark);
		n->str = "";
		diag_error(b->d, n->pos, "expected a plain value, found an alias *%s", (const char *)ev->data.alias.anchor);
		b->nerr++;
		break;
	case YAML_SEQUENCE_START_EVENT:
		n = new_node(b, YN_SEQ, ev->start_mark);
		refuse_decorations(b, ev, ev->data.sequence_start.anchor, ev->data.sequence_start.tag);
		yaml_event_delete(ev);
		rc = build_seq(b, n, depth);
		return rc == 0 ? n : NULL;
	case YAML_MAPPING_START_EVENT:
		n = new_node(b, YN_MAP, ev->start_mark);
		refuse_decorations(b, ev, ev->data.mapping_start.anchor, ev->data.mapping_start.tag);
		yaml_event_delete(ev);
		rc = build_map(b, n, depth);
		return rc == 0 ? n : NULL;
	default: /* cannot happen in a well-formed event stream */
		diag_error(b->d, mark_pos(b, ev->start_mark), "expected a YAML node, found event %d", (int)ev->type);
		break;
	}
	yaml_event_delete(ev);
	return n;
}

/* stream: STREAM-START [DOCUMENT-START node DOCUMENT-END] STREAM-END.  A
 * second document is an error. */
static int build_stream(Builder *b)
{
	yaml_event_t ev;
	if (next_event(b, &ev) != 0)
		return -1;
	yaml_event_delete(&ev); /* STREAM-START */
	if (next_event(b, &ev) != 0)
		return -1;
	if (ev.type == YAML_STREAM_END_EVENT) {
		yaml_event_delete(&ev);
		return 0; /* empty: no document */
	}
	yaml_event_delete(&ev); /* DOCUMENT-START */
	if (next_event(b, &ev) != 0 || !(b->doc->root = build_node(b, &ev, 1)))
		return -1;
	if (next_event(b, &ev) != 0)
		return -1;
	yaml_event_delete(&ev); /* DOCUMENT-END */
	if (next_event(b, &ev) != 0)
		return -1;
	int rc = 0;
	if (ev.type != YAML_STREAM_END_EVENT) {
		diag_error(b->d, mark_pos(b, ev.start_mark), "expected one YAML document, found a second one");
		rc = -1;
	}
	yaml_event_delete(&ev);
	return rc;
}

static void doc_init(YDoc *doc, const char *name)
{
	arena_init(&doc->arena);
	doc->root = NULL;
	doc->file = name;
}

/* Parse text[0..len) into doc.  0, or -1 after reporting. */
static int parse_buffer(YDoc *doc, const char *text, size_t len, Diag *d)
{
	Builder b = {.doc = doc, .d = d, .text = text, .len = len};
	if (!yaml_parser_initialize(&b.p)) {
		diag_error(d, (Pos){doc->file, 0, 0}, "expected a YAML parser, found out of memory");
		return -1;
	}
	yaml_parser_set_input_string(&b.p, (const unsigned char *)text, len);
	int rc = build_stream(&b);
	yaml_parser_delete(&b.p);
	if (rc != 0 || b.nerr) {
		doc->root = NULL;
		return -1;
	}
	return 0;
}

int ydoc_parse_string(YDoc *doc, const char *text, const char *name, Diag *d)
{
	doc_init(doc, name);
	return parse_buffer(doc, text, strlen(text), d);
}

int ydoc_parse_file(YDoc *doc, const char *path, Diag *d)
{
	doc_init(doc, path);
	size_t n = 0;
	char *text = file_read(path, &n);
	if (!text) {
		diag_error(d, (Pos){path, 0, 0}, "cannot open: %s", strerror(errno));
		return -1;
	}
	int rc = parse_buffer(doc, text, n, d);
	free(text);
	return rc;
}

void ydoc_free(YDoc *doc)
{
	arena_free(&doc->arena);
	doc->root = NULL;
}

/* ---- reading nodes ---- */

const YNode *ynode_get(const YNode *map, const char *key)
{
	if (!map || map->kind != YN_MAP)
		return NULL;
	for (int i = 0; i < map->n; i++)
		if (map->keys[i]->kind == YN_SCALAR && strcmp(map->keys[i]->str, key) == 0)
			return map->items[i];
	return NULL;
}

bool ynode_is_null(const YNode *n)
{
	if (!n || n->kind != YN_SCALAR || n->quoted)
		return false;
	const char *s = n->str;
	return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

void ynode_describe(const YNode *n, char *buf, size_t len)
{
	if (!n)
		snprintf(buf, len, "nothing");
	else if (n->kind == YN_MAP)
		snprintf(buf, len, "a mapping");
	else if (n->kind == YN_SEQ)
		snprintf(buf, len, "a list");
	else if (ynode_is_null(n))
		snprintf(buf, len, "%s", n->str[0] ? "null" : "nothing");
	else {
		char text[48];
		size_t k = 0;
		for (const char *s = n->str; *s && k < 40; s++)
			text[k++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
		snprintf(text + k, sizeof text - k, "%s", strlen(n->str) > 40 ? "..." : "");
		snprintf(buf, len, "%s'%s'", n->quoted ? "the quoted string " : "", text);
	}
}

/* ---- numbers ----
 * Integers: [-+]? then decimal digits, 0x hex, 0o octal or 0b binary, with
 * '_' allowed after the first digit.  Floats: [-+]? (.D | D[.D]) [eE[-+]D],
 * .inf, .nan in YAML's three spellings. */

enum { NUM_OK, NUM_SYNTAX, NUM_RANGE };

static int digit_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return 99;
}

/* Read an integer; *dv gets its value as a double even when out of int64 range. */
static int scan_int(const char *s, int64_t *out, double *dv)
{
	bool neg = *s == '-';
	if (*s == '-' || *s == '+')
		s++;
	int base = 10;
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'o' || s[1] == 'b'))
		base = s[1] == 'x' ? 16 : s[1] == 'o' ? 8 : 2, s += 2;
	uint64_t v = 0;
	double d = 0;
	bool any = false, over = false;
	for (; *s; s++) {
		if (*s == '_' && any)
			continue;
		int k = digit_value(*s);
		if (k >= base)
			return NUM_SYNTAX;
		over = over || v > (UINT64_MAX - (uint64_t)k) / (uint64_t)base;
		v = v * (uint64_t)base + (uint64_t)k;
		d = d * base + k;
		any = true;
	}
	if (!any)
		return NUM_SYNTAX;
	*dv = neg ? -d : d;
	if (over || v > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
		return NUM_RANGE;
	*out = neg ? (int64_t)(0 - v) : (int64_t)v;
	return NUM_OK;
}

/* Skip decimal digits (and '_' after the first); how many digits were seen. */
static int skip_digits(const char **s, bool underscores)
{
	int n = 0;
	for (; (**s >= '0' && **s <= '9') || (underscores && n && **s == '_'); (*s)++)
		n += **s != '_';
	return n;
}

/* Check the float grammar (not the integer forms). */
static bool float_syntax(const char *s)
{
	if (*s == '-' || *s == '+')
		s++;
	int n = skip_digits(&s, true);
	if (*s == '.')
		s++, n += skip_digits(&s, true);
	if (n == 0)
		return false;
	if (*s == 'e' || *s == 'E') {
		s++;
		if (*s == '-' || *s == '+')
			s++;
		if (skip_digits(&s, false) == 0)
			return false;
	}
	return *s == 0;
}

static bool special_float(const char *s, double *out)
{
	const char *t = s + (*s == '-' || *s == '+');
	if (!strcmp(t, ".inf") || !strcmp(t, ".Inf") || !strcmp(t, ".INF")) {
		*out = *s == '-' ? -INFINITY : INFINITY;
		return true;
	}
	if (t == s && (!strcmp(s, ".nan") || !strcmp(s, ".NaN") || !strcmp(s, ".NAN"))) {
		*out = NAN;
		return true;
	}
	return false;
}

static int scan_double(const char *s, double *out)
{
	int64_t i;
	int rc = scan_int(s, &i, out);
	if (rc == NUM_OK) {
		*out = (double)i;
		return NUM_OK;
	}
	if (special_float(s, out))
		return NUM_OK;
	if (!float_syntax(s))
		return rc == NUM_RANGE ? NUM_OK : NUM_SYNTAX; /* a huge 0x, 0o or 0b integer: *out from scan_int */
	size_t n = strlen(s);
	char *buf = xmalloc(n + 1), *p = buf;
	for (; *s; s++)
		if (*s != '_')
			*p++ = *s;
	*p = 0;
	*out = strtod(buf, NULL);
	free(buf);
	return isinf(*out) ? NUM_RANGE : NUM_OK;
}

static bool plain_scalar(const YNode *n) { return n && n->kind == YN_SCALAR && !n->quoted; }

static int mismatch(const YNode *n, const char *what, Diag *d)
{
	char desc[96];
	ynode_describe(n, desc, sizeof desc);
	diag_error(d, n ? n->pos : (Pos){0}, "expected %s, found %s", what, desc);
	return -1;
}

int ynode_int(const YNode *n, int64_t *out, Diag *d)
{
	if (!plain_scalar(n))
		return mismatch(n, "an integer", d);
	double dv;
	int rc = scan_int(n->str, out, &dv);
	if (rc == NUM_RANGE)
		return mismatch(n, "an integer that fits in 64 bits", d);
	return rc == NUM_OK ? 0 : mismatch(n, "an integer", d);
}

int ynode_double(const YNode *n, double *out, Diag *d)
{
	if (!plain_scalar(n))
		return mismatch(n, "a number", d);
	int rc = scan_double(n->str, out);
	if (rc == NUM_RANGE)
		return mismatch(n, "a number within the range of a double", d);
	return rc == NUM_OK ? 0 : mismatch(n, "a number", d);
}

bool ynode_is_number(const YNode *n)
{
	double v;
	return plain_scalar(n) && scan_double(n->str, &v) == NUM_OK;
}

int ynode_bool(const YNode *n, bool *out, Diag *d)
{
	static const char *const yes[] = {"true", "True", "TRUE"}, *const no[] = {"false", "False", "FALSE"};
	for (int i = 0; plain_scalar(n) && i < 3; i++) {
		if (!strcmp(n->str, yes[i]) || !strcmp(n->str, no[i])) {
			*out = !strcmp(n->str, yes[i]);
			return 0;
		}
	}
	return mismatch(n, "true or false", d);
}

int ynode_string(const YNode *n, const char **out, Diag *d)
{
	if (!n || n->kind != YN_SCALAR || ynode_is_null(n))
		return mismatch(n, "a string", d);
	*out = n->str;
	return 0;
}
