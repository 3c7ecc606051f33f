/* profiles.c: hardware profiles — the built-in ones (embedded YAML), parsing, lookup by name or file, writing. */
#include "cost.h"

#include <errno.h>
#include <string.h>

#include "../spmd/ops.h"
#include "../base/yaml.h"

const char *const hw_topology_names[TOPO_COUNT] = {"ring", "torus", "switch", "threads"};

/* The built-in profiles, in the format of docs/hardware.md, which gives the
 * source of every figure.  Figures marked "assumed" there are not published
 * specifications. */
static const char *const builtin_names[] = {"tpu-v3", "tpu-v4", "a100-nvlink", "h100-nvlink", NULL};
static const char *const builtin_text[] = {
	/* tpu-v3 */
	"name: tpu-v3\n"
	"compute: {bf16: 123e12, f32: 20.5e12}\n"
	"kernel_overhead: 1e-6\n"
	"collective_overhead: 1e-6\n"
	"fusion: true\n"
	"memory: {bandwidth: 900e9, capacity: 34359738368}\n"
	"interconnect: {topology: torus, dims: [32, 32], wraparound: full, link_bandwidth: 1e11, latency: 1e-6,\n"
	"               dcn: {bandwidth: 6.25e9, latency: 1e-5}}\n",
	/* tpu-v4 */
	"name: tpu-v4\n"
	"compute: {bf16: 275e12, f32: 45.8e12}\n"
	"kernel_overhead: 1e-6\n"
	"collective_overhead: 1e-6\n"
	"fusion: true\n"
	"memory: {bandwidth: 1200e9, capacity: 34359738368}\n"
	"interconnect: {topology: torus, dims: [16, 16, 16], wraparound: 4, link_bandwidth: 4.5e10, latency: 1e-6,\n"
	"               dcn: {bandwidth: 6.25e9, latency: 1e-5}}\n",
	/* a100-nvlink */
	"name: a100-nvlink\n"
	"compute: {bf16: 312e12, f16: 312e12, f32: 19.5e12, f64: 19.5e12, i32: 19.5e12}\n"
	"kernel_overhead: 4e-6\n"
	"collective_overhead: 4e-6\n"
	"fusion: true\n"
	"memory: {bandwidth: 2039e9, capacity: 85899345920}\n"
	"interconnect: {topology: switch, dims: [8], link_bandwidth: 300e9, latency: 3e-6,\n"
	"               dcn: {bandwidth: 25e9, latency: 5e-6}}\n",
	/* h100-nvlink */
	"name: h100-nvlink\n"
	"compute: {bf16: 989e12, f16: 989e12, f32: 67e12, f64: 67e12}\n"
	"kernel_overhead: 4e-6\n"
	"collective_overhead: 3e-6\n"
	"fusion: true\n"
	"memory: {bandwidth: 3.35e12, capacity: 85899345920}\n"
	"interconnect: {topology: switch, dims: [8], link_bandwidth: 450e9, latency: 3e-6,\n"
	"               dcn: {bandwidth: 50e9, latency: 5e-6}}\n",
};
enum { NBUILTIN = sizeof builtin_text / sizeof builtin_text[0] };
_Static_assert(NBUILTIN + 1 == sizeof builtin_names / sizeof builtin_names[0], "one name per built-in profile");

const char *const *hw_profile_names(void) { return builtin_names; }

int hw_profile_builtin(HwProfile *p, const char *name)
{
	for (int i = 0; i < NBUILTIN; i++)
		if (strcmp(name, builtin_names[i]) == 0) {
			Diag d;
			diag_init(&d);
			return hw_profile_parse(p, builtin_text[i], name, &d);
		}
	return -1;
}

double hw_share(const HwProfile *p, int ndev)
{
	if (p->host_cores <= 0 || ndev <= p->host_cores)
		return 1;
	return (double)p->host_cores / ndev;
}

/* ---- parsing ---- */

static int expect(Diag *d, const YNode *n, const char *what)
{
	char found[128];
	ynode_describe(n, found, sizeof found);
	diag_error(d, n->pos, "expected %s, found %s", what, found);
	return -1;
}

/* Every key of map n is one of keys[]. */
static int check_keys(const YNode *n, const char *const *keys, const char *what, Diag *d)
{
	int rc = 0;
	for (int i = 0; i < n->n; i++) {
		bool ok = false;
		for (int k = 0; keys[k] && !ok; k++)
			ok = strcmp(n->keys[i]->str, keys[k]) == 0;
		if (!ok)
			rc = expect(d, n->keys[i], what);
	}
	return rc;
}

