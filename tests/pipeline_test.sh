#!/bin/sh
# pipeline_test.sh: pipeline: sections end to end — the priced schedules
# against the bubble formula, activations in flight, recompute, stages: auto
# on uneven stages; the pipelined programs run with --check under every
# schedule on threads and MPI, written, verified and broken; and the models
# the pipeline refuses.
# usage: sh pipeline_test.sh SPMD_BINARY SOURCE_DIR
SPMD=${1:?usage: pipeline_test.sh SPMD SOURCE_DIR}
SRC=${2:?usage: pipeline_test.sh SPMD SOURCE_DIR}
. "$SRC/tests/script_setup.sh"
fails=0 passes=0
HW="--hardware $SRC/tests/pipeline/slow_matrix.yaml"
BAL=$SRC/tests/pipeline/balanced.yaml
TWO=$SRC/tests/pipeline/two.yaml

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

# cost NAME MODEL PY_ASSERTS [ARGS...]: `spmd cost MODEL --json ARGS` exits 0
# and every Python expression in PY_ASSERTS (one a line) holds, with p its
# "pipeline" object and j the whole report (a line NAME = ... defines NAME).
cost() {
	name=$1 model=$2 asserts=$3
	shift 3
	"$SPMD" cost "$model" --json "$@" >"$tmp/out" 2>"$tmp/err" || { fail "$name: exit status $?"; cat "$tmp/err"; return; }
	printf '%s\n' "$asserts" >"$tmp/asserts"
	if "$PY" - "$tmp/out" "$tmp/asserts" <<'PYEOF'; then passes=$((passes + 1)); else fail "$name"; fi
import json, sys
j = json.load(open(sys.argv[1]))
env = {"json": json, "j": j, "p": j["pipeline"]}
for line in open(sys.argv[2]):
    line = line.strip()
    if line.split(" = ")[0].isidentifier():  # NAME = ...: a name for the lines after
        exec(line, env)
    elif line and not eval(line, env):
        print("  does not hold:", line, file=sys.stderr)
        sys.exit(1)
PYEOF
}

# schedule S MODEL: MODEL with schedule S.
schedule() { sed "s/schedule: gpipe/schedule: $1/" "$2" >"$tmp/$1.yaml" && echo "$tmp/$1.yaml"; }

formula='abs(p["bubble_fraction"] - 3 / 11) <= 0.01 * 3 / 11'
# Balanced stages without sends: GPipe and 1F1B have the textbook bubble
# (p - 1) / (m + p - 1) with p = 4, m = 8; GPipe keeps all 8 microbatches,
# 1F1B at most p - d on device d.
cost gpipe "$BAL" "$formula
p['schedule'] == 'gpipe' and p['microbatches'] == 8 and p['stages'] == 4
p['microbatches_in_flight'] == 8
all(d['microbatches_in_flight'] == 8 for d in p['devices'])
abs(p['bubble_formula'] - 3 / 11) < 1e-12" $HW
cost 1f1b "$(schedule 1f1b "$BAL")" "$formula
p['schedule'] == '1f1b' and p['microbatches_in_flight'] == 4
[d['microbatches_in_flight'] for d in p['devices']] == [4, 3, 2, 1]
all(len(d['timeline']) == 16 for d in p['devices'])" $HW
# Interleaving 2 stages a device divides the bubble: (p - 1) / (V m + p - 1).
cost interleaved "$SRC/tests/pipeline/interleaved.yaml" "abs(p['bubble_fraction'] - 3 / 19) <= 0.01 * 3 / 19
p['virtual_stages'] == 2 and len(p['per_stage']) == 8
[s['device'] for s in p['per_stage']] == [0, 1, 2, 3, 0, 1, 2, 3]" $HW

# Steps of a device never overlap, and a backward follows its forward.
cost timeline "$(schedule 1f1b "$BAL")" "all(a['end_s'] <= b['start_s'] + 1e-15 for d in p['devices'] for a, b in zip(d['timeline'], d['timeline'][1:]))
all(p['devices'][3]['timeline'][2 * k]['step'] == 'forward' for k in range(8))"

