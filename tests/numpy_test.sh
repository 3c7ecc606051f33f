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
# ref: the reference executor; threads: partitioned over the mesh, one thread per device
BACKENDS=${NUMPY_TEST_BACKENDS:-ref threads}
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
	mkdir -p "$dir/in"
	args=$("$PY" "$REF" gen "$model" "$dir/in" --seed "$SEED")
	st=$?
	if [ $st -eq 3 ]; then
		skip=$((skip + 1))
		echo "SKIP: $name: $args"
		return
	fi
	[ $st -eq 0 ] || { bad "$name: numpy_ref gen failed"; return; }
	for backend in $BACKENDS; do
		out="$dir/out.$backend"
		# shellcheck disable=SC2086 # args are --input NAME=PATH words without spaces
		if ! "$SPMD" run "$model" $args --backend "$backend" --save "$out" >"$out.log" 2>&1; then
			bad "$name ($backend): spmd run failed:"
			sed 's/^/    /' "$out.log" | head -20
		elif "$PY" "$REF" check "$model" "$dir/in" "$out"; then
			ok
		else
			bad "$name ($backend): spmd and numpy differ"
		fi
	done
}

for model in "$SRC"/examples/*.yaml "$SRC"/tests/models/ops_*.yaml; do
	[ -f "$model" ] || continue
	check_model "$model"
done

# The comparison must be able to fail: perturb one saved output and expect a mismatch.
mlp_y="$TMP/mlp/out.ref/y.npy"
if [ -f "$mlp_y" ]; then
	"$PY" -c "import numpy as np, sys; a = np.load(sys.argv[1]); a[3, 7] += 1e-3 * np.abs(a).max(); np.save(sys.argv[1], a)" "$mlp_y"
	if "$PY" "$REF" check "$SRC/examples/mlp.yaml" "$TMP/mlp/in" "$TMP/mlp/out.ref" >/dev/null; then
		bad "numpy_ref accepted a perturbed output"
	else
		ok
	fi
fi

# An id outside the table is a run-time error: exit status 2, a message, no output file.
lk="$TMP/ops_lookup"
if [ -d "$lk/in" ]; then
	"$PY" -c "import numpy as np, sys; np.save(sys.argv[1], np.full((3, 4), 10, '<i4'))" "$lk/bad_ids.npy"
	set -- --input "ids=$lk/bad_ids.npy"
	for f in "$lk"/in/*.npy; do
		n=$(basename "$f" .npy)
		[ "$n" = ids ] || set -- "$@" --input "$n=$f"
	done
	for backend in $BACKENDS; do
		"$SPMD" run "$SRC/tests/models/ops_lookup.yaml" "$@" --backend "$backend" --save "$lk/bad.$backend" \
			>"$lk/bad.$backend.log" 2>&1
		st=$?
		if [ $st -ne 2 ]; then
			bad "take with an id out of range ($backend): exit status $st, expected 2"
		elif ! grep -q "error: .*take.*expected an id" "$lk/bad.$backend.log"; then
			bad "take with an id out of range ($backend): no error message"
		elif [ -f "$lk/bad.$backend/rows.npy" ]; then
			bad "take with an id out of range ($backend): rows.npy was saved"
		else
			ok
		fi
	done
fi

echo "numpy_test: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
