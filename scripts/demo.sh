#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on its embedded default: the reference GPT trained at
# ZeRO stages 0-3 with 4 ranks as threads, printing bytes per rank by category beside the ZeRO formula.
# Extra arguments go to zero-demo (e.g. --model small --world 2 --steps 20 --csv out.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
exec ./build/bin/zero-demo "$@"
