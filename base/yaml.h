/* yaml.h: a YAML document as a small tree of nodes that remember their positions.
 *
 * Built from libyaml's event stream.  The format does not use anchors,
 * aliases or tags: they are rejected, never expanded.  A key given twice in
 * one mapping is an error.  Nodes live in the document's arena. */
#ifndef SPMD_YAML_H
#define SPMD_YAML_H

#include "base.h"

typedef enum { YN_SCALAR, YN_SEQ, YN_MAP } YKind;

typedef struct YNode {
	YKind kind;
	Pos pos;              /* where the node starts (1-based line and column) */
	const char *str;      /* YN_SCALAR: its text */
	bool quoted;          /* YN_SCALAR: written quoted ('x' or "x"), never null or a number */
	int n;                /* YN_SEQ: items; YN_MAP: pairs */
	struct YNode **items; /* YN_SEQ: the items; YN_MAP: the values */
	struct YNode **keys;  /* YN_MAP: the keys (scalars) */
} YNode;

typedef struct {
	Arena arena;
	YNode *root; /* NULL for an empty document */
	const char *file;
} YDoc;

/* Parse a file or a string (name is used in messages).  0, or -1 after
 * reporting FILE:LINE:COL errors to d.  Free with ydoc_free either way. */
int ydoc_parse_file(YDoc *doc, const char *path, Diag *d);
int ydoc_parse_string(YDoc *doc, const char *text, const char *name, Diag *d);
void ydoc_free(YDoc *doc);

/* The value under key in a mapping, or NULL. */
const YNode *ynode_get(const YNode *map, const char *key);
/* A plain scalar null, ~, Null, NULL or empty. */
bool ynode_is_null(const YNode *n);
/* Readers that report "expected ..., found ..." at the node and return -1 on a
 * mismatch, 0 on success.  Numbers take every form YAML 1.1/1.2 allows
 * (1e-05, 1.0e-5, .5, -3, 0x10, +.inf); booleans true/false/True/False/TRUE/FALSE. */
int ynode_int(const YNode *n, int64_t *out, Diag *d);
int ynode_double(const YNode *n, double *out, Diag *d);
int ynode_bool(const YNode *n, bool *out, Diag *d);
int ynode_string(const YNode *n, const char **out, Diag *d);
/* True if a scalar reads as a number (for constants in `in` lists). */
bool ynode_is_number(const YNode *n);
/* Describe a node for "found ..." ("a mapping", "a list", "'abc'"). */
void ynode_describe(const YNode *n, char *buf, size_t len);

#endif
