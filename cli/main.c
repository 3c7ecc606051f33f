/* main.c: the spmd command — a table of subcommands and a dispatcher. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "commands.h"
#include "../base/base.h"

typedef struct {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} Command;

static const Command commands[] = {
	{"check", cmd_check, "validate a model and print a summary (values, ops, parameters, FLOPs)"},
	{"run", cmd_run, "run a model on deterministic or given data and print its outputs"},
	{"propagate", cmd_propagate, "infer a sharding for every value and say where each came from"},
	{"partition", cmd_partition, "partition a model into the program every device runs, with the collectives"},
	{"verify", cmd_verify, "check that per-device programs' collectives match across their replica groups"},
	{"reshard", cmd_reshard, "plan (and check) moving a tensor from one sharding to another"},
	{"cost", cmd_cost, "estimate step time, communication and memory per device on a hardware profile"},
	{"calibrate", cmd_calibrate, "measure this machine and write a hardware profile for the cost model"},
	{"explore", cmd_explore, "try every mesh shape for N devices and rank the plans by estimated step time"},
	{"autoshard", cmd_autoshard, "choose the shardings (and mesh) with the least step time that fit in memory"},
	{"report", cmd_report, "write one self-contained HTML report: shardings, collectives, cost, memory, timeline"},
	{"show", cmd_show, "draw how one value's tiles lie on the mesh (terminal, or --svg FILE)"},
};
enum { NCOMMANDS = sizeof commands / sizeof commands[0] };

/* For the commands that measure (calibrate, cost): one BLAS thread per
 * process unless the user sets OPENBLAS_NUM_THREADS, as the thread backend
 * runs one device per thread (docs/hardware.md) and OpenBLAS's workers would
 * compete with the device threads.  OpenBLAS reads the variable and starts
 * its workers when it is loaded, before main(), and a started worker spins
 * for about 0.1 s whatever openblas_set_num_threads says later — enough to
 * spoil a measurement — so set the variable and start again.  If that
 * fails, carry on as we are.  autoshard and explore run no kernel but
 * price plans on every processor, where that spinning worker took 5% of
 * autoshard's wall time on a 12-layer model (docs/performance.md), so
 * they start again too.  Other commands keep every BLAS thread for the
 * reference executor; the thread backend sets one BLAS thread when it runs
 * several devices (runtime/threads.c). */
static void blas_one_thread(int argc, char **argv)
{
	static const char *const one[] = {"calibrate", "cost", "autoshard", "explore"};
	bool want = false;
	for (size_t k = 0; argc >= 2 && k < sizeof one / sizeof one[0]; k++)
		want |= strcmp(argv[1], one[k]) == 0;
	if (!want)
		return;
	if (getenv("OPENBLAS_NUM_THREADS") || setenv("OPENBLAS_NUM_THREADS", "1", 0) != 0)
		return;
	execv("/proc/self/exe", argv);
}

/* Keep freed memory in the process.  glibc returns a heap's free top to
 * the system once it passes 128 KB and serves blocks from 128 KB up with
 * mmap, so every run of a program (every step) maps, faults in, unmaps
 * and trims its activations again: system calls and page faults between
 * kernels (docs/hardware.md, "Memory").  Blocks up to 32 MB (glibc's
 * largest mmap threshold) now come from the heap, which keeps up to 1 GB
 * free. */
static void malloc_keep(void)
{
#ifdef __GLIBC__
	mallopt(M_MMAP_THRESHOLD, 32 << 20);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

static void usage(FILE *out)
{
	fprintf(out, "usage: spmd COMMAND [ARGS...]\n\n"
	             "spmd partitions models written in YAML over a mesh of devices.\n\ncommands:\n");
	for (int i = 0; i < NCOMMANDS; i++)
		fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(out, "\n'spmd COMMAND --help' describes a command.  Exit status: 0 ok, 1 a check failed,\n"
	             "2 bad input or usage.  The model format: docs/format.md.\n");
}

/* Out of memory anywhere (a device thread too) is an error, exit 2, not an
 * abort; files are written whole or not at all (file_write_atomic), so
 * none is left half-written. */
static void out_of_memory(size_t n)
{
	char msg[160];
	int len = snprintf(msg, sizeof msg,
	                   "spmd: error: expected memory for the run, found none: cannot allocate %zu bytes (--memory)\n", n);
	if (write(2, msg, (size_t)len) != len) { /* nothing more can be said */
	}
	_exit(2);
}

int main(int argc, char **argv)
{
	alloc_on_failure(out_of_memory);
	blas_one_thread(argc, argv);
	malloc_keep();
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
		usage(stdout);
		return 0;
	}
	for (int i = 0; i < NCOMMANDS; i++)
		if (strcmp(argv[1], commands[i].name) == 0)
			return commands[i].run(argc - 2, argv + 2);
	fprintf(stderr, "spmd: error: expected a command (check, run, reshard, ...), found '%s'\n", argv[1]);
	return 2;
}
