/* collective_cost.c: alpha-beta time of collectives on the profile's topology (rings per mesh axis, decomposed).
 *
 * The mapping rule (docs/cost_model.md, "Mesh axes on the interconnect"):
 * the N devices of a program occupy a slice of the machine whose dims are
 * grown from 1 by placing N's prime factors, smallest first, on the dim that
 * stays smallest (the last dim on a tie) without passing the machine's size;
 * what does not fit goes over the data-center network (DCN).  Device id d
 * sits at flat position d of the slice, row-major (the last dim fastest), so
 * a mesh in its default order lays its axes in order over the dims: the
 * major axis on the major dims, an axis larger than a dim spanning several,
 * axes smaller than a dim sharing it.  A mesh axis whose replica groups sit
 * at a constant stride s covers the flat strides [s, s*k); each slice dim
 * it overlaps gives one ring: its size, the distance (hop) between ring
 * neighbours in that dim, and whether it closes (wraparound). */
#include "cost.h"

#include <math.h>
#include <string.h>

#include "../spmd/ops.h"

typedef struct {
	int r;                     /* slice dims */
	int64_t size[HW_MAX_DIMS]; /* slice dim sizes */
	int64_t stride[HW_MAX_DIMS];
	int64_t beyond;            /* devices' groups over the DCN */
	bool wraps[HW_MAX_DIMS];
} Slice;

/* Every device reaches every other at full bandwidth (a switch, shared memory). */
static bool switched(const HwProfile *hw) { return hw->topo == TOPO_SWITCH || hw->topo == TOPO_THREADS; }

static int smallest_prime(int64_t n)
{
	for (int p = 2; (int64_t)p * p <= n; p++)
		if (n % p == 0)
			return p;
	return (int)n;
}

/* The slice N devices occupy (see the top of the file). */
static void slice_of(const HwProfile *hw, int64_t ndev, Slice *s)
{
	memset(s, 0, sizeof *s);
	s->r = hw->ndims > 0 ? hw->ndims : 1;
	s->beyond = 1;
	for (int j = 0; j < s->r; j++)
		s->size[j] = 1;
	for (int64_t rest = ndev; rest > 1;) {
		int p = smallest_prime(rest), best = -1;
		rest /= p;
		for (int j = s->r - 1; j >= 0; j--)
			if (s->size[j] * p <= (hw->ndims ? hw->dims[j] : 1) && (best < 0 || s->size[j] < s->size[best]))
				best = j;
		if (best < 0)
			s->beyond *= p;
		else
			s->size[best] *= p;
	}
	int64_t st = 1;
	for (int j = s->r - 1; j >= 0; j--) {
		s->stride[j] = st, st *= s->size[j];
		bool whole = s->size[j] == hw->dims[j];
		s->wraps[j] = !switched(hw) && s->size[j] > 1 &&
		              (whole || (hw->wraparound > 0 && s->size[j] % hw->wraparound == 0));
	}
}

static CostRing ring_make(const HwProfile *hw, int n, double bw, double alpha, bool wrap, bool sw, int hop, int link)
{
	return (CostRing){.n = n, .bw = bw, .alpha = alpha, .wrap = wrap, .sw = sw, .hop = hop, .link = link};
}

/* The rings of one group of k devices at flat stride st.  Returns their
 * number, or -1 when the group does not line up with the slice's dims. */
static int stride_rings(const HwProfile *hw, const Slice *s, int64_t st, int64_t k, CostRing *out)
{
	int n = 0;
	int64_t covered = 1;
	for (int j = s->r; j >= 0; j--) { /* j == r: the DCN level, outermost */
		bool dcn = j == s->r;
		int64_t T = dcn ? s->stride[0] * s->size[0] : s->stride[j], S = dcn ? s->beyond : s->size[j];
		int64_t lo = st > T ? st : T, hi = st * k < T * S ? st * k : T * S;
		if (hi <= lo)
			continue;
		if (hi % lo || lo % T)
			return -1;
		int m = (int)(hi / lo), hop = (int)(lo / T);
		covered *= m;
		if (dcn)
			out[n++] = ring_make(hw, m, hw->dcn_bw, hw->dcn_latency, false, true, 1, HW_MAX_DIMS);
		else if (switched(hw))
			out[n++] = ring_make(hw, m, hw->link_bw, hw->latency, false, true, 1, j);
		else {
			bool wrap = s->wraps[j] && (int64_t)hop * m == S;
			out[n++] = ring_make(hw, m, (wrap ? 2 : 1) * hw->link_bw / hop, hw->latency, wrap, false, hop, j);
		}
	}
	return covered == k ? n : -1;
}

