#!/bin/sh
# autoshard_bench.sh: spmd autoshard against hand-written plans on generated
# transformers (bench/gen_transformer.c: pre-LN blocks, batch 4, seq 16,
# d_model 64, 4 heads, MLP 256).  Hand plans: the generator's data x model
# grid with Megatron tensor parallelism (its own annotations), and data
# parallelism over every device (the batch split over both axes, weights
# replicated).  Budgets: loose (the profile's capacity) and tight (half the
# data-parallel plan's peak).  Prints one table row per case.
# usage: sh bench/autoshard_bench.sh BUILD_DIR
B=${1:?usage: autoshard_bench.sh BUILD_DIR}
SPMD=$B/spmd GEN=$B/bench/gen_transformer
tmp=${TMPDIR:-/tmp}/autoshard_bench.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT

field() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

printf '| layers | mesh | hardware | budget (B) | Megatron grid (us) | data parallel (us) | auto (us) | auto peak (B) | gap | plans priced | solve (s) |\n'
printf '| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for layers in 2 12; do
	for mesh in 2x4 4x2; do
		"$GEN" $layers $mesh >"$tmp/grid.yaml"
		sed -E 's/, sharding: \[[^]]*\]//' "$tmp/grid.yaml" >"$tmp/free.yaml"
		sed -E 's/^  x: \{shape: (\[[^]]*\])\}/  x: {shape: \1, sharding: [[data, model], null, null]}/' "$tmp/free.yaml" >"$tmp/dp.yaml"
		for hw in tpu-v4 h100-nvlink; do
			"$SPMD" cost "$tmp/grid.yaml" --hardware $hw --json >"$tmp/grid.json"
			"$SPMD" cost "$tmp/dp.yaml" --hardware $hw --json >"$tmp/dp.json"
			cap=$(field "$tmp/dp.json" 'int(j["memory"]["capacity_bytes"])')
			tight=$(field "$tmp/dp.json" 'j["memory"]["peak_bytes"] // 2')
			for budget in $cap $tight; do
				t0=$(date +%s.%N)
				"$SPMD" autoshard "$tmp/free.yaml" --hardware $hw --memory $budget --json >"$tmp/auto.json" 2>/dev/null
				t1=$(date +%s.%N)
				fit() { field "$1" "('%.1f' % (j['step_time_overlapped_s'] * 1e6)) + ('' if j['memory']['peak_bytes'] <= $budget else ' (over)')"; }
				printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f |\n' $layers $mesh $hw $budget \
					"$(fit "$tmp/grid.json")" "$(fit "$tmp/dp.json")" \
					"$(field "$tmp/auto.json" "'%.1f' % (j['step_time_overlapped_s'] * 1e6) if j['found'] else 'none fits'")" \
					"$(field "$tmp/auto.json" "j.get('peak_bytes', j.get('smallest_peak_bytes'))")" \
					"$(field "$tmp/auto.json" "'%.0f%%' % (100 * j['gap']) if j['found'] else '-'")" \
					"$(field "$tmp/auto.json" "j['plans_priced']")" "$(echo "$t1 - $t0" | bc)"
			done
		done
	done
done