# Recompute keeps only a stage's input per microbatch and runs its forward again.
sed 's/schedule: gpipe}/schedule: gpipe, recompute: true}/' "$BAL" >"$tmp/rc.yaml"
"$SPMD" cost "$BAL" --json $HW >"$tmp/plain.json" || fail "plain cost"
cost recompute "$tmp/rc.yaml" "q = json.load(open('$tmp/plain.json'))['pipeline']
p['recompute'] and not q['recompute']
all(a['kept_bytes_per_microbatch'] < b['kept_bytes_per_microbatch'] for a, b in zip(p['per_stage'], q['per_stage']))
all(abs(a['backward_s'] - b['backward_s'] - b['forward_s']) < 1e-12 for a, b in zip(p['per_stage'], q['per_stage']))
p['devices'][0]['activations_in_flight_bytes'] < q['devices'][0]['activations_in_flight_bytes']" $HW

# Every microbatch pays an op's fixed costs (kernel launch, dispatch,
# collective latency) and 1/m of its work: a stage's forward on m
# microbatches is L + W / m, with L and W read off m = 1 and m = 2; on a
# profile without fixed costs it is W / m alone.
EX=$SRC/examples/train_pipeline.yaml
for m in 1 2 8; do
	sed "s/microbatches: 8, schedule: 1f1b/microbatches: $m, schedule: gpipe/" "$EX" >"$tmp/mb$m.yaml"
	"$SPMD" cost "$tmp/mb$m.yaml" --json >"$tmp/mb$m.json" || fail "microbatches $m: exit status $?"
	"$SPMD" cost "$tmp/mb$m.yaml" --json $HW >"$tmp/mbs$m.json" || fail "microbatches $m, slow_matrix: exit status $?"
done
cost fixed_costs "$tmp/mb8.yaml" "f = lambda n, m: [s['forward_s'] for s in json.load(open('$tmp/' + n + str(m) + '.json'))['pipeline']['per_stage']]
W = [2 * (a - b) for a, b in zip(f('mb', 1), f('mb', 2))]
L = [a - w for a, w in zip(f('mb', 1), W)]
all(l > 0 and w > 0 for l, w in zip(L, W))
all(abs(l + w / 8 - x) <= 1e-9 * x for l, w, x in zip(L, W, f('mb', 8)))
all(abs(x - y * 8) <= 1e-9 * x for x, y in zip(f('mbs', 1), f('mbs', 8)))"

# Sends on the stage axis lengthen the step on a real profile: the bubble
# exceeds the formula, and the example prices.
cost sends "$BAL" "p['bubble_fraction'] > p['bubble_formula']
p['per_stage'][0]['send_s'] > 0 and p['per_stage'][3]['send_bytes'] == 0" --hardware tpu-v3
cost example "$SRC/examples/train_pipeline.yaml" "p['schedule'] == '1f1b' and p['stages'] == 4 and p['microbatches_in_flight'] == 4
0 < p['bubble_fraction'] < 1
p['step_time_s'] > p['microbatch_steps_s']"

# stages: auto on uneven stages: 8 layers on 3 stages — contiguous runs,
# every stage used, at most 3 layers a stage, and a larger bubble.
sed -e 's/, stage: [0-9]//' -e 's/schedule: gpipe}/schedule: 1f1b, stages: auto}/' "$BAL" >"$tmp/auto.yaml"
cost auto "$tmp/auto.yaml" "st = [p['op_stages']['e%d' % l] for l in range(8)]
st == sorted(st) and set(st) == {0, 1, 2}
max(st.count(s) for s in range(3)) == 3
p['stages_auto'] and p['bubble_fraction'] > p['bubble_formula'] + 0.01
abs(p['bubble_formula'] - 2 / 10) < 1e-12" $HW --mesh stage=3,data=2

# --pipeline-sweep: every schedule and microbatch count the batch allows, each
# with the textbook bubble here; GPipe holds m microbatches, 1F1B min(m, p).
cost sweep "$BAL" "w = j['pipeline_sweep']
sorted(set(r['microbatches'] for r in w)) == [1, 2, 4, 8, 16, 32]
set(r['schedule'] for r in w) == {'gpipe', '1f1b'}
all(abs(r['bubble_fraction'] - 3 / (r['microbatches'] + 3)) <= 0.01 * 3 / (r['microbatches'] + 3) for r in w)
all(r['microbatches_in_flight'] == (r['microbatches'] if r['schedule'] == 'gpipe' else min(r['microbatches'], 4)) for r in w)" $HW --pipeline-sweep
"$SPMD" cost "$SRC/examples/mlp.yaml" --pipeline-sweep >/dev/null 2>"$tmp/err"
[ $? = 2 ] && grep -q "expected a model with a pipeline section for --pipeline-sweep" "$tmp/err" && passes=$((passes + 1)) ||
	fail "sweep without a pipeline: $(cat "$tmp/err")"

