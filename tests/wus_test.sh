#!/bin/sh
# wus_test.sh SPMD SOURCE_DIR: weight-update sharding is exact, keeps optimizer
# state sharded, and moves the bytes of the all-reduce it replaces.
SPMD=$1
SRC=$2
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# a variant of the test model: optimizer $1, sharding $2, extra train lines $3
variant() {
	sed -e "s/type: adam, lr: 0.01/type: $1/" -e "s/weight_update_sharding: on/weight_update_sharding: $2$3/" \
		"$SRC/tests/wus/wus_mlp.yaml" > "$T/m_$1_$2.yaml"
	echo "$T/m_$1_$2.yaml"
}

# 1. Exact: every optimizer, sharding off and on, meshes that divide and do not.
for opt in sgd momentum adam adamw lamb; do
	for wus in off on; do
		m=$(variant $opt $wus)
		for mesh in data=3,model=1 data=4,model=1 data=3,model=2 data=2,model=3; do
			if "$SPMD" run "$m" --steps 3 --check --mesh $mesh > "$T/out" 2>&1; then ok
			else bad "$opt wus=$wus mesh $mesh"; sed 's/^/    /' "$T/out" | tail -5; fi
		done
	done
done
m=$(variant lamb on "\n  clip_global_norm: 0.5")
if "$SPMD" run "$m" --steps 3 --check --mesh data=3,model=2 > "$T/out" 2>&1; then ok; else bad "lamb + clipping"; fi
m=$(variant adam on "\n  grad_dtype: bf16")
if "$SPMD" run "$m" --steps 3 --check --mesh data=4,model=1 > "$T/out" 2>&1; then ok; else bad "adam + bf16 gradients"; fi
# all_gather: before_use keeps weights sharded between steps and gathers them at use.
for opt in momentum adam lamb; do
	m=$(variant $opt on "\n  all_gather: before_use")
	for mesh in data=3,model=1 data=2,model=2 data=3,model=2; do
		if "$SPMD" run "$m" --steps 3 --check --mesh $mesh > "$T/out" 2>&1; then ok
		else bad "$opt before_use mesh $mesh"; tail -3 "$T/out"; fi
	done
done
# all_gather per param: a param's own all_gather overrides the section's
# (w2 gathered after its update while w1 and the biases are gathered at
# use, and the other way round): exact on every mesh
for opt in adam lamb; do
	for sec in before_use after_update; do
		own=after_update
		[ $sec = after_update ] && own=before_use
		m=$(variant $opt on "\n  all_gather: $sec")
		sed -i "s/^  w2: {\(.*\)}$/  w2: {\1, all_gather: $own}/" "$m"
		grep -q "all_gather: $own}" "$m" || bad "the mixed variant was not written"
		for mesh in data=3,model=1 data=2,model=2 data=3,model=2; do
			if "$SPMD" run "$m" --steps 3 --check --mesh $mesh > "$T/out" 2>&1; then ok
			else bad "$opt all_gather $sec, w2 $own, mesh $mesh"; tail -3 "$T/out"; fi
		done
	done
done
# all_gather: first_use gathers each weight once a step, at its first use,
# and the backward reads that copy: exact for the whole section and for one
# param (w1 held for the backward while the rest are gathered twice)
for opt in adam lamb; do
	m=$(variant $opt on "\n  all_gather: first_use\n  group_bytes: 0")
	for mesh in data=3,model=1 data=2,model=2 data=3,model=2; do
		if "$SPMD" run "$m" --steps 3 --check --mesh $mesh > "$T/out" 2>&1; then ok
		else bad "$opt first_use mesh $mesh"; tail -3 "$T/out"; fi
	done
	m=$(variant $opt on "\n  all_gather: before_use\n  group_bytes: 0\n  prefetch: off")
	sed -i "s/^  w1: {\(.*\)}$/  w1: {\1, all_gather: first_use}/" "$m"
	grep -q "all_gather: first_use}" "$m" || bad "the first_use variant was not written"
	for mesh in data=4,model=1 data=3,model=2; do
		if "$SPMD" run "$m" --steps 3 --check --mesh $mesh > "$T/out" 2>&1; then ok
		else bad "$opt w1 first_use, mesh $mesh"; tail -3 "$T/out"; fi
	done
	"$SPMD" partition "$m" --mesh data=4,model=1 > "$T/fu.txt" 2>&1
	if grep -q '^  w1%full *= all_gather' "$T/fu.txt" && ! grep -q '^  w1%full%bwd' "$T/fu.txt" &&
		grep -q '^  w2%full%bwd *= all_gather' "$T/fu.txt"; then ok
	else bad "$opt w1 first_use: gathered once, w2 twice"; fi
