/* mesh.h: a device mesh of named axes, device order, coordinates and replica groups. */
#ifndef SPMD_MESH_H
#define SPMD_MESH_H

#include "../base/base.h"

enum { MESH_MAX_AXES = 4, MESH_MAX_DEVICES = 1 << 20 };

/* A mesh of 1..4 named axes, major to minor.  Mesh positions are row-major
 * over the axis coordinates; position p holds device devices[p] (identity when
 * devices is NULL).  A graph without a mesh has naxes == 0 and ndev == 1. */
typedef struct {
	int naxes;
	const char *name[MESH_MAX_AXES];
	int size[MESH_MAX_AXES];
	Pos pos[MESH_MAX_AXES]; /* where each axis was named */
	int ndev;               /* product of the sizes */
	int *devices;           /* position -> device id, or NULL for identity */
	int *position;          /* device id -> position, or NULL for identity */
	const char *hardware;   /* optional hardware profile name */
} Mesh;

/* Index of the axis called name, or -1. */
int mesh_axis_find(const Mesh *m, const char *name);
int mesh_axis_findn(const Mesh *m, const char *name, size_t len);
/* Coordinates of a device, coord[a] for each axis a. */
void mesh_device_coords(const Mesh *m, int device, int *coord);
/* Device at the given coordinates. */
int mesh_coords_device(const Mesh *m, const int *coord);
/* Product of the sizes of the axes in mask (bit a = axis a). */
int mesh_axes_size(const Mesh *m, unsigned mask);
/* The replica group of device over the axes in order axes[0..n) (major to minor):
 * the devices that differ from device only in those axes, listed with the
 * listed axes' coordinates row-major in the given order.  group gets
 * mesh_axes_size() entries; returns the index of device within its group. */
int mesh_group(const Mesh *m, int device, const int *axes, int n, int *group);
/* target[] of a permute that moves every buffer `shift` places along axis
 * (c -> (c + shift) mod size); other coordinates stay. */
void mesh_shift_targets(const Mesh *m, int axis, int64_t shift, int *target);
/* Set up position/devices tables; devices may be NULL.  Returns 0, or -1 if
 * devices is not a permutation of 0..ndev-1 (the caller reports). */
int mesh_finish(Mesh *m, Arena *a, const int *devices);
/* Parse "data=2,model=4" (a command-line mesh) into m, names in a.  0, or -1
 * after a usage error (unknown form, an axis twice, a size below 1, more
 * than 4 axes or MESH_MAX_DEVICES devices). */
int mesh_parse_text(Mesh *m, Arena *a, const char *text, Diag *d);
/* "data=2,model=4" for messages */
void mesh_format(const Mesh *m, char *buf, size_t n);

#endif
