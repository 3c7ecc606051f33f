#!/bin/sh
# pipeline_test.sh: pipeline: sections end to end — the priced schedules
# against the bubble formula, activations in flight, recompute, stages: auto
# on uneven stages, and the commands that do not take pipelined models yet.
# usage: sh pipeline_test.sh SPMD_BINARY SOURCE_DIR
SPMD=${1:?usage: pipeline_test.sh SPMD SOURCE_DIR}
SRC=${2:?usage: pipeline_test.sh SPMD SOURCE_DIR}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
tmp=${TMPDIR:-/tmp}/pipeline_test.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
HW="--hardware $SRC/tests/pipeline/slow_matrix.yaml"
BAL=$SRC/tests/pipeline/balanced.yaml

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

# Commands that would run the pipelined program refuse it with a positioned error.
for cmd in run partition; do
	"$SPMD" $cmd "$BAL" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" = 2 ] && head -n 1 "$tmp/err" | grep -q "balanced.yaml:5:11: error: expected a model without a pipeline section here"; then
		passes=$((passes + 1))
	else
		fail "$cmd: exit $rc: $(head -n 1 "$tmp/err")"
	fi
done

echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
