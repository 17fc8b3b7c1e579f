#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd "${BUILD_DIR:-build}"
# One test at a time: each test process uses every core (OpenMP), and two at once would make
# their threads spin against each other.
ctest --output-on-failure "$@"
