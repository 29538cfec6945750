#!/usr/bin/env bash
# Configures and builds zero (Release) into build/. Extra arguments go to the CMake configure step.
#   ZERO_BUILD_DIR=dir        build there instead of build/ (scripts/test.sh --sanitize: build-asan, build-tsan)
#   ZERO_BUILD_TARGETS="a b"  build only these targets (and what they depend on) instead of everything
set -euo pipefail
cd "$(dirname "$0")/.."
"./scripts/install-deps.sh" ${ZERO_INSTALL_ARGS:-}
jobs=$(nproc)
# The compiler cache (CMakeLists.txt uses ccache where installed) keys on paths relative to the checkout, and not
# on the build folder, so a clone in another folder (CI's) reuses what an earlier build compiled; the sanitizer
# builds' -g1 would otherwise put the folder into every key. The cost: an object's debug info names the folder
# of the build that first compiled it, while its line tables hold the relative paths the reports print.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
dir=${ZERO_BUILD_DIR:-build}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
# shellcheck disable=SC2206
targets=(${ZERO_BUILD_TARGETS:-})
if [[ ${#targets[@]} -gt 0 ]]; then
  cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
else
  cmake --build "$dir" -j "$jobs"
fi
