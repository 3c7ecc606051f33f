#!/bin/sh
# mpi_test.sh: `spmd run --backend mpi` under mpirun on 2, 4 and 8 ranks, against the thread backend, and its faults.
#
#   sh tests/mpi_test.sh SPMD_BINARY SOURCE_DIR
#
# Every example runs with --check on meshes of 2, 4 and 8 devices (--mesh
# sizes each example's axes to the rank count; the train_ examples run 2
# training steps); its saved outputs (trained params) must equal the thread
# backend's bit for bit (the MPI backend keeps the fixed reduction order of
# docs/collectives.md), and be within the check's tolerance with
# SPMD_MPI_REDUCE=native (MPI's own reduction order, groups of 4 and 8).  --input files are
# read shard by shard on each rank.  A program written by hand with
# shard_rolls (tests/programs/shard_roll.yaml) runs on 4 ranks as on
# threads.  Faults must end the whole job with an
# error, every mpirun bounded by `timeout` so a hang fails the test: a wrong
# -np; a bad --input file on one rank only; an id out of range in one rank's
# shard (a kernel error mid-run: that rank ends the job); and a rank killed
# with SIGKILL while the other waits for it in a collective.
#
# In the sanitizer build (SPMD_SANITIZED=1, or a binary linking libasan), where each MPI process
# takes seconds to start and check its leaks, the forward examples and
# train_mlp run on 2 ranks, mlp with MPI's reductions on 4, --input on 2.  Open MPI's own allocations at exit are
# suppressed for LeakSanitizer (tests/lsan_mpi.supp); ours are still checked.
SPMD=$1
SRC=$2
PY=/usr/bin/python3
LIMIT=${MPI_TEST_TIMEOUT:-120}  # seconds any one mpirun may take

if [ -z "$SPMD" ] || [ -z "$SRC" ]; then
	echo "usage: sh mpi_test.sh SPMD_BINARY SOURCE_DIR" >&2
	exit 2
fi
if ! command -v mpirun >/dev/null 2>&1; then
	echo "mpi_test: mpirun is needed (Debian: apt-get install openmpi-bin libopenmpi-dev)" >&2
	exit 1
fi
if ! "$PY" -c 'import numpy' 2>/dev/null; then
	echo "mpi_test: $PY with numpy is needed (Debian: apt-get install python3-numpy)" >&2
	exit 1
fi

ROOT=""
[ "$(id -u)" = 0 ] && ROOT=--allow-run-as-root
MPIRUN="timeout $LIMIT mpirun $ROOT --oversubscribe"
LSAN_OPTIONS="suppressions=$SRC/tests/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0"
OPENBLAS_NUM_THREADS=1  # 8 processes on 2 cores: one BLAS thread each
export LSAN_OPTIONS OPENBLAS_NUM_THREADS
ASAN=0
{ [ "${SPMD_SANITIZED:-0}" = 1 ] || ldd "$SPMD" 2>/dev/null | grep -q libasan; } && ASAN=1

TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
show() { sed 's/^/    /' "$1" | head -n "${2:-15}"; }

# mesh_for EXAMPLE N: --mesh with the example's axes and N devices
mesh_for() {
	case $1:$2 in
	convnet:*) echo "data=$2" ;;
	embedding:2) echo "data=2,model=1" ;;
	embedding:8) echo "data=4,model=2" ;;
	*:2) echo "data=1,model=2" ;;
	*:4) echo "data=2,model=2" ;;
	*:8) echo "data=2,model=4" ;;
	esac
}

# same DIR_A DIR_B TOL: every .npy of A equals B's (TOL 0: bit for bit; else relative to B's largest magnitude)
same() {
	"$PY" - "$1" "$2" "$3" <<'EOF'
import glob, os, sys
import numpy as np
a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
files = sorted(glob.glob(os.path.join(b, "*.npy")))
if not files:
    sys.exit("no outputs in " + b)
for f in files:
    x, y = np.load(os.path.join(a, os.path.basename(f))), np.load(f)
    if x.shape != y.shape or x.dtype != y.dtype:
        sys.exit("%s: %s %s against %s %s" % (os.path.basename(f), x.dtype, x.shape, y.dtype, y.shape))
    if tol == 0:
        if x.tobytes() != y.tobytes():
            sys.exit("%s: not bit for bit equal (max difference %g)" % (os.path.basename(f), np.abs(x - y).max()))
    else:
        err = np.abs(x.astype(np.float64) - y).max() / max(np.abs(y).max(), 1e-30)
        if not err <= tol:
            sys.exit("%s: relative difference %g above %g" % (os.path.basename(f), err, tol))
EOF
}

