#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (GPU tests skip themselves without a GPU). Warnings are
# errors here (-DZERO_WERROR=ON), always, so a local run fails where CI (.ci/run) would; ZERO_WERROR=OFF in the
# environment turns that off.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh -DZERO_WERROR="${ZERO_WERROR:-ON}"
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
