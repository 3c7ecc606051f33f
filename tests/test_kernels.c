/* test_kernels.c: every kernel against an independent naive loop written here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "../runtime/kernels.h"

/* ---- helpers ---- */

static uint64_t rng = 88172645463325252ull;

static double urand(void) /* [0, 1) */
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

static Shape shape_of(const int64_t *d, int n)
{
	Shape s = {.rank = n};
	for (int i = 0; i < n; i++)
		s.dim[i] = d[i];
	return s;
}
#define SH(...) shape_of((int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
static const Shape SCALAR = {0};

/* One op in a graph of its own, with operand and result tensors. */
typedef struct {
	Graph g;
	int op, nin;
	Tensor in[8];
	Tensor out;
	KernCtx kc;
} Case;

/* Operands get random values in [lo, hi) (floats) or [0, 10) (i32). */
static void case_init(Case *c, OpKind k, int nin, const Shape *ins, const DType *dts, const Shape *os, DType odt,
                      float lo, float hi)
{
	memset(c, 0, sizeof *c);
	graph_init(&c->g);
	int ids[8];
	for (int i = 0; i < nin; i++) {
		char name[16];
		snprintf(name, sizeof name, "a%d", i);
		ids[i] = graph_value(&c->g, name, dts[i], &ins[i], VK_INPUT, (Pos){0});
		tensor_alloc(&c->in[i], dts[i], &ins[i]);
		for (int64_t j = 0; j < shape_numel(&ins[i]); j++)
			if (dts[i] == DT_I32)
				tensor_i32(&c->in[i])[j] = (int32_t)(urand() * 10);
			else
				tensor_f32(&c->in[i])[j] = frand(lo, hi);
	}
	int y = graph_value(&c->g, "y", odt, os, VK_INTER, (Pos){0});
	c->op = graph_op(&c->g, k, ids, nin, y, (Pos){0});
	c->nin = nin;
	tensor_alloc(&c->out, odt, os);
}

static Attr *case_attr(Case *c) { return c->g.ops.a[c->op].attr; }

static int case_run(Case *c)
{
	const Tensor *in[8];
	for (int i = 0; i < c->nin; i++)
		in[i] = &c->in[i];
	const Op *op = &c->g.ops.a[c->op];
	return op_kernels[op->kind](&c->kc, op, in, &c->out);
}

static void case_free(Case *c)
{
	for (int i = 0; i < c->nin; i++)
		tensor_free(&c->in[i]);
	tensor_free(&c->out);
	graph_free(&c->g);
}

/* One operand, same shape result. */
static void case1(Case *c, OpKind k, const Shape *s, DType dt, float lo, float hi)
{
	case_init(c, k, 1, s, (DType[]){dt}, s, dt, lo, hi);
}

static void check_close(double got, double want, double rtol, double atol, const char *what, int64_t i)
{
	if ((isnan(want) && isnan(got)) || got == want)
		return;
	if (fabs(got - want) <= atol + rtol * fabs(want))
		return;
	fail_msg("%s: element %lld: got %.9g, want %.9g", what, (long long)i, got, want);
}

/* Multi-index of flat i in s. */
static void unflat(const Shape *s, int64_t i, int64_t *idx)
{
	for (int d = s->rank - 1; d >= 0; d--) {
		idx[d] = i % s->dim[d];
		i /= s->dim[d];
	}
}

static int64_t flat(const Shape *s, const int64_t *idx)
{
	int64_t k = 0;
	for (int d = 0; d < s->rank; d++)
		k = k * s->dim[d] + idx[d];
	return k;
}

/* The op table names the kernels of runtime/kernels.c. */
static void test_op_table_kernels(void **state)
{
	(void)state;
	assert_ptr_equal(op_kernels[OP_EINSUM], kern_einsum);
	assert_ptr_equal(op_kernels[OP_RESHAPE], kern_copy);
	assert_ptr_equal(op_kernels[OP_CAST], kern_cast);
	assert_null(op_kernels[OP_ALL_REDUCE]);
}

/* ---- unary ---- */

static double ref_unary(OpKind k, double x)
{
	switch (k) {
	case OP_NEG: return -x;
	case OP_ABS: return fabs(x);
	case OP_EXP: return exp(x);
	case OP_LOG: return log(x);
	case OP_SQRT: return sqrt(x);
	case OP_RSQRT: return 1 / sqrt(x);
	case OP_TANH: return tanh(x);
	case OP_SIGMOID: return 1 / (1 + exp(-x));
	case OP_RELU: return x > 0 ? x : 0;
	case OP_GELU: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
	case OP_SQUARE: return x * x;
	case OP_RECIPROCAL: return 1 / x;
	default: return NAN;
	}
}

static void test_unary(void **state)
{
	(void)state;
	static const OpKind kinds[] = {OP_NEG, OP_ABS, OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT, OP_TANH,
	                               OP_SIGMOID, OP_RELU, OP_GELU, OP_SQUARE, OP_RECIPROCAL};
	for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
		OpKind k = kinds[i];
		bool pos = k == OP_LOG || k == OP_SQRT || k == OP_RSQRT;
		Case c;
		Shape s = SH(3, 5, 7);
		case1(&c, k, &s, DT_F32, pos ? 0.05f : -4, 4);
		float *x = tensor_f32(&c.in[0]);
		if (!pos)
			x[0] = 0, x[1] = -1.5f, x[2] = 2.5f;
		assert_int_equal(case_run(&c), 0);
		for (int64_t j = 0; j < shape_numel(&s); j++)
			check_close(tensor_f32(&c.out)[j], ref_unary(k, x[j]), 2e-6, 1e-6, op_table[k].name, j);
		case_free(&c);
	}
}

