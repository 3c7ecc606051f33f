#!/bin/sh
# run.sh: install what is missing (apt), build, and run the default example.
#   ./run.sh [MODEL.yaml] [spmd run options...]
set -e
cd "$(dirname "$0")"
sh scripts/setup.sh
sh scripts/build.sh build RelWithDebInfo
model=${1:-examples/mlp.yaml}
[ $# -gt 0 ] && shift
./build/spmd run "$model" "$@"
