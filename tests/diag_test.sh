#!/bin/sh
# diag_test.sh: every error has a place (FILE:LINE:COL), in every command and backend.
#
# Usage: sh tests/diag_test.sh SPMD_BINARY SOURCE_DIR
#
#  1. every model and program of the bad catalogues (tests/bad, tests/train_bad,
#     tests/bad_programs, tests/models/part_bad_*) through check, propagate,
#     partition, run and cost: no crash (exit 0, 1 or 2), and every `error:`
#     line is `FILE:LINE:COL: error: ...` with LINE >= 1 — never a bare file
#     name, never `?:0:0`;
#  2. kernel errors (a take id, a loss label out of range) name the op's
#     place on the reference, on threads and in training;
#  3. `spmd propagate` explains every value of the examples and the
#     weight-update sharding models without `?:0:0` or `:0:0`;
#  4. weight_update_sharding reads 'on' and 'off' quoted (as PyYAML writes
#     them) and true/false as on/off;
#  5. an invariant the passes break themselves is an internal error at the
#     op's place, exit 2;
#  6. a warning repeated on every layer is printed four times, then a note;
#  7. under every message, the line it names, with the caret at its column:
#     200 errors in file order, then one on an earlier line (the loader
#     reads `outputs` after `ops`, wherever the file has it).
SPMD=$1
SRC=${2:-.}
cd "$SRC" || exit 1
ulimit -c 0 2>/dev/null
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

nfail=0
fail() {
	echo "FAIL $1"
	head -n 5 "$tmp/err" | sed 's/^/    /'
	nfail=$((nfail + 1))
}

# placed FILE WHAT: every error line of $tmp/err is FILE:LINE:COL with LINE >= 1
placed() {
	if grep 'error:' "$tmp/err" | grep -v "^$1:[1-9][0-9]*:[1-9][0-9]*: error: " | grep -q .; then
		fail "$2: an error without FILE:LINE:COL"
	elif grep -q '?:0:0' "$tmp/err"; then
		fail "$2: ?:0:0"
	fi
}

# ---- 1. the catalogues, every command ----
for f in tests/bad/*.yaml tests/train_bad/*.yaml tests/bad_programs/*.yaml tests/models/part_bad_*.yaml; do
	for cmd in check propagate partition run cost; do
		"$SPMD" $cmd "$f" >/dev/null 2>"$tmp/err"
		st=$?
		if [ $st -gt 2 ]; then
			fail "$cmd $f: exit status $st"
			continue
		fi
		placed "$f" "$cmd $f"
		grep -q 'error:' "$tmp/err" && [ $st -ne 2 ] && fail "$cmd $f: an error but exit status $st"
	done
done

# ---- 2. kernel errors name the op ----
# npy FILE ROWS COLS VALUE: an i32 .npy of one value
npy() {
	python3 -c "
import struct, sys
path, r, c, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
h = \"{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }\" % (r, c)
h += ' ' * ((64 - (11 + len(h)) % 64) % 64) + '\n'
open(path, 'wb').write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(h)) + h.encode() + struct.pack('<%di' % (r * c), *[v] * (r * c)))
" "$@"
}
npy "$tmp/ids.npy" 8 12 5000
npy "$tmp/labels.npy" 4 8 99
for b in ref threads; do
	"$SPMD" run examples/embedding.yaml --input ids="$tmp/ids.npy" --backend $b >/dev/null 2>"$tmp/err"
	[ $? -eq 2 ] && grep -q '^examples/embedding.yaml:15:5: error: .*take: expected an id' "$tmp/err" ||
		fail "take id out of range on $b: not at the op"
	"$SPMD" run examples/train_transformer.yaml --steps 1 --input labels="$tmp/labels.npy" --backend $b \
		>/dev/null 2>"$tmp/err"
	[ $? -eq 2 ] && grep -q '^examples/train_transformer.yaml:55:5: error: .*expected a label' "$tmp/err" ||
		fail "label out of range on $b: not at the op"
	placed examples/train_transformer.yaml "label out of range on $b"
done
# with the classes split, the label is checked by the split loss's own ops
npy "$tmp/vlabels.npy" 4 3 11
"$SPMD" run tests/models/part_vocab_loss_grad.yaml --steps 1 --input labels="$tmp/vlabels.npy" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q '^tests/models/part_vocab_loss_grad.yaml:19:5: error: .*expected a label in \[0, 11), found 11' "$tmp/err" ||
	fail "label out of range with the classes split: $(head -2 "$tmp/err")"

# ---- 3. explanations name places ----
for f in examples/*.yaml tests/wus/*.yaml; do
	"$SPMD" propagate "$f" >"$tmp/err" 2>&1
	grep -q ':0:0' "$tmp/err" && fail "propagate $f: a place :0:0"
done

# ---- 5. an error the passes make themselves is placed too ----
# (tied embeddings under weight-update sharding: an internal error at the op
# until shared params are supported; then it runs, and has no errors at all)
cat >"$tmp/tied.yaml" <<'YAML'
mesh: {data: 2, model: 2}
inputs:
  tokens: {shape: [4, 8], dtype: i32, sharding: [data, null]}
  labels: {shape: [4, 8], dtype: i32, sharding: [data, null]}
params: {embed: {shape: [12, 16], init: {normal: 0.5}}}
ops:
  - {out: x, op: take, in: [embed, tokens], sharding: [data, null, null]}
  - {out: logits, op: einsum, in: [x, embed], eq: "bsm,vm->bsv"}
  - {out: loss, op: softmax_cross_entropy, in: [logits, labels]}
outputs: [loss]
train: {loss: loss, optimizer: {type: adam, lr: 0.01}, weight_update_sharding: on}
YAML
for cmd in propagate partition run cost; do
	"$SPMD" $cmd "$tmp/tied.yaml" >/dev/null 2>"$tmp/err"
	st=$?
	[ $st -le 2 ] || fail "$cmd tied embeddings: exit status $st"
	placed "$tmp/tied.yaml" "$cmd tied embeddings"
done

# ---- 4. weight_update_sharding as YAML writers emit it ----
for v in "'on'" '"off"' true false "'auto'"; do
	sed "s/^  weight_update_sharding: .*/  weight_update_sharding: $v/" tests/wus/wus_mlp.yaml >"$tmp/w.yaml"
	grep -q "weight_update_sharding: $v" "$tmp/w.yaml" || { echo "FAIL: tests/wus/wus_mlp.yaml lacks weight_update_sharding"; nfail=$((nfail + 1)); }
	"$SPMD" propagate "$tmp/w.yaml" >"$tmp/out" 2>"$tmp/err" || fail "weight_update_sharding: $v refused"
	case $v in *off* | false) want=0 ;; *auto*) continue ;; *) want=1 ;; esac # auto: the cost model decides
	[ "$(grep -c '^w1%grad .*fixed by weight-update sharding' "$tmp/out")" = $want ] ||
		fail "weight_update_sharding: $v not read as $( [ $want = 1 ] && echo on || echo off)"
