#!/bin/sh
# partition_test.sh: the partitioner end to end — every model checked against the reference on many meshes, pinned collectives, conflicting annotations.
# usage: sh partition_test.sh SPMD_BINARY SOURCE_DIR
#
# 1. Every example, every tests/models/*.yaml and every tests/mesh_models/*.yaml
#    runs partitioned on threads with --check (outputs compared with the
#    unpartitioned reference) on a list of meshes that fit its axes: one
#    device, 2, 3 (dims that do not divide), 4, 2x2, 3x2, 2x3, 1xN, Nx1 and
#    3-axis meshes for 3-axis models; on the one-device meshes the program
#    has no collectives at all.
# 2. The collectives of the tests/models/part_*.yaml models are pinned through
#    `spmd partition --json` (and the text listing for max/sum).
# 3. Annotations that cannot hold together: a warning naming both positions
#    and the cost (or an error naming both, exit 2); partial shardings no op
#    can produce (tests/models/part_bad_*.yaml): an error, exit 2.
SPMD=${1:?usage: partition_test.sh SPMD SOURCE_DIR}
SRC=${2:?usage: partition_test.sh SPMD SOURCE_DIR}
. "$SRC/tests/script_setup.sh"
passed=0 failed=0

pass() { passed=$((passed + 1)); }
fail() {
	echo "FAIL: $*"
	failed=$((failed + 1))
}

# show FILE...: the first lines of a failure's output, indented.
show() { cat "$@" | grep -v ' ok$' | head -8 | sed 's/^/    /'; }

# ---- 1. every model, every mesh that fits it, with --check ----

# mesh_axes MODEL: the model's mesh axis names, comma-separated; "" if it
# has no mesh, "?" if its mesh is not in the short flow form {a: N, b: M}.
mesh_axes() {
	grep -q '^mesh:' "$1" || return
	axes=$(sed -n 's/^mesh: *{\([^}:]*: *[0-9][0-9]*\(, *[^}:]*: *[0-9][0-9]*\)*\)}.*/\1/p' "$1" |
		sed 's/: *[0-9][0-9]*//g; s/ //g')
	echo "${axes:-?}"
}

# meshes AXES: the --mesh values tried for a model with those axes ("-": its own mesh).
meshes() {
	case $1 in
	"") echo "- data=1 data=2 data=3 data=2,model=2" ;;
	"?" | *,*,*,*) echo "-" ;;
	*,*,*)
		a=${1%%,*} rest=${1#*,}
		b=${rest%%,*} c=${rest#*,}
		echo "- $a=1,$b=1,$c=1 $a=2,$b=2,$c=2 $a=3,$b=2,$c=1 $a=1,$b=3,$c=2 $a=2,$b=1,$c=3 $a=1,$b=1,$c=4 $a=3,$b=3,$c=3"
		;;
	*,*)
		a=${1%,*} b=${1#*,}
		echo "- $a=1,$b=1 $a=2,$b=1 $a=1,$b=2 $a=3,$b=1 $a=1,$b=3 $a=2,$b=2 $a=3,$b=2 $a=2,$b=3 $a=1,$b=4 $a=4,$b=1 $a=3,$b=3"
		;;
	*) echo "- $1=1 $1=2 $1=3 $1=4" ;;
	esac
}

# sample MESHES...: the sanitizer build's share (SPMD_SANITIZED=1) of a mesh
# list: the model's own mesh, one device, and the first two uneven splits;
# the release build tries them all.
sample() {
	[ "${SPMD_SANITIZED:-0}" = 1 ] || { echo "$@"; return; }
	uneven=0 out=""
	for m in "$@"; do
		if [ "$m" = - ] || ! echo "$m" | grep -q '=[02-9]'; then
			out="$out $m"
		elif echo "$m" | grep -q '=3' && [ $uneven -lt 2 ]; then
			out="$out $m" uneven=$((uneven + 1))
		fi
	done
	echo "$out"
}

