#!/bin/sh
# train_mpi_test.sh: training programs under MPI — per-device files run as
# separate programs (rank r loads only DIR/device_r.yaml), and resume.
#
# Usage: sh tests/train_mpi_test.sh SPMD_BINARY SOURCE_DIR
#
#   - `mpirun -np N spmd run DIR --backend mpi --steps K` prints what the
#     model prints on MPI and saves the same files, byte for byte, which are
#     also the thread backend's (params, optimizer state, step counter);
#     with --input too;
#   - K steps then K more from --load equal 2K steps, from the files and
#     from the model;
#   - a wrong -np, a missing file, a file of another program or of another
#     kind: exit 2 on every rank (mpirun's status), the reason on stderr.
# Every mpirun is bounded by `timeout`, so a hang fails the test.
SPMD=$1
SRC=${2:-.}
cd "$SRC" || exit 1
LIMIT=${MPI_TEST_TIMEOUT:-120}
if ! command -v mpirun >/dev/null 2>&1; then
	echo "train_mpi_test: mpirun is needed (Debian: apt-get install openmpi-bin libopenmpi-dev)" >&2
	exit 1
fi
ROOT=""
[ "$(id -u)" = 0 ] && ROOT=--allow-run-as-root
MPIRUN="timeout $LIMIT mpirun $ROOT --oversubscribe"
LSAN_OPTIONS="suppressions=$SRC/tests/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0"
OPENBLAS_NUM_THREADS=1
export LSAN_OPTIONS OPENBLAS_NUM_THREADS
ulimit -c 0 2>/dev/null
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

npass=0
nfail=0
fail() {
	echo "FAIL $1: $2"
	[ -f "$tmp/err" ] && sed 's/^/    /' "$tmp/err" | head -n 8
	nfail=$((nfail + 1))
}
pass() { npass=$((npass + 1)); }
same_files() {
	[ -n "$(ls "$1")" ] && [ "$(ls "$1")" = "$(ls "$2")" ] || return 1
	for f in "$1"/*; do
		cmp -s "$f" "$2/${f##*/}" || return 1
	done
}

# Adam with weight-update sharding on 3 ranks (sizes 24, 40 and 10 do not divide by 3).
sed -e 's/data: 4, model: 1/data: 3/' -e 's/sharding: \[null, model\]/sharding: [null, null]/' \
	-e 's/sharding: \[model\]/sharding: [null]/' -e 's/sharding: \[model, null\]/sharding: [null, null]/' \
	tests/wus/wus_mlp.yaml >"$tmp/adam.yaml"
cat >"$tmp/data.yaml" <<'EOF'
inputs:
  x0: {shape: [24, 12]}
ops:
  - {out: x, op: mul, in: [x0, 3.0]}
outputs: [x]
EOF
"$SPMD" run "$tmp/data.yaml" --seed 7 --save "$tmp/data" >/dev/null 2>"$tmp/err" || fail data "no x.npy"

# check MODEL N NAME [OPTIONS...]: the model on threads and MPI, its files on MPI, resume
check() {
	model=$1 n=$2 d="$tmp/$3"
	shift 3
	mkdir -p "$d"
	"$SPMD" partition "$model" --per-device "$d/dev" >/dev/null 2>"$tmp/err" || fail "$model" "partition failed"
	"$SPMD" run "$model" --steps 3 "$@" --save "$d/threads" >/dev/null 2>"$tmp/err" ||
		fail "$model" "threads failed"
	$MPIRUN -np "$n" "$SPMD" run "$model" --backend mpi --steps 3 "$@" --save "$d/model" >"$d/model.out" 2>"$tmp/err" ||
		fail "$model" "the model on MPI failed"
	$MPIRUN -np "$n" "$SPMD" run "$d/dev" --backend mpi --steps 3 "$@" --save "$d/files" >"$d/files.out" 2>"$tmp/err"
	st=$?
	[ $st -eq 0 ] && cmp -s "$d/model.out" "$d/files.out" && same_files "$d/model" "$d/files" &&
		same_files "$d/threads" "$d/files" && pass ||
		fail "$model" "per-device files on MPI (exit $st) differ from the model on MPI or threads"
	# resume from the files: 2 steps, then 1 from --load, equal 3; and from the model
	$MPIRUN -np "$n" "$SPMD" run "$d/dev" --backend mpi --steps 2 "$@" --save "$d/half" >/dev/null 2>"$tmp/err" &&
		$MPIRUN -np "$n" "$SPMD" run "$d/dev" --backend mpi --steps 1 "$@" --load "$d/half" --save "$d/rf" \
			>/dev/null 2>"$tmp/err" &&
		$MPIRUN -np "$n" "$SPMD" run "$model" --backend mpi --steps 1 "$@" --load "$d/half" --save "$d/rm" \
			>/dev/null 2>"$tmp/err" &&
		same_files "$d/model" "$d/rf" && same_files "$d/model" "$d/rm" && pass ||
		fail "$model" "on MPI, 2 steps then 1 from --load differ from 3 steps"
}
check examples/train_mlp.yaml 4 mlp
check "$tmp/adam.yaml" 3 adam --input "x=$tmp/data/x.npy"

# ---- errors: every rank exits 2 ----

expect2() { # NAME PATTERN N DIR
	$MPIRUN -np "$3" "$SPMD" run "$4" --backend mpi --steps 1 >/dev/null 2>"$tmp/err"
	st=$?
	[ $st -eq 2 ] && grep -q -- "$2" "$tmp/err" && pass || fail "$1" "exit $st, expected 2 and '$2'"
}
dev="$tmp/mlp/dev"
expect2 "too few ranks" "expected 4 MPI processes for the 4 per-device files of $dev (mpirun -np 4), found 2" 2 "$dev"
expect2 "too many ranks" "expected 4 MPI processes for the 4 per-device files of $dev" 5 "$dev"
cp -r "$dev" "$tmp/missing" && rm "$tmp/missing/device_2.yaml"
expect2 "a missing file" "$tmp/missing/device_2.yaml: error: cannot open" 4 "$tmp/missing"
# another program: the same model with another learning rate, device 1's file swapped in
sed 's/lr: 0.1/lr: 0.2/' examples/train_mlp.yaml >"$tmp/lr.yaml"
"$SPMD" partition "$tmp/lr.yaml" --per-device "$tmp/lr" >/dev/null 2>&1
cp -r "$dev" "$tmp/two" && cp "$tmp/lr/device_1.yaml" "$tmp/two/device_1.yaml"
expect2 "files of two programs" "expected the per-device files of one program in $tmp/two, found device 1's" 4 "$tmp/two"
cp -r "$dev" "$tmp/swapped" && cp "$dev/device_0.yaml" "$tmp/swapped/device_3.yaml"
expect2 "another device's file" "expected $tmp/swapped/device_3.yaml to be device 3's program" 4 "$tmp/swapped"
cp -r "$dev" "$tmp/shared" && "$SPMD" partition examples/train_mlp.yaml -o "$tmp/shared/device_1.yaml" >/dev/null 2>&1
expect2 "the shared program as a device's" "found the program of spmd partition -o" 4 "$tmp/shared"

echo "train_mpi_test: $npass passed, $nfail failed"
[ "$nfail" -eq 0 ]
