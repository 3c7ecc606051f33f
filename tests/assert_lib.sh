# assert_lib.sh: sourced by script tests after script_setup.sh, with T set
# to their folder.  ok / bad NAME count passes and failures (bad prints
# FAIL: NAME); py NAME EXPR... passes when every Python expression holds,
# with j the JSON of $T/p.json, c of $T/c.json and prog the YAML of
# $T/prog.yaml (each None when the file is not there).
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() {
	fail=$((fail + 1))
	echo "FAIL: $*"
}
py() {
	name=$1
	shift
	printf '%s\n' "$@" >"$T/asserts"
	if "$PY" - "$T" <<'PYEOF'; then ok; else bad "$name"; fi
import json, os, sys, yaml
t = sys.argv[1]
load = lambda f, how: how(open(os.path.join(t, f))) if os.path.exists(os.path.join(t, f)) else None
j, c, prog = load("p.json", json.load), load("c.json", json.load), load("prog.yaml", yaml.safe_load)
for line in open(os.path.join(t, "asserts")):
    if line.strip():
        assert eval(line), line.strip()
PYEOF
}