# --compare-run times the pipelined program on threads, by microbatch step,
# beside the estimate: structure and consistency only (a loaded machine
# moves the times): every device ran its 2 m steps, busy and idle fill the
# span of the microbatch steps, the bubble is their idle share, and the
# estimate is the pipeline object's.
"$SPMD" calibrate --quick -o "$tmp/local.yaml" >/dev/null 2>"$tmp/err" || fail "calibrate: $(cat "$tmp/err")"
ACT=$SRC/tests/pipeline/activations.yaml
measured="c = j['compare_run']
c['pipelined'] and c['runs'] == 1
c['predicted_s'] == p['step_time_s'] and c['bubble_fraction_predicted'] == p['bubble_fraction']
c['microbatch_steps_predicted_s'] == p['microbatch_steps_s']
0 < c['bubble_fraction_measured'] < 1 and 0 < c['bubble_fraction_predicted'] < 1
all(d['steps'] == d['predicted_steps'] == 2 * p['microbatches'] for d in c['devices'])
all(d['busy_s'] > 0 and d['idle_s'] > 0 for d in c['devices'])
all(abs(d['busy_s'] + d['idle_s'] - c['microbatch_steps_measured_s']) < 1e-9 for d in c['devices'])
abs(c['bubble_fraction_measured'] - sum(d['idle_s'] for d in c['devices']) / (len(c['devices']) * c['microbatch_steps_measured_s'])) < 1e-9
c['measured_s'] >= c['microbatch_steps_measured_s']
abs(c['error'] - (c['predicted_s'] / c['measured_s'] - 1)) < 1e-9"
for s in gpipe 1f1b; do
	cost "compare-run $s on {stage: 2}" "$(schedule $s "$ACT")" "$measured
len(c['devices']) == 2" --hardware "$tmp/local.yaml" --compare-run --runs 1
done
cost "compare-run 1f1b on {stage: 4}" "$(schedule 1f1b "$BAL")" "$measured
[d['coordinate'] for d in c['devices']] == [0, 1, 2, 3]" --hardware "$tmp/local.yaml" --compare-run --runs 1 --mesh stage=4,data=1
"$SPMD" cost "$ACT" --hardware "$tmp/local.yaml" --compare-run --runs 1 >"$tmp/out" 2>&1 &&
	grep -q '^  bubble  ' "$tmp/out" && grep -q 'the pipelined program as spmd run builds it' "$tmp/out" &&
	passes=$((passes + 1)) || fail "compare-run text: $(tail -n 3 "$tmp/out")"

# ---- the pipelined program, run ----

# check NAME MODEL [ARGS...]: `spmd run MODEL --steps 3 --check ARGS` exits 0
# (loss, params, optimizer state and gradients equal the unpipelined model's).
# The example checks 2 steps under its own schedule (the second starts from
# the first's update) and 1 under the others: its reference runs dominate
# the test's time under the sanitizers; the smaller models check 3.
check() {
	name=$1 model=$2
	shift 2
	if "$SPMD" run "$model" --steps "${steps:-3}" --check "$@" >"$tmp/out" 2>"$tmp/err" && ! grep -q MISMATCH "$tmp/out" &&
		grep -q '^check loss ' "$tmp/out"; then
		passes=$((passes + 1))
	else
		fail "$name: run --check: $(grep -m 3 'MISMATCH\|error' "$tmp/out" "$tmp/err")"
	fi
}

# schedule_of S MODEL: MODEL with schedule S (any schedule it had).
schedule_of() { sed "s/schedule: [a-z0-9]*/schedule: $1/" "$2" >"$tmp/s_$1_${2##*/}" && echo "$tmp/s_$1_${2##*/}"; }

for s in gpipe 1f1b interleaved; do
	steps=1 && [ $s = 1f1b ] && steps=2 # the example's own schedule: two steps
	check "example $s" "$(schedule_of $s "$SRC/examples/train_pipeline.yaml")"        # {stage: 4, data: 2}
	steps=3
	check "tensor $s" "$(schedule_of $s "$SRC/tests/pipeline/tensor.yaml")"           # {stage: 4, data: 2, model: 2}
	check "two $s" "$(schedule_of $s "$SRC/tests/pipeline/two.yaml")"                 # {stage: 2, data: 2}