/* The plausible range of each kind of figure (docs/hardware.md, "Ranges"):
 * far wider than any machine, narrow enough that no report divides by
 * nothing or overflows.  Zero, where a key allows it, means "none". */
typedef struct {
	double lo, hi;
	const char *unit;
} Range;

static const Range R_RATE = {1e3, 1e18, "per second"};     /* FLOP/s, elements/s */
static const Range R_BW = {1e3, 1e16, "bytes per second"}; /* memory and links */
static const Range R_TIME = {1e-18, 1e3, "seconds"};       /* latencies, overheads */
static const Range R_BYTES = {1e3, 1e15, "bytes"};
static const Range R_WIDTH = {1e-6, 1e6, "elements"};

/* A number in r (or 0 when zero_ok) under key of map n into *out; absent:
 * keep *out unless required. */
static int get_num(const YNode *map, const char *key, double *out, bool required, bool zero_ok, const Range *r,
                   Diag *d)
{
	const YNode *n = ynode_get(map, key);
	char what[160];
	if (!n) {
		if (!required)
			return 0;
		diag_error(d, map->pos, "expected '%s' in this mapping, found none", key);
		return -1;
	}
	double v;
	snprintf(what, sizeof what, "%sa number of %s from %g to %g for '%s'", zero_ok ? "0 or " : "", r->unit, r->lo,
	         r->hi, key);
	if (ynode_double(n, &v, d) != 0)
		return -1;
	if (!((v >= r->lo && v <= r->hi) || (zero_ok && v == 0)))
		return expect(d, n, what);
	*out = v;
	return 0;
}

static const YNode *get_map(const YNode *map, const char *key, bool required, Diag *d)
{
	const YNode *n = ynode_get(map, key);
	if (!n) {
		if (required)
			diag_error(d, map->pos, "expected '%s' in this mapping, found none", key);
		return NULL;
	}
	if (n->kind != YN_MAP) {
		char what[64];
		snprintf(what, sizeof what, "a mapping for '%s'", key);
		expect(d, n, what);
		return NULL;
	}
	return n;
}

static int parse_compute(HwProfile *p, const YNode *root, Diag *d)
{
	const YNode *c = get_map(root, "compute", true, d);
	if (!c)
		return -1;
	for (int i = 0; i < c->n; i++)
		if (dtype_parse(c->keys[i]->str) < 0)
			return expect(d, c->keys[i], "a dtype (f32, bf16, f16, f64, i32)");
	int rc = 0;
	for (int t = 0; t < DT_COUNT; t++)
		rc |= get_num(c, dtype_names[t], &p->flops[t], false, false, &R_RATE, d);
	if (rc == 0 && p->flops[DT_F32] == 0 && p->flops[DT_BF16] == 0) {
		diag_error(d, c->pos, "expected an f32 or bf16 figure in compute, found neither");
		return -1;
	}
	double base = p->flops[DT_F32] ? p->flops[DT_F32] : p->flops[DT_BF16];
	for (int t = 0; t < DT_COUNT; t++)
		if (p->flops[t] == 0)
			p->flops[t] = t == DT_F16 && p->flops[DT_BF16] ? p->flops[DT_BF16] : base;
	return rc;
}

/* dims: a list of 1..4 sizes >= 1. */
static int parse_dims(HwProfile *p, const YNode *ic, Diag *d)
{
	const YNode *n = ynode_get(ic, "dims");
	if (!n) {
		diag_error(d, ic->pos, "expected 'dims' in the interconnect, found none");
		return -1;
	}
	if (n->kind != YN_SEQ || n->n < 1 || n->n > HW_MAX_DIMS)
		return expect(d, n, "a list of 1 to 4 dim sizes");
	if (p->topo != TOPO_TORUS && n->n != 1)
		return expect(d, n, "one size (a ring's length, or the devices per switch)");
	p->ndims = n->n;
	for (int i = 0; i < n->n; i++) {
		int64_t v;
		if (ynode_int(n->items[i], &v, d) != 0)
			return -1;
		if (v < 1 || v > MESH_MAX_DEVICES)
			return expect(d, n->items[i], "a size from 1 to 1048576");
		p->dims[i] = (int)v;
	}
	return 0;
}

