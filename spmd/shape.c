/* shape.c: shape rules of the op table (result shape and dtype from operands and attributes), and graph_flops.
 *
 * A rule checks what it reads and reports "expected ..., found ..." at the
 * op.  Attributes are expected in the normal form the attribute parsers store
 * (attrs.c), but rules do not trust it: ops built by later passes skip the
 * parsers, so axes are range-checked (negative ones accepted) here too. */
#include "ops.h"

#include <stdarg.h>
#include <string.h>

#define MAX_NUMEL ((int64_t)SHAPE_MAX_NUMEL) /* the enum constant is unsigned */

static int fail(Diag *d, const Op *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(Diag *d, const Op *op, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	d->nerr++;
	diag_verror(d, op->pos, "error", fmt, ap);
	va_end(ap);
	return -1;
}

static const Value *arg(const Graph *g, const Op *op, int i) { return &g->values.a[op->in[i]]; }
static const char *op_name(const Op *op) { return op_table[op->kind].name; }

/* "[3, 4]" into a caller's buffer, for messages. */
static const char *fmt_shape(const Shape *s, char *buf, size_t n)
{
	shape_format(s, buf, n);
	return buf;
}

static int need_float(const Value *v, const Op *op, Diag *d)
{
	if (dtype_is_float(v->dtype))
		return 0;
	return fail(d, op, "expected a floating-point operand for %s, found %s '%s'", op_name(op), dtype_names[v->dtype],
	            v->name);
}

static int need_i32(const Value *v, const Op *op, Diag *d)
{
	if (v->dtype == DT_I32)
		return 0;
	return fail(d, op, "expected i32 ids for %s, found %s '%s'", op_name(op), dtype_names[v->dtype], v->name);
}

static int same_dtype(const Value *a, const Value *b, const Op *op, Diag *d)
{
	if (a->dtype == b->dtype)
		return 0;
	return fail(d, op, "expected operands of one dtype for %s, found %s and %s", op_name(op), dtype_names[a->dtype],
	            dtype_names[b->dtype]);
}

/* A result too big for the loader's limit (or with a zero or negative dim). */
static int check_result(const Shape *s, const Op *op, Diag *d)
{
	int64_t n = 1;
	for (int i = 0; i < s->rank; i++) {
		if (s->dim[i] < 1 || s->dim[i] > MAX_NUMEL / n) {
			char b[160];
			return fail(d, op, "expected a result of 1 to 2^40 elements for %s, found shape %s", op_name(op),
			            fmt_shape(s, b, sizeof b));
		}
		n *= s->dim[i];
	}
	return 0;
}

/* Axis a of a rank-r operand, negative from the end: its index, or -1 after reporting. */
static int norm_axis(int a, int r, const Op *op, Diag *d)
{
	if (a >= -r && a < r)
		return a < 0 ? a + r : a;
	return fail(d, op, "expected an axis in %d..%d for %s, found %d", -r, r - 1, op_name(op), a);
}

/* ---- elementwise ---- */

/* The mesh axes of a collective: at least one, each a mesh axis, each once.
 * The product of their sizes, or -1 after reporting. */
static int64_t group_size(const Graph *g, const Op *op, Diag *d)
{
	const Attr *a = op->attr;
	unsigned seen = 0;
	int64_t n = 1;
	if (a->ncax < 1 || a->ncax > MESH_MAX_AXES)
		return fail(d, op, "expected 1 to %d mesh axes for %s, found %d", MESH_MAX_AXES, op_name(op), a->ncax);
	for (int i = 0; i < a->ncax; i++) {
		int ax = a->cax[i];
		if (ax < 0 || ax >= g->mesh.naxes || (seen >> ax & 1))
			return fail(d, op, "expected distinct mesh axes for %s, found axis %d (the mesh has %d)", op_name(op),
			            ax, g->mesh.naxes);
		seen |= 1u << ax;
		n *= g->mesh.size[ax];
	}
	return n;
}

/* Unary elementwise (float), copy (any dtype), all_reduce and
 * collective_permute (any dtype, mesh axes checked): the operand's shape. */
int shape_unary(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0);
	unsigned fl = op_table[op->kind].flags;
	if ((fl & OPF_UNARY) && need_float(x, op, d) != 0)
		return -1;
	if ((fl & OPF_COLLECTIVE) && group_size(g, op, d) < 0)
		return -1;
	*out = x->shape;
	*dt = x->dtype;
	return 0;
}

