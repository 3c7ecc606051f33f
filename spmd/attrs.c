/* attrs.c: attribute parsers of the op table — an op's YAML mapping to op->attr.
 *
 * The loader calls a parser once the op's operands are resolved, so a parser
 * may read operand shapes from the graph.  It uses that to store attributes
 * in normal form: axes non-negative (reduce axes sorted, omitted axes made
 * explicit), reshape's -1 inferred, conv2d's `same` padding resolved.  Shape
 * rules (shape.c) check the normal form again, since ops made by later passes
 * do not come through here.  Errors are reported at the attribute's node. */
#include "load.h"
#include "../base/yaml.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#define MAX_NUMEL ((int64_t)SHAPE_MAX_NUMEL) /* the enum constant is unsigned */

typedef struct LoadCtx LoadCtx;

/* ---- which keys each op takes ---- */

static const char *const *grad_op_keys(OpKind k); /* the ops of training, at the end of the file */

const char *const *attr_keys(OpKind k)
{
	if (grad_op_keys(k))
		return grad_op_keys(k);
	static const char *const none[] = {NULL}, *const einsum[] = {"eq", NULL},
	                         *const reduce[] = {"axes", "keepdims", NULL}, *const axis[] = {"axis", NULL},
	                         *const layer_norm[] = {"axis", "eps", NULL}, *const transpose[] = {"perm", NULL},
	                         *const shape[] = {"shape", NULL}, *const slice[] = {"start", "limit", "stride", NULL},
	                         *const pad[] = {"low", "high", "value", NULL},
	                         *const conv2d[] = {"strides", "padding", NULL}, *const one_hot[] = {"depth", NULL},
	                         *const one_hot_shard[] = {"depth", "labels", NULL},
	                         *const cast[] = {"dtype", NULL}, *const all_reduce[] = {"axes", "reduce", NULL},
	                         *const reduce_scatter[] = {"axes", "reduce", "dim", NULL},
	                         *const all_gather[] = {"axes", "dim", NULL},
	                         *const all_to_all[] = {"axes", "split_dim", "concat_dim", NULL},
	                         *const permute[] = {"axes", "shift", "targets", NULL},
	                         *const shard_slice[] = {"from", "to", "shape", NULL}, *const mask[] = {"value", NULL},
	                         *const shard_roll[] = {"axes", "dim", "shift", NULL};
	switch (k) {
	case OP_EINSUM: return einsum;
	case OP_REDUCE_SUM: case OP_REDUCE_MAX: case OP_REDUCE_MEAN: return reduce;
	case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_CONCAT: return axis;
	case OP_LAYER_NORM: return layer_norm;
	case OP_TRANSPOSE: return transpose;
	case OP_RESHAPE: case OP_BROADCAST_TO: return shape;
	case OP_SLICE: return slice;
	case OP_PAD: return pad;
	case OP_CONV2D: return conv2d;
	case OP_ONE_HOT: return one_hot;
	case OP_ONE_HOT_SHARD: return one_hot_shard;
	case OP_CAST: return cast;
	case OP_ALL_REDUCE: return all_reduce;
	case OP_REDUCE_SCATTER: return reduce_scatter;
	case OP_ALL_GATHER: return all_gather;
	case OP_ALL_TO_ALL: return all_to_all;
	case OP_COLLECTIVE_PERMUTE: return permute;
	case OP_SHARD_SLICE: return shard_slice;
	case OP_MASK: return mask;
	case OP_SHARD_ROLL: return shard_roll;
	default: return none;
	}
}

/* ---- helpers ---- */