static void test_sigmoid_extremes(void **state)
{
	(void)state;
	Case c;
	Shape s = SH(6);
	case1(&c, OP_SIGMOID, &s, DT_F32, 0, 1);
	float x[6] = {-1000, -100, -30, 30, 100, 1000};
	memcpy(c.in[0].data, x, sizeof x);
	assert_int_equal(case_run(&c), 0);
	for (int j = 0; j < 6; j++) {
		float y = tensor_f32(&c.out)[j];
		assert_false(isnan(y));
		check_close(y, ref_unary(OP_SIGMOID, x[j]), 1e-6, 1e-30, "sigmoid", j);
	}
	case_free(&c);
}

static void test_unary_i32(void **state)
{
	(void)state;
	static const OpKind kinds[] = {OP_NEG, OP_ABS, OP_RELU, OP_SQUARE};
	for (size_t i = 0; i < 4; i++) {
		Case c;
		Shape s = SH(9);
		case1(&c, kinds[i], &s, DT_I32, 0, 0);
		for (int j = 0; j < 9; j++)
			tensor_i32(&c.in[0])[j] = j - 4;
		assert_int_equal(case_run(&c), 0);
		for (int j = 0; j < 9; j++)
			assert_int_equal(tensor_i32(&c.out)[j], (int32_t)ref_unary(kinds[i], j - 4));
		case_free(&c);
	}
	Case c;
	Shape s = SH(2);
	case1(&c, OP_EXP, &s, DT_I32, 0, 0);
	assert_int_equal(case_run(&c), -1);
	assert_non_null(strstr(c.kc.err, "expected"));
	case_free(&c);
}

/* ---- binary with broadcasting ---- */

static double ref_binary(OpKind k, double a, double b)
{
	switch (k) {
	case OP_ADD: return a + b;
	case OP_SUB: return a - b;
	case OP_MUL: return a * b;
	case OP_DIV: return a / b;
	case OP_MAX: return a > b ? a : b;
	case OP_MIN: return a < b ? a : b;
	case OP_POW: return pow(a, b);
	default: return NAN;
	}
}

/* Broadcast result shape (numpy rules; the cases are valid). */
static Shape bshape(const Shape *a, const Shape *b)
{
	Shape s = {.rank = a->rank > b->rank ? a->rank : b->rank};
	for (int d = 0; d < s.rank; d++) {
		int ea = d - (s.rank - a->rank), eb = d - (s.rank - b->rank);
		int64_t x = ea >= 0 ? a->dim[ea] : 1, y = eb >= 0 ? b->dim[eb] : 1;
		s.dim[d] = x > y ? x : y;
	}
	return s;
}

/* The flat index in operand shape a of result index idx. */
static int64_t bindex(const Shape *a, const Shape *out, const int64_t *idx)
{
	int64_t k = 0;
	for (int d = 0; d < a->rank; d++) {
		int64_t i = idx[d + out->rank - a->rank];
		k = k * a->dim[d] + (a->dim[d] == 1 ? 0 : i);
	}
	return k;
}

static void check_binary(OpKind k, Shape a, Shape b, DType dt)
{
	Shape o = bshape(&a, &b);
	Case c;
	bool pw = k == OP_POW, dv = k == OP_DIV;
	case_init(&c, k, 2, (Shape[]){a, b}, (DType[]){dt, dt}, &o, dt, pw || dv ? 0.5f : -2, 2);
	if (dt == DT_I32)
		for (int64_t j = 0; j < shape_numel(&b); j++)
			tensor_i32(&c.in[1])[j] = (int32_t)(j % 5) + 1 - (k == OP_SUB ? 3 : 0);
	assert_int_equal(case_run(&c), 0);
	for (int64_t j = 0; j < shape_numel(&o); j++) {
		int64_t idx[MAX_RANK];
		unflat(&o, j, idx);
		int64_t ia = bindex(&a, &o, idx), ib = bindex(&b, &o, idx);
		if (dt == DT_I32) {
			int32_t x = tensor_i32(&c.in[0])[ia], y = tensor_i32(&c.in[1])[ib];
			int32_t want = k == OP_DIV ? x / y : k == OP_POW ? (int32_t)pow(x, y) : (int32_t)ref_binary(k, x, y);
			assert_int_equal(tensor_i32(&c.out)[j], want);
		} else
			check_close(tensor_f32(&c.out)[j], ref_binary(k, tensor_f32(&c.in[0])[ia], tensor_f32(&c.in[1])[ib]),
			            2e-6, 1e-7, op_table[k].name, j);
	}
	case_free(&c);
}

static void test_binary(void **state)
{
	(void)state;
	static const OpKind kinds[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN, OP_POW};
	Shape cases[][2] = {
		{SH(3, 4), SH(3, 4)},       /* same shape */
		{SH(3, 4), SCALAR},         /* scalar operand */
		{SCALAR, SH(3, 4)},
		{SH(3, 4), SH(4)},          /* row */
		{SH(3, 4), SH(3, 1)},       /* column */
		{SH(2, 1, 4), SH(3, 1)},    /* rank-different, both broadcast */
		{SH(1, 3, 1, 5), SH(2, 1, 4, 1)},
		{SH(5), SH(1)},
	};
	for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
		for (size_t j = 0; j < sizeof cases / sizeof *cases; j++)
			check_binary(kinds[i], cases[j][0], cases[j][1], DT_F32);
	for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
		check_binary(kinds[i], SH(2, 1, 4), SH(3, 1), DT_I32);
}

