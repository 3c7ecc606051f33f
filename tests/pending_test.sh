#!/bin/sh
# pending_test.sh SPMD SOURCE_DIR: pending sums meet before they are reduced.
#
# For the trained Megatron block and PaLM parallel block of tests/pending/
# (heads and MLP hidden layer on `model`, batch on `data`), with collective
# grouping on (the default group_bytes) and off:
#  1. the collectives over `model` are the analytic ones: Megatron 2 in the
#     forward pass and 2 in the backward pass, PaLM 1 and 1; each an
#     all_reduce of one activation shard (no larger buffers), in all
#     4 x and 2 x its bytes;
#  2. `spmd run --steps 3 --check` passes on threads, on {data: 2, model: 2}
#     and on uneven {data: 3, model: 3};
#  3. under mpirun (when present) --backend mpi --check passes and saves the
#     params the thread backend saves, bit for bit.
SPMD=$1
SRC=$2
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/mpi_lib.sh"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; [ -f "$T/out" ] && sed 's/^/    /' "$T/out" | tail -6; }

for spec in megatron_block:4 palm_block:2; do
	name=${spec%:*} want=${spec#*:}
	model="$SRC/tests/pending/$name.yaml"
	sed 's/^  steps: 3$/  steps: 3\n  group_bytes: 0/' "$model" > "$T/${name}_g0.yaml"
	for m in "$model" "$T/${name}_g0.yaml"; do
		if ! "$SPMD" partition "$m" --json > "$T/json" 2> "$T/out"; then bad "partition $m"; continue; fi
		if $PY - "$T/json" "$want" <<'PY' > "$T/out" 2>&1
import json, sys
j, want = json.load(open(sys.argv[1])), int(sys.argv[2])
act = 2 * 6 * 8 * 4  # one activation shard: [2, 6, 8] f32
mc = [c for c in j["collectives"] if c["axes"] == ["model"]]
assert len(mc) == want, [(c["op"], c["value"]) for c in mc]
assert all(c["op"] == "all_reduce" and c["bytes_per_device"] == act for c in mc), mc
assert sum(c["bytes_per_device"] for c in mc) == want * act
PY
		then ok; else bad "$name ($m): $want all_reduces over model"; fi
	done
	for mesh in data=2,model=2 data=3,model=3; do
		if "$SPMD" run "$model" --steps 3 --check --mesh $mesh > "$T/out" 2>&1 && ! grep -q MISMATCH "$T/out"; then ok
		else bad "$name --check on $mesh"; fi
	done
	if command -v mpirun > /dev/null 2>&1; then
		if mpi_matches "$model" data=2,model=2 4 3 "$T"; then ok; else bad "$name: MPI against threads"; fi
	fi
done

echo "pending_test: $pass passed, $fail failed"
[ "$fail" = 0 ]
