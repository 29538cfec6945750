#!/usr/bin/env python3
"""Offload on the host engine: where each buffer lives and where the step's time goes, side by side.

Runs zero-gpt (N thread-ranks) with the same model, data, seed and steps under several offload settings, reads
each step's `wall_clock_breakdown` line (rank 0) and the final memory table, and prints a markdown report.

  bench/scripts/offload_breakdown.py [--build build] [--model small] [--world 2] [--steps 8]
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

VARIANTS = [
    ("stage 3, no offload", 3, None, None),
    ("stage 3, offload_optimizer", 3, "cpu", None),
    ("stage 3, offload_optimizer + offload_param", 3, "cpu", "cpu"),
    ("stage 3, Twin-Flow ratio 0.5", 3, ("cpu", 0.5), None),
    ("stage 2, no offload", 2, None, None),
    ("stage 2, offload_optimizer", 2, "cpu", None),
]

FIELDS = ["total", "compute", "gather_wait", "reduce_wait", "norm", "optimizer", "allgather"]
OFF_FIELDS = ["copy stream busy", "waited"]


def config(stage, opt, param):
    with open(os.path.join(ROOT, "examples/gpt/configs/zero3_offload.json")) as f:
        c = json.load(f)
    z = c["zero_optimization"]
    z["stage"] = stage
    z.pop("offload_optimizer", None)
    z.pop("offload_param", None)
    if opt is not None:
        dev, ratio = (opt, 1.0) if isinstance(opt, str) else opt
        z["offload_optimizer"] = {"device": dev, "pin_memory": True, "ratio": ratio}
    if param is not None:
        z["offload_param"] = {"device": param, "pin_memory": True}
    return c


def run(args, cfg):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
        path = f.name
    try:
        p = subprocess.run([os.path.join(args.build, "bin/zero-gpt"), "--model", args.model, "--world",
                            str(args.world), "--steps", str(args.steps), "--config", path],
                           capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    steps = []
    for line in p.stderr.splitlines():
        if "| ms:" not in line:
            continue
        row = {}
        for k in FIELDS:
            m = re.search(r"(?<![\w])%s ([0-9.e+-]+)" % k, line)
            row[k] = float(m.group(1)) if m else 0.0
        for k in OFF_FIELDS:
            m = re.search(r"%s ([0-9.e+-]+)" % k, line)
            row[k] = float(m.group(1)) if m else 0.0
        steps.append(row)
    mem = {}
    for line in p.stdout.splitlines():
        m = re.match(r"(host|device)\s+(\w+)\s+(\d+)\s+(\d+)", line)
        if m:
            mem[(m.group(1), m.group(2))] = (int(m.group(3)), int(m.group(4)))
    losses = re.findall(r"step\s+\d+\s+loss ([0-9.]+)", p.stdout)
    return steps, mem, losses


def mib(b):
    return "%.1f" % (b / 2**20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="small")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    print("# Offload on the host engine: placement and step breakdown, zero-gpt --model %s --world %d\n" %
          (args.model, args.world))
    print("Command: `bench/scripts/offload_breakdown.py --build %s --model %s --world %d --steps %d` (each variant "
          "is `zero-gpt` with `examples/gpt/configs/zero3_offload.json` — bf16, AdamW, sub_group_size 1e6, "
          "wall_clock_breakdown — with only `stage` and the offload sections changed).  " %
          (args.build, args.model, args.world, args.steps))
    print("Machine: %d cores, %s, %s. Times are rank 0's, the median over steps 2-%d (ms); the host is shared, "
          "so compare rows within this run only.\n" % (os.cpu_count(), cpu, platform.node() and "shared dev host",
                                                         args.steps))
    rows = []
    for name, stage, opt, param in VARIANTS:
        steps, mem, losses = run(args, config(stage, opt, param))
        rows.append((name, steps[1:], mem, losses))
    print("## Where the model state lives (rank 0, MiB, current)\n")
    print("| variant | device params | device grads | device master | device optimizer | host params | host grads |"
          " host master | host optimizer | device gather peak | device buckets peak | final loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, steps, mem, losses in rows:
        g = lambda t, k, i=0: mib(mem.get((t, k), (0, 0))[i])
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, g("device", "params"), g("device", "grads"), g("device", "master"), g("device", "optimizer"),
            g("host", "params"), g("host", "grads"), g("host", "master"), g("host", "optimizer"),
            g("device", "gather", 1), g("device", "buckets", 1), losses[-1] if losses else "?"))
    print("\n## Where the step's time goes (rank 0, median ms over steps 2-%d)\n" % args.steps)
    print("`copy busy` is the copy stream's own time (gradient shards landing in the host tier during backward, "
          "updated parameters copied back during the host step); it runs beside the rest. `copy waited` is the "
          "time the trainer's thread was blocked on it. Serialized copies would make the two equal.\n")
    print("| variant | total | compute | gather wait | reduce wait | optimizer | all-gather | copy busy | copy waited |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, steps, mem, losses in rows:
        med = lambda k: "%.2f" % statistics.median(s[k] for s in steps) if steps else "?"
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, med("total"), med("compute"), med("gather_wait"), med("reduce_wait"), med("optimizer"),
            med("allgather"), med("copy stream busy"), med("waited")))


if __name__ == "__main__":
    sys.exit(main())
