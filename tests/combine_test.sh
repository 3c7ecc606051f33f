#!/bin/sh
# combine_test.sh SPMD SOURCE_DIR: combining small collectives (partitioner/combine.c).
#
# For training steps with weight-update sharding (tests/wus/wus_mlp.yaml;
# examples/train_lamb.yaml, LAMB with clipping; examples/train_transformer.yaml,
# Adam, and with LAMB and clipping) on meshes {data: 3}, {data: 4},
# {data: 2, model: 2}, {data: 3, model: 2}:
#  1. the step with grouping (group_bytes by default) still matches the
#     unpartitioned step (`spmd run --steps 3 --check`);
#  2. its report against the same step with `group_bytes: 0`: every
#     collective of one is a collective, or a part of a combined one ("combined:
#     a, b" in its reason), of the other, of the same kind and axes; a combined
#     one moves exactly its parts' bytes; the totals sent are equal; with
#     group_bytes 0 only scalar all_reduces are combined; with grouping the
#     gradients' reduce_scatters are one per set of axes, the weights'
#     all_gathers too, and the scalar all_reduces of the global norm and
#     LAMB's trust ratios are at most one per program point and axes, not two
#     per param;
#  3. a threshold between the tensors' sizes groups only the smaller ones;
#  4. a bad group_bytes is refused at its position.
SPMD=$1
SRC=$2
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; [ -f "$T/out" ] && sed 's/^/    /' "$T/out" | tail -8; }

# variant NAME SOURCE EXTRA: the model with sharding on and EXTRA train lines.
variant() {
	sed -e '/^  weight_update_sharding:/d' -e "s/^  loss: \(.*\)\$/  loss: \1\n  weight_update_sharding: on$3/" \
		"$SRC/$2" > "$T/$1.yaml"
}
variant mlp tests/wus/wus_mlp.yaml ""
variant lamb examples/train_lamb.yaml ""
variant tr examples/train_transformer.yaml ""
sed -e 's/type: adam, lr: 0.01/type: lamb, lr: 0.01/' "$T/tr.yaml" > "$T/tr_lamb.yaml"
printf '  clip_global_norm: 1.0\n' >> "$T/tr_lamb.yaml"
sed -e 's/type: adam, lr: 0.01/type: lamb, lr: 0.01/' "$T/mlp.yaml" > "$T/mlp_lamb.yaml"
printf '  clip_global_norm: 0.5\n  grad_dtype: bf16\n' >> "$T/mlp_lamb.yaml"
sed 's/^  weight_update_sharding: on/  weight_update_sharding: off/' "$T/lamb.yaml" > "$T/lamb_dp.yaml"
sed 's/^  weight_update_sharding: on/  weight_update_sharding: off/' "$T/tr_lamb.yaml" > "$T/tr_lamb_dp.yaml"
cat > "$T/check.py" <<'PY'
import json, math, sys
on, off = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
lamb = "lamb" in sys.argv[3]

def parts(c):
    r = c["reason"]
    if not r.startswith("combined: "):
        return None
    return r[len("combined: "):r.index(" (")].split(", ")

def numel(name, j):
    v = j["values"].get(name)
    return None if v is None else math.prod(v["local_shape"])

def expand(j):  # (op, axes, part) for every collective and every part
    out = []
    for i, c in enumerate(j["collectives"]):
        for p in parts(c) or [c["value"]]:
            out.append((c["op"], tuple(c["axes"]), p, i))
    return out

eon, eoff = expand(on), expand(off)
op_of = {x[2]: x[3] for x in eon}  # part -> the collective holding it
# every collective is accounted for, as itself or as a part
assert sorted(x[:3] for x in eon) == sorted(x[:3] for x in eoff), "the collectives differ"
# group_bytes 0: only scalar all_reduces are combined
for c in off["collectives"]:
    if parts(c):
        assert c["op"] == "all_reduce", c
        assert all(numel(p, off) == 1 for p in parts(c)), ("not a scalar", c)
# bytes: a combined collective moves its parts' bytes; totals unchanged
part_bytes = {}
for c in off["collectives"]:
    ps = parts(c) or [c["value"]]
    for p in ps:
        part_bytes[p] = c["bytes_per_device"] / len(ps)  # scalars: equal parts
for c in on["collectives"]:
    if parts(c):
        assert len(parts(c)) >= 2, c
        assert abs(c["bytes_per_device"] - sum(part_bytes[p] for p in parts(c))) < 1e-9, c
assert on["total_bytes_per_device"] == off["total_bytes_per_device"]
# bytes sent are whole bytes per collective: rounding differs by < 1 byte each
k = "total_bytes_sent_per_device"
assert abs(on[k] - off[k]) <= len(off["collectives"]), (k, on[k], off[k])
# data parallel (no weight-update sharding): the gradients' all_reduces,
# one per set of axes
grads = [x for x in eoff if x[0] == "all_reduce" and x[2].startswith("d%")]
for axes in {x[1] for x in grads}:
    holders = {op_of[x[2]] for x in grads if x[1] == axes}
    assert len(holders) == 1, ("gradient all_reduces over", axes, "in", len(holders), "collectives")
