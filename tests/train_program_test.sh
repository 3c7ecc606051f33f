#!/bin/sh
# train_program_test.sh: training steps written out by `spmd partition`,
# run as programs, verified, and resumed with --save / --load: on threads,
# on the reference executor and under MPI (per-device files run as
# separate programs: rank r loads only DIR/device_r.yaml).
#
# Usage: sh tests/train_program_test.sh SPMD_BINARY SOURCE_DIR
#
# For each training model (the examples, and a small MLP under every
# optimizer and weight-update sharding setting, on 1-D, 2-D and uneven
# meshes) and the same --input files:
#   - `spmd run P.yaml --steps K` (P from -o) and `spmd run DIR/device_N.yaml`
#     (from --per-device) print exactly what `spmd run MODEL --steps K`
#     prints, and --save writes the same files byte for byte (params,
#     optimizer state, step counter);
#   - `spmd verify DIR` passes;
#   - K steps, then K more from --load, save the files 2K steps save, from
#     the model and from the program, on threads and on the reference.
# And the errors: --load without a saved file, --load or --steps on a model
# without train: or a forward program, exit 2 naming what is missing.
#
# Under MPI (every mpirun bounded by `timeout`, so a hang fails the test):
#   - `mpirun -np N spmd run DIR --backend mpi --steps K` prints what the
#     model prints on MPI and saves the same files, byte for byte, which are
#     also the thread backend's; with --input too;
#   - K steps then K more from --load equal 2K steps, from the files and
#     from the model;
#   - a wrong -np, a missing file, a file of another program or of another
#     kind: exit 2 on every rank (mpirun's status), the reason on stderr.
SPMD=$1
SRC=${2:-.}
cd "$SRC" || exit 1
LIMIT=${MPI_TEST_TIMEOUT:-120}  # seconds any one mpirun may take
if ! command -v mpirun >/dev/null 2>&1; then
	echo "train_program_test: mpirun is needed (Debian: apt-get install openmpi-bin libopenmpi-dev)" >&2
	exit 1
fi
ROOT=""
[ "$(id -u)" = 0 ] && ROOT=--allow-run-as-root
MPIRUN="timeout $LIMIT mpirun $ROOT --oversubscribe"
LSAN_OPTIONS="suppressions=$SRC/tests/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0"
OPENBLAS_NUM_THREADS=1
export LSAN_OPTIONS OPENBLAS_NUM_THREADS
# Sanitizer builds run every kind of case once: fewer examples and meshes.
EXAMPLES="train_mlp train_lamb train_transformer" MESHES="data=3,model=1 data=2,model=2 data=3,model=2"
if [ "${SPMD_SANITIZED:-0}" = 1 ] || ldd "$SPMD" 2>/dev/null | grep -q libasan; then
	EXAMPLES="train_lamb" MESHES="data=3,model=2"
fi
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

# same_files A B: B holds exactly A's files, byte for byte
same_files() {
	[ -n "$(ls "$1")" ] || return 1
	[ "$(ls "$1")" = "$(ls "$2")" ] || return 1
	for f in "$1"/*; do
		cmp -s "$f" "$2/${f##*/}" || return 1
	done
}

# ---- models: a small MLP whose sizes divide neither 3 nor 4, every optimizer ----

