#!/bin/sh
# emit_test.sh: partitioned programs written by `spmd partition -o` and
# `--per-device`, read back and run by `spmd run`.
#
# Usage: sh tests/emit_test.sh SPMD_BINARY SOURCE_DIR
#
# For every example (and every test model that runs), the program written
# with -o must give, with the same seed, the same printed statistics and the
# same .npy outputs, byte for byte, as the model itself; --per-device must
# write exactly device_0.yaml .. device_{N-1}.yaml, each itself runnable.
# A program written by hand (tests/programs/shard_roll.yaml) must give the
# outputs it computes two ways alike.
# Every tests/bad_programs/NAME.yaml starts with `# expect: LINE:COL: TEXT`:
# `spmd run` must exit 2 with `FILE:LINE:COL: error: expected...` containing
# TEXT as its first line of stderr.
SPMD=$1
SRC=${2:-.}
cd "$SRC" || exit 1
ulimit -c 0 2>/dev/null
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

npass=0
nfail=0
fail() {
	echo "FAIL $1: $2"
	[ -f "$tmp/err" ] && sed 's/^/    /' "$tmp/err" | head -n 5
	nfail=$((nfail + 1))
}
pass() { npass=$((npass + 1)); }

# ---- models made here: every kind of reshard step, quoting, device orders ----

cat >"$tmp/reshards.yaml" <<'EOF'
# a permute, all_gathers, all_to_alls, shard_slices, a mask, a max all_reduce
name: reshards
mesh: {data: 2, model: 2}
inputs:
  x: {shape: [7, 6], sharding: [data, model]}
  ids: {shape: [5], dtype: i32, sharding: [data]}
params:
  w: {shape: [6, 5], sharding: [model, null]}
  t: {shape: [9, 3], sharding: [null, model]}
ops:
  - {out: a, op: copy, in: [x], sharding: [model, data]}
  - {out: b, op: copy, in: [a], sharding: [null, [data, model]]}
  - {out: c, op: copy, in: [b], sharding: [data, null]}
  - {out: y, op: einsum, in: [c, w], eq: "bd,df->bf", sharding: [null, model]}
  - {out: m, op: reduce_max, in: [x], axes: [1]}
  - {out: e, op: take, in: [t, ids], sharding: [null, null]}
  - {out: s, op: reduce_mean, in: [x], axes: [0, 1]}
outputs: [y, b, m, e, s]
EOF

cat >"$tmp/quoting.yaml" <<'EOF'
# names YAML would read as null or booleans, a device order, odd strings and numbers
name: "wéird: model	#1"
mesh: {axes: {"true": 2, m: 2}, devices: [3, 1, 2, 0], hardware: "tpu v3"}
inputs:
  "null": {shape: [5, 4], dtype: bf16, sharding: ["true", null]}
params:
  w: {shape: [4, 3], dtype: bf16, sharding: [m, null], init: {uniform: [-0.5, 0.25]}}
ops:
  - {out: "True", op: einsum, in: ["null", w], eq: "bd,df->bf", sharding: [null, null]}
  - {out: s, op: reduce_mean, in: ["True"], axes: [0]}
  - {out: p, op: pad, in: [s], low: [1], high: [2], value: -.inf}
  - {out: q, op: mul, in: [p, -0.0]}
outputs: [s, q, "True"]
EOF

cat >"$tmp/lookup.yaml" <<'EOF'
# a bf16 mean split unevenly (a rounded constant), ids into a table split by rows
mesh: {data: 2, model: 2}
inputs:
  x: {shape: [5, 6], dtype: bf16, sharding: [data, model]}
  ids: {shape: [3, 2], dtype: i32, sharding: [data, null]}
params:
  tab: {shape: [7, 4], sharding: [model, null]}
ops:
  - {out: m, op: reduce_mean, in: [x], axes: [0, 1]}
  - {out: e, op: take, in: [tab, ids], sharding: [data, null, null]}
  - {out: r, op: reshape, in: [ids], shape: [6]}
  - {out: e2, op: take, in: [tab, r]}
