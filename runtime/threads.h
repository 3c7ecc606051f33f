/* threads.h: the thread backend — each device of a mesh is a thread of this process.
 *
 *   static int body(int device, void *arg, Backend *b) {
 *           ... b->all_reduce(b, device, &coll, in, out) ...
 *           return 0;
 *   }
 *   if (threads_run(&mesh, body, &state) != 0) ... some device failed ...
 *
 * Each device thread holds only its own buffers; a collective publishes each
 * device's buffer pointers in shared memory, waits at a barrier, then every
 * device reads what it needs from its group and writes only its own output
 * (semantics: runtime/collectives.h, docs/collectives.md).  A device that
 * returns nonzero — or returns while others still wait in a collective —
 * aborts the run: every collective waiting or called afterwards returns -1,
 * so no thread waits forever. */
#ifndef SPMD_THREADS_H
#define SPMD_THREADS_H

#include "collectives.h"

enum { THREADS_MAX_DEVICES = 4096 };

typedef int (*DeviceFn)(int device, void *arg, Backend *b);

enum { THREADS_FAILED = -1, THREADS_NOT_STARTED = -2 };

/* Run fn(device, arg, backend) on every device of m, one thread each.  0 if
 * every device returned 0; THREADS_FAILED if some failed or the run was
 * aborted; THREADS_NOT_STARTED if the threads could not all be started (the
 * system refused one, or more than THREADS_MAX_DEVICES devices): then the
 * started ones are stopped and joined, and threads_start_error says why. */
int threads_run(const Mesh *m, DeviceFn fn, void *arg);
/* After THREADS_NOT_STARTED: "cannot start thread 37 of 64 (one per device):
 * Resource temporarily unavailable" (of the calling thread's last run). */
const char *threads_start_error(void);

/* Run plan p on deterministic data and compare every device's result with
 * the target layout computed directly from the global tensor (partial
 * targets: the sum or max over each partial group).  Element i of the global
 * tensor is a small multiple of 1/4, so every sum is exact and the check is
 * bit-for-bit.  0 if all match, 1 on a mismatch (described in msg), -1 if
 * the run failed, THREADS_NOT_STARTED if it could not start (msg says why). */
int threads_check_plan(const ReshardPlan *p, const Spec *from, const Spec *to, DType dt, char *msg, size_t n);
/* The same for n plans with the same device count, in one run per mesh
 * they run on (from[i] -> to[i] by p[i]); *bad gets the index of the first
 * plan that fails, or -1. */
int threads_check_plans(int n, const ReshardPlan *p, const Spec *from, const Spec *to, DType dt, int *bad,
                        char *msg, size_t len);

#endif