done
check "balanced on {stage: 4}" "$BAL" --mesh stage=4,data=1
check "balanced 1f1b" "$(schedule_of 1f1b "$BAL")"
check "interleaved, 2 stages a device" "$SRC/tests/pipeline/interleaved.yaml"
for s in gpipe 1f1b; do
	check "uneven $s" "$(schedule_of $s "$SRC/tests/pipeline/uneven.yaml")"           # stages of 1, 3, 2 layers; shards of 4, 4, 2
done
check "uneven batch over data 3" "$SRC/tests/pipeline/two.yaml" --mesh stage=2,data=3

# clip_global_norm: every stage's gradients in one norm (the sum of squares
# passed from stage to stage, the scale sent back to each), the norm above
# the limit in each: with Adam (two; tensor: weight-update sharding on,
# model parallel inside the stages) and momentum (uneven stages, where the
# scale moves the loss), under two schedules.
sed 's/steps: 3}/steps: 3, clip_global_norm: 0.01}/' "$SRC/tests/pipeline/two.yaml" >"$tmp/clip.yaml"
sed 's/steps: 3}/steps: 3, clip_global_norm: 0.05}/' "$SRC/tests/pipeline/tensor.yaml" >"$tmp/clip_tensor.yaml"
sed 's/steps: 3}/steps: 3, clip_global_norm: 0.05}/' "$SRC/tests/pipeline/uneven.yaml" >"$tmp/clip_uneven.yaml"
# check_schedules PATTERN NAME...: each $tmp/NAME.yaml holds PATTERN (the
# edit took) and trains under GPipe and 1F1B.
check_schedules() {
	pattern=$1
	shift
	for f in "$@"; do
		grep -q "$pattern" "$tmp/$f.yaml" || fail "$f: the edit did not take ($pattern)"
		for s in gpipe 1f1b; do
			check "$f $s" "$(schedule_of $s "$tmp/$f.yaml")"
		done
	done
}
check_schedules 'clip_global_norm' clip clip_tensor clip_uneven
# Tied weights: a param read on two stages (an embedding table and the
# output layer that reads it transposed, a weight of the first block read
# again by the last) belongs to its first reader's stage; the others read
# a copy sent once a step, whose gradient comes back for the one update.
# With weight-update sharding, model parallelism, clipping and before_use.
TEN=$SRC/tests/pipeline/tensor.yaml
sed 's/in: \[a0, w1\], stage: 1/in: [a0, w0], stage: 1/' "$TWO" >"$tmp/tied.yaml"
sed -e 's/in: \[y3, a4\]/in: [y3, a0]/' -e '/^  a4:/d' \
	-e 's/steps: 3}/steps: 3, clip_global_norm: 0.05}/' "$TEN" >"$tmp/tied_tensor.yaml"
sed 's/weight_update_sharding: true/weight_update_sharding: true, all_gather: before_use/' "$tmp/tied_tensor.yaml" \
	>"$tmp/tied_gather.yaml"
sed -e 's/in: \[x8, wout\], eq: "bsm,mv->bsv"/in: [x8, embed], eq: "bsm,vm->bsv"/' -e '/^  wout:/d' \
	"$SRC/examples/train_pipeline.yaml" >"$tmp/tied_lm.yaml"
check_schedules 'a0, w0\]\|y3, a0\]' tied tied_tensor tied_gather
steps=1
check "tied embedding 1f1b" "$tmp/tied_lm.yaml"
steps=3
"$SPMD" partition "$tmp/tied.yaml" >"$tmp/out" 2>"$tmp/err" &&
	grep -q 'collective_permute \[stage\] (w0%to_stage1) .* stage 0 -> 1$' "$tmp/out" &&
	[ "$(grep -c 'collective_permute .* stage 1 -> 0$' "$tmp/out")" = 5 ] && passes=$((passes + 1)) ||
	fail "tied: the copy is not sent once, or its gradient not once back: $(grep -m 3 'to_stage\|error' "$tmp/out" "$tmp/err")"
"$SPMD" cost "$SRC/examples/train_pipeline.yaml" --json >"$tmp/untied.json" || fail "untied cost"
cost "tied cost" "$tmp/tied_lm.yaml" "q = json.load(open('$tmp/untied.json'))['pipeline']
[d['tied_params_bytes'] for d in p['devices']] == [0, 0, 0, 64 * 64 * 4]
[d['tied_params_bytes'] for d in q['devices']] == [0, 0, 0, 0]
p['devices'][0]['tail_s'] > q['devices'][0]['tail_s']"

