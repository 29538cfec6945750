#!/usr/bin/python3
"""zero-torch-lm at world 4 under zero-run: torch AdamW with one all-reduce after backward against
zero::TorchOptimizer at stages 0 and 2, with and without overlap (bench/results/torch.md).

  bench/scripts/torch_lm_bench.py [--build build] [--rounds 5] [--steps 12] [--skip 2] [--world 4]
                                  [--dim 256 --layers 4 --heads 4 --vocab 512 --seq 64 --batch 16]
                                  [--bucket 524288] [--no-overlap-comm] [--json-out FILE]

Each round runs every configuration once, in an order rotated by one each round (the machine is shared and
noisy: a slow minute then hits every configuration, not one). Per configuration it reports the medians over
all rounds' steps (the first --skip steps of each run dropped: allocation, Gloo's first connections) of
rank 0's --time figures, and per stage the fraction of the reduction hidden under backward,
1 - reduce_wait(overlap) / reduce_wait(no overlap), from each round's medians (their median over the rounds,
and the lowest and highest). Then every rank's optimizer-state bytes (zero's memory_report, tag "optimizer")
against 8 Psi (stage 0, torch) and 8 Psi / N (stage 2). Timing only: no assertion anywhere.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

CONFIGS = [
    ("torch", "torch AdamW + all-reduce after backward", ["--optimizer", "torch"]),
    ("zero-s0-no-overlap", "zero stage 0, no overlap", ["--optimizer", "zero", "--stage", "0", "--no-overlap"]),
    ("zero-s0-overlap", "zero stage 0, overlap", ["--optimizer", "zero", "--stage", "0"]),
    ("zero-s2-no-overlap", "zero stage 2, no overlap", ["--optimizer", "zero", "--stage", "2", "--no-overlap"]),
    ("zero-s2-overlap", "zero stage 2, overlap", ["--optimizer", "zero", "--stage", "2"]),
]
# rank 0's --time fields; those a mode does not print count 0 (torch: no norm_ms/allgather_ms; zero: no copy_ms).
FIELDS = ["total_ms", "fwd_bwd_ms", "step_ms", "reduce_wait_ms", "optimizer_ms", "norm_ms", "allgather_ms", "copy_ms"]


def config_json(bucket, overlap_comm):
    # The optimizer the embedded default has; buckets of `bucket` elements (several over this model) and
    # overlap_comm, without which a reduction started from a backward hook is waited for inside that hook
    # (--no-overlap-comm leaves the key out: DeepSpeed's default, false at stages 0-2).
    zero = {"stage": 2, "reduce_bucket_size": bucket}
    if overlap_comm:
        zero["overlap_comm"] = True
    return {
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
    }


def run_once(args, cfg_path, flags):
    cmd = [os.path.join(args.build, "bin", "zero-run"), "-n", str(args.world), "--timeout", "600", "--",
           os.path.join(args.build, "bin", "zero-torch-lm"), "--json", "--time", "--config", cfg_path,
           "--steps", str(args.steps), "--dim", str(args.dim), "--layers", str(args.layers), "--heads",
           str(args.heads), "--vocab", str(args.vocab), "--seq", str(args.seq), "--batch", str(args.batch)] + flags
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out.stdout))
    steps, ranks = [], []
    for line in out.stdout.splitlines():
        m = re.match(r"^\[r(\d+)\] (\{.*\})$", line)
        if not m:
            continue
        j = json.loads(m.group(2))
        if "step" in j and m.group(1) == "0":
            steps.append(j)
        elif "rank" in j:
            ranks.append(j)
    return steps, ranks, cmd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--skip", type=int, default=2)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--bucket", type=int, default=524288)
    p.add_argument("--no-overlap-comm", action="store_true")
    p.add_argument("--json-out", default="")
    args = p.parse_args()

    fd, cfg_path = tempfile.mkstemp(prefix="torch_lm_bench_", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(config_json(args.bucket, not args.no_overlap_comm), f)
    print("config (%s): %s" % (cfg_path, json.dumps(config_json(args.bucket, not args.no_overlap_comm))))

    per_step = {key: {f: [] for f in FIELDS} for key, _, _ in CONFIGS}
    per_round = {key: [] for key, _, _ in CONFIGS}  # each round's medians
    memory = {}
    for r in range(args.rounds):
        order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]
        for key, _, flags in order:
            steps, ranks, cmd = run_once(args, cfg_path, flags)
            if r == 0 and key == order[0][0]:
                print("command: " + " ".join(cmd))
            kept = [s for s in steps if s["step"] > args.skip]
            for f in FIELDS:
                per_step[key][f] += [s.get(f, 0.0) for s in kept]
            per_round[key].append({f: statistics.median(s.get(f, 0.0) for s in kept) for f in FIELDS})
            memory[key] = sorted(ranks, key=lambda j: j["rank"])
            print("round %d %-20s total %7.1f ms  fwd+bwd %7.1f  step %6.1f  reduce wait %6.1f" %
                  (r + 1, key, per_round[key][-1]["total_ms"], per_round[key][-1]["fwd_bwd_ms"],
                   per_round[key][-1]["step_ms"], per_round[key][-1]["reduce_wait_ms"]), flush=True)
    os.unlink(cfg_path)

    print()
    print("Medians over %d rounds x %d steps, ms (rank 0):" % (args.rounds, args.steps - args.skip))
    print()
    print("| configuration | iteration | forward+backward | after backward (step) | blocked on reduction | optimizer |"
          " norm | all-gather | copies |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, label, _ in CONFIGS:
        med = {f: statistics.median(per_step[key][f]) for f in FIELDS}
        print("| %s | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f |" %
              (label, med["total_ms"], med["fwd_bwd_ms"], med["step_ms"], med["reduce_wait_ms"], med["optimizer_ms"],
               med["norm_ms"], med["allgather_ms"], med["copy_ms"]))
    print()
    hidden = {}
    for stage in (0, 2):
        on, off = per_round["zero-s%d-overlap" % stage], per_round["zero-s%d-no-overlap" % stage]
        fr = [1 - a["reduce_wait_ms"] / b["reduce_wait_ms"] for a, b in zip(on, off)]
        pooled = 1 - statistics.median(per_step["zero-s%d-overlap" % stage]["reduce_wait_ms"]) / statistics.median(
            per_step["zero-s%d-no-overlap" % stage]["reduce_wait_ms"])
        hidden[stage] = {"per_round": fr, "median": statistics.median(fr), "pooled": pooled}
        print("stage %d: hidden under backward 1 - wait(overlap)/wait(no overlap): median over rounds %.2f "
              "(rounds: %s); from the pooled medians %.2f" %
              (stage, statistics.median(fr), ", ".join("%.2f" % x for x in fr), pooled))
    print()
    print("| configuration | rank | Psi (elements) | optimizer state bytes | formula | formula bytes |")
    print("|---|---:|---:|---:|---|---:|")
    for key, label, _ in CONFIGS:
        for j in memory[key]:
            stage = j.get("stage", 0)
            formula = "8 Psi" if key == "torch" or stage == 0 else "8 Psi / %d" % j["world"]
            print("| %s | %d | %d | %d | %s | %d |" % (label, j["rank"], j["psi"], j["optimizer_state_bytes"],
                                                     formula, j["formula_bytes"]))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "per_step": per_step, "per_round": per_round, "hidden": hidden,
                       "memory": memory}, f)


if __name__ == "__main__":
    main()
