#!/bin/sh
# cost_error.sh: the cost model's measured error (docs/cost_model.md, "Measured error").
# For every example and benchmark model: calibrates this machine, then runs
# `spmd cost --compare-run`; prints each one's predicted and measured step time,
# the error, and the median absolute error over the examples and over all.
# usage: sh bench/cost_error.sh SPMD_BINARY [RUNS]     (from the source folder)
# BLAS runs on one thread per device (OPENBLAS_NUM_THREADS=1: a device is one
# core, and OpenBLAS's own threads would compete with the device threads;
# spmd sets it itself when it is unset); when chrt works the runs get
# real-time priority, so that other processes on a shared machine do not
# delay the devices' wake-ups.
SPMD=${1:?usage: cost_error.sh SPMD [RUNS]}
RUNS=${2:-9}
export OPENBLAS_NUM_THREADS=1
RT=
chrt -f 10 true 2>/dev/null && RT="chrt -f 10"
tmp=${TMPDIR:-/tmp}/cost_error.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "priority: ${RT:-normal}"
# calibrate right before each model: the machine's speed drifts (a shared VM)
for f in examples/*.yaml bench/cost_*.yaml; do
	grep -q '^pipeline:' "$f" && continue # the pipeline schedule is not run yet (docs/pipeline.md)
	$RT "$SPMD" calibrate -o "$tmp/local.yaml" >/dev/null || exit 1
	grep -v '^#' "$tmp/local.yaml" | grep -E '^compute|latency' | sed "s|^|$(basename "$f"): |"
	$RT "$SPMD" cost "$f" --hardware "$tmp/local.yaml" --compare-run --runs "$RUNS" --json >"$tmp/$(basename "$f").json" ||
		echo "$f: failed"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp"/*.json <<'EOF'
import json, sys, statistics
rows = []
for path in sys.argv[1:]:
    j = json.load(open(path))
    c = j["compare_run"]
    rows.append((path.rsplit("/", 1)[1][:-5], j["devices"], c["predicted_s"], c["measured_s"], c["error"], c["by_op_kind"]))
print("%-26s %7s %12s %12s %8s" % ("model", "devices", "predicted", "measured", "error"))
for name, ndev, p, m, e, _ in rows:
    print("%-26s %7d %10.1f us %10.1f us %+7.1f%%" % (name, ndev, p * 1e6, m * 1e6, 100 * e))
ex = [r for r in rows if not r[0].startswith("cost_")]
print("median absolute error of the step: %.1f%% over the %d examples, %.1f%% over all %d models" % (
    100 * statistics.median(abs(r[4]) for r in ex), len(ex), 100 * statistics.median(abs(r[4]) for r in rows), len(rows)))
kinds = [abs(k["error"]) for r in rows for k in r[5] if k["measured_s"] > 0]
print("median absolute error per op kind: %.1f%% over %d (model, kind) pairs" % (100 * statistics.median(kinds), len(kinds)))
EOF