"$SPMD" partition "$tmp/clip.yaml" >"$tmp/out" 2>"$tmp/err" &&
	grep -q 'collective_permute \[stage\] (opt%clip_scale) .* stage 1 -> 0$' "$tmp/out" &&
	grep -q 'mul (w0%grad, opt%[0-9]*) .* stage 0$' "$tmp/out" && passes=$((passes + 1)) ||
	fail "clip: the scale is not sent to stage 0: $(grep -m 3 'clip' "$tmp/out" "$tmp/err")"

# spmd cost prices the clip's scalar hops: the running total's way to the
# last stage and the scale's way back, one hop a stage in every device's
# tail.  With the links' latency 100 times larger, each device's tail grows
# by at least two hops' worth more in the clipped model than in the same
# model unclipped (the clip's own ops are compute: they do not grow).
for lat in 1e-6 1e-4; do
	printf '%s\n' "name: slow_links" "compute: {f32: 20.5e12}" "kernel_overhead: 1e-6" "collective_overhead: 1e-6" \
		"memory: {bandwidth: 900e9, capacity: 34359738368}" \
		"interconnect: {topology: torus, dims: [32, 32], link_bandwidth: 1e11, latency: $lat}" >"$tmp/lat$lat.yaml"
	for m in two clip; do
		f=$SRC/tests/pipeline/two.yaml
		[ $m = clip ] && f=$tmp/clip.yaml
		"$SPMD" cost "$f" --hardware "$tmp/lat$lat.yaml" --json >"$tmp/$m$lat.json" 2>"$tmp/err" || fail "cost of $m at latency $lat: $(cat "$tmp/err")"
	done
done
"$PY" - "$tmp" <<'PYEOF' && passes=$((passes + 1)) || fail "clip: the scalar hops are not in the tails"
import json, os, sys
t = lambda n: [d["tail_s"] for d in json.load(open(os.path.join(sys.argv[1], n + ".json")))["pipeline"]["devices"]]
grow = [(c2 - u2) - (c1 - u1) for c1, u1, c2, u2 in zip(t("clip1e-6"), t("two1e-6"), t("clip1e-4"), t("two1e-4"))]
assert len(grow) == 2 and all(g >= 2 * 0.9 * (1e-4 - 1e-6) for g in grow), grow
PYEOF

# Forward-only pipelines (no train: section): the outputs of both stages
# joined back from their microbatches, with the batch split over data (2),
# not split (data 3 does not divide the microbatches), under every schedule;
# the example's logits on threads.
fwd_check() {
	name=$1 model=$2
	shift 2
	if "$SPMD" run "$model" --check "$@" >"$tmp/out" 2>"$tmp/err" && ! grep -q MISMATCH "$tmp/out" &&
		[ "$(grep -c '^check .* ok$' "$tmp/out")" -ge 1 ]; then
		passes=$((passes + 1))
	else
		fail "$name: run --check: $(grep -m 3 'MISMATCH\|error' "$tmp/out" "$tmp/err")"
	fi
}
awk '/^[^ #]/ { skip = /^train:/ } !skip' "$SRC/tests/pipeline/two.yaml" |
	sed -e 's/^outputs.*/outputs: [a0, h1]/' -e '/out: loss, op: mse/d' >"$tmp/fwd.yaml"
for s in gpipe 1f1b interleaved; do
	fwd_check "forward only $s" "$(schedule_of $s "$tmp/fwd.yaml")"
done
fwd_check "forward only, batch not split" "$tmp/fwd.yaml" --mesh stage=2,data=3
awk '/^[^ #]/ { skip = /^train:/ } !skip' "$SRC/examples/train_pipeline.yaml" |
	sed -e 's/^outputs: \[loss\]/outputs: [logits]/' -e '/out: loss, op: softmax_cross_entropy/d' >"$tmp/fwd_example.yaml"
fwd_check "forward-only example" "$tmp/fwd_example.yaml"

# recompute: true: the backward recomputes its stage's forward, trains as the
# model, and the measured peak drops (activations dominate this model).
for s in gpipe 1f1b; do
	sed "s/schedule: gpipe}/schedule: $s, recompute: true}/" "$ACT" >"$tmp/recompute_$s.yaml"
	check "recompute $s" "$tmp/recompute_$s.yaml"