/* A scalar f32 constant takes the dtype of the other operand (docs/format.md). */
static void test_binary_constant_dtype(void **state)
{
	(void)state;
	DType dts[2] = {DT_BF16, DT_F16};
	float want[2] = {0.10009765625f, 0.300048828125f}, c[2] = {0.1f, 0.3f}; /* numpy: float16(0.3) */
	for (int t = 0; t < 2; t++) {
		Shape s = SH(3);
		Case k;
		case_init(&k, OP_MUL, 2, (Shape[]){s, SCALAR}, (DType[]){dts[t], DT_F32}, &s, dts[t], 0, 0);
		float a[3] = {1, 2, -0.5f};
		memcpy(k.in[0].data, a, sizeof a);
		tensor_f32(&k.in[1])[0] = c[t];
		assert_int_equal(case_run(&k), 0);
		for (int i = 0; i < 3; i++)
			if (tensor_f32(&k.out)[i] != a[i] * want[t])
				fail_msg("%s: %a * %a: got %a, want %a", dtype_names[dts[t]], a[i], c[t], tensor_f32(&k.out)[i],
				         a[i] * want[t]);
		case_free(&k);
	}
}

static void test_binary_i32_div_zero(void **state)
{
	(void)state;
	Case c;
	Shape s = SH(3);
	case_init(&c, OP_DIV, 2, (Shape[]){s, s}, (DType[]){DT_I32, DT_I32}, &s, DT_I32, 0, 0);
	tensor_i32(&c.in[1])[0] = 1, tensor_i32(&c.in[1])[1] = 0;
	assert_int_equal(case_run(&c), -1);
	assert_non_null(strstr(c.kc.err, "divisor"));
	case_free(&c);
}

/* ---- einsum ---- */

/* Letter sizes for the einsum cases, indexed by letter. */
typedef struct {
	int64_t size[128];
} Sizes;

static Sizes sizes_of(const char *spec) /* "i5 j7 k6" */
{
	Sizes s = {{0}};
	for (const char *p = spec; *p;) {
		char c = *p++;
		s.size[(int)c] = strtoll(p, (char **)&p, 10);
		while (*p == ' ')
			p++;
	}
	return s;
}

/* Naive einsum: one loop over every combination of letter values. */
static void ref_einsum(const char *let[3], const int nlet[3], int nin, const Tensor *a, const Tensor *b,
                       const Sizes *sz, double *y, int64_t ny)
{
	char all[32];
	int nl = 0;
	for (int t = 0; t < 3; t++)
		for (int i = 0; i < nlet[t]; i++)
			if (!memchr(all, let[t][i], (size_t)nl))
				all[nl++] = let[t][i];
	memset(y, 0, sizeof(double) * (size_t)ny);
	int64_t val[128] = {0}, total = 1;
	for (int l = 0; l < nl; l++)
		total *= sz->size[(int)all[l]];
	for (int64_t combo = 0; combo < total; combo++) {
		int64_t r = combo;
		for (int l = nl - 1; l >= 0; l--) {
			val[(int)all[l]] = r % sz->size[(int)all[l]];
			r /= sz->size[(int)all[l]];
		}
		int64_t off[3] = {0, 0, 0};
		for (int t = 0; t < 3; t++)
			for (int i = 0; i < nlet[t]; i++)
				off[t] = off[t] * sz->size[(int)let[t][i]] + val[(int)let[t][i]];
		double p = tensor_f32(a)[off[0]];
		if (nin == 2)
			p *= tensor_f32(b)[off[1]];
		y[off[2]] += p;
	}
}

/* Run "eq" (explicit, one or two operands) with the letter sizes in spec. */
static void check_einsum(const char *eq, const char *spec)
{
	Sizes sz = sizes_of(spec);
	char buf[64];
	snprintf(buf, sizeof buf, "%s", eq);
	char *arrow = strstr(buf, "->");
	*arrow = 0;
	const char *let[3] = {buf, NULL, arrow + 2};
	char *comma = strchr(buf, ',');
	int nin = comma ? 2 : 1;
	if (comma)
		*comma = 0, let[1] = comma + 1;
	int nlet[3] = {(int)strlen(let[0]), nin == 2 ? (int)strlen(let[1]) : 0, (int)strlen(let[2])};
	Shape s[3] = {{0}};
	for (int t = 0; t < 3; t++) {
		s[t].rank = nlet[t];
		for (int i = 0; i < nlet[t]; i++)
			s[t].dim[i] = sz.size[(int)let[t][i]];
	}
	Case c;
	case_init(&c, OP_EINSUM, nin, (Shape[]){s[0], s[1]}, (DType[]){DT_F32, DT_F32}, &s[2], DT_F32, -1, 1);
	Attr *at = case_attr(&c);
	at->eq = eq;
	for (int t = 0; t < 3; t++) {
		at->nlet[t] = nlet[t];
		if (nlet[t])
			memcpy(at->let[t], let[t], (size_t)nlet[t]);
	}
	for (int64_t j = 0; j < shape_numel(&s[2]); j++)
		tensor_f32(&c.out)[j] = NAN; /* every element must be written */
	assert_int_equal(case_run(&c), 0);
	int64_t ny = shape_numel(&s[2]);
	double *y = malloc(sizeof(double) * (size_t)(ny + 1));
	ref_einsum(let, nlet, nin, &c.in[0], &c.in[1], &sz, y, ny);
	for (int64_t j = 0; j < ny; j++)
		check_close(tensor_f32(&c.out)[j], y[j], 1e-5, 1e-5, eq, j);
	free(y);
	case_free(&c);
}