# run_check MODEL MESH: spmd run on threads with --check; MESH "-" keeps the model's.
run_check() {
	model=$1 mesh=$2
	if [ "$mesh" = - ]; then set --; else set -- --mesh "$mesh"; fi
	"$SPMD" run "$model" --check --backend threads --seed 7 "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" = 0 ]; then
		pass
	else
		fail "run --check ${model#"$SRC"/} on mesh $mesh: exit status $rc"
		show "$tmp/out" "$tmp/err"
	fi
}

# no_collectives MODEL MESH: on a mesh of one device nothing is communicated.
no_collectives() {
	if "$SPMD" partition "$1" --json --mesh "$2" >"$tmp/json" 2>"$tmp/err" &&
		"$PY" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["collectives"] != [])' "$tmp/json"; then
		pass
	else
		fail "partition ${1#"$SRC"/} on mesh $2: expected no collectives on one device"
		show "$tmp/err"
	fi
}

for model in "$SRC"/examples/*.yaml "$SRC"/tests/models/*.yaml "$SRC"/tests/mesh_models/*.yaml; do
	[ -f "$model" ] || continue
	case $model in */part_bad_*) continue ;; esac # errors: section 3
	case $model in
	*/examples/mlp.yaml) list="- data=1,model=1 data=3,model=2 data=1,model=3 data=3,model=3" ;; # the largest: fewer meshes
	*/examples/train_pipeline.yaml) list="- stage=4,data=1 stage=4,data=3" ;; # its stages need 4 on the stage axis
	*) list=$(meshes "$(mesh_axes "$model")") ;;
	esac
	for mesh in $(sample $list); do
		run_check "$model" "$mesh"
		case $mesh in
		*=[02-9]* | -) ;;
		*) no_collectives "$model" "$mesh" ;;
		esac
	done
done

# ---- 2. pinned collectives ----

# pin NAME MODEL MESH PY_ASSERTS: `spmd partition --json` (and the text
# listing) of MODEL (a path under SOURCE_DIR) on MESH ("-": its own); the Python expressions in
# PY_ASSERTS, one per line, see the report as j, its collectives as colls,
# their op names as ops, the values as vals, and from the listing the
# collectives as (op, [axes], reduce) triples in program order as listing.
# Every collective must give its reason.
pin() {
	name=$1 rel=$2 mesh=$3 asserts=$4
	model=$SRC/$rel
	if [ "$mesh" = - ]; then set --; else set -- --mesh "$mesh"; fi
	if ! "$SPMD" partition "$model" --json "$@" >"$tmp/json" 2>"$tmp/err" ||
		! "$SPMD" partition "$model" "$@" >"$tmp/listing" 2>>"$tmp/err"; then
		fail "$name: spmd partition failed"
		show "$tmp/err"
		return
	fi
	printf '%s\n' "$asserts" >"$tmp/asserts"
	if "$PY" - "$tmp/json" "$tmp/listing" "$tmp/asserts" >"$tmp/pyout" 2>&1 <<'EOF'; then pass; else
import json, re, sys
j = json.load(open(sys.argv[1]))
colls = j["collectives"]
ops = [c["op"] for c in colls]
vals = j["values"]
listing = []
for line in open(sys.argv[2]):
    m = re.match(r"\s+\S+\s+= (all_reduce|reduce_scatter|all_gather|all_to_all|collective_permute) \[([^\]]*)\]( max| sum)?", line)
    if m:
        listing.append((m.group(1), m.group(2).split(", "), (m.group(3) or "").strip()))
def local_bytes(name, size=4):
    n = size
    for d in vals[name]["local_shape"]:
        n *= d
    return n
assert [l[0] for l in listing] == ops, (listing, ops)
for c in colls:
    assert c["reason"].strip(), "collective without a reason: %r" % c
assert j["total_bytes_per_device"] == sum(c["bytes_per_device"] for c in colls)
assert j["total_bytes_sent_per_device"] == sum(c["bytes_sent_per_device"] for c in colls)
for line in open(sys.argv[3]):
    if line.strip():
        assert eval(line), "%s\n    collectives: %s" % (line.strip(), [(c["op"], c["axes"], c["value"], c["bytes_per_device"]) for c in colls])
EOF
		fail "$name ($rel on mesh $mesh): $(tail -n 3 "$tmp/pyout")"
	fi
}

