#!/bin/sh
# verify_test.sh: `spmd verify DIR` on the per-device programs of
# `spmd partition --per-device DIR`.
#
# Usage: sh tests/verify_test.sh SPMD_BINARY SOURCE_DIR
#
# Every example (and every test model that partitions) must verify (exit 0).
# Copies broken by hand — a collective removed on one device, two swapped, a
# wrong group, shape, kind, reduction or member order, a permute whose
# partners do not pair up, a missing device file — must exit 1 with a first
# line `FILE:LINE:COL: error: device N: collective #K ...` that names the
# device and the collective.  Bad input — no such directory, a file that is
# not a per-device program, a device file of another program — must exit 2
# with `error: expected ...`.
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

# ---- every example verifies ----

for f in examples/*.yaml tests/mesh_models/*.yaml tests/models/part_*.yaml; do
	name=$(basename "$f" .yaml)
	dir="$tmp/ok_$name"
	if ! "$SPMD" partition "$f" --per-device "$dir" >/dev/null 2>"$tmp/err"; then
		case "$f" in
		examples/*) grep -q '^train:' "$f" || fail "$f" "spmd partition --per-device failed" ;;
		esac
		continue # a training step has no per-device files yet; bad test models are others' tests
	fi
	"$SPMD" verify "$dir" >"$tmp/out" 2>"$tmp/err"
	st=$?
	if [ "$st" -ne 0 ]; then
		fail "$f" "spmd verify exited $st, expected 0"
	elif ! grep -q ": ok: " "$tmp/out"; then
		fail "$f" "spmd verify printed no 'ok'"
	else
		pass
	fi
done

# ---- programs broken by hand ----

# Two all_reduces over `model` (a sum of [4] and a max of [2]) and one over
# `data`; device d has coordinates (d / 2, d % 2).
cat >"$tmp/two.yaml" <<'EOF'
name: two
mesh: {data: 2, model: 2}
inputs:
  x: {shape: [8, 6], sharding: [data, model]}
  z: {shape: [4, 10], sharding: [data, model]}
ops:
  - {out: a, op: reduce_sum, in: [x], axes: [1]}
  - {out: b, op: reduce_max, in: [z], axes: [1]}
  - {out: s, op: reduce_sum, in: [a], axes: [0]}
outputs: [s, b]
EOF

# A permute over [data, model], all_gathers, all_to_alls, a max all_reduce
# and a sum all_reduce over [data, model].
cat >"$tmp/mix.yaml" <<'EOF'
name: mix
mesh: {data: 2, model: 2}
inputs:
  x: {shape: [7, 6], sharding: [data, model]}
params:
  w: {shape: [6, 5], sharding: [model, null]}
ops:
  - {out: a, op: copy, in: [x], sharding: [model, data]}
  - {out: b, op: copy, in: [a], sharding: [null, [data, model]]}
  - {out: c, op: copy, in: [b], sharding: [data, null]}
  - {out: y, op: einsum, in: [c, w], eq: "bd,df->bf", sharding: [null, model]}
  - {out: m, op: reduce_max, in: [x], axes: [1]}
  - {out: s, op: reduce_mean, in: [x], axes: [0, 1]}
outputs: [y, b, m, s]
EOF

for m in two mix; do
	if ! "$SPMD" partition "$tmp/$m.yaml" --per-device "$tmp/$m" >/dev/null 2>"$tmp/err"; then
		fail "$m.yaml" "spmd partition --per-device failed"
	elif "$SPMD" verify "$tmp/$m" >/dev/null 2>"$tmp/err"; then
		pass
	else
		fail "$m.yaml" "the unbroken programs do not verify"
	fi
done

# copy NAME FROM: a fresh copy of the per-device dir FROM as $tmp/NAME
copy() {
	rm -rf "${tmp:?}/$1"
	cp -r "$tmp/$2" "$tmp/$1"
}

# broken NAME DEVICE TEXT...: spmd verify $tmp/NAME exits 1; its first line
# is FILE:LINE:COL: error: device DEVICE: collective #..., and holds every
# TEXT.  DEVICE is a pattern: '[0-3]' where any device may report.
broken() {
	name=$1 dev=$2
	shift 2
	"$SPMD" verify "$tmp/$name" >/dev/null 2>"$tmp/err"
	st=$?
	first=$(head -n 1 "$tmp/err")
	if [ "$st" -ne 1 ]; then
		fail "$name" "exit status $st, expected 1"
		return
	fi
	case "$first" in
	"$tmp/$name/device_"*.yaml:*:*": error: device "$dev": collective #"*) ;;
	*) fail "$name" "the first line is not 'FILE:LINE:COL: error: device $dev: collective #...'"; return ;;
	esac
	for t in "$@"; do
		case "$first" in
		*"$t"*) ;;
		*) fail "$name" "the message lacks '$t'"; return ;;
		esac
	done
	pass
}

# A collective removed on device 1: its max all_reduce becomes a copy.
copy removed two
sed -i -e 's/op: all_reduce, in: \[b%local\], axes: \[model\], reduce: max,/op: copy, in: [b%local],/' \
	-e '/out: b,/s/group: \[0, 1\], //' "$tmp/removed/device_1.yaml"
broken removed 0 "all_reduce [model] max" "waits forever for device 1" "has run all its 2 collectives"

# Two collectives swapped on device 1: b's ops before a's.
copy swapped two
sed -i -e '/out: a%local,/{h;d}' -e '/out: a, op: all_reduce/{H;d}' -e '/out: b, op: all_reduce/{p;x}' \
	"$tmp/swapped/device_1.yaml"
broken swapped 1 "does not match its group [0, 1]" "all_reduce [model] max of [2] f32 -> b" "as device 0 runs it"

# A wrong group: device 1 reduces a over `data` ({1, 3}) where its group is `model` ({0, 1}).
copy group two
sed -i 's/in: \[a%local\], axes: \[model\], reduce: sum, sharding: \[data\], global: \[8\], group: \[0, 1\]/in: [a%local], axes: [data], reduce: sum, sharding: [data], global: [8], group: [1, 3]/' \
	"$tmp/group/device_1.yaml"
broken group 1 "all_reduce [data] sum" "its group [1, 3]" "device 3"

# A wrong shape: device 1's block of x has 5 rows, so it reduces [5], not [4].
copy shape two
sed -i 's/^  x: .*/  x: {shape: [5, 3], global: [10, 6], dtype: f32, sharding: [data, model]}/' "$tmp/shape/device_1.yaml"
broken shape 1 "does not match" "of [4] f32 -> a" "of [5] f32 -> a"

