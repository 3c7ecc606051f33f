/* mesh.c: device ids, mesh coordinates and replica groups. */
#include "mesh.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mesh_axis_findn(const Mesh *m, const char *name, size_t len)
{
	for (int a = 0; a < m->naxes; a++)
		if (strlen(m->name[a]) == len && memcmp(m->name[a], name, len) == 0)
			return a;
	return -1;
}

int mesh_axis_find(const Mesh *m, const char *name) { return mesh_axis_findn(m, name, strlen(name)); }

/* Row-major position <-> coordinates, ignoring device order. */
static void position_coords(const Mesh *m, int pos, int *coord)
{
	for (int a = m->naxes - 1; a >= 0; a--) {
		coord[a] = pos % m->size[a];
		pos /= m->size[a];
	}
}

static int coords_position(const Mesh *m, const int *coord)
{
	int pos = 0;
	for (int a = 0; a < m->naxes; a++)
		pos = pos * m->size[a] + coord[a];
	return pos;
}

void mesh_device_coords(const Mesh *m, int device, int *coord)
{
	position_coords(m, m->position ? m->position[device] : device, coord);
}

int mesh_coords_device(const Mesh *m, const int *coord)
{
	int pos = coords_position(m, coord);
	return m->devices ? m->devices[pos] : pos;
}

int mesh_axes_size(const Mesh *m, unsigned mask)
{
	int n = 1;
	for (int a = 0; a < m->naxes; a++)
		if (mask >> a & 1)
			n *= m->size[a];
	return n;
}

int mesh_group_index(const Mesh *m, int device, const int *axes, int n)
{
	int coord[MESH_MAX_AXES], self = 0;
	mesh_device_coords(m, device, coord);
	for (int i = 0; i < n; i++)
		self = self * m->size[axes[i]] + coord[axes[i]];
	return self;
}

int mesh_group(const Mesh *m, int device, const int *axes, int n, int *group)
{
	int coord[MESH_MAX_AXES], self = mesh_group_index(m, device, axes, n), count = 1;
	mesh_device_coords(m, device, coord);
	for (int i = 0; i < n; i++)
		count *= m->size[axes[i]];
	for (int k = 0; k < count; k++) {
		int rest = k;
		for (int i = n - 1; i >= 0; i--) {
			coord[axes[i]] = rest % m->size[axes[i]];
			rest /= m->size[axes[i]];
		}
		group[k] = mesh_coords_device(m, coord);
	}
	return self;
}

int mesh_finish(Mesh *m, Arena *a, const int *devices)
{
	long n = 1;
	for (int i = 0; i < m->naxes; i++)
		n *= m->size[i];
	m->ndev = (int)n;
	m->devices = m->position = NULL;
	if (!devices)
		return 0;
	int *dev = arena_alloc(a, sizeof(int) * (size_t)n);
	int *pos = arena_alloc(a, sizeof(int) * (size_t)n);
	for (int i = 0; i < n; i++)
		pos[i] = -1;
	for (int i = 0; i < n; i++) {
		if (devices[i] < 0 || devices[i] >= n || pos[devices[i]] >= 0)
			return -1;
		dev[i] = devices[i];
		pos[devices[i]] = i;
	}
	m->devices = dev;
	m->position = pos;
	return 0;
}

bool mesh_same_order(const Mesh *a, const Mesh *b)
{
	if (!a->devices && !b->devices)
		return true;
	for (int i = 0; i < a->ndev; i++)
		if ((a->devices ? a->devices[i] : i) != (b->devices ? b->devices[i] : i))
			return false;
	return true;
}

void mesh_format(const Mesh *m, char *buf, size_t n)
{
	size_t k = 0;
	buf[0] = 0;
	for (int a = 0, r, size; a < m->naxes && k < n; a += r) {
		char name[128];
		r = mesh_written_axis(m, a, name, sizeof name, &size);
		k += (size_t)snprintf(buf + k, n - k, "%s%s=%d", a ? "," : "", name, size);
	}
}

/* ---- sub-axes ---- */

static const char *base_of(const Mesh *m, int a) { return m->pre[a] ? m->base[a] : m->name[a]; }
static int64_t lo_of(const Mesh *m, int a) { return m->pre[a] ? m->pre[a] : 1; }
static int64_t whole_of(const Mesh *m, int a) { return m->pre[a] ? m->whole[a] : m->size[a]; }

static bool base_is(const Mesh *m, int a, const char *name, size_t len)
{
	const char *b = base_of(m, a);
	return strlen(b) == len && memcmp(b, name, len) == 0;
}

bool mesh_has_pieces(const Mesh *m)
{
	for (int a = 0; a < m->naxes; a++)
		if (m->pre[a])
			return true;
	return false;
}

int mesh_pieces_size(const Mesh *m)
{
	int n = 1;
	for (int a = 0; a < m->naxes; a++)
		n *= m->pre[a] ? m->size[a] : 1;
	return n;
}

