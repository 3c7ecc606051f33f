#!/bin/sh
# autoshard_bench.sh: spmd autoshard against hand-written plans on generated
# decoder-only language models with an Adam training step
# (bench/gen_transformer.c: pre-LN blocks, MLP 4 x d_model, heads of 128,
# vocabulary 32000, one sequence per device).  The hand plans (bench/autoshard_plans/ holds the
# 12-layer ones at 8 and 16 devices, written by this script's `plans` mode):
#   dp          the batch over every device, params replicated
#   dp_wus      the same with weight-update sharding
#   megatron    Megatron tensor parallelism over every device
#   megatron_sp the same with sequence parallelism of the norms and residual stream
#   grid        data x model: the batch over data, Megatron over model
#   grid_wus    the same with weight-update sharding
#   grid_sp     the grid with sequence parallelism of the norms and residual stream
#   grid_sp_wus the same with weight-update sharding
#   dp_zero3    dp_wus with all_gather before_use (ZeRO-3: weights gathered at use)
# The grid's model axis is 8 (4 at 8 devices).  Each hand plan is priced
# with the profile named in its mesh, as autoshard's plans name theirs: the
# passes' own choices and the step's order (docs/training.md) are then
# that profile's.  Budgets: loose (the
# profile's capacity) and tight (5% above the smallest peak of the hand
# plans, at most half the capacity).  Prints one table row per case; the
# auto mesh column adds "recompute" where the answer recomputes the forward
# (no plan without it fits), "selective" where it recomputes selectively.
# usage: sh bench/autoshard_bench.sh BUILD_DIR [quick|full]
#        AUTOSHARD_CONFIGS='96:256:8192:256' sh bench/autoshard_bench.sh BUILD_DIR   # these configurations
#        (LAYERS:DEVICES:D_MODEL:SEQ, space-separated)
#        sh bench/autoshard_bench.sh BUILD_DIR plans   # rewrite bench/autoshard_plans/
#        AUTOSHARD_RUNS=1 sh bench/autoshard_bench.sh BUILD_DIR   # one search per row (default 3: the least wall time)
B=${1:?usage: autoshard_bench.sh BUILD_DIR [quick|full|plans]}
MODE=${2:-quick}
RUNS=${AUTOSHARD_RUNS:-3} # searches per row: the table gives the least wall time
SPMD=$B/spmd GEN=$B/bench/gen_transformer
HERE=$(cd "$(dirname "$0")" && pwd)
tmp=${TMPDIR:-/tmp}/autoshard_bench.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT

field() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# gen LAYERS DEVICES DMODEL SEQ PLAN NAME: the model with plan NAME into $tmp/NAME.yaml
gen() {
	L=$1 N=$2 M=$3 S=$4 plan=$5 name=$6
	mp=8
	[ "$N" -le 8 ] && mp=4
	case $plan in
	dp | dp_wus | dp_zero3 | none) mesh=${N}x1 ;;
	megatron | megatron_sp) mesh=1x$N ;;
	*) mesh=$((N / mp))x$mp ;;
	esac
	case $plan in
	none) bits=none ;;
	dp) bits=batch ;;
	dp_wus | dp_zero3) bits=batch,wus ;;
	megatron) bits=batch,tp ;;
	megatron_sp) bits=batch,tp,sp ;;
	grid) bits=batch,tp ;;
	grid_wus) bits=batch,tp,wus ;;
	grid_sp) bits=batch,tp,sp ;;
	grid_sp_wus) bits=batch,tp,sp,wus ;;
	esac
	# one sequence per device: the grid's replicas get a few each (its model axis)
	"$GEN" "$L" "$mesh" ${N}x$((M / 128)) --dmodel "$M" --seq "$S" --vocab 32000 --train \
		--plan $bits >"$tmp/$name.yaml"
	if [ "$plan" = dp_zero3 ]; then
		sed -i 's/^  weight_update_sharding: on/  weight_update_sharding: on\n  all_gather: before_use/' "$tmp/$name.yaml"
	fi
}

PLANS="dp dp_wus dp_zero3 megatron megatron_sp grid grid_wus grid_sp grid_sp_wus"

if [ "$MODE" = plans ]; then
	mkdir -p "$HERE/autoshard_plans"
	for c in 8:1024 16:2048; do
		for p in none $PLANS; do
			gen 12 "${c%:*}" "${c#*:}" 1024 $p $p
			cp "$tmp/$p.yaml" "$HERE/autoshard_plans/lm12_d${c#*:}_${c%:*}dev_$p.yaml"
		done
	done
	exit 0
fi

# the configurations: layers devices d_model seq
if [ "$MODE" = full ]; then
	CONFIGS="${AUTOSHARD_CONFIGS:-12:8:1024:1024 12:16:1024:1024 12:16:2048:1024 48:16:2048:1024 48:64:4096:1024 96:256:8192:256}"
