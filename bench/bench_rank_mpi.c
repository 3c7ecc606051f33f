/* bench_rank_mpi.c: one plan of the ranking benchmark on the MPI backend (run by bench/rank_mpi.sh).
 *
 *   mpirun -np DEVICES bench_rank_mpi PROFILE.yaml RUNS MODEL.yaml MESH WUS
 *
 * Every rank builds the plan's program (MESH as --mesh; WUS -1 for the
 * model's own weight_update_sharding, 0 off, 1 on), makes its leaves, and
 * runs its device's program RUNS times over MPI, all ranks starting
 * together (a barrier); a run's step is the last rank's end less the first
 * rank's start, and the fastest run counts.  The peak is the most bytes a
 * rank's tensor buffers held at once (tensor_mem_peak), the largest over the
 * ranks.  Rank 0 prints one line: MESH WUS predicted_s measured_s
 * predicted_peak measured_peak, predicted on PROFILE as bench_rank does. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cli/measure.h"
#include "../runtime/exec.h"
#include "../runtime/mpi_backend.h"

/* One timed run of this rank's device; the step over every rank, or -1. */
static double run_once(const Graph *prog, const SpmdOpts *o, Backend *b, int rank, int64_t *peak, Diag *d)
{
	Tensor *vals = xcalloc((size_t)prog->values.n + 1, sizeof *vals);
	int rc = 0;
	tensor_mem_reset();
	for (int v = 0; v < prog->values.n && rc == 0; v++)
		if (prog->values.a[v].producer < 0)
			rc = spmd_make_leaf(prog, o, rank, v, &vals[v], d);
	ExecOpts eo = {.seed = o->seed, .backend = b, .device = rank};
	double t[2] = {0, 0}, all[2];
	if (mpi_backend_agree(rc, NULL) == 0) {
		MPI_Barrier(MPI_COMM_WORLD);
		t[0] = -MPI_Wtime();
		rc = exec_run(prog, vals, NULL, &eo, d);
		t[1] = MPI_Wtime();
		if (rc != 0)
			mpi_backend_abort(2);
	} else
		rc = -1;
	int64_t mine = tensor_mem_peak(), most = 0;
	exec_free_values(prog, vals);
	free(vals);
	MPI_Allreduce(t, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	MPI_Allreduce(&mine, &most, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
	*peak = most > *peak ? most : *peak;
	return rc == 0 ? all[0] + all[1] : -1;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: mpirun -np N bench_rank_mpi PROFILE.yaml RUNS MODEL.yaml MESH WUS\n");
		return 2;
	}
	if (mpi_backend_start() != 0)
		return 2;
	int rank = mpi_backend_rank(), runs = atoi(argv[2]), wus = atoi(argv[5]), rc = 0;
	Diag d;
	diag_init(&d);
	HwProfile hw;
	Graph model, prog;
	CostStep st;
	if (hw_profile_load(&hw, argv[1], &d) != 0 || cost_prepare_step(argv[3], argv[4], wus, &model, &prog, &st, &d) != 0)
		return mpi_backend_finish(2);
	Backend b;
	if (mpi_backend_init(&b, &prog.mesh, 0) != 0) {
		fprintf(stderr, "bench_rank_mpi: expected %d ranks, found %d\n", prog.mesh.ndev, mpi_backend_size());
		return mpi_backend_finish(2);
	}
	int64_t *range = cost_leaf_ranges(&model, &prog), peak = 0;
	SpmdOpts o = {.seed = 0, .id_range = range};
	double best = -1;
	for (int r = 0; r < runs && rc == 0; r++) {
		double s = run_once(&prog, &o, &b, rank, &peak, &d);
		rc = s < 0 ? 2 : 0;
		best = best < 0 || s < best ? s : best;
	}
	if (rc == 0 && rank == 0) {
		CostEstimate e;
		cost_estimate_step(&prog, &hw, &st, &e);
		printf("%s %d %.9g %.9g %lld %lld\n", argv[4], wus, e.overlapped_s, best, (long long)e.mem.peak,
		       (long long)peak);
		cost_estimate_free(&e);
	}
	free(range);
	mpi_backend_free(&b);
	cost_step_free(&st);
	graph_free(&prog), graph_free(&model);
	return mpi_backend_finish(rc);
}
