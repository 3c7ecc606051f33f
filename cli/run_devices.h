/* run_devices.h: `mpirun -np N spmd run DIR --backend mpi` — each rank loads only its own per-device file. */
#ifndef SPMD_RUN_DEVICES_H
#define SPMD_RUN_DEVICES_H

#include "../spmd/ir.h"

/* Is path a directory (of per-device files)? */
bool run_is_dir(const char *path);

/* On every rank of the MPI job: load DIR/device_R.yaml (R this rank) into g
 * and check that it is device R's program, that the job has one rank per
 * device of its mesh, and that every rank loaded the same program (files of
 * two partitionings are refused).  Every rank returns the same: 0, or 2
 * after the lowest failing rank reported why.  g must be freed either way. */
int run_load_devices(Graph *g, const char *dir, Diag *d);

#endif
