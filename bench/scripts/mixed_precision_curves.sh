#!/usr/bin/env bash
# bf16 vs fp32 training of the tiny GPT at world size 4, ZeRO stage 3, 200 steps; prints a markdown report with
# 20-step mean losses, the largest relative gap, and the raw per-step losses as CSV.
#   bench/scripts/mixed_precision_curves.sh [BUILD_DIR] > bench/results/mixed-precision-gpt.md
set -euo pipefail
B=${1:-build}
STEPS=${STEPS:-200}
tmp=$(mktemp -d)
for p in fp32 bf16; do
  en=false; [[ $p == bf16 ]] && en=true
  cat > "$tmp/$p.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": $en},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}}, "gradient_clipping": 1.0,
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
JSON
  "$B/bin/zero-gpt" --model tiny --world 4 --steps "$STEPS" --seq 32 --config "$tmp/$p.json" --json 2>/dev/null \
    | grep '"loss"' | sed 's/.*"loss": \([0-9.]*\).*/\1/' > "$tmp/$p.loss"
done
echo "# bf16 vs fp32: tiny GPT, world size 4 (threads), ZeRO stage 3, $STEPS steps"
echo
echo "Command: \`bench/scripts/mixed_precision_curves.sh build\` (zero-gpt --model tiny --world 4 --steps $STEPS --seq 32, micro-batch 4, AdamW lr 3e-3, clip 1.0)."
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%Y-%m-%d)."
echo
echo "Tolerance: each 20-step mean loss of bf16 within 2% of fp32's (the test tests/shard/mixed_precision_engine_test.cc"
echo "checks 10-step means over 40 steps)."
echo
echo "| steps | fp32 mean loss | bf16 mean loss | relative gap |"
echo "|---|---|---|---|"
paste "$tmp/fp32.loss" "$tmp/bf16.loss" | awk -v W=20 '
  { f += $1; b += $2; n++; if (n == W) { g = (b - f) / f; printf "| %d-%d | %.4f | %.4f | %+.2f%% |\n", NR-W+1, NR, f/W, b/W, 100*g; if (g<0) g=-g; if (g>mx) mx=g; f=0; b=0; n=0 } }
  END { printf "\nLargest 20-step relative gap: %.2f%%\n", 100*mx }'
echo
echo "Per-step losses (step,fp32,bf16):"
echo
echo '```csv'
paste -d, "$tmp/fp32.loss" "$tmp/bf16.loss" | awk '{print NR "," $0}'
echo '```'
rm -rf "$tmp"
