#!/usr/bin/env bash
# The CUDA backend's check on the GPU machine, in ONE call of the device tool (docs/cuda.md):
#
#   run  carry: [".devdeps", "build-gpu/keel", "build-gpu/keel_tests"]   timeout_s: 600
#        command: scripts/device-check.sh
#
# Prepared here first (no GPU needed): scripts/device-deps.sh (the .deb files and the default
# corpus into .devdeps), then scripts/device-check.sh --build-only (keel's GPU profile built
# into build-gpu against .devdeps alone: KEEL_CUDA=ON, no MPI, no benchmarks). On the GPU
# machine the carried binaries run as they are (same nvcc 13.0, sm_90); without them, or with
# REBUILD=1, the profile is built there (ninja, all cores).
#
# Steps, each with its own time limit so one hang cannot eat the call, logs to $OUT (at most 8
# files come back): summary.txt, gpu.txt, build.log, tests.log, tests.xml, train.log (the
# default job on cuda and on cpu, side by side), resume.log (killed and resumed on cuda), bench.log
# (GPT-2 124M shape, bf16). The exit status is the tests' (0: every CUDA op and model test passed).
#
#   --build-only   configure and build build-gpu, nothing else (on a CPU machine: nvcc needed)
#   --cpu-only     also run, on a machine without a GPU, what runs there (the tests skip CUDA)
#   --resume-only  the tests, then only the kill-and-resume check (RESUME_BACKEND=cpu: on the CPU)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
ROOT=$PWD
MODE=${1:-}
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-gpu}
D=$ROOT/.devdeps-root  # beside .devdeps: unpacked, too large to carry
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
start=$(date +%s)
elapsed() { echo "$(($(date +%s) - start))s"; }
# The device tool allows 600 s a command: every step gets at most its cap and what is left before
# DEADLINE (default 570 s after the start), so the logs always come back.
DEADLINE=$((start + ${DEADLINE_S:-570}))
limit() {  # limit CAP: seconds for the next step (1 when none is left)
  local left=$((DEADLINE - $(date +%s) - 5))
  ((left < 1)) && left=1  # (timeout 0 would mean no limit)
  echo $((left < $1 ? left : $1))
}

# ---- the dependencies: the carried .deb files unpacked (dpkg-deb, or ar + tar where no dpkg) ----
if [[ ! -d .devdeps/debs ]]; then
  say "FAIL: .devdeps/debs is missing: run scripts/device-deps.sh here and carry .devdeps"
  exit 3
fi
if [[ ! -f $D/.unpacked ]]; then
  rm -rf "$D" && mkdir -p "$D"
  for f in .devdeps/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$D"
    else
      tmp=$(mktemp -d) && (cd "$tmp" && ar x "$ROOT/$f" && tar -xf data.tar.* -C "$D") && rm -rf "$tmp"
    fi
  done
  touch "$D/.unpacked"
fi
LIB=$D/usr/lib/x86_64-linux-gnu
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
CUDA_LIB=
for dir in /usr/local/cuda/lib64 "$(dirname "$(command -v nvcc)")/../lib64"; do
  if compgen -G "$dir/libcublasLt.so*" >/dev/null; then CUDA_LIB=$dir && break; fi
