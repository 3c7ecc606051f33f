#!/bin/sh
# autoshard_pipe_test.sh: `spmd autoshard` on models with a pipeline:
# section — the stage count and the microbatch count searched, plans
# ranked by the scheduled step against an enumeration by `spmd cost`, under
# budgets that force more microbatches; the written model reproducing the
# price and training checked; the user's stage axis and stage: keys kept.
# usage: sh autoshard_pipe_test.sh SPMD_BINARY SOURCE_DIR
SPMD=${1:?usage: autoshard_pipe_test.sh SPMD SOURCE_DIR}
SRC=${2:?usage: autoshard_pipe_test.sh SPMD SOURCE_DIR}
. "$SRC/tests/script_setup.sh"
fails=0 passes=0
SEARCH=$SRC/tests/pipeline/search.yaml
EXAMPLE=$SRC/examples/train_pipeline.yaml

. "$SRC/tests/autoshard_lib.sh"

# the enumeration's rows ($tmp/table: stages, microbatches, step, peak a
# line) and what autoshard must choose from them, for check
cat >"$tmp/prelude.py" <<'PYEOF'
rows = load("table", lambda f: [tuple(float(x) for x in l.split()) for l in f if l.strip()]) or []
def best(budget):  # the fastest (stages, microbatches) within budget; ties: the fewer stages, then microbatches
    fit = [r for r in rows if r[3] <= budget]
    return min(fit, key=lambda r: (r[2], r[0], r[1])) if fit else None
def pick(p, budget):  # the count a plan on p stages takes: the fastest within budget, else the least peak
    mine = [r for r in rows if r[0] == p]
    fit = [r for r in mine if r[3] <= budget]
    return min(fit, key=lambda r: (r[2], r[1])) if fit else min(mine, key=lambda r: (r[3], r[1]))
def runner(p, budget):  # the best other stage count: fits first, then the faster
    return min((pick(q, budget) for q in set(r[0] for r in rows) if q != p), key=lambda r: (r[3] > budget, r[2], r[0]))
PYEOF

# The enumeration: every stage count of 4 devices (the rest data parallel)
# and every microbatch count the batch of 32 allows, priced by spmd cost.
# Every leaf of the model is annotated and --keep-train keeps its train:
# section, so the stage count and the microbatch count are all autoshard
# chooses.
for p in 1 2 4; do
	for m in 1 2 4 8 16 32; do
		sed "s/mesh: {stage: 4, data: 2}/mesh: {stage: $p, data: $((4 / p))}/; s/microbatches: 4/microbatches: $m/" \
			"$SEARCH" >"$tmp/e.yaml"
		"$SPMD" cost "$tmp/e.yaml" --json >"$tmp/e.json" 2>"$tmp/err" || fail "cost of stage=$p, $m microbatches: $(cat "$tmp/err")"
		"$PY" -c "import json, sys; j = json.load(open(sys.argv[1]))['pipeline']; print($p, $m, j['step_time_s'], j['peak_bytes'])" \
			"$tmp/e.json" >>"$tmp/table" || fail "enumeration row $p $m"
	done
done

