# mpi_lib.sh: sourced by script tests that run a training model under MPI.
#
# mpi_matches MODEL MESH NP STEPS DIR: run MODEL for STEPS steps on threads
# and on NP MPI ranks (--backend mpi --check), both --save'd under DIR; true
# when both run, the check passes and every saved file is the same bytes.
# Writes the failing step's output to DIR/out.  Needs SPMD, SRC and PY.
mpi_matches() {
	_root=""
	[ "$(id -u)" = 0 ] && _root=--allow-run-as-root
	rm -rf "$5/thr" "$5/mpi"
	OPENBLAS_NUM_THREADS=1 "$SPMD" run "$1" --mesh "$2" --steps "$4" --save "$5/thr" > "$5/out" 2>&1 || return 1
	OPENBLAS_NUM_THREADS=1 LSAN_OPTIONS="suppressions=$SRC/tests/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0" \
		timeout "${MPI_TEST_TIMEOUT:-120}" mpirun $_root --oversubscribe -np "$3" "$SPMD" run "$1" --backend mpi \
		--check --mesh "$2" --steps "$4" --save "$5/mpi" > "$5/out" 2>&1 || return 1
	"$PY" - "$5/thr" "$5/mpi" > "$5/out" 2>&1 <<'PY'
import glob, os, sys
fs = sorted(glob.glob(sys.argv[1] + "/*.npy"))
assert fs, "no files saved"
for f in fs:
    assert open(f, "rb").read() == open(os.path.join(sys.argv[2], os.path.basename(f)), "rb").read(), f
PY
}
