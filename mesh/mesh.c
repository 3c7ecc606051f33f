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

int mesh_group(const Mesh *m, int device, const int *axes, int n, int *group)
{
	int coord[MESH_MAX_AXES], self = 0, count = 1;
	mesh_device_coords(m, device, coord);
	for (int i = 0; i < n; i++) {
		self = self * m->size[axes[i]] + coord[axes[i]];
		count *= m->size[axes[i]];
	}
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

void mesh_format(const Mesh *m, char *buf, size_t n)
{
	size_t k = 0;
	buf[0] = 0;
	for (int a = 0; a < m->naxes && k < n; a++)
		k += (size_t)snprintf(buf + k, n - k, "%s%s=%d", a ? "," : "", m->name[a], m->size[a]);
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