/* A decimal number of at most 7 digits at s (sizes are at most 2^20); its end, or NULL. */
static const char *small_number(const char *s, int64_t *v)
{
	int k = 0;
	*v = 0;
	for (; s[k] >= '0' && s[k] <= '9'; k++)
		if (k < 7)
			*v = *v * 10 + (s[k] - '0');
		else
			*v = MESH_MAX_DEVICES + 1; /* too large to be valid: said so by mesh_resolve */
	return k ? s + k : NULL;
}

bool mesh_sub_form(const char *name, size_t *base_len, int64_t *pre, int64_t *size)
{
	const char *c = strchr(name, ':'), *e;
	if (!c || c == name || c[1] != '(' || !(e = small_number(c + 2, pre)) || *e != ')')
		return false;
	if (!(e = small_number(e + 1, size)) || *e)
		return false;
	*base_len = (size_t)(c - name);
	return true;
}

int mesh_resolve(const Mesh *m, const char *name, uint8_t *out)
{
	size_t len;
	int64_t p = 1, s = 0, whole = 0;
	bool sub = mesh_sub_form(name, &len, &p, &s), off = false;
	if (!sub)
		len = strlen(name), p = 1, s = MESH_MAX_DEVICES;
	int n = 0;
	for (int a = 0; a < m->naxes; a++) {
		if (!base_is(m, a, name, len))
			continue;
		whole = whole_of(m, a);
		int64_t lo = lo_of(m, a), hi = lo * m->size[a];
		if (lo >= p && hi <= p * s)
			out[n++] = (uint8_t)a;
		else if (lo < p * s && hi > p)
			off = true; /* the piece straddles a cut the name needs */
	}
	if (!whole)
		return MESH_UNKNOWN;
	if (sub && (s < 2 || p < 1 || p * s > whole || whole % (p * s) != 0))
		return MESH_BAD_SUB;
	return off ? MESH_OFF_CUTS : n;
}

static void set_piece(Mesh *m, Arena *ar, int a, const char *base, int64_t pre, int64_t size, int64_t whole)
{
	char buf[160];
	snprintf(buf, sizeof buf, "%s:(%lld)%lld", base, (long long)pre, (long long)size);
	m->name[a] = arena_strdup(ar, buf);
	m->size[a] = (int)size;
	m->pre[a] = (int)pre;
	m->whole[a] = (int)whole;
	m->base[a] = base;
}

int mesh_cut(Mesh *m, Arena *ar, int a, int at)
{
	int size = m->size[a];
	if (m->naxes >= MESH_MAX_AXES || at <= 1 || at >= size || size % at != 0)
		return -1;
	const char *base = base_of(m, a);
	int64_t lo = lo_of(m, a), whole = whole_of(m, a);
	for (int i = m->naxes; i > a + 1; i--) {
		m->name[i] = m->name[i - 1], m->size[i] = m->size[i - 1], m->pos[i] = m->pos[i - 1];
		m->pre[i] = m->pre[i - 1], m->whole[i] = m->whole[i - 1], m->base[i] = m->base[i - 1];
	}
	m->naxes++;
	m->pos[a + 1] = m->pos[a];
	set_piece(m, ar, a, base, lo, at, whole);
	set_piece(m, ar, a + 1, base, lo * at, size / at, whole);
	return 0;
}

/* Cut the axis called name[0..len) at pre-size b (if it is not cut there).  0, or -1. */
static int cut_at(Mesh *m, Arena *ar, const char *name, size_t len, int64_t b)
{
	for (int a = 0; a < m->naxes; a++) {
		if (!base_is(m, a, name, len))
			continue;
		int64_t lo = lo_of(m, a), hi = lo * m->size[a];
		if (b == lo || b == hi)
			return 0;
		if (lo < b && b < hi)
			return b % lo == 0 ? mesh_cut(m, ar, a, (int)(b / lo)) : -1;
	}
	return -1;
}

int mesh_cut_name(Mesh *m, Arena *ar, const char *name)
{
	size_t len;
	int64_t p, s;
	uint8_t ax[MESH_MAX_AXES];
	if (!mesh_sub_form(name, &len, &p, &s))
		return -1;
	int r = mesh_resolve(m, name, ax);
	if (r != MESH_OFF_CUTS)
		return r >= 0 ? 0 : -1;
	Mesh save = *m;
	if (cut_at(m, ar, name, len, p) != 0 || cut_at(m, ar, name, len, p * s) != 0) {
		*m = save;
		return -1;
	}
	return 0;
}

int mesh_pieces(const Mesh *to, const Mesh *from, int a, uint8_t *out)
{
	const char *base = base_of(from, a);
	int64_t lo = lo_of(from, a), hi = lo * from->size[a];
	int n = 0;
	for (int b = 0; b < to->naxes; b++)
		if (base_is(to, b, base, strlen(base)) && lo_of(to, b) >= lo && lo_of(to, b) * to->size[b] <= hi)
			out[n++] = (uint8_t)b;
	return n;
}