# The optimum at a loose budget, and at budgets that force more microbatches
# or more stages (1F1B holds at most p - d microbatches a device, each
# smaller as m grows; more stages hold fewer params each): each a byte
# below the previous optimum's peak, taken from the table.
budgets=$("$PY" - "$tmp/table" <<'PYEOF'
import sys
rows = [tuple(float(x) for x in l.split()) for l in open(sys.argv[1]) if l.strip()]
b, out = 34359738368, []
while len(out) < 3:
    fit = [r for r in rows if r[3] <= b]
    if not fit:
        break
    out.append(b)
    b = int(min(fit, key=lambda r: (r[2], r[0], r[1]))[3]) - 1
print(" ".join(map(str, out)), int(min(r[3] for r in rows)) - 1)
PYEOF
)
none=${budgets##* }
budgets=${budgets% *}
[ "$(echo $budgets | wc -w)" = 3 ] || fail "three budgets from the table: $budgets"
for budget in $budgets; do
	auto "$SEARCH" --devices 4 --keep-train --memory $budget
	[ "$rc" = 0 ] || fail "autoshard at $budget: exit status $rc: $(cat "$tmp/err")"
	check "optimum at $budget" "a['found'] and best($budget) is not None
(a['pipeline']['stages'], a['pipeline']['microbatches']) == best($budget)[:2]
abs(a['step_time_overlapped_s'] - best($budget)[2]) <= 1e-12 and a['peak_bytes'] == best($budget)[3] <= $budget
a['mesh'] == {'stage': a['pipeline']['stages'], 'data': 4 // a['pipeline']['stages']} and out['mesh'] == a['mesh']
out['pipeline']['microbatches'] == a['pipeline']['microbatches'] and out['pipeline']['stages'] == 'auto'
c['pipeline']['step_time_s'] == a['step_time_overlapped_s'] and c['pipeline']['peak_bytes'] == a['peak_bytes']
a['pipeline']['runner_up_microbatches'] != a['pipeline']['microbatches']
[r for r in rows if r[0] == a['pipeline']['stages'] and r[1] == a['pipeline']['runner_up_microbatches']][0][2] == a['pipeline']['runner_up_microbatches_step_s']
(a['pipeline']['runner_up_stages'], a['pipeline']['runner_up_stages_microbatches'], a['pipeline']['runner_up_stages_step_s'], a['pipeline']['runner_up_stages_peak_bytes']) == runner(a['pipeline']['stages'], $budget)
a['pipeline']['runner_up_stages_fits'] == (runner(a['pipeline']['stages'], $budget)[3] <= $budget)"
	cp "$tmp/auto.json" "$tmp/at_$budget.json"
done
# each budget moved the answer to more microbatches or more stages
check "budgets force more microbatches or stages" "all((q[0], q[1]) > (p[0], p[1]) for p, q in zip(*(lambda x: (x, x[1:]))([(j['pipeline']['stages'], j['pipeline']['microbatches']) for j in (json.load(open(os.path.join(t, 'at_%s.json' % b))) for b in '$budgets'.split())])))"
"$SPMD" run "$tmp/out.yaml" --steps 2 --check >"$tmp/run" 2>&1 && ! grep -q MISMATCH "$tmp/run" && grep -q ' ok$' "$tmp/run" &&
	pass || fail "training the written plan checked: $(tail -n 5 "$tmp/run")"

# no stage count or microbatch count fits: exit 1, nothing written
rm -f "$tmp/none.yaml"
"$SPMD" autoshard "$SEARCH" --devices 4 --keep-train --memory "$none" -o "$tmp/none.yaml" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 1 ] && grep -q "no plan fits" "$tmp/out" && [ ! -f "$tmp/none.yaml" ] && pass ||
	fail "no plan fits: exit status $rc, $(cat "$tmp/out")"

# more stages than the eight layers fill: a usage error (exit 2, nothing
# written), not "no plan fits"; explore --search says why on that mesh
rm -f "$tmp/none.yaml"
"$SPMD" autoshard "$SEARCH" --mesh stage=16,data=1 -o "$tmp/none.yaml" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 2 ] && grep -q "^spmd: error: expected a mesh with at most 8 stages on the pipeline's axis 'stage' (the model's 8 repeated layers fill 8), found stage=16$" "$tmp/err" &&
	[ ! -s "$tmp/out" ] && [ ! -f "$tmp/none.yaml" ] && pass ||
	fail "autoshard --mesh stage=16,data=1: exit status $rc, $(cat "$tmp/err" "$tmp/out")"
sed -e 's/^mesh: {stage: 4, data: 2}$/mesh: {stage: 4}/' -e 's/, sharding: \[data, null\]//' "$SEARCH" >"$tmp/stage_only.yaml"
"$SPMD" autoshard "$tmp/stage_only.yaml" --devices 16 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 2 ] && grep -q "^spmd: error: expected --devices at most 8: the pipeline's axis 'stage' is the mesh's only axis and the model's 8 repeated layers fill 8 stages, found 16$" "$tmp/err" && pass ||
	fail "autoshard --devices 16 on a stage-only mesh: exit status $rc, $(cat "$tmp/err" "$tmp/out")"
