/* tilemap.h: how one value is laid out on the mesh — its tiles, the devices holding each, as text or SVG.
 *
 *   TileMap t;
 *   tilemap_init(&t, "w1", DT_F32, &global, &spec, &mesh);
 *   tilemap_text(&t, stdout, tilemap_colour_auto(stdout));   // coloured cells, a legend
 *   double w, h;
 *   tilemap_svg_size(&t, &w, &h);
 *   tilemap_svg(&t, out, x, y);                              // a <g> to put in an <svg>
 *   tilemap_free(&t);
 *
 * Tile math is docs/sharding.md's: dim d is cut into n_d shards of the
 * padded size c_d = ceil(D_d / n_d); a tile is one combination of shard
 * indices, and the devices whose shard indices match hold it (replicas).
 * Shards past the end of an uneven dim are partly or wholly padding.  The
 * pictures are described in docs/pictures.md. */
#ifndef SPMD_TILEMAP_H
#define SPMD_TILEMAP_H

#include <stdio.h>

#include "../spmd/ir.h"

enum {
	TILEMAP_GRID_CAP = 12,   /* tiles drawn along one side of a grid; the rest elided */
	TILEMAP_FACET_CAP = 6,   /* 2-D slices drawn for rank >= 3; the rest elided */
	TILEMAP_DEVICE_CAP = 8,  /* device ids listed per tile before "+N more" */
	TILEMAP_LEGEND_CAP = 24, /* tiles described in the legend */
};

typedef struct {
	const char *name;
	DType dtype;
	Shape global;
	Spec spec;
	const Mesh *mesh;          /* not owned */
	int64_t nshard[MAX_RANK];  /* shards per dim */
	int64_t chunk[MAX_RANK];   /* padded shard size per dim */
	int64_t ntiles;            /* product of nshard */
	int *tile_of;              /* per device id: the tile it holds (row-major over the shard indices) */
	int nsummand;              /* product of the partial axes' sizes (1: no pending reduction) */
} TileMap;

/* Lay out a value of global shape `global` sharded by spec on mesh m (which
 * must outlive t).  The spec must be valid on m (spec_is_valid). */
void tilemap_init(TileMap *t, const char *name, DType dt, const Shape *global, const Spec *spec, const Mesh *m);
void tilemap_free(TileMap *t);

/* Tile `tile`'s shard index per dim, and its region: offset and valid
 * extent per dim (extent < chunk: the rest is padding). */
void tilemap_tile_index(const TileMap *t, int64_t tile, int64_t *index);
void tilemap_tile_region(const TileMap *t, int64_t tile, int64_t *offset, int64_t *extent);
/* The devices holding tile, in id order, into dev (room for mesh->ndev);
 * returns their number. */
int tilemap_tile_devices(const TileMap *t, int64_t tile, int *dev);

/* True when out is a terminal and NO_COLOR is unset or empty. */
bool tilemap_colour_auto(FILE *out);
/* The picture for a terminal: a header, one grid of cells per 2-D slice,
 * and a legend (each tile's region, its devices with mesh coordinates,
 * padding, partial summands).  colour: ANSI backgrounds from a
 * colour-blind-safe palette (else labels alone tell tiles apart). */
void tilemap_text(const TileMap *t, FILE *out, bool colour);

/* Width and height in px of tilemap_svg's drawing. */
void tilemap_svg_size(const TileMap *t, double *w, double *h);
/* Draw the tile map as an SVG <g> at (x, y).  Uses the pattern "hatch"
 * that svg_defs() defines. */
void tilemap_svg(const TileMap *t, FILE *out, double x, double y);

#endif
