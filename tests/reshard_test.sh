#!/bin/sh
# reshard_test.sh: `spmd reshard` end to end — plans run with --check, JSON fields, exit codes and errors.
# usage: sh reshard_test.sh SPMD_BINARY SOURCE_DIR
SPMD=${1:?usage: reshard_test.sh SPMD SOURCE_DIR}
SRC=${2:?usage: reshard_test.sh SPMD SOURCE_DIR}
. "$SRC/tests/script_setup.sh"
fails=0

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

# plan NAME EXPECTED_STATUS PY_ASSERTS ARGS...: run with --check --json; the
# Python expressions in PY_ASSERTS (one per line) see the parsed output as j.
plan() {
	name=$1 want=$2 asserts=$3
	shift 3
	"$SPMD" reshard "$@" --check --json >"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ "$rc" = "$want" ] || { fail "$name: exit status $rc, expected $want"; cat "$tmp/err"; return; }
	printf '%s\n' "$asserts" >"$tmp/asserts"
	"$PY" - "$tmp/out" "$tmp/asserts" <<'EOF' || fail "$name: $(cat "$tmp/out")"
import json, sys
j = json.load(open(sys.argv[1]))          # stdout must hold the JSON alone
assert set(j) == {"steps", "bytes_per_device", "bytes_sent_per_device", "check"}, j.keys()
assert j["bytes_per_device"] == sum(s["bytes_per_device"] for s in j["steps"])
assert j["bytes_sent_per_device"] == sum(s["bytes_sent_per_device"] for s in j["steps"])
ops = [s["op"] for s in j["steps"]]
colls = [s for s in j["steps"] if s["op"] != "slice"]
for line in open(sys.argv[2]):
    if line.strip():
        assert eval(line), line.strip()
EOF
}

# error NAME PATTERN ARGS...: exit status 2 and PATTERN on stderr.
error() {
	name=$1 pattern=$2
	shift 2
	"$SPMD" reshard "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ "$rc" = 2 ] || fail "$name: exit status $rc, expected 2"
	grep -q -- "$pattern" "$tmp/err" || fail "$name: stderr lacks '$pattern': $(cat "$tmp/err")"
	[ ! -s "$tmp/out" ] || fail "$name: wrote to stdout: $(cat "$tmp/out")"
}

M="--mesh data=2,model=4"

plan a2a 0 'ops == ["all_to_all"]
j["steps"][0]["axes"] == ["data"]
j["steps"][0]["bytes_per_device"] == 256
j["steps"][0]["bytes_sent_per_device"] == 128
j["steps"][0]["split_dim"] == 1 and j["steps"][0]["concat_dim"] == 0
j["check"] == "ok"' $M --shape 8,16 --from '[data, null]' --to '[null, data]'

plan all_reduce 0 'ops == ["all_reduce"]
j["steps"][0]["axes"] == ["model"] and j["steps"][0]["reduce"] == "sum"
j["bytes_sent_per_device"] == 768
j["check"] == "ok"' $M --shape 8,16 --from '{dims: [null, null], partial: [model]}' --to '[null, null]'

plan reduce_scatter 0 '[s["op"] for s in colls] == ["reduce_scatter"]
colls[0]["axes"] == ["data", "model"]
j["check"] == "ok"' $M --shape 8,16 --from '{dims: [null, null], partial: [data, model]}' --to '[[data, model], null]'

plan partial_max 0 '[s["op"] for s in colls] == ["reduce_scatter"]
colls[0]["reduce"] == "max"
j["check"] == "ok"' $M --shape 6,5 --from '{dims: [null, null], partial: {axes: [model], reduce: max}}' --to '[null, model]'

plan all_gather 0 'set(ops) == {"all_gather"}
j["check"] == "ok"' $M --shape 8,16 --from '[data, model]' --to '[null, null]'

plan slice 0 'ops == ["slice"]
j["bytes_per_device"] == 0 and j["bytes_sent_per_device"] == 0
j["check"] == "ok"' $M --shape 8,16 --from '[null, null]' --to '[model, data]'

plan axis_order 0 'ops == ["collective_permute"]
len(j["steps"][0]["pairs"]) > 0
j["check"] == "ok"' $M --shape 8,16 --from '[[data, model], null]' --to '[[model, data], null]'

plan device_order 0 'ops == ["collective_permute"]
j["steps"][0]["pairs"] == [[0, 3], [1, 2], [2, 1], [3, 0]]
j["check"] == "ok"' --mesh data=2,model=2 --to-devices 3,2,1,0 --shape 4,6 --from '[data, model]' --to '[data, model]'

plan no_full_gather 0 '"all_gather" not in ops
j["check"] == "ok"' --mesh data=2,model=2 --shape 16,16 --from '[[data, model], null]' --to '[model, data]'