# A wrong kind: device 1 permutes a where its group all_reduces it.
copy kind two
sed -i -e 's/op: all_reduce, in: \[a%local\], axes: \[model\], reduce: sum,/op: collective_permute, in: [a%local], axes: [model], shift: 1,/' \
	-e '/out: a,/s/group: \[0, 1\], //' "$tmp/kind/device_1.yaml"
broken kind 1 "expected all_reduce [model] sum" "found collective_permute [model]"

# A wrong reduction: max on device 2 where device 3 sums.
copy reduce two
sed -i 's/in: \[a%local\], axes: \[model\], reduce: sum,/in: [a%local], axes: [model], reduce: max,/' "$tmp/reduce/device_2.yaml"
broken reduce 2 "its group [2, 3]" "expected all_reduce [model] sum" "as device 3 runs it" "found all_reduce [model] max"

# Another member order: device 3 sums s over [model, data] ({0, 2, 1, 3}), the rest over [data, model].
copy order mix
sed -i '/out: s,/s/axes: \[data, model\]/axes: [model, data]/; /out: s,/s/group: \[0, 1, 2, 3\]/group: [0, 2, 1, 3]/' \
	"$tmp/order/device_3.yaml"
broken order 3 "all_reduce [model, data] sum" "waits forever for device 0" "all_reduce [data, model] sum"

# A permute whose partners do not pair: device 1 sends to 3, which keeps its own.
copy permute mix
grep -q 'targets: \[\[1, 2\], \[2, 1\]\]' "$tmp/permute/device_1.yaml" || fail permute "mix has no permute 1 <-> 2"
sed -i -e 's/targets: \[\[1, 2\], \[2, 1\]\]/targets: [[1, 3], [3, 1]]/' -e 's/send_to: 2, recv_from: 2/send_to: 3, recv_from: 3/' \
	"$tmp/permute/device_1.yaml"