int mesh_run_name(const Mesh *m, const uint8_t *ax, int n, char *buf, size_t len)
{
	int a = ax[0], k = 1;
	if (!m->pre[a]) {
		snprintf(buf, len, "%s", m->name[a]);
		return 1;
	}
	int64_t lo = m->pre[a], hi = lo * m->size[a];
	while (k < n && m->pre[ax[k]] == hi && !strcmp(base_of(m, ax[k]), m->base[a]))
		hi *= m->size[ax[k++]];
	if (lo == 1 && hi == m->whole[a])
		snprintf(buf, len, "%s", m->base[a]);
	else
		snprintf(buf, len, "%s:(%lld)%lld", m->base[a], (long long)lo, (long long)(hi / lo));
	return k;
}

static bool is_ident(const char *s, size_t n)
{
	if (n == 0 || !(s[0] == '_' || ((s[0] | 32) >= 'a' && (s[0] | 32) <= 'z')))
		return false;
	for (size_t i = 1; i < n; i++)
		if (!(s[i] == '_' || (s[i] >= '0' && s[i] <= '9') || ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z')))
			return false;
	return !(n == 4 && !memcmp(s, "null", 4)) && !(n == 1 && s[0] == '_');
}

/* One NAME=SIZE item of a mesh text. */
static int parse_axis(Mesh *m, Arena *a, const char *p, size_t len, Diag *d)
{
	const char *eq = memchr(p, '=', len);
	if (!eq || !is_ident(p, (size_t)(eq - p))) {
		diag_usage(d, "expected a mesh axis NAME=SIZE (NAME an identifier other than null and _), found '%.*s'",
		           (int)len, p);
		return -1;
	}
	if (mesh_axis_findn(m, p, (size_t)(eq - p)) >= 0) {
		diag_usage(d, "expected each mesh axis once, found '%.*s' twice", (int)(eq - p), p);
		return -1;
	}
	if (m->naxes == MESH_MAX_AXES) {
		diag_usage(d, "expected at most %d mesh axes, found more", MESH_MAX_AXES);
		return -1;
	}
	char *end;
	errno = 0;
	long long v = strtoll(eq + 1, &end, 10);
	if (end == eq + 1 || end != p + len || errno || v <= 0 || v > MESH_MAX_DEVICES) {
		diag_usage(d, "expected a positive axis size (at most %d), found '%.*s'", MESH_MAX_DEVICES,
		           (int)(p + len - eq - 1), eq + 1);
		return -1;
	}
	m->name[m->naxes] = arena_strndup(a, p, (size_t)(eq - p));
	m->size[m->naxes++] = (int)v;
	return 0;
}

int mesh_parse_text(Mesh *m, Arena *a, const char *text, Diag *d)
{
	int64_t ndev = 1;
	memset(m, 0, sizeof *m);
	for (const char *p = text;;) {
		size_t len = strcspn(p, ",");
		if (parse_axis(m, a, p, len, d) != 0)
			return -1;
		ndev *= m->size[m->naxes - 1];
		if (ndev > MESH_MAX_DEVICES) {
			diag_usage(d, "expected at most %d devices in the mesh, found more in '%s'", MESH_MAX_DEVICES, text);
			return -1;
		}
		if (!p[len])
			break;
		p += len + 1;
	}
	return mesh_finish(m, a, NULL);
}

void mesh_shift_targets(const Mesh *m, int axis, int64_t shift, int *target)
{
	for (int dev = 0; dev < m->ndev; dev++) {
		int coord[MESH_MAX_AXES] = {0};
		mesh_device_coords(m, dev, coord);
		int64_t n = m->size[axis];
		coord[axis] = (int)(((coord[axis] + shift) % n + n) % n);
		target[dev] = mesh_coords_device(m, coord);
	}
}

int mesh_written_axis(const Mesh *m, int a, char *buf, size_t len, int *size)
{
	uint8_t all[MESH_MAX_AXES];
	for (int i = a; i < m->naxes; i++)
		all[i] = (uint8_t)i;
	int r = mesh_run_name(m, all + a, m->naxes - a, buf, len);
	*size = 1;
	for (int i = a; i < a + r; i++)
		*size *= m->size[i];
	return r;
}

void mesh_axes_text(const Mesh *m, const int *ax, int n, char *buf, size_t len)
{
	uint8_t a8[MESH_MAX_AXES];
	size_t k = 0;
	buf[0] = 0;
	for (int i = 0; i < n && i < MESH_MAX_AXES; i++)
		a8[i] = (uint8_t)ax[i];
	for (int i = 0; i < n && k < len;) {
		char name[128];
		i += mesh_run_name(m, a8 + i, n - i, name, sizeof name);
		k += (size_t)snprintf(buf + k, len - k, "%s%s", k ? ", " : "", name);
	}
}
