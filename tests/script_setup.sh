# script_setup.sh: sourced at the top of the script tests, after SPMD and
# SRC:  . "$SRC/tests/script_setup.sh"
# PY: the system python3 (numpy is there), else the first on PATH; tmp: a
# folder of the test's own, removed when the test exits.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
tmp=${TMPDIR:-/tmp}/$(basename "$0" .sh).$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
