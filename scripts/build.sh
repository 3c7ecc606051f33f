#!/bin/sh
# build.sh DIR BUILD_TYPE [cmake options...]: configure (once) and build,
# quietly: the compiler's output is shown only when the build fails.
set -e
dir=$1 type=$2
shift 2
mkdir -p "$dir"
if ! { cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" "$@" && \
       cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 2)"; } > "$dir/build.log" 2>&1; then
	cat "$dir/build.log"
	echo "build.sh: the build in $dir failed (log: $dir/build.log)" >&2
	exit 1
fi
echo "build.sh: built $dir ($type)"