static void test_einsum_matmul(void **state)
{
	(void)state;
	check_einsum("ik,kj->ij", "i33 k17 j29");
	check_einsum("ij,jk->ik", "i1 j20 k9");            /* one row */
	check_einsum("ij,jk->ik", "i8 j0 k9");             /* empty contraction: zeros */
	check_einsum("ki,kj->ij", "i12 k10 j11");          /* transposed A */
	check_einsum("ij,kj->ik", "i12 j10 k11");          /* transposed B */
	check_einsum("ki,jk->ij", "i12 k10 j11");          /* both */
	check_einsum("ij,jk->ki", "i12 j10 k11");          /* transposed result */
	check_einsum("ji,kj->ik", "i7 j9 k8");             /* implicit-mode order of "ji,kj" */
	check_einsum("ba,ac->bc", "a6 b9 c13");
}

static void test_einsum_batched(void **state)
{
	(void)state;
	check_einsum("bij,bjk->bik", "b3 i9 j7 k8");
	check_einsum("bhqd,bhkd->bhqk", "b2 h3 q5 k6 d8");
	check_einsum("bqhd,bkhd->bhqk", "b2 h3 q5 k6 d8");  /* strided batch */
	check_einsum("bij,jk->bik", "b4 i5 j6 k7");         /* b folds into M */
	check_einsum("ibj,bjk->bki", "b3 i5 j6 k7");
	check_einsum("jik,kl->lij", "i4 j5 k6 l7");
	check_einsum("abc,cd->dba", "a3 b4 c5 d6");
	check_einsum("bij,bjk->bik", "b1 i9 j7 k8");
	check_einsum("ik,jkl->ijl", "i5 j4 k6 l3");     /* B copied */
	check_einsum("ik,kjl->jil", "i5 j4 k6 l3");     /* result through scratch */
	check_einsum("kbi,jbk->ibj", "b3 i5 j4 k6");    /* a bit of everything */
}

static void test_einsum_other(void **state)
{
	(void)state;
	check_einsum("ij,jk->i", "i6 j7 k8");    /* sum-out k */
	check_einsum("ij,jk->k", "i6 j7 k8");    /* sum-out i */
	check_einsum("ij,jk->i", "i16 j9 k8");   /* sum-out, then sgemm */
	check_einsum("aij,jk->k", "a3 i6 j9 k8");
	check_einsum("i,j->ij", "i9 j11");       /* outer product */
	check_einsum("ij,k->kji", "i3 j4 k5");
	check_einsum("ij->ji", "i5 j7");         /* single operand */
	check_einsum("ij->", "i5 j7");
	check_einsum("ii->i", "i6");             /* diagonal */
	check_einsum("ii->", "i6");              /* trace */
	check_einsum("iij,jk->ik", "i5 j6 k7");  /* diagonal in a contraction */
	check_einsum("ij,ij->ij", "i5 j7");      /* all batch */
	check_einsum("ij,ij->", "i5 j7");
	check_einsum("ij,ij->i", "i5 j70");
	check_einsum("ab,ab->ba", "a4 b3");
	check_einsum("ijk->kij", "i3 j4 k5");
}

/* ---- reductions ---- */

static void check_reduce(OpKind k, Shape s, const int *axes, int naxes, bool keep, DType dt)
{
	Shape o = {0};
	for (int d = 0; d < s.rank; d++) {
		bool red = false;
		for (int i = 0; i < naxes; i++)
			red |= axes[i] == d;
		if (!red || keep)
			o.dim[o.rank++] = red ? 1 : s.dim[d];
	}
	Case c;
	case1(&c, k, &s, dt, -3, 3);
	tensor_free(&c.out);
	tensor_alloc(&c.out, dt, &o);
	Attr *at = case_attr(&c);
	at->naxes = naxes, at->keepdims = keep;
	memcpy(at->axes, axes, sizeof(int) * (size_t)naxes);
	assert_int_equal(case_run(&c), 0);
	int64_t no = shape_numel(&o), count = shape_numel(&s) / no;
	double *want = calloc((size_t)no, sizeof(double));
	bool *seen = calloc((size_t)no, 1);
	for (int64_t j = 0; j < shape_numel(&s); j++) {
		int64_t idx[MAX_RANK], oi = 0;
		unflat(&s, j, idx);
		for (int d = 0; d < s.rank; d++) {
			bool red = false;
			for (int i = 0; i < naxes; i++)
				red |= axes[i] == d;
			if (!red)
				oi = oi * s.dim[d] + idx[d];
		}
		double v = dt == DT_I32 ? tensor_i32(&c.in[0])[j] : tensor_f32(&c.in[0])[j];
		want[oi] = k == OP_REDUCE_MAX ? (seen[oi] && want[oi] > v ? want[oi] : v) : want[oi] + v;
		seen[oi] = true;
	}
	for (int64_t j = 0; j < no; j++) {
		double w = k == OP_REDUCE_MEAN ? want[j] / (double)count : want[j];
		double got = dt == DT_I32 ? tensor_i32(&c.out)[j] : tensor_f32(&c.out)[j];
		check_close(got, w, 1e-6, 1e-6, op_table[k].name, j);
	}
	free(want);
	free(seen);
	case_free(&c);
}

