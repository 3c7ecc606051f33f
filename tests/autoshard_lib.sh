# autoshard_lib.sh: sourced by the autoshard script tests (autoshard_test.sh,
# autoshard_pipe_test.sh).  Needs SPMD, PY and tmp; counts in passes and fails.
#
# fail MESSAGE, pass: count a check.
# check NAME PY_ASSERTS: every Python expression (one a line) holds, with a
#   the JSON of $tmp/auto.json, c that of $tmp/cost.json (when present), out
#   the YAML of $tmp/out.yaml (when present), enum the text of $tmp/enum, and
#   whatever $tmp/prelude.py (when present) defines.
# auto ARGS...: spmd autoshard ARGS --json -o $tmp/out.yaml into
#   $tmp/auto.json (exit status in $rc), then spmd cost of the written model
#   (with --hardware $COST_HARDWARE when set) into $tmp/cost.json.

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}
pass() { passes=$((passes + 1)); }

check() {
	printf '%s\n' "$2" >"$tmp/asserts"
	if "$PY" - "$tmp" <<'PYEOF'; then pass; else fail "$1"; fi
import json, math, os, sys, yaml
t = sys.argv[1]
load = lambda f, how: how(open(os.path.join(t, f))) if os.path.exists(os.path.join(t, f)) else None
a, c = load("auto.json", json.load), load("cost.json", json.load)
out, enum = load("out.yaml", yaml.safe_load), load("enum", lambda f: f.read().strip())
if os.path.exists(os.path.join(t, "prelude.py")):
    exec(open(os.path.join(t, "prelude.py")).read())
for line in open(os.path.join(t, "asserts")):
    if line.strip():
        assert eval(line), line.strip()
PYEOF
}

auto() {
	rm -f "$tmp/out.yaml" "$tmp/cost.json"
	"$SPMD" autoshard "$@" --json -o "$tmp/out.yaml" >"$tmp/auto.json" 2>"$tmp/err"
	rc=$?
	if [ -f "$tmp/out.yaml" ]; then
		"$SPMD" cost "$tmp/out.yaml" ${COST_HARDWARE:+--hardware "$COST_HARDWARE"} --json >"$tmp/cost.json" 2>>"$tmp/err" ||
			fail "cost of the written model"
	fi
}