static int parse_wrap(HwProfile *p, const YNode *ic, Diag *d)
{
	const YNode *n = ynode_get(ic, "wraparound");
	p->wraparound = p->topo == TOPO_RING ? 1 : 0;
	if (!n)
		return 0;
	if (n->kind == YN_SCALAR && strcmp(n->str, "full") == 0)
		return 0;
	if (n->kind == YN_SCALAR && strcmp(n->str, "always") == 0) {
		p->wraparound = 1;
		return 0;
	}
	int64_t v;
	if (!ynode_is_number(n) || ynode_int(n, &v, d) != 0 || v < 1 || v > MESH_MAX_DEVICES)
		return expect(d, n, "full, always, or a size k >= 1 (slice dims that are multiples of k wrap)");
	p->wraparound = (int)v;
	return 0;
}

static int parse_interconnect(HwProfile *p, const YNode *root, Diag *d)
{
	static const char *const keys[] = {"topology", "dims", "wraparound", "link_bandwidth", "latency", "dcn", "streams",
	                                   NULL};
	static const char *const dcn_keys[] = {"bandwidth", "latency", NULL};
	const YNode *ic = get_map(root, "interconnect", true, d);
	if (!ic || check_keys(ic, keys, "an interconnect key (topology, dims, wraparound, link_bandwidth, latency, dcn, streams)",
	                         d))
		return -1;
	const YNode *t = ynode_get(ic, "topology");
	if (!t) {
		diag_error(d, ic->pos, "expected 'topology' in the interconnect, found none");
		return -1;
	}
	int k = 0;
	while (k < TOPO_COUNT && !(t->kind == YN_SCALAR && strcmp(t->str, hw_topology_names[k]) == 0))
		k++;
	if (k == TOPO_COUNT)
		return expect(d, t, "a topology (ring, torus, switch, threads)");
	p->topo = (HwTopology)k;
	if (parse_dims(p, ic, d) || parse_wrap(p, ic, d))
		return -1;
	const YNode *st = ynode_get(ic, "streams");
	p->comm_streams = COMM_LINKS;
	if (st && st->kind == YN_SCALAR && strcmp(st->str, "one") == 0)
		p->comm_streams = COMM_ONE;
	else if (st && !(st->kind == YN_SCALAR && strcmp(st->str, "links") == 0))
		return expect(d, st, "links (one collective at a time per set of links) or one (one at a time)");
	if (get_num(ic, "link_bandwidth", &p->link_bw, true, false, &R_BW, d) || get_num(ic, "latency", &p->latency, true, true, &R_TIME, d))
		return -1;
	p->dcn_bw = p->link_bw, p->dcn_latency = p->latency;
	const YNode *dcn = get_map(ic, "dcn", false, d);
	if (ynode_get(ic, "dcn") && !dcn)
		return -1;
	if (dcn && (check_keys(dcn, dcn_keys, "a dcn key (bandwidth, latency)", d) ||
	            get_num(dcn, "bandwidth", &p->dcn_bw, true, false, &R_BW, d) ||
	            get_num(dcn, "latency", &p->dcn_latency, true, true, &R_TIME, d)))
		return -1;
	return 0;
}

/* key: {OP: number > 0, ...} per local op kind into per[] (op_rates,
 * op_overheads); absent: zeros. */
static int parse_per_op(const YNode *root, const char *key, double *per, const Range *range, Diag *d)
{
	const YNode *r = get_map(root, key, false, d);
	if (!r)
		return ynode_get(root, key) ? -1 : 0;
	for (int i = 0; i < r->n; i++) {
		int k = op_find(r->keys[i]->str);
		if (k < 0 || (op_table[k].flags & OPF_COLLECTIVE))
			return expect(d, r->keys[i], "the name of a local op (add, softmax, ...)");
		if (get_num(r, r->keys[i]->str, &per[k], true, false, range, d) != 0)
			return -1;
	}
	return 0;
}

