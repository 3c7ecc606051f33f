#!/bin/sh
# wus_table.sh: weight-update sharding off against on, in the steady state,
# for a Transformer-like and a ResNet-50-like data-parallel training step on
# tpu-v3 at 16, 128 and 1024 chips (docs/weight_update_sharding.md).
#
#   sh bench/wus_table.sh build/spmd [CHIPS...]
#
# Transformer-like: LAYERS pre-LN blocks (d_model 1024, 16 heads of 64, MLP
# 4096), sequence 512, vocabulary 8192, 2 sequences per replica, bf16
# weights, Adam.  ResNet-50-like: four bottleneck stages (1x1, 3x3, 1x1; 256,
# 512, 1024 and 2048 channels on 56, 28, 14 and 7 pixels square), global
# pooling and a 1000-way head, 8 images per replica, bf16, momentum.  Each
# is estimated (spmd cost --json) with weight_update_sharding off, and on
# with all_gather after_update (ZeRO-1/2: the weights whole between steps,
# the same bytes as the all_reduce) and before_use (ZeRO-3: the weights
# sharded, gathered before each use in the forward and the backward, with
# prefetch); the table gives the steady-state step, the changes, and for
# before_use where the change comes from: the update's and the
# collectives' serial time, and the time overlap hides.  No measurement:
# an estimate on a built-in profile.
set -eu
SPMD=${1:-build/spmd}
[ $# -gt 0 ] && shift
CHIPS=${*:-16 128 1024}
LAYERS=${LAYERS:-4}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

transformer() { # N WUS GATHER
	n=$1 b=${T_BATCH:-$((2 * $1))}
	cat <<Y
name: transformer_like
mesh: {data: $n}
inputs:
  tokens: {shape: [$b, 512], dtype: i32, sharding: [data, null]}
  labels: {shape: [$b, 512], dtype: i32, sharding: [data, null]}
params:
  embed: {shape: [8192, 1024], dtype: bf16}
  wout: {shape: [1024, 8192], dtype: bf16}
Y
	l=0
	while [ $l -lt "$LAYERS" ]; do
		cat <<Y
  l$l.ln1: {shape: [1024], dtype: bf16, init: ones}
  l$l.wq: {shape: [1024, 16, 64], dtype: bf16}
  l$l.wk: {shape: [1024, 16, 64], dtype: bf16}
  l$l.wv: {shape: [1024, 16, 64], dtype: bf16}
  l$l.wo: {shape: [16, 64, 1024], dtype: bf16}
  l$l.ln2: {shape: [1024], dtype: bf16, init: ones}
  l$l.w1: {shape: [1024, 4096], dtype: bf16}
  l$l.w2: {shape: [4096, 1024], dtype: bf16}
Y
		l=$((l + 1))
	done
	echo "ops:"
	echo "  - {out: l0.x, op: take, in: [embed, tokens], sharding: [data, null, null]}"
	l=0
	while [ $l -lt "$LAYERS" ]; do
		x=l$l.x
		cat <<Y
  - {out: l$l.n1, op: layer_norm, in: [$x]}
  - {out: l$l.h1, op: mul, in: [l$l.n1, l$l.ln1]}
  - {out: l$l.q, op: einsum, in: [l$l.h1, l$l.wq], eq: "bsm,mhd->bshd"}
  - {out: l$l.k, op: einsum, in: [l$l.h1, l$l.wk], eq: "bsm,mhd->bshd"}
  - {out: l$l.v, op: einsum, in: [l$l.h1, l$l.wv], eq: "bsm,mhd->bshd"}
  - {out: l$l.s, op: einsum, in: [l$l.q, l$l.k], eq: "bqhd,bkhd->bhqk"}
  - {out: l$l.p, op: softmax, in: [l$l.s], axis: -1}
  - {out: l$l.c, op: einsum, in: [l$l.p, l$l.v], eq: "bhqk,bkhd->bqhd"}
  - {out: l$l.a, op: einsum, in: [l$l.c, l$l.wo], eq: "bqhd,hdm->bqm"}
  - {out: l$l.y, op: add, in: [$x, l$l.a]}
  - {out: l$l.n2, op: layer_norm, in: [l$l.y]}
  - {out: l$l.h2, op: mul, in: [l$l.n2, l$l.ln2]}
  - {out: l$l.f1, op: einsum, in: [l$l.h2, l$l.w1], eq: "bsm,mf->bsf"}
  - {out: l$l.g, op: gelu, in: [l$l.f1]}
  - {out: l$l.f2, op: einsum, in: [l$l.g, l$l.w2], eq: "bsf,fm->bsm"}
  - {out: l$((l + 1)).x, op: add, in: [l$l.y, l$l.f2]}
Y
		l=$((l + 1))
	done
	cat <<Y
  - {out: logits, op: einsum, in: [l$LAYERS.x, wout], eq: "bsm,mv->bsv"}
  - {out: loss, op: softmax_cross_entropy, in: [logits, labels]}
outputs: [loss]
train: {loss: loss, optimizer: {type: adam, lr: 0.001}, weight_update_sharding: $2, all_gather: $3}
Y
}

resnet() { # N WUS GATHER
	n=$1 b=${R_BATCH:-$((8 * $1))}
	cat <<Y
name: resnet50_like
mesh: {data: $n}
inputs:
  images: {shape: [$b, 56, 56, 64], dtype: bf16, sharding: [data, null, null, null]}
  labels: {shape: [$b], dtype: i32, sharding: [data]}
params:
Y
	cin=64
	for c in 256 512 1024 2048; do
		q=$((c / 4))
		cat <<Y
  s$c.a: {shape: [1, 1, $cin, $q], dtype: bf16}
  s$c.b: {shape: [3, 3, $q, $q], dtype: bf16}
  s$c.c: {shape: [1, 1, $q, $c], dtype: bf16}
Y
		cin=$c
	done
	echo "  head: {shape: [2048, 1000], dtype: bf16}"
	echo "ops:"
	x=images stride=1
	for c in 256 512 1024 2048; do
		cat <<Y
  - {out: s$c.ya, op: conv2d, in: [$x, s$c.a], strides: [$stride, $stride], padding: same}
  - {out: s$c.ra, op: relu, in: [s$c.ya]}
  - {out: s$c.yb, op: conv2d, in: [s$c.ra, s$c.b], padding: same}
  - {out: s$c.rb, op: relu, in: [s$c.yb]}
  - {out: s$c.yc, op: conv2d, in: [s$c.rb, s$c.c], padding: same}
  - {out: s$c.r, op: relu, in: [s$c.yc]}
Y
		x=s$c.r stride=2
	done
	cat <<Y
  - {out: pooled, op: reduce_mean, in: [$x], axes: [1, 2]}
  - {out: logits, op: einsum, in: [pooled, head], eq: "nc,ck->nk"}
  - {out: loss, op: softmax_cross_entropy, in: [logits, labels]}
outputs: [loss]
train: {loss: loss, optimizer: {type: momentum, lr: 0.1}, weight_update_sharding: $2, all_gather: $3}
Y
}

# The fields of spmd cost --json the table reads: the steady step, the
# serial step, and the serial and hidden seconds of the update and gather.
fields() {
	python3 -c '
import json, sys
j = json.load(sys.stdin)
ph = {p["phase"]: p for p in j["phases"]}
hidden = sum(p["hidden_s"] for p in j["phases"])
print(j["step_time_overlapped_s"], j["step_time_s"], ph["weight update"]["serial_s"],
      ph["weight gather"]["serial_s"] + ph["gradient sync"]["serial_s"], hidden)'
}

ms() { awk -v x="$1" 'BEGIN { printf "%.2f ms", x * 1e3 }'; }

echo "| model | chips | steady off | on, after_update | change | on, before_use | change | serial change | update off → on | communication off → on | hidden by overlap off → on |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for model in transformer resnet; do
	for n in $CHIPS; do
		for w in off:after_update on:after_update on:before_use; do
			$model "$n" "${w%%:*}" "${w#*:}" > "$DIR/m.yaml"
			"$SPMD" cost "$DIR/m.yaml" --hardware tpu-v3 --json | fields > "$DIR/$w"
		done
		read -r s0 r0 u0 c0 h0 < "$DIR/off:after_update"
		read -r sa ra ua ca ha < "$DIR/on:after_update"
		read -r s1 r1 u1 c1 h1 < "$DIR/on:before_use"
		echo "| $model-like | $n | $(ms "$s0") | $(ms "$sa") | $(awk -v a="$s0" -v b="$sa" 'BEGIN{printf "%+.1f%%", 100*(b-a)/a}') |" \
		     "$(ms "$s1") | $(awk -v a="$s0" -v b="$s1" 'BEGIN{printf "%+.1f%%", 100*(b-a)/a}') |" \
		     "$(awk -v a="$r0" -v b="$r1" 'BEGIN{printf "%+.1f%%", 100*(b-a)/a}') | $(ms "$u0") → $(ms "$u1") |" \
		     "$(ms "$c0") → $(ms "$c1") | $(ms "$h0") → $(ms "$h1") |"
	done
done
