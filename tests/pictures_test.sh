#!/bin/sh
# pictures_test.sh: `spmd show`, `reshard --svg`, the --trace files and `spmd report`, looked at as a person
# would: tile maps read right, SVGs parse as XML, traces load as JSON with the fields Perfetto needs,
# and headless Chromium draws the report and an SVG (not blank, nothing on the console).
# usage: sh pictures_test.sh SPMD_BINARY SOURCE_DIR
SPMD=${1:?usage: pictures_test.sh SPMD SOURCE_DIR}
SRC=${2:?usage: pictures_test.sh SPMD SOURCE_DIR}
. "$SRC/tests/script_setup.sh"
fails=0 passes=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}
pass() { passes=$((passes + 1)); }

# ok NAME ARGS...: `spmd ARGS` exits 0, stdout in $tmp/out.
ok() {
	name=$1
	shift
	if "$SPMD" "$@" >"$tmp/out" 2>"$tmp/err"; then pass; else fail "$name: exit $?: $(cat "$tmp/err")"; fi
}
# has NAME PATTERN: $tmp/out holds the fixed string PATTERN.
has() { if grep -qF -- "$2" "$tmp/out"; then pass; else fail "$1: expected '$2' in: $(head -c 3000 "$tmp/out")"; fi; }
lacks() { if grep -qF -- "$2" "$tmp/out"; then fail "$1: did not expect '$2'"; else pass; fi; }
# error NAME STATUS PATTERN ARGS...: exit status STATUS and PATTERN on stderr.
error() {
	name=$1 want=$2 pat=$3
	shift 3
	"$SPMD" "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ "$rc" = "$want" ] || { fail "$name: exit status $rc, expected $want: $(cat "$tmp/err")"; return; }
	if grep -qF -- "$pat" "$tmp/err"; then pass; else fail "$name: expected '$pat' on stderr, found: $(cat "$tmp/err")"; fi
}
# py NAME FILE CODE: Python CODE (with f the file's path) raises nothing.
py() {
	if "$PY" -c "import sys; f = sys.argv[1]
$3" "$2" >"$tmp/py" 2>&1; then pass; else fail "$1: $(tail -5 "$tmp/py")"; fi
}

MLP=$SRC/examples/mlp.yaml TB=$SRC/examples/transformer_block.yaml TRAIN=$SRC/examples/train_transformer.yaml

# ---- spmd show: the terminal picture ----
ok "show w1" show "$MLP" w1
has "show w1 header" "w1: f32 [512, 2048], sharding [null, model], mesh data=2,model=4 (8 devices)"
has "show w1 tiles" "4 tiles of [512, 512], each on 2 devices"
has "show w1 replicas with coordinates" "T1   [0:512, 512:1024] on 1 (data=0, model=1), 5 (data=1, model=1)"
lacks "not a terminal: no colour" "$(printf '\033[')"
ok "show --color always" show "$MLP" w1 --color always
has "colour escapes" "$(printf '\033[48;2;230;159;0m')"
NO_COLOR=1 "$SPMD" show "$MLP" w1 >"$tmp/out" 2>&1
lacks "NO_COLOR" "$(printf '\033[')"
# uneven: 32 rows over data=3 is 11, 11, 10 (+1 padding); the partial sum before the all_reduce
ok "show uneven partial" show "$MLP" 'y%local' --mesh data=3,model=2
has "uneven tile" "T2   [22:32 (+1 pad), 0:512] on 4 (data=2, model=0; summand 0), 5 (data=2, model=1; summand 1)"
has "partial" "each tile is the sum of 2 summands"
# rank 4 on 4 data shards: a slice per leading shard, capped at 6 with an ellipsis
ok "show rank 4" show "$TB" q --mesh data=4,model=2
has "facet" "slice dim 0 0:1, dim 1 0:16"
ok "show rank 4 capped" show "$SRC/tests/models/pictures_rank4.yaml" x
has "facets capped" "... 2 more slices"
has "uneven last dim: a tile wholly padding" "6:6 (+2 pad)"
# a scalar, and a value of a partitioned program file (spmd partition -o)
ok "show a scalar" show "$TRAIN" loss
has "scalar" "1 tile of [], each on 4 devices"
"$SPMD" partition "$MLP" -o "$tmp/prog.yaml" >/dev/null 2>&1
ok "show a program's value" show "$tmp/prog.yaml" 'y%local'
has "program value" "partial: each tile is the sum of 4 summands"
# ---- SVGs ----
ok "show --svg" show "$MLP" 'y%local' --mesh data=3,model=2 --svg "$tmp/y.svg"
py "show svg is XML with hatching and dashed partial borders" "$tmp/y.svg" '
import xml.etree.ElementTree as E
r = E.parse(f).getroot()
assert r.tag == "{http://www.w3.org/2000/svg}svg", r.tag
fills = [e.get("fill") for e in r.iter()]
assert fills.count("url(#hatch)") == 3, fills
assert any(e.get("stroke-dasharray") for e in r.iter()), "no dashed border"
text = " ".join(e.text or "" for e in r.iter())
assert "padding hatched" in text and "summand 1" in text, text'
ok "reshard --svg" reshard --mesh data=2,model=4 --shape 8,16 --from '[[data, model], null]' --to '[model, data]' \
	--svg "$tmp/r.svg"