/* The physical stride of axis a's replica groups, or -1 when not constant. */
static int64_t axis_stride(const Mesh *m, int a)
{
	if (!m->devices) { /* identity order: row-major, no need to walk the axis */
		int64_t st = 1;
		for (int b = m->naxes - 1; b > a; b--)
			st *= m->size[b];
		return st;
	}
	int coord[MESH_MAX_AXES] = {0};
	int d0 = mesh_coords_device(m, coord);
	coord[a] = 1;
	int64_t st = (int64_t)mesh_coords_device(m, coord) - d0;
	if (st <= 0)
		return -1;
	for (int c = 2; c < m->size[a]; c++) {
		coord[a] = c;
		if (mesh_coords_device(m, coord) - d0 != st * c)
			return -1;
	}
	return st;
}

/* Rings of mesh axis a: by its stride, or one line of its size at link
 * bandwidth when the groups do not line up with the slice. */
static int axis_rings(const HwProfile *hw, const Mesh *m, const Slice *s, int a, CostRing *out)
{
	if (m->size[a] <= 1)
		return 0;
	int64_t st = axis_stride(m, a);
	int n = st > 0 ? stride_rings(hw, s, st, m->size[a], out) : -1;
	if (n >= 0)
		return n;
	bool dcn = s->beyond > 1;
	out[0] = ring_make(hw, m->size[a], dcn ? hw->dcn_bw : hw->link_bw, dcn ? hw->dcn_latency : hw->latency, false,
	                   switched(hw) || dcn, 1, -1);
	return 1;
}

int cost_rings(const HwProfile *hw, const Mesh *m, const int *axes, int nax, CostRing *ring)
{
	Slice s;
	slice_of(hw, m->ndev, &s);
	int n = 0;
	for (int i = 0; i < nax; i++)
		n += axis_rings(hw, m, &s, axes[i], ring + n);
	for (int i = 1; i < n; i++) /* fastest first, stable */
		for (int j = i; j > 0 && ring[j].bw > ring[j - 1].bw; j--) {
			CostRing t = ring[j];
			ring[j] = ring[j - 1], ring[j - 1] = t;
		}
	return n;
}

/* ---- formulas on one ring (docs/cost_model.md) ---- */

double cost_ring_reduce_scatter(const CostRing *r, double B)
{
	double n = r->n;
	return (n - 1) * r->alpha + (n - 1) / n * B / r->bw;
}

double cost_ring_all_reduce(const CostRing *r, double B) { return 2 * cost_ring_reduce_scatter(r, B); }

double cost_ring_all_gather(const CostRing *r, double B)
{
	double n = r->n;
	return (n - 1) * r->alpha + (n - 1) * B / r->bw;
}

double cost_ring_all_to_all(const CostRing *r, double B)
{
	double n = r->n, load; /* the busiest link's bytes per byte handed in, times bw */
	if (r->sw || r->n <= 2)
		load = (n - 1) / n;
	else if (r->wrap) /* the hops to every other device, sum over d of min(d, n - d): floor(n^2 / 4) */
		load = (double)((int64_t)r->n * r->n / 4) / n;
	else
		load = floor(n / 2) * ceil(n / 2) / n;
	return (n - 1) * r->alpha + load * B / r->bw;
}

/* ---- permutes ---- */

/* Hops from device a to b within the slice (a switch: 1), or -1 when the
 * path leaves it over the DCN. */
static int64_t path_hops(const HwProfile *hw, const Slice *s, int64_t a, int64_t b)
{
	int64_t per = s->stride[0] * s->size[0];
	if (a / per != b / per)
		return -1;
	if (switched(hw))
		return 1;
	int64_t hops = 0;
	for (int j = 0; j < s->r; j++) {
		int64_t ca = a / s->stride[j] % s->size[j], cb = b / s->stride[j] % s->size[j];
		int64_t dist = ca > cb ? ca - cb : cb - ca;
		if (s->wraps[j] && s->size[j] - dist < dist)
			dist = s->size[j] - dist;
		hops += dist;
	}
	return hops;
}

