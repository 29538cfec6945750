#!/usr/bin/env bash
# Activation recomputation on the small GPT: peak activation bytes per rank by tier, and step time, with and
# without recomputation; prints a markdown report.
#   bench/scripts/recompute_table.sh [BUILD_DIR] > bench/results/recompute-gpt.md
# Environment: MODEL (small), WORLD (1), MICRO (4), SEQ (128), STEPS (6; the first is dropped as warm-up),
# REPEATS (5), BLAS_THREADS (1: on a shared 2-core machine a multi-threaded GEMM waits for its slowest thread,
# which multiplies the noise). The modes run interleaved, REPEATS rounds, so slow phases of a shared machine
# hit all of them; step times are medians over every measured step of every round.
set -euo pipefail
B=${1:-build}
MODEL=${MODEL:-small}
WORLD=${WORLD:-1}
MICRO=${MICRO:-4}
SEQ=${SEQ:-128}
STEPS=${STEPS:-6}
REPEATS=${REPEATS:-5}
BLAS_THREADS=${BLAS_THREADS:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# mode name | zero-gpt flag | activation_checkpointing section
modes=(
  "none||{\"profile\": true}"
  "every block|--recompute|{\"profile\": true}"
  "every 2nd block (number_checkpoints 3)|--recompute|{\"profile\": true, \"number_checkpoints\": 3}"
  "every block, cpu_checkpointing|--recompute|{\"profile\": true, \"cpu_checkpointing\": true}"
)
for i in "${!modes[@]}"; do
  IFS='|' read -r _ _ section <<<"${modes[$i]}"
  cat >"$tmp/$i.json" <<JSON
{"train_micro_batch_size_per_gpu": $MICRO, "activation_checkpointing": $section,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}}, "gradient_clipping": 1.0,
 "zero_optimization": {"stage": 0}}
JSON
done
for rep in $(seq 1 "$REPEATS"); do
  for i in "${!modes[@]}"; do
    IFS='|' read -r _ flag _ <<<"${modes[$i]}"
    # shellcheck disable=SC2086
    "$B/bin/zero-gpt" --model "$MODEL" --world "$WORLD" --steps "$STEPS" --seq "$SEQ" --config "$tmp/$i.json" \
      --blas-threads "$BLAS_THREADS" $flag --json 2>/dev/null >"$tmp/$i.$rep.jsonl"
  done
done

echo "# Activation recomputation: $MODEL GPT, world size $WORLD, micro-batch $MICRO, seq $SEQ"
echo
echo "Command: \`MODEL=$MODEL WORLD=$WORLD MICRO=$MICRO SEQ=$SEQ STEPS=$STEPS REPEATS=$REPEATS BLAS_THREADS=$BLAS_THREADS bench/scripts/recompute_table.sh $B\`"
echo "(zero-gpt --model $MODEL --world $WORLD --steps $STEPS --seq $SEQ --blas-threads $BLAS_THREADS, ZeRO stage 0, fp32, AdamW; --recompute and the"
echo "config's activation_checkpointing as in the first column)."
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $(date -u +%Y-%m-%d)."
echo
MODES=$(printf '%s\n' "${modes[@]}" | cut -d'|' -f1) python3 - "$tmp" "$REPEATS" <<'PY'
import json, os, statistics, sys

tmp, repeats = sys.argv[1], int(sys.argv[2])
names = os.environ["MODES"].splitlines()
runs = []
for i, name in enumerate(names):
    steps, summaries = [], []
    for rep in range(1, repeats + 1):
        lines = [json.loads(l) for l in open(f"{tmp}/{i}.{rep}.jsonl") if l.strip()]
        steps += [(l["step_ms"], l["cpu_ms"]) for l in lines if "step" in l and l["step"] > 1]
        summaries += [l for l in lines if "params" in l]
    runs.append((name, steps, summaries))

def act(summary, tier):
    return max([v["peak"] for k, v in summary["memory"].items() if k.startswith("activations") and v["tier"] == tier]
               or [0])

