/* report.h: the one-file HTML report of `spmd report` — inline SVG and CSS, nothing fetched.
 *
 *   Report r = {.model = &g, .prog = &prog, .map = map, .wus = &wus, .hw = &hw, .est = &e};
 *   report_html(&r, out);
 *
 * Sections (docs/pictures.md): summary, mesh, params and annotated values
 * with tile maps, collectives, cost breakdown bar charts, memory over the
 * step, timeline, and for a training step the weight-update sharding. */
#ifndef SPMD_REPORT_H
#define SPMD_REPORT_H

#include <stdio.h>

#include "../cost_model/cost.h"
#include "../partitioner/wus.h"

typedef struct {
	const Graph *model;      /* as the passes left it (annotations, training step) */
	const Graph *prog;       /* its partitioned program */
	const int *map;          /* model value -> program value (pipeline_partition) */
	const WusReport *wus;    /* NULL or empty: no training step */
	const HwProfile *hw;
	const CostEstimate *est; /* cost_estimate of prog on hw */
	const char *path;        /* the model file */
} Report;

void report_html(const Report *r, FILE *out);

#endif
