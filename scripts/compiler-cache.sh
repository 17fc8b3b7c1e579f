# Sourced by scripts/setup.sh, sanitizers.sh and fuzz.sh: compile through ccache when it is
# installed (scripts/setup.sh --with-tests installs it). A second clone of the same sources, or a
# build directory made anew, then recompiles nothing that did not change: CI's clean clone reuses
# what the session's builds compiled. Sets COMPILER_CACHE_ARGS (cmake options) and the ccache
# environment; without ccache both are empty and the build compiles everything, as before.
COMPILER_CACHE_ARGS=()
if command -v ccache >/dev/null 2>&1 && [ "${KEEL_NO_CCACHE:-0}" != 1 ]; then
  # Paths under the checkout are hashed relative to it, and the working directory is not hashed
  # (the -g builds name it): objects are shared between clones in different folders.
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  # The Release, sanitizer and fuzz builds together take about 3 GB.
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-10G}"
  COMPILER_CACHE_ARGS=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
