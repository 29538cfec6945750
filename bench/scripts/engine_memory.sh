#!/usr/bin/env bash
# Trains the GPT at ZeRO stages 0-3 with N thread-ranks and checks each rank's model-state bytes against the ZeRO
# formula for fp32 Adam (16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N). Prints a markdown report.
#   bench/scripts/engine_memory.sh [BUILD_DIR] [MODEL] [WORLD] [STEPS] > bench/results/engine-small-world4.md
set -euo pipefail
B=${1:-build}; MODEL=${2:-small}; W=${3:-4}; STEPS=${4:-10}
echo "# zero-gpt --model $MODEL --world $W: loss and per-rank memory at each ZeRO stage"
echo
echo "Command: \`bench/scripts/engine_memory.sh $B $MODEL $W $STEPS\`, i.e. for each stage"
echo "\`$B/bin/zero-gpt --model $MODEL --world $W --steps $STEPS --config examples/gpt/configs/zeroS.json --json\`."
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%Y-%m-%d)."
echo "Memory is the largest rank's, from zero's allocation tracker (bytes). The formula is on the padded Ψ"
echo "(units padded to a multiple of 32·N elements; for this model Ψ is already a multiple, so padding is 0)."
echo
echo "| stage | Ψ | loss step 1 | loss step $STEPS | params | grads | optimizer | model state | formula (padded Ψ) | match | gather peak | buckets peak | ms/step (median) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for s in 0 1 2 3; do
  out=$("$B/bin/zero-gpt" --model "$MODEL" --world "$W" --steps "$STEPS" --config "examples/gpt/configs/zero$s.json" --json 2>/dev/null)
  echo "$out" | python3 "$(dirname "$0")/engine_memory_row.py" "$s" "$W" "$MODEL"
done