static void test_reduce(void **state)
{
	(void)state;
	static const OpKind kinds[] = {OP_REDUCE_SUM, OP_REDUCE_MAX, OP_REDUCE_MEAN};
	for (int i = 0; i < 3; i++)
		for (int keep = 0; keep < 2; keep++) {
			check_reduce(kinds[i], SH(3, 4, 5), (int[]){0, 2}, 2, keep, DT_F32);
			check_reduce(kinds[i], SH(3, 4, 5), (int[]){1}, 1, keep, DT_F32);
			check_reduce(kinds[i], SH(3, 4, 5), (int[]){2}, 1, keep, DT_F32);
			check_reduce(kinds[i], SH(3, 4, 5), (int[]){0, 1, 2}, 3, keep, DT_F32);
			check_reduce(kinds[i], SH(2, 3, 4, 5), (int[]){1, 3}, 2, keep, DT_F32);
		}
	check_reduce(OP_REDUCE_SUM, SH(6, 7), (int[]){0}, 1, false, DT_I32);
	check_reduce(OP_REDUCE_MAX, SH(6, 7), (int[]){1}, 1, true, DT_I32);
}

/* ---- softmax, log_softmax, layer_norm ---- */

static void check_norm(OpKind k, Shape s, int axis, bool large)
{
	Case c;
	case1(&c, k, &s, DT_F32, -3, 3);
	Attr *at = case_attr(&c);
	at->naxes = 1, at->axes[0] = axis, at->eps = 1e-5;
	float *x = tensor_f32(&c.in[0]);
	if (large)
		x[0] = 1000, x[1] = 999, x[2] = -1000, x[3] = 1000;
	assert_int_equal(case_run(&c), 0);
	for (int64_t j = 0; j < shape_numel(&s); j++) {
		int64_t idx[MAX_RANK];
		unflat(&s, j, idx);
		long double sum = 0, sq = 0, n = (long double)s.dim[axis];
		for (int64_t m = 0; m < s.dim[axis]; m++) { /* the other elements of j's row */
			idx[axis] = m;
			long double v = x[flat(&s, idx)];
			sum += k == OP_LAYER_NORM ? v : expl(v - x[j]); /* exp(2000) fits a long double */
			sq += v * v;
		}
		double want;
		if (k == OP_SOFTMAX)
			want = (double)(1 / sum);
		else if (k == OP_LOG_SOFTMAX)
			want = (double)-logl(sum);
		else {
			long double mean = sum / n, var = sq / n - mean * mean;
			want = (double)((x[j] - mean) / sqrtl(var + 1e-5L));
		}
		float got = tensor_f32(&c.out)[j];
		assert_true(isfinite(got));
		check_close(got, want, 1e-5, 1e-6, op_table[k].name, j);
	}
	case_free(&c);
}

static void test_normalizations(void **state)
{
	(void)state;
	static const OpKind kinds[] = {OP_SOFTMAX, OP_LOG_SOFTMAX, OP_LAYER_NORM};
	for (int i = 0; i < 3; i++) {
		check_norm(kinds[i], SH(2, 3, 4), 1, false);
		check_norm(kinds[i], SH(2, 3, 4), 2, false);
		check_norm(kinds[i], SH(2, 3, 4), 0, false);
		check_norm(kinds[i], SH(3, 7), 1, true); /* 1000, 999, -1000: no inf, no NaN */
	}
}

/* ---- data movement ---- */

static void test_transpose(void **state)
{
	(void)state;
	int perms[][3] = {{2, 0, 1}, {1, 0, 2}, {0, 2, 1}, {0, 1, 2}};
	for (int p = 0; p < 4; p++) {
		Shape s = SH(2, 3, 4), o = {.rank = 3};
		for (int d = 0; d < 3; d++)
			o.dim[d] = s.dim[perms[p][d]];
		Case c;
		case_init(&c, OP_TRANSPOSE, 1, &s, (DType[]){DT_I32}, &o, DT_I32, 0, 0);
		for (int j = 0; j < 24; j++)
			tensor_i32(&c.in[0])[j] = j;
		memcpy(case_attr(&c)->axes, perms[p], sizeof perms[p]);
		assert_int_equal(case_run(&c), 0);
		for (int64_t j = 0; j < 24; j++) {
			int64_t oi[MAX_RANK], ii[MAX_RANK];
			unflat(&o, j, oi);
			for (int d = 0; d < 3; d++)
				ii[perms[p][d]] = oi[d];
			assert_int_equal(tensor_i32(&c.out)[j], flat(&s, ii));
		}
		case_free(&c);
	}
}

static void test_copy_reshape_broadcast(void **state)
{
	(void)state;
	Case c;
	Shape s = SH(2, 6), o = SH(3, 4);
	case_init(&c, OP_RESHAPE, 1, &s, (DType[]){DT_F32}, &o, DT_F32, -1, 1);
	case_attr(&c)->shape = o;
	assert_int_equal(case_run(&c), 0);
	assert_memory_equal(c.out.data, c.in[0].data, 12 * 4);
	case_free(&c);

	case1(&c, OP_COPY, &s, DT_I32, 0, 0);
	assert_int_equal(case_run(&c), 0);
	assert_memory_equal(c.out.data, c.in[0].data, 12 * 4);
	case_free(&c);

	s = SH(3, 1), o = SH(2, 3, 4);
	case_init(&c, OP_BROADCAST_TO, 1, &s, (DType[]){DT_I32}, &o, DT_I32, 0, 0);
	case_attr(&c)->shape = o;
	assert_int_equal(case_run(&c), 0);
	for (int64_t j = 0; j < 24; j++) {
		int64_t idx[MAX_RANK];
		unflat(&o, j, idx);
		assert_int_equal(tensor_i32(&c.out)[j], tensor_i32(&c.in[0])[idx[1]]);
	}
	case_free(&c);
}

