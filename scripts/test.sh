#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (GPU tests skip themselves without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
