#!/bin/sh
# rank.sh: the ranking benchmark (docs/performance.md, "Ranking against measurement").
# For every example: calibrate this machine, then bench_rank it — every mesh
# of 2, 4 and 8 devices over its axes, weight-update sharding off and on for
# a training step, each estimated on the fresh local profile and run on the
# thread backend; per model Kendall's tau, the median and worst step error,
# and the peak memory error.  Real-time priority when chrt works, BLAS on
# one thread (as bench/cost_error.sh).
# usage: sh bench/rank.sh BUILD_DIR [RUNS]     (from the source folder)
BUILD=${1:?usage: rank.sh BUILD_DIR [RUNS]}
RUNS=${2:-9}
export OPENBLAS_NUM_THREADS=1
RT=
chrt -f 10 true 2>/dev/null && RT="chrt -f 10"
tmp=${TMPDIR:-/tmp}/rank.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); priority: ${RT:-normal}"
for f in examples/*.yaml; do
	grep -q '^pipeline:' "$f" && continue # the pipeline schedule is not run yet (docs/pipeline.md)
	$RT "$BUILD/spmd" calibrate -o "$tmp/local.yaml" >/dev/null || exit 1
	$RT "$BUILD/bench/bench_rank" "$tmp/local.yaml" "$RUNS" "$f" >"$tmp/$(basename "$f").md" || exit 1
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
for f in "$tmp"/*.md; do sed -n '/^| model | mesh/,/^$/p' "$f" | grep -v '^| model\|^| ---\|^$'; done |
	sed '1i | model | mesh | wus | predicted | measured | error | peak predicted | peak measured | error |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |'
echo
echo "| model | plans | Kendall tau | median error | worst error | median peak error | worst peak error |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for f in "$tmp"/*.md; do grep '^| examples/' "$f" | tail -1; done