broken permute 1 "collective_permute [data, model]" "sends to device 3" "expected device 3 to receive from device 1"

# A missing device file.
copy missing two
rm "$tmp/missing/device_2.yaml"
broken missing '[013]' "waits forever for device 2" "no program for device 2"

# --json: the same problem, as data.
"$SPMD" verify "$tmp/swapped" --json >"$tmp/out" 2>/dev/null
st=$?
if [ "$st" -ne 1 ] || ! grep -q '"ok": false' "$tmp/out" || ! grep -q '"device": 1' "$tmp/out" ||
	! grep -q '"op": "all_reduce"' "$tmp/out"; then
	fail "--json" "expected exit 1 and ok false, device 1, op all_reduce"
else
	pass
fi
"$SPMD" verify "$tmp/two" --json >"$tmp/out" 2>"$tmp/err"
if [ $? -ne 0 ] || ! grep -q '"ok": true' "$tmp/out" || ! grep -q '"collectives": 12' "$tmp/out"; then
	fail "--json ok" "expected exit 0, ok true and 12 collectives (3 on each of 4 devices)"
else
	pass
fi

# ---- bad input: exit 2 ----

# bad NAME DIR TEXT: spmd verify DIR exits 2 with an error whose first line holds TEXT.
bad() {
	"$SPMD" verify "$2" >/dev/null 2>"$tmp/err"
	st=$?
	first=$(head -n 1 "$tmp/err")
	if [ "$st" -ne 2 ]; then
		fail "$1" "exit status $st, expected 2"
	else
		case "$first" in
		*"error: expected"*"$3"*) pass ;;
		*) fail "$1" "the first line lacks 'error: expected ... $3'" ;;
		esac
	fi
}

bad nodir "$tmp/no_such_dir" "found '$tmp/no_such_dir'"
bad notdir "$tmp/two.yaml" "Not a directory"
mkdir "$tmp/empty"
bad empty "$tmp/empty" "found none"
copy extra two
echo notes >"$tmp/extra/notes.txt"
bad extra "$tmp/extra" "found 'notes.txt'"
copy model two
cp "$tmp/two.yaml" "$tmp/model/device_1.yaml"
bad model "$tmp/model" "found a model"
copy whole two
"$SPMD" partition "$tmp/two.yaml" -o "$tmp/whole/device_2.yaml" >/dev/null 2>&1
bad whole "$tmp/whole" "(spmd partition -o)"
copy renamed two
cp "$tmp/renamed/device_1.yaml" "$tmp/renamed/device_2.yaml"
bad renamed "$tmp/renamed" "found device: 1"
copy other two
cp "$tmp/mix/device_3.yaml" "$tmp/other/device_3.yaml"
bad other "$tmp/other" "found one of mix on mesh data=2,model=2"
copy range two
sed 's/^device: 1$/device: 7/' "$tmp/range/device_1.yaml" >"$tmp/range/device_7.yaml"
bad range "$tmp/range" "a device id in 0..3"
copy yaml two
printf 'spmd: true\nops: [\n' >"$tmp/yaml/device_0.yaml"
"$SPMD" verify "$tmp/yaml" >/dev/null 2>"$tmp/err"
st=$?
case "$(head -n 1 "$tmp/err")" in
"$tmp/yaml/device_0.yaml:"[0-9]*:[0-9]*": error: expected"*) [ "$st" -eq 2 ] && pass || fail yaml "exit status $st, expected 2" ;;
*) fail yaml "the first line is not FILE:LINE:COL: error: expected ..." ;;
esac
"$SPMD" verify >/dev/null 2>&1
[ $? -eq 2 ] && pass || fail usage "spmd verify without DIR must exit 2"
"$SPMD" verify --help >"$tmp/out" 2>&1
[ $? -eq 0 ] && grep -q "usage: spmd verify DIR" "$tmp/out" && pass || fail help "spmd verify --help"

echo "$npass passed, $nfail failed"
[ "$nfail" -eq 0 ]