outputs: [m, e, e2]
EOF

# ---- round trips ----

# Are the .npy files of $1 and $2 the same set, byte for byte?
same_outputs() {
	for f in "$1"/*.npy; do
		cmp -s "$f" "$2/${f##*/}" || return 1
	done
	[ "$(ls "$1")" = "$(ls "$2")" ]
}

# Does $1 hold exactly device_0.yaml .. device_{$2-1}.yaml?
exact_device_files() {
	want=$(i=0; while [ "$i" -lt "$2" ]; do echo "device_$i.yaml"; i=$((i + 1)); done | sort)
	[ "$(ls "$1" | sort)" = "$want" ]
}

# round_trip MODEL STRICT: with STRICT=0 a model that does not run is skipped.
# A program is the forward pass: a model's train: section is dropped, and
# with it a pipeline (what is pipelined is the training step: its programs
# round-trip in tests/pipeline_test.sh).
round_trip() {
	m=$1
	if grep -q '^train:' "$m"; then
		awk '/^[^ #]/ { skip = /^train:/ || /^pipeline:/ } !skip' "$m" | sed 's/, stage: [0-9]*//' >"$tmp/forward.yaml"
		m=$tmp/forward.yaml
	fi
	rm -rf "$tmp/a" "$tmp/b" "$tmp/dev" "$tmp/err"
	if ! "$SPMD" run "$m" --seed 7 --save "$tmp/a" >"$tmp/a.out" 2>"$tmp/err"; then
		[ "$2" = 1 ] && fail "$1" "spmd run MODEL failed"
		return
	fi
	if ! "$SPMD" partition "$m" -o "$tmp/p.yaml" --per-device "$tmp/dev" >"$tmp/listing" 2>"$tmp/err"; then
		fail "$1" "spmd partition -o --per-device failed"
		return
	fi
	if ! "$SPMD" run "$tmp/p.yaml" --seed 7 --save "$tmp/b" >"$tmp/b.out" 2>"$tmp/err"; then
		fail "$1" "spmd run PROGRAM failed"
		return
	fi
	cmp -s "$tmp/a.out" "$tmp/b.out" || { fail "$1" "model and program print different outputs"; return; }
	same_outputs "$tmp/a" "$tmp/b" || { fail "$1" "model and program save different .npy files"; return; }
	ndev=$(sed -n '1s/.*(\([0-9]*\) devices*).*/\1/p' "$tmp/listing")
	exact_device_files "$tmp/dev" "$ndev" || { fail "$1" "expected device_0..$((ndev - 1)).yaml in --per-device"; return; }
	last=$((ndev - 1))
	for f in "$tmp/dev/device_0.yaml" "$tmp/dev/device_$last.yaml"; do
		"$SPMD" run "$f" --seed 7 >"$tmp/c.out" 2>"$tmp/err" && cmp -s "$tmp/c.out" "$tmp/a.out" ||
			{ fail "$1" "${f##*/} does not run like the program"; return; }
	done
	pass
}

