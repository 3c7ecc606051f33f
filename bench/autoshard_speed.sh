#!/bin/sh
# autoshard_speed.sh: how fast two builds of spmd search the same models,
# and whether they find the same plans.  The 12-layer models of
# autoshard_bench.sh (bench/gen_transformer.c, vocabulary 32000, Adam,
# sequence 1024, nothing annotated): d_model 1024 on 8 H100s and d_model
# 2048 on 16 TPU v4s.  Each build searches each model RUNS times on one
# thread (--jobs 1), the builds taking turns so that the machine's noise
# falls on both; the least user CPU time of each is printed, and their
# ratio.  "same plan" says whether the two builds' --json outputs are
# equal but for the counts of plans priced, which the last column gives
# (old -> new).
# usage: sh bench/autoshard_speed.sh OLD_BUILD_DIR NEW_BUILD_DIR [RUNS]
A=${1:?usage: autoshard_speed.sh OLD_BUILD_DIR NEW_BUILD_DIR [RUNS]}
B=${2:?usage: autoshard_speed.sh OLD_BUILD_DIR NEW_BUILD_DIR [RUNS]}
RUNS=${3:-3}
for d in "$A" "$B"; do
	[ -x "$d/spmd" ] || { echo "autoshard_speed.sh: no $d/spmd" >&2; exit 2; }
done
tmp=${TMPDIR:-/tmp}/autoshard_speed.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT

"$B/bench/gen_transformer" 12 8x1 8x8 --dmodel 1024 --seq 1024 --vocab 32000 --train --plan none >"$tmp/m8.yaml" &&
	"$B/bench/gen_transformer" 12 16x1 16x16 --dmodel 2048 --seq 1024 --vocab 32000 --train --plan none >"$tmp/m16.yaml" ||
	exit 1

printf '| layers | d_model | devices | hardware | old CPU (s) | new CPU (s) | new / old | same plan | plans priced |\n'
printf '| ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | --- |\n'
for c in m8:8:h100-nvlink m16:16:tpu-v4; do
	m=${c%%:*} rest=${c#*:}
	n=${rest%%:*} hw=${rest#*:}
	: >"$tmp/a.t"
	: >"$tmp/b.t"
	i=0
	while [ "$i" -lt "$RUNS" ]; do
		for side in a b; do
			[ "$side" = a ] && d=$A || d=$B
			/usr/bin/time -f '%U' -o "$tmp/t" "$d/spmd" autoshard "$tmp/$m.yaml" --devices "$n" --hardware "$hw" \
				--jobs 1 --json >"$tmp/$side.json" 2>/dev/null || { echo "autoshard_speed.sh: $d/spmd failed on $m" >&2; exit 1; }
			tail -n 1 "$tmp/t" >>"$tmp/$side.t"
		done
		i=$((i + 1))
	done
	# the outputs equal without the counts (yes/no), and the counts old->new
	read -r same priced <<EOP
$(python3 -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
counts = ("plans_priced", "plans_priced_exactly")
strip = lambda j: {k: v for k, v in j.items() if k not in counts}
print("yes" if strip(a) == strip(b) else "no", "%s->%s" % (a.get("plans_priced"), b.get("plans_priced")))
' "$tmp/a.json" "$tmp/b.json")
EOP
	a=$(sort -g "$tmp/a.t" | head -n 1) b=$(sort -g "$tmp/b.t" | head -n 1)
	dm=1024
	[ "$m" = m16 ] && dm=2048
	printf '| 12 | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$dm" "$n" "$hw" "$a" "$b" \
		"$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }')" "$same" "$priced"
done
