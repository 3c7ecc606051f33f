/* verify.h: do the per-device programs' collectives match across their replica groups?
 *
 *   // the files of `spmd partition --per-device DIR`, loaded (NULL: missing)
 *   VerifyResult r;
 *   verify_devices(progs, ndev, &r);
 *   if (!r.ok)
 *       verify_report(&r, &d);          // device 3: collective #2 ... waits forever ...
 *
 *   // one SPMD program, expanded for every device of its mesh (no files)
 *   if (verify_program(&prog, &d) != 0) ...
 *
 * Each device runs its collectives in program order, and a collective blocks
 * until every member of its replica group has reached it.  The check plays
 * that out: a group's collective goes through when all its members stand at
 * it, and then they must agree on it — the same kind, axes (hence the same
 * group in the same member order), reduction, dims, operand dtype and shape,
 * and result name; a collective_permute's partners must pair up (whom a
 * device sends to receives from it).  When no group can go on while some
 * device still has collectives to run, the programs deadlock.  The work is
 * linear in the collectives run over all devices (docs/verify.md). */
#ifndef SPMD_VERIFY_H
#define SPMD_VERIFY_H

#include "../spmd/ir.h"

/* The first problem found. */
typedef struct {
	int device;     /* the device whose collective cannot go through */
	int index;      /* that collective's number on the device, from 1; 0: none */
	const char *op; /* its kind ("all_reduce"), or NULL */
	const char *value; /* its result's name, or NULL */
	Pos pos;        /* where it is written, or {0} */
	char msg[480];  /* "device 3: collective #2 all_reduce ... waits forever ..." */
} VerifyProblem;

typedef struct {
	bool ok;
	int ndev;         /* devices checked */
	int64_t ncoll;    /* collectives over all devices */
	int64_t ngroup;   /* group collectives that went through */
	VerifyProblem problem; /* when !ok */
} VerifyResult;

/* Check the per-device programs progs[0..ndev): progs[k] is device k's
 * (`device: k`), or NULL if it has none.  The present ones must share one
 * mesh of ndev devices (the caller checks; from program_load, their facts
 * agree with their axes).  r gets the outcome; r->ok is false on the first
 * problem.  Returns 0 when ok, 1 otherwise. */
int verify_devices(const Graph *const *progs, int ndev, VerifyResult *r);

/* Check prog (partition's output) as run by every device of its mesh.
 * 0, or -1 after reporting the problem to d (a partitioner bug). */
int verify_program(const Graph *prog, Diag *d);

/* Report r's problem as an error at its position. */
void verify_report(const VerifyResult *r, Diag *d);

#endif