def mib(b):
    return f"{b / 2**20:.2f} MiB"

s0 = runs[0][2][0]
sz = s0["activation_sizes"]
L, S, A, H, Sc = sz["layers"], sz["stream"], sz["block"], sz["head"], sz["scratch"]
print(f"Per rank: residual stream S = {mib(S)} (one block's input), one block's saved activations A = {mib(A)}, "
      f"head activations H = {mib(H)}, block-backward scratch Sc = {mib(Sc)}, L = {L} blocks.")
print("Expected arena peaks (the stack of examples/gpt/train.cc): without recomputation 2S + L·A + max(H, Sc) = "
      f"{mib(2*S + L*A + max(H, Sc))}; with every block recomputed 2S + max(H, S + A + Sc) = "
      f"{mib(2*S + max(H, S + A + Sc))} plus L·S = {mib(L*S)} of checkpoints.")
print()
print("## Peak activation bytes per rank (rank 0; identical in every round)")
print()
print("| mode | recomputed per step | arena peak | checkpoints peak (tier) | device-tier activations peak | "
      "host-tier activations peak | device-tier vs none |")
print("|---|---|---|---|---|---|---|")
base_dev = act(s0, "device")
for name, _, summaries in runs:
    s = summaries[0]
    for other in summaries[1:]:  # bytes are deterministic: every round must agree
        assert other["memory"] == s["memory"] and other["recompute"]["peak_arena_bytes"] == s["recompute"]["peak_arena_bytes"], name
    rc = s["recompute"]
    per_step = rc["recomputes"] * L // rc["forwards"] if rc["forwards"] else 0
    print(f"| {name} | {per_step} of {L} blocks | {mib(rc['peak_arena_bytes'])} | {mib(rc['peak_checkpoint_bytes'])} "
          f"({rc['checkpoint_tier']}) | {mib(act(s, 'device'))} | {mib(act(s, 'host'))} | "
          f"{act(s, 'device') / base_dev:.3f}x |")
print()
print("## Step time (steps 2..N of every round)")
print()
print("Wall time is what the issue asks for, but on this shared machine it swings by 2x with other tenants' load;")
print("CPU time of the process (CLOCK_PROCESS_CPUTIME_ID around each step, one BLAS thread) does not grow while")
print("another tenant holds the core, so its ratio is the steadier measure of the recompute's cost. The last column")
print("is the time inside the Checkpointer (config `profile`): recompute / (forward + recompute + backward).")
print()
print("| mode | steps | wall median ms | wall p25-p75 | wall min | wall vs none (median) | CPU median ms | "
      "CPU p25-p75 | CPU vs none (median) | recompute share of segment time |")
print("|---|---|---|---|---|---|---|---|---|---|")
base_wall = statistics.median(s for s, _ in runs[0][1])
base_cpu = statistics.median(c for _, c in runs[0][1])
for name, steps, summaries in runs:
    wall = [w for w, _ in steps]
    cpu = [c for _, c in steps]
    qw, qc = statistics.quantiles(wall, n=4), statistics.quantiles(cpu, n=4)
    mw, mc = statistics.median(wall), statistics.median(cpu)
    f = sum(s["recompute"]["forward_s"] for s in summaries)
    r = sum(s["recompute"]["recompute_s"] for s in summaries)
    b = sum(s["recompute"]["backward_s"] for s in summaries)
    share = f"{100 * r / (f + r + b):.1f}% (fwd {f:.1f} s, recompute {r:.1f} s, bwd {b:.1f} s)"
    print(f"| {name} | {len(steps)} | {mw:.0f} | {qw[0]:.0f}-{qw[2]:.0f} | {min(wall):.0f} | {mw / base_wall:.3f}x | "
          f"{mc:.0f} | {qc[0]:.0f}-{qc[2]:.0f} | {mc / base_cpu:.3f}x | {share} |")
PY
