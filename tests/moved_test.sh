#!/bin/sh
# moved_test.sh SPMD SOURCE_DIR: an operand moved once for readers close
# together (docs/partitioning.md, "An operand moved once").
#
#  1. The trained sequence-parallel attention of tests/moved/: the norm's
#     result h, split on the sequence, is read by the query, key and value
#     projections, which need it gathered: two all_gathers of h in the
#     training step (the forward's and the backward's, for the weights'
#     gradients), not six; `spmd run --steps 2 --check` passes on
#     {data: 2, model: 2} and on uneven {data: 1, model: 5}; under mpirun
#     (when present) the MPI backend saves the params the threads do.
#  2. Two readers of h 16 ops apart read one gather; 17 apart, the second
#     gathers again (the moved copy is not kept alive across the step), and
#     both programs run checked.
SPMD=$1
SRC=$2
. "$SRC/tests/script_setup.sh"
T=$tmp
. "$SRC/tests/assert_lib.sh"
. "$SRC/tests/mpi_lib.sh"

# the all_gathers of value root $2 in the program of model $1, counted
gathers() {
	"$SPMD" partition "$1" --json > "$T/json" 2> "$T/out" || { echo -1; return; }
	"$PY" - "$T/json" "$2" <<'PY'
import json, sys
j, root = json.load(open(sys.argv[1])), sys.argv[2]
print(sum(c["op"] == "all_gather" and c["value"].split("%")[0] == root for c in j["collectives"]))
PY
}

model="$SRC/tests/moved/seqpar_attn.yaml"
n=$(gathers "$model" h)
if [ "$n" = 2 ]; then ok; else bad "seqpar_attn: expected 2 all_gathers of h, found $n"; fi
for mesh in data=2,model=2 data=1,model=5; do
	if "$SPMD" run "$model" --steps 2 --check --mesh $mesh > "$T/out" 2>&1 && ! grep -q MISMATCH "$T/out"; then ok
	else bad "seqpar_attn --check on $mesh: $(tail -3 "$T/out")"; fi
done
if command -v mpirun > /dev/null 2>&1; then
	if mpi_matches "$model" data=2,model=2 4 2 "$T"; then ok; else bad "seqpar_attn: MPI against threads"; fi
fi

# h read by an einsum, then by another after a chain of $1 negations
far() {
	"$PY" - "$1" > "$T/far$1.yaml" <<'PY'
import sys
n = int(sys.argv[1])
print("name: far\nmesh: {data: 1, model: 2}\ninputs:\n  x: {shape: [2, 8, 4], sharding: [data, model, null]}")
print("params:\n  wq: {shape: [4, 2, 2], sharding: [null, model, null], init: {normal: 0.3}}")
print("  wr: {shape: [4, 2, 2], sharding: [null, model, null], init: {normal: 0.3}}\nops:")
print("  - {out: h, op: layer_norm, in: [x]}")
print('  - {out: q, op: einsum, in: [h, wq], eq: "bsm,mhd->bshd", sharding: [data, null, model, null]}')
prev = "q"
for i in range(n):
    print("  - {out: t%d, op: neg, in: [%s]}" % (i, prev))
    prev = "t%d" % i
print('  - {out: r, op: einsum, in: [h, wr], eq: "bsm,mhd->bshd", sharding: [data, null, model, null]}')
print("  - {out: s, op: add, in: [%s, r]}\noutputs: [s]" % prev)
PY
}
for spec in 15:1 16:2; do
	k=${spec%:*} want=${spec#*:}
	far "$k"
	n=$(gathers "$T/far$k.yaml" h)
	if [ "$n" = "$want" ]; then ok; else bad "readers $((k + 1)) ops apart: expected $want all_gathers of h, found $n"; fi
	if "$SPMD" run "$T/far$k.yaml" --check > "$T/out" 2>&1 && ! grep -q MISMATCH "$T/out"; then ok
	else bad "readers $((k + 1)) ops apart: --check: $(tail -3 "$T/out")"; fi
done

echo "moved_test: $pass passed, $fail failed"
[ "$fail" = 0 ]