/* numpy broadcasting of a and b into out; false if they do not broadcast. */
static bool broadcast(const Shape *a, const Shape *b, Shape *out)
{
	out->rank = a->rank > b->rank ? a->rank : b->rank;
	for (int i = 0; i < out->rank; i++) {
		int ia = a->rank - out->rank + i, ib = b->rank - out->rank + i;
		int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
		if (da != db && da != 1 && db != 1)
			return false;
		out->dim[i] = da == 1 ? db : da;
	}
	return true;
}

/* Binary elementwise: float, one dtype (a constant takes the other's), numpy broadcasting. */
int shape_binary(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *a = arg(g, op, 0), *b = arg(g, op, 1);
	bool ca = a->kind == VK_CONST, cb = b->kind == VK_CONST;
	if (!ca && !cb && same_dtype(a, b, op, d) != 0)
		return -1;
	const Value *t = ca ? b : a;
	if (need_float(t, op, d) != 0)
		return -1;
	if (!broadcast(&a->shape, &b->shape, out)) {
		char x[160], y[160];
		return fail(d, op, "expected shapes that broadcast for %s, found %s and %s", op_name(op),
		            fmt_shape(&a->shape, x, sizeof x), fmt_shape(&b->shape, y, sizeof y));
	}
	*dt = t->dtype;
	return 0;
}

/* ---- einsum ---- */

/* Terms left of "->" in the stored equation (commas + 1); nin when there is none. */
static int einsum_nterms(const Op *op)
{
	const char *s = op->attr->eq;
	if (!s)
		return op->nin;
	int n = 1;
	for (; *s && !(s[0] == '-' && s[1] == '>'); s++)
		n += *s == ',';
	return n;
}

/* Bind each letter of operand i to its size in size[]; -1 on a conflict. */
static int einsum_bind(const Graph *g, const Op *op, int i, int64_t *size, Diag *d)
{
	const Attr *a = op->attr;
	const Value *v = arg(g, op, i);
	char b[160];
	if (a->nlet[i] != v->shape.rank)
		return fail(d, op, "expected operand %d of einsum '%s' to have rank %d, found %s '%s'", i, a->eq, a->nlet[i],
		            fmt_shape(&v->shape, b, sizeof b), v->name);
	for (int k = 0; k < a->nlet[i]; k++) {
		unsigned char c = (unsigned char)a->let[i][k];
		int64_t n = v->shape.dim[k];
		if (c >= 128)
			return fail(d, op, "expected einsum letters, found byte %d", c);
		if (size[c] && size[c] != n)
			return fail(d, op, "expected one size for letter '%c' in einsum '%s', found %lld and %lld", c, a->eq,
			            (long long)size[c], (long long)n);
		size[c] = n;
	}
	return 0;
}

/* einsum: operands match the equation's terms, letters agree in size, float, one dtype. */
int shape_einsum(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Attr *a = op->attr;
	int64_t size[128] = {0};
	int nt = einsum_nterms(op);
	if (nt != op->nin)
		return fail(d, op, "expected %d operand%s for einsum '%s', found %d", nt, nt == 1 ? "" : "s",
		            a->eq ? a->eq : "", op->nin);
	for (int i = 0; i < op->nin; i++)
		if (need_float(arg(g, op, i), op, d) != 0 || einsum_bind(g, op, i, size, d) != 0)
			return -1;
	if (op->nin == 2 && same_dtype(arg(g, op, 0), arg(g, op, 1), op, d) != 0)
		return -1;
	out->rank = a->nlet[2];
	for (int k = 0; k < a->nlet[2]; k++) {
		unsigned char c = (unsigned char)a->let[2][k];
		if (c >= 128 || !size[c])
			return fail(d, op, "expected output letters that occur in the operands of '%s', found '%c'", a->eq, c);
		out->dim[k] = size[c];
	}
	*dt = arg(g, op, 0)->dtype;
	return check_result(out, op, d);
}

/* ---- reductions and one-axis ops ---- */

