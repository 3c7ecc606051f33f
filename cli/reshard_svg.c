/* reshard_svg.c: the layouts a reshard plan goes through, drawn as tile maps in a row. */
#include "reshard_svg.h"

#include "svg.h"
#include "tilemap.h"

typedef struct {
	const ReshardPlan *p;
	DType dt;
	int n;        /* layouts: the source and one after each step */
	TileMap *map;
	char (*name)[64];
} Row;

/* Layout k: the source (k = 0) or the one after step k - 1, on its mesh. */
static void row_layout(Row *r, int k)
{
	const ReshardPlan *p = r->p;
	const ReshardLayout *l = k == 0 ? &p->from : &p->steps[k - 1].after;
	bool last = k == p->nsteps && k > 0;
	const Mesh *m = last && p->steps[k - 1].to_target_mesh ? p->mesh_to : p->mesh;
	int reduce = k > 0 ? p->steps[k - 1].reduce : REDUCE_SUM;
	Spec s;
	reshard_layout_spec(l, p->rank, reduce, &s);
	Shape g = {.rank = p->rank};
	for (int d = 0; d < p->rank; d++)
		g.dim[d] = p->dims[d];
	snprintf(r->name[k], sizeof r->name[k], k == 0 ? "from" : last ? "to (after step %d)" : "after step %d", k);
	tilemap_init(&r->map[k], r->name[k], r->dt, &g, &s, m);
}

enum { GAP = 220 };

static void fill(FILE *out, void *ctx)
{
	Row *r = ctx;
	double w = 0, h = 0, x = 12;
	for (int k = 0; k < r->n; k++) {
		double mw, mh;
		tilemap_svg_size(&r->map[k], &mw, &mh);
		w += mw + (k + 1 < r->n ? GAP : 0), h = mh > h ? mh : h;
	}
	svg_begin(out, w + 24, h + 60);
	svg_text(out, 12, 20, 15, "start", "reshard plan: %d step%s, %lld B per device handed to collectives, %lld B sent",
	         r->p->nsteps, r->p->nsteps == 1 ? "" : "s", (long long)r->p->bytes_per_device,
	         (long long)r->p->bytes_sent_per_device);
	for (int k = 0; k < r->n; k++) {
		double mw, mh;
		tilemap_svg_size(&r->map[k], &mw, &mh);
		tilemap_svg(&r->map[k], out, x, 40);
		x += mw;
		if (k + 1 == r->n)
			break;
		const ReshardStep *s = &r->p->steps[k];
		char text[256];
		reshard_step_format(s, r->p->mesh, text, sizeof text);
		fprintf(out, "<line x1=\"%.1f\" y1=\"150\" x2=\"%.1f\" y2=\"150\" stroke=\"#222222\" stroke-width=\"2\"/>"
		             "<polygon points=\"%.1f,144 %.1f,150 %.1f,156\" fill=\"#222222\"/>\n",
		        x + 10, x + GAP - 20, x + GAP - 22, x + GAP - 10, x + GAP - 22);
		svg_text(out, x + GAP / 2.0, 128, 12, "middle", "%d. %s", k + 1, text);
		svg_text(out, x + GAP / 2.0, 176, 11, "middle", s->kind == RS_SLICE ? "no communication" : "%lld B/device",
		         (long long)s->bytes_per_device);
		x += GAP;
	}
	svg_end(out);
}

int reshard_svg_write(const char *path, const ReshardPlan *p, DType dt, Diag *d)
{
	Row r = {.p = p, .dt = dt, .n = p->nsteps + 1};
	r.map = xcalloc((size_t)r.n, sizeof *r.map);
	r.name = xcalloc((size_t)r.n, sizeof *r.name);
	for (int k = 0; k < r.n; k++)
		row_layout(&r, k);
	int rc = picture_write(path, fill, &r, d);
	for (int k = 0; k < r.n; k++)
		tilemap_free(&r.map[k]);
	free(r.map);
	free(r.name);
	return rc;
}
