#!/bin/sh
# resources_test.sh: runs that cannot have the memory or the threads they need
# end in an error naming why (exit 2), never an abort or a "mismatch"; `spmd
# cost` on a threads profile agrees with what `spmd run --memory` refuses.
# usage: sh resources_test.sh SPMD_BINARY SOURCE_DIR
SPMD=${1:?usage: resources_test.sh SPMD SOURCE_DIR}
SRC=${2:?usage: resources_test.sh SPMD SOURCE_DIR}
tmp=${TMPDIR:-/tmp}/resources_test.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}
pass() { passes=$((passes + 1)); }

# error NAME STATUS PATTERN ARGS...: exit status STATUS and PATTERN on stderr.
error() {
	name=$1 want=$2 pat=$3
	shift 3
	"$SPMD" "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ "$rc" = "$want" ] || { fail "$name: exit status $rc, expected $want"; cat "$tmp/err"; return; }
	if grep -q -- "$pat" "$tmp/err"; then pass; else fail "$name: expected '$pat' on stderr, found: $(cat "$tmp/err")"; fi
}

mlp=$SRC/examples/mlp.yaml
# the peak of every device (liveness) against --memory, naming the largest tensors per device
error "run over --memory" 2 "mlp.yaml:10:3: error: expected a run that fits in the 1000000 bytes of memory available (--memory), found a peak of 17563648 bytes (8 devices x 2195456 bytes, by liveness); the largest tensors per device: w1 (f32 \[512, 512\], 1048576 bytes" \
	run "$mlp" --memory 1e6
error "run --check over --memory" 2 "and the reference's 8978432 bytes" run "$mlp" --check --memory 2e7
error "reference over --memory" 2 "the reference executor's 8978432 bytes.*largest tensors: w1 (f32 \[512, 2048\]" run "$mlp" --backend ref --memory 8e6
error "bad --memory" 2 "expected a number of bytes from 1000 to 1e18 after --memory (8e9, 16GB, 16GiB), found '12x'" run "$mlp" --memory 12x
for bad in 12Gx GB 1.5Xi 0.5kB -1GB 2e18 nan; do
	error "bad --memory $bad" 2 "after --memory (8e9, 16GB, 16GiB), found '$bad'" run "$mlp" --memory "$bad"
done
# units: 1MB is 1e6 bytes (too little), 30MiB 31457280 (enough)
error "run over --memory 1MB" 2 "fits in the 1000000 bytes of memory available" run "$mlp" --memory 1MB
error "run over --memory 0.5mib" 2 "fits in the 524288 bytes of memory available" run "$mlp" --memory 0.5mib
"$SPMD" run "$mlp" --check --memory 30MiB >"$tmp/out" 2>&1 && pass || fail "run within --memory 30MiB: $(cat "$tmp/out")"
"$SPMD" run "$mlp" --check --memory 3e7 >"$tmp/out" 2>&1 && pass || fail "run within --memory: $(cat "$tmp/out")"

# training steps too: on threads (every device of the step) and on the reference
train=$SRC/examples/train_transformer.yaml
error "training over --memory" 2 "train_transformer.yaml:[0-9]*:[0-9]*: error: expected a run that fits in the 100000 bytes of memory available (--memory), found a peak of [0-9]* bytes (4 devices x" \
	run "$train" --steps 2 --memory 1e5
error "training on the reference over --memory" 2 "expected a run that fits in the 1000 bytes .*the reference executor's" \
	run "$train" --steps 2 --backend ref --memory 1e3
"$SPMD" run "$train" --steps 2 --check --memory 1e7 >"$tmp/out" 2>&1 && pass || fail "training within --memory: $(cat "$tmp/out")"

# a small model whose tensors need more than any machine has: refused before it starts (default: memory free)
cat >"$tmp/huge.yaml" <<'YAML'
name: huge
inputs:
  x: {shape: [1000000, 1000000], dtype: f32}
ops:
  - {out: y, op: neg, in: [x]}
