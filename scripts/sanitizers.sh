#!/usr/bin/env bash
# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer (CI's second suite):
# builds keel and the tests in build-fuzz with clang, in the same instrumented keel_lib that
# scripts/fuzz.sh's targets link (one sanitizer build serves both), and runs ctest there. Any
# undefined behaviour aborts the test. Extra arguments go to ctest (e.g. -R Resume).
#   FUZZ_BUILD_DIR (default build-fuzz)
# Needs keel's dependencies and the test tools: run scripts/setup.sh --with-tests first.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}

if ! dpkg-query -W -f='${Status}' libgtest-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "sanitizers: GoogleTest is missing: run scripts/setup.sh --with-tests first" >&2
  exit 2
fi
scripts/install-clang.sh
# clang rather than GCC: with the sanitizers on, GCC took 4x as long to compile a test file
# (87 s against clang's 21 s at -O2 -g), which did not fit CI's time.
# shellcheck source=scripts/compiler-cache.sh
source scripts/compiler-cache.sh
cmake -S . -B "$BUILD_DIR" -DCMAKE_CXX_COMPILER=clang++ "${COMPILER_CACHE_ARGS[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKEEL_BUILD_FUZZ=ON -DKEEL_BUILD_TESTS=ON -DKEEL_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target keel keel_tests
cd "$BUILD_DIR"
ctest --output-on-failure "$@"
