#!/bin/sh
# order_test.sh SPMD SOURCE_DIR: propagation and the partitioned program are
# the same for every topological order of a model's ops (tests/order_test.py).
PY=/usr/bin/python3
if ! "$PY" -c 'import yaml' 2>/dev/null; then
	echo "order_test: $PY with PyYAML is needed (Debian: apt-get install python3-yaml)" >&2
	exit 1
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$PY" "$2/tests/order_test.py" "$1" "$2" "$T"
