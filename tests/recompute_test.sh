#!/bin/sh
# recompute_test.sh SPMD SOURCE_DIR: `recompute: true` and `selective` in a
# train: section (train/train.c).  The backward reads the forward's results
# from copies made in the backward, but for the checkpoints (the leaves and
# the residual stream, the operands of layer_norm), and with selective but
# for those that cost more than 512 FLOPs an element to make again; the
# step computes what the reference does on any mesh, with weight-update
# sharding, before_use, bf16 gradients and clipping; the peak falls and the
# compute grows by about one forward pass (selective: by less, the peak by
# less); bad values and a pipelined model are errors.
SPMD=$1
SRC=$2
. "$SRC/tests/script_setup.sh"
T=$tmp
. "$SRC/tests/assert_lib.sh"
GEN=$(dirname "$SPMD")/bench/gen_transformer

# with_train FILE LINES: FILE's train: section with LINES added after its loss
with_train() {
	sed "s/^  loss: \(.*\)$/  loss: \1$2/" "$1"
}

# same_bits MODEL DIR WHAT: two steps of MODEL save what two of the example
# transformer without recompute saved (in $T/a): the same bits
same_bits() {
	mkdir -p "$2"
	if OPENBLAS_NUM_THREADS=1 "$SPMD" run "$1" --steps 2 --save "$2" >/dev/null 2>&1; then
		same=yes
		for f in "$T"/a/*.npy; do cmp -s "$f" "$2/$(basename "$f")" || same="no: $(basename "$f")"; done
		[ "$same" = yes ] && ok || bad "$3 changes the step's results: $same"
	else
		bad "$3: run with --save failed"
	fi
}

# copied YES WHAT VALUES...: whether each value has a copy made in the
# backward (NAME%re) in the listing $T/list is YES (yes or no)
copied() {
	want=$1 what=$2
	shift 2
	for v in "$@"; do
		if grep -q "^  $v%re *=" "$T/list"; then has=yes; else has=no; fi
		[ "$has" = "$want" ] && ok || bad "$what: $v made again: $has"
	done
}

# 1. Exact: the example transformer, on meshes that divide and that do not,
# and with what the train: section offers beside it.
with_train "$SRC/examples/train_transformer.yaml" "\n  recompute: true" >"$T/tt.yaml"
for mesh in data=2,model=2 data=3,model=1 data=1,model=4 data=4,model=2; do
	if "$SPMD" run "$T/tt.yaml" --steps 3 --check --mesh $mesh >"$T/out" 2>&1; then ok
	else bad "recompute on mesh $mesh: $(grep -v ' ok$' "$T/out" | tail -3)"; fi
done
for extra in "\n  weight_update_sharding: on" "\n  weight_update_sharding: on\n  all_gather: before_use\n  group_bytes: 0" \
	"\n  grad_dtype: bf16" "\n  clip_global_norm: 0.5"; do
	with_train "$T/tt.yaml" "$extra" >"$T/tt2.yaml"
	if "$SPMD" run "$T/tt2.yaml" --steps 2 --check --mesh data=2,model=2 >"$T/out" 2>&1; then ok
	else bad "recompute with$(printf '%b' "$extra" | tr '\n' ' '): $(grep -v ' ok$' "$T/out" | tail -3)"; fi
done
# the same bits as without: the copies compute what the forward did
mkdir -p "$T/a"
OPENBLAS_NUM_THREADS=1 "$SPMD" run "$SRC/examples/train_transformer.yaml" --steps 2 --save "$T/a" >/dev/null 2>&1 ||
	bad "run with --save failed"
same_bits "$T/tt.yaml" "$T/b" recompute

# 2. What is recomputed: a 2-layer decoder's attention and MLP results are
# copied (NAME%re), the residual stream (x, l#.y, l#.z: what the norms
# read) is not; the program written runs as the one in memory.
if [ -x "$GEN" ]; then
	"$GEN" 2 2x2 4x2 --dmodel 64 --seq 16 --vocab 128 --train --plan batch,tp >"$T/s.yaml"
	with_train "$T/s.yaml" "\n  recompute: true" >"$T/sr.yaml"
	"$SPMD" partition "$T/sr.yaml" >"$T/list" 2>"$T/err" || bad "partition: $(cat "$T/err")"
	copied yes recompute l0.q l0.probs l0.n2 l1.f1 l1.g logits
	copied no "recompute (the residual stream)" x l0.y l0.z l1.y l1.z
	if "$SPMD" run "$T/sr.yaml" --steps 2 --check >"$T/out" 2>&1; then ok
	else bad "2-layer decoder: $(grep -v ' ok$' "$T/out" | tail -3)"; fi

	# 3. Memory and time: a 4-layer decoder whose activations dominate; the
	# peak with recompute under 0.6 of the peak without, the FLOPs more
	# by at most one forward pass (a third of the step's) and the step slower
	"$GEN" 4 8x1 16x2 --dmodel 256 --seq 2048 --vocab 512 --train --plan batch >"$T/m.yaml"
	with_train "$T/m.yaml" "\n  recompute: true" >"$T/mr.yaml"
	"$SPMD" cost "$T/m.yaml" --hardware tpu-v4 --json >"$T/p.json" 2>"$T/err" || bad "cost: $(cat "$T/err")"
	"$SPMD" cost "$T/mr.yaml" --hardware tpu-v4 --json >"$T/c.json" 2>"$T/err" || bad "cost: $(cat "$T/err")"
	py "recompute: the peak falls, the compute grows by at most a forward" \
		"c['memory']['peak_bytes'] < 0.6 * j['memory']['peak_bytes']" \
		"j['flops_per_device'] < c['flops_per_device'] <= j['flops_per_device'] * (1 + 1 / 3 + 1e-9)" \
		"c['step_time_overlapped_s'] > j['step_time_overlapped_s']"
fi

# 4. recompute: selective.  Exact on meshes that divide and that do not,
# with weight-update sharding and before_use; the same bits as without.
with_train "$SRC/examples/train_transformer.yaml" "\n  recompute: selective" >"$T/ts.yaml"
for mesh in data=2,model=2 data=3,model=1 data=1,model=4; do
	if "$SPMD" run "$T/ts.yaml" --steps 2 --check --mesh $mesh >"$T/out" 2>&1; then ok
	else bad "selective on mesh $mesh: $(grep -v ' ok$' "$T/out" | tail -3)"; fi
done
with_train "$T/ts.yaml" "\n  weight_update_sharding: on\n  all_gather: before_use" >"$T/ts2.yaml"
if "$SPMD" run "$T/ts2.yaml" --steps 2 --check --mesh data=2,model=2 >"$T/out" 2>&1; then ok
else bad "selective with ZeRO-3: $(grep -v ' ok$' "$T/out" | tail -3)"; fi
same_bits "$T/ts.yaml" "$T/c" "selective recompute"
if [ -x "$GEN" ]; then
	# What is made again on a 2-layer decoder of width 512 (heads of 128,
	# sequences of 512): what costs at most 512 FLOPs an element — the
	# attention's probabilities (from its scores), the norms' results —
	# not the projections (1024 an element), the context (1024), the MLP's
	# pre-activation, the logits, nor the residual stream
	"$GEN" 2 2x2 2x4 --dmodel 512 --seq 512 --vocab 128 --train --plan batch,tp >"$T/s5.yaml"
	with_train "$T/s5.yaml" "\n  recompute: selective" >"$T/s5s.yaml"
	"$SPMD" partition "$T/s5s.yaml" >"$T/list" 2>"$T/err" || bad "partition: $(cat "$T/err")"
	copied yes selective l0.probs l0.scores l0.n1 l0.h1 l1.n2 l1.h2 l1.g nf
	copied no selective l0.q l0.k l0.v l0.ctx l1.f1b logits x l0.y l1.z
	# the 4-layer decoder of part 3: the peak between none's and full
	# recompute's, the FLOPs more than none's and fewer than full's
	with_train "$T/m.yaml" "\n  recompute: selective" >"$T/ms.yaml"
	"$SPMD" cost "$T/ms.yaml" --hardware tpu-v4 --json >"$T/s.json" 2>"$T/err" || bad "cost: $(cat "$T/err")"
	py "selective: between none and full" \
		"c['memory']['peak_bytes'] < load('s.json', json.load)['memory']['peak_bytes'] < 0.6 * j['memory']['peak_bytes']" \
		"j['flops_per_device'] < load('s.json', json.load)['flops_per_device'] < c['flops_per_device']" \
		"j['step_time_overlapped_s'] < load('s.json', json.load)['step_time_overlapped_s'] < c['step_time_overlapped_s']"
fi

# 5. Errors: a value not a boolean or selective, and recompute in train: of
# a pipelined model (its stages recompute with pipeline.recompute).
with_train "$SRC/examples/train_transformer.yaml" "\n  recompute: sometimes" >"$T/bad.yaml"
"$SPMD" check "$T/bad.yaml" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && grep -q "bad.yaml:[0-9]*:[0-9]*: error: expected recompute true, false or selective, found 'sometimes'" "$T/err" && ok ||
	bad "bad recompute value: rc $rc: $(cat "$T/err")"
with_train "$SRC/examples/train_pipeline.yaml" "\n  recompute: true" >"$T/pipe.yaml"
"$SPMD" cost "$T/pipe.yaml" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && grep -q "pipe.yaml:[0-9]*:[0-9]*: error: expected recompute in the pipeline: section" "$T/err" && ok ||
	bad "recompute in train: of a pipelined model: rc $rc: $(cat "$T/err")"

echo "recompute_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
