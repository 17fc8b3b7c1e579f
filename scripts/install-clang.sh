#!/usr/bin/env bash
# Installs, when missing, the Debian packages of the sanitizer and fuzz build (build-fuzz): clang,
# libFuzzer and the sanitizer runtimes (libclang-rt-14-dev), python3 for the seeds. (OpenMP is
# GCC's libgomp, already there: CMakeLists.txt says why.)
# Test-only tools, kept apart from scripts/setup.sh's; used by scripts/sanitizers.sh and fuzz.sh.
set -euo pipefail
PACKAGES=(clang libclang-rt-14-dev python3)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-clang: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# keel's own libraries and the npm assets are scripts/setup.sh's.
if ! dpkg-query -W -f='${Status}' libtomlplusplus-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "install-clang: keel's dependencies are missing: run scripts/setup.sh first" >&2
  exit 2
fi