done
sed 's/schedule: 1f1b}/schedule: 1f1b, recompute: true}/' "$SRC/tests/pipeline/tensor.yaml" >"$tmp/recompute_t.yaml"
check "recompute, tensor parallel stages" "$tmp/recompute_t.yaml"
peak() { "$SPMD" run "$1" --steps 1 | sed -n 's/^memory per device:.* peak \([0-9]*\) B$/\1/p'; }
kept=$(peak "$ACT") recomputed=$(peak "$tmp/recompute_gpipe.yaml")
[ -n "$kept" ] && [ -n "$recomputed" ] && [ "$recomputed" -lt $((kept * 3 / 4)) ] && passes=$((passes + 1)) ||
	fail "recompute's peak: $recomputed bytes against $kept"
"$SPMD" partition "$tmp/recompute_1f1b.yaml" | grep -q 'e0%mb0%re *= einsum' && passes=$((passes + 1)) ||
	fail "recompute: no recomputed forward in the listing"

# stages: auto runs the cut spmd cost prices (pipeline.op_stages), on 3 stages.
check "stages: auto" "$tmp/auto.yaml" --mesh stage=3,data=2
"$SPMD" cost "$tmp/auto.yaml" --json --mesh stage=3,data=2 >"$tmp/auto.json" &&
	"$SPMD" partition "$tmp/auto.yaml" --mesh stage=3,data=2 >"$tmp/auto.txt" &&
	"$PY" - "$tmp/auto.json" "$tmp/auto.txt" <<'PYEOF' && passes=$((passes + 1)) || fail "stages: auto: the run's cut is not the priced one"
import json, re, sys
cut = json.load(open(sys.argv[1]))["pipeline"]["op_stages"]
ran = {m.group(1): int(m.group(2)) for m in re.finditer(r"^  (\w+)%mb0 .* stage (\d+)$", open(sys.argv[2]).read(), re.M)}
sys.exit(not (len(set(cut.values())) == 3 and all(ran[k] == v for k, v in cut.items() if k in ran) and len(ran) >= 16))
PYEOF

# explore on a pipelined model: every stage mesh of 4 devices, each priced
# by its scheduled step with its best microbatch count (that of
# --pipeline-sweep), and ranked by it; its peak the pipeline's (its
# stages' params, the activations in flight), below the peak of the
# program with every stage on every device.
"$SPMD" explore "$tmp/auto.yaml" --devices 4 --time-limit 600 --json $HW >"$tmp/explore.json" 2>"$tmp/err" &&
	"$SPMD" cost "$tmp/auto.yaml" --json --pipeline-sweep --mesh stage=4,data=1 $HW >"$tmp/sweep.json" &&
	"$PY" - "$tmp/explore.json" "$tmp/sweep.json" <<'PYEOF' && passes=$((passes + 1)) || fail "explore over the stage axis: $(head -n 2 "$tmp/err")"
import json, sys
plans = json.load(open(sys.argv[1]))["plans"]
cost = json.load(open(sys.argv[2]))
sweep = [r for r in cost["pipeline_sweep"] if r["schedule"] == "1f1b"]
ranked = [p for p in plans if p.get("rank")]
best = min(sweep, key=lambda r: r["step_time_s"])
four = [p for p in plans if p["mesh"]["stage"] == 4 and p["weight_update_sharding"] is False][0]["pipeline"]
assert all(p["peak_bytes"] == p["pipeline"]["peak_bytes"] and p["fits"] for p in plans), plans
assert four["peak_bytes"] < cost["memory"]["peak_bytes"], (four, cost["memory"])
# stages: auto: interleaved rows too, two and four virtual stages (the ops fill 16 runs), on multiples of 4
inter = [r for r in cost["pipeline_sweep"] if r["schedule"] == "interleaved"]
assert sorted(set(r["virtual_stages"] for r in inter)) == [2, 4], inter  # its 17 ops fill 4 x 4 runs
assert all(r["microbatches"] % 4 == 0 for r in inter), inter
assert all(r["virtual_stages"] == 1 for r in cost["pipeline_sweep"] if r["schedule"] != "interleaved")
ok = (sorted(p["mesh"]["stage"] for p in plans) == [1, 1, 2, 2, 4, 4] and len(ranked) == 6
      and all(32 % p["pipeline"]["microbatches"] == 0 for p in plans)
      and [p["pipeline"]["step_time_s"] for p in ranked] == sorted(p["pipeline"]["step_time_s"] for p in ranked)
      and four["microbatches"] == best["microbatches"] and abs(four["step_time_s"] - best["step_time_s"]) <= 1e-12
      and four["bubble_fraction"] > 0)