/* A send of B bytes over a path of `hops` (path_hops). */
static double path_seconds(const HwProfile *hw, int64_t hops, double B)
{
	return hops < 0 ? hw->dcn_latency + B / hw->dcn_bw : (double)hops * hw->latency + B / hw->link_bw;
}

/* The slowest device's send: device d sends B bytes to target[d]. */
static double permute_seconds(const HwProfile *hw, const Mesh *m, const int *target, double B)
{
	Slice s;
	slice_of(hw, m->ndev, &s);
	double worst = 0;
	for (int d = 0; d < m->ndev; d++)
		if (target[d] >= 0 && target[d] != d) {
			double t = path_seconds(hw, path_hops(hw, &s, d, target[d]), B);
			worst = t > worst ? t : worst;
		}
	return worst;
}

/* A shift along one axis: every device's send has the same bytes, so the
 * slowest is the one with the most hops within the slice, or one over the
 * DCN.  Those two facts are remembered per thread for the last few
 * profiles' topologies, meshes, axes and shifts: an estimate prices every
 * send of a collective matmul, and a search thousands of estimates. */
typedef struct {
	HwTopology topo;
	int ndims, dims[HW_MAX_DIMS], wraparound, naxes, size[MESH_MAX_AXES], axis;
	int64_t shift;
} ShiftKey;
typedef struct {
	ShiftKey k;
	int64_t hops; /* -1: no send within the slice */
	bool dcn;
} ShiftPath;
enum { NSHIFT = 8 };

static double shift_seconds(const HwProfile *hw, const Mesh *m, int axis, int64_t shift, double B)
{
	static _Thread_local ShiftPath cache[NSHIFT];
	static _Thread_local int ncache, next;
	ShiftKey k;
	memset(&k, 0, sizeof k);
	k.topo = hw->topo, k.ndims = hw->ndims, k.wraparound = hw->wraparound, k.naxes = m->naxes, k.axis = axis;
	k.shift = shift;
	memcpy(k.dims, hw->dims, sizeof k.dims);
	memcpy(k.size, m->size, sizeof(int) * (size_t)m->naxes);
	ShiftPath *p = NULL;
	for (int i = 0; i < ncache && !m->devices; i++)
		if (memcmp(&cache[i].k, &k, sizeof k) == 0)
			p = &cache[i];
	ShiftPath fresh;
	if (!p) {
		Slice s;
		slice_of(hw, m->ndev, &s);
		int *tg = xmalloc(sizeof(int) * (size_t)m->ndev);
		mesh_shift_targets(m, axis, shift, tg);
		fresh = (ShiftPath){k, -1, false};
		for (int d = 0; d < m->ndev; d++) {
			if (tg[d] == d)
				continue;
			int64_t hops = path_hops(hw, &s, d, tg[d]);
			if (hops < 0)
				fresh.dcn = true;
			else if (hops > fresh.hops)
				fresh.hops = hops;
		}
		free(tg);
		p = &fresh;
		if (!m->devices) {
			cache[next] = fresh;
			next = (next + 1) % NSHIFT;
			ncache += ncache < NSHIFT;
		}
	}
	double worst = p->hops >= 0 ? path_seconds(hw, p->hops, B) : 0;
	return p->dcn ? fmax(worst, path_seconds(hw, -1, B)) : worst;
}

int cost_thread_barriers(ReshardKind k) { return k == RS_ALL_REDUCE ? 3 : 2; }

/* The thread backend: every collective waits at barriers of all devices
 * (alpha each), and moves the ring volume through shared memory. */
static double threads_seconds(const HwProfile *hw, const Mesh *m, ReshardKind k, const int *axes, int nax, double B)
{
	double n = 1, vol;
	for (int i = 0; i < nax; i++)
		n *= m->size[axes[i]];
	switch (k) {
	case RS_ALL_REDUCE: vol = 2 * (n - 1) / n * B; break;
	case RS_ALL_GATHER: vol = (n - 1) * B; break;
	case RS_PERMUTE: vol = B; break;
	default: vol = (n - 1) / n * B; break;
	}
	return (cost_thread_barriers(k) * hw->latency + vol / hw->link_bw) / hw_share(hw, m->ndev);
}