# one reduce_scatter per set of axes; the weights' all_gathers likewise
rs_axes = {x[1] for x in eoff if x[0] == "reduce_scatter"}
assert len([c for c in on["collectives"] if c["op"] == "reduce_scatter"]) == len(rs_axes), "reduce_scatters not grouped"
sharded = [w["param"] for w in on["weight_update_sharding"] if w["sharded"]]
weight_gathers = [c for c in off["collectives"] if c["op"] == "all_gather" and
                  any(c["reason"].startswith(p + "%next ") for p in sharded)]
for axes in {tuple(c["axes"]) for c in weight_gathers}:
    holders = {op_of[c["value"]] for c in weight_gathers if tuple(c["axes"]) == axes}
    assert len(holders) == 1, ("weight all_gathers over", axes, "in", len(holders), "collectives")
# scalar all_reduces, grouping or not: at most one per program point (the
# global norm, the trust ratios) and set of axes
for j, e in ((on, eon), (off, eoff)):
    scalars = [x for x in e if x[0] == "all_reduce" and numel(x[2], j) == 1]
    ops = {x[3] for x in scalars}
    axes = {x[1] for x in scalars}
    assert len(ops) <= 2 * len(axes), ("scalar all_reduces", len(ops), "over", len(axes), "sets of axes")
    if lamb and sharded:
        # a trust ratio's update norm per sharded param, and the global norm:
        # its per-param sums of squares meet pending and are reduced once
        assert len(scalars) >= len(sharded) + 1, ("LAMB with clipping: too few scalar reductions", len(scalars))
        assert len(ops) < len(scalars), "no scalar all_reduces fused"
print(len(on["collectives"]), "collectives instead of", len(eoff))
PY

for m in mlp lamb tr tr_lamb mlp_lamb lamb_dp tr_lamb_dp; do
	cp "$T/$m.yaml" "$T/${m}_0.yaml"
	printf '  group_bytes: 0\n' >> "$T/${m}_0.yaml"
	for mesh in data=3,model=1 data=4,model=1 data=2,model=2 data=3,model=2; do
		# 1. exact
		if "$SPMD" run "$T/$m.yaml" --steps 3 --check --mesh $mesh > "$T/out" 2>&1 &&
			grep -q '^check loss .* ok$' "$T/out"; then ok; else bad "$m on $mesh: run --check"; fi
		# 2. the report against group_bytes 0
		"$SPMD" partition "$T/$m.yaml" --mesh $mesh --json > "$T/on.json" 2> "$T/out" &&
			"$SPMD" partition "$T/${m}_0.yaml" --mesh $mesh --json > "$T/off.json" 2>> "$T/out" ||
			{ bad "$m on $mesh: partition --json"; continue; }
		if $PY "$T/check.py" "$T/on.json" "$T/off.json" "$m" > "$T/out" 2>&1
		then ok; else bad "$m on $mesh: report"; fi
	done
done

# 3. a threshold between the sizes: on {data: 4}, wus_mlp's buffers are
# 1920 (w1), 160 (b1), 1600 (w2) and 48 (b2) bytes.
sed 's/^  weight_update_sharding: on/&\n  group_bytes: 1000/' "$T/mlp.yaml" > "$T/mlp_t.yaml"
if "$SPMD" run "$T/mlp_t.yaml" --steps 3 --check --mesh data=4,model=1 > "$T/out" 2>&1; then ok
else bad "threshold: run --check"; fi
"$SPMD" partition "$T/mlp_t.yaml" --mesh data=4,model=1 --json > "$T/t.json" 2> "$T/out"
"$SPMD" partition "$T/mlp_0.yaml" --mesh data=4,model=1 --json > "$T/off.json" 2>> "$T/out"
if $PY - "$T/t.json" "$T/off.json" > "$T/out" 2>&1 <<'PY'
import json, sys
on, off = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
def parts(c):
    r = c["reason"]
    return r[len("combined: "):r.index(" (")].split(", ") if r.startswith("combined: ") else None
# a device's buffer: the larger of operand and result (an all_gather's result is 4x)
buf = {c["value"]: c["bytes_per_device"] * (4 if c["op"] == "all_gather" else 1) for c in off["collectives"]}
combined = [p for c in on["collectives"] if parts(c) for p in parts(c)]
alone = [c["value"] for c in on["collectives"] if not parts(c) and c["op"] != "all_reduce"]
assert combined and all(buf[p] < 1000 for p in combined), [(p, buf[p]) for p in combined]
big = [v for v, b in buf.items() if b >= 1000]
assert big and all(v in alone for v in big), (big, alone)
PY
then ok; else bad "threshold 1000"; fi

# 4. bad values
for v in -1 abc 2000000000000; do
	sed "s/^  weight_update_sharding: on/&\n  group_bytes: $v/" "$T/mlp.yaml" > "$T/bad.yaml"
	"$SPMD" partition "$T/bad.yaml" > "$T/out" 2>&1
	st=$?
	if [ $st -eq 2 ] && grep -q "bad.yaml:[0-9]*:[0-9]*: error: expected" "$T/out"; then ok
	else bad "group_bytes: $v: exit status $st"; fi
done

echo "combine_test: $pass passed, $fail failed"
[ $fail -eq 0 ]