/* reduce_*: the axes in range and distinct; removed, or kept as 1 with keepdims. */
int shape_reduce(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Attr *a = op->attr;
	const Value *x = arg(g, op, 0);
	int r = x->shape.rank;
	bool red[MAX_RANK] = {false};
	if (need_float(x, op, d) != 0)
		return -1;
	if (a->naxes < 0 || a->naxes > r)
		return fail(d, op, "expected at most %d axes for %s, found %d", r, op_name(op), a->naxes);
	for (int i = 0; i < a->naxes; i++) {
		int ax = norm_axis(a->axes[i], r, op, d);
		if (ax < 0)
			return -1;
		if (red[ax])
			return fail(d, op, "expected each axis once for %s, found %d twice", op_name(op), ax);
		red[ax] = true;
	}
	out->rank = 0;
	for (int i = 0; i < r; i++)
		if (!red[i] || a->keepdims)
			out->dim[out->rank++] = red[i] ? 1 : x->shape.dim[i];
	*dt = x->dtype;
	return 0;
}

/* softmax, log_softmax, layer_norm: rank >= 1, the axis in range, float; same shape. */
int shape_axis(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0);
	if (x->shape.rank == 0)
		return fail(d, op, "expected an operand of rank >= 1 for %s, found a scalar '%s'", op_name(op), x->name);
	if (op->attr->naxes != 1)
		return fail(d, op, "expected one axis for %s, found %d", op_name(op), op->attr->naxes);
	if (norm_axis(op->attr->axes[0], x->shape.rank, op, d) < 0 || need_float(x, op, d) != 0)
		return -1;
	*out = x->shape;
	*dt = x->dtype;
	return 0;
}

/* ---- data movement ---- */

/* transpose: axes[0..rank) a permutation; out[i] = in[perm[i]]. */
int shape_transpose(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Attr *a = op->attr;
	const Value *x = arg(g, op, 0);
	int r = x->shape.rank;
	bool used[MAX_RANK] = {false};
	if (a->naxes != r)
		return fail(d, op, "expected a permutation of %d axes for transpose, found %d axes", r, a->naxes);
	out->rank = r;
	for (int i = 0; i < r; i++) {
		int ax = norm_axis(a->axes[i], r, op, d);
		if (ax < 0)
			return -1;
		if (used[ax])
			return fail(d, op, "expected a permutation for transpose, found axis %d twice", ax);
		used[ax] = true;
		out->dim[i] = x->shape.dim[ax];
	}
	*dt = x->dtype;
	return 0;
}

/* reshape: the target has the operand's number of elements. */
int shape_reshape(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0);
	const Shape *t = &op->attr->shape;
	char a[160], b[160];
	if (t->rank < 0 || t->rank > MAX_RANK || check_result(t, op, d) != 0)
		return -1;
	if (shape_numel(t) != shape_numel(&x->shape))
		return fail(d, op, "expected a shape of %lld elements to reshape %s, found %s",
		            (long long)shape_numel(&x->shape), fmt_shape(&x->shape, a, sizeof a), fmt_shape(t, b, sizeof b));
	*out = *t;
	*dt = x->dtype;
	return 0;
}

/* broadcast_to: numpy rules from the operand's shape to the target. */
int shape_broadcast_to(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0);
	const Shape *t = &op->attr->shape, *s = &x->shape;
	char a[160], b[160];
	if (t->rank < 0 || t->rank > MAX_RANK || check_result(t, op, d) != 0)
		return -1;
	bool ok = t->rank >= s->rank;
	for (int i = 0; ok && i < s->rank; i++) {
		int64_t sd = s->dim[i], td = t->dim[t->rank - s->rank + i];
		ok = sd == 1 || sd == td;
	}
	if (!ok)
		return fail(d, op, "expected a shape that %s broadcasts to, found %s", fmt_shape(s, a, sizeof a),
		            fmt_shape(t, b, sizeof b));
	*out = *t;
	*dt = x->dtype;
	return 0;
}

/* slice: 0 <= start < limit <= dim, stride >= 1; out = ceil((limit - start) / stride). */
int shape_slice(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Attr *a = op->attr;
	const Value *x = arg(g, op, 0);
	out->rank = x->shape.rank;
	for (int i = 0; i < x->shape.rank; i++) {
		int64_t lo = a->start[i], hi = a->limit[i], st = a->stride[i], n = x->shape.dim[i];
		if (lo < 0 || lo >= hi || hi > n)
			return fail(d, op, "expected 0 <= start < limit <= %lld in dim %d of slice, found start %lld, limit %lld",
			            (long long)n, i, (long long)lo, (long long)hi);
		if (st < 1)
			return fail(d, op, "expected a stride >= 1 in dim %d of slice, found %lld", i, (long long)st);
		out->dim[i] = (hi - lo - 1) / st + 1;
	}
	*dt = x->dtype;
	return 0;
}

