#!/bin/sh
# cost_test.sh: `spmd cost`, `spmd calibrate` and `spmd explore` end to end — JSON fields, exit codes, errors.
# usage: sh cost_test.sh SPMD_BINARY SOURCE_DIR
SPMD=${1:?usage: cost_test.sh SPMD SOURCE_DIR}
SRC=${2:?usage: cost_test.sh SPMD SOURCE_DIR}
. "$SRC/tests/script_setup.sh"
fails=0 passes=0

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}
pass() { passes=$((passes + 1)); }

# json NAME PY_ASSERTS ARGS...: `spmd ARGS` exits 0 and its stdout is JSON
# for which every Python expression in PY_ASSERTS (one a line) holds, with j
# the parsed output.
json() {
	name=$1 asserts=$2
	shift 2
	"$SPMD" "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ "$rc" = 0 ] || { fail "$name: exit status $rc"; cat "$tmp/err"; return; }
	printf '%s\n' "$asserts" >"$tmp/asserts"
	if "$PY" - "$tmp/out" "$tmp/asserts" <<'EOF'; then pass; else fail "$name: $(head -c 2000 "$tmp/out")"; fi
import json, sys
j = json.load(open(sys.argv[1]))
for line in open(sys.argv[2]):
    if line.strip():
        assert eval(line), line.strip()
EOF
}

# error NAME STATUS PATTERN ARGS...: exit status STATUS and PATTERN on stderr.
error() {
	name=$1 want=$2 pat=$3
	shift 3
	"$SPMD" "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ "$rc" = "$want" ] || { fail "$name: exit status $rc, expected $want"; cat "$tmp/err"; return; }
	if grep -q -- "$pat" "$tmp/err"; then pass; else fail "$name: expected '$pat' on stderr, found: $(cat "$tmp/err")"; fi
}

common='isinstance(j["step_time_s"], float) and j["step_time_s"] > 0
j["step_time_overlapped_s"] <= j["step_time_s"] * (1 + 1e-9)
abs(j["compute_s"] + j["communication_s"] - j["step_time_s"]) <= 1e-9 * j["step_time_s"]
abs(sum(k["seconds"] for k in j["by_op_kind"]) - j["step_time_s"]) <= 1e-9 * j["step_time_s"]
j["memory"]["peak_bytes"] >= j["memory"]["params_bytes"] + j["memory"]["inputs_bytes"]
j["memory"]["fits"] == (j["memory"]["peak_bytes"] <= j["memory"]["capacity_bytes"])
j["first_step_time_s"] <= j["step_time_s"] * (1 + 1e-9)
[p["phase"] for p in j["phases"]] == ["forward", "backward", "gradient sync", "weight update", "weight gather"]
abs(sum(p["serial_s"] for p in j["phases"]) - j["step_time_s"]) <= 1e-9 * j["step_time_s"]
all(0 <= p["hidden_s"] <= p["serial_s"] * (1 + 1e-9) for p in j["phases"])
all((p["limited_by"] is None) == (p["serial_s"] == 0) for p in j["phases"])'