# mlp NAME OPTIMIZER WUS [EXTRA TRAIN LINES]
mlp() {
	cat >"$tmp/$1.yaml" <<EOF
name: $1
mesh: {data: 4, model: 1}
inputs:
  x:      {shape: [24, 12], sharding: [data, null]}
  labels: {shape: [24], dtype: i32, sharding: [data]}
params:
  w1: {shape: [12, 40], sharding: [null, model], init: {normal: 0.2}}
  b1: {shape: [40], sharding: [model], init: zeros}
  w2: {shape: [40, 10], sharding: [model, null], init: {normal: 0.2}}
  b2: {shape: [10], init: zeros}
ops:
  - {out: h,      op: einsum, in: [x, w1], eq: "bd,df->bf"}
  - {out: hb,     op: add, in: [h, b1]}
  - {out: a,      op: gelu, in: [hb]}
  - {out: z,      op: einsum, in: [a, w2], eq: "bf,fc->bc"}
  - {out: logits, op: add, in: [z, b2]}
  - {out: loss,   op: softmax_cross_entropy, in: [logits, labels]}
outputs: [loss]
train:
  loss: loss
  optimizer: $2
  weight_update_sharding: $3
EOF
	[ -n "$4" ] && printf '%b' "$4" >>"$tmp/$1.yaml"
}
mlp adam_on "{type: adam, lr: 0.01}" on
mlp lamb_auto "{type: lamb, lr: 0.01}" auto "  clip_global_norm: 0.5\n"
mlp momentum_before_use "{type: momentum, lr: 0.1}" on "  all_gather: before_use\n  grad_dtype: bf16\n"
mlp adamw_off "{type: adamw, lr: 0.01}" off ""
mlp sgd_ungrouped "{type: sgd, lr: 0.1, weight_decay: 0.01}" on "  group_bytes: 0\n"
# all_gather per param: w2 kept whole between steps, the rest gathered at use
mlp adam_mixed "{type: adam, lr: 0.01}" on "  all_gather: before_use\n"
sed -i 's/^  w2: {\(.*\)}$/  w2: {\1, all_gather: after_update}/' "$tmp/adam_mixed.yaml"
grep -q 'all_gather: after_update}' "$tmp/adam_mixed.yaml" || fail "adam_mixed" "w2's all_gather not written"

# Whole --input files for the MLP (made by a forward run of a model that saves them).
cat >"$tmp/data.yaml" <<'EOF'
inputs:
  x0: {shape: [24, 12]}
ops:
  - {out: x, op: mul, in: [x0, 3.0]}
outputs: [x]
EOF
"$SPMD" run "$tmp/data.yaml" --seed 7 --save "$tmp/data" >/dev/null 2>"$tmp/err" || fail "data" "could not make x.npy"
INPUT="--input x=$tmp/data/x.npy"

# check_program MODEL MESH [INPUT...]: program and device file against the model, verify, resume
check_program() {
	model=$1 mesh=$2 name=$(basename "$1" .yaml).$2
	shift 2
	d="$tmp/$name"
	mkdir -p "$d"
	if ! "$SPMD" run "$model" --mesh "$mesh" --steps 3 --seed 5 "$@" --save "$d/model" >"$d/model.out" 2>"$tmp/err"; then
		fail "$name" "the model does not train"
		return
	fi
	if ! "$SPMD" partition "$model" --mesh "$mesh" -o "$d/p.yaml" --per-device "$d/dev" >/dev/null 2>"$tmp/err"; then
		fail "$name" "spmd partition -o/--per-device failed"
		return
	fi
	"$SPMD" run "$d/p.yaml" --steps 3 --seed 5 "$@" --save "$d/prog" >"$d/prog.out" 2>"$tmp/err"
	cmp -s "$d/model.out" "$d/prog.out" && same_files "$d/model" "$d/prog" && pass ||
		fail "$name" "the program written with -o does not train as its model"
	last=$(ls "$d/dev" | sort -t_ -k2 -n | tail -n 1)
	"$SPMD" run "$d/dev/$last" --steps 3 --seed 5 "$@" --save "$d/file" >"$d/file.out" 2>"$tmp/err"
	cmp -s "$d/model.out" "$d/file.out" && same_files "$d/model" "$d/file" && pass ||
		fail "$name" "$last does not train as its model"
	"$SPMD" verify "$d/dev" >/dev/null 2>"$tmp/err" && pass || fail "$name" "spmd verify fails on its files"
	# resume: 2 steps, then 1 more, from the model and from the program, equal 3 steps
	"$SPMD" run "$model" --mesh "$mesh" --steps 2 --seed 5 "$@" --save "$d/half" >/dev/null 2>"$tmp/err" &&
		"$SPMD" run "$model" --mesh "$mesh" --steps 1 --seed 5 "$@" --load "$d/half" --save "$d/rm" \
			>/dev/null 2>"$tmp/err" &&
		"$SPMD" run "$d/p.yaml" --steps 1 --seed 5 "$@" --load "$d/half" --save "$d/rp" >/dev/null 2>"$tmp/err" &&
		same_files "$d/model" "$d/rm" && same_files "$d/model" "$d/rp" && pass ||
		fail "$name" "2 steps then 1 from --load differ from 3 steps"
}

