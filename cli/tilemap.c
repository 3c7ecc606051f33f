/* tilemap.c: the tiles of one value on the mesh, drawn as terminal cells or as SVG. */
#include "tilemap.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "svg.h"

void tilemap_init(TileMap *t, const char *name, DType dt, const Shape *global, const Spec *spec, const Mesh *m)
{
	*t = (TileMap){.name = name, .dtype = dt, .global = *global, .spec = *spec, .mesh = m, .ntiles = 1};
	t->spec.rank = (uint8_t)global->rank;
	for (int d = 0; d < global->rank; d++) {
		t->nshard[d] = spec_dim_shards(&t->spec, m, d);
		t->chunk[d] = (global->dim[d] + t->nshard[d] - 1) / t->nshard[d];
		t->ntiles *= t->nshard[d];
	}
	t->nsummand = mesh_axes_size(m, t->spec.partial);
	t->tile_of = xmalloc(sizeof(int) * (size_t)m->ndev);
	for (int dev = 0; dev < m->ndev; dev++) {
		int64_t idx[MAX_RANK], lin = 0;
		spec_shard_index(&t->spec, m, dev, idx);
		for (int d = 0; d < global->rank; d++)
			lin = lin * t->nshard[d] + idx[d];
		t->tile_of[dev] = (int)lin;
	}
}

void tilemap_free(TileMap *t)
{
	free(t->tile_of);
	t->tile_of = NULL;
}

void tilemap_tile_index(const TileMap *t, int64_t tile, int64_t *index)
{
	for (int d = t->global.rank - 1; d >= 0; d--) {
		index[d] = tile % t->nshard[d];
		tile /= t->nshard[d];
	}
}

void tilemap_tile_region(const TileMap *t, int64_t tile, int64_t *offset, int64_t *extent)
{
	int64_t idx[MAX_RANK];
	tilemap_tile_index(t, tile, idx);
	for (int d = 0; d < t->global.rank; d++) {
		offset[d] = idx[d] * t->chunk[d];
		int64_t e = t->global.dim[d] - offset[d];
		extent[d] = e < 0 ? 0 : e > t->chunk[d] ? t->chunk[d] : e;
	}
}

int tilemap_tile_devices(const TileMap *t, int64_t tile, int *dev)
{
	int n = 0;
	for (int d = 0; d < t->mesh->ndev; d++)
		if (t->tile_of[d] == tile)
			dev[n++] = d;
	return n;
}

bool tilemap_colour_auto(FILE *out)
{
	const char *no = getenv("NO_COLOR");
	return isatty(fileno(out)) && !(no && *no);
}

/* ---- shared by both drawings ---- */

/* The grid of a rank-r value: columns are the shards of dim r-1, rows of
 * dim r-2, and each combination of the leading dims' shards is a facet. */
typedef struct {
	int cd, rd;          /* column and row dims, or -1 */
	int64_t ncol, nrow;  /* shards along them */
	int64_t nfacet;
} Grid;