outputs: [y]
YAML
error "a model larger than the machine" 2 "huge.yaml:3:3: error: expected a run that fits in the .* bytes of memory available" run "$tmp/huge.yaml"

# spmd cost on a threads (local) profile: fits exactly when run --memory CAPACITY runs
for cap in 1e6 3e7; do
	printf 'name: local\ncompute: {f32: 1e10}\nmemory: {bandwidth: 1e10, capacity: %s}\ninterconnect: {topology: threads, dims: [8], link_bandwidth: 1e10, latency: 1e-6}\n' \
		"$cap" >"$tmp/local.yaml"
	"$SPMD" cost "$mlp" --hardware "$tmp/local.yaml" --json >"$tmp/cost" 2>&1 || fail "cost on capacity $cap"
	fits=$(grep -c '"fits": true' "$tmp/cost")
	"$SPMD" run "$mlp" --memory "$cap" >/dev/null 2>&1
	rc=$?
	if { [ "$fits" -ge 1 ] && [ "$rc" = 0 ]; } || { [ "$fits" = 0 ] && [ "$rc" = 2 ]; }; then pass
	else fail "cost and run disagree at capacity $cap: fits=$fits, run exit $rc"; fi
done

# Threads that cannot start, and allocation that fails: an address-space limit
# (ulimit -v holds for root too).  Not under AddressSanitizer, which needs
# terabytes of address space for itself.
if grep -q __asan_init "$SPMD" 2>/dev/null; then
	echo "resources_test: the limits part skipped (AddressSanitizer build)"
else
	# 256 device threads with 4 MiB stacks do not fit in 400 MB (OpenBLAS's
	# own threads are kept out: below about 200 MB it cannot start itself)
	export OPENBLAS_NUM_THREADS=1
	(ulimit -v 400000 && exec timeout 120 "$SPMD" reshard --mesh d=256 --shape 256 --from '[d]' --to '[null]' --check) \
		>"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" = 2 ] && grep -q "error: --check: cannot start thread [0-9]* of 256 (one per device): " "$tmp/err" &&
		! grep -q mismatch "$tmp/out" "$tmp/err"; then pass
	else fail "reshard --check without threads: exit $rc, $(cat "$tmp/err" "$tmp/out" | head -5)"; fi
	# no einsum here: OpenBLAS, when its own buffers cannot be mapped, can
	# spin forever in blas_memory_alloc (seen under ulimit -v with 256
	# threads), which no error path of spmd can reach
	cat >"$tmp/ew.yaml" <<'EOF'
mesh: {data: 16, model: 16}
inputs: {x: {shape: [64, 512], sharding: [data, model]}}
ops:
  - {out: a, op: tanh, in: [x]}
  - {out: b, op: reduce_sum, in: [a], axes: [1]}
outputs: [b]
EOF
	(ulimit -v 400000 && exec timeout 120 "$SPMD" run "$tmp/ew.yaml" --memory 1e9) >"$tmp/out" 2>"$tmp/err"
	rc=$?
	# which runs out first, the threads' stacks or a device's buffers, depends
	# on timing: either is an error with its reason, exit 2, never a mismatch
	if [ "$rc" = 2 ] && grep -q "cannot start thread [0-9]* of 256 (one per device)\|expected memory for the run, found none: cannot allocate" "$tmp/err" &&
		! grep -q mismatch "$tmp/out" "$tmp/err"; then pass
	else fail "run without threads: exit $rc, $(head -5 "$tmp/err")"; fi
	# --memory says the machine has room: the allocation that fails is an error, not an abort
	(ulimit -v 400000 && exec timeout 120 "$SPMD" run "$tmp/huge.yaml" --memory 1e18) >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" = 2 ] && grep -q "error: expected memory for the run, found none: cannot allocate" "$tmp/err"; then pass
	else fail "allocation failure: exit $rc (134 is an abort), $(head -5 "$tmp/err")"; fi
fi

echo "resources_test: $passes passed, $fails failed"
[ "$fails" = 0 ]
