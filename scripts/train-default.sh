#!/usr/bin/env bash
# README command 1: set up, build, and train the default model on the embedded Moby-Dick corpus.
# Extra arguments go to `keel train` (e.g. --train-iters 50).
set -euo pipefail
cd "$(dirname "$0")/.."
# Installs and builds only what training needs (no test tools, no test build): see setup.sh.
scripts/setup.sh
# Each run gets its own directory: keel never overwrites a run's files.
exec "${BUILD_DIR:-build}/keel" train --save "runs/default-$(date +%Y%m%d-%H%M%S)" "$@"