/* concat: one rank and dtype, dims equal except the axis, which adds up. */
int shape_concat(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0);
	int ax = norm_axis(op->attr->axis, x->shape.rank, op, d);
	if (ax < 0)
		return -1;
	*out = x->shape;
	for (int i = 1; i < op->nin; i++) {
		const Value *y = arg(g, op, i);
		Shape s = y->shape;
		s.dim[ax] = x->shape.dim[ax];
		if (!shape_eq(&s, &x->shape)) {
			char a[160], b[160];
			return fail(d, op, "expected shapes equal except in axis %d for concat, found %s and %s", ax,
			            fmt_shape(&x->shape, a, sizeof a), fmt_shape(&y->shape, b, sizeof b));
		}
		if (same_dtype(x, y, op, d) != 0)
			return -1;
		out->dim[ax] += y->shape.dim[ax]; /* each <= 2^40: no overflow before the check */
		if (out->dim[ax] > MAX_NUMEL)
			return check_result(out, op, d);
	}
	*dt = x->dtype;
	return check_result(out, op, d);
}

/* pad: out = low + dim + high, low and high >= 0. */
int shape_pad(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Attr *a = op->attr;
	const Value *x = arg(g, op, 0);
	out->rank = x->shape.rank;
	for (int i = 0; i < x->shape.rank; i++) {
		if (a->start[i] < 0 || a->limit[i] < 0 || a->start[i] > MAX_NUMEL || a->limit[i] > MAX_NUMEL)
			return fail(d, op, "expected paddings in 0..2^40 in dim %d of pad, found %lld and %lld", i,
			            (long long)a->start[i], (long long)a->limit[i]);
		out->dim[i] = a->start[i] + x->shape.dim[i] + a->limit[i];
	}
	*dt = x->dtype;
	return check_result(out, op, d);
}

/* ---- convolution ---- */

/* One spatial dim of conv2d: out size, or -1 after reporting. */
static int64_t conv_dim(const Op *op, int i, int64_t in, int64_t k, Diag *d)
{
	const Attr *a = op->attr;
	int64_t st = a->strides[i], lo = a->padding[i][0], hi = a->padding[i][1];
	const char *what = i ? "width" : "height";
	if (st < 1)
		return fail(d, op, "expected a stride >= 1 for conv2d, found %lld", (long long)st);
	if (a->pad_mode == CONV_PAD_SAME)
		return (in + st - 1) / st;
	if (a->pad_mode == CONV_PAD_VALID)
		lo = hi = 0;
	if (lo < 0 || hi < 0 || lo > MAX_NUMEL || hi > MAX_NUMEL)
		return fail(d, op, "expected paddings >= 0 for conv2d, found %lld and %lld", (long long)lo, (long long)hi);
	if (in + lo + hi < k)
		return fail(d, op, "expected a kernel %s of at most %lld (the padded input), found %lld", what,
		            (long long)(in + lo + hi), (long long)k);
	return (in + lo + hi - k) / st + 1;
}

/* conv2d: input NHWC, kernel HWIO with I == C; result [N, OH, OW, O]. */
int shape_conv2d(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0), *w = arg(g, op, 1);
	char a[160], b[160];
	if (x->shape.rank != 4 || w->shape.rank != 4)
		return fail(d, op, "expected an NHWC input and an HWIO kernel (rank 4) for conv2d, found %s and %s",
		            fmt_shape(&x->shape, a, sizeof a), fmt_shape(&w->shape, b, sizeof b));
	if (need_float(x, op, d) || same_dtype(x, w, op, d))
		return -1;
	if (x->shape.dim[3] != w->shape.dim[2])
		return fail(d, op, "expected kernel input channels equal to the input's %lld for conv2d, found %lld",
		            (long long)x->shape.dim[3], (long long)w->shape.dim[2]);
	int64_t oh = conv_dim(op, 0, x->shape.dim[1], w->shape.dim[0], d);
	int64_t ow = oh < 0 ? -1 : conv_dim(op, 1, x->shape.dim[2], w->shape.dim[1], d);
	if (ow < 0)
		return -1;
	*out = (Shape){4, {x->shape.dim[0], oh, ow, w->shape.dim[3]}};
	*dt = x->dtype;
	return 0;
}

