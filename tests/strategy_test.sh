#!/bin/sh
# strategy_test.sh SPMD SOURCE_DIR: logical axis names (axis_rules:,
# --axis-rules) — one model file on several meshes, checked against the
# reference; the same shardings as mesh-axis annotations; the errors.
# Priorities: strategies applied in order reach the hand-written Megatron
# layout, and --explain names the round that decided a dim.  Sharding
# groups: their errors.  Training: the forward pass propagates first, and
# weight-update sharding keeps its layout.  (tests/shardy_test.sh has the
# propagation cases.)
SPMD=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; sed 's/^/    /' "$T/out" | tail -5; }
M="$SRC/examples/transformer_block.yaml"

# 1. One file, several meshes (axes the mesh lacks are unsplit), threads and reference agree.
for mesh in "" "--mesh data=8" "--mesh data=2,model=4" "--mesh model=4" "--mesh data=3,model=2"; do
	if "$SPMD" run "$M" --check $mesh > "$T/out" 2>&1; then ok; else bad "run --check $mesh"; fi
done

# 2. The mesh lacks `model`: a warning names each logical axis mapped to it.
"$SPMD" propagate "$M" --mesh data=8 > "$T/prop" 2> "$T/out"
if grep -q "warning: logical axis 'heads' maps to mesh axis 'model', which mesh data=8 does not have" "$T/out" &&
   grep -q "warning: logical axis 'mlp' maps to mesh axis 'model'" "$T/out"; then ok; else bad "warnings on data=8"; fi

# 3. spmd propagate prints what each logical name resolved to.
"$SPMD" propagate "$M" > "$T/out" 2>&1
if grep -q "^logical heads *-> \[model\]" "$T/out" && grep -q "^logical embed *-> not split" "$T/out"; then ok
else bad "propagate prints the rules"; fi

# 4. Logical names give exactly the shardings of the mesh-axis annotations.
# name and sharding of each line (the sharding is the bracketed text after the name)
shardings() { sed -n -E 's/^([^ ]+) +([[{][^a-z]*([a-z_]+[],]* *[^a-z]*)*[]}]).*/\1 \2/p' | sed -E 's/ +(annotated|from).*//'; }
"$SPMD" propagate "$M" 2>/dev/null | grep -v '^logical\|^$' | shardings > "$T/a"
"$SPMD" propagate "$SRC/tests/strategy/transformer_block_axes.yaml" | shardings > "$T/b"
if cmp -s "$T/a" "$T/b" && [ -s "$T/a" ]; then ok; else diff "$T/a" "$T/b" > "$T/out"; bad "logical = mesh axes"; fi

# 5. --axis-rules replaces the model's rules: heads over both axes, no batch split.
R="$SRC/tests/strategy/rules_2d.yaml"
if "$SPMD" run "$M" --check --axis-rules "$R" > "$T/out" 2>&1; then ok; else bad "run --axis-rules"; fi
"$SPMD" propagate "$M" --axis-rules "$R" > "$T/out" 2>&1
if grep -q "^wq .*\[null, \[data, model\], null\]" "$T/out" && grep -q "^logical batch *-> not split" "$T/out"; then ok
else bad "propagate --axis-rules"; fi
for cmd in check partition "cost --hardware tpu-v4"; do
	if "$SPMD" $cmd "$M" --axis-rules "$R" > "$T/out" 2>&1; then ok; else bad "$cmd --axis-rules"; fi
done

# 6. Errors: a missing rules file, a file without axis_rules, exit 2 with a place.
"$SPMD" check "$M" --axis-rules "$T/none.yaml" > "$T/out" 2>&1
st=$?
if [ $st = 2 ] && grep -q "none.yaml" "$T/out"; then ok; else bad "missing --axis-rules file (exit $st)"; fi
printf 'rules: {batch: data}\n' > "$T/norules.yaml"
"$SPMD" check "$M" --axis-rules "$T/norules.yaml" > "$T/out" 2>&1
st=$?
if [ $st = 2 ] && grep -q "norules.yaml:1:1: error: expected a mapping with key 'axis_rules'" "$T/out"; then ok
else bad "rules file without axis_rules (exit $st)"; fi
# a mesh-axis annotation on a mesh without that axis is an error at the annotation
"$SPMD" check "$SRC/tests/strategy/transformer_block_axes.yaml" --mesh data=8 > "$T/out" 2>&1
st=$?
if [ $st = 2 ] && grep -q "transformer_block_axes.yaml:[0-9]*:[0-9]*: error: expected a mesh axis (one of data), found 'model'" "$T/out"
then ok; else bad "mesh axis missing from --mesh (exit $st)"; fi