/* The executor's figures of local profiles (docs/hardware.md), all optional. */
static int parse_executor(HwProfile *p, const YNode *root, Diag *d)
{
	if (parse_per_op(root, "op_rates", p->op_rate, &R_RATE, d) ||
	    parse_per_op(root, "op_overheads", p->op_overhead, &R_TIME, d))
		return -1;
	return get_num(root, "dispatch_overhead", &p->dispatch_overhead, false, true, &R_TIME, d) ||
	               get_num(root, "dispatch_bandwidth", &p->dispatch_bw, false, true, &R_BW, d) ||
	               get_num(root, "im2col_copy", &p->im2col_copy, false, true, &R_TIME, d) ||
	               get_num(root, "matrix_element", &p->matrix_element, false, true, &R_TIME, d) ||
	               get_num(root, "matrix_half_width", &p->matrix_half_width, false, true, &R_WIDTH, d)
	               ? -1 : 0;
}

static int parse_top(HwProfile *p, const YNode *root, Diag *d)
{
	static const char *const keys[] = {"name", "compute", "vector", "transcendentals", "kernel_overhead",
	                                   "matrix_overhead", "collective_overhead", "fusion", "memory", "interconnect", "host_cores", "op_rates",
	                                   "op_overheads", "dispatch_overhead", "dispatch_bandwidth", "im2col_copy",
	                                   "matrix_half_width", "matrix_element", NULL};
	static const char *const mem_keys[] = {"bandwidth", "capacity", NULL};
	if (check_keys(root, keys, "a profile key (name, compute, vector, transcendentals, kernel_overhead, "
	                           "matrix_overhead, collective_overhead, fusion, memory, interconnect, host_cores, op_rates, op_overheads, "
	                           "dispatch_overhead, dispatch_bandwidth, im2col_copy, matrix_half_width, matrix_element)", d))
		return -1;
	const YNode *n = ynode_get(root, "name");
	const char *s;
	if (n && ynode_string(n, &s, d) == 0)
		snprintf(p->name, sizeof p->name, "%s", s);
	else if (n)
		return -1;
	if (parse_compute(p, root, d) || parse_interconnect(p, root, d) || parse_executor(p, root, d))
		return -1;
	const YNode *mem = get_map(root, "memory", true, d);
	if (!mem || check_keys(mem, mem_keys, "a memory key (bandwidth, capacity)", d) ||
	    get_num(mem, "bandwidth", &p->mem_bw, true, false, &R_BW, d) || get_num(mem, "capacity", &p->mem_capacity, true, false, &R_BYTES, d))
		return -1;
	if (get_num(root, "vector", &p->vector_flops, false, false, &R_RATE, d) ||
	    get_num(root, "transcendentals", &p->transcendentals, false, false, &R_RATE, d) ||
	    get_num(root, "kernel_overhead", &p->kernel_overhead, false, true, &R_TIME, d) ||
	    get_num(root, "matrix_overhead", &p->matrix_overhead, false, true, &R_TIME, d) ||
	    get_num(root, "collective_overhead", &p->collective_overhead, false, true, &R_TIME, d))
		return -1;
	const YNode *f = ynode_get(root, "fusion");
	p->fusion = true;
	if (f && ynode_bool(f, &p->fusion, d) != 0)
		return -1;
	double cores = 0;
	static const Range R_CORES = {1, 1e300, "cores"}; /* checked below: whole, <= 4096 */
	if (get_num(root, "host_cores", &cores, false, true, &R_CORES, d))
		return -1;
	if (cores > 4096 || cores != (int)cores)
		return expect(d, ynode_get(root, "host_cores"), "a whole number of cores from 0 to 4096");
	p->host_cores = (int)cores;
	return 0;
}

int hw_profile_parse(HwProfile *p, const char *text, const char *name, Diag *d)
{
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "%s", name);
	YDoc doc;
	int rc = ydoc_parse_string(&doc, text, name, d);
	if (rc == 0 && (!doc.root || doc.root->kind != YN_MAP)) {
		diag_error(d, (Pos){name, 1, 1}, "expected a hardware profile (a mapping), found %s",
		           doc.root ? "something else" : "an empty file");
		rc = -1;
	}
	if (rc == 0)
		rc = parse_top(p, doc.root, d);
	if (rc == 0 && p->vector_flops == 0)
		p->vector_flops = p->flops[DT_F32];
	if (rc == 0 && p->transcendentals == 0)
		p->transcendentals = p->vector_flops;
	if (rc == 0 && p->matrix_overhead == 0)
		p->matrix_overhead = p->kernel_overhead;
	ydoc_free(&doc);
	return rc;
}

int hw_profile_load(HwProfile *p, const char *path, Diag *d)
{
	size_t n;
	char *text = file_read(path, &n);
	if (!text) {
		diag_usage(d, "cannot read hardware profile '%s': %s", path, strerror(errno));
		return -1;
	}
	int rc = hw_profile_parse(p, text, path, d);
	free(text);
	return rc;
}