done
m=$(variant adam on "\n  all_gather: before_use")
"$SPMD" run "$m" --steps 1 --mesh data=4,model=1 > "$T/bu" 2>&1
m=$(variant adam on)
"$SPMD" run "$m" --steps 1 --mesh data=4,model=1 > "$T/au" 2>&1
if $PY - "$T" <<'PY'
import re, sys
t = sys.argv[1]
params = lambda f: int(re.search(r"params (\d+) B", open(f"{t}/{f}").read()).group(1))
assert params("bu") * 3 < params("au"), (params("bu"), params("au"))
PY
then ok; else bad "before_use keeps the params sharded"; fi
# before_use gathers each weight where it is used, in the forward and again
# in the backward (no prefetch: group_bytes 0), and stays exact
m=$(variant adam on "\n  all_gather: before_use\n  group_bytes: 0")
if "$SPMD" run "$m" --steps 3 --check --mesh data=2,model=2 > "$T/out" 2>&1; then ok
else bad "before_use gathered at use"; tail -3 "$T/out"; fi
m=$(variant adam on "\n  all_gather: before_use\n  group_bytes: 0\n  prefetch: off")
if "$SPMD" run "$m" --steps 3 --check --mesh data=2,model=2 > "$T/out" 2>&1; then ok
else bad "before_use with prefetch off"; tail -3 "$T/out"; fi
# one weight ahead, and more weights ahead than the model has: exact too
for n in 1 9; do
	m=$(variant adam on "\n  all_gather: before_use\n  group_bytes: 0\n  prefetch: $n")
	if "$SPMD" run "$m" --steps 3 --check --mesh data=2,model=2 > "$T/out" 2>&1; then ok
	else bad "before_use with prefetch $n"; tail -3 "$T/out"; fi
done
# ZeRO-3's memory: on a 4-layer 4096-wide language model over 64 devices, at
# the peak at most four gathered weights, the one in use and the next three,
# prefetched (not every weight, gathered once and kept from the forward to
# the backward: no more than the four largest, the unembedding and three MLP
# weights; with `prefetch: 1` two), and the gradients reduce_scattered as
# the backward makes them: the peak is under half after_update's
GEN=$(dirname "$SPMD")/bench/gen_transformer
if [ -x "$GEN" ]; then
	"$GEN" 4 64x1 64x32 --dmodel 4096 --seq 1024 --vocab 32000 --train --plan batch,wus >"$T/lm_au.yaml"
	sed 's/^  weight_update_sharding: on/  weight_update_sharding: on\n  all_gather: before_use/' "$T/lm_au.yaml" >"$T/lm_bu.yaml"
	"$SPMD" cost "$T/lm_au.yaml" --hardware tpu-v4 --json >"$T/au.json" 2>/dev/null
	"$SPMD" cost "$T/lm_bu.yaml" --hardware tpu-v4 --json >"$T/bu.json" 2>/dev/null
	sed 's/^  all_gather: before_use/  all_gather: before_use\n  prefetch: off/' "$T/lm_bu.yaml" >"$T/lm_np.yaml"
	"$SPMD" cost "$T/lm_np.yaml" --hardware tpu-v4 --json >"$T/np.json" 2>/dev/null
	sed 's/^  all_gather: before_use/  all_gather: before_use\n  prefetch: 1/' "$T/lm_bu.yaml" >"$T/lm_p1.yaml"
	"$SPMD" cost "$T/lm_p1.yaml" --hardware tpu-v4 --json >"$T/p1.json" 2>/dev/null
	if $PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