# Megatron MLP: one all_reduce over model, of y's local size, and nothing else.
MEGATRON='ops == ["all_reduce"]
colls[0]["axes"] == ["model"]
colls[0]["value"] == "y"
colls[0]["bytes_per_device"] == local_bytes("y")
vals["y"]["partial"] == [] and vals["y"]["sharding"] in (["data", None], [None, None])'
for m in - data=3,model=2 data=2,model=3 data=1,model=4; do
	pin megatron tests/models/part_megatron.yaml $m "$MEGATRON"
done
pin megatron_example examples/mlp.yaml - "$MEGATRON"
pin megatron_example examples/mlp.yaml data=3,model=3 "$MEGATRON"
pin megatron_3axis tests/mesh_models/mlp_3axis.yaml - 'ops == ["all_reduce"]
colls[0]["axes"] == ["model", "pipe"]
colls[0]["bytes_per_device"] == local_bytes("y")'

# Pure data parallelism: no collective in the forward pass, even unevenly split.
for m in - data=3 data=4; do
	pin data_parallel tests/models/part_data_parallel.yaml $m 'ops == []
vals["y"]["sharding"] == ["data", None]
vals["w1"]["sharding"] == [None, None]'
done

# Attention, heads over model: one all_reduce, after the output projection.
for m in - data=1,model=4 data=2,model=3; do
	pin attention tests/models/part_attention.yaml $m 'ops == ["all_reduce"]
colls[0]["axes"] == ["model"]
colls[0]["value"] == "attn"
colls[0]["bytes_per_device"] == local_bytes("attn")'
done

# Heads from a reshape of a split dim: the split goes on through sub-axes
# (model:(1)2 on the heads, the rest of model on e), nothing is gathered:
# one all_reduce of the scores over the sub-axis on e, one of the output.
pin head_split tests/models/part_head_split.yaml - 'ops == ["all_reduce", "all_reduce"]
[c["axes"] for c in colls] == [["model:(2)2"], ["model"]]
[c["value"] for c in colls] == ["scores", "attn"]
vals["qh"]["sharding"] == ["data", None, "model:(1)2", "model:(2)2"]
vals["merged"]["sharding"] == ["data", None, "model"]
listing[0] == ("all_reduce", ["model:(2)2"], "sum")'
pin head_split_2x8 tests/models/part_head_split.yaml data=2,model=8 'ops == ["all_reduce", "all_reduce"]
[c["axes"] for c in colls] == [["model:(2)4"], ["model"]]
vals["ctx"]["sharding"] == ["data", None, "model:(1)2", "model:(2)4"]
colls[0]["bytes_per_device"] == local_bytes("scores")'
# model = 3 has no part that divides the 2 heads: no sub-axis, the
# reshape's split is dropped (the projections are gathered), as before.
pin head_split_odd tests/models/part_head_split.yaml data=1,model=3 'all("model:" not in a for c in colls for a in c["axes"])
vals["qh"]["sharding"] == [None, None, None, None]'

# A contraction over a split dim, result wanted split: one reduce_scatter.
for m in - model=4; do
	pin reduce_scatter tests/models/part_reduce_scatter.yaml $m 'ops == ["reduce_scatter"]
colls[0]["axes"] == ["model"]
colls[0]["value"] == "y"
vals["y"]["sharding"] == ["model", None]
"all_reduce" not in ops and "all_gather" not in ops'
done

# conv2d with H split, same padding, stride 1: halo exchange only.
for m in - data=2,model=2; do
	pin conv_halo tests/models/part_conv_halo.yaml $m 'len(ops) >= 1
set(ops) == {"collective_permute"}
all(c["axes"] == ["model"] for c in colls)
vals["c1"]["sharding"][1] == "model" and vals["c2"]["sharding"][1] == "model"'
done

# A split over an axis of size 1 is no split: no halo exchange.
pin conv_halo_size1 tests/models/part_conv_halo_size1.yaml - 'ops == []'

# softmax, log_softmax along a split axis: all_reduce of the max, then of the sum.
for model in part_softmax_split.yaml part_log_softmax_split.yaml; do
	pin norm_split "tests/models/$model" - 'set(ops) == {"all_reduce"}
