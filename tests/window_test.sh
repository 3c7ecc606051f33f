#!/bin/sh
# window_test.sh SPMD SOURCE_DIR: collective matmul (partitioner/window.h).
# Where the cost model on the mesh's hardware expects it to gain, the
# all_gathers and reduce_scatters next to einsums become blocks passed
# round the ring with an einsum per block, and all_reduces of an einsum's
# sums blocks all_reduced one by one; the program written, priced and
# run is that one, and it computes what the reference does: trained, read
# back from its file, on a grid, on uneven shapes, without a train:
# section, on MPI ranks, sent both ways round a closed ring.  Where it
# would not gain (the small model on TPU v4s; the thread backend's
# profile) the program is left as partitioned, and the reports say why.
SPMD=$1
SRC=$2
. "$SRC/tests/script_setup.sh"
GEN=$(dirname "$SPMD")/bench/gen_transformer
T=$tmp
PROFILE=$SRC/tests/window/matmul_bound.yaml
. "$SRC/tests/assert_lib.sh"
# model LAYERS MESH BATCH SEQ HARDWARE [GEN ARGS]: a decoder with tensor
# and sequence parallelism (d_model 64) into $T/m.yaml, its mesh on HARDWARE
model() {
	layers=$1 mesh=$2 batch=$3 seq=$4 hw=$5
	shift 5
	"$GEN" "$layers" "$mesh" "$batch" --dmodel 64 --seq "$seq" --vocab 128 --plan batch,tp,sp "$@" |
		sed "s|^mesh: {\([^}]*\)}$|mesh: {axes: {\1}, hardware: $hw}|" >"$T/m.yaml"
}
# check NAME [RUN ARGS]: $T/m.yaml run on threads against the reference
check() {
	name=$1
	shift
	if "$SPMD" run "$T/m.yaml" --check "$@" >"$T/run" 2>&1; then ok; else bad "$name: $(grep -v ' ok$' "$T/run" | head -5)"; fi
}

# 1. A training step on 4 devices of a profile where einsums take long:
# gathers and scatters both taken, the step faster, priced as spmd cost
# prices it, the program listing its sends and rolls.
model 2 1x4 1x4 32 "$PROFILE" --train
rm -f "$T/prog.yaml"
"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "partition: $(cat "$T/err")"
"$SPMD" cost "$T/m.yaml" --json >"$T/c.json" 2>"$T/err" || bad "cost: $(cat "$T/err")"
py "training step: overlapped, faster, priced alike" \
	"j['collective_matmul']['overlapped'] and j['collective_matmul']['hardware'] == 'matmul_bound'" \
	"j['collective_matmul']['all_gathers'] > 0 and j['collective_matmul']['reduce_scatters'] > 0" \
	"j['collective_matmul']['einsums'] >= j['collective_matmul']['all_gathers'] + j['collective_matmul']['reduce_scatters']" \
	"j['collective_matmul']['step_overlapped_s'] < 0.99 * j['collective_matmul']['step_s']" \
	"sorted(c['collective_matmul']) == sorted(j['collective_matmul'])" \
	"all(abs(v - j['collective_matmul'][k]) <= 1e-12 * abs(v) if isinstance(v, float) else v == j['collective_matmul'][k] for k, v in c['collective_matmul'].items())" \
	"abs(c['step_time_overlapped_s'] - (j['step_order']['step_hoisted_s'] if j['step_order']['step_hoisted_s'] is not None else j['step_order']['step_moved_s'] if j['step_order']['moved'] else j['collective_matmul']['step_overlapped_s'])) <= 1e-12 * c['step_time_overlapped_s']"
# the program: a ring of 4 is 3 sends per block chain, each collective_permute
# one step round the model axis (-1 is written 3); rolls by the device's place on it
py "training step: the program's sends and rolls" \
	"sum(o['op'] == 'collective_permute' for o in prog['ops']) >= 3 * (j['collective_matmul']['all_gathers'] + j['collective_matmul']['reduce_scatters'])" \
	"all(o['axes'] == ['model'] and o['shift'] in (1, 3) for o in prog['ops'] if o['op'] == 'collective_permute')" \
	"sum(o['op'] == 'shard_roll' for o in prog['ops']) >= j['collective_matmul']['einsums']" \
	"all('collective matmul' in o['why'] for o in prog['ops'] if o['op'] == 'collective_permute')"
