#!/bin/sh
# rank_mpi.sh: the ranking benchmark on the MPI backend (docs/performance.md).
# For every example: calibrate this machine (the thread backend's local
# profile, which prices every plan), then run each plan bench_rank lists
# (--list) under mpirun, one process per device (bench_rank_mpi), and print
# per plan the predicted and measured step and peak memory, then per model
# Kendall's tau, the median and worst step error and the worst peak error.
# Normal priority: MPI's ranks poll, and real-time ranks sharing two cores
# could starve each other.
# usage: sh bench/rank_mpi.sh BUILD_DIR [RUNS]     (from the source folder; as root it passes --allow-run-as-root)
BUILD=${1:?usage: rank_mpi.sh BUILD_DIR [RUNS]}
RUNS=${2:-9}
export OPENBLAS_NUM_THREADS=1
ROOT=
[ "$(id -u)" = 0 ] && ROOT=--allow-run-as-root
tmp=${TMPDIR:-/tmp}/rank_mpi.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for f in examples/*.yaml; do
	grep -q '^pipeline:' "$f" && continue # the pipeline schedule is not run yet (docs/pipeline.md)
	"$BUILD/spmd" calibrate -o "$tmp/local.yaml" >/dev/null || exit 1
	"$BUILD/bench/bench_rank" --list "$f" | while read -r mesh wus; do
		np=$(echo "$mesh" | tr ',' '\n' | cut -d= -f2 | awk '{ p *= $1 } BEGIN { p = 1 } END { print p }')
		mpirun $ROOT --oversubscribe -np "$np" "$BUILD/bench/bench_rank_mpi" "$tmp/local.yaml" "$RUNS" "$f" \
			"$mesh" "$wus" </dev/null 2>/dev/null | sed "s|^|$f |"
	done
done >"$tmp/rows"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/rows" <<'PY'
import sys, statistics, math
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
def err(p, m): return (p - m) / m if m > 0 else 0.0
def tau(r):
    c = d = tp = tm = n = 0
    for i in range(len(r)):
        for j in range(i + 1, len(r)):
            dp, dm = r[i][0] - r[j][0], r[i][1] - r[j][1]
            n += 1; tp += dp == 0; tm += dm == 0
            c += dp * dm > 0; d += dp * dm < 0
    den = math.sqrt((n - tp) * (n - tm))
    return (c - d) / den if den else 1.0
print("\n| model | mesh | wus | predicted | measured | error | peak predicted | peak measured | error |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
by = {}
for f, mesh, wus, p, m, pp, mp in rows:
    p, m, pp, mp = float(p), float(m), int(pp), int(mp)
    by.setdefault(f, []).append((p, m, pp, mp))
    w = {"-1": "n/a", "0": "off", "1": "on"}[wus]
    print("| %s | %s | %s | %.3g ms | %.3g ms | %+.1f%% | %d | %d | %+.1f%% |" % (f, mesh, w, p * 1e3, m * 1e3, 100 * err(p, m), pp, mp, 100 * err(pp, mp)))
print("\n| model | plans | Kendall tau | median error | worst error | worst peak error |")
print("| --- | --- | --- | --- | --- | --- |")
for f, r in by.items():
    e = [abs(err(p, m)) for p, m, _, _ in r]
    pe = [abs(err(pp, mp)) for _, _, pp, mp in r]
    print("| %s | %d | %.2f | %.1f%% | %.1f%% | %.1f%% |" % (f, len(r), tau(r), 100 * statistics.median(e), 100 * max(e), 100 * max(pe)))
PY