# run_example EXAMPLE N [native [MESH]]: threads and MPI on N devices, --check, outputs compared
run_example() {
	ex=$1 n=$2 mode=${3:-ordered} mesh=${4:-$(mesh_for "${1#train_}" "$2")}
	model="$SRC/examples/$ex.yaml" dir="$TMP/$(basename "$ex").$n.$mode" steps=""
	case $ex in */*) model="$SRC/$ex.yaml" ;; esac # a model under tests/
	case $ex in train_*) steps="--steps 2" ;; esac
	# shellcheck disable=SC2086 # $steps is empty or two words
	if ! "$SPMD" run "$model" --mesh "$mesh" $steps --save "$dir/threads" >"$dir.threads.log" 2>&1; then
		bad "$ex on threads ($mesh) failed:"
		show "$dir.threads.log"
		return
	fi
	red="" tol=0
	[ "$mode" = native ] && red=native tol=1e-4
	# shellcheck disable=SC2086
	if ! SPMD_MPI_REDUCE=$red $MPIRUN -np "$n" "$SPMD" run "$model" --backend mpi --check --mesh "$mesh" $steps \
		--save "$dir/mpi" >"$dir.mpi.log" 2>&1; then
		bad "$ex on $n MPI ranks ($mesh, $mode) failed:"
		show "$dir.mpi.log"
	elif [ "$(grep -c '^check .* ok$' "$dir.mpi.log")" -lt 1 ] || grep -q MISMATCH "$dir.mpi.log"; then
		bad "$ex on $n MPI ranks ($mesh, $mode): --check did not pass:"
		show "$dir.mpi.log"
	elif ! same "$dir/mpi" "$dir/threads" $tol >"$dir.cmp.log" 2>&1; then
		bad "$ex on $n MPI ranks ($mesh, $mode) differs from threads: $(cat "$dir.cmp.log")"
	else
		ok
	fi
}

for n in 2 4 8; do
	for ex in mlp transformer_block embedding convnet train_mlp train_lamb train_transformer; do
		[ $ASAN = 1 ] && { [ "$n" != 2 ] || [ $ex = train_lamb ] || [ $ex = train_transformer ]; } && continue
		run_example $ex "$n"
	done
done
# A vocabulary-parallel loss trained across ranks: each rank's one_hot_shard
# block and the loss's statistics, all_reduced over model (11 classes on 2).
run_example tests/models/part_vocab_loss_grad 4 ordered data=2,model=2
# A weight gathered once a step (all_gather: first_use): the backward reads
# the forward's gathered copy across ranks as on threads.
run_example tests/models/train_first_use 4 ordered data=2,model=2
# Sub-axes: heads from a reshape keep model's split through model:(1)2 and
# model:(2)2 (or model:(2)4 on 16 ranks); the scores' all_reduce runs over
# a sub-axis.  The per-device files name the sub-axes and load on each rank.
run_example tests/models/part_head_split 8 ordered data=2,model=4
if [ $ASAN = 0 ]; then
	run_example tests/models/part_head_split 16 ordered data=2,model=8
	"$SPMD" partition "$SRC/tests/models/part_head_split.yaml" --per-device "$TMP/heads" >"$TMP/heads.log" 2>&1 &&
		"$SPMD" verify "$TMP/heads" >>"$TMP/heads.log" 2>&1 &&
		$MPIRUN -np 8 "$SPMD" run "$TMP/heads" --backend mpi --save "$TMP/heads.mpi" >>"$TMP/heads.log" 2>&1 &&
		"$SPMD" run "$SRC/tests/models/part_head_split.yaml" --save "$TMP/heads.threads" >>"$TMP/heads.log" 2>&1 &&
		grep -q 'model:(1)2' "$TMP/heads/device_5.yaml" &&
		same "$TMP/heads.mpi" "$TMP/heads.threads" 0 >>"$TMP/heads.log" 2>&1 && ok ||
		{ bad "per-device files with sub-axes on 8 MPI ranks:"; show "$TMP/heads.log"; }
fi
# MPI's own reductions, in groups of 4 (model) where the order of a sum shows
run_example mlp 4 native data=1,model=4
# a training step whose gradients' reductions run in the backward pass
# (docs/training.md, "The step's order"): on each rank as on threads
[ $ASAN = 1 ] || run_example tests/step_order/train_dp 4 ordered data=4,model=1
[ $ASAN = 1 ] || run_example train_transformer 8 native

# a program written by hand with shard_rolls (device-dependent: each rank
# turns its buffer by its own index) and a device order: as on threads
roll="$TMP/roll"
"$SPMD" run "$SRC/tests/programs/shard_roll.yaml" --save "$roll.threads" >"$roll.log" 2>&1 &&
	$MPIRUN -np 4 "$SPMD" run "$SRC/tests/programs/shard_roll.yaml" --backend mpi --save "$roll.mpi" >>"$roll.log" 2>&1 &&
	same "$roll.mpi" "$roll.threads" 0 >>"$roll.log" 2>&1 && ok ||
	{ bad "shard_roll on 4 MPI ranks:"; show "$roll.log"; }

# ---- --input: each rank reads its own shards of the files ----
"$PY" - "$TMP" <<'EOF'
import sys
import numpy as np
r = np.random.RandomState(5)
np.save(sys.argv[1] + "/x.npy", r.randn(32, 512).astype(np.float32))
np.save(sys.argv[1] + "/images.npy", r.randn(4, 16, 16, 3).astype(np.float32))
ids = r.randint(0, 1000, size=(8, 12)).astype(np.int32)
ids[6, 3] = 5000                     # in the rows of data shard 1 only
np.save(sys.argv[1] + "/ids_bad.npy", ids)
EOF
# input_case EXAMPLE N MESH NAME: --input NAME from $TMP/NAME.npy, threads against MPI
input_case() {
	dir="$TMP/in.$1.$2"
	"$SPMD" run "$SRC/examples/$1.yaml" --mesh "$3" --input "$4=$TMP/$4.npy" --save "$dir/threads" >"$dir.log" 2>&1 &&
		$MPIRUN -np "$2" "$SPMD" run "$SRC/examples/$1.yaml" --backend mpi --check --mesh "$3" \
			--input "$4=$TMP/$4.npy" --save "$dir/mpi" >>"$dir.log" 2>&1 &&
		same "$dir/mpi" "$dir/threads" 0 >>"$dir.log" 2>&1 && ok && return
	bad "--input $4 on $2 MPI ranks ($1, $3):"
	show "$dir.log"
}
if [ $ASAN = 1 ]; then input_case mlp 2 data=1,model=2 x; else input_case mlp 4 data=2,model=2 x; fi
[ $ASAN = 1 ] || input_case convnet 8 data=8 images  # a batch of 4 over 8 devices: half the shards are empty

# ---- faults: each must end the job with an error, never hang ----
# expect_fail NAME STATUS PATTERN: the last mpirun exited with STATUS (not timeout's 124) and said PATTERN once
expect_fail() {
	if [ "$st" = 124 ]; then
		bad "$1: mpirun was still running after ${LIMIT}s (a hang)"
	elif [ "$st" != "$2" ]; then
		bad "$1: exit status $st, expected $2:"
		show "$TMP/fault.log"
	elif [ -n "$3" ] && [ "$(grep -c "$3" "$TMP/fault.log")" != 1 ]; then
		bad "$1: expected one message matching '$3':"
		show "$TMP/fault.log"
	else
		ok
	fi
}

$MPIRUN -np 2 "$SPMD" run "$SRC/examples/mlp.yaml" --backend mpi >"$TMP/fault.log" 2>&1
st=$?
expect_fail "wrong -np" 2 "error: expected 8 MPI processes for the mesh data=2,model=4"

# a file only rank 1 cannot read (MPMD: each rank its own arguments)
M="--backend mpi --mesh data=1,model=2"
# shellcheck disable=SC2086 # $M is options without spaces
$MPIRUN -np 1 "$SPMD" run "$SRC/examples/mlp.yaml" $M --input "x=$TMP/x.npy" : \
	-np 1 "$SPMD" run "$SRC/examples/mlp.yaml" $M --input "x=$TMP/missing.npy" >"$TMP/fault.log" 2>&1
st=$?
expect_fail "a bad --input file on rank 1" 2 "missing.npy: error: expected a readable .npy file"

$MPIRUN -np 2 "$SPMD" run "$SRC/examples/embedding.yaml" --backend mpi --mesh data=2,model=1 \
	--input "ids=$TMP/ids_bad.npy" >"$TMP/fault.log" 2>&1
st=$?
expect_fail "an id out of range in rank 1's shard" 2 "error: device 1 (MPI rank 1) failed"

# SIGKILL: rank 1 blocks opening a FIFO for --input while rank 0 waits for it in a collective
mkfifo "$TMP/fifo.npy"
# shellcheck disable=SC2086
$MPIRUN -np 1 "$SPMD" run "$SRC/examples/mlp.yaml" $M --input "x=$TMP/x.npy" : \
	-np 1 "$SPMD" run "$SRC/examples/mlp.yaml" $M --input "x=$TMP/fifo.npy" >"$TMP/fault.log" 2>&1 &
job=$!
victim=""
for _ in $(seq 300); do  # up to 30 s for the rank to start
	for f in /proc/[0-9]*/cmdline; do
		p=${f#/proc/}
		p=${p%/cmdline}
		[ "$(cat "/proc/$p/comm" 2>/dev/null)" = spmd ] && tr '\0' ' ' <"$f" 2>/dev/null | grep -q "x=$TMP/fifo.npy" &&
			victim=$p
	done
	[ -n "$victim" ] && break
	sleep 0.1
done
sleep 0.5
t0=$(date +%s)
[ -n "$victim" ] && kill -9 "$victim"
wait $job
st=$?
if [ -z "$victim" ]; then
	bad "SIGKILL: rank 1 never started"
elif [ "$st" = 124 ] || [ "$st" = 0 ] || [ $(($(date +%s) - t0)) -gt 30 ]; then
	bad "SIGKILL of rank 1: mpirun exited with $st after $(($(date +%s) - t0))s:"
	show "$TMP/fault.log"
else
	ok
fi

# A rank that stops making progress (here: rank 1 stops before its first
# collective) ends the job after --timeout, a waiting rank naming the
# collective and the op it waits in. mpirun ends the job when the first rank
# exits, so which of the waiting ranks gets to print first is a race: any
# of 0, 2 and 3 will do.
SPMD_TEST_MPI_STALL_RANK=1 $MPIRUN -np 4 "$SPMD" run "$SRC/examples/mlp.yaml" --mesh data=2,model=2 --backend mpi \
	--timeout 2 >"$TMP/stall.log" 2>&1
st=$?
if [ "$st" != 0 ] && [ "$st" != 124 ] &&
   grep -q "spmd: rank [023]: error: no progress for 2 s in .* of all_reduce over \[model\] at .*mlp.yaml:[0-9]*:[0-9]* (--timeout)" "$TMP/stall.log"; then
	ok
else
	bad "a stalled rank: mpirun exited with $st"
	show "$TMP/stall.log"
fi
"$SPMD" run "$SRC/examples/mlp.yaml" --backend mpi --timeout 0 >"$TMP/t0.log" 2>&1
if [ $? = 2 ] && grep -q "expected a number of seconds above 0, .* after --timeout, found '0'" "$TMP/t0.log"; then ok
else bad "--timeout 0 is refused"; show "$TMP/t0.log"; fi

echo "mpi_test: $pass passed, $fail failed"
[ $fail -eq 0 ]