py "reshard svg: from, after step 1, to, with the steps" "$tmp/r.svg" '
import xml.etree.ElementTree as E
r = E.parse(f).getroot()
text = " ".join(e.text or "" for e in r.iter())
for want in ("from: f32 [8, 16]", "after step 1", "to (after step 2)", "1. collective_permute", "2. all_to_all"):
    assert want in text, want'
# errors: unknown value, bad --color, an unwritable SVG leaves nothing behind
error "unknown value" 2 "expected a value of" show "$MLP" nosuch
error "bad color" 2 "expected --color auto, always or never" show "$MLP" w1 --color sometimes
error "one argument" 2 "expected MODEL.yaml and VALUE" show "$MLP"
error "unwritable svg" 2 "expected a writable file" show "$MLP" w1 --svg "$tmp/no/such/dir/w1.svg"
[ -z "$(ls "$tmp/no" 2>/dev/null)" ] && pass || fail "unwritable svg left a file"

# ---- traces ----
perfetto='
import json
d = json.load(open(f))
ev = d["traceEvents"]
assert isinstance(ev, list) and ev
for e in ev:
    assert e["ph"] in ("X", "M", "C"), e
    assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
    if e["ph"] == "X":
        assert isinstance(e["name"], str) and e["ts"] >= 0 and e["dur"] >= 0, e
    if e["ph"] == "C":
        assert e["name"] == "memory" and e["args"]["bytes"] > 0, e
names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
assert names == {"compute", "communication"}, names
'
ok "cost --trace" cost "$MLP" --trace "$tmp/cost.json"
py "cost trace" "$tmp/cost.json" "$perfetto"'
x = [e for e in ev if e["ph"] == "X"]
assert {e["pid"] for e in x} == set(range(8))
y = [e for e in x if e["name"] == "y" and e["pid"] == 0][0]
assert y["tid"] == 1 and y["args"]["op"] == "all_reduce" and y["args"]["bytes"] == 16 * 512 * 4, y
assert "annotated [data, null]" in y["args"]["reason"], y
h = [e for e in x if e["name"] == "h" and e["pid"] == 0][0]
assert h["tid"] == 0 and h["ts"] == 0, h
procs = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
assert "predicted device 5 (data=1, model=1)" in procs, procs
mem = [e["args"]["bytes"] for e in ev if e["ph"] == "C" and e["pid"] == 0]
assert max(mem) == 2 * 512 * 512 * 4 + 16 * 512 * 4 + 2 * 16 * 512 * 4, mem'
# collectives on disjoint links run at once (docs/cost_model.md): on TPU v4s the
# training step's data and model axes are each a lane, a track of its own,
# whose slices never overlap one another
ok "cost --trace lanes" cost "$TRAIN" --hardware tpu-v4 --trace "$tmp/lanes.json"
py "cost trace lanes" "$tmp/lanes.json" '
import json
ev = json.load(open(f))["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 0}
assert names[0] == "compute" and {"communication: data", "communication: model"} <= set(names.values()), names
for tid in names:
    x = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == tid)
    assert x and all(a[1] <= b[0] + 1e-6 for a, b in zip(x, x[1:])), (names[tid], x[:4])
    assert tid == 0 or all(e["cat"] == "collective" for e in ev if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == tid)'
ok "run --profile --trace" run "$MLP" --profile --trace "$tmp/run.json"
py "run trace" "$tmp/run.json" "$perfetto"'
x = [e for e in ev if e["ph"] == "X"]
assert {e["pid"] for e in x} == set(range(1000, 1008))
pred = json.load(open(f.replace("run.json", "cost.json")))["traceEvents"]
assert sorted(e["name"] for e in x if e["pid"] == 1000) == sorted(e["name"] for e in pred if e["ph"] == "X" and e["pid"] == 0)
for p in range(1000, 1008):
    s = sorted((e for e in x if e["pid"] == p), key=lambda e: e["ts"])
    assert all(abs(a["ts"] + a["dur"] - b["ts"]) < 1e-3 for a, b in zip(s, s[1:])), "not end to end"'