else
	CONFIGS="${AUTOSHARD_CONFIGS:-12:8:1024:1024 12:16:2048:1024 48:64:4096:1024 96:256:8192:256}"
fi

us() { field "$1" "'%.1f' % (j['step_time_overlapped_s'] * 1e3)"; }

printf '| layers | d_model | devices | hardware | budget (GB) | best hand plan (ms) | auto (ms) | auto mesh | auto peak (GB) | vs hand | bound (ms) | gap (compute + waiting) | solve (s) | solve CPU (s) |\n'
printf '| ---: | ---: | ---: | --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for c in $CONFIGS; do
	IFS=: read -r L N M S <<EOC
$c
EOC
	gen "$L" "$N" "$M" "$S" none free
	for p in $PLANS; do gen "$L" "$N" "$M" "$S" $p $p; done
	for hw in tpu-v4 h100-nvlink; do
		for p in $PLANS; do # the mesh names the profile: the passes price their choices on it, as autoshard's do
			sed "s/^mesh: {\([^}]*\)}\$/mesh: {axes: {\1}, hardware: $hw}/" "$tmp/$p.yaml" >"$tmp/$p.$hw.yaml"
			"$SPMD" cost "$tmp/$p.$hw.yaml" --json >"$tmp/$p.$hw.json" 2>/dev/null
		done
		cap=$(field "$tmp/dp.$hw.json" 'int(j["memory"]["capacity_bytes"])')
		# the fastest hand plan within a budget: "name ms", or "none"
		best() {
			for p in $PLANS; do
				field "$tmp/$p.$hw.json" "('%s %.6f' % ('$p', j['step_time_overlapped_s'] * 1e3)) if j['memory']['peak_bytes'] <= $1 else ''"
			done | sed '/^$/d' | sort -k2 -g | head -1
		}
		# tight: 5% above the smallest hand plan's peak (that plan alone fits
		# among the hand plans), when that is below the loose budget
		tight=$(for p in $PLANS; do field "$tmp/$p.$hw.json" 'j["memory"]["peak_bytes"]'; done | sort -g | head -1)
		tight=$(python3 -c "print(min(int($tight * 1.05), $cap // 2))")
		for budget in $cap $tight; do
			hand=$(best "$budget")
			# the least wall time of RUNS searches (the machine's load only
			# adds time), and that run's CPU time; the answers must agree
			wall= cpu=
			for r in $(seq "$RUNS"); do
				/usr/bin/time -f '%e %U' -o "$tmp/time" "$SPMD" autoshard "$tmp/free.yaml" --devices "$N" --hardware $hw \
					--memory "$budget" --json >"$tmp/auto.json" 2>/dev/null
				read -r w c <<EOT
$(tail -1 "$tmp/time")
EOT
				if [ -z "$wall" ] || python3 -c "import sys; sys.exit(not $w < $wall)"; then wall=$w cpu=$c; fi
				[ "$r" = 1 ] && cp "$tmp/auto.json" "$tmp/auto1.json"
				cmp -s "$tmp/auto.json" "$tmp/auto1.json" || echo "autoshard_bench: run $r of $L layers on $N $hw gave another answer" >&2
			done
			if [ "$(field "$tmp/auto.json" "j['found']")" = True ]; then
				auto=$(us "$tmp/auto.json")
				amesh=$(field "$tmp/auto.json" "'x'.join(str(v) for v in j['mesh'].values()) + (' recompute' if j.get('recompute') else ' selective' if j.get('recompute_selective') else '')")
				apeak=$(field "$tmp/auto.json" "'%.2f' % (j['peak_bytes'] / 1e9)")
				bound=$(field "$tmp/auto.json" "'%.1f' % (j['bound_s'] * 1e3)")
				gap=$(field "$tmp/auto.json" "'%.1f%% (%.1f + %.1f)' % (100 * j['gap'], 100 * j['gap_compute'], 100 * j['gap_exposed'])")
			else
				auto="none fits" amesh=- bound=- gap=-
				apeak=$(field "$tmp/auto.json" "'smallest %.2f' % (j.get('smallest_peak_bytes', -1) / 1e9)")
			fi
			if [ -n "$hand" ] && [ "$auto" != "none fits" ]; then
				vs=$(python3 -c "print('%+.1f%%' % (100 * ($auto / ${hand#* } - 1)))")
				handtxt="${hand%% *} $(printf '%.1f' "${hand#* }")"
			else
				vs=- handtxt=${hand:-none fits}
				[ -n "$hand" ] && handtxt="${hand%% *} $(printf '%.1f' "${hand#* }")"
			fi
			printf '| %s | %s | %s | %s | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$L" "$M" "$N" $hw \
				"$(python3 -c "print($budget / 1e9)")" "$handtxt" "$auto" "$amesh" "$apeak" "$vs" "$bound" "$gap" "$wall" "$cpu"
		done
	done
done
