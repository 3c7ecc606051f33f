#!/bin/sh
# collective_matmul.sh: what overlapping gathers, scatters and all_reduces
# with the einsums next to them (and the ops after an all_reduce with its
# blocks) (partitioner/window.c, docs/partitioning.md
# "Collective matmul") does to the hand plans with tensor parallelism of
# bench/autoshard_plans/ (the 12-layer decoder on 8 and 16 devices:
# Megatron and data x model grids, with and without sequence parallelism
# and weight-update sharding) and to a 4-layer decoder with d_model 4096
# and sequences of 4096 on 8 devices (Megatron with sequence parallelism),
# each with its mesh naming the profile.  Prints, per plan and profile, the
# cost model's steady step as partitioned and with the blocks, the change,
# whether it was kept, and how many gathers, scatters and all_reduces
# were taken (or tried), with the ops after the all_reduces run in their
# blocks.  Estimates, not timings: the same on every machine.
# usage: sh bench/collective_matmul.sh BUILD_DIR
B=${1:?usage: collective_matmul.sh BUILD_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
tmp=${TMPDIR:-/tmp}/collective_matmul.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
"$B/bench/gen_transformer" 4 1x8 1x32 --dmodel 4096 --seq 4096 --vocab 32000 --train --plan batch,tp,sp \
	>"$tmp/lm4_d4096_s4096_8dev_megatron_sp.yaml" || exit 1
printf '| plan | devices | hardware | as partitioned (ms) | with blocks (ms) | change | kept | gathers / scatters / all_reduces (ops in blocks after them) |\n'
printf '| --- | ---: | --- | ---: | ---: | ---: | --- | --- |\n'
for hw in tpu-v4 h100-nvlink; do
	for f in "$HERE"/autoshard_plans/lm12_*megatron*.yaml "$HERE"/autoshard_plans/lm12_*grid*.yaml \
		"$tmp"/lm4_*.yaml; do
		name=$(basename "$f" .yaml)
		sed "s/^mesh: {\([^}]*\)}$/mesh: {axes: {\1}, hardware: $hw}/" "$f" >"$tmp/m.yaml"
		"$B/spmd" partition "$tmp/m.yaml" --json 2>/dev/null | python3 -c "
import json, sys
j = json.load(sys.stdin)
o = j.get('collective_matmul')
name = '$name'
plan, dev = name.split('_dev')[0].rsplit('_', 1)[0], ''
parts = name.split('_')
dev = [p for p in parts if p.endswith('dev')][0].replace('dev', '')
plan = '_'.join(parts[parts.index(dev + 'dev') + 1:])
model = '_'.join(parts[:parts.index(dev + 'dev')])
if o is None:
    print('| %s %s | %s | %s | - | - | - | no | none next to an einsum |' % (model, plan, dev, '$hw'))
else:
    b = o['step_s']
    a = o['step_overlapped_s'] if o['step_overlapped_s'] is not None else b
    print('| %s %s | %s | %s | %.2f | %.2f | %+.1f%% | %s | %s |' % (model, plan, dev, '$hw', b * 1e3, a * 1e3,
          100 * (a / b - 1), 'yes' if o['overlapped'] else 'no',
          '%d / %d / %d (%d)' % (o['all_gathers'], o['reduce_scatters'], o['all_reduces'], o.get('chained_ops', 0))
          if o['step_overlapped_s'] is not None else 'none expected to gain'))"
	done
done
