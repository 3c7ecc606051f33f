#!/bin/sh
# layers_test.sh: the include graph goes down the layers (scripts/check_layers.py),
# the checker rejects the back edges the layout removed, and no file of the
# repository points outside it.
#
#   sh tests/layers_test.sh SPMD_BINARY SOURCE_DIR
SRC=$2
fail=0
python3 "$SRC/scripts/check_layers.py" "$SRC" || fail=1
python3 "$SRC/scripts/check_layers.py" --self-test || fail=1
# Docs and code stand alone: no pointer to notes kept beside the repository.
if (cd "$SRC" && git grep -n -I -E '\.\./shared|(^|[^a-z_])(ALGORITHMS|LAYERS|DESIGN|STYLE)\.md' -- . ':!tests/layers_test.sh' 2>/dev/null); then
	echo "layers_test: the lines above point outside the repository"
	fail=1
fi
[ $fail = 0 ] && echo "layers_test: 3 passed, 0 failed" || echo "layers_test: failed"
exit $fail