for ex in $EXAMPLES; do
	mesh=data=2,model=2
	[ $ex = train_lamb ] && mesh=data=2,model=1
	check_program "examples/$ex.yaml" "$mesh"
done
for m in adam_on lamb_auto momentum_before_use adam_mixed adamw_off sgd_ungrouped; do
	for mesh in $MESHES; do
		check_program "$tmp/$m.yaml" "$mesh"
	done
done
check_program "$tmp/adam_on.yaml" data=4,model=1 $INPUT
check_program "$tmp/adam_on.yaml" data=1,model=1

# The saved files: params, every state value and the step counter, in global shapes.
ls "$tmp/adam_on.data=3,model=2/model" >"$tmp/saved"
[ "$(tr '\n' ' ' <"$tmp/saved")" = "adam_m%b1.npy adam_m%b2.npy adam_m%w1.npy adam_m%w2.npy adam_v%b1.npy adam_v%b2.npy adam_v%w1.npy adam_v%w2.npy b1.npy b2.npy opt%step.npy w1.npy w2.npy " ] &&
	pass || fail "--save after training" "expected params, optimizer state and step counter, found $(cat "$tmp/saved")"

# Resume on the reference executor: 2 + 2 steps = 4 steps.
m="$tmp/adam_on.yaml"
"$SPMD" run "$m" --backend ref --steps 4 --save "$tmp/ref4" >/dev/null 2>"$tmp/err" &&
	"$SPMD" run "$m" --backend ref --steps 2 --save "$tmp/ref2" >/dev/null 2>"$tmp/err" &&
	"$SPMD" run "$m" --backend ref --steps 2 --load "$tmp/ref2" --save "$tmp/ref22" >/dev/null 2>"$tmp/err" &&
	same_files "$tmp/ref4" "$tmp/ref22" && pass || fail "resume on ref" "2 + 2 steps differ from 4"
# --check starts the reference from the same files.
"$SPMD" run "$m" --steps 2 --load "$tmp/ref2" --check >"$tmp/out" 2>"$tmp/err" && pass ||
	fail "resume --check" "the partitioned run and the reference disagree after --load"

# ---- errors ----

expect2() { # NAME PATTERN COMMAND...: exit 2, stderr containing PATTERN
	name=$1 pat=$2
	shift 2
	"$@" >/dev/null 2>"$tmp/err"
	st=$?
	[ $st -eq 2 ] && grep -q -- "$pat" "$tmp/err" && pass || fail "$name" "exit $st, expected 2 and '$pat'"
}
cp -r "$tmp/ref2" "$tmp/partial" && rm "$tmp/partial/adam_v%w2.npy"
expect2 "--load missing file" "expected $tmp/partial/adam_v%w2.npy, the saved optimizer state 'adam_v%w2'" \
	"$SPMD" run "$m" --steps 1 --load "$tmp/partial"
expect2 "--load without train" "expected a model with a train: section for --steps or --load" \
	"$SPMD" run examples/mlp.yaml --load "$tmp/ref2"
"$SPMD" partition examples/mlp.yaml -o "$tmp/fwd.yaml" >/dev/null 2>&1
expect2 "--steps on a forward program" "expected a model or a training program for --steps" \
	"$SPMD" run "$tmp/fwd.yaml" --steps 2
expect2 "--load on a forward program" "expected a model or a training program for --load" \
	"$SPMD" run "$tmp/fwd.yaml" --load "$tmp/ref2"
expect2 "--check on a training program" "expected a model for --check" \
	"$SPMD" run "$tmp/adam_on.data=3,model=2/p.yaml" --check
expect2 "a directory on threads" "expected --backend mpi (mpirun -np DEVICES) to run the per-device files" \
	"$SPMD" run "$tmp/adam_on.data=3,model=2/dev"
