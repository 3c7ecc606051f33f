#!/bin/sh
# test.sh: install what is missing (apt), build, and run every test: once in
# an optimized build, once under AddressSanitizer and UndefinedBehaviorSanitizer.
set -e
cd "$(dirname "$0")"
sh scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
sh scripts/build.sh build RelWithDebInfo
(cd build && ctest --output-on-failure -j "$jobs")
sh scripts/build.sh build-asan Debug -DSPMD_SANITIZE=ON
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	ctest --output-on-failure -j "$jobs")