/* ---- lookups and casts ---- */

/* take: table (float, rank >= 1) rows by i32 ids: ids.shape ++ table.shape[1:]. */
int shape_take(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *t = arg(g, op, 0), *ids = arg(g, op, 1);
	if (t->shape.rank < 1)
		return fail(d, op, "expected a table of rank >= 1 for take, found a scalar '%s'", t->name);
	if (need_float(t, op, d) || need_i32(ids, op, d))
		return -1;
	int r = ids->shape.rank + t->shape.rank - 1;
	if (r > MAX_RANK)
		return fail(d, op, "expected a result of rank <= %d for take, found rank %d", MAX_RANK, r);
	*out = ids->shape;
	for (int i = 1; i < t->shape.rank; i++)
		out->dim[out->rank++] = t->shape.dim[i];
	*dt = t->dtype;
	return check_result(out, op, d);
}

/* one_hot: i32 ids to f32 ids.shape ++ [depth]. */
int shape_one_hot(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *ids = arg(g, op, 0);
	if (need_i32(ids, op, d))
		return -1;
	if (ids->shape.rank >= MAX_RANK)
		return fail(d, op, "expected ids of rank < %d for one_hot, found rank %d", MAX_RANK, ids->shape.rank);
	*out = ids->shape;
	out->dim[out->rank++] = op->attr->depth;
	*dt = DT_F32;
	return check_result(out, op, d);
}

/* cast: any dtype to any; same shape. */
int shape_cast(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	if ((unsigned)op->attr->dtype >= DT_COUNT)
		return fail(d, op, "expected a dtype for cast, found %d", (int)op->attr->dtype);
	*out = arg(g, op, 0)->shape;
	*dt = op->attr->dtype;
	return 0;
}

/* ---- collectives ---- */

/* Dim `dim` of the operand (negative from the end), or -1 after reporting. */
static int collective_dim(const Value *x, int dim, const Op *op, Diag *d)
{
	if (x->shape.rank == 0)
		return fail(d, op, "expected an operand of rank >= 1 for %s, found a scalar '%s'", op_name(op), x->name);
	return norm_axis(dim, x->shape.rank, op, d);
}

static int divide_dim(Shape *s, int dim, int64_t n, const Op *op, Diag *d)
{
	if (s->dim[dim] % n == 0) {
		s->dim[dim] /= n;
		return 0;
	}
	return fail(d, op, "expected dim %d to divide by %lld (the size of the mesh axes) for %s, found size %lld", dim,
	            (long long)n, op_name(op), (long long)s->dim[dim]);
}

/* The group size of a collective (or shard_roll) into *n and its dim
 * (attr dim) of operand x, non-negative; -1 after reporting. */
static int group_dim(const Graph *g, const Op *op, const Value *x, int64_t *n, Diag *d)
{
	*n = group_size(g, op, d);
	return *n < 0 ? -1 : collective_dim(x, op->attr->dim, op, d);
}

/* all_gather: dim multiplied by the group size. */
int shape_all_gather(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0);
	int64_t n;
	int dim = group_dim(g, op, x, &n, d);
	if (dim < 0)
		return -1;
	*out = x->shape;
	out->dim[dim] *= n; /* <= 2^40 * 2^20 */
	*dt = x->dtype;
	return check_result(out, op, d);
}

/* reduce_scatter: dim divided by the group size (it must divide). */
int shape_reduce_scatter(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0);
	int64_t n;
	int dim = group_dim(g, op, x, &n, d);
	if (dim < 0)
		return -1;
	*out = x->shape;
	*dt = x->dtype;
	return divide_dim(out, dim, n, op, d);
}

/* all_to_all: split dim divided by the group size, concat dim multiplied. */
int shape_all_to_all(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0);
	int64_t n;
	int sd = group_dim(g, op, x, &n, d);
	int cd = sd < 0 ? -1 : collective_dim(x, op->attr->dim2, op, d);
	if (cd < 0)
		return -1;
	*out = x->shape;
	*dt = x->dtype;
	if (divide_dim(out, sd, n, op, d) != 0)
		return -1;
	out->dim[cd] *= n;
	return 0;
}