for m in examples/*.yaml "$tmp/reshards.yaml" "$tmp/quoting.yaml" "$tmp/lookup.yaml"; do
	round_trip "$m" 1
done
for m in tests/models/*.yaml tests/mesh_models/*.yaml; do
	[ -f "$m" ] && round_trip "$m" 0
done

# ---- --per-device directories ----

d="$tmp/devices"
"$SPMD" partition examples/mlp.yaml --per-device "$d" >/dev/null 2>"$tmp/err" && exact_device_files "$d" 8 &&
	"$SPMD" partition examples/mlp.yaml --mesh data=1,model=2 --per-device "$d" >/dev/null 2>"$tmp/err" &&
	exact_device_files "$d" 2 && pass || fail "--per-device" "stale device files of a larger mesh not removed"

mkdir -p "$tmp/mine" && echo keep >"$tmp/mine/notes.txt"
"$SPMD" partition examples/mlp.yaml --per-device "$tmp/mine" >/dev/null 2>"$tmp/err"
st=$?
if [ "$st" -ne 2 ] || [ "$(ls "$tmp/mine")" != notes.txt ] || ! grep -q "error: expected a directory holding only" "$tmp/err"; then
	fail "--per-device" "a directory with other files: status $st, expected 2 and nothing written"
else
	pass
fi

"$SPMD" partition examples/mlp.yaml -o "$tmp/no/such/dir/p.yaml" >/dev/null 2>"$tmp/err"
st=$?
[ "$st" -eq 2 ] && grep -q "cannot write" "$tmp/err" && [ ! -e "$tmp/no" ] && pass ||
	fail "-o" "an unwritable path: status $st, expected 2 and a message"

# ---- programs where a model is expected ----

"$SPMD" partition examples/mlp.yaml -o "$tmp/mlp.yaml" >/dev/null 2>&1
"$SPMD" run "$tmp/mlp.yaml" --check >/dev/null 2>"$tmp/err"
st=$?
[ "$st" -eq 2 ] && grep -q "expected a model for --check" "$tmp/err" && pass ||
	fail "run PROGRAM --check" "status $st, expected 2"
"$SPMD" check "$tmp/mlp.yaml" >/dev/null 2>"$tmp/err"
st=$?
[ "$st" -eq 2 ] && head -n 1 "$tmp/err" | grep -q "^$tmp/mlp.yaml:3:7: error: expected a model, found a partitioned program" &&
	pass || fail "check PROGRAM" "status $st, expected 2 and 'expected a model'"

# --input takes the whole tensor for a program as for the model
"$SPMD" run examples/mlp.yaml --seed 3 --save "$tmp/in" >/dev/null 2>&1
rm -rf "$tmp/a" "$tmp/b"
"$SPMD" run examples/mlp.yaml --input x="$tmp/in/y.npy" --save "$tmp/a" >"$tmp/a.out" 2>"$tmp/err" &&
	"$SPMD" run "$tmp/mlp.yaml" --input x="$tmp/in/y.npy" --save "$tmp/b" >"$tmp/b.out" 2>"$tmp/err" &&
	cmp -s "$tmp/a.out" "$tmp/b.out" && same_outputs "$tmp/a" "$tmp/b" && pass ||
	fail "run PROGRAM --input" "outputs differ from the model's"

# ---- a program written by hand: shard_roll after an all_gather ----

# tests/programs/shard_roll.yaml computes each roll's expected result from
# the gathered input by slices: the pairs must be equal, byte for byte.
rm -rf "$tmp/roll"
if ! "$SPMD" run tests/programs/shard_roll.yaml --save "$tmp/roll" >/dev/null 2>"$tmp/err"; then
	fail shard_roll "spmd run PROGRAM failed"
else
	for pair in x:y1 z2:y2 z3:y3 x:y4; do
		cmp -s "$tmp/roll/${pair%:*}.npy" "$tmp/roll/${pair#*:}.npy" && pass ||
			fail shard_roll "${pair#*:} differs from ${pair%:*}"
	done
fi

# ---- bad programs ----

for f in tests/bad_programs/*.yaml; do
	expect=$(sed -n '1s/^# expect: //p' "$f")
	pos=${expect%%: *}
	frag=${expect#*: }
	"$SPMD" run "$f" >/dev/null 2>"$tmp/err"
	st=$?
	first=$(head -n 1 "$tmp/err")
	if [ -z "$expect" ]; then
		fail "$f" "no '# expect:' line"
	elif [ "$st" -ne 2 ]; then
		fail "$f" "exit status $st, expected 2"
	else
		case "$first" in
		"$f:$pos: error: expected"*)
			case "$first" in
			*"$frag"*) pass ;;
			*) fail "$f" "message lacks '$frag'" ;;
			esac ;;
		*) fail "$f" "stderr does not start with '$f:$pos: error: expected'" ;;
		esac
	fi
done

echo "$npass passed, $nfail failed"
[ "$nfail" -eq 0 ]
