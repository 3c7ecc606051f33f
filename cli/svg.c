/* svg.c: SVG frame, escaping, the Okabe-Ito palette, atomic picture files. */
#include "svg.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Okabe & Ito, "Color Universal Design" (2008), black replaced by grey. */
static const struct {
	const char *fill, *ink;
	int r, g, b;
} palette[PALETTE_N] = {
	{"#E69F00", "#000000", 0xE6, 0x9F, 0x00}, {"#56B4E9", "#000000", 0x56, 0xB4, 0xE9},
	{"#009E73", "#FFFFFF", 0x00, 0x9E, 0x73}, {"#F0E442", "#000000", 0xF0, 0xE4, 0x42},
	{"#0072B2", "#FFFFFF", 0x00, 0x72, 0xB2}, {"#D55E00", "#FFFFFF", 0xD5, 0x5E, 0x00},
	{"#CC79A7", "#000000", 0xCC, 0x79, 0xA7}, {"#999999", "#000000", 0x99, 0x99, 0x99},
};

const char *palette_fill(int i) { return palette[i % PALETTE_N].fill; }
const char *palette_ink(int i) { return palette[i % PALETTE_N].ink; }

void palette_rgb(int i, int *r, int *g, int *b)
{
	*r = palette[i % PALETTE_N].r, *g = palette[i % PALETTE_N].g, *b = palette[i % PALETTE_N].b;
}

void xml_escape(FILE *out, const char *s)
{
	for (; *s; s++)
		switch (*s) {
		case '&': fputs("&amp;", out); break;
		case '<': fputs("&lt;", out); break;
		case '>': fputs("&gt;", out); break;
		case '"': fputs("&quot;", out); break;
		case '\'': fputs("&#39;", out); break;
		default: fputc(*s, out);
		}
}

void svg_defs(FILE *out)
{
	fprintf(out, "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
	             "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#ffffff\"/>"
	             "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#777777\" stroke-width=\"2\"/></pattern></defs>\n");
}

void svg_begin(FILE *out, double w, double h)
{
	fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	             "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
	             "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
	        w, h, w, h);
	svg_defs(out);
	fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
}

void svg_end(FILE *out) { fprintf(out, "</svg>\n"); }

void svg_text(FILE *out, double x, double y, double size, const char *anchor, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"%s\">", x, y, size, anchor);
	xml_escape(out, buf);
	fprintf(out, "</text>\n");
}

int picture_write(const char *path, void (*fill)(FILE *out, void *ctx), void *ctx, Diag *d)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *out = open_memstream(&buf, &n);
	if (!out) {
		diag_usage(d, "expected memory for %s, found none", path);
		return -1;
	}
	fill(out, ctx);
	int rc = fclose(out);
	if (rc == 0 && file_write_atomic(path, buf, n) != 0)
		rc = -1;
	if (rc != 0)
		diag_usage(d, "expected a writable file %s, found %s", path, strerror(errno));
	free(buf);
	return rc;
}