"$SPMD" explore "$tmp/stage_only.yaml" --devices 16 --search --json >"$tmp/ex.json" 2>"$tmp/err" &&
	"$PY" -c "import json, sys; p = json.load(open(sys.argv[1]))['plans']; a = [x['autoshard'] for x in p if 'autoshard' in x]; assert a and all('at most 8 stages' in x['error'] and not x['found'] for x in a)" "$tmp/ex.json" && pass ||
	fail "explore --search past the stages: $(cat "$tmp/err"; head -c 600 "$tmp/ex.json")"

# The schedule and recompute, where the section does not write them, are
# chosen with the count: every (schedule, recompute, microbatches) on
# {stage: 4} priced by spmd cost — interleaved with two virtual stages
# too — and autoshard's choice the fastest within the budget (ties: gpipe,
# 1f1b, interleaved; without recompute before with; the fewer
# microbatches) at a loose budget, at the peak of recompute's rows
# (below every row without it but 1F1B's with many microbatches: recompute
# wins) and below that.
sed -e 's/, schedule: 1f1b, recompute: false//' -e 's/mesh: {stage: 4, data: 2}/mesh: {stage: 4, data: 1}/' \
	"$SEARCH" >"$tmp/open.yaml"
grep -q '^pipeline: {axis: stage, microbatches: 4, stages: auto}$' "$tmp/open.yaml" || fail "the open section: $(grep '^pipeline' "$tmp/open.yaml")"
# sched_rows FILE RECOMPUTES [--hardware H]: every (schedule, recompute, count) priced, into $tmp/FILE
sched_rows() {
	f=$1 res=$2
	shift 2
	rm -f "$tmp/$f"
	for sc in gpipe 1f1b interleaved; do
		for re in $res; do
			for m in 1 2 4 8 16 32; do
				sv=$sc
				if [ $sc = interleaved ]; then # two virtual stages a device: the eight layers allow no more; m a multiple of 4
					[ $((m % 4)) = 0 ] || continue
					sv="$sc, virtual_stages: 2"
				fi
				sed "s/microbatches: 4/microbatches: $m, schedule: $sv, recompute: $re/" "$tmp/open.yaml" >"$tmp/e.yaml"
				"$SPMD" cost "$tmp/e.yaml" "$@" --json >"$tmp/e.json" 2>"$tmp/err" || fail "cost of $sc $re $m: $(cat "$tmp/err")"
				"$PY" -c "import json, sys; j = json.load(open(sys.argv[1]))['pipeline']; print('$sc', '$re', $m, j['step_time_s'], j['peak_bytes'])" \
					"$tmp/e.json" >>"$tmp/$f" || fail "schedule row $sc $re $m"
			done
		done
	done
}
sched_rows sched "false true"
cat >>"$tmp/prelude.py" <<'PYEOF'
sload = lambda name: load(name, lambda f: [(l.split()[0], l.split()[1] == "true", int(l.split()[2]), float(l.split()[3]), float(l.split()[4])) for l in f if l.strip()]) or []
srows = sload("sched")
def sbest(budget, rows=srows):  # (schedule, recompute, m, step, peak) autoshard must choose
    fit = [r for r in rows if r[4] <= budget]
    return min(fit, key=lambda r: (r[3], ["gpipe", "1f1b", "interleaved"].index(r[0]), r[1], r[2])) if fit else None
def pairbest(rows, budget, pair):  # a (schedule, recompute)'s count: fits first, the faster (else the smaller), the fewer
    rs = [r for r in rows if (r[0], r[1]) == pair]
    fit = [r for r in rs if r[4] <= budget]
    return min(fit, key=lambda r: (r[3], r[2])) if fit else min(rs, key=lambda r: (r[4], r[2]))