au, bu = (json.load(open(f"{t}/{f}.json"))["memory"] for f in ("au", "bu"))
assert bu["collective_buffers_at_peak_bytes"] <= (4096 * 32000 + 3 * 4096 * 16384) * 4 + 4096, bu
assert 2 * bu["peak_bytes"] < au["peak_bytes"], (bu, au)
# one weight ahead: two gathered weights at the peak
step = {f: json.load(open(f"{t}/{f}.json"))["step_time_overlapped_s"] for f in ("bu", "p1", "np")}
p1 = json.load(open(f"{t}/p1.json"))["memory"]
assert p1["collective_buffers_at_peak_bytes"] <= (4096 * 32000 + 4096 * 16384) * 4 + 4096, p1
# prefetch off: one gathered weight at the peak, less memory, the gathers exposed
np_ = json.load(open(f"{t}/np.json"))["memory"]
assert np_["collective_buffers_at_peak_bytes"] <= 4096 * 32000 * 4 + 4096, np_
assert np_["peak_bytes"] < p1["peak_bytes"] <= bu["peak_bytes"], (np_, p1, bu)
assert step["np"] > 1.1 * step["p1"] and step["p1"] > step["bu"], step
PY
	then ok; else bad "before_use: ZeRO-3's peak, with and without prefetch"; fi
	# the backward reads the forward's gathered copy where it would gather
	# the weight again a place after freeing it: the last layer's second
	# MLP weight (the unembedding is read last and first: gathered again,
	# not held over the loss); with prefetch off every weight is gathered
	# twice
	"$SPMD" partition "$T/lm_bu.yaml" >"$T/bu.txt" 2>/dev/null
	"$SPMD" partition "$T/lm_np.yaml" >"$T/np.txt" 2>/dev/null
	if grep -q '^  l3.w2%full *= all_gather' "$T/bu.txt" && ! grep -q '^  l3.w2%full%bwd' "$T/bu.txt" &&
		grep -q '^  l3.w1%full%bwd *= all_gather' "$T/bu.txt" && grep -q '^  l2.w2%full%bwd *= all_gather' "$T/bu.txt" &&
		grep -q '^  unembed%full%bwd *= all_gather' "$T/bu.txt" && grep -q '^  l3.w2%full%bwd *= all_gather' "$T/np.txt" &&
		[ "$(grep -c '%full%bwd *= all_gather' "$T/bu.txt")" -eq $(($(grep -c '%full%bwd *= all_gather' "$T/np.txt") - 1)) ]
	then ok; else bad "before_use: the last layer's weight kept for the backward"; fi
	# all_gather per param: ZeRO-3 with the unembedding kept whole between
	# steps (gathered once, after its update): its weight gathered at the
	# step's end and never at use, the others at use; the params held lie
	# between ZeRO-3's and after_update's by the unembedding's shards
	sed 's/^  unembed: {\(.*\)}$/  unembed: {\1, all_gather: after_update}/' "$T/lm_bu.yaml" >"$T/lm_mix.yaml"
	"$SPMD" cost "$T/lm_mix.yaml" --hardware tpu-v4 --json >"$T/mix.json" 2>/dev/null
	"$SPMD" partition "$T/lm_mix.yaml" >"$T/mix.txt" 2>/dev/null
	if grep -q '^  unembed%next *= all_gather' "$T/mix.txt" && ! grep -q '^  unembed%full' "$T/mix.txt" &&
		grep -q '^  l0.wq%full *= all_gather' "$T/mix.txt" && ! grep -q '^  l0.wq%next *= all_gather' "$T/mix.txt" &&
		$PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
au, bu, mix = (json.load(open(f"{t}/{f}.json"))["memory"]["params_bytes"] for f in ("au", "bu", "mix"))
unembed = 4096 * 32000 * 4
assert mix - bu == unembed - unembed // 64, (au, bu, mix)
assert bu < mix < au, (au, bu, mix)
PY
	then ok; else bad "all_gather per param: the unembedding kept whole under before_use"; fi
	# all_gather: first_use on the unembedding (FSDP's root, the weight the
	# forward reads last and the backward first): its forward copy is held
	# over the loss, not gathered again; one gather fewer, faster, and the
	# peak higher by at most its whole copy
	sed 's/^  unembed: {\(.*\)}$/  unembed: {\1, all_gather: first_use}/' "$T/lm_bu.yaml" >"$T/lm_fu.yaml"
	"$SPMD" cost "$T/lm_fu.yaml" --hardware tpu-v4 --json >"$T/fu.json" 2>/dev/null
	"$SPMD" partition "$T/lm_fu.yaml" >"$T/fu.txt" 2>/dev/null
	if grep -q '^  unembed%full *= all_gather' "$T/fu.txt" && ! grep -q '^  unembed%full%bwd' "$T/fu.txt" &&
		[ "$(grep -c '%full%bwd *= all_gather' "$T/fu.txt")" -eq $(($(grep -c '%full%bwd *= all_gather' "$T/bu.txt") - 1)) ] &&
		$PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