all(c["axes"] == ["model"] for c in colls)
[l[2] for l in listing] == ["max", "sum"]'
done
# layer_norm along a split axis: only all_reduces (sums) over model.
pin layer_norm_split tests/models/part_layer_norm_split.yaml - 'len(ops) >= 1 and set(ops) == {"all_reduce"}
all(c["axes"] == ["model"] for c in colls)
all(l[2] == "sum" for l in listing)'

# A result wanted split on another dim than propagation chose: one all_to_all.
for m in - data=3; do
	pin all_to_all tests/models/part_all_to_all.yaml $m 'ops == ["all_to_all"]
colls[0]["axes"] == ["data"]
vals["h"]["sharding"] == ["data", None]
vals["y"]["sharding"] == [None, "data"]'
done

# A vocab-parallel embedding's gradient is summed into the rows each device
# holds (take_grad_shard): 17 of the 50 rows on model=3, and no collective
# moves the whole table (50 x 8 f32).
for m in data=2,model=3 data=1,model=3; do
	pin vocab_grad tests/models/part_vocab_grad.yaml $m 'vals["d%embed"]["local_shape"] == [17, 8]
vals["d%embed"]["sharding"] == ["model", None]
all(c["bytes_per_device"] < 50 * 8 * 4 for c in colls)'
done

# A vocabulary-parallel loss: the classes stay split on model, the loss
# from two all_reduces over model, the max (one value a position), then
# the sum of exponentials and the labels' logits (two a position, made by
# softmax_cross_entropy_stats_shard), and one 4-byte sum over data; the
# logits are never gathered.  Trained (its gradient split the same way):
# no all_gather or all_to_all at all, and nothing moves a whole row of
# logits.
for m in - data=1,model=3 data=2,model=2; do
	pin vocab_loss tests/models/part_loss_vocab.yaml $m 'sorted(ops) == ["all_reduce"] * len(ops)
sum(1 for c in colls if c["axes"] == ["model"]) == 2
sum(c["bytes_per_device"] for c in colls if c["axes"] == ["model"]) * vals["x"]["local_shape"][-1] == 3 * local_bytes("x")'
	pin vocab_loss_grad tests/models/part_vocab_loss_grad.yaml $m '"all_gather" not in ops and "all_to_all" not in ops
vals["unembed"]["sharding"] == [None, "model"]'
done
# The same with the batch split over model too: the loss's gradient stays
# split on the classes (softmax_cross_entropy_grad), no all_to_all, and
# no collective as large as the logits (8 x 5 x 13 f32): the labels and
# the activations the logits' einsum reads are gathered, not the logits or
# their gradient.
for m in - model=3; do
	pin vocab_loss_batch tests/models/part_vocab_loss_batch.yaml $m '"all_to_all" not in ops
vals["%g12"]["sharding"] == [None, None, "model"]
all(c["bytes_per_device"] < 8 * 5 * 13 * 4 for c in colls)'
done

# one_hot split on its classes keeps one_hot's own semantics for ids
# outside [0, depth) (a row of zeros), as the reference does: ids all 99
# and all -1, and all 11 (in the padding of the last block of classes: 10
# over 4 is 3, 3, 3 and 1 of 3), checked on a mesh that splits the classes
# unevenly.
for v in 99 -1 11; do
	"$PY" -c "
import struct, sys
h = \"{'descr': '<i4', 'fortran_order': False, 'shape': (6, 5), }\"
h += ' ' * ((64 - (11 + len(h)) % 64) % 64) + '\\n'
open(sys.argv[1], 'wb').write(b'\\x93NUMPY\\x01\\x00' + struct.pack('<H', len(h)) + h.encode() + struct.pack('<30i', *[int(sys.argv[2])] * 30))
" "$tmp/ids.npy" "$v"
	if "$SPMD" run "$SRC/tests/models/part_one_hot_split.yaml" --mesh data=2,model=4 --input ids="$tmp/ids.npy" --check \
		>"$tmp/out" 2>&1 && [ "$(grep -c ' ok$' "$tmp/out")" = 2 ]; then pass; else
		fail "one_hot split, ids $v: $(tail -n 2 "$tmp/out")"
	fi
done

# ---- 3. annotations that cannot hold together ----