def srunner(budget, rows=srows):  # the runner-up pair: the best other that prices otherwise
    c = sbest(budget, rows)
    pairs = sorted(set((r[0], r[1]) for r in rows) - {(c[0], c[1])}, key=lambda p: (["gpipe", "1f1b", "interleaved"].index(p[0]), p[1]))
    o = [pairbest(rows, budget, p) for p in pairs]
    o = [r for r in o if (r[2], r[3], r[4]) != (c[2], c[3], c[4])]
    return min(o, key=lambda r: (r[4] > budget, r[3] if r[4] <= budget else r[4])) if o else None
PYEOF
rc_peak=$("$PY" -c "import sys; print(int(max(float(l.split()[4]) for l in open(sys.argv[1]) if l.split()[1] == 'true')))" "$tmp/sched")
for budget in 34359738368 $rc_peak $((rc_peak - 1)); do
	auto "$tmp/open.yaml" --mesh stage=4,data=1 --keep-train --memory $budget
	check "schedule and recompute at $budget" "a['found'] and sbest($budget) is not None
(a['pipeline']['schedule'], a['pipeline']['recompute'], a['pipeline']['microbatches']) == sbest($budget)[:3]
abs(a['step_time_overlapped_s'] - sbest($budget)[3]) <= 1e-12 and a['peak_bytes'] == sbest($budget)[4]
out['pipeline']['schedule'] == a['pipeline']['schedule'] and out['pipeline']['recompute'] == a['pipeline']['recompute']
c['pipeline']['step_time_s'] == a['step_time_overlapped_s'] and c['pipeline']['peak_bytes'] == a['peak_bytes']
$budget != $rc_peak or a['pipeline']['recompute']
(a['pipeline']['runner_up_schedule'], a['pipeline']['runner_up_schedule_recompute'], a['pipeline']['runner_up_schedule_microbatches']) == srunner($budget)[:3]
abs(a['pipeline']['runner_up_schedule_step_s'] - srunner($budget)[3]) <= 1e-12"
done
"$SPMD" run "$tmp/out.yaml" --steps 2 --check >"$tmp/run" 2>&1 && ! grep -q MISMATCH "$tmp/run" && grep -q ' ok$' "$tmp/run" &&
	pass || fail "training the plan with its schedule chosen checked: $(tail -n 5 "$tmp/run")"

# Interleaved is a choice too, cut again into twice the stages: on a slow
# device without fixed costs the bubble is what a schedule saves, and two
# virtual stages a device win (the enumeration above, priced there; within
# the profile's capacity recompute only adds work: without it).
SLOW=$SRC/tests/pipeline/slow_compute.yaml
sched_rows sched_slow false --hardware "$SLOW"
COST_HARDWARE=$SLOW auto "$tmp/open.yaml" --mesh stage=4,data=1 --keep-train --hardware "$SLOW"
check "interleaved chosen" "a['found'] and a['pipeline']['schedule'] == 'interleaved' and a['pipeline']['virtual_stages'] == 2
(a['pipeline']['schedule'], a['pipeline']['recompute'], a['pipeline']['microbatches']) == sbest(1e30, sload('sched_slow'))[:3]
out['pipeline']['schedule'] == 'interleaved' and out['pipeline']['virtual_stages'] == 2 and out['pipeline']['stages'] == 'auto'
c['pipeline']['step_time_s'] == a['step_time_overlapped_s'] and c['pipeline']['peak_bytes'] == a['peak_bytes']"
"$SPMD" autoshard "$tmp/open.yaml" --mesh stage=4,data=1 --keep-train --hardware "$SLOW" 2>/dev/null |
	grep -q '^step .* s scheduled: 4 stages (stages: auto), interleaved (2 virtual stages a device), [0-9]* microbatches;' && pass ||
	fail "the text report of interleaved"
