#!/usr/bin/env bash
# README command 2: set up with the test tools, build keel and the tests, run the whole suite.
# Extra arguments go to ctest (e.g. -R BackendOps).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --with-tests
cd "${BUILD_DIR:-build}"
# One test at a time: each test process uses every core (OpenMP), and two at once would make
# their threads spin against each other.
ctest --output-on-failure "$@"