# 7. Priorities: batch parallelism (priority 0) then tensor parallelism
# (priority 1) give exactly the hand-annotated Megatron layout; both run.
P="$SRC/tests/strategy/megatron_priority.yaml" H="$SRC/tests/strategy/megatron_hand.yaml"
"$SPMD" propagate "$P" | shardings > "$T/a"
"$SPMD" propagate "$H" | shardings > "$T/b"
if cmp -s "$T/a" "$T/b" && [ "$(wc -l < "$T/a")" -gt 30 ]; then ok; else diff "$T/a" "$T/b" > "$T/out"; bad "priority = hand Megatron"; fi
for m in "$P" "$H"; do
	if "$SPMD" run "$m" --check > "$T/out" 2>&1; then ok; else bad "run --check $m"; fi
done
"$SPMD" propagate "$P" --explain f1 > "$T/out" 2>&1
if grep -q "^f1 .*\[data, null, model\]" "$T/out" && grep -q "^  decided at dim 0: priority 0, dim 2: priority 1$" "$T/out" &&
   grep -A1 -E "^(w1|b1) " "$T/out" | grep -q "^  decided at dim [01]: priority 1$"; then ok; else bad "--explain names the priority"; fi
# without priorities --explain prints no priority lines
"$SPMD" propagate "$H" --explain f1 > "$T/out" 2>&1
if ! grep -q "priority" "$T/out"; then ok; else bad "no priority lines without priorities"; fi
# on another mesh
if "$SPMD" run "$P" --check --mesh data=4,model=2 > "$T/out" 2>&1; then ok; else bad "run --check data=4,model=2"; fi
# training (a second propagation after weight-update sharding): the layout of
# examples/train_mlp.yaml, whose ops are annotated, from priorities alone
TP="$SRC/tests/strategy/train_priority.yaml"
"$SPMD" propagate "$TP" | shardings > "$T/a"
"$SPMD" propagate "$SRC/examples/train_mlp.yaml" | shardings > "$T/b"
if cmp -s "$T/a" "$T/b" && [ -s "$T/a" ]; then ok; else diff "$T/a" "$T/b" > "$T/out"; bad "training with priorities"; fi
if "$SPMD" run "$TP" --check > "$T/out" 2>&1; then ok; else bad "run --check $TP"; fi
# a training step propagates its forward pass first: an elementwise op of the
# model follows its operand, not its gradient; weight-update sharding
# changes the update, not that layout
W="$SRC/tests/strategy/train_sp_wus.yaml"
sed 's/^  weight_update_sharding: on/  weight_update_sharding: off/' "$W" > "$T/off.yaml"
"$SPMD" propagate "$W" | shardings | grep '^l0\.\|^nf\|^hf\|^x ' | grep -v '^l0\.[a-z0-9_]*%' > "$T/a"
"$SPMD" propagate "$T/off.yaml" | shardings | grep '^l0\.\|^nf\|^hf\|^x ' | grep -v '^l0\.[a-z0-9_]*%' > "$T/b"
if grep -q '^l0.g \[data, null, model\]$' "$T/a" && cmp -s "$T/a" "$T/b"; then ok
else { diff "$T/a" "$T/b"; grep '^l0.g ' "$T/a"; } > "$T/out"; bad "forward layout of a training step"; fi
if "$SPMD" run "$W" --check --steps 2 > "$T/out" 2>&1; then ok; else bad "run --check $W"; fi

# 8. Sharding-group errors, at the annotation, exit 2: shapes, two
# annotations, two priorities.
for f in "$SRC"/tests/strategy/bad_shard_as_*.yaml; do
	want=$(sed -n '1s/^# error at //p' "$f")
	"$SPMD" propagate "$f" > "$T/out" 2>&1
	st=$?
	line="$(basename "$f"):${want%%: *}: error: ${want#*: }"
	if [ $st = 2 ] && head -1 "$T/out" | grep -qF "$line"; then ok; else bad "$(basename "$f") (exit $st)"; fi
done

echo "strategy_test: $pass passed, $fail failed"
[ $fail = 0 ]