int hw_profile_resolve(HwProfile *p, const char *arg, const char *model, Pos pos, Diag *d)
{
	if (hw_profile_builtin(p, arg) == 0)
		return 0;
	if (strchr(arg, '/') || strstr(arg, ".yaml") || strstr(arg, ".yml")) {
		const char *slash = model ? strrchr(model, '/') : NULL;
		FILE *f = fopen(arg, "r");
		if (f || arg[0] == '/' || !slash) {
			if (f)
				fclose(f);
			return hw_profile_load(p, arg, d);
		}
		char path[4096];
		snprintf(path, sizeof path, "%.*s/%s", (int)(slash - model), model, arg);
		return hw_profile_load(p, path, d);
	}
	char list[256] = "";
	for (const char *const *n = hw_profile_names(); *n; n++)
		snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", n == hw_profile_names() ? "" : ", ", *n);
	if (pos.file)
		diag_error(d, pos, "expected a hardware profile (%s, or a FILE.yaml), found '%s'", list, arg);
	else
		diag_usage(d, "expected a hardware profile (%s, or a FILE.yaml), found '%s'", list, arg);
	return -1;
}

/* key: {OP: value, ...} for the kinds with a value, nothing when none has. */
static void write_per_op(FILE *out, const char *key, const double *per)
{
	bool any = false;
	for (int k = 0; k < OP_COUNT; k++)
		if (per[k] > 0) {
			if (any)
				fputs(", ", out);
			else
				fprintf(out, "%s: {", key);
			fprintf(out, "%s: %.6g", op_table[k].name, per[k]);
			any = true;
		}
	if (any)
		fprintf(out, "}\n");
}

void hw_profile_write(const HwProfile *p, FILE *out)
{
	fprintf(out, "name: %s\ncompute: {", p->name);
	for (int t = 0; t < DT_COUNT; t++)
		fprintf(out, "%s%s: %.6g", t ? ", " : "", dtype_names[t], p->flops[t]);
	fprintf(out, "}\nvector: %.6g\ntranscendentals: %.6g\nkernel_overhead: %.6g\nmatrix_overhead: %.6g\n",
	        p->vector_flops, p->transcendentals, p->kernel_overhead, p->matrix_overhead);
	fprintf(out, "collective_overhead: %.6g\nfusion: %s\n", p->collective_overhead, p->fusion ? "true" : "false");
	fprintf(out, "memory: {bandwidth: %.6g, capacity: %.0f}\n", p->mem_bw, p->mem_capacity);
	fprintf(out, "interconnect:\n  topology: %s\n  dims: [", hw_topology_names[p->topo]);
	for (int i = 0; i < p->ndims; i++)
		fprintf(out, "%s%d", i ? ", " : "", p->dims[i]);
	fprintf(out, "]\n");
	if (p->topo == TOPO_RING || p->topo == TOPO_TORUS) {
		if (p->wraparound)
			fprintf(out, "  wraparound: %d\n", p->wraparound);
		else
			fprintf(out, "  wraparound: full\n");
	}
	fprintf(out, "  link_bandwidth: %.6g\n  latency: %.6g\n  dcn: {bandwidth: %.6g, latency: %.6g}\n", p->link_bw,
	        p->latency, p->dcn_bw, p->dcn_latency);
	if (p->comm_streams == COMM_ONE)
		fprintf(out, "  streams: one\n");
	if (p->host_cores)
		fprintf(out, "host_cores: %d\n", p->host_cores);
	if (p->dispatch_overhead > 0)
		fprintf(out, "dispatch_overhead: %.6g\n", p->dispatch_overhead);
	if (p->dispatch_bw > 0)
		fprintf(out, "dispatch_bandwidth: %.6g\n", p->dispatch_bw);
	if (p->im2col_copy > 0)
		fprintf(out, "im2col_copy: %.6g\n", p->im2col_copy);
	if (p->matrix_element > 0)
		fprintf(out, "matrix_element: %.6g\n", p->matrix_element);
	if (p->matrix_half_width > 0)
		fprintf(out, "matrix_half_width: %.6g\n", p->matrix_half_width);
	write_per_op(out, "op_rates", p->op_rate);
	write_per_op(out, "op_overheads", p->op_overhead);
}