/* ---- FLOPs ---- */

static double einsum_flops(const Graph *g, const Op *op)
{
	const Attr *a = op->attr;
	double size[128] = {0}, f = 1;
	for (int i = 0; i < op->nin && i < 2; i++)
		for (int k = 0; k < a->nlet[i]; k++)
			size[(unsigned char)a->let[i][k] & 127] = (double)arg(g, op, i)->shape.dim[k];
	for (int c = 0; c < 128; c++)
		f *= size[c] ? size[c] : 1;
	return op->nin == 2 ? 2 * f : f;
}

double graph_op_flops(const Graph *g, const Op *op)
{
	double n = (double)shape_numel(&g->values.a[op->out].shape);
	unsigned fl = op_table[op->kind].flags;
	for (int i = 0; i < op->nin; i++) {
		double k = (double)shape_numel(&arg(g, op, i)->shape);
		n = k > n ? k : n;
	}
	switch (op->kind) {
	case OP_EINSUM:
		return einsum_flops(g, op);
	case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM:
		return 5 * n;
	case OP_CONV2D: {
		const Shape *o = &g->values.a[op->out].shape, *w = &arg(g, op, 1)->shape;
		return 2.0 * (double)o->dim[0] * (double)o->dim[1] * (double)o->dim[2] * (double)w->dim[0] *
		       (double)w->dim[1] * (double)w->dim[2] * (double)w->dim[3];
	}
	default:
		return fl & (OPF_UNARY | OPF_BINARY | OPF_REDUCE) ? n : 0;
	}
}

/* FLOPs of one forward evaluation: einsum 2 * (product of the letters' sizes)
 * (one operand: the product), elementwise and reductions the larger of the
 * operands' and result's element counts, softmax and layer_norm 5 per
 * element, conv2d 2*N*OH*OW*KH*KW*C*O, data movement and collectives 0. */
double graph_flops(const Graph *g)
{
	double f = 0;
	for (int i = 0; i < g->ops.n; i++)
		f += graph_op_flops(g, &g->ops.a[i]);
	return f;
}

/* ---- losses and gradient ops ---- */

/* softmax_cross_entropy: float logits [..., C] (rank >= 1) and i32 labels
 * [...] (the logits' other dims); a scalar of the logits' dtype. */
int shape_softmax_cross_entropy(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0), *y = arg(g, op, 1);
	char a[160], b[160];
	if (x->shape.rank == 0)
		return fail(d, op, "expected logits of rank >= 1 (classes last) for %s, found a scalar '%s'",
		            op_table[op->kind].name, x->name);
	if (need_float(x, op, d) || need_i32(y, op, d))
		return -1;
	Shape want = x->shape;
	want.rank--;
	if (!shape_eq(&want, &y->shape))
		return fail(d, op, "expected labels of shape %s (the logits' shape without the class axis), found %s '%s'",
		            fmt_shape(&want, a, sizeof a), fmt_shape(&y->shape, b, sizeof b), y->name);
	*out = (Shape){0};
	*dt = x->dtype;
	return 0;
}

/* softmax_cross_entropy_grad: the loss's logits and labels, and a float
 * scalar g; the logits' shape and dtype. */
int shape_softmax_cross_entropy_grad(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0), *gy = arg(g, op, 2);
	if (shape_softmax_cross_entropy(g, op, out, dt, d) != 0 || need_float(gy, op, d))
		return -1;
	if (gy->shape.rank != 0) {
		char a[160];
		return fail(d, op, "expected a scalar gradient for softmax_cross_entropy_grad, found %s '%s'",
		            fmt_shape(&gy->shape, a, sizeof a), gy->name);
	}
	*out = x->shape;
	return check_result(out, op, d);
}

/* The split loss's statistics operand k of op (the max, or the sum of
 * exponentials): the logits' dtype and shape with one class. */
static int xent_stat_operand(const Graph *g, const Op *op, int k, Diag *d)
{
	const Value *x = arg(g, op, 0), *m = arg(g, op, k);
	Shape want = x->shape;
	want.dim[want.rank - 1] = 1;
	char a[160], b[160];
	if (same_dtype(x, m, op, d))
		return -1;
	if (!shape_eq(&want, &m->shape))
		return fail(d, op, "expected a statistic of shape %s (the logits' with one class) for %s, found %s '%s'",
		            fmt_shape(&want, a, sizeof a), op_table[op->kind].name, fmt_shape(&m->shape, b, sizeof b),
		            m->name);
	return 0;
}