"$SPMD" run "$tmp/out.yaml" --steps 2 --check >"$tmp/run" 2>&1 && ! grep -q MISMATCH "$tmp/run" && grep -q ' ok$' "$tmp/run" &&
	pass || fail "training the interleaved plan checked: $(tail -n 5 "$tmp/run")"

# --mesh with the stage axis given keeps it (and with it one stage, no pipeline: every count the same step)
for p in 2 1; do
	auto "$SEARCH" --mesh stage=$p,data=$((4 / p)) --keep-train
	check "--mesh stage=$p" "a['found'] and a['mesh'] == {'stage': $p, 'data': 4 // $p} and a['pipeline']['stages'] == $p
a['step_time_overlapped_s'] == min(r[2] for r in rows if r[0] == $p) and 'runner_up_stages' not in a['pipeline']
c['pipeline']['step_time_s'] == a['step_time_overlapped_s'] and c['pipeline']['stages'] == $p"
	"$SPMD" run "$tmp/out.yaml" --steps 2 --check >"$tmp/run" 2>&1 && ! grep -q MISMATCH "$tmp/run" && pass ||
		fail "training the plan on stage=$p checked: $(tail -n 5 "$tmp/run")"
done

# The example, shardings searched too: on its own stage count its stage:
# keys are kept; with --devices 8 every stage count is searched, the plan
# written reproduces its price and trains checked.
auto "$EXAMPLE" --mesh stage=4,data=2
check "the example's stages kept" "a['found'] and a['pipeline']['stages'] == 4 and not a['pipeline']['stages_auto']
'stages' not in out['pipeline'] and sum('stage' in o for o in out['ops']) == sum('stage' in o for o in yaml.safe_load(open('$EXAMPLE'))['ops']) > 0
c['pipeline']['step_time_s'] == a['step_time_overlapped_s'] and c['pipeline']['peak_bytes'] == a['peak_bytes']"
auto "$EXAMPLE" --devices 8
check "the example on 8 devices" "a['found'] and a['mesh']['stage'] * a['mesh']['data'] == 8 and 'runner_up_stages' in a['pipeline']
c['pipeline']['step_time_s'] == a['step_time_overlapped_s'] and c['pipeline']['peak_bytes'] == a['peak_bytes']
c['pipeline']['microbatches'] == a['pipeline']['microbatches'] and c['pipeline']['stages'] == a['mesh']['stage']"
"$SPMD" run "$tmp/out.yaml" --steps 2 --check >"$tmp/run" 2>&1 && ! grep -q MISMATCH "$tmp/run" && pass ||
	fail "training the example's plan checked: $(tail -n 5 "$tmp/run")"
# the same plan on MPI, one rank per device, equal to the threads' to the byte
# (one step: its communication is all there)
if command -v mpirun >/dev/null 2>&1; then
	. "$SRC/tests/mpi_lib.sh"
	MPI_TEST_TIMEOUT=${MPI_TEST_TIMEOUT:-300} # 8 ranks of the sanitizer build on two shared cores: minutes
	mkdir -p "$tmp/mpi"
	mesh=$("$PY" -c "import json, sys; print(','.join('%s=%d' % kv for kv in json.load(open(sys.argv[1]))['mesh'].items()))" "$tmp/auto.json")
	mpi_matches "$tmp/out.yaml" "$mesh" 8 1 "$tmp/mpi" && pass || fail "the example's plan on MPI: $(tail -n 3 "$tmp/mpi/out")"
fi
"$SPMD" autoshard "$EXAMPLE" --devices 8 --explain >"$tmp/text" 2>/dev/null &&
	grep -q '^step .* s scheduled: [0-9]* stages\{0,1\}.*, [0-9]* microbatches; peak [0-9]* bytes with the activations in flight$' "$tmp/text" &&
	grep -q '^runner-up microbatches: ' "$tmp/text" && grep -q '^runner-up stages: ' "$tmp/text" && pass ||
	fail "the text report: $(head -n 6 "$tmp/text")"

echo "autoshard_pipe_test: $passes passed, $fails failed"
[ "$fails" = 0 ]