done
export LD_LIBRARY_PATH=$LIB:$LIB/openblas-openmp${CUDA_LIB:+:$CUDA_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_LIBDIR=$LIB/pkgconfig:$D/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D
# The default corpus and its prepared tokens (device-deps.sh copies them: the npm assets and the
# cache are links to outside the checkout, which do not travel).
export KEEL_ASSETS_DIR=$ROOT/.devdeps/assets KEEL_CACHE_DIR=$ROOT/.devdeps/cache

# ---- build (unless carried) -----------------------------------------------------------------
build() {
  say "build: configuring $BUILD (KEEL_CUDA=ON, KEEL_MPI=OFF, deps from .devdeps only)"
  # The GPU image's compiler may be newer than Debian 12's: its new warnings must not stop the
  # check (CI's build keeps -Werror).
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # shellcheck disable=SC2086  # CMAKE_EXTRA: extra arguments, split on purpose
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKEEL_CUDA=ON -DKEEL_MPI=OFF \
    -DKEEL_BUILD_TESTS=ON -DKEEL_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$D/usr" \
    -DKEEL_OPENBLAS_PATH="$LIB/openblas-openmp/libopenblas.so.0" \
    -DPKG_CONFIG_EXECUTABLE="$D/usr/bin/pkgconf" -DKEEL_WERROR=OFF \
    -DKEEL_ASSETS_DIR="$KEEL_ASSETS_DIR" -DKEEL_CACHE_DIR="$KEEL_CACHE_DIR" \
    ${CMAKE_EXTRA:-} >>"$OUT/build.log" 2>&1 &&
    timeout "$(limit "${BUILD_TIMEOUT:-400}")" cmake --build "$BUILD" -j"$(nproc)" --target keel keel_tests \
      >>"$OUT/build.log" 2>&1
}
: >"$OUT/build.log"
if [[ "$MODE" == "--build-only" || "${REBUILD:-0}" == 1 || ! -x $BUILD/keel_tests || ! -x $BUILD/keel ]]; then
  if ! build; then
    say "FAIL: build (see build.log), $(elapsed)"
    tail -30 "$OUT/build.log"
    exit 4
  fi
  say "build: done, $(elapsed)"
else
  say "build: using the carried $BUILD/keel and $BUILD/keel_tests"
  # They were built elsewhere against .devdeps-root at that checkout's path, which the binary
  # names for OpenBLAS (dlopen'd by absolute path): that path, if absent here, points at ours.
  built=$(grep -aoE '/[^[:space:]"]*/\.devdeps-root/' "$BUILD/keel" | head -1)
  built=${built%/}
  if [[ -n $built && $built != "$D" && ! -e $built ]]; then
    mkdir -p "$(dirname "$built")" && ln -s "$D" "$built" && say "build: linked $built -> $D"
  fi
fi
[[ "$MODE" == "--build-only" ]] && exit 0

# ---- the device ------------------------------------------------------------------------------
{ nvidia-smi 2>&1; nvcc --version 2>&1; } >"$OUT/gpu.txt"
say "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo none)"

# ---- the CUDA op tests, the whole-model reference test, the checkpoint round trip ---------------
FILTER='Backends/BackendOpsTest.*/cuda*:BackendRegistryTest.*:Variants/GptReferenceTest.*/cuda*'
FILTER+=':Backends/GptModelBackendTest.*/cuda*:Precisions/CudaCheckpointTest.*:*BackendSupport*'
FILTER+=':CudaCliTest.*'
timeout "$(limit "${TEST_TIMEOUT:-180}")" "$BUILD/keel_tests" --gtest_filter="$FILTER" \
  --gtest_output=xml:"$OUT/tests.xml" >"$OUT/tests.log" 2>&1
tests_rc=$?
counts=$(grep -oE '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$OUT/tests.log" | sed -E 's/^\[ +([A-Z]+) +\] / \1 /' | tr '\n' ';')
say "tests: exit $tests_rc;$counts $(elapsed)"
grep -E '^\[  FAILED  \] .*/' "$OUT/tests.log" | sort -u | head -40 | sed 's/^/  /' | tee -a "$SUMMARY"
[[ "$MODE" == "--cpu-only" ]] && say "cpu-only: stopping before the GPU runs" && exit $tests_rc
RUNS=$(mktemp -d)

# ---- the default job on cuda and on cpu, side by side (the CPU on all cores but one) ---------
if [[ "$MODE" != "--resume-only" ]]; then
  TRAIN_ITERS=${TRAIN_ITERS:-400}
  t=$(limit 150)
  (timeout "$t" "$BUILD/keel" train --backend cuda --train-iters "$TRAIN_ITERS" --save "$RUNS/cuda" \
    >"$RUNS/cuda.log" 2>&1; echo "exit $?" >>"$RUNS/cuda.log") &
  (timeout "$t" "$BUILD/keel" train --backend cpu --threads $(($(nproc) - 1)) \
    --train-iters "$TRAIN_ITERS" --save "$RUNS/cpu" >"$RUNS/cpu.log" 2>&1
    echo "exit $?" >>"$RUNS/cpu.log") &
  wait
  { echo "==== cuda"; cat "$RUNS/cuda.log"; echo "==== cpu"; cat "$RUNS/cpu.log"; } >"$OUT/train.log"
  for b in cuda cpu; do
    say "train $b: $(tail -1 "$RUNS/$b.log"); last validation: $(grep 'validation loss' "$RUNS/$b.log" | tail -1)"
  done
fi

# ---- killed and resumed on cuda: the same fingerprint as the uninterrupted run ---------------
resume_run() {  # resume_run LOG CAP ARGS...: one run, its log kept apart
  local log=$1 cap=$2
  shift 2
  timeout "$(limit "$cap")" "$BUILD/keel" train --backend "${RESUME_BACKEND:-cuda}" --train-iters 40 \
    --lr-warmup-iters 4 "$@" >"$log" 2>&1
}
cap=${RESUME_CAP:-40}
resume_run "$RUNS/whole.log" "$cap" --save "$RUNS/whole"
resume_run "$RUNS/split1.log" "$cap" --exit-interval 20 --save "$RUNS/split"
resume_run "$RUNS/split2.log" "$cap" --save "$RUNS/split"
for f in whole split1 split2; do
  echo "==== $f"
  cat "$RUNS/$f.log"
done >"$OUT/resume.log"
fp_whole=$(grep 'state fingerprint' "$RUNS/whole.log" | tail -1 | awk '{print $NF}')
fp_split=$(grep 'state fingerprint' "$RUNS/split2.log" | tail -1 | awk '{print $NF}')
verdict=DIFFERENT
[[ -n $fp_whole && $fp_whole == "$fp_split" ]] && verdict=SAME
for f in whole split2; do  # a run stopped by its time limit saves early: no verdict then
  grep -qE 'iteration +40/ +40' "$RUNS/$f.log" || verdict="INCOMPLETE ($f did not reach 40)"
done
say "resume: uninterrupted $fp_whole, resumed $fp_split: $verdict"
[[ "$MODE" == "--resume-only" ]] && exit 0

# ---- GPT-2 124M in bf16 (GPT-2's tokenizer, micro-batch 16, sequence 1024): the iteration line ---
timeout "$(limit "${BENCH_TIMEOUT:-90}")" "$BUILD/keel" train --backend cuda --bf16 --tokenizer gpt2 \
  --num-layers 12 \
  --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 16 \
  --global-batch-size 16 --train-iters 6 --log-interval 1 --eval-iters 0 --lr-warmup-iters 0 \
  --save "$RUNS/bench" >"$OUT/bench.log" 2>&1
say "bench: exit $?; $(grep -E 'iteration +6/' "$OUT/bench.log" | tail -1)"
rm -rf "$RUNS"
say "done, $(elapsed)"
exit $tests_rc
