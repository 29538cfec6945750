#!/usr/bin/env bash
# Configures and builds zero (Release) into build/. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
"./scripts/install-deps.sh" ${ZERO_INSTALL_ARGS:-}
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
