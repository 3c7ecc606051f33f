#!/bin/sh
# bench_mpi.sh: the MPI backend — bytes each rank sends against the partitioner's report, and bandwidth against threads.
#
#   sh bench/bench_mpi.sh [BUILD_DIR [DEVICES [MAX_MIB]]]   (defaults build-bench, 4, 16)
#
# 1. Bytes: every example runs under `mpirun -np N spmd run --backend mpi`
#    on meshes of 4 and 8 devices with SPMD_MPI_STATS=1, which makes rank 0
#    print the bytes each rank's collectives addressed to other ranks; they
#    are set beside `spmd partition --json`'s total_bytes_sent_per_device
#    (the ring traffic the partitioner planned per device).  Per rank they
#    differ only where a buffer does not split evenly among a group (the
#    partitioner rounds up).
# 2. Bandwidth: bench_collectives (threads) and bench_mpi (MPI, both
#    reduction orders) on DEVICES devices, buffers up to MAX_MIB.
# One job at a time: on a 2-core machine two would measure each other.
set -u
dir=${1:-build-bench}
ndev=${2:-4}
mib=${3:-16}
src=$(cd "$(dirname "$0")/.." && pwd)
spmd="$dir/spmd"
for f in "$spmd" "$dir/bench/bench_collectives" "$dir/bench/bench_mpi"; do
	if [ ! -x "$f" ]; then
		echo "bench_mpi.sh: $f not built (cmake --build $dir)" >&2
		exit 2
	fi
done
ROOT=""
[ "$(id -u)" = 0 ] && ROOT=--allow-run-as-root
MPIRUN="timeout 600 mpirun $ROOT --oversubscribe"
export OPENBLAS_NUM_THREADS=1

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "## bytes sent per device: the partitioner's report against each rank's count"
printf '%-18s %-16s %14s %14s %14s %s\n' model mesh partitioner "rank min" "rank max" match
status=0
for spec in mlp:data=1,model=4 mlp:data=2,model=4 transformer_block:data=2,model=2 transformer_block:data=2,model=4 \
	embedding:data=2,model=2 embedding:data=4,model=2 convnet:data=4 convnet:data=8; do
	ex=${spec%%:*} mesh=${spec#*:}
	n=$(echo "$mesh" | tr ',' '\n' | sed 's/.*=//' | awk 'BEGIN{p=1}{p*=$1}END{print p}')
	model="$src/examples/$ex.yaml"
	planned=$("$spmd" partition "$model" --mesh "$mesh" --json |
		/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["total_bytes_sent_per_device"])')
	counts=$(SPMD_MPI_STATS=1 $MPIRUN -np "$n" "$spmd" run "$model" --backend mpi --mesh "$mesh" |
		sed -n 's/^mpi rank [0-9]*: [0-9]* collectives, \([0-9]*\) bytes sent.*/\1/p')
	lo=$(echo "$counts" | sort -n | head -1) hi=$(echo "$counts" | sort -n | tail -1)
	match=yes
	[ "$lo" = "$planned" ] && [ "$hi" = "$planned" ] || match=no
	[ -z "$counts" ] && match=FAILED status=1
	printf '%-18s %-16s %14s %14s %14s %s\n' "$ex" "$mesh" "$planned" "$lo" "$hi" "$match"
done
echo
echo "## collectives on $ndev devices: threads"
"$dir/bench/bench_collectives" "$ndev" "$mib" || status=1
echo
echo "## collectives on $ndev devices: MPI (one process per device)"
$MPIRUN -np "$ndev" "$dir/bench/bench_mpi" "$mib" || status=1
echo
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