plan uneven 0 'j["check"] == "ok"' $M --shape 5,3 --from '[[model, data], null]' --to '[null, [data, model]]'
plan uneven_partial 0 'j["check"] == "ok"' $M --shape 7,3 --from '{dims: [null, data], partial: [model]}' --to '[model, null]'
plan i32 0 'j["check"] == "ok"' $M --shape 6,10 --dtype i32 --from '{dims: [model, null], partial: [data]}' --to '[null, [model, data]]'
plan scalar 0 'ops == ["all_reduce"] and j["check"] == "ok"' $M --shape '' --from '{dims: [], partial: [data]}' --to '[]'
plan bf16_bytes 0 'j["bytes_per_device"] == 128' $M --shape 8,16 --dtype bf16 --from '[data, null]' --to '[null, data]'
plan same 0 'ops == [] and j["check"] == "ok"' $M --shape 8,16 --from '[data, model]' --to '[data, model]'

# text output: the plan, a total and the check
"$SPMD" reshard $M --shape 8,16 --from '[data, null]' --to '[null, data]' --check >"$tmp/out" 2>"$tmp/err" ||
	fail "text: exit status $?"
grep -q 'all_to_all \[data\]' "$tmp/out" || fail "text: no all_to_all line: $(cat "$tmp/out")"
grep -q '^total: 1 step, 256 B/device' "$tmp/out" || fail "text: no total: $(cat "$tmp/out")"
grep -q '^check: ok' "$tmp/out" || fail "text: no check line"
"$SPMD" reshard --help >"$tmp/out" 2>&1 || fail "--help: exit status $?"
grep -q 'usage: spmd reshard' "$tmp/out" || fail "--help: no usage line"

error unknown_axis "expected a mesh axis (one of data, model), found 'foo'" $M --shape 8,16 --from '[foo, null]' --to '[null, null]'
error axis_twice "expected each mesh axis at most once, found 'data' twice" $M --shape 8,16 --from '[data, data]' --to '[null, null]'
error rank "expected 2 entries (one per dimension), found 3" $M --shape 8,16 --from '[data, null]' --to '[null, null, null]'
error partial_on_dim "found a partial axis also used on a dimension" $M --shape 8,16 --from '{dims: [data, null], partial: [data]}' --to '[null, null]'
error position "^--from:1:2: error" $M --shape 8,16 --from '[foo, null]' --to '[null, null]'
error size_zero "expected a positive axis size" --mesh data=0 --shape 8 --from '[null]' --to '[null]'
error size_negative "expected a positive axis size" --mesh data=-4 --shape 8 --from '[null]' --to '[null]'
error overflow "expected at most 1048576 devices" --mesh a=65536,b=65536,c=65536 --shape 8 --from '[null]' --to '[null]'
error bad_mesh "expected a mesh axis NAME=SIZE" --mesh data --shape 8 --from '[null]' --to '[null]'
error bad_shape "expected dimensions" $M --shape 8,-1 --from '[null, null]' --to '[null, null]'
error bad_dtype "expected a dtype" $M --shape 8 --dtype f7 --from '[null]' --to '[null]'
error new_partial "partial only in the target" $M --shape 8 --from '[null]' --to '{dims: [null], partial: [data]}'
error missing "expected --to" $M --shape 8 --from '[null]'
error bad_yaml "error: expected" $M --shape 8 --from '[data' --to '[null]'
error devices "expected --devices to list each device" $M --devices 0,1,2 --shape 8 --from '[null]' --to '[null]'
error check_too_big "for --check" --mesh data=8192 --shape 8 --from '[null]' --to '[data]' --check

# Sub-axes (model:(P)S): the mesh is cut for what either spec names, and
# collectives run over pieces; the whole axis is written as model.
S="--mesh data=2,model=8"
plan sub_gather 0 'ops == ["all_gather"]
j["steps"][0]["axes"] == ["model:(4)2"]
j["check"] == "ok"' $S --shape 16,8 --from '[model, null]' --to '[model:(1)4, null]'
plan sub_split 0 'ops == ["slice"]
j["check"] == "ok"' $S --shape 16,8 --from '[model:(1)4, data]' --to '[model, data]'
plan sub_a2a 0 'ops == ["all_to_all"]
j["steps"][0]["axes"] == ["model:(4)2"]
j["check"] == "ok"' $S --shape 16,16 --from '[model:(1)4, model:(4)2]' --to '[model, null]'
plan sub_reduce 0 'ops == ["slice", "reduce_scatter"]
colls[0]["axes"] == ["model:(1)4"]
j["check"] == "ok"' $S --shape 5,3 --from '{dims: [null, null], partial: [model:(1)4]}' --to '[model:(1)4, null]'
plan sub_nested 0 'j["check"] == "ok"' $S --shape 6,10 --devices 15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0 \
	--from '{dims: [[model:(1)2, data], model:(2)2], partial: [model:(4)2]}' --to '[model:(4)2, model:(1)4]'
error sub_size '--from:1:2: error: expected a sub-axis model:(P)S of .model. (size 8) with P\*S dividing 8, found .model:(3)2.' \
	$S --shape 8 --from '[model:(3)2]' --to '[null]'
error sub_overlap "expected sub-axes of 'model' that do not overlap" $S --shape 8,8 --from '[model:(1)4, model:(2)4]' --to '[null, null]'

if [ "$fails" -ne 0 ]; then
	echo "$fails failure(s)"
	exit 1
fi
echo "reshard_test: all passed"