static Grid grid_of(const TileMap *t)
{
	int r = t->global.rank;
	Grid g = {.cd = r - 1, .rd = r - 2, .ncol = 1, .nrow = 1, .nfacet = 1};
	if (g.cd >= 0)
		g.ncol = t->nshard[g.cd];
	if (g.rd >= 0)
		g.nrow = t->nshard[g.rd];
	for (int d = 0; d < r - 2; d++)
		g.nfacet *= t->nshard[d];
	return g;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t grid_tile(const Grid *g, int64_t facet, int64_t row, int64_t col)
{
	return (facet * g->nrow + row) * g->ncol + col;
}

/* "a:b" of dim d of tile, with " (+p pad)" when padded. */
static void range_text(const TileMap *t, int64_t tile, int d, char *buf, size_t n)
{
	int64_t off[MAX_RANK], ext[MAX_RANK];
	tilemap_tile_region(t, tile, off, ext);
	int64_t pad = t->chunk[d] - ext[d];
	if (pad)
		snprintf(buf, n, "%lld:%lld (+%lld pad)", (long long)off[d], (long long)(off[d] + ext[d]), (long long)pad);
	else
		snprintf(buf, n, "%lld:%lld", (long long)off[d], (long long)(off[d] + ext[d]));
}

/* The whole region of a tile: "[0:16, 512:1024 (+3 pad)]". */
static void region_text(const TileMap *t, int64_t tile, char *buf, size_t n)
{
	size_t k = (size_t)snprintf(buf, n, "[");
	for (int d = 0; d < t->global.rank && k < n; d++) {
		char r[64];
		range_text(t, tile, d, r, sizeof r);
		k += (size_t)snprintf(buf + k, n - k, "%s%s", d ? ", " : "", r);
	}
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

static bool tile_padded(const TileMap *t, int64_t tile)
{
	int64_t off[MAX_RANK], ext[MAX_RANK];
	tilemap_tile_region(t, tile, off, ext);
	for (int d = 0; d < t->global.rank; d++)
		if (ext[d] < t->chunk[d])
			return true;
	return false;
}

/* "d3" or "d3 (data 1, model 1)" with coords; "summand k" when partial. */
static size_t device_text(const TileMap *t, int dev, bool coords, char *buf, size_t n)
{
	size_t k = (size_t)snprintf(buf, n, "%d", dev);
	if (!coords || t->mesh->naxes == 0)
		return k;
	int c[MESH_MAX_AXES];
	mesh_device_coords(t->mesh, dev, c);
	for (int a = 0; a < t->mesh->naxes && k < n; a++)
		k += (size_t)snprintf(buf + k, n - k, "%s%s=%d", a ? ", " : " (", t->mesh->name[a], c[a]);
	if (t->nsummand > 1 && k < n)
		k += (size_t)snprintf(buf + k, n - k, "; summand %d", spec_partial_index(&t->spec, t->mesh, dev));
	if (k < n)
		k += (size_t)snprintf(buf + k, n - k, ")");
	return k;
}

/* Device ids of a tile, capped: "0, 4, +6 more". */
static void devices_text(const TileMap *t, int64_t tile, bool coords, int cap, char *buf, size_t n)
{
	int *dev = xmalloc(sizeof(int) * (size_t)t->mesh->ndev);
	int nd = tilemap_tile_devices(t, tile, dev);
	size_t k = 0;
	buf[0] = 0;
	for (int i = 0; i < nd && i < cap && k < n; i++) {
		k += (size_t)snprintf(buf + k, n - k, "%s", i ? ", " : "");
		if (k < n)
			k += device_text(t, dev[i], coords, buf + k, n - k);
	}
	if (nd > cap && k < n)
		snprintf(buf + k, n - k, ", +%d more", nd - cap);
	if (nd == 0)
		snprintf(buf, n, "no device");
	free(dev);
}

/* The header both drawings start with. */
static void header_text(const TileMap *t, char *l1, size_t n1, char *l2, size_t n2)
{
	char shape[96], spec[256], mesh[128] = "none", local[96];
	shape_format(&t->global, shape, sizeof shape);
	spec_format(&t->spec, t->mesh, spec, sizeof spec);
	if (t->mesh->naxes)
		mesh_format(t->mesh, mesh, sizeof mesh);
	snprintf(l1, n1, "%s: %s %s, sharding %s, mesh %s (%d device%s)", t->name, dtype_names[t->dtype], shape, spec, mesh,
	         t->mesh->ndev, t->mesh->ndev == 1 ? "" : "s");
	Shape ls = {.rank = t->global.rank};
	memcpy(ls.dim, t->chunk, sizeof(int64_t) * (size_t)t->global.rank);
	shape_format(&ls, local, sizeof local);
	int per = t->mesh->ndev / (int)(t->ntiles ? t->ntiles : 1);
	size_t k = (size_t)snprintf(l2, n2, "%lld tile%s of %s, each on %d device%s",
	                            (long long)t->ntiles, t->ntiles == 1 ? "" : "s", local, per, per == 1 ? "" : "s");
	if (t->nsummand > 1 && k < n2)
		snprintf(l2 + k, n2 - k, "; partial: each tile is the sum of %d summands (%s over the partial axes)",
		         t->nsummand, t->spec.reduce == REDUCE_MAX ? "max" : "sum");
}

/* ---- terminal ---- */

enum { CELL_W = 14 };

static void cell_begin(FILE *out, bool colour, int64_t tile)
{
	if (!colour)
		return;
	int r, g, b;
	palette_rgb((int)(tile % PALETTE_N), &r, &g, &b);
	bool white = palette_ink((int)(tile % PALETTE_N))[1] == 'F';
	fprintf(out, "\x1b[48;2;%d;%d;%dm\x1b[%sm", r, g, b, white ? "97" : "30");
}

static void cell_end(FILE *out, bool colour)
{
	if (colour)
		fputs("\x1b[0m", out);
}

/* One line of a cell: text cut or padded to CELL_W. */
static void cell_line(FILE *out, bool colour, int64_t tile, const char *text)
{
	cell_begin(out, colour, tile);
	fprintf(out, " %-*.*s", CELL_W - 1, CELL_W - 1, text);
	cell_end(out, colour);
}

static void text_facet(const TileMap *t, const Grid *g, int64_t f, FILE *out, bool colour)
{
	int64_t ncol = min64(g->ncol, TILEMAP_GRID_CAP), nrow = min64(g->nrow, TILEMAP_GRID_CAP);
	char buf[256];
	fprintf(out, "%14s ", g->rd >= 0 ? "rows \\ cols" : "");
	for (int64_t c = 0; c < ncol; c++) {
		if (g->cd >= 0)
			range_text(t, grid_tile(g, f, 0, c), g->cd, buf, sizeof buf);
		fprintf(out, " %-*.*s", CELL_W - 1, CELL_W - 1, g->cd >= 0 ? buf : "scalar");
	}
	fprintf(out, "%s\n", ncol < g->ncol ? " ..." : "");
	for (int64_t r = 0; r < nrow; r++) {
		for (int line = 0; line < 2; line++) {
			if (line == 0 && g->rd >= 0)
				range_text(t, grid_tile(g, f, r, 0), g->rd, buf, sizeof buf);
			fprintf(out, "%14.14s ", line == 0 && g->rd >= 0 ? buf : "");
			for (int64_t c = 0; c < ncol; c++) {
				int64_t tile = grid_tile(g, f, r, c);
				if (line == 0)
					snprintf(buf, sizeof buf, "T%lld%s%s", (long long)tile, tile_padded(t, tile) ? " pad" : "",
					         t->nsummand > 1 ? " sum" : "");
				else {
					memcpy(buf, "dev ", 4);
					devices_text(t, tile, false, TILEMAP_DEVICE_CAP, buf + 4, sizeof buf - 4);
				}
				cell_line(out, colour, tile, buf);
			}
			fprintf(out, "%s\n", ncol < g->ncol ? " ..." : "");
		}
	}
	if (nrow < g->nrow)
		fprintf(out, "%14s ... %lld more rows of tiles\n", "", (long long)(g->nrow - nrow));
}

/* "slice dim 0 0:4, dim 1 8:16" for facet f of a rank >= 3 value. */
static void facet_text(const TileMap *t, const Grid *g, int64_t f, char *buf, size_t n)
{
	int64_t tile = grid_tile(g, f, 0, 0);
	size_t k = (size_t)snprintf(buf, n, "slice");
	for (int d = 0; d < t->global.rank - 2 && k < n; d++) {
		char r[64];
		range_text(t, tile, d, r, sizeof r);
		k += (size_t)snprintf(buf + k, n - k, "%s dim %d %s", d ? "," : "", d, r);
	}
}

void tilemap_text(const TileMap *t, FILE *out, bool colour)
{
	char l1[512], l2[512], buf[4096];
	header_text(t, l1, sizeof l1, l2, sizeof l2);
	fprintf(out, "%s\n%s\n", l1, l2);
	Grid g = grid_of(t);
	for (int64_t f = 0; f < min64(g.nfacet, TILEMAP_FACET_CAP); f++) {
		if (g.nfacet > 1) {
			facet_text(t, &g, f, buf, sizeof buf);
			fprintf(out, "\n%s\n", buf);
		} else
			fputc('\n', out);
		text_facet(t, &g, f, out, colour);
	}
	if (g.nfacet > TILEMAP_FACET_CAP)
		fprintf(out, "\n... %lld more slices\n", (long long)(g.nfacet - TILEMAP_FACET_CAP));
	fprintf(out, "\ntiles (devices with their mesh coordinates):\n");
	for (int64_t tile = 0; tile < min64(t->ntiles, TILEMAP_LEGEND_CAP); tile++) {
		region_text(t, tile, l1, sizeof l1);
		devices_text(t, tile, true, TILEMAP_DEVICE_CAP, buf, sizeof buf);
		cell_begin(out, colour, tile);
		fprintf(out, "T%-3lld", (long long)tile);
		cell_end(out, colour);
		fprintf(out, " %s on %s\n", l1, buf);
	}
	if (t->ntiles > TILEMAP_LEGEND_CAP)
		fprintf(out, "... %lld more tiles\n", (long long)(t->ntiles - TILEMAP_LEGEND_CAP));
}

/* ---- SVG ---- */

enum { SVG_CELL_W = 132, SVG_CELL_H = 64, SVG_MARGIN = 64, SVG_LINE = 16, SVG_FACET_GAP = 28 };

static double grid_w(const Grid *g) { return (double)min64(g->ncol, TILEMAP_GRID_CAP) * SVG_CELL_W + SVG_MARGIN + 40; }
static double grid_h(const Grid *g) { return (double)min64(g->nrow, TILEMAP_GRID_CAP) * SVG_CELL_H + SVG_FACET_GAP + 40; }

static int64_t legend_lines(const TileMap *t) { return min64(t->ntiles, TILEMAP_LEGEND_CAP) + (t->ntiles > TILEMAP_LEGEND_CAP) + 1; }

void tilemap_svg_size(const TileMap *t, double *w, double *h)
{
	Grid g = grid_of(t);
	int64_t nf = min64(g.nfacet, TILEMAP_FACET_CAP);
	char l1[512], l2[512], buf[4096];
	header_text(t, l1, sizeof l1, l2, sizeof l2);
	double text_w = 8.0 * (double)strlen(l1); /* about 8 px a character at 15 px, 6 at 11 px */
	for (int64_t tile = 0; tile < min64(t->ntiles, TILEMAP_LEGEND_CAP); tile++) {
		region_text(t, tile, l2, sizeof l2);
		devices_text(t, tile, true, TILEMAP_DEVICE_CAP, buf, sizeof buf);
		double lw = 6.0 * (double)(strlen(l2) + strlen(buf) + 12) + 16;
		text_w = lw > text_w ? lw : text_w;
	}
	*w = grid_w(&g) > text_w ? grid_w(&g) : text_w;
	*h = 3 * SVG_LINE + 8 + (double)nf * grid_h(&g) + (g.nfacet > nf ? SVG_LINE * 2 : 0) +
	     (double)legend_lines(t) * SVG_LINE + 8;
}

/* One tile's cell at (x, y): its colour over the valid part, hatching
 * over the padding, a dashed border when it holds partial sums. */
static void svg_cell(const TileMap *t, const Grid *g, int64_t tile, FILE *out, double x, double y)
{
	int64_t off[MAX_RANK], ext[MAX_RANK];
	tilemap_tile_region(t, tile, off, ext);
	double fx = g->cd >= 0 ? (double)ext[g->cd] / (double)t->chunk[g->cd] : 1;
	double fy = g->rd >= 0 ? (double)ext[g->rd] / (double)t->chunk[g->rd] : 1;
	double w = SVG_CELL_W - 4, h = SVG_CELL_H - 4;
	bool lead_pad = false; /* a leading (facet) dim padded: the slice is wholly or partly padding */
	for (int d = 0; d < t->global.rank - 2; d++) {
		fx = ext[d] == 0 ? 0 : fx;
		lead_pad |= ext[d] < t->chunk[d];
	}
	char region[512], devs[2048];
	region_text(t, tile, region, sizeof region);
	devices_text(t, tile, true, TILEMAP_DEVICE_CAP, devs, sizeof devs);
	fprintf(out, "<g><title>T%lld ", (long long)tile);
	xml_escape(out, region);
	fputs(" on ", out);
	xml_escape(out, devs);
	fprintf(out, "</title>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"url(#hatch)\"/>\n", x, y,
	        w, h);
	fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", x, y, w * fx, h * fy,
	        palette_fill((int)(tile % PALETTE_N)));
	fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#222222\" "
	             "stroke-width=\"%s\"%s/>\n",
	        x, y, w, h, t->nsummand > 1 ? "2" : "1", t->nsummand > 1 ? " stroke-dasharray=\"6 3\"" : "");
	devices_text(t, tile, false, 4, devs, sizeof devs);
	fprintf(out, "<g fill=\"%s\">\n", fx > 0 && fy > 0 ? palette_ink((int)(tile % PALETTE_N)) : "#000000");
	svg_text(out, x + 6, y + 18, 13, "start", "T%lld%s", (long long)tile, t->nsummand > 1 ? "  \xce\xa3 partial" : "");
	svg_text(out, x + 6, y + 36, 11, "start", "dev %s", devs);
	if (fx < 1 || fy < 1 || lead_pad)
		svg_text(out, x + 6, y + 52, 11, "start", fx == 0 || fy == 0 ? "all padding" : "padding hatched");
	fprintf(out, "</g></g>\n");
}

static void svg_facet(const TileMap *t, const Grid *g, int64_t f, FILE *out, double x, double y)
{
	int64_t ncol = min64(g->ncol, TILEMAP_GRID_CAP), nrow = min64(g->nrow, TILEMAP_GRID_CAP);
	char buf[512];
	if (g->nfacet > 1) {
		facet_text(t, g, f, buf, sizeof buf);
		svg_text(out, x, y + 14, 12, "start", "%s", buf);
	}
	y += SVG_FACET_GAP;
	for (int64_t c = 0; c < ncol && g->cd >= 0; c++) {
		range_text(t, grid_tile(g, f, 0, c), g->cd, buf, sizeof buf);
		svg_text(out, x + SVG_MARGIN + (double)c * SVG_CELL_W + 4, y + 8, 10, "start", "%s", buf);
	}
	if (ncol < g->ncol)
		svg_text(out, x + SVG_MARGIN + (double)ncol * SVG_CELL_W + 4, y + 40, 16, "start", "\xe2\x80\xa6");
	y += 14;
	for (int64_t r = 0; r < nrow; r++) {
		if (g->rd >= 0) {
			range_text(t, grid_tile(g, f, r, 0), g->rd, buf, sizeof buf);
			svg_text(out, x + SVG_MARGIN - 6, y + (double)r * SVG_CELL_H + 20, 10, "end", "%s", buf);
		}
		for (int64_t c = 0; c < ncol; c++)
			svg_cell(t, g, grid_tile(g, f, r, c), out, x + SVG_MARGIN + (double)c * SVG_CELL_W,
			         y + (double)r * SVG_CELL_H);
	}
	if (nrow < g->nrow)
		svg_text(out, x + SVG_MARGIN, y + (double)nrow * SVG_CELL_H + 14, 16, "start", "\xe2\x80\xa6 %lld more rows",
		         (long long)(g->nrow - nrow));
}

void tilemap_svg(const TileMap *t, FILE *out, double x, double y)
{
	char l1[512], l2[512], buf[4096];
	header_text(t, l1, sizeof l1, l2, sizeof l2);
	fprintf(out, "<g class=\"tilemap\">\n");
	svg_text(out, x, y + 16, 15, "start", "%s", l1);
	svg_text(out, x, y + 16 + SVG_LINE + 2, 12, "start", "%s", l2);
	y += 3 * SVG_LINE + 8;
	Grid g = grid_of(t);
	int64_t nf = min64(g.nfacet, TILEMAP_FACET_CAP);
	for (int64_t f = 0; f < nf; f++, y += grid_h(&g))
		svg_facet(t, &g, f, out, x, y);
	if (g.nfacet > nf) {
		svg_text(out, x, y + 16, 14, "start", "\xe2\x80\xa6 %lld more slices", (long long)(g.nfacet - nf));
		y += 2 * SVG_LINE;
	}
	svg_text(out, x, y + 12, 12, "start", "tiles, with each device's mesh coordinates:");
	for (int64_t tile = 0; tile < min64(t->ntiles, TILEMAP_LEGEND_CAP); tile++) {
		y += SVG_LINE;
		region_text(t, tile, l1, sizeof l1);
		devices_text(t, tile, true, TILEMAP_DEVICE_CAP, buf, sizeof buf);
		fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\" stroke=\"#222222\"/>\n", x,
		        y + 3, palette_fill((int)(tile % PALETTE_N)));
		svg_text(out, x + 16, y + 12, 11, "start", "T%lld %s on %s", (long long)tile, l1, buf);
	}
	if (t->ntiles > TILEMAP_LEGEND_CAP)
		svg_text(out, x + 16, y + SVG_LINE + 12, 11, "start", "\xe2\x80\xa6 %lld more tiles",
		         (long long)(t->ntiles - TILEMAP_LEGEND_CAP));
	fprintf(out, "</g>\n");
}