expect2 "--load with a file of another shape" "expected f32 \[12, 40\] for 'w1'" \
	"$SPMD" run "$tmp/adam_on.yaml" --steps 1 --load "$tmp/ref2" --input "w1=$tmp/ref2/w2.npy"

# ---- MPI ----

# Adam with weight-update sharding on 3 ranks (sizes 24, 40 and 10 do not divide by 3).
sed -e 's/data: 4, model: 1/data: 3/' -e 's/sharding: \[null, model\]/sharding: [null, null]/' \
	-e 's/sharding: \[model\]/sharding: [null]/' -e 's/sharding: \[model, null\]/sharding: [null, null]/' \
	tests/wus/wus_mlp.yaml >"$tmp/adam.yaml"

# check_mpi MODEL N NAME [OPTIONS...]: the model on threads and MPI, its files on MPI, resume
check_mpi() {
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
[ "$EXAMPLES" = train_lamb ] || check_mpi examples/train_mlp.yaml 4 mlp
check_mpi "$tmp/adam.yaml" 3 adam --input "x=$tmp/data/x.npy"

# A forward pass's files run the same way.
"$SPMD" partition examples/mlp.yaml --mesh data=2,model=1 --per-device "$tmp/fwd" >/dev/null 2>"$tmp/err"
$MPIRUN -np 2 "$SPMD" run "$tmp/fwd" --backend mpi --seed 3 --save "$tmp/fwd.files" >"$tmp/fwd.out" 2>"$tmp/err" &&
	$MPIRUN -np 2 "$SPMD" run examples/mlp.yaml --mesh data=2,model=1 --backend mpi --seed 3 --save "$tmp/fwd.model" \
		>"$tmp/fwd.model.out" 2>"$tmp/err" &&
	cmp -s "$tmp/fwd.out" "$tmp/fwd.model.out" && same_files "$tmp/fwd.model" "$tmp/fwd.files" && pass ||
	fail "forward per-device files on MPI" "differ from the model on MPI"

# ---- errors: every rank exits 2 ----

expect2_mpi() { # NAME PATTERN N DIR
	$MPIRUN -np "$3" "$SPMD" run "$4" --backend mpi --steps 1 >/dev/null 2>"$tmp/err"
	st=$?
	[ $st -eq 2 ] && grep -q -- "$2" "$tmp/err" && pass || fail "$1" "exit $st, expected 2 and '$2'"
}
dev="$tmp/adam/dev"
expect2_mpi "too few ranks" "expected 3 MPI processes for the 3 per-device files of $dev (mpirun -np 3), found 2" 2 "$dev"
expect2_mpi "too many ranks" "expected 3 MPI processes for the 3 per-device files of $dev" 4 "$dev"
cp -r "$dev" "$tmp/missing" && rm "$tmp/missing/device_1.yaml"
expect2_mpi "a missing file" "$tmp/missing/device_1.yaml: error: cannot open" 3 "$tmp/missing"
# another program: the same model with another learning rate, device 1's file swapped in
sed 's/lr: 0.01/lr: 0.02/' "$tmp/adam.yaml" >"$tmp/lr.yaml"
"$SPMD" partition "$tmp/lr.yaml" --per-device "$tmp/lr" >/dev/null 2>&1
cp -r "$dev" "$tmp/two" && cp "$tmp/lr/device_1.yaml" "$tmp/two/device_1.yaml"
expect2_mpi "files of two programs" "expected the per-device files of one program in $tmp/two, found device 1's" 3 "$tmp/two"
cp -r "$dev" "$tmp/swapped" && cp "$dev/device_0.yaml" "$tmp/swapped/device_2.yaml"
expect2_mpi "another device's file" "expected $tmp/swapped/device_2.yaml to be device 2's program" 3 "$tmp/swapped"
cp -r "$dev" "$tmp/shared" && "$SPMD" partition "$tmp/adam.yaml" -o "$tmp/shared/device_1.yaml" >/dev/null 2>&1
expect2_mpi "the shared program as a device's" "found the program of spmd partition -o" 3 "$tmp/shared"


echo "train_program_test: $npass passed, $nfail failed"
[ "$nfail" -eq 0 ]