bu, fu = (json.load(open(f"{t}/{f}.json")) for f in ("bu", "fu"))
sent = lambda j: sum(c["bytes_sent_per_device"] for c in j["collectives"])
assert sent(bu) - sent(fu) >= 4096 * 32000 * 4 * 63 // 64, (sent(bu), sent(fu))
assert fu["step_time_overlapped_s"] < bu["step_time_overlapped_s"], (fu["step_time_overlapped_s"], bu["step_time_overlapped_s"])
assert bu["memory"]["peak_bytes"] < fu["memory"]["peak_bytes"] <= bu["memory"]["peak_bytes"] + 4096 * 32000 * 4
PY
	then ok; else bad "all_gather: first_use holds the unembedding over the loss"; fi
	# after_update: the gathers that end the step go in the order the next
	# step reads the weights: the embedding's, the first layer's, ..., the
	# unembedding's last
	"$SPMD" partition "$T/lm_au.yaml" 2>/dev/null | grep -o '^  [^ ]*%next *= all_gather' | sed 's/ *=.*//; s/^ *//' >"$T/gathers"
	if [ "$(sed -n 1,2p "$T/gathers" | tr '\n' ' ')" = "embed%next l0.wq%next " ] && [ "$(tail -1 "$T/gathers")" = unembed%next ]; then ok
	else bad "after_update gathers in the order of use: $(tr '\n' ' ' <"$T/gathers")"; fi
else
	bad "no $GEN"
fi

for ex in train_mlp train_transformer train_lamb; do
	sed 's/^  loss: \(.*\)$/  loss: \1\n  weight_update_sharding: on/' "$SRC/examples/$ex.yaml" > "$T/$ex.yaml"
	if "$SPMD" run "$T/$ex.yaml" --steps 2 --check > "$T/out" 2>&1; then ok; else bad "$ex with sharding on"; tail -3 "$T/out"; fi
done

# 2. On {data: 8} with Adam: optimizer state per device at most 1/8 of the
#    unsharded state plus padding; reduce_scatter + all_gather send what the
#    all_reduce sent, padding aside; the gradients are reduce-scattered.
for wus in off on; do
	m=$(variant adam $wus "\n  group_bytes: 0")
	"$SPMD" run "$m" --steps 1 --mesh data=8,model=1 > "$T/run_$wus" 2>&1 || bad "adam {data: 8} wus=$wus runs"
	"$SPMD" partition "$m" --mesh data=8,model=1 --json > "$T/json_$wus" 2>/dev/null || bad "partition --json wus=$wus"
done
if $PY - "$T" <<'PY'
import json, re, sys
t = sys.argv[1]
def state(w):
    m = re.search(r"optimizer state (\d+) B", open(f"{t}/run_{w}").read())
    return int(m.group(1))
off, on = json.load(open(f"{t}/json_off")), json.load(open(f"{t}/json_on"))
pad = sum(p["padding"] for p in on["weight_update_sharding"]) * 4 * 2  # adam: two f32 states
assert all(p["sharded"] for p in on["weight_update_sharding"]), on["weight_update_sharding"]
assert not any(p["sharded"] for p in off["weight_update_sharding"])
assert state("on") <= state("off") / 8 + pad, (state("on"), state("off"), pad)
rs = sum(c["bytes_sent_per_device"] for c in on["collectives"] if c["op"] == "reduce_scatter")
gathers = lambda j: sum(c["bytes_sent_per_device"] for c in j["collectives"] if c["op"] == "all_gather")
ag = gathers(on) - gathers(off)  # the weights' gathers: the forward's are in both
grad = lambda v: v.startswith("d%") or v.endswith("%grad")  # a sum moved past the gradient's copy is reduced there
ar = sum(c["bytes_sent_per_device"] for c in off["collectives"] if c["op"] == "all_reduce" and grad(c["value"]))
assert rs > 0 and ag > 0 and ar > 0, (rs, ag, ar)
assert not [c for c in on["collectives"] if c["op"] == "all_reduce" and c["value"].startswith("d%w")], "a weight gradient is all-reduced"
assert abs((rs + ag) - ar) <= pad, (rs, ag, ar, pad)
print(f"state {state('off')} -> {state('on')} B; all_reduce {ar} B vs reduce_scatter {rs} + all_gather {ag} B")
PY
then ok; else bad "memory and bytes on {data: 8}"; fi

echo "wus_test: $pass passed, $fail failed"
[ $fail -eq 0 ]