/* A collective on the rings of a torus or switch, its call's overhead aside. */
static double network_seconds(const HwProfile *hw, const Mesh *m, ReshardKind k, const int *axes, int nax,
                              double bytes, const int *target, int64_t shift)
{
	CostRing ring[2 * MESH_MAX_AXES + 2];
	double t = 0, B = bytes;
	if (k == RS_PERMUTE) { /* a shift along axes[0] (its targets, when given, are the shift's), else the targets */
		bool by_shift = !target || (shift && nax == 1);
		t = by_shift ? shift_seconds(hw, m, axes[0], shift, B) : permute_seconds(hw, m, target, B);
		return t / hw_share(hw, m->ndev);
	}
	int n = cost_rings(hw, m, axes, nax, ring);
	if (k == RS_ALL_GATHER) /* the mirror of a reduce_scatter whose input is the gathered size */
		for (int i = 0; i < n; i++)
			B *= ring[i].n;
	for (int i = 0; i < n; i++) {
		switch (k) {
		case RS_ALL_REDUCE: t += cost_ring_all_reduce(&ring[i], B); break;
		case RS_REDUCE_SCATTER: case RS_ALL_GATHER: t += cost_ring_reduce_scatter(&ring[i], B); break;
		case RS_ALL_TO_ALL: t += cost_ring_all_to_all(&ring[i], bytes); break;
		default: break;
		}
		B /= ring[i].n;
	}
	return t / hw_share(hw, m->ndev);
}

double cost_collective_seconds(const HwProfile *hw, const Mesh *m, ReshardKind k, const int *axes, int nax,
                               double bytes, const int *target, int64_t shift)
{
	if (hw->topo == TOPO_THREADS)
		return threads_seconds(hw, m, k, axes, nax, bytes) + hw->collective_overhead;
	return network_seconds(hw, m, k, axes, nax, bytes, target, shift) + hw->collective_overhead;
}

double cost_collective_op(const HwProfile *hw, const Graph *g, int i)
{
	const Op *op = &g->ops.a[i];
	const Value *in = &g->values.a[op->in[0]];
	double bytes = (double)shape_numel(&in->shape) * dtype_size(in->dtype);
	ReshardKind k = op_reshard_kind(op->kind);
	return cost_collective_seconds(hw, &g->mesh, k, op->attr->cax, op->attr->ncax, bytes, op->attr->target,
	                               op->attr->shift);
}

double cost_reshard_seconds(const HwProfile *hw, const Mesh *m, const ReshardPlan *p)
{
	double t = 0;
	for (int i = 0; i < p->nsteps; i++) {
		const ReshardStep *s = &p->steps[i];
		if (s->kind != RS_SLICE) {
			t += cost_collective_seconds(hw, s->kind == RS_PERMUTE && s->to_target_mesh ? p->mesh_to : m, s->kind,
			                             s->axes, s->nax, (double)s->bytes_per_device, s->target, 0);
			continue;
		}
		double kept = p->elem_size;
		for (int d = 0; d < p->rank; d++)
			kept *= (double)s->after.block[d];
		t += 2 * kept / hw->mem_bw + hw->kernel_overhead;
	}
	return t;
}

unsigned cost_collective_links(const HwProfile *hw, const Graph *g, int i)
{
	const Op *op = &g->ops.a[i];
	unsigned all = (1u << COST_LINKS) - 1, links = 0;
	bool permute = op_reshard_kind(op->kind) == RS_PERMUTE;
	if (permute && (!op->attr->shift || op->attr->ncax != 1))
		return all;
	int64_t n = g->mesh.size[op->attr->cax[0]], s = permute ? ((op->attr->shift % n) + n) % n : 0;
	CostRing ring[2 * MESH_MAX_AXES + 2];
	int nr = cost_rings(hw, &g->mesh, op->attr->cax, op->attr->ncax, ring);
	for (int k = 0; k < nr; k++) {
		if (ring[k].link < 0)
			return all;
		if (ring[k].link == HW_MAX_DIMS)
			links |= 1u << (2 * HW_MAX_DIMS);
		else if (permute && ring[k].wrap && !ring[k].sw) /* one way round: the shorter */
			links |= 1u << (2 * ring[k].link + (2 * s <= n ? 0 : 1));
		else
			links |= 3u << (2 * ring[k].link);
	}
	return links ? links : all;
}

int cost_links_way(unsigned links)
{
	for (int d = 0; d < HW_MAX_DIMS; d++) {
		unsigned w = links >> 2 * d & 3;
		if (w == 1 || w == 2)
			return w == 1 ? 1 : -1;
	}
	return 0;
}
