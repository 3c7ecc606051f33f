#!/bin/sh
# bench_run.sh: run every benchmark one after the other and print their figures (docs/performance.md).
#
#   sh bench/bench_run.sh [BUILD_DIR]      (default build-bench; configure it with
#                                           -DCMAKE_BUILD_TYPE=Release)
#
# The benchmarks run one at a time: on a 2-core machine two at once would
# measure each other.  Each prints ratios measured within its own run, which
# hold on a noisy machine where absolute times wander.
set -u
dir=${1:-build-bench}
for b in bench_einsum bench_collectives bench_e2e bench_scale; do
	if [ ! -x "$dir/bench/$b" ]; then
		echo "bench_run.sh: $dir/bench/$b not built (cmake --build $dir)" >&2
		exit 2
	fi
done
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
for cmd in bench_einsum bench_collectives bench_e2e bench_scale; do
	echo
	echo "## $dir/bench/$cmd"
	"$dir/bench/$cmd" || status=1
done
echo
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