sys.exit(not ok)
PYEOF

# The program: every stage's ops, sends between stages, written and read
# back, verified deadlock-free, and run as the model runs.
"$SPMD" partition "$SRC/tests/pipeline/tensor.yaml" -o "$tmp/prog.yaml" --per-device "$tmp/dev" >"$tmp/listing" 2>"$tmp/err" ||
	fail "partition: $(head -n 3 "$tmp/err")"
grep -q '^pipelined over stage' "$tmp/listing" && grep -q 'collective_permute \[stage\].*stage 0 -> 1' "$tmp/listing" &&
	grep -q '^stages: stage' "$tmp/prog.yaml" && passes=$((passes + 1)) || fail "the listing and program name stages and sends"
"$SPMD" verify "$tmp/dev" >"$tmp/out" 2>&1 && grep -q ': ok: 16 devices' "$tmp/out" && passes=$((passes + 1)) ||
	fail "verify: $(cat "$tmp/out")"
"$SPMD" run "$SRC/tests/pipeline/tensor.yaml" --steps 3 >"$tmp/a.out" 2>&1
"$SPMD" run "$tmp/prog.yaml" --steps 3 >"$tmp/b.out" 2>&1 && cmp -s "$tmp/a.out" "$tmp/b.out" && passes=$((passes + 1)) ||
	fail "the written program does not train as the model"
# A send moved to the wrong place reads what its devices do not hold: refused where it is written.
sed '0,/stage: \[0, 1\]/s//stage: [1, 2]/' "$tmp/prog.yaml" >"$tmp/bad.yaml"
"$SPMD" run "$tmp/bad.yaml" --steps 1 >"$tmp/out" 2>"$tmp/err"
[ $? = 2 ] && grep -q 'bad.yaml:[0-9]*:[0-9]*: error: expected an op of stage 1 to read values of its own devices' "$tmp/err" &&
	passes=$((passes + 1)) || fail "a misplaced send: $(head -n 2 "$tmp/err")"
# Device 0's first send renamed: its partner, device 2, disagrees, and verify says so.
"$SPMD" partition "$SRC/tests/pipeline/two.yaml" --per-device "$tmp/dev2" >/dev/null 2>&1
send=$(grep -m 1 -o 'out: a0%[0-9]*, op: collective_permute' "$tmp/dev2/device_0.yaml" | sed 's/out: \(a0%[0-9]*\),.*/\1/')
sed -i "s/$send\b/a0%9999/g" "$tmp/dev2/device_0.yaml"
"$SPMD" verify "$tmp/dev2" >"$tmp/out" 2>&1
[ $? = 1 ] && grep -q 'device_2.yaml:[0-9]*:[0-9]*: error: device 2: collective #1 does not match its group \[0, 2\]' "$tmp/out" &&
	passes=$((passes + 1)) || fail "verify of a renamed send: $(head -n 2 "$tmp/out")"

# A send sits where the schedule's steps that start before its value is
# made are already in the order: the last stage takes microbatch k's
# activations only after its own forward of microbatch k - 1, which the
# schedule runs while the first stage makes them (a send right after the
# step that makes it made the receiver wait for that step first).
for s in gpipe 1f1b; do
	"$SPMD" partition "$(schedule $s "$SRC/tests/pipeline/activations.yaml")" -o "$tmp/order_$s.yaml" >/dev/null 2>"$tmp/err" ||
		{ fail "send order $s: partition: $(head -n 3 "$tmp/err")"; continue; }
	if "$PY" - "$tmp/order_$s.yaml" <<'PYEOF'; then passes=$((passes + 1)); else fail "send order $s"; fi
import re, sys
ops = re.findall(r"\{out: \"?([^\",]+)\"?, op: (\w+), in: \[\"?([^\]\"]*)", open(sys.argv[1]).read())
at = {out: k for k, (out, kind, ins) in enumerate(ops)}
sends = [(k, ins) for k, (out, kind, ins) in enumerate(ops) if kind == "collective_permute" and "%mb" in ins]
assert len(sends) == 4, sends
for k, ins in sends:
    mb = int(ins.split("%mb")[1])
    if mb and at["loss%%mb%d" % (mb - 1)] > k:
        print("  %s is sent before the last stage's forward of microbatch %d" % (ins, mb - 1), file=sys.stderr)
        sys.exit(1)
