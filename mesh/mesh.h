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
	/* Sub-axes (docs/sharding.md#sub-axes): an axis of size n may be cut
	 * into pieces, major to minor, so that one sharding can split it over
	 * several dims ("model:(1)4" and "model:(4)2" for model = 8).  A cut
	 * mesh lists the pieces as its axes: the coordinate of the whole axis is
	 * the mixed-radix number of its pieces' coordinates, so every device
	 * keeps its position, and every pass treats a piece as an axis.
	 * pre[a] == 0: axis a is a whole axis; else it is a piece of the axis
	 * called base[a], of size whole[a], after pieces of total size pre[a]
	 * (Shardy's pre-size), and name[a] is "base:(pre)size". */
	int pre[MESH_MAX_AXES];
	int whole[MESH_MAX_AXES];
	const char *base[MESH_MAX_AXES];
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
/* The index of device within its replica group over axes[0..n) (major to
 * minor): its coordinates on those axes, row-major in the given order.  The
 * member index every collective over the axes gives it, without the group. */
int mesh_group_index(const Mesh *m, int device, const int *axes, int n);
/* target[] of a permute that moves every buffer `shift` places along axis
 * (c -> (c + shift) mod size); other coordinates stay. */
void mesh_shift_targets(const Mesh *m, int axis, int64_t shift, int *target);
/* ---- sub-axes ---- */
enum { MESH_UNKNOWN = -1, MESH_BAD_SUB = -2, MESH_OFF_CUTS = -3 };
/* The axes (pieces) a name stands for, major to minor, into out[]: a whole
 * axis ("model": all its pieces) or a sub-axis "model:(P)S", the pieces
 * covering pre-sizes P .. P*S.  Their count, or MESH_UNKNOWN (no such axis,
 * or not a name), MESH_BAD_SUB (S < 2, or P*S does not divide the size),
 * MESH_OFF_CUTS (P or P*S falls inside a piece: the mesh is not cut there). */
int mesh_resolve(const Mesh *m, const char *name, uint8_t *out);
/* Does the name have the sub-axis form NAME:(P)S?  *base_len gets NAME's length. */
bool mesh_sub_form(const char *name, size_t *base_len, int64_t *pre, int64_t *size);
/* Cut the axes of m so that the sub-axis `name` is made of whole pieces.
 * 0, or -1 when name is not a valid sub-axis of m, its cuts do not nest
 * with m's (12 cut at 2 cannot also be cut at 3), or m would get more than
 * MESH_MAX_AXES axes; m is then unchanged. */
int mesh_cut_name(Mesh *m, Arena *a, const char *name);
/* Cut piece (or axis) `axis` after its first `at` coordinates: it becomes
 * two pieces, of sizes at and size/at.  0, or -1 (at must divide the size,
 * 1 < at < size; at most MESH_MAX_AXES axes). */
int mesh_cut(Mesh *m, Arena *a, int axis, int at);
/* The axes of `to`, a cut of `from`, that make up axis a of `from`, major
 * to minor, into out[]; their count. */
int mesh_pieces(const Mesh *to, const Mesh *from, int a, uint8_t *out);
/* The name of ax[0] and the pieces after it that continue it ("model" for
 * all of model's pieces in order, "model:(1)4" for the first two of
 * model:(1)2, model:(2)2, model:(4)2) into buf; how many of ax[0..n) it
 * names (1 for a whole axis). */
int mesh_run_name(const Mesh *m, const uint8_t *ax, int n, char *buf, size_t len);
/* The axis as written that starts at axis a (all its pieces: they are in
 * order in the mesh): its name into buf, its size into *size; how many
 * axes of m it spans.  Loop a += result to list the mesh as written. */
int mesh_written_axis(const Mesh *m, int a, char *buf, size_t len, int *size);
/* "data, model:(1)4": the names of axes ax[0..n), pieces joined as in
 * mesh_run_name, into buf (empty for n == 0). */
void mesh_axes_text(const Mesh *m, const int *ax, int n, char *buf, size_t len);
/* Is the mesh cut into pieces anywhere? */
bool mesh_has_pieces(const Mesh *m);
/* The product of the sizes of its pieces (1 when it has none). */
int mesh_pieces_size(const Mesh *m);

/* Set up position/devices tables; devices may be NULL.  Returns 0, or -1 if
 * devices is not a permutation of 0..ndev-1 (the caller reports). */
int mesh_finish(Mesh *m, Arena *a, const int *devices);
/* Do a and b (of ndev devices each) put the same device at every position? */
bool mesh_same_order(const Mesh *a, const Mesh *b);
/* Parse "data=2,model=4" (a command-line mesh) into m, names in a.  0, or -1
 * after a usage error (unknown form, an axis twice, a size below 1, more
 * than 4 axes or MESH_MAX_DEVICES devices). */
int mesh_parse_text(Mesh *m, Arena *a, const char *text, Diag *d);
/* "data=2,model=4" for messages (the axes as written: pieces joined) */
void mesh_format(const Mesh *m, char *buf, size_t n);

#endif