static void test_slice(void **state)
{
	(void)state;
	struct { Shape s; int64_t start[3], limit[3], stride[3]; } cases[] = {
		{SH(5, 6), {1, 0}, {5, 6}, {2, 3}},
		{SH(4, 5, 6), {1, 2, 0}, {4, 5, 5}, {1, 2, 2}},
		{SH(7), {2}, {7}, {1}},
		{SH(3, 4), {1, 1}, {1, 4}, {1, 1}}, /* empty */
	};
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		Shape s = cases[k].s, o = {.rank = s.rank};
		for (int d = 0; d < s.rank; d++)
			o.dim[d] = (cases[k].limit[d] - cases[k].start[d] + cases[k].stride[d] - 1) / cases[k].stride[d];
		Case c;
		case_init(&c, OP_SLICE, 1, &s, (DType[]){DT_F32}, &o, DT_F32, -1, 1);
		Attr *at = case_attr(&c);
		memcpy(at->start, cases[k].start, sizeof cases[k].start);
		memcpy(at->limit, cases[k].limit, sizeof cases[k].limit);
		memcpy(at->stride, cases[k].stride, sizeof cases[k].stride);
		assert_int_equal(case_run(&c), 0);
		for (int64_t j = 0; j < shape_numel(&o); j++) {
			int64_t idx[MAX_RANK];
			unflat(&o, j, idx);
			for (int d = 0; d < s.rank; d++)
				idx[d] = cases[k].start[d] + idx[d] * cases[k].stride[d];
			assert_true(tensor_f32(&c.out)[j] == tensor_f32(&c.in[0])[flat(&s, idx)]);
		}
		case_free(&c);
	}
}

static void test_concat(void **state)
{
	(void)state;
	for (int axis = 0; axis < 3; axis++) {
		Shape in[3] = {SH(2, 3, 4), SH(2, 3, 4), SH(2, 3, 4)};
		for (int i = 0; i < 3; i++)
			in[i].dim[axis] = i + 1;
		Shape o = in[0];
		o.dim[axis] = 6;
		Case c;
		case_init(&c, OP_CONCAT, 3, in, (DType[]){DT_F32, DT_F32, DT_F32}, &o, DT_F32, -1, 1);
		case_attr(&c)->axis = axis;
		assert_int_equal(case_run(&c), 0);
		for (int64_t j = 0; j < shape_numel(&o); j++) {
			int64_t idx[MAX_RANK];
			unflat(&o, j, idx);
			int which = idx[axis] < 1 ? 0 : idx[axis] < 3 ? 1 : 2;
			idx[axis] -= which == 0 ? 0 : which == 1 ? 1 : 3;
			assert_true(tensor_f32(&c.out)[j] == tensor_f32(&c.in[which])[flat(&in[which], idx)]);
		}
		case_free(&c);
	}
}

static void check_pad(DType dt, Shape s, const int64_t *lo, const int64_t *hi)
{
	Shape o = s;
	for (int d = 0; d < s.rank; d++)
		o.dim[d] += lo[d] + hi[d];
	Case c;
	case_init(&c, OP_PAD, 1, &s, (DType[]){dt}, &o, dt, -1, 1);
	Attr *at = case_attr(&c);
	memcpy(at->start, lo, sizeof(int64_t) * (size_t)s.rank);
	memcpy(at->limit, hi, sizeof(int64_t) * (size_t)s.rank);
	at->value = 7.5;
	assert_int_equal(case_run(&c), 0);
	for (int64_t j = 0; j < shape_numel(&o); j++) {
		int64_t idx[MAX_RANK];
		bool inside = true;
		unflat(&o, j, idx);
		for (int d = 0; d < s.rank; d++) {
			idx[d] -= lo[d];
			inside &= idx[d] >= 0 && idx[d] < s.dim[d];
		}
		if (dt == DT_I32)
			assert_int_equal(tensor_i32(&c.out)[j], inside ? tensor_i32(&c.in[0])[flat(&s, idx)] : 7);
		else
			assert_true(tensor_f32(&c.out)[j] == (inside ? tensor_f32(&c.in[0])[flat(&s, idx)] : 7.5f));
	}
	case_free(&c);
}

static void test_pad(void **state)
{
	(void)state;
	check_pad(DT_F32, SH(2, 3), (int64_t[]){1, 0}, (int64_t[]){0, 2});
	check_pad(DT_F32, SH(2, 3, 4), (int64_t[]){1, 2, 0}, (int64_t[]){3, 0, 1});
	check_pad(DT_I32, SH(4), (int64_t[]){2}, (int64_t[]){3});
	check_pad(DT_F32, SH(5, 4), (int64_t[]){-1, 1}, (int64_t[]){0, -2}); /* negative pads crop */
}

/* ---- conv2d ---- */

