/* mesh.c: device ids, mesh coordinates and replica groups. */
#include "mesh.h"

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
