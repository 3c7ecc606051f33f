#!/bin/sh
# numpy_test.sh: cross-check `spmd run --save` against numpy (tests/numpy_ref.py) on every example and op model.
#
#   sh tests/numpy_test.sh SPMD_BINARY SOURCE_DIR
#
# For each model: numpy makes random .npy files for all inputs and params
# (i32 ids within range), spmd runs the model on them and saves its outputs,
# and an independent numpy interpreter of the format computes the same outputs
# and compares.  Also checks that the comparison can fail (a perturbed output
# must be caught) and that a run-time id out of range is refused.
SPMD=$1
SRC=$2
PY=/usr/bin/python3
SEED=${NUMPY_TEST_SEED:-11}  # the test data's seed
REF="$SRC/tests/numpy_ref.py"

if [ -z "$SPMD" ] || [ -z "$SRC" ]; then
	echo "usage: sh numpy_test.sh SPMD_BINARY SOURCE_DIR" >&2
	exit 2
fi
if ! "$PY" -c 'import numpy, yaml' 2>/dev/null; then
	echo "numpy_test: $PY with numpy and PyYAML is needed (Debian: apt-get install python3-numpy python3-yaml)" >&2
	exit 1
fi

TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
pass=0
fail=0
skip=0

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# check_model MODEL: generate, run spmd, compare.  Leaves its files in $TMP/NAME.
check_model() {
	model=$1
	name=$(basename "$model" .yaml)
	dir="$TMP/$name"
	mkdir -p "$dir/in" "$dir/out"
	args=$("$PY" "$REF" gen "$model" "$dir/in" --seed "$SEED")
	st=$?
	if [ $st -eq 3 ]; then
		skip=$((skip + 1))
		echo "SKIP: $name: $args"
		return
	fi
	[ $st -eq 0 ] || { bad "$name: numpy_ref gen failed"; return; }
	# shellcheck disable=SC2086 # args are --input NAME=PATH words without spaces
	if ! "$SPMD" run "$model" $args --save "$dir/out" >"$dir/run.log" 2>&1; then
		bad "$name: spmd run failed:"
		sed 's/^/    /' "$dir/run.log" | head -20
		return
	fi
	if "$PY" "$REF" check "$model" "$dir/in" "$dir/out"; then
		ok
	else
		bad "$name: spmd and numpy differ"
	fi
}

for model in "$SRC"/examples/*.yaml "$SRC"/tests/models/ops_*.yaml; do
	[ -f "$model" ] || continue
	check_model "$model"
done

# The comparison must be able to fail: perturb one saved output and expect a mismatch.
mlp_y="$TMP/mlp/out/y.npy"
if [ -f "$mlp_y" ]; then
	"$PY" -c "import numpy as np, sys; a = np.load(sys.argv[1]); a[3, 7] += 1e-3 * np.abs(a).max(); np.save(sys.argv[1], a)" "$mlp_y"
	if "$PY" "$REF" check "$SRC/examples/mlp.yaml" "$TMP/mlp/in" "$TMP/mlp/out" >/dev/null; then
		bad "numpy_ref accepted a perturbed output"
	else
		ok
	fi
fi

# An id outside the table is a run-time error: exit status 2, no output file.
lk="$TMP/ops_lookup"
if [ -d "$lk/in" ]; then
	"$PY" -c "import numpy as np, sys; np.save(sys.argv[1], np.full((3, 4), 10, '<i4'))" "$lk/bad_ids.npy"
	rm -rf "$lk/out_bad"
	set -- --input "ids=$lk/bad_ids.npy"
	for f in "$lk"/in/*.npy; do
		n=$(basename "$f" .npy)
		[ "$n" = ids ] || set -- "$@" --input "$n=$f"
	done
	"$SPMD" run "$SRC/tests/models/ops_lookup.yaml" "$@" --save "$lk/out_bad" >"$lk/bad.log" 2>&1
	st=$?
	if [ $st -ne 2 ]; then
		bad "take with an id out of range: exit status $st, expected 2"
	elif [ -f "$lk/out_bad/rows.npy" ]; then
		bad "take with an id out of range still saved rows.npy"
	else
		ok
	fi
fi

echo "numpy_test: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