ok "run --profile --trace on the reference" run "$MLP" --backend ref --profile --trace "$tmp/ref.json"
py "reference trace: one device" "$tmp/ref.json" "$perfetto"'
assert {e["pid"] for e in ev if e["ph"] == "X"} == {1000}'
error "unwritable trace" 2 "expected a writable file" cost "$MLP" --trace "$tmp/no/such/dir/t.json"
error "trace without profile" 2 "expected --profile with --trace" run "$MLP" --trace "$tmp/x.json"
ok "cost --compare-run --trace" cost "$MLP" --compare-run --runs 1 --trace "$tmp/both.json"
py "both in one file" "$tmp/both.json" "$perfetto"'
pids = {e["pid"] for e in ev if e["ph"] == "X"}
assert pids == set(range(8)) | set(range(1000, 1008)), pids
a = sorted(e["name"] for e in ev if e["ph"] == "X" and e["pid"] == 0)
b = sorted(e["name"] for e in ev if e["ph"] == "X" and e["pid"] == 1000)
assert a == b, (a, b)'
if command -v mpirun >/dev/null 2>&1; then
	# as tests/mpi_test.sh: Open MPI's own allocations at exit suppressed for LeakSanitizer; under
	# AddressSanitizer (each process slow to start) 2 ranks, else 8
	root="" np=8 mesh=data=2,model=4
	[ "$(id -u)" = 0 ] && root=--allow-run-as-root
	{ [ "${SPMD_SANITIZED:-0}" = 1 ] || ldd "$SPMD" 2>/dev/null | grep -q libasan; } && np=2 mesh=data=1,model=2
	if LSAN_OPTIONS="suppressions=$SRC/tests/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0" \
		OPENBLAS_NUM_THREADS=1 timeout 120 mpirun $root -np $np --oversubscribe "$SPMD" run "$MLP" --mesh $mesh \
		--backend mpi --profile --trace "$tmp/mpi.json" >"$tmp/out" 2>&1; then pass; else fail "mpi trace: $(tail -5 "$tmp/out")"; fi
	py "mpi trace: every rank's ops, merged by rank 0" "$tmp/mpi.json" "$perfetto"'
x = [e for e in ev if e["ph"] == "X"]
np = '"$np"'
assert {e["pid"] for e in x} == set(range(1000, 1000 + np))
assert all(sum(e["dur"] for e in x if e["pid"] == p) > 0 for p in range(1000, 1000 + np)), "a rank with no times"'
else
	echo "SKIP: mpirun is not installed: the MPI trace is not tested"
fi

# ---- the report ----
ok "report" report "$TRAIN" -o "$tmp/report.html"
py "report: self-contained, every section" "$tmp/report.html" '
import re
s = open(f).read()
assert "<script" not in s and "<link" not in s and "@import" not in s and "url(http" not in s
assert set(re.findall(r"https?://[^\"\x27 ]+", s)) == {"http://www.w3.org/2000/svg"}, set(re.findall(r"https?://[^\"\x27 ]+", s))
for h in ("Mesh", "Params and annotated values", "Collectives", "Cost breakdown", "time by op kind",
          "time by collective", "bytes sent per device by mesh axis", "Memory over the step", "Live at the peak",
          "Timeline", "Weight-update sharding", "Step order"):
    assert h in s, h
assert s.count("class=\"tilemap\"") >= 10, s.count("class=\"tilemap\"")'
ok "report without training" report "$MLP" -o "$tmp/mlp.html" --hardware tpu-v4
py "no weight-update section for a forward model" "$tmp/mlp.html" '
s = open(f).read()
assert "Weight-update sharding" not in s and "Step order" not in s and "tpu-v4" in s'
error "report without -o" 2 "expected -o REPORT.html" report "$MLP"
error "report bad hardware" 2 "error" report "$MLP" -o "$tmp/x.html" --hardware nosuch
[ ! -e "$tmp/x.html" ] && pass || fail "a failed report left a file"

# ---- in a browser ----
if "$PY" "$SRC/tests/chromium_check.py" --self-test "$tmp" >"$tmp/py" 2>&1; then
	pass
	for page in report.html y.svg r.svg; do
		if "$PY" "$SRC/tests/chromium_check.py" "$tmp/$page" "$tmp/$page.png" >"$tmp/py" 2>&1; then pass
		else fail "chromium $page: $(cat "$tmp/py")"; fi
	done
elif grep -q "^SKIP" "$tmp/py"; then
	cat "$tmp/py"
else
	fail "chromium self-test: $(cat "$tmp/py")"
fi

echo "pictures_test: $passes passed, $fails failed"
[ "$fails" = 0 ]