PYEOF
done

# MPI: one rank per device, the model and the per-device files (one step
# of the example: its communication is all there; steps are checked on
# threads), and a forward-only pipeline.
if command -v mpirun >/dev/null 2>&1; then
	MPIRUN="timeout 300 mpirun --oversubscribe"
	[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
	# Open MPI's own allocations that outlive MPI_Finalize (sanitizer builds), as mpi_test.sh
	LSAN_OPTIONS="suppressions=$SRC/tests/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0"
	OPENBLAS_NUM_THREADS=1
	export LSAN_OPTIONS OPENBLAS_NUM_THREADS
	for s in gpipe 1f1b interleaved; do
		$MPIRUN -np 8 "$SPMD" run "$(schedule_of $s "$SRC/examples/train_pipeline.yaml")" --backend mpi --steps 1 --check \
			>"$tmp/out" 2>"$tmp/err" && ! grep -q MISMATCH "$tmp/out" && passes=$((passes + 1)) ||
			fail "mpi $s: $(grep -m 3 'MISMATCH\|error' "$tmp/out" "$tmp/err")"
	done
	$MPIRUN -np 4 "$SPMD" run "$tmp/s_1f1b_clip.yaml" --backend mpi --steps 2 --check >"$tmp/out" 2>"$tmp/err" &&
		! grep -q MISMATCH "$tmp/out" && grep -q '^check adam_m%w0 .* ok$' "$tmp/out" && passes=$((passes + 1)) ||
		fail "mpi clip: $(grep -m 3 'MISMATCH\|error' "$tmp/out" "$tmp/err")"
	$MPIRUN -np 4 "$SPMD" run "$tmp/s_1f1b_tied.yaml" --backend mpi --steps 2 --check >"$tmp/out" 2>"$tmp/err" &&
		! grep -q MISMATCH "$tmp/out" && grep -q '^check w0%grad .* ok$' "$tmp/out" && passes=$((passes + 1)) ||
		fail "mpi tied: $(grep -m 3 'MISMATCH\|error' "$tmp/out" "$tmp/err")"
	$MPIRUN -np 4 "$SPMD" run "$tmp/s_1f1b_fwd.yaml" --backend mpi --check >"$tmp/out" 2>"$tmp/err" &&
		! grep -q MISMATCH "$tmp/out" && grep -q '^check h1 .* ok$' "$tmp/out" && passes=$((passes + 1)) ||
		fail "mpi forward only: $(grep -m 3 'MISMATCH\|error' "$tmp/out" "$tmp/err")"
	$MPIRUN -np 16 "$SPMD" run "$tmp/dev" --backend mpi --steps 3 >"$tmp/c.out" 2>"$tmp/err" &&
		[ "$(grep '^step' "$tmp/c.out")" = "$(grep '^step' "$tmp/a.out")" ] && passes=$((passes + 1)) ||
		fail "mpi per-device files: $(head -n 3 "$tmp/err")"
fi

# ---- models the pipeline cannot cut: positioned errors, exit 2 ----
refused() {
	name=$1 model=$2 want=$3
	"$SPMD" run "$model" --steps 1 >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" = 2 ] && grep -q "$want" "$tmp/err"; then
		passes=$((passes + 1))
	else
		fail "$name: exit $rc: $(head -n 1 "$tmp/err")"
	fi
}
sed 's/{out: a0, op: tanh, in: \[h0\]}/{out: a0, op: softmax, in: [h0], axis: 0}/' "$TWO" >"$tmp/rows.yaml"
refused "rows mixed" "$tmp/rows.yaml" "rows.yaml:14:5: error: expected ops that keep the rows of the batch"
# A forward-only pipeline's outputs keep the batch's rows: a loss is refused at its op.
awk '/^[^ #]/ { skip = /^train:/ } !skip' "$TWO" | sed 's/^outputs.*/outputs: [loss]/' >"$tmp/fwd_loss.yaml"
"$SPMD" run "$tmp/fwd_loss.yaml" >"$tmp/out" 2>"$tmp/err"
[ $? = 2 ] && grep -q "fwd_loss.yaml:16:5: error: expected ops that keep the rows of the batch" "$tmp/err" &&
	passes=$((passes + 1)) || fail "forward-only loss: $(head -n 1 "$tmp/err")"

echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
