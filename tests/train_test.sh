#!/bin/sh
# train_test.sh: training end to end through `spmd run --steps K`.
#
# Usage: sh tests/train_test.sh SPMD_BINARY SOURCE_DIR
#
#  1. the loss goes down over a few steps on the reference executor, for the
#     three training examples;
#  2. `--steps 3 --check` (threads against the reference, loss and params)
#     passes on meshes {data: N} and {data, model} whose sizes do not divide
#     the tensors, for every optimizer, with clipping and bf16 gradients;
#  3. every tests/train_bad/NAME.yaml (first line `# expect: LINE:COL: MESSAGE`)
#     is refused with exit status 2 and FILE:LINE:COL: error: MESSAGE;
#  4. usage errors, the warning for a param the loss does not reach, --save.
SPMD=$1
SRC=${2:-.}
cd "$SRC" || exit 1
ulimit -c 0 2>/dev/null
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

nfail=0
fail() {
	echo "FAIL $1"
	sed 's/^/    /' "$tmp/out" | head -n 25
	nfail=$((nfail + 1))
}

# ---- 1. the loss decreases ----
for m in examples/train_mlp.yaml examples/train_transformer.yaml examples/train_lamb.yaml; do
	if ! "$SPMD" run "$m" --backend ref --steps 4 >"$tmp/out" 2>&1; then
		fail "$m: exit status $?"
		continue
	fi
	first=$(sed -n 's/^step 1 *loss //p' "$tmp/out")
	last=$(sed -n 's/^step 4 *loss //p' "$tmp/out")
	awk -v a="$first" -v b="$last" 'BEGIN { exit !(a + 0 == a && b + 0 < a + 0) }' ||
		fail "$m: the loss went from '$first' to '$last'"
done

# ---- 2. partitioned runs match the reference ----
check() { # MODEL MESH
	"$SPMD" run "$1" --steps 3 --check --mesh "$2" >"$tmp/out" 2>&1
	st=$?
	if [ $st -ne 0 ] || ! grep -q '^check loss .* ok$' "$tmp/out"; then
		fail "$1 --mesh $2: exit status $st"
	fi
}

# examples/train_mlp.yaml with another optimizer and options ($tmp/NAME.yaml),
# and its one-axis form ($tmp/NAME_1d.yaml: mesh {data}, no model splits)
variant() { # NAME OPTIMIZER OPTIONS
	sed -e "s|^  optimizer: .*|  optimizer: $2|" -e "s|^  steps: .*|  steps: 3$3|" examples/train_mlp.yaml >"$tmp/$1.yaml"
	sed -e 's/^mesh: .*/mesh: {data: 2}/' -e 's/\[model/[null/g' -e 's/ model\]/ null]/g' "$tmp/$1.yaml" >"$tmp/$1_1d.yaml"
}
variant sgd "{type: sgd, lr: 0.1, weight_decay: 0.01}" ""
variant momentum "{type: momentum, lr: 0.05}" ""
variant adam "{type: adam, lr: 0.01}" ""
variant adamw "{type: adamw, lr: 0.01}" "\n  grad_dtype: bf16"
variant lamb "{type: lamb, lr: 0.01, weight_decay: 0.01}" "\n  clip_global_norm: 0.5\n  grad_dtype: bf16"
variant clip "{type: sgd, lr: 0.5}" "\n  clip_global_norm: 0.1"
for v in sgd momentum adam adamw lamb clip; do
	grep -v '^#' "$tmp/${v}_1d.yaml" | grep -q 'model' && { echo "FAIL: the one-axis variant still names model"; nfail=$((nfail + 1)); }
	for mesh in data=3,model=2 data=2,model=3 data=3,model=5; do
		check "$tmp/$v.yaml" "$mesh"
	done
	for mesh in data=3 data=5; do
		check "$tmp/${v}_1d.yaml" "$mesh"
	done
done
# bf16 params and inputs, a scalar param, bf16 gradients, clipping
cat >"$tmp/bf16.yaml" <<'YAML'
mesh: {data: 2}
inputs: {x: {shape: [6, 4], dtype: bf16, sharding: [data, null]}, t: {shape: [6, 3], dtype: bf16}}
params: {w: {shape: [4, 3], dtype: bf16, init: {normal: 0.5}}, s: {shape: [], init: ones}}
ops:
  - {out: p, op: einsum, in: [x, w], eq: "bd,dc->bc"}
  - {out: loss0, op: mse, in: [p, t]}
  - {out: l32, op: cast, in: [loss0], dtype: f32}
  - {out: loss, op: mul, in: [l32, s]}
outputs: [loss]
train: {loss: loss, optimizer: {type: adamw, lr: 0.05}, grad_dtype: bf16, clip_global_norm: 2.0}
YAML
check "$tmp/bf16.yaml" data=4
for m in examples/train_transformer.yaml examples/train_lamb.yaml; do
	for mesh in data=2,model=2 data=3,model=2 data=1,model=3; do
		check "$m" "$mesh"
	done
done

# ---- 3. bad train sections ----
for f in tests/train_bad/*.yaml; do
	expect=$(sed -n '1s/^# expect: //p' "$f")
	"$SPMD" run "$f" --backend ref >/dev/null 2>"$tmp/out"
	st=$?
	where=${expect%%: *}
	msg=${expect#*: }
	first=$(head -n 1 "$tmp/out")
	case "$first" in
	"$f:$where: error: $msg"*) [ $st -eq 2 ] || fail "$f: exit status $st, expected 2" ;;
	*) fail "$f: expected '$f:$where: error: $msg'" ;;
	esac
done

# ---- 4. usage, warnings, --save ----
"$SPMD" run examples/mlp.yaml --steps 2 >/dev/null 2>"$tmp/out"
st=$?
[ $st -eq 2 ] && grep -q 'expected a model with a train: section for --steps' "$tmp/out" ||
	fail "--steps on a model without train: exit status $st"
for bad in 0 -1 x 1000001; do
	"$SPMD" run examples/train_mlp.yaml --steps "$bad" >/dev/null 2>"$tmp/out"
	st=$?
	[ $st -eq 2 ] && grep -q 'expected a step count' "$tmp/out" || fail "--steps $bad: exit status $st"
done
cat >"$tmp/unused.yaml" <<'YAML'
inputs: {x: {shape: [4]}}
params: {w: {shape: [4]}, unused: {shape: [2, 2]}}
ops: [{out: loss, op: mse, in: [x, w]}]
outputs: [loss]
train: {loss: loss, optimizer: {type: adam, lr: 0.1}, steps: 2}
YAML
"$SPMD" run "$tmp/unused.yaml" >"$tmp/out" 2>&1
st=$?
[ $st -eq 0 ] && grep -q "unused.yaml:2:27: warning: param 'unused' does not reach the loss" "$tmp/out" &&
	grep -q '^step 2 ' "$tmp/out" || fail "a param that does not reach the loss: exit status $st"
"$SPMD" run examples/train_mlp.yaml --steps 1 --save "$tmp/saved" >"$tmp/out" 2>&1 &&
	[ -s "$tmp/saved/w1.npy" ] && [ -s "$tmp/saved/b2.npy" ] || fail "--save: the params were not written"

if [ $nfail -ne 0 ]; then
	echo "$nfail failure(s)"
	exit 1
fi
echo "train_test: ok"
