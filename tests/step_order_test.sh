#!/bin/sh
# step_order_test.sh SPMD SOURCE_DIR: a training step's gradient reductions
# and weight updates moved into the backward pass (partitioner/order.h):
# where the cost model on the mesh's hardware calls it faster, the program
# written, priced and run is the moved one; it computes what the reference
# does; it is left as built where that is no faster, its peak would grow,
# or collectives cannot overlap compute (the thread backend's profile).
SPMD=$1
SRC=$2
. "$SRC/tests/script_setup.sh"
GEN=$(dirname "$SPMD")/bench/gen_transformer
T=$tmp
. "$SRC/tests/assert_lib.sh"
# model PLAN HARDWARE [GEN ARGS]: a 2-layer decoder on 4 devices into $T/m.yaml, its mesh on HARDWARE
model() {
	plan=$1 hw=$2
	shift 2
	"$GEN" 2 4x1 4x2 --dmodel 128 --seq 64 --vocab 4096 --train --plan "$plan" "$@" |
		sed "s|^mesh: {\([^}]*\)}$|mesh: {axes: {\1}, hardware: $hw}|" >"$T/m.yaml"
}

# 1. Data parallel on TPU v4s: the gradients' reductions were all issued
# after the backward pass (each at its reader, the update); moved to where
# each gradient is made, they overlap the rest of the backward pass.
model batch tpu-v4
rm -f "$T/prog.yaml"
"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "partition: $(cat "$T/err")"
"$SPMD" cost "$T/m.yaml" --json >"$T/c.json" 2>"$T/err" || bad "cost: $(cat "$T/err")"
py "data parallel: moved, faster, priced as spmd cost prices it" \
	"j['step_order']['moved'] and j['step_order']['hardware'] == 'tpu-v4' and j['step_order']['gradients_moved'] > 0" \
	"j['step_order']['step_moved_s'] < 0.95 * j['step_order']['step_s']" \
	"j['step_order']['peak_moved_bytes'] <= 1.01 * j['step_order']['peak_bytes']" \
	"abs(c['step_time_overlapped_s'] - (j['step_order']['step_hoisted_s'] or j['step_order']['step_moved_s'])) <= 1e-12 * c['step_time_overlapped_s']" \
	"all(abs(v - j['step_order'][k]) <= 1e-12 * abs(v) if isinstance(v, float) else v == j['step_order'][k] for k, v in c['step_order'].items())" \
	"sorted(c['step_order']) == sorted(j['step_order'])"
# in the program written: a reduced gradient made before the last op of the backward pass
py "data parallel: a gradient reduced before the backward pass ends" \
	"[i for i, o in enumerate(prog['ops']) if o['out'].endswith('%grad') and o['op'] == 'all_reduce'][0] < max(i for i, o in enumerate(prog['ops']) if o['out'].startswith('d%') and o['op'] == 'einsum')"
"$SPMD" partition "$T/m.yaml" >"$T/text" 2>&1 && grep -q "^step order: [0-9]* ops moved into the backward pass" "$T/text" && ok ||
	bad "the listing says what moved: $(tail -1 "$T/text")"
# the sanitizer build runs one step (its einsums are slow) and skips the unmoved runs below
steps=2
[ -n "$SPMD_SANITIZED" ] && steps=1
"$SPMD" run "$T/m.yaml" --steps $steps --check >"$T/run" 2>&1 && ok || bad "run --check of the moved step: $(tail -3 "$T/run")"

# 2. With weight-update sharding on TPU v4s the moved step is faster, but
# its peak would grow by more than 1%: left as built, and the listing says so
model batch,wus tpu-v4
"$SPMD" partition "$T/m.yaml" --json >"$T/p.json" 2>"$T/err" || bad "partition: $(cat "$T/err")"
py "wus: left as built, its peak would grow" "not j['step_order']['moved']" \
	"j['step_order']['step_moved_s'] < j['step_order']['step_s']" \
	"j['step_order']['peak_moved_bytes'] > 1.01 * j['step_order']['peak_bytes']" \
	"'the peak would be' in j['step_order']['reason']"
if [ -z "$SPMD_SANITIZED" ]; then
	"$SPMD" run "$T/m.yaml" --steps 2 --check >"$T/run" 2>&1 && ok || bad "run --check (wus): $(tail -3 "$T/run")"
fi