static void check_conv(int64_t n, int64_t h, int64_t w, int64_t ci, int64_t kh, int64_t kw, int64_t co, int sh, int sw,
                       int mode, const int64_t pads[2][2])
{
	int64_t p[2][2];
	memcpy(p, pads, sizeof p);
	if (mode == CONV_PAD_SAME) /* TensorFlow: total = max((ceil(n/s)-1)*s + k - n, 0), extra at the end */
		for (int a = 0; a < 2; a++) {
			int64_t in = a ? w : h, k = a ? kw : kh, s = a ? sw : sh;
			int64_t total = ((in + s - 1) / s - 1) * s + k - in;
			total = total < 0 ? 0 : total;
			p[a][0] = total / 2, p[a][1] = total - total / 2;
		}
	if (mode == CONV_PAD_VALID)
		memset(p, 0, sizeof p);
	int64_t oh = (h + p[0][0] + p[0][1] - kh) / sh + 1, ow = (w + p[1][0] + p[1][1] - kw) / sw + 1;
	Shape xs = SH(n, h, w, ci), ks = SH(kh, kw, ci, co), os = SH(n, oh, ow, co);
	Case c;
	case_init(&c, OP_CONV2D, 2, (Shape[]){xs, ks}, (DType[]){DT_F32, DT_F32}, &os, DT_F32, -1, 1);
	Attr *at = case_attr(&c);
	at->strides[0] = sh, at->strides[1] = sw, at->pad_mode = mode;
	memcpy(at->padding, p, sizeof p);
	assert_int_equal(case_run(&c), 0);
	const float *x = tensor_f32(&c.in[0]), *k = tensor_f32(&c.in[1]);
	for (int64_t b = 0; b < n; b++)
		for (int64_t y = 0; y < oh; y++)
			for (int64_t z = 0; z < ow; z++)
				for (int64_t o = 0; o < co; o++) {
					double acc = 0;
					for (int64_t dy = 0; dy < kh; dy++)
						for (int64_t dz = 0; dz < kw; dz++)
							for (int64_t q = 0; q < ci; q++) {
								int64_t iy = y * sh + dy - p[0][0], iz = z * sw + dz - p[1][0];
								if (iy >= 0 && iy < h && iz >= 0 && iz < w)
									acc += x[((b * h + iy) * w + iz) * ci + q] * k[((dy * kw + dz) * ci + q) * co + o];
							}
					int64_t j = ((b * oh + y) * ow + z) * co + o;
					check_close(tensor_f32(&c.out)[j], acc, 1e-5, 1e-5, "conv2d", j);
				}
	case_free(&c);
}

static void test_conv2d(void **state)
{
	(void)state;
	static const int64_t none[2][2] = {{0, 0}, {0, 0}}, asym[2][2] = {{2, 0}, {1, 3}};
	check_conv(2, 7, 6, 3, 3, 2, 4, 1, 1, CONV_PAD_VALID, none);
	check_conv(2, 7, 6, 3, 3, 3, 4, 1, 1, CONV_PAD_SAME, none);
	check_conv(2, 7, 6, 3, 3, 3, 4, 2, 2, CONV_PAD_SAME, none);   /* odd total padding at the end */
	check_conv(1, 8, 8, 2, 2, 2, 3, 2, 2, CONV_PAD_SAME, none);   /* total 0 */
	check_conv(1, 6, 9, 2, 4, 2, 3, 2, 1, CONV_PAD_SAME, none);   /* even kernel: totals 2 and 1 */
	check_conv(2, 7, 6, 3, 3, 2, 4, 2, 1, CONV_PAD_VALID, none);
	check_conv(1, 5, 6, 2, 3, 3, 2, 1, 2, CONV_PAD_EXPLICIT, asym);
	check_conv(1, 5, 5, 4, 1, 1, 3, 1, 1, CONV_PAD_VALID, none);  /* 1x1 */
}

/* ---- lookups and casts ---- */

static void test_take(void **state)
{
	(void)state;
	Shape ts = SH(5, 3), is = SH(2, 2), os = SH(2, 2, 3);
	Case c;
	case_init(&c, OP_TAKE, 2, (Shape[]){ts, is}, (DType[]){DT_F32, DT_I32}, &os, DT_F32, -1, 1);
	int32_t ids[4] = {4, 0, 2, 4};
	memcpy(c.in[1].data, ids, sizeof ids);
	assert_int_equal(case_run(&c), 0);
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 3; j++)
			assert_true(tensor_f32(&c.out)[i * 3 + j] == tensor_f32(&c.in[0])[ids[i] * 3 + j]);
	tensor_i32(&c.in[1])[3] = 7;
	assert_int_equal(case_run(&c), -1);
	assert_non_null(strstr(c.kc.err, "[0, 5)"));
	assert_non_null(strstr(c.kc.err, "found 7 at index [1, 1]"));
	tensor_i32(&c.in[1])[3] = 0, tensor_i32(&c.in[1])[1] = -1; /* negative ids are errors, no wrap-around */
	assert_int_equal(case_run(&c), -1);
	assert_non_null(strstr(c.kc.err, "found -1 at index [0, 1]"));
	case_free(&c);
}

static void test_one_hot(void **state)
{
	(void)state;
	Shape is = SH(2, 3), os = SH(2, 3, 4);
	Case c;
	case_init(&c, OP_ONE_HOT, 1, &is, (DType[]){DT_I32}, &os, DT_F32, 0, 0);
	case_attr(&c)->depth = 4;
	int32_t ids[6] = {0, 3, 5, -1, 2, 4};
	memcpy(c.in[0].data, ids, sizeof ids);
	for (int j = 0; j < 24; j++)
		tensor_f32(&c.out)[j] = 9; /* all of it must be written */
	assert_int_equal(case_run(&c), 0);
	for (int i = 0; i < 6; i++)
		for (int k = 0; k < 4; k++)
			assert_true(tensor_f32(&c.out)[i * 4 + k] == (ids[i] == k ? 1.0f : 0.0f));
	case_free(&c);
}

/* Nearest bf16 by comparing the two neighbours in double; ties to the even one. */
static float ref_bf16(float x)
{
	if (isnan(x) || isinf(x))
		return x;
	uint32_t u;
	memcpy(&u, &x, 4);
	uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
	float flo, fhi;
	memcpy(&flo, &lo, 4);
	memcpy(&fhi, &hi, 4);
	double dlo = fabs((double)x - flo), dhi = isinf(fhi) ? fabs(ldexp(1, 128) - fabs((double)x)) : fabs((double)fhi - x);
	if (dlo < dhi || (dlo == dhi && !(lo & 0x10000u)))
		return flo;
	return fhi;
}

