#!/bin/sh
# shared_test.sh SPMD SOURCE_DIR: params read by several ops train exactly,
# with their gradient contributions summed before one reduction.
#
# tests/shared/tied.yaml ties an embedding (take and einsum with one table),
# reuses one weight in two layers and reads one weight as it is and
# transposed; sizes do not divide the meshes.  For every optimizer, weight-
# update sharding off, on and auto, all_gather after_update and before_use,
# clipping and bf16 gradients, on 1-D ({data: 3}, {data: 4}, and {data: 8},
# more devices than the batch has rows) and 2-D meshes (model parallelism on
# the other axis):
#  1. `spmd run --steps 3 --check` on threads passes;
#  2. with group_bytes 0, each param's gradient is reduced over `data` by one
#     collective (a reduce_scatter or an all_reduce: never one per use; none
#     where nothing is pending, when the batch is not split);
#  3. under mpirun (when present), --backend mpi --check passes and saves
#     the params the thread backend saves, bit for bit.
SPMD=$1
SRC=$2
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/mpi_lib.sh"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; [ -f "$T/out" ] && sed 's/^/    /' "$T/out" | tail -6; }

# variant NAME OPTIMIZER WUS EXTRA: the model with those train lines
variant() {
	sed -e "s/type: adam, lr: 0.01/type: $2, lr: 0.01/" -e "s/weight_update_sharding: on/weight_update_sharding: $3$4/" \
		"$SRC/tests/shared/tied.yaml" > "$T/$1.yaml"
	echo "$T/$1.yaml"
}
check() { # MODEL MESH WHAT
	if "$SPMD" run "$1" --steps 3 --check --mesh "$2" > "$T/out" 2>&1; then ok; else bad "$3 on $2"; fi
}

MESHES="data=3,model=1 data=4,model=1 data=8,model=1 data=2,model=2 data=3,model=2 data=2,model=3"
for opt in sgd momentum adam adamw lamb; do
	for wus in off on auto; do
		m=$(variant "${opt}_$wus" $opt $wus "")
		for mesh in $MESHES; do check "$m" $mesh "$opt wus=$wus"; done
	done
	m=$(variant "${opt}_bu" $opt on "\n  all_gather: before_use")
	for mesh in $MESHES; do check "$m" $mesh "$opt before_use"; done
done
m=$(variant clip adamw on "\n  clip_global_norm: 0.5")
for mesh in data=3,model=1 data=3,model=2; do check "$m" $mesh "adamw + clipping"; done
m=$(variant bf16 adam on "\n  grad_dtype: bf16")
for mesh in data=4,model=1 data=2,model=2; do check "$m" $mesh "adam + bf16 gradients"; done
m=$(variant lamb_all lamb on "\n  all_gather: before_use\n  clip_global_norm: 0.5\n  grad_dtype: bf16")
for mesh in data=3,model=2 data=4,model=1; do check "$m" $mesh "lamb + before_use + clipping + bf16"; done

# 2. one reduction of each param's gradient over data
for wus in off on; do
	for extra in "" "\n  all_gather: before_use" "\n  grad_dtype: bf16"; do
		m=$(variant "count_$wus" adam $wus "$extra\n  group_bytes: 0")
		for mesh in data=4,model=1 data=8,model=1 data=3,model=2; do
			if ! "$SPMD" partition "$m" --mesh $mesh --json > "$T/json" 2> "$T/out"; then
				bad "partition $wus $extra on $mesh"; continue; fi
			if $PY - "$T/json" $mesh <<'PY' > "$T/out" 2>&1
import json, math, sys
j = json.load(open(sys.argv[1]))
numel = lambda v: math.prod(j["values"][v]["local_shape"]) if v in j["values"] else 0
red = [c for c in j["collectives"] if c["op"] in ("all_reduce", "reduce_scatter") and "data" in c["axes"]
       and numel(c["value"]) != 1]
params = [w["param"] for w in j["weight_update_sharding"]]
assert len(params) == 3, params
per = {p: [c for c in red if "d%" + p + ")" in c["reason"] or c["value"] in ("d%" + p, p + "%grad")] for p in params}
# on {data: 8} the batch (6 rows) is not split: only the take's rows come
# out pending, the other gradients are whole on every device
want = (lambda n: n <= 1) if sys.argv[2].startswith("data=8") else (lambda n: n == 1)
assert all(want(len(v)) for v in per.values()), {p: [(c["op"], c["value"]) for c in v] for p, v in per.items()}
assert len(red) == sum(len(v) for v in per.values()), [(c["op"], c["value"], c["reason"][:80]) for c in red]
PY
			then ok; else bad "one reduction per gradient, wus=$wus$extra on $mesh"; fi
		done
	done
done

# 3. MPI: the same steps, one rank per device
if command -v mpirun > /dev/null 2>&1; then
	for v in adam:on lamb:on:before_use momentum:off; do
		opt=${v%%:*} rest=${v#*:}
		wus=${rest%%:*} extra=""
		[ "$rest" = on:before_use ] && extra="\n  all_gather: before_use"
		m=$(variant "mpi_$opt" $opt $wus "$extra")
		if mpi_matches "$m" data=2,model=2 4 3 "$T"; then ok; else bad "$v: MPI against threads"; fi
	done
fi

echo "shared_test: $pass passed, $fail failed"
[ "$fail" = 0 ]