# 2b. A data x model grid, Megatron with sequence parallelism and
# weight-update sharding on H100s: the moved tail interleaves with the
# backward pass's own collectives (tensor- and sequence-parallel); the
# moved step computes what the reference does (the release build: the
# sanitizers' run covers the moved path in 1.)
if [ -z "$SPMD_SANITIZED" ]; then
	"$GEN" 2 2x2 4x2 --dmodel 128 --seq 64 --vocab 2048 --train --plan batch,tp,sp,wus |
		sed "s|^mesh: {\([^}]*\)}$|mesh: {axes: {\1}, hardware: h100-nvlink}|" >"$T/m.yaml"
	"$SPMD" partition "$T/m.yaml" --json >"$T/p.json" 2>"$T/err" || bad "partition (grid): $(cat "$T/err")"
	py "grid with sequence parallelism: moved" "j['step_order']['moved'] and j['step_order']['gradients_moved'] > 0"
	"$SPMD" run "$T/m.yaml" --steps 2 --check >"$T/run" 2>&1 && ok || bad "run --check (grid): $(tail -3 "$T/run")"
fi

# 3. Data x model with weight-update sharding and global-norm clipping on
# H100s: every update waits for the norm of every gradient; what moves
# moves before it, and the step still computes what the reference does
"$GEN" 2 2x2 4x2 --dmodel 128 --seq 32 --vocab 512 --train --plan batch,tp,wus |
	sed -e "s/^mesh: {\([^}]*\)}$/mesh: {axes: {\1}, hardware: h100-nvlink}/" \
		-e "s/^  weight_update_sharding: on/  weight_update_sharding: on\n  clip_global_norm: 1.0/" >"$T/m.yaml"
grep -q clip_global_norm "$T/m.yaml" || bad "the clipped model has no clip_global_norm"
"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "partition (clipped): $(cat "$T/err")"
py "clipped: no param updated before the last gradient" "j['step_order']['moved'] is False or j['step_order']['params_moved'] == 0"
"$SPMD" run "$T/m.yaml" --steps $steps --check >"$T/run" 2>&1 && ok || bad "run --check (clipped): $(tail -3 "$T/run")"

# 3b. A vocabulary-parallel embedding on TPU v4s (its rows over model,
# the batch over model from the labels, the other params whole with
# weight-update sharding): at the end of the backward pass the
# embedding's gradient waits for the gather of its input's gradient, and
# the updates the rounds placed before the op feeding that gather move
# into the wait; the program priced is the one spmd cost prices, and it
# computes what the reference does
"$GEN" 4 1x4 4x2 --dmodel 128 --seq 512 --vocab 4096 --train --plan none |
	sed -e "s|^mesh: {\([^}]*\)}$|mesh: {axes: {\1}, hardware: tpu-v4}|" \
		-e 's|^  ids: {\(.*\)}$|  ids: {\1, sharding: [null, null]}|' \
		-e 's|^  labels: {\(.*\)}$|  labels: {\1, sharding: [model, null]}|' \
		-e 's|^  embed: {\(.*\)}$|  embed: {\1, sharding: [model, null], weight_update_sharding: off}|' \
		-e 's|^  weight_update_sharding: off|  weight_update_sharding: on|' >"$T/m.yaml"
"$SPMD" partition "$T/m.yaml" --json >"$T/p.json" 2>"$T/err" || bad "partition (vocabulary-parallel): $(cat "$T/err")"
"$SPMD" cost "$T/m.yaml" --json >"$T/c.json" 2>"$T/err" || bad "cost (vocabulary-parallel): $(cat "$T/err")"
py "vocabulary-parallel: a wait filled, priced as spmd cost prices it" \
	"j['step_order']['moved'] and j['step_order']['waits_filled'] == 1 and 0 < j['step_order']['ops_filled'] <= j['step_order']['ops_moved']" \
	"'into 1 wait of the compute stream' in j['step_order']['reason']" \
	"abs(c['step_time_overlapped_s'] - (j['step_order']['step_hoisted_s'] or j['step_order']['step_moved_s'])) <= 1e-12 * c['step_time_overlapped_s']"
"$SPMD" run "$T/m.yaml" --steps $steps --check >"$T/run" 2>&1 && ok || bad "run --check (filled): $(tail -3 "$T/run")"

