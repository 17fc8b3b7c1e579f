#!/usr/bin/env bash
# Fuzzes every parser of outside input (docs/fuzzing.md): builds build-fuzz with clang, libFuzzer,
# AddressSanitizer and UBSan (installing the Debian packages that needs when missing), writes the
# seed corpora, then runs each target for a bounded time. Prints per target the executions and
# seconds run without a crash; exits 1 if any target crashed, hung, leaked or ran out of memory
# (the input that did it is kept under build-fuzz/crashes/TARGET/).
#   scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET ...]
#   FUZZ_BUILD_DIR (default build-fuzz)  FUZZ_JOBS (default: all cores) build parallelism
# Idempotent: the build is incremental, and each target's corpus (build-fuzz/corpus/TARGET/)
# keeps what earlier runs found, so every run starts where the last one stopped.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-60}
shift $(($# > 0 ? 1 : 0))
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}

scripts/install-clang.sh

# A new build directory leaves the tests out (no GoogleTest needed); one that scripts/sanitizers.sh
# configured keeps them, and shares its instrumented keel_lib with the fuzz targets.
# shellcheck source=scripts/compiler-cache.sh
source scripts/compiler-cache.sh
CMAKE_ARGS=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKEEL_BUILD_FUZZ=ON
  "${COMPILER_CACHE_ARGS[@]}")
[ -f "$BUILD_DIR/CMakeCache.txt" ] || CMAKE_ARGS+=(-DKEEL_BUILD_TESTS=OFF -DKEEL_BUILD_BENCH=OFF)
cmake -S . -B "$BUILD_DIR" "${CMAKE_ARGS[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j"${FUZZ_JOBS:-$(nproc)}" --target keel_fuzz
python3 fuzz/make_seeds.py "$BUILD_DIR/seeds"

targets=("$@")
if ((${#targets[@]} == 0)); then
  for src in fuzz/*_fuzz.cc; do targets+=("$(basename "$src" .cc)"); done
fi

failed=()
printf '%-24s %12s %8s  %s\n' target executions seconds result
for t in "${targets[@]}"; do
  bin="$BUILD_DIR/fuzz/$t"
  [ -x "$bin" ] || { echo "fuzz: no target $t (fuzz/*_fuzz.cc)" >&2; exit 2; }
  corpus="$BUILD_DIR/corpus/$t" crashes="$BUILD_DIR/crashes/$t" log="$BUILD_DIR/logs/$t.log"
  mkdir -p "$corpus" "$crashes" "$(dirname "$log")"
  # New inputs go to the first directory only: the committed seeds are never written to.
  dirs=("$corpus")
  for d in "fuzz/corpus/$t" "fuzz/regressions/$t" "$BUILD_DIR/seeds/$t"; do
    [ -d "$d" ] && dirs+=("$d")
  done
  rc=0
  # -timeout: an input running this long (wall clock, so with room for a busy machine) is a hang;
  # -rss_limit_mb also caps a single malloc.
  "$bin" -max_total_time="$SECONDS_PER_TARGET" -timeout=25 -rss_limit_mb=2048 \
    -dict=fuzz/keel.dict -print_final_stats=1 -artifact_prefix="$crashes/" "${dirs[@]}" \
    >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  if ((rc == 0)); then
    printf '%-24s %12s %8s  %s\n' "$t" "${runs:-?}" "${secs:-?}" "no crash"
  else
    failed+=("$t")
    what=$(grep -m1 -E '^SUMMARY:|ERROR: libFuzzer|ERROR: AddressSanitizer|runtime error' "$log" ||
      echo "exit status $rc")
    printf '%-24s %12s %8s  %s\n' "$t" "${runs:-?}" "${secs:-?}" "FAILED: $what"
    grep -m1 -E "^artifact_prefix=|Test unit written to" "$log" | sed 's/^/    /' || true
    echo "    log: $log"
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]} (docs/fuzzing.md: a crash becomes a test)"
  exit 1
fi
echo "fuzz: ${#targets[@]} target(s), ${SECONDS_PER_TARGET} s each, no crash"
