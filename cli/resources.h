/* resources.h: what a run needs against what the machine has (docs/testing.md, "Resources"). */
#ifndef SPMD_CLI_RESOURCES_H
#define SPMD_CLI_RESOURCES_H

#include "../spmd/ir.h"

/* Bytes this process may still allocate: the kernel's MemAvailable, or
 * less under a limit on the address space or data segment (ulimit -v, -d). */
double memory_available(void);

/* Parse --memory's value: a number of bytes from 1e3 to 1e18 (8e9,
 * 1073741824), optionally with a unit: kB, MB, GB, TB (powers of 1000),
 * KiB, MiB, GiB, TiB (of 1024), the B optional, in either case (16G,
 * 16gib).  0, or 2 after a usage error naming cmd. */
int memory_parse(const char *cmd, const char *s, double *out);

/* Refuse a run that cannot fit: ndev devices of prog in this process (prog
 * may be NULL) and, when ref is not NULL, the reference executor on ref,
 * each at its peak by liveness (cost_memory), against avail bytes.  0, or 2
 * after an error at the largest tensor naming the largest ones. */
int memory_check(const Graph *prog, int ndev, const Graph *ref, double avail, Diag *d);

#endif