# conflict NAME MODEL LINE1 LINE2: `spmd partition` either resolves the
# conflict with a reshard and warns (exit 0, a warning on stderr naming both
# annotations' lines and what the reshard costs in bytes), or refuses it
# (exit 2, an error naming both).  Both lines are those of the annotations.
# These pin the behaviour the issue asks for: a conflict spmd resolves
# silently (no warning) fails here.
conflict() {
	name=$1 model=tests/models/$2 l1=$3 l2=$4
	"$SPMD" partition "$SRC/$model" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	file=$(basename "$model")
	if [ "$rc" = 0 ]; then
		grep -q 'warning' "$tmp/err" &&
			grep -q "$file:$l1:" "$tmp/err" && grep -q "$file:$l2:" "$tmp/err" &&
			grep -q '[0-9] bytes' "$tmp/err"
	elif [ "$rc" = 2 ]; then
		grep -q 'error' "$tmp/err" && grep -q "$file:$l1:" "$tmp/err" && grep -q "$file:$l2:" "$tmp/err"
	else
		false
	fi
	if [ $? = 0 ]; then
		pass
	else
		fail "$name: expected a warning naming $file:$l1 and $file:$l2 and the cost in bytes (or an error, exit 2), found exit $rc, stderr: $(head -c 300 "$tmp/err")"
	fi
}

conflict conflict_transpose part_conflict_transpose.yaml 8 10
conflict conflict_binary part_conflict_binary.yaml 7 8
conflict conflict_einsum part_conflict_einsum.yaml 8 10
conflict conflict_reshape part_conflict_reshape.yaml 8 10

# A gather point (sequence parallelism written by hand or by autoshard):
# the result annotated whole after a stream split on its sequence dim, the
# norm's bias annotated whole.  The bias moves nothing, so the all_gather
# is the plan, not a conflict: no warning (one per layer used to blame the
# bias), and the gather is there.
"$SPMD" partition "$SRC/tests/models/part_gather_point.yaml" >"$tmp/out" 2>"$tmp/err"
if [ $? = 0 ] && [ ! -s "$tmp/err" ] && grep -q '= all_gather \[data\] dim 1' "$tmp/out"; then
	pass
else
	fail "gather_point: expected an all_gather over data on dim 1 and no warning, found stderr: $(head -c 300 "$tmp/err")"
fi

# Two factors asking one tensor for one axis: the winner by the conflict
# rule keeps it (sequence parallelism: a keeps model on its hidden dim).
for m in - data=1,model=3; do
	pin factor_clash tests/models/part_sequence_parallel.yaml $m 'ops == ["all_gather", "reduce_scatter"]
vals["a"]["sharding"][1:] == [None, "model"]'
done

# A partial annotation on an op result is kept: y stays a pending sum over
# model (the all_reduce goes to z's relu), and the run still matches.
pin partial_annotation tests/models/part_partial_annotation.yaml - 'vals["y"]["partial"] == ["model"]
vals["z"]["partial"] == []
ops == ["all_reduce"] and colls[0]["axes"] == ["model"]'

# bad NAME MODEL LINE:COL: a sharding no op can produce is an error at the
# annotation, exit status 2, from propagate, partition and run, with nothing
# on stdout.
bad() {
	name=$1 model=tests/models/$2 at=$3
	for cmd in propagate partition run; do
		"$SPMD" $cmd "$SRC/$model" >"$tmp/out" 2>"$tmp/err"
		rc=$?
		if [ "$rc" = 2 ] && grep -q "$(basename "$model"):$at: error: expected" "$tmp/err" && [ ! -s "$tmp/out" ]; then
			pass
		else
			fail "$name ($cmd): expected exit 2 and '$(basename "$model"):$at: error: expected ...', found exit $rc, stderr: $(head -c 300 "$tmp/err")"
		fi
	done
}

bad partial_input part_bad_partial_input.yaml 7:32
bad partial_relu part_bad_partial_relu.yaml 9:43
bad partial_max part_bad_partial_max.yaml 11:65
bad partial_sum part_bad_partial_sum.yaml 9:60

echo "partition_test: $passed passed, $failed failed"
[ "$failed" = 0 ]
