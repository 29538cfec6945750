#!/usr/bin/env bash
# Configures and builds zero (Release) into build/. Extra arguments go to the CMake configure step.
#   ZERO_BUILD_DIR=dir        build there instead of build/ (scripts/test.sh --sanitize: build-asan, build-tsan)
#   ZERO_BUILD_TARGETS="a b"  build only these targets (and what they depend on) instead of everything
set -euo pipefail
cd "$(dirname "$0")/.."
"./scripts/install-deps.sh" ${ZERO_INSTALL_ARGS:-}
jobs=$(nproc)
dir=${ZERO_BUILD_DIR:-build}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
# shellcheck disable=SC2206
targets=(${ZERO_BUILD_TARGETS:-})
if [[ ${#targets[@]} -gt 0 ]]; then
  cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
else
  cmake --build "$dir" -j "$jobs"
fi
