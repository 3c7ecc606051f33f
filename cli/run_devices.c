/* run_devices.c: per-device files run as separate programs under MPI (docs/mpi.md, "Per-device files").
 *
 * Rank R reads DIR/device_R.yaml and nothing else.  What one rank finds
 * wrong with its file (missing, not a per-device program, another device's,
 * the job's size not the mesh's) only it knows, so the ranks agree on the
 * outcome and the lowest failing rank prints its reason; then they compare
 * a fingerprint of the program each loaded (its shared text, without the
 * device's facts) with rank 0's, so that files of two programs are caught
 * on every rank before any collective runs. */
#include "run_devices.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../spmd/emit.h"
#include "../spmd/load.h"
#include "../runtime/mpi_backend.h"

bool run_is_dir(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* FNV-1a of the program's shared text, comment lines left out (they name the file). */
static uint64_t fingerprint(const Graph *g)
{
	size_t n;
	char *text = emit_text(g, -1, &n);
	uint64_t h = 14695981039346656037ull;
	bool comment = false, line_start = true;
	for (size_t i = 0; i < n; i++) {
		if (line_start)
			comment = text[i] == '#';
		line_start = text[i] == '\n';
		if (!comment)
			h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
	}
	free(text);
	return h;
}

/* Load this rank's file and check it on its own; 0 or 2, reported to d. */
static int load_mine(Graph *g, const char *dir, int rank, Diag *d)
{
	size_t len = strlen(dir) + 32;
	char *path = xmalloc(len);
	snprintf(path, len, "%s/device_%d.yaml", dir, rank);
	LoadKind kind;
	int rc = program_load(g, path, &kind, d) == 0 ? 0 : 2;
	int n = mpi_backend_size();
	if (rc == 0 && (!kind.spmd || kind.device != rank)) {
		char found[64] = "a model";
		if (kind.spmd)
			snprintf(found, sizeof found, kind.device >= 0 ? "device %d's program" : "the program of spmd partition -o",
			         kind.device);
		diag_usage(d, "expected %s to be device %d's program (spmd partition --per-device writes it), found %s",
		           path, rank, found);
		rc = 2;
	} else if (rc == 0 && g->mesh.ndev != n) {
		diag_usage(d, "expected %d MPI processes for the %d per-device files of %s (mpirun -np %d), found %d",
		           g->mesh.ndev, g->mesh.ndev, dir, g->mesh.ndev, n);
		rc = 2;
	}
	free(path);
	return rc;
}

int run_load_devices(Graph *g, const char *dir, Diag *d)
{
	int rank = mpi_backend_rank(), first;
	Diag mine; /* kept until we know whether this rank is the one to print */
	char *text = NULL;
	size_t len = 0;
	diag_init(&mine);
	mine.out = open_memstream(&text, &len);
	if (!mine.out)
		mine.out = stderr;
	int rc = load_mine(g, dir, rank, &mine);
	if (mine.out != stderr)
		fclose(mine.out);
	if (mpi_backend_agree(rc, &first) != 0) {
		if (first == rank && text)
			fputs(text, stderr);
		d->nerr++;
		free(text);
		return 2;
	}
	free(text);
	if (mpi_backend_same(fingerprint(g), &first) == 0)
		return 0;
	if (first == rank) {
		bool q = d->quiet;
		d->quiet = false;
		diag_usage(d, "expected the per-device files of one program in %s, found device %d's program "
		           "(%s/device_%d.yaml) differing from device 0's: another model, mesh or partitioning", dir, rank,
		           dir, rank);
		d->quiet = q;
	} else
		d->nerr++;
	return 2;
}
