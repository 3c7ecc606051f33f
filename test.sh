#!/bin/sh
# test.sh: install what is missing (apt), build, and run every test: once in
# an optimized build (GCC), once under AddressSanitizer and
# UndefinedBehaviorSanitizer (clang 14, with the fuzz harnesses' short runs).
set -e
cd "$(dirname "$0")"
sh scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
sh scripts/build.sh build RelWithDebInfo
(cd build && ctest --output-on-failure -j "$jobs")
# The sanitizer build (docs/testing.md): with clang 14 when present — its
# checks are a superset of GCC's, and it builds the fuzz harnesses, whose
# tests run each a fixed number of inputs — else with GCC.
if command -v clang-14 >/dev/null 2>&1; then
	CC=clang-14 sh scripts/build.sh build-asan-clang Debug -DSPMD_SANITIZE=ON -DSPMD_FUZZ=ON
	san=build-asan-clang
else
	sh scripts/build.sh build-asan Debug -DSPMD_SANITIZE=ON
	san=build-asan
fi
(cd "$san" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	ctest --output-on-failure -j "$jobs")
