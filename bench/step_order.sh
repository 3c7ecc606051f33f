#!/bin/sh
# step_order.sh: what moving a training step's tail into its backward pass
# (partitioner/order.c, docs/training.md "The step's order") does to the
# hand plans of bench/autoshard_plans/ (the 12-layer decoder on 8 and 16
# devices: data parallel, with weight-update sharding, ZeRO-3, Megatron,
# grids, with and without sequence parallelism), each with its mesh naming
# the profile.  Prints, per plan and profile, the cost model's steady step
# as built and moved, the change, whether the move was kept, and what
# moved.  Estimates, not timings: the same on every machine.
# usage: sh bench/step_order.sh BUILD_DIR
B=${1:?usage: step_order.sh BUILD_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
tmp=${TMPDIR:-/tmp}/step_order.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
printf '| plan | devices | hardware | as built (ms) | moved (ms) | change | kept | gradients / updates moved (of params) |\n'
printf '| --- | ---: | --- | ---: | ---: | ---: | --- | --- |\n'
for hw in tpu-v4 h100-nvlink; do
	for f in "$HERE"/autoshard_plans/lm12_*.yaml; do
		case $f in *_none.yaml) continue ;; esac
		name=$(basename "$f" .yaml)
		sed "s/^mesh: {\([^}]*\)}$/mesh: {axes: {\1}, hardware: $hw}/" "$f" >"$tmp/m.yaml"
		"$B/spmd" partition "$tmp/m.yaml" --json 2>/dev/null | python3 -c "
import json, sys
o = json.load(sys.stdin)['step_order']
b = o['step_s']
a = o['step_moved_s'] if o['step_moved_s'] is not None else b
name = '$name'
plan, dev = name.split('_', 3)[3], name.split('_')[2].replace('dev', '')
g, u = (o['gradients_moved'], o['params_moved']) if o['moved'] else (0, 0)
print('| %s | %s | %s | %.2f | %.2f | %+.1f%% | %s | %d / %d (%d) |' % (plan, dev, '$hw', b * 1e3, a * 1e3,
      100 * (a / b - 1), 'yes' if o['moved'] else 'no', g, u, o['params']))"
	done
done