done
sed "s/^  weight_update_sharding: .*/  weight_update_sharding: maybe/" tests/wus/wus_mlp.yaml >"$tmp/w.yaml"
"$SPMD" check "$tmp/w.yaml" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "error: expected weight_update_sharding off, on or auto, found 'maybe'" "$tmp/err" ||
	fail "weight_update_sharding: maybe accepted"

# ---- 6. a warning repeated on every layer: four printed, then a note ----
# (six layers disagree alike, two warnings a layer: of each shape the
# first four, a note after the fourth, none for the fifth and sixth layers)
"$SPMD" partition tests/models/repeat_warnings.yaml >/dev/null 2>"$tmp/err" || fail "repeat_warnings: exit status $?"
[ "$(grep -c ': warning: ' "$tmp/err")" = 8 ] && [ "$(grep -c '^tests/models/repeat_warnings.yaml: note: more warnings like this one' "$tmp/err")" = 2 ] &&
	grep -q '^tests/models/repeat_warnings.yaml:22:5: warning: h3 ' "$tmp/err" && ! grep -q 'warning: .*h[45] ' "$tmp/err" ||
	fail "repeat_warnings: expected 8 warnings and 2 notes, found $(grep -c ': warning: ' "$tmp/err") and $(grep -c ': note: ' "$tmp/err")"

# 7. the source line under each message is the one it names (show_source
# reads on from the last message's line, and from the top for an earlier one)
python3 -c "
print('name: order\noutputs: [nope]\ninputs:\n  x: {shape: [4, 4]}\nops:')
for i in range(200):
    print('  - {out: h%d, op: bogus%d, in: [x]}' % (i, i))
" >"$tmp/order.yaml"
"$SPMD" check "$tmp/order.yaml" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && python3 - "$tmp/order.yaml" "$tmp/err" <<'PYEOF' || fail "source lines under 201 errors"
import re, sys
src = open(sys.argv[1]).read().split("\n")
err = open(sys.argv[2]).read().split("\n")
seen = []
for i, l in enumerate(err):
    m = re.match(r".*:(\d+):(\d+): error: ", l)
    if m:
        line, col = int(m.group(1)), int(m.group(2))
        assert err[i + 1] == "  " + src[line - 1], (l, err[i + 1])
        assert err[i + 2] == "  " + " " * (col - 1) + "^", (l, err[i + 2])
        seen.append(line)
assert len(seen) == 201 and seen[:200] == list(range(6, 206)) and seen[200] == 2, seen[-3:]
PYEOF

if [ $nfail -ne 0 ]; then
	echo "$nfail failure(s)"
	exit 1
fi
echo "diag tests passed"
