#!/bin/sh
# build.sh DIR BUILD_TYPE [cmake options...]: configure (once) and build.
set -e
dir=$1 type=$2
shift 2
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" "$@" >/dev/null
cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 2)"
