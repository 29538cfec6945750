#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on its embedded default: the reference GPT trained at
# ZeRO stages 0-3 (and stage 3 with bf16, recomputation, offload) with 4 ranks as threads, printing bytes per rank
# by category beside zero::Estimate's prediction and the ZeRO formula, and writing demo-out/zero-demo.csv and
# demo-out/zero-demo.png (the picture needs gnuplot, which scripts/install-deps.sh installs).
# Extra arguments go to zero-demo (e.g. --model small --world 2 --steps 20 --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
exec ./build/bin/zero-demo "$@"
