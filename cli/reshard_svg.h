/* reshard_svg.h: a reshard plan as a picture — the layout before, after each step, and the target. */
#ifndef SPMD_RESHARD_SVG_H
#define SPMD_RESHARD_SVG_H

#include "../spmd/ir.h"
#include "../sharding_spec/reshard.h"

/* Write an SVG of plan p (of a dt tensor) to path: the source layout and
 * the layout after each step side by side, each step's collective, bytes
 * and local shapes between them.  0, or -1 after reporting to d. */
int reshard_svg_write(const char *path, const ReshardPlan *p, DType dt, Diag *d);

#endif