/* Nearest f16 (10 fraction bits, exponents down to -14, subnormals below),
 * computed exactly in double; ties to the even one; past 65504 rounds to inf.
 * Written out because clang 14 has no _Float16 on x86-64. */
static float ref_f16(float x)
{
	if (isnan(x) || isinf(x))
		return x;
	double a = fabs((double)x);
	int e;
	frexp(a, &e); /* a in [2^(e-1), 2^e) */
	double ulp = ldexp(1, (e - 1 < -14 ? -14 : e - 1) - 10);
	double q = floor(a / ulp), lo = q * ulp, hi = lo + ulp;
	double r = a - lo < hi - a || (a - lo == hi - a && fmod(q, 2) == 0) ? lo : hi;
	if (r > 65504)
		r = INFINITY;
	return (float)copysign(r, x);
}

static float bits_to_float(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static void test_rounding(void **state)
{
	(void)state;
	float edge[] = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, 1.0f + 0x1p-9f, -1.0f - 0x1p-8f, 3.3895314e38f, 3.4e38f, 1e-40f,
	                65504.0f, 65519.0f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x3p-25f, 0x1p-26f, 6.1e-5f, 1e-8f, -0.0f,
	                INFINITY, -INFINITY, 0.1f, 3.14159f};
	for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) {
		float x = edge[i];
		if (round_bf16(x) != ref_bf16(x) || round_f16(x) != ref_f16(x))
			fail_msg("%a: bf16 %a want %a, f16 %a want %a", x, round_bf16(x), ref_bf16(x), round_f16(x),
			         ref_f16(x));
	}
	assert_true(round_bf16(1.0f + 0x1p-8f) == 1.0f);           /* tie to even */
	assert_true(round_bf16(1.0f + 0x3p-8f) == 1.0f + 0x1p-6f); /* tie to even, upward */
	assert_true(round_f16(65520.0f) == INFINITY);
	assert_true(round_f16(65519.0f) == 65504.0f);
	assert_true(round_f16(0x3p-25f) == 0x1p-23f);
	assert_true(round_f16(0x1p-25f) == 0.0f);
	assert_true(isnan(round_bf16(NAN)) && isnan(round_f16(NAN)));
	assert_true(isnan(round_bf16(bits_to_float(0x7f800001u)))); /* a NaN that truncation would make inf */
	for (int i = 0; i < 200000; i++) {
		uint32_t u = (uint32_t)(urand() * 4294967296.0);
		float x = bits_to_float(u);
		if (isnan(x))
			continue;
		assert_true(round_bf16(x) == ref_bf16(x));
		float h = ref_f16(x);
		if (round_f16(x) != h)
			fail_msg("round_f16(%a) = %a, want %a", x, round_f16(x), h);
	}
}

static void test_cast(void **state)
{
	(void)state;
	Shape s = SH(8);
	float x[8] = {2.7f, -2.7f, 0.5f, -0.5f, 1e10f, NAN, -2147483648.0f, 3.0f};
	Case c;
	case_init(&c, OP_CAST, 1, &s, (DType[]){DT_F32}, &s, DT_I32, 0, 0);
	memcpy(c.in[0].data, x, sizeof x);
	assert_int_equal(case_run(&c), 0);
	int32_t want[8] = {2, -2, 0, 0, INT32_MIN, INT32_MIN, INT32_MIN, 3};
	assert_memory_equal(c.out.data, want, sizeof want);
	case_free(&c);

	case_init(&c, OP_CAST, 1, &s, (DType[]){DT_I32}, &s, DT_F32, 0, 0);
	int32_t ints[8] = {0, 1, -7, 16777217, INT32_MAX, INT32_MIN, 100, -100};
	memcpy(c.in[0].data, ints, sizeof ints);
	assert_int_equal(case_run(&c), 0);
	for (int i = 0; i < 8; i++)
		assert_true(tensor_f32(&c.out)[i] == (float)ints[i]);
	case_free(&c);

	DType to[2] = {DT_BF16, DT_F16};
	for (int t = 0; t < 2; t++) {
		case_init(&c, OP_CAST, 1, &s, (DType[]){DT_F32}, &s, to[t], -1000, 1000);
		tensor_f32(&c.in[0])[0] = 1.0f + 0x1p-8f;
		tensor_f32(&c.in[0])[1] = 70000.0f;
		assert_int_equal(case_run(&c), 0);
		for (int i = 0; i < 8; i++) {
			float v = tensor_f32(&c.in[0])[i];
			float w = t == 0 ? ref_bf16(v) : ref_f16(v);
			assert_true(tensor_f32(&c.out)[i] == w);
		}
		case_free(&c);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_op_table_kernels),
		cmocka_unit_test(test_unary),
		cmocka_unit_test(test_sigmoid_extremes),
		cmocka_unit_test(test_unary_i32),
		cmocka_unit_test(test_binary),
		cmocka_unit_test(test_binary_constant_dtype),
		cmocka_unit_test(test_binary_i32_div_zero),
		cmocka_unit_test(test_einsum_matmul),
		cmocka_unit_test(test_einsum_batched),
		cmocka_unit_test(test_einsum_other),
		cmocka_unit_test(test_reduce),
		cmocka_unit_test(test_normalizations),
		cmocka_unit_test(test_transpose),
		cmocka_unit_test(test_copy_reshape_broadcast),
		cmocka_unit_test(test_slice),
		cmocka_unit_test(test_concat),
		cmocka_unit_test(test_pad),
		cmocka_unit_test(test_conv2d),
		cmocka_unit_test(test_take),
		cmocka_unit_test(test_one_hot),
		cmocka_unit_test(test_rounding),
		cmocka_unit_test(test_cast),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