/* softmax_cross_entropy_stats_shard [logits, max, labels]: the labels'
 * shape and 2, in the logits' dtype. */
int shape_xent_stats_shard(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	Op as = *op; /* the loss's checks on logits and labels */
	int in[2] = {op->in[0], op->in[2]};
	as.in = in, as.nin = 2;
	if (shape_softmax_cross_entropy(g, &as, out, dt, d) != 0 || xent_stat_operand(g, op, 1, d) != 0)
		return -1;
	*out = arg(g, op, 2)->shape;
	out->dim[out->rank++] = 2;
	return check_result(out, op, d);
}

/* softmax_cross_entropy_grad_shard [logits, max, sum, labels, g]: the
 * logits' shape and dtype. */
int shape_xent_grad_shard(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	Op as = *op; /* softmax_cross_entropy_grad's checks on logits, labels and g */
	int in[3] = {op->in[0], op->in[3], op->in[4]};
	as.in = in, as.nin = 3;
	if (shape_softmax_cross_entropy_grad(g, &as, out, dt, d) != 0 || xent_stat_operand(g, op, 1, d) != 0 ||
	    xent_stat_operand(g, op, 2, d) != 0)
		return -1;
	return 0;
}

/* mse: prediction and target of one float dtype and one shape; a scalar. */
int shape_mse(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0), *y = arg(g, op, 1);
	char a[160], b[160];
	if (need_float(x, op, d) || same_dtype(x, y, op, d))
		return -1;
	if (!shape_eq(&x->shape, &y->shape))
		return fail(d, op, "expected a target of the prediction's shape %s for mse, found %s '%s'",
		            fmt_shape(&x->shape, a, sizeof a), fmt_shape(&y->shape, b, sizeof b), y->name);
	*out = (Shape){0};
	*dt = x->dtype;
	return 0;
}

/* take_grad: grads [ids..., row...] and i32 ids [ids...] to [num_rows, row...]. */
int shape_take_grad(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0), *ids = arg(g, op, 1);
	char a[160], b[160];
	if (need_float(x, op, d) || need_i32(ids, op, d))
		return -1;
	int k = ids->shape.rank;
	Shape lead = x->shape;
	lead.rank = k <= x->shape.rank ? k : x->shape.rank;
	if (k > x->shape.rank || !shape_eq(&lead, &ids->shape))
		return fail(d, op, "expected gradients whose leading dims are the ids' %s for take_grad, found %s '%s'",
		            fmt_shape(&ids->shape, a, sizeof a), fmt_shape(&x->shape, b, sizeof b), x->name);
	if (x->shape.rank - k + 1 > MAX_RANK)
		return fail(d, op, "expected a result of rank <= %d for take_grad, found rank %d", MAX_RANK,
		            x->shape.rank - k + 1);
	if (op->attr->depth < 1)
		return fail(d, op, "expected num_rows >= 1 for take_grad, found %lld", (long long)op->attr->depth);
	out->rank = 1;
	out->dim[0] = op->attr->depth;
	for (int i = k; i < x->shape.rank; i++)
		out->dim[out->rank++] = x->shape.dim[i];
	*dt = x->dtype;
	return check_result(out, op, d);
}

/* The conv2d of input x and kernel w (attributes of op) must give dy's shape. */
static int conv_grad_check(const Op *op, const Shape *x, const Shape *w, const Shape *dy, Diag *d)
{
	char a[160], b[160];
	if (x->rank != 4 || w->rank != 4 || dy->rank != 4)
		return fail(d, op, "expected rank-4 input, kernel and gradient for %s, found %s and %s", op_name(op),
		            fmt_shape(x, a, sizeof a), fmt_shape(w, b, sizeof b));
	if (x->dim[3] != w->dim[2])
		return fail(d, op, "expected kernel input channels equal to the input's %lld for %s, found %lld",
		            (long long)x->dim[3], op_name(op), (long long)w->dim[2]);
	int64_t oh = conv_dim(op, 0, x->dim[1], w->dim[0], d);
	int64_t ow = oh < 0 ? -1 : conv_dim(op, 1, x->dim[2], w->dim[1], d);
	if (ow < 0)
		return -1;
	Shape want = {4, {x->dim[0], oh, ow, w->dim[3]}};
	if (!shape_eq(&want, dy))
		return fail(d, op, "expected a gradient of the conv2d's result shape %s for %s, found %s",
		            fmt_shape(&want, a, sizeof a), op_name(op), fmt_shape(dy, b, sizeof b));
	return 0;
}

