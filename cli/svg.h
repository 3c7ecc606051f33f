/* svg.h: small helpers for the pictures — an SVG frame, escaped text, the palette, whole-file writes.
 *
 *   svg_begin(out, 640, 480);               // <svg ...> with <defs> (the "hatch" pattern)
 *   svg_text(out, 10, 20, 12, "start", "w1 %s", "f32");
 *   svg_end(out);
 *
 * Pictures use the Okabe-Ito palette (distinguishable with the common
 * forms of colour blindness), cycled by index. */
#ifndef SPMD_SVG_H
#define SPMD_SVG_H

#include <stdio.h>

#include "../base/base.h"

enum { PALETTE_N = 8 };

/* Fill colour "#rrggbb" of palette entry i (any i >= 0; cycles), the text
 * colour that reads on it, and its RGB for a terminal's 24-bit escape. */
const char *palette_fill(int i);
const char *palette_ink(int i);
void palette_rgb(int i, int *r, int *g, int *b);

/* Write s with &, <, >, " and ' escaped for XML text or attributes. */
void xml_escape(FILE *out, const char *s);

/* A standalone SVG document of w x h px: the XML declaration, <svg> with
 * its namespace, a white background and svg_defs(). */
void svg_begin(FILE *out, double w, double h);
void svg_end(FILE *out);
/* The <defs> every picture may use: pattern "hatch" (padding). */
void svg_defs(FILE *out);
/* <text> at (x, y) of font size px, anchor "start" | "middle" | "end";
 * the formatted text is escaped. */
void svg_text(FILE *out, double x, double y, double size, const char *anchor, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

/* Fill a file by calling fill(out, ctx) on a memory stream and write it
 * with file_write_atomic (never a half-written file).  0, or -1 after
 * reporting "expected a writable FILE, found ..." to d. */
int picture_write(const char *path, void (*fill)(FILE *out, void *ctx), void *ctx, Diag *d);

#endif
