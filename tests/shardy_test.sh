#!/bin/sh
# shardy_test.sh SPMD SOURCE_DIR: the cases of tests/shardy/ (after OpenXLA
# Shardy's propagation tests: priorities, sharding groups, reshapes).  Each
# `# expect: NAME SHARDING` line must be what `spmd propagate` prints for
# NAME, and every model must run partitioned and match the reference.
SPMD=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; sed 's/^/    /' "$T/out" | tail -5; }

# NAME SHARDING from each line of `spmd propagate` (the sharding: the
# bracketed text after the name, brackets balanced)
shardings() {
	awk '/^[^ ]/ && NF > 1 {
		s = substr($0, length($1) + 1); sub(/^ +/, "", s)
		d = 0; out = ""
		for (i = 1; i <= length(s); i++) {
			c = substr(s, i, 1); out = out c
			if (c == "[" || c == "{") d++
			if (c == "]" || c == "}") { d--; if (d == 0) break }
		}
		print $1, out
	}'
}

for f in "$SRC"/tests/shardy/*.yaml; do
	n=$(basename "$f" .yaml)
	if ! "$SPMD" propagate "$f" > "$T/prop" 2> "$T/out"; then bad "$n: propagate"; continue; fi
	shardings < "$T/prop" > "$T/got"
	sed -n 's/^# expect: //p' "$f" > "$T/want"
	if [ ! -s "$T/want" ]; then echo "no expectation" > "$T/out"; bad "$n: no expect lines"; fi
	while read -r name spec; do
		if grep -qxF "$name $spec" "$T/got"; then ok
		else grep "^$name " "$T/got" > "$T/out"; bad "$n: $name expected $spec"; fi
	done < "$T/want"
	if "$SPMD" run "$f" --check > "$T/out" 2>&1; then ok; else bad "$n: run --check"; fi
done

# A conflict inside a group is an error naming both annotations, exit 2.
cat > "$T/conflict.yaml" <<'YAML'
name: conflict
mesh: {a: 2, b: 2}
inputs:
  x: {shape: [8, 8], sharding: [a, _], shard_as: g}
params:
  w: {shape: [8, 8], sharding: [b, _], shard_as: g}
ops:
  - {out: y, op: add, in: [x, w]}
outputs: [y]
YAML
"$SPMD" propagate "$T/conflict.yaml" > "$T/out" 2>&1
st=$?
if [ $st = 2 ] && grep -q "conflict.yaml:6:32: error: expected the sharding of 'x' in sharding group 'g', \[a, null\] with open dims (annotated at .*conflict.yaml:4:32), found \[b, null\] with open dims" "$T/out"
then ok; else bad "group conflict (exit $st)"; fi

echo "shardy_test: $pass passed, $fail failed"
[ "$fail" = 0 ]