static int fail(LoadCtx *lc, Pos p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(LoadCtx *lc, Pos p, const char *fmt, ...)
{
	Diag *d = load_diag(lc);
	va_list ap;
	va_start(ap, fmt);
	d->nerr++;
	diag_verror(d, p, "error", fmt, ap);
	va_end(ap);
	return -1;
}

static int expect(LoadCtx *lc, const YNode *n, const char *what)
{
	char desc[96];
	ynode_describe(n, desc, sizeof desc);
	return fail(lc, n->pos, "expected %s, found %s", what, desc);
}

static const char *op_name(const Op *op) { return op_table[op->kind].name; }

static const Shape *operand_shape(LoadCtx *lc, const Op *op, int i) { return &load_graph(lc)->values.a[op->in[i]].shape; }

/* The value of a required attribute, or NULL after reporting at the op. */
static const YNode *need(LoadCtx *lc, const YNode *n, const Op *op, const char *key)
{
	const YNode *v = ynode_get(n, key);
	if (!v)
		fail(lc, n->pos, "expected key '%s' in %s, found none", key, op_name(op));
	return v;
}

/* An integer in [lo, hi]; what names it in the message. */
static int read_range(LoadCtx *lc, const YNode *n, int64_t lo, int64_t hi, const char *what, int64_t *out)
{
	if (ynode_int(n, out, load_diag(lc)) != 0)
		return -1;
	if (*out >= lo && *out <= hi)
		return 0;
	char buf[128];
	snprintf(buf, sizeof buf, "%s in %lld..%lld", what, (long long)lo, (long long)hi);
	return expect(lc, n, buf);
}

/* An axis of a rank-`rank` operand, negative counting from the end; stored non-negative. */
static int read_axis(LoadCtx *lc, const YNode *n, int rank, int *out)
{
	int64_t v;
	if (rank == 0)
		return expect(lc, n, "no axis (the operand is a scalar)");
	if (read_range(lc, n, -rank, rank - 1, "an axis", &v) != 0)
		return -1;
	*out = (int)(v < 0 ? v + rank : v);
	return 0;
}

/* A list of exactly `count` integers, each in [lo, hi]. */
static int read_ints(LoadCtx *lc, const YNode *n, int count, int64_t lo, int64_t hi, const char *what, int64_t *out)
{
	if (n->kind != YN_SEQ || n->n != count) {
		char buf[128];
		snprintf(buf, sizeof buf, "a list of %d integer%s (one per dim)", count, count == 1 ? "" : "s");
		return expect(lc, n, buf);
	}
	int rc = 0;
	for (int i = 0; i < count; i++)
		if (read_range(lc, n->items[i], lo, hi, what, &out[i]) != 0)
			rc = -1;
	return rc;
}

/* A list of distinct axes of a rank-`rank` operand (a single integer is a
 * list of one) into axes[0..*naxes), non-negative, in the order given. */
static int read_axes(LoadCtx *lc, const YNode *n, int rank, int *axes, int *naxes)
{
	const YNode *const *items = n->kind == YN_SEQ ? (const YNode *const *)n->items : &n;
	int count = n->kind == YN_SEQ ? n->n : 1;
	if (n->kind == YN_MAP)
		return expect(lc, n, "a list of axes");
	unsigned seen = 0;
	*naxes = 0;
	for (int i = 0; i < count; i++) {
		int a = 0;
		if (read_axis(lc, items[i], rank, &a) != 0)
			return -1;
		if (seen >> a & 1)
			return expect(lc, items[i], "each axis once");
		seen |= 1u << a;
		axes[(*naxes)++] = a;
	}
	return 0;
}

int attr_none(LoadCtx *lc, const YNode *n, Op *op) { return 0; }

/* ---- einsum ---- */

static bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* The left side: one or two comma-separated terms of letters. */
static int einsum_terms(LoadCtx *lc, Pos p, const char *s, const char *end, Attr *a, int *nterms)
{
	int t = 0;
	for (; s < end; s++) {
		if (*s == ' ')
			continue;
		if (*s == ',' && t == 1)
			return fail(lc, p, "expected at most 2 operands in einsum equation '%s', found more", a->eq);
		if (*s == ',') {
			t++;
			continue;
		}
		if (!is_letter(*s))
			return fail(lc, p, "expected a letter, ',' or '->' in einsum equation '%s', found '%c'", a->eq, *s);
		if (a->nlet[t] == MAX_RANK)
			return fail(lc, p, "expected at most %d letters per operand in einsum equation '%s', found more",
			            MAX_RANK, a->eq);
		a->let[t][a->nlet[t]++] = *s;
	}
	*nterms = t + 1;
	return 0;
}

/* The right side, given: letters of the inputs, each once. */
static int einsum_output(LoadCtx *lc, Pos p, const char *s, Attr *a, const int *count)
{
	for (; *s; s++) {
		if (*s == ' ')
			continue;
		if (!is_letter(*s))
			return fail(lc, p, "expected a letter after '->' in einsum equation '%s', found '%c'", a->eq, *s);
		if (!count[(unsigned char)*s])
			return fail(lc, p, "expected output letters that occur in the operands of '%s', found '%c'", a->eq, *s);
		if (memchr(a->let[2], *s, (size_t)a->nlet[2]))
			return fail(lc, p, "expected each output letter once in einsum equation '%s', found '%c' twice", a->eq,
			            *s);
		if (a->nlet[2] == MAX_RANK)
			return fail(lc, p, "expected at most %d output letters in einsum equation '%s', found more", MAX_RANK,
			            a->eq);
		a->let[2][a->nlet[2]++] = *s;
	}
	return 0;
}

/* Implicit output (numpy): the letters occurring exactly once, in ASCII order. */
static int einsum_implicit(LoadCtx *lc, Pos p, Attr *a, const int *count)
{
	for (int c = 0; c < 128; c++) {
		if (count[c] != 1)
			continue;
		if (a->nlet[2] == MAX_RANK)
			return fail(lc, p, "expected at most %d output letters in einsum equation '%s', found more", MAX_RANK,
			            a->eq);
		a->let[2][a->nlet[2]++] = (char)c;
	}
	return 0;
}

/* "ab,bc->ac" from the parsed letters: the stored, explicit form. */
static const char *einsum_format(LoadCtx *lc, const Attr *a, int nterms)
{
	char buf[3 * MAX_RANK + 8];
	size_t k = 0;
	for (int t = 0; t < nterms; t++) {
		if (t)
			buf[k++] = ',';
		memcpy(buf + k, a->let[t], (size_t)a->nlet[t]), k += (size_t)a->nlet[t];
	}
	memcpy(buf + k, "->", 2), k += 2;
	memcpy(buf + k, a->let[2], (size_t)a->nlet[2]), k += (size_t)a->nlet[2];
	return arena_strndup(&load_graph(lc)->arena, buf, k);
}

/* eq: "TERM[,TERM][->OUT]".  '...' is refused.  The operand count against
 * the terms and the letters against operand ranks are the shape rule's. */
int attr_einsum(LoadCtx *lc, const YNode *n, Op *op)
{
	const YNode *e = need(lc, n, op, "eq");
	const char *s;
	if (!e || ynode_string(e, &s, load_diag(lc)) != 0)
		return -1;
	Attr *a = op->attr;
	a->eq = s; /* for messages until replaced below */
	if (strstr(s, "..."))
		return fail(lc, e->pos, "expected einsum letters, found '...' in '%s' (ellipsis is not supported)", s);
	const char *arrow = strstr(s, "->");
	int nterms = 1, count[128] = {0};
	if (einsum_terms(lc, e->pos, s, arrow ? arrow : s + strlen(s), a, &nterms) != 0)
		return -1;
	for (int t = 0; t < nterms; t++)
		for (int i = 0; i < a->nlet[t]; i++)
			count[(unsigned char)a->let[t][i]]++;
	if (arrow ? einsum_output(lc, e->pos, arrow + 2, a, count) : einsum_implicit(lc, e->pos, a, count))
		return -1;
	a->eq = einsum_format(lc, a, nterms);
	return 0;
}

/* ---- reductions and one-axis ops ---- */

static int cmp_int(const void *x, const void *y) { return *(const int *)x - *(const int *)y; }

/* axes: [A, ...] (omitted: all), keepdims: BOOL.  Stored sorted, non-negative. */
int attr_reduce(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	int rank = operand_shape(lc, op, 0)->rank;
	const YNode *an = ynode_get(n, "axes"), *kn = ynode_get(n, "keepdims");
	if (kn && ynode_bool(kn, &a->keepdims, load_diag(lc)) != 0)
		return -1;
	if (!an) {
		for (a->naxes = 0; a->naxes < rank; a->naxes++)
			a->axes[a->naxes] = a->naxes;
		return 0;
	}
	if (read_axes(lc, an, rank, a->axes, &a->naxes) != 0)
		return -1;
	qsort(a->axes, (size_t)a->naxes, sizeof a->axes[0], cmp_int);
	return 0;
}

/* axis: A (default -1), into axes[0]. */
int attr_axis(LoadCtx *lc, const YNode *n, Op *op)
{
	int rank = operand_shape(lc, op, 0)->rank;
	const YNode *an = ynode_get(n, "axis");
	op->attr->naxes = 1;
	if (rank == 0)
		return fail(lc, n->pos, "expected an operand of rank >= 1 for %s, found a scalar", op_name(op));
	if (!an) {
		op->attr->axes[0] = rank - 1;
		return 0;
	}
	return read_axis(lc, an, rank, &op->attr->axes[0]);
}

/* axis: A (default -1), eps: E > 0 (default 1e-5). */
int attr_layer_norm(LoadCtx *lc, const YNode *n, Op *op)
{
	const YNode *en = ynode_get(n, "eps");
	op->attr->eps = 1e-5;
	if (attr_axis(lc, n, op) != 0)
		return -1;
	if (en && ynode_double(en, &op->attr->eps, load_diag(lc)) != 0)
		return -1;
	if (!(op->attr->eps > 0) || isinf(op->attr->eps))
		return expect(lc, en, "an eps > 0");
	return 0;
}

/* ---- data movement ---- */

/* perm: a permutation of the operand's axes (default: reversed). */
int attr_transpose(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	int rank = operand_shape(lc, op, 0)->rank;
	const YNode *pn = ynode_get(n, "perm");
	if (!pn) {
		for (a->naxes = 0; a->naxes < rank; a->naxes++)
			a->axes[a->naxes] = rank - 1 - a->naxes;
		return 0;
	}
	if (pn->kind != YN_SEQ || pn->n != rank) {
		char buf[96];
		snprintf(buf, sizeof buf, "a permutation of the %d axes of the operand", rank);
		return expect(lc, pn, buf);
	}
	return read_axes(lc, pn, rank, a->axes, &a->naxes);
}

/* The product of dims other than one -1, with the index of the -1 in *hole. */
static int target_dims(LoadCtx *lc, const YNode *sn, Shape *s, bool allow_hole, int *hole, int64_t *known)
{
	*hole = -1, *known = 1;
	for (int i = 0; i < sn->n; i++) {
		const YNode *it = sn->items[i];
		if (ynode_int(it, &s->dim[i], load_diag(lc)) != 0)
			return -1;
		if (s->dim[i] == -1 && allow_hole && *hole < 0)
			*hole = i;
		else if (s->dim[i] < 1)
			return expect(lc, it, allow_hole ? "a dimension >= 1 (or one -1)" : "a dimension >= 1");
		else if (s->dim[i] > MAX_NUMEL / *known)
			return expect(lc, it, "a shape of at most 2^40 elements");
		else
			*known *= s->dim[i];
	}
	return 0;
}

/* shape: [D, ...]; for reshape one D may be -1 (inferred from the operand). */
int attr_shape(LoadCtx *lc, const YNode *n, Op *op)
{
	const YNode *sn = need(lc, n, op, "shape");
	if (!sn)
		return -1;
	if (sn->kind != YN_SEQ || sn->n > MAX_RANK)
		return expect(lc, sn, "a shape (a list of at most 8 dimensions)");
	Shape *s = &op->attr->shape;
	s->rank = sn->n;
	int hole;
	int64_t known, numel = shape_numel(operand_shape(lc, op, 0));
	if (target_dims(lc, sn, s, op->kind == OP_RESHAPE, &hole, &known) != 0)
		return -1;
	if (hole < 0)
		return 0;
	if (numel % known != 0) {
		char buf[96];
		snprintf(buf, sizeof buf, "a shape whose -1 can be inferred from %lld elements", (long long)numel);
		return expect(lc, sn, buf);
	}
	s->dim[hole] = numel / known;
	return 0;
}

/* start: [...], limit: [...] (one per dim), stride: [...] (each >= 1, default 1). */
int attr_slice(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	int rank = operand_shape(lc, op, 0)->rank;
	const YNode *sn = need(lc, n, op, "start"), *ln = need(lc, n, op, "limit"), *tn = ynode_get(n, "stride");
	if (!sn || !ln)
		return -1;
	int rc = read_ints(lc, sn, rank, 0, MAX_NUMEL, "a start", a->start);
	rc |= read_ints(lc, ln, rank, 0, MAX_NUMEL, "a limit", a->limit);
	for (int i = 0; i < rank; i++)
		a->stride[i] = 1;
	if (tn)
		rc |= read_ints(lc, tn, rank, 1, MAX_NUMEL, "a stride", a->stride);
	return rc ? -1 : 0;
}

/* axis: A (required), of the first operand. */
int attr_concat(LoadCtx *lc, const YNode *n, Op *op)
{
	const YNode *an = need(lc, n, op, "axis");
	int axis = 0;
	if (!an || read_axis(lc, an, operand_shape(lc, op, 0)->rank, &axis) != 0)
		return -1;
	op->attr->axis = axis;
	return 0;
}

/* low: [...], high: [...] (one per dim, each >= 0), value: V (default 0). */
int attr_pad(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	int rank = operand_shape(lc, op, 0)->rank;
	const YNode *lo = need(lc, n, op, "low"), *hi = need(lc, n, op, "high"), *vn = ynode_get(n, "value");
	if (!lo || !hi)
		return -1;
	int rc = read_ints(lc, lo, rank, 0, MAX_NUMEL, "a padding", a->start);
	rc |= read_ints(lc, hi, rank, 0, MAX_NUMEL, "a padding", a->limit);
	if (vn && ynode_double(vn, &a->value, load_diag(lc)) != 0)
		rc = -1;
	return rc ? -1 : 0;
}

/* ---- convolution ---- */

/* padding: [[top, bottom], [left, right]] */
static int conv_explicit(LoadCtx *lc, const YNode *pn, Attr *a)
{
	if (pn->kind != YN_SEQ || pn->n != 2)
		return expect(lc, pn, "padding same, valid or [[top, bottom], [left, right]]");
	for (int i = 0; i < 2; i++)
		if (read_ints(lc, pn->items[i], 2, 0, MAX_NUMEL, "a padding", a->padding[i]) != 0)
			return -1;
	a->pad_mode = CONV_PAD_EXPLICIT;
	return 0;
}

/* TensorFlow's SAME: out = ceil(in / stride), the odd pixel at the end. */
static void conv_same(int64_t in, int64_t k, int64_t stride, int64_t *lo, int64_t *hi)
{
	int64_t out = (in + stride - 1) / stride, total = (out - 1) * stride + k - in;
	total = total > 0 ? total : 0;
	*lo = total / 2, *hi = total - total / 2;
}

/* strides: [sh, sw] (default [1, 1]); padding: same | valid (default) | explicit. */
int attr_conv2d(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	const YNode *sn = ynode_get(n, "strides"), *pn = ynode_get(n, "padding");
	int64_t st[2] = {1, 1};
	if (sn && read_ints(lc, sn, 2, 1, 1 << 30, "a stride", st) != 0)
		return -1;
	a->strides[0] = (int)st[0], a->strides[1] = (int)st[1];
	a->pad_mode = CONV_PAD_VALID;
	if (pn && pn->kind == YN_SCALAR && !pn->quoted && !strcmp(pn->str, "same"))
		a->pad_mode = CONV_PAD_SAME;
	else if (pn && !(pn->kind == YN_SCALAR && !pn->quoted && !strcmp(pn->str, "valid")))
		return conv_explicit(lc, pn, a);
	const Shape *x = operand_shape(lc, op, 0), *w = operand_shape(lc, op, 1);
	if (a->pad_mode == CONV_PAD_SAME && x->rank == 4 && w->rank == 4)
		for (int i = 0; i < 2; i++)
			conv_same(x->dim[1 + i], w->dim[i], a->strides[i], &a->padding[i][0], &a->padding[i][1]);
	return 0;
}

/* ---- lookups and casts ---- */

/* depth: D >= 1; one_hot_shard also labels: BOOL (into value) */
int attr_one_hot(LoadCtx *lc, const YNode *n, Op *op)
{
	const YNode *dn = need(lc, n, op, "depth"), *ln = ynode_get(n, "labels");
	if (!dn || read_range(lc, dn, 1, MAX_NUMEL, "a depth", &op->attr->depth) != 0)
		return -1;
	bool labels = false;
	if (ln && op->kind == OP_ONE_HOT_SHARD && ynode_bool(ln, &labels, load_diag(lc)) != 0)
		return -1;
	op->attr->value = labels;
	return 0;
}

/* dtype: T */
int attr_cast(LoadCtx *lc, const YNode *n, Op *op)
{
	const YNode *tn = need(lc, n, op, "dtype");
	if (!tn)
		return -1;
	int t = tn->kind == YN_SCALAR ? dtype_parse(tn->str) : -1;
	if (t < 0)
		return expect(lc, tn, "a dtype (f32, bf16, f16, f64 or i32)");
	op->attr->dtype = (DType)t;
	return 0;
}

/* ---- collectives ---- */

/* axes: [AXIS, ...] mesh axis names, each once, into cax/ncax. */
static int collective_axes(LoadCtx *lc, const YNode *an, Attr *a)
{
	const Mesh *m = &load_graph(lc)->mesh;
	char what[160] = "a mesh axis (the model has no mesh)";
	if (m->naxes) {
		size_t k = (size_t)snprintf(what, sizeof what, "a mesh axis (");
		for (int i = 0; i < m->naxes && k < sizeof what; i++)
			k += (size_t)snprintf(what + k, sizeof what - k, "%s%s", i ? ", " : "", m->name[i]);
		if (k < sizeof what)
			snprintf(what + k, sizeof what - k, ")");
	}
	if (an->kind != YN_SEQ || an->n == 0)
		return expect(lc, an, "a non-empty list of mesh axes");
	unsigned seen = 0;
	for (int i = 0; i < an->n; i++) {
		const YNode *it = an->items[i];
		uint8_t ax[MESH_MAX_AXES];
		int k = it->kind == YN_SCALAR ? mesh_resolve(m, it->str, ax) : -1;
		if (k <= 0)
			return expect(lc, it, what);
		for (int j = 0; j < k; j++) {
			if (seen >> ax[j] & 1)
				return expect(lc, it, "each mesh axis once");
			seen |= 1u << ax[j];
			a->cax[a->ncax++] = ax[j];
		}
	}
	return 0;
}

static int read_reduce(LoadCtx *lc, const YNode *rn, Attr *a)
{
	a->reduce = REDUCE_SUM;
	if (!rn)
		return 0;
	if (rn->kind == YN_SCALAR && !strcmp(rn->str, "max"))
		a->reduce = REDUCE_MAX;
	else if (!(rn->kind == YN_SCALAR && !strcmp(rn->str, "sum")))
		return expect(lc, rn, "a reduction (sum or max)");
	return 0;
}

/* A required dimension attribute, normalized against the operand's rank. */
static int read_dim(LoadCtx *lc, const YNode *n, const Op *op, const char *key, int *out)
{
	const YNode *dn = need(lc, n, op, key);
	return dn ? read_axis(lc, dn, operand_shape(lc, op, 0)->rank, out) : -1;
}

/* One [SRC, DST] pair of a permute's targets into t (ndev entries); seen
 * marks the sources listed so far.  0, or -1 after reporting. */
static int read_pair(LoadCtx *lc, const YNode *p, int *t, char *seen)
{
	int ndev = load_graph(lc)->mesh.ndev;
	int64_t src, dst;
	if (p->kind != YN_SEQ || p->n != 2)
		return expect(lc, p, "a [source, target] pair of device ids");
	if (read_range(lc, p->items[0], 0, ndev - 1, "a device id", &src) != 0 ||
	    read_range(lc, p->items[1], -1, ndev - 1, "a device id (or -1: nobody)", &dst) != 0)
		return -1;
	if (seen[src])
		return expect(lc, p->items[0], "each source device once");
	seen[src] = 1;
	t[src] = (int)dst;
	return 0;
}

/* Does every pair move along the op's axes only, and does every device
 * receive from one device at most (unlisted devices keep their buffer)? */
static int check_pairs(LoadCtx *lc, const YNode *tn, const Attr *a, const int *t, const char *seen)
{
	const Mesh *m = &load_graph(lc)->mesh;
	char *got = xcalloc((size_t)m->ndev, 1);
	int rc = 0;
	for (int i = 0; i < tn->n && rc == 0; i++) {
		int64_t src = 0;
		ynode_int(tn->items[i]->items[0], &src, load_diag(lc));
		int dst = t[src], c1[MESH_MAX_AXES] = {0}, c2[MESH_MAX_AXES] = {0};
		if (dst < 0)
			continue;
		if (got[dst] || !seen[dst]) /* an unlisted device keeps its own buffer */
			rc = expect(lc, tn->items[i]->items[1], "a device that receives from no other (unlisted ones keep theirs)");
		got[dst] = 1;
		mesh_device_coords(m, (int)src, c1), mesh_device_coords(m, dst, c2);
		for (int k = 0; k < a->ncax; k++)
			c1[a->cax[k]] = c2[a->cax[k]];
		if (rc == 0 && memcmp(c1, c2, sizeof c1) != 0)
			rc = expect(lc, tn->items[i], "a pair of devices that differ only along the permute's axes");
	}
	free(got);
	return rc;
}

/* targets: [[SRC, DST], ...]: device SRC sends its buffer to DST (-1: to
 * nobody); devices not listed keep theirs.  Into a->target (ndev entries). */
static int read_targets(LoadCtx *lc, const YNode *tn, Attr *a)
{
	Graph *g = load_graph(lc);
	int ndev = g->mesh.ndev, rc = 0;
	if (tn->kind != YN_SEQ)
		return expect(lc, tn, "a list of [source, target] pairs of device ids");
	int *t = arena_alloc(&g->arena, sizeof(int) * (size_t)ndev);
	char *seen = xcalloc((size_t)ndev, 1);
	for (int dev = 0; dev < ndev; dev++)
		t[dev] = dev;
	for (int i = 0; i < tn->n && rc == 0; i++)
		rc = read_pair(lc, tn->items[i], t, seen);
	if (rc == 0)
		rc = check_pairs(lc, tn, a, t, seen);
	free(seen);
	a->target = t;
	return rc;
}

/* collective_permute: one axis and a shift along it (default 1), or any
 * axes and an explicit map (targets). */
static int attr_permute(LoadCtx *lc, const YNode *n, const YNode *an, Attr *a)
{
	const YNode *sn = ynode_get(n, "shift"), *tn = ynode_get(n, "targets");
	a->shift = 0; /* explicit targets: no shift (the cost model tells them apart so) */
	if (sn && tn)
		return expect(lc, tn, "shift or targets for collective_permute, not both");
	if (tn)
		return read_targets(lc, tn, a);
	a->shift = 1;
	if (a->ncax != 1)
		return expect(lc, an, "one mesh axis for collective_permute");
	if (sn && read_range(lc, sn, -MESH_MAX_DEVICES, MESH_MAX_DEVICES, "a shift", &a->shift) != 0)
		return -1;
	/* the map, made once here rather than by every device at every run */
	Graph *g = load_graph(lc);
	int *t = arena_alloc(&g->arena, sizeof(int) * (size_t)g->mesh.ndev);
	mesh_shift_targets(&g->mesh, a->cax[0], a->shift, t);
	a->target = t;
	return 0;
}

/* axes (all); reduce (all_reduce, reduce_scatter); dim (all_gather,
 * reduce_scatter); split_dim, concat_dim (all_to_all); shift (collective_permute,
 * which takes exactly one axis). */
int attr_collective(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	const YNode *an = need(lc, n, op, "axes");
	if (!an || collective_axes(lc, an, a) != 0)
		return -1;
	switch (op->kind) {
	case OP_ALL_REDUCE:
		return read_reduce(lc, ynode_get(n, "reduce"), a);
	case OP_REDUCE_SCATTER:
		return read_reduce(lc, ynode_get(n, "reduce"), a) | read_dim(lc, n, op, "dim", &a->dim);
	case OP_ALL_GATHER:
		return read_dim(lc, n, op, "dim", &a->dim);
	case OP_ALL_TO_ALL:
		return read_dim(lc, n, op, "split_dim", &a->dim) | read_dim(lc, n, op, "concat_dim", &a->dim2);
	case OP_COLLECTIVE_PERMUTE:
		return attr_permute(lc, n, an, a);
	default:
		return fail(lc, n->pos, "expected a collective op, found %s", op_name(op));
	}
}

/* ---- ops of partitioned programs (load.c admits them only there) ---- */

/* A sharding of a rank-`rank` tensor, without open dims; an absent node is
 * replicated. */
static int read_spec(LoadCtx *lc, const YNode *n, int rank, Spec *s)
{
	memset(s, 0, sizeof *s);
	s->rank = (uint8_t)rank;
	if (!n)
		return 0;
	if (spec_parse(s, n, &load_graph(lc)->mesh, rank, load_diag(lc)) != 0)
		return -1;
	return s->open ? expect(lc, n, "a sharding without open dims ('_' or '?')") : 0;
}

/* from: SPEC (the operand's layout), to: SPEC (the result's), shape: the
 * result's local blocks, global: the tensor's shape (default: the
 * operand's).  How they relate to the operand is checked in load.c. */
int attr_shard_slice(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	const Value *x = &load_graph(lc)->values.a[op->in[0]];
	const YNode *fn = need(lc, n, op, "from"), *tn = need(lc, n, op, "to"), *sn = need(lc, n, op, "shape");
	const YNode *gn = ynode_get(n, "global");
	int rank = x->shape.rank;
	if (!fn || !tn || !sn || read_spec(lc, fn, rank, &a->spec_from) != 0 || read_spec(lc, tn, rank, &a->spec) != 0 ||
	    load_shape(lc, sn, &a->shape) != 0)
		return -1;
	if (a->shape.rank != rank) {
		char what[64];
		snprintf(what, sizeof what, "a shape of rank %d (the operand's)", rank);
		return expect(lc, sn, what);
	}
	a->global = x->global;
	return gn ? load_shape(lc, gn, &a->global) : 0;
}

/* value: the fill (default 0).  The layout and the global shape are the
 * op's `sharding` and `global` (defaults: replicated; the operand's). */
int attr_mask(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	const Value *x = &load_graph(lc)->values.a[op->in[0]];
	const YNode *sn = ynode_get(n, "sharding"), *gn = ynode_get(n, "global"), *vn = ynode_get(n, "value");
	a->global = x->global;
	if (read_spec(lc, sn, x->shape.rank, &a->spec) != 0 || (gn && load_shape(lc, gn, &a->global) != 0))
		return -1;
	return vn ? ynode_double(vn, &a->value, load_diag(lc)) : 0;
}

/* axes: [AXIS, ...] (as a collective's), dim: D, shift: K (any integer,
 * default 1).  The dim's divisibility by the axes' size is the shape rule's. */
int attr_shard_roll(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	const YNode *an = need(lc, n, op, "axes"), *sn = ynode_get(n, "shift");
	a->shift = 1;
	if (!an || collective_axes(lc, an, a) != 0 || read_dim(lc, n, op, "dim", &a->dim) != 0)
		return -1;
	return sn ? ynode_int(sn, &a->shift, load_diag(lc)) : 0;
}

/* No keys: the table's (operand 0's) sharding and global shape say which
 * rows this device holds. */
int attr_take_shard(LoadCtx *lc, const YNode *n, Op *op)
{
	const Value *t = &load_graph(lc)->values.a[op->in[0]];
	op->attr->spec = t->spec;
	op->attr->global = t->global;
	return 0;
}

/* ---- losses and gradient ops ---- */

static const char *const *grad_op_keys(OpKind k)
{
	static const char *const take_grad[] = {"num_rows", NULL},
	                         *const grad_input[] = {"strides", "padding", "input_size", NULL},
	                         *const grad_filter[] = {"strides", "padding", "kernel_size", NULL};
	switch (k) {
	case OP_TAKE_GRAD: case OP_TAKE_GRAD_SHARD: return take_grad;
	case OP_CONV2D_GRAD_INPUT: return grad_input;
	case OP_CONV2D_GRAD_FILTER: return grad_filter;
	default: return NULL;
	}
}

/* mse, softmax_cross_entropy(_grad): no keys; value = the number of elements
 * (mse) or positions (softmax_cross_entropy) the mean is over, so that the
 * local op of a split loss divides by the global count. */
int attr_loss(LoadCtx *lc, const YNode *n, Op *op)
{
	const Shape *s = operand_shape(lc, op, 0);
	int64_t count = shape_numel(s);
	if ((op->kind == OP_SOFTMAX_CROSS_ENTROPY || op->kind == OP_SOFTMAX_CROSS_ENTROPY_GRAD ||
	     op->kind == OP_XENT_GRAD_SHARD) && s->rank > 0)
		count /= s->dim[s->rank - 1];
	op->attr->value = (double)count;
	return 0;
}

/* num_rows: R >= 1, into depth. */
int attr_take_grad(LoadCtx *lc, const YNode *n, Op *op)
{
	const YNode *rn = need(lc, n, op, "num_rows");
	return rn ? read_range(lc, rn, 1, MAX_NUMEL, "a row count", &op->attr->depth) : -1;
}

/* input_size: [H, W] (conv2d_grad_input: the conv2d input's) or
 * kernel_size: [KH, KW] (conv2d_grad_filter), into shape; strides and
 * padding as conv2d, `same` resolved against the conv2d's input and kernel. */
int attr_conv2d_grad(LoadCtx *lc, const YNode *n, Op *op)
{
	Attr *a = op->attr;
	bool grad_input = op->kind == OP_CONV2D_GRAD_INPUT;
	const YNode *sn = need(lc, n, op, grad_input ? "input_size" : "kernel_size");
	const YNode *tn = ynode_get(n, "strides"), *pn = ynode_get(n, "padding");
	int64_t st[2] = {1, 1};
	if (!sn || read_ints(lc, sn, 2, 1, MAX_NUMEL, "a size", a->shape.dim) != 0)
		return -1;
	a->shape.rank = 2;
	if (tn && read_ints(lc, tn, 2, 1, 1 << 30, "a stride", st) != 0)
		return -1;
	a->strides[0] = (int)st[0], a->strides[1] = (int)st[1];
	a->pad_mode = CONV_PAD_VALID;
	if (pn && pn->kind == YN_SCALAR && !pn->quoted && !strcmp(pn->str, "same"))
		a->pad_mode = CONV_PAD_SAME;
	else if (pn && !(pn->kind == YN_SCALAR && !pn->quoted && !strcmp(pn->str, "valid")))
		return conv_explicit(lc, pn, a);
	const Shape *other = operand_shape(lc, op, grad_input ? 1 : 0);
	if (a->pad_mode != CONV_PAD_SAME || other->rank != 4)
		return 0;
	for (int i = 0; i < 2; i++) {
		int64_t in = grad_input ? a->shape.dim[i] : other->dim[1 + i], k = grad_input ? other->dim[i] : a->shape.dim[i];
		conv_same(in, k, a->strides[i], &a->padding[i][0], &a->padding[i][1]);
	}
	return 0;
}