"$SPMD" partition "$T/m.yaml" >"$T/text" 2>&1 && grep -q "^collective matmul: [0-9]* all_gathers* and [0-9]* reduce_scatters* overlapped with the [0-9]* einsums next to them" "$T/text" && ok ||
	bad "partition: no collective matmul line: $(tail -3 "$T/text")"
"$SPMD" cost "$T/m.yaml" >"$T/text" 2>&1 && grep -q "^collective matmul: .* overlapped with" "$T/text" && ok ||
	bad "cost: no collective matmul line: $(tail -3 "$T/text")"
check "training step, two steps" --steps 2

# 2. The program written reads back and runs as the one partitioned in
# memory: the same bits.
# same_bits NAME: $T/prog.yaml, read back, computes $T/m.yaml's bits
same_bits() {
	rm -rf "$T/a" "$T/b"
	mkdir -p "$T/a" "$T/b"
	if OPENBLAS_NUM_THREADS=1 "$SPMD" run "$T/m.yaml" --save "$T/a" >/dev/null 2>"$T/err" &&
		OPENBLAS_NUM_THREADS=1 "$SPMD" run "$T/prog.yaml" --save "$T/b" >/dev/null 2>>"$T/err"; then
		same=yes
		for f in "$T"/a/*.npy; do cmp -s "$f" "$T/b/$(basename "$f")" || same="no: $(basename "$f")"; done
		[ "$same" = yes ] && ok || bad "$1: the program read back computes otherwise: $same"
	else
		bad "$1: run: $(cat "$T/err")"
	fi
}
same_bits "training step"
"$SPMD" partition "$T/m.yaml" --per-device "$T/dev" >/dev/null 2>"$T/err" && "$SPMD" verify "$T/dev" >"$T/err" 2>&1 && ok ||
	bad "verify: $(cat "$T/err")"

# 3. A data x model grid: the rings are the model axis within each replica.
model 2 2x4 2x4 32 "$PROFILE" --train
"$SPMD" partition "$T/m.yaml" --json >"$T/p.json" 2>"$T/err" || bad "grid: $(cat "$T/err")"
py "grid: overlapped" "j['collective_matmul']['overlapped']"
check "grid"

# 4. Uneven shapes: a sequence of 30 on 4 devices (blocks of 8, padded) and
# a batch of 3 on 2 replicas; what is taken must still be exact.
model 2 2x4 3x4 30 "$PROFILE" --train
check "uneven"

# 5. A model without a train: section.
model 2 1x4 1x4 32 "$PROFILE"
"$SPMD" partition "$T/m.yaml" --json >"$T/p.json" 2>"$T/err" || bad "inference: $(cat "$T/err")"
py "inference: overlapped" "j['collective_matmul']['overlapped']" "'step_order' not in j"
check "inference"

# 6. A closed ring whose ring collectives send both ways: a gather's
# blocks go both ways, n/2 steps of two sends (block c + k from c + 1 and
# c - k from c - 1; -1 is written 7 on 8 devices), and so do a scatter's
# partial sums (4 steps one way, 3 the other and a last send); two
# training steps compute what the reference does.
model 2 1x8 1x8 64 "$SRC/tests/window/matmul_bound_torus.yaml" --train
"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "ring: $(cat "$T/err")"
py "closed ring: gathers and scatters sent both ways" \
	"j['collective_matmul']['overlapped'] and j['collective_matmul']['all_gathers'] > 0" \
	"j['collective_matmul']['reduce_scatters'] > 0" \
	"sum(o['op'] == 'collective_permute' and o['shift'] == 7 for o in prog['ops']) == 4 * j['collective_matmul']['all_gathers'] + 3 * j['collective_matmul']['reduce_scatters']" \
	"sum(o['op'] == 'collective_permute' and o['shift'] == 1 for o in prog['ops']) == 3 * j['collective_matmul']['all_gathers'] + 4 * j['collective_matmul']['reduce_scatters']"
check "closed ring: two training steps" --steps 2

# 6b. Tensor parallelism without sequence parallelism: each row-parallel
# projection's partial sums (the MLP's with its bias share added) are
# all_reduced.  Split into 2 to 4 blocks of the sequence (as many as the
# estimate finds best), each block's sums all_reduced while the next
# block is einsummed: faster, priced alike, the program lists one
# all_reduce per block of each split one, the blocks covering the
# sequence, the first ones longer where it does not divide (a sequence of
# 5 in 2 blocks: 3 and 2), read back and run.
# reduce_model SEQ: the decoder with plan batch,tp on 4 devices into $T/m.yaml
reduce_model() {
	"$GEN" 2 1x4 1x4 --dmodel 64 --seq "$1" --vocab 128 --plan batch,tp --train |
		sed "s|^mesh: {\([^}]*\)}$|mesh: {axes: {\1}, hardware: $PROFILE}|" >"$T/m.yaml"
}
for seq in 32 5; do
	reduce_model $seq
	rm -f "$T/prog.yaml"
	"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "all_reduce: $(cat "$T/err")"
	"$SPMD" cost "$T/m.yaml" --json >"$T/c.json" 2>"$T/err" || bad "all_reduce cost: $(cat "$T/err")"
	py "all_reduces in blocks (sequence $seq): faster, priced alike, in the program" \
		"j['collective_matmul']['overlapped'] and j['collective_matmul']['all_reduces'] == 4" \
		"j['collective_matmul']['step_overlapped_s'] < j['collective_matmul']['step_s']" \
		"'4 all_reduces overlapped with the 4 einsums next to them' in j['collective_matmul']['reason']" \
		"all(abs(v - j['collective_matmul'][k]) <= 1e-12 * abs(v) if isinstance(v, float) else v == j['collective_matmul'][k] for k, v in c['collective_matmul'].items())" \
		"all(2 <= sum(o['op'] == 'all_reduce' and o['out'].startswith(v + '%') for o in prog['ops']) <= 4 for v in ('l0.attn', 'l0.f2b', 'l1.attn', 'l1.f2b'))" \
		"sum(o['op'] == 'all_reduce' and 'collective matmul' in o['why'] for o in prog['ops']) == sum(o['op'] == 'all_reduce' and o['out'].split('%')[0] in ('l0.attn', 'l0.f2b', 'l1.attn', 'l1.f2b') for o in prog['ops'])" \
		"sum(o['global'][1] for o in prog['ops'] if o['op'] == 'all_reduce' and o['out'].startswith('l0.f2b%')) == $seq" \
		"[o['global'][1] for o in prog['ops'] if o['op'] == 'all_reduce' and o['out'].startswith('l0.f2b%')] == sorted((o['global'][1] for o in prog['ops'] if o['op'] == 'all_reduce' and o['out'].startswith('l0.f2b%')), reverse=True)" \
		"max(o['global'][1] for o in prog['ops'] if o['op'] == 'all_reduce' and o['out'].startswith('l0.f2b%')) - min(o['global'][1] for o in prog['ops'] if o['op'] == 'all_reduce' and o['out'].startswith('l0.f2b%')) == (0 if $seq == 32 else 1)"
	check "all_reduces in blocks (sequence $seq): two training steps" --steps 2
	same_bits "all_reduces in blocks (sequence $seq)"
	# 6c. The ops after each all_reduce take its blocks too: the residual
	# add, the norm and the next projections run on block k while block
	# k + 1 is all_reduced (the first blocks' layer_norm before the last
	# block's all_reduce); the chain after the attention's all_reduce ends
	# at the MLP's, whose einsum reads the gelu's blocks (no slice of l0.g),
	# and the chain after it reads the attention chain's blocks of the
	# residual stream (no slice of l0.y); the values read whole after them
	# (the attention's q, the backward's) concatenated.
	py "the ops after the all_reduces in blocks (sequence $seq)" \
		"j['collective_matmul']['chained_ops'] > 0" \
		"'ops after the all_reduces in their blocks' in j['collective_matmul']['reason']" \
		"[o['op'] for o in prog['ops']].index('layer_norm') < max(i for i, o in enumerate(prog['ops']) if o['op'] == 'all_reduce' and o['out'].startswith('l0.attn%'))" \
		"not any(o['op'] == 'slice' and o['in'][0] in ('l0.g', 'l0.y', 'l1.g') for o in prog['ops'])" \
		"sum(o['op'] == 'concat' and o['out'] in ('l1.q', 'l1.k', 'l1.v', 'l0.y', 'l0.z') for o in prog['ops']) == 5" \
		"sum(o['op'] == 'layer_norm' and o['in'][0].startswith('l0.y%') for o in prog['ops']) == sum(o['op'] == 'all_reduce' and o['out'].startswith('l0.attn%') for o in prog['ops'])"
done

# 6d. On slower links the all_reduces take more blocks, each paying the
# all_reduce's latency again but hiding more of it: on links four times
# slower 4 (a sequence of 7: blocks of 2, 2, 2 and 1), twice slower 3
# (3, 2, 2).  The MLP's einsum reads the attention chain's blocks of the
# gelu, so it takes as many; the ops after them run in those blocks;
# trained and checked, read back and run alike.
for bw in 5e7:2,2,2,1 1e8:3,2,2; do
	sed "s/link_bandwidth: 5e7/link_bandwidth: ${bw%%:*}/" "$SRC/tests/window/reduce_bound.yaml" >"$T/links.yaml"
	"$GEN" 2 1x4 1x4 --dmodel 64 --seq 7 --vocab 128 --plan batch,tp --train |
		sed "s|^mesh: {\([^}]*\)}$|mesh: {axes: {\1}, hardware: $T/links.yaml}|" >"$T/m.yaml"
	rm -f "$T/prog.yaml"
	"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "more blocks: $(cat "$T/err")"
	py "more blocks on slower links (${bw%%:*} B/s: ${bw#*:})" \
		"j['collective_matmul']['overlapped'] and j['collective_matmul']['chained_ops'] > 0" \
		"all([o['global'][1] for o in prog['ops'] if o['op'] == 'all_reduce' and o['out'].startswith(v + '%')] == [${bw#*:}] for v in ('l0.attn', 'l0.f2b', 'l1.attn', 'l1.f2b'))" \
		"sum(o['op'] == 'layer_norm' and o['in'][0].startswith('l0.y%') for o in prog['ops']) == len([${bw#*:}])" \
		"not any(o['op'] == 'slice' and o['in'][0] in ('l0.g', 'l0.y', 'l1.g') for o in prog['ops'])"
	check "more blocks (${bw#*:}): two training steps" --steps 2
	same_bits "more blocks (${bw#*:})"
done

# 7. On TPU v4s (a torus: its ring collectives send both ways round the
# ring) the small model's blocks cost more kernel overhead than their
# sends hide: nothing is taken, and the report says so.
model 2 1x4 1x4 32 tpu-v4 --train
"$SPMD" partition "$T/m.yaml" --json -o "$T/prog.yaml" >"$T/p.json" 2>"$T/err" || bad "tpu: $(cat "$T/err")"
py "tpu-v4: left as partitioned" \
	"'collective_matmul' not in j or not j['collective_matmul']['overlapped']" \
	"not any(o['op'] in ('shard_roll', 'collective_permute') for o in prog['ops'])"

# 8. The thread backend's profile: nothing overlaps there, the pass does not run.
model 2 1x4 1x4 32 "$SRC/tests/window/threads.yaml" --train
"$SPMD" partition "$T/m.yaml" --json >"$T/p.json" 2>"$T/err" || bad "threads: $(cat "$T/err")"
py "threads profile: not looked at" "'collective_matmul' not in j"

# 9. MPI: one rank per device, as the threads compute (tests/mpi_lib.sh).
if [ -z "$SPMD_SANITIZED" ] && command -v mpirun >/dev/null 2>&1; then
	. "$SRC/tests/mpi_lib.sh"
	model 2 1x4 1x4 32 "$PROFILE" --train
	mkdir -p "$T/mpi"
	mpi_matches "$T/m.yaml" data=1,model=4 4 2 "$T/mpi" && ok || bad "mpi: $(tail -5 "$T/mpi/out")"
	reduce_model 5 # all_reduces in uneven blocks, the ops after them too
	mpi_matches "$T/m.yaml" data=1,model=4 4 2 "$T/mpi" && ok || bad "mpi, all_reduces: $(tail -5 "$T/mpi/out")"
fi

echo "window_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