# 3c. Collectives the compute stream waits for, hoisted: a grid with
# sequence parallelism recomputing selectively on TPU v4s makes its norms
# again in the backward and gathers them over the model axis just before
# the weight's gradient that reads them; the step waits for each gather.
# Hoisted with the norm made again, each gather runs under the einsums
# before it: the step is faster, spmd cost prices the same program, and in
# the program written a recomputed norm's gather comes before an einsum
# that its reader follows.  The run checks the hoisted step (the
# sanitizers' run: a smaller one, whose embedding gradient's gather is
# hoisted)
hoisted() { # GEN ARGS: the grid recomputing selectively on TPU v4s into $T/m.yaml
	"$GEN" "$@" --vocab 1024 --train --plan batch,tp,sp |
		sed -e "s|^mesh: {\([^}]*\)}$|mesh: {axes: {\1}, hardware: tpu-v4}|" \
			-e 's|^  weight_update_sharding: off|  weight_update_sharding: off\n  recompute: selective|' >"$T/m.yaml"
	rm -f "$T/prog.yaml"
	"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "partition (hoisted): $(cat "$T/err")"
	"$SPMD" cost "$T/m.yaml" --json >"$T/c.json" 2>"$T/err" || bad "cost (hoisted): $(cat "$T/err")"
}
hoisted 1 2x2 4x2 --dmodel 512 --seq 256
py "recomputed norms' gathers hoisted, priced as spmd cost prices it" \
	"j['step_order']['collectives_hoisted'] >= 2 and j['step_order']['ops_hoisted'] > 0" \
	"j['step_order']['step_hoisted_s'] < (j['step_order']['step_moved_s'] if j['step_order']['moved'] else j['step_order']['step_s'])" \
	"j['step_order']['peak_hoisted_bytes'] <= 1.01 * j['step_order']['peak_bytes']" \
	"'issued sooner' in j['step_order']['reason']" \
	"abs(c['step_time_overlapped_s'] - (j['step_order']['step_put_off_s'] or j['step_order']['step_hoisted_s'])) <= 1e-12 * c['step_time_overlapped_s']" \
	"len([i for i, o in enumerate(prog['ops']) if o['op'] == 'all_gather' and any('%re' in x for x in o['in']) and any(prog['ops'][k]['op'] == 'einsum' for k in range(i + 1, min(r for r, p in enumerate(prog['ops']) if o['out'] in p['in'])))]) >= 2"
# 3d. Last, updates that then wait for their gradients' collectives (the
# hoisted gathers hold the links their reductions need) are put off past
# the ops that fill the waits, with the ops reading them: faster again,
# and priced as spmd cost prices it.  The run below checks this program.
py "updates' waits put off after the hoist" \
	"j['step_order']['waits_put_off'] >= 1 and j['step_order']['ops_put_off'] >= j['step_order']['waits_put_off']" \
	"j['step_order']['step_put_off_s'] < j['step_order']['step_hoisted_s']" \
	"j['step_order']['peak_put_off_bytes'] <= 1.01 * j['step_order']['peak_bytes']" \
	"'put off, with the' in j['step_order']['reason']" \
	"abs(c['step_time_overlapped_s'] - j['step_order']['step_put_off_s']) <= 1e-12 * c['step_time_overlapped_s']"
if [ -z "$SPMD_SANITIZED" ]; then
	"$SPMD" run "$T/m.yaml" --steps 1 --check >"$T/run" 2>&1 && ok || bad "run --check (hoisted): $(tail -3 "$T/run")"
else
	hoisted 2 2x2 4x2 --dmodel 128 --seq 64
	py "a gradient's gather hoisted" "j['step_order']['collectives_hoisted'] >= 1"
	"$SPMD" run "$T/m.yaml" --steps 1 --check >"$T/run" 2>&1 && ok || bad "run --check (hoisted, small): $(tail -3 "$T/run")"
fi

# 4. The thread backend's profile: collectives run on the device's own
# thread, nothing overlaps, the step is left as built and not reported
printf 'name: local\ncompute: {f32: 1e10}\nmemory: {bandwidth: 1e10, capacity: 1e10}\ninterconnect: {topology: threads, dims: [4], link_bandwidth: 1e10, latency: 1e-6}\n' >"$T/threads.yaml"
model batch "$T/threads.yaml"
"$SPMD" partition "$T/m.yaml" --json >"$T/p.json" 2>"$T/err" || bad "partition (threads): $(cat "$T/err")"
py "threads: not reordered" "'step_order' not in j"

# 5. An inference model has no step to order
"$SPMD" partition "$SRC/examples/mlp.yaml" --json >"$T/p.json" 2>"$T/err" || bad "partition (mlp): $(cat "$T/err")"
py "inference: no step order" "'step_order' not in j"

echo "step_order_test: $pass passed, $fail failed"
[ "$fail" = 0 ]