/* attr shape: [H, W] of a conv2d input or kernel, each >= 1. */
static int conv_grad_size(const Op *op, Diag *d)
{
	const Shape *s = &op->attr->shape;
	if (s->rank == 2 && s->dim[0] >= 1 && s->dim[1] >= 1 && s->dim[0] <= MAX_NUMEL && s->dim[1] <= MAX_NUMEL)
		return 0;
	return fail(d, op, "expected a size [H, W] of two dims >= 1 for %s, found rank %d", op_name(op), s->rank);
}

/* conv2d_grad_input: [dy, kernel] to the input [N, H, W, C], N from dy, C
 * from the kernel, H and W from attr shape (so a local op keeps its split N and C). */
int shape_conv2d_grad_input(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *dy = arg(g, op, 0), *w = arg(g, op, 1);
	if (need_float(dy, op, d) || same_dtype(dy, w, op, d) || conv_grad_size(op, d))
		return -1;
	if (dy->shape.rank != 4 || w->shape.rank != 4)
		return conv_grad_check(op, &dy->shape, &w->shape, &dy->shape, d);
	Shape x = {4, {dy->shape.dim[0], op->attr->shape.dim[0], op->attr->shape.dim[1], w->shape.dim[2]}};
	if (conv_grad_check(op, &x, &w->shape, &dy->shape, d) != 0)
		return -1;
	*out = x;
	*dt = dy->dtype;
	return 0;
}

/* conv2d_grad_filter: [x, dy] to the kernel [KH, KW, C, O], KH and KW from
 * attr shape, C from x, O from dy. */
int shape_conv2d_grad_filter(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0), *dy = arg(g, op, 1);
	if (need_float(x, op, d) || same_dtype(x, dy, op, d) || conv_grad_size(op, d))
		return -1;
	if (x->shape.rank != 4 || dy->shape.rank != 4)
		return conv_grad_check(op, &x->shape, &dy->shape, &dy->shape, d);
	Shape w = {4, {op->attr->shape.dim[0], op->attr->shape.dim[1], x->shape.dim[3], dy->shape.dim[3]}};
	if (conv_grad_check(op, &x->shape, &w, &dy->shape, d) != 0)
		return -1;
	*out = w;
	*dt = x->dtype;
	return 0;
}

/* shard_slice: the result is the block the attribute names (checked ranks). */
int shape_shard_slice(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *v = &g->values.a[op->in[0]];
	const Attr *at = op->attr;
	*out = at->shape;
	*dt = v->dtype;
	if (at->shape.rank != v->shape.rank || at->spec.rank != v->shape.rank || at->spec_from.rank != v->shape.rank ||
	    at->global.rank != v->shape.rank) {
		diag_error(d, op->pos, "expected shard_slice shapes and specs of rank %d, found rank %d", v->shape.rank,
		           at->shape.rank);
		return -1;
	}
	return 0;
}

/* shard_roll: the operand's shape and dtype; its axes are a collective's,
 * and the rolled dim must split into as many equal parts as they have
 * devices, since each device turns by a whole number of parts. */
int shape_shard_roll(const Graph *g, const Op *op, Shape *out, DType *dt, Diag *d)
{
	const Value *x = arg(g, op, 0);
	int64_t n;
	int dim = group_dim(g, op, x, &n, d);
	if (dim < 0)
		return -1;
	if (x->shape.dim[dim] % n != 0) {
		char axes[160];
		mesh_axes_text(&g->mesh, op->attr->cax, op->attr->ncax, axes, sizeof axes);
		return fail(d, op, "expected dim %d's size divisible by %lld (the devices over [%s]) for %s, found %lld", dim,
		            (long long)n, axes, op_name(op), (long long)x->shape.dim[dim]);
	}
	*out = x->shape;
	*dt = x->dtype;
	return 0;
}