# --sensitivity: a larger kernel overhead never shortens the step, a larger bandwidth never lengthens it;
# a training step has a backward pass and a weight update
json "cost --sensitivity" "$common
len(j[\"sensitivity\"]) >= 8
all(s[\"change\"] >= -1e-9 for s in j[\"sensitivity\"] if s[\"figure\"].endswith(\"overhead\") or \"latency\" in s[\"figure\"])
all(s[\"change\"] <= 1e-9 for s in j[\"sensitivity\"] if \"bandwidth\" in s[\"figure\"] or s[\"figure\"].startswith(\"compute\"))
j[\"phases\"][1][\"serial_s\"] > 0 and j[\"phases\"][3][\"serial_s\"] > 0" \
	cost "$SRC/examples/train_transformer.yaml" --sensitivity --json

for f in "$SRC"/examples/*.yaml; do
	for hw in tpu-v3 tpu-v4 a100-nvlink h100-nvlink; do
		json "cost $(basename "$f") $hw" "$common
j[\"hardware\"] == \"$hw\"" cost "$f" --hardware "$hw" --json
	done
done

# the mlp by hand: one all_reduce over model (4) of 16x512 f32 per device
json "mlp collectives" 'len(j["collectives"]) == 1
j["collectives"][0]["op"] == "all_reduce" and j["collectives"][0]["axes"] == ["model"]
j["collectives"][0]["bytes_per_device"] == 16 * 512 * 4
j["collectives"][0]["bytes_sent_per_device"] == 2 * 3 / 4 * 16 * 512 * 4
j["bytes_sent_per_axis"] == {"data": 0, "model": 2 * 3 / 4 * 16 * 512 * 4}
j["memory"]["params_bytes"] == 2 * 512 * 512 * 4 and j["memory"]["inputs_bytes"] == 16 * 512 * 4
j["devices"] == 8 and j["mesh"] == {"data": 2, "model": 4}' cost "$SRC/examples/mlp.yaml" --json

# a model that does not fit still exits 0, and says so
cat >"$tmp/big.yaml" <<'EOF'
mesh: {axes: {data: 2}, hardware: tpu-v3}
inputs: {x: {shape: [8, 131072]}}
params: {w: {shape: [131072, 131072]}}
ops: [{out: y, op: einsum, eq: "bi,io->bo", in: [x, w]}]
outputs: [y]
EOF
json "does not fit" 'j["memory"]["fits"] is False and j["hardware"] == "tpu-v3"' cost "$tmp/big.yaml" --json
"$SPMD" cost "$tmp/big.yaml" >"$tmp/out" 2>&1 && grep -q "DOES NOT FIT" "$tmp/out" && pass || fail "text report of a model that does not fit"

# the mesh names the hardware; a profile file beside the model
cat >"$tmp/hw.yaml" <<'EOF'
name: tiny
compute: {f32: 1e9}
memory: {bandwidth: 1e9, capacity: 1e3}
interconnect: {topology: ring, dims: [16], link_bandwidth: 1e9, latency: 1e-6}
EOF
sed 's/hardware: tpu-v3/hardware: hw.yaml/' "$tmp/big.yaml" >"$tmp/named.yaml"
json "profile beside the model" 'j["hardware"] == "tiny" and j["memory"]["capacity_bytes"] == 1000' cost "$tmp/named.yaml" --json
sed 's/hardware: tpu-v3/hardware: tpu-v9/' "$tmp/big.yaml" >"$tmp/unknown.yaml"
error "unknown hardware in the model" 2 "unknown.yaml:1:.*expected a hardware profile (tpu-v3" cost "$tmp/unknown.yaml"
error "unknown --hardware" 2 "expected a hardware profile" cost "$SRC/examples/mlp.yaml" --hardware nope
printf 'compute: {f32: 1e9}\nmemory: {bandwidth: 1e9, capacity: 1}\nbogus: 1\n' >"$tmp/bad.yaml"
error "bad profile key" 2 "bad.yaml:3:1: error: expected a profile key" cost "$SRC/examples/mlp.yaml" --hardware "$tmp/bad.yaml"
printf 'compute: {f32: 1e9}\nmemory: {bandwidth: 1e-300, capacity: 1e9}\ninterconnect: {topology: ring, dims: [4], link_bandwidth: 1e9, latency: 0}\n' >"$tmp/absurd.yaml"
error "implausible rate (docs/hardware.md, Ranges)" 2 "absurd.yaml:2:21: error: expected a number of bytes per second from 1000 to 1e+16 for 'bandwidth', found '1e-300'" cost "$SRC/examples/mlp.yaml" --hardware "$tmp/absurd.yaml"
error "missing profile" 2 "cannot read hardware profile" cost "$SRC/examples/mlp.yaml" --hardware "$tmp/none.yaml"
error "no model" 2 "expected one MODEL.yaml" cost
error "bad runs" 2 "expected --runs from 1" cost "$SRC/examples/mlp.yaml" --runs 0

# calibrate writes a profile that cost reads; --compare-run reports every op kind
"$SPMD" calibrate --quick -o "$tmp/local.yaml" >/dev/null 2>"$tmp/err" && pass || fail "calibrate: $(cat "$tmp/err")"
json "compare-run" '"compare_run" in j and j["compare_run"]["measured_s"] > 0
set(k["op"] for k in j["compare_run"]["by_op_kind"]) == set(k["op"] for k in j["by_op_kind"])
abs(j["compare_run"]["error"] - (j["compare_run"]["predicted_s"] / j["compare_run"]["measured_s"] - 1)) < 1e-6' \
	cost "$SRC/examples/transformer_block.yaml" --hardware "$tmp/local.yaml" --compare-run --runs 1 --json
"$SPMD" cost "$SRC/examples/embedding.yaml" --hardware "$tmp/local.yaml" --compare-run --runs 1 >"$tmp/out" 2>&1 &&
	grep -q "^total" "$tmp/out" && pass || fail "compare-run text: $(cat "$tmp/out")"
error "calibrate without -o" 2 "expected -o PROFILE.yaml" calibrate
error "calibrate into no directory" 2 "expected a file to write, found $tmp/none/p.yaml: No such file" calibrate --quick -o "$tmp/none/p.yaml"

# explore: every factorization of 8 over {data, model}, the fitting ones ranked by time
json "explore" 'len(j["plans"]) == 4
sorted(p["mesh"]["data"] * p["mesh"]["model"] for p in j["plans"]) == [8, 8, 8, 8]
[p["rank"] for p in j["plans"] if p.get("rank")] == list(range(1, 1 + sum(1 for p in j["plans"] if p.get("rank"))))
all(a["step_time_overlapped_s"] <= b["step_time_overlapped_s"] for a, b in zip(j["plans"], j["plans"][1:]) if a.get("rank") and b.get("rank"))' \
	explore "$SRC/examples/transformer_block.yaml" --devices 8 --json
json "explore with training" 'len(j["plans"]) == 6
sorted(p["weight_update_sharding"] for p in j["plans"]) == [False] * 3 + [True] * 3
all(p["partitioned"] for p in j["plans"])' explore "$SRC/examples/train_mlp.yaml" --devices 4 --json
json "explore without training" 'all(p["weight_update_sharding"] is None for p in j["plans"])' \
	explore "$SRC/examples/mlp.yaml" --devices 2 --json
# a training step: the optimizer state is counted, the gradients' all_reduce over data is there
json "cost of a training step" 'j["memory"]["state_bytes"] > 0
any(c["op"] == "all_reduce" and c["axes"] == ["data"] for c in j["collectives"])' cost "$SRC/examples/train_mlp.yaml" --json
# explore is bounded: --max-plans and --time-limit stop it with a note of what it skipped
# where the step waits: ZeRO-3 on 8 TPU v4s waits for gathers and scatters; the waits
# add up to the steady step's time the compute stream idles
json "waits" 'j["waits"]["total_s"] > 0 and len(j["waits"]["longest"]) == 5
abs(j["waits"]["total_s"] - (j["step_time_overlapped_s"] - j["compute_s"])) < 0.02 * j["step_time_overlapped_s"]
all(w["collective_kind"] in ("all_gather", "reduce_scatter", "all_reduce") for w in j["waits"]["longest"])
j["waits"]["longest"][0]["seconds"] >= j["waits"]["longest"][-1]["seconds"] > 0' \
	cost "$SRC/bench/autoshard_plans/lm12_d1024_8dev_dp_zero3.yaml" --hardware tpu-v4 --json
"$SPMD" cost "$SRC/bench/autoshard_plans/lm12_d1024_8dev_dp_zero3.yaml" --hardware tpu-v4 >"$tmp/out" 2>/dev/null &&
	grep -q "^the compute stream waits .* of the .* steady step" "$tmp/out" && grep -q "before .* for all_gather" "$tmp/out" &&
	pass || fail "waits in the text report: $(cat "$tmp/out")"
json "explore --max-plans" 'len(j["plans"]) == 2 and j["plans_total"] == 4 and j["plans_skipped"] == 2
j["stopped_by"] == "--max-plans"' explore "$SRC/examples/mlp.yaml" --devices 8 --max-plans 2 --json
json "explore not stopped" 'j["plans_skipped"] == 0 and j["stopped_by"] is None' explore "$SRC/examples/mlp.yaml" --devices 8 --json
json "explore --time-limit" '0 < len(j["plans"]) < j["plans_total"] == 240 and j["stopped_by"] == "--time-limit"' \
	explore "$SRC/examples/mlp.yaml" --devices 720720 --time-limit 0.001 --json
"$SPMD" explore "$SRC/examples/mlp.yaml" --devices 8 --max-plans 3 >"$tmp/out" 2>"$tmp/err" &&
	grep -q "note: tried 3 of 4 plans; skipped 1 (--max-plans reached" "$tmp/err" && pass || fail "explore note of skipped plans"
# explore prunes a mesh that provably cannot fit once a plan that fits exists: w [1024, 1024] f32
# split only by `model` needs 4 MiB per device on data=8,model=1, over the 3 MB capacity
cat >"$tmp/floor.yaml" <<'EOF'
name: floor
mesh: {data: 2, model: 4}
inputs:
  x: {shape: [16, 1024], sharding: [data, null]}
params:
  w: {shape: [1024, 1024], sharding: [null, model]}
ops:
  - {out: y, op: einsum, in: [x, w], eq: "bi,io->bo"}
  - {out: z, op: tanh, in: [y]}
  - {out: loss, op: reduce_mean, in: [z], axes: [0, 1]}
outputs: [loss]
EOF
printf 'name: small\ncompute: {f32: 1e12}\nmemory: {bandwidth: 1e11, capacity: CAP}\ninterconnect: {topology: ring, dims: [8], link_bandwidth: 1e10, latency: 1e-6}\n' >"$tmp/small.in"
sed 's/CAP/3e6/' "$tmp/small.in" >"$tmp/small.yaml"
sed 's/CAP/1e5/' "$tmp/small.in" >"$tmp/tiny.yaml"
json "explore prunes a mesh that cannot fit" 'j["plans_pruned"] == 1
[(p["mesh"]["data"], p["memory_floor_bytes"]) for p in j["plans"] if p["pruned"]] == [(8, 4202496)]
all(p["partitioned"] and p["fits"] for p in j["plans"] if not p["pruned"])' \
	explore "$tmp/floor.yaml" --devices 8 --hardware "$tmp/small.yaml" --json
json "the pruned mesh really does not fit" 'not j["memory"]["fits"] and j["memory"]["peak_bytes"] >= 4202496' \
	cost "$tmp/floor.yaml" --mesh data=8,model=1 --hardware "$tmp/small.yaml" --json
# training: weight-update sharding may shard w over data, so only the plan without it is pruned
{ cat "$tmp/floor.yaml"; printf 'train: {loss: loss, optimizer: {type: sgd, lr: 0.1}}\n'; } >"$tmp/floor_train.yaml"
json "explore prunes only what cannot fit" 'j["plans_pruned"] == 1
[(p["mesh"]["data"], p["weight_update_sharding"]) for p in j["plans"] if p["pruned"]] == [(8, False)]
[p for p in j["plans"] if p["mesh"]["data"] == 8 and p["weight_update_sharding"]][0]["partitioned"]' \
	explore "$tmp/floor_train.yaml" --devices 8 --hardware "$tmp/small.yaml" --json
json "without a plan that fits nothing is pruned" 'j["plans_pruned"] == 0 and not any(p["fits"] for p in j["plans"])' \
	explore "$tmp/floor.yaml" --devices 8 --hardware "$tmp/tiny.yaml" --json
error "explore --time-limit 0" 2 "expected a number of seconds above 0" explore "$SRC/examples/mlp.yaml" --devices 8 --time-limit 0
error "explore --max-plans x" 2 "expected a non-negative integer after --max-plans" explore "$SRC/examples/mlp.yaml" --devices 8 --max-plans x
error "explore without --devices" 2 "expected --devices N" explore "$SRC/examples/mlp.yaml"
printf 'inputs: {x: {shape: [2]}}\nops: []\noutputs: [x]\n' >"$tmp/nomesh.yaml"
error "explore without a mesh" 2 "expected a model with a mesh" explore "$tmp/nomesh.yaml" --devices 4

echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
