#!/usr/bin/env python3
"""Per-tag peaks beside the true peak and the placement plan's bound, zero-gpt at stages 0-3.

    bench/scripts/true_peak_table.py [BUILD_DIR] [MODEL] [WORLD] [STEPS] > bench/results/true-peak.md

Runs `BUILD/bin/zero-gpt --model MODEL --world WORLD --steps STEPS --json` at each stage twice: with DeepSpeed's
defaults (examples/gpt/configs/zeroS.json) and with a bounded window (examples/gpt/configs/zero_bounded.json:
reduce_bucket_size, stage3_prefetch_bucket_size and stage3_max_live_parameters at 3.7e6 elements, about two of
the small GPT's 1.77 M-element blocks, passed with --stage S). Prints a markdown table and checks that every true
peak is at or below its bound, and that with the bounded window the true peaks fall strictly from stage 0 to 3.
"""
import json
import os
import platform
import subprocess
import sys
import time

build, model, world, steps = (sys.argv[1:] + ["build", "small", "4", "3"][len(sys.argv) - 1:])[:4]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TAGS = ["params", "grads", "optimizer", "master", "gather", "buckets", "staging", "activations"]


def run(stage, bounded):
    cfg = "zero_bounded.json" if bounded else f"zero{stage}.json"
    cmd = [os.path.join(build, "bin", "zero-gpt"), "--model", model, "--world", world, "--steps", steps, "--json",
           "--config", os.path.join("examples", "gpt", "configs", cfg)]
    if bounded:
        cmd += ["--stage", str(stage)]
    out = subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def mib(b):
    return f"{b / 2**20:.2f}"


cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# True peak per rank beside per-tag peaks and the plan's bound: zero-gpt --model {model} --world {world}")
print()
print(f"Command: `bench/scripts/true_peak_table.py {build} {model} {world} {steps}`, which runs, per stage S,")
print(f"`{build}/bin/zero-gpt --model {model} --world {world} --steps {steps} --json --config "
      "examples/gpt/configs/zeroS.json` (defaults) and `... --config examples/gpt/configs/zero_bounded.json "
      "--stage S` (bounded).")
print(f"Machine: {os.cpu_count()} cores, {cpu}, {platform.system()} {platform.release()}; "
      f"{time.strftime('%Y-%m-%d', time.gmtime())}. Ranks are threads (Gloo over 127.0.0.1), fp32, AdamW.")
print()
print("Bytes are MiB, the largest rank's (per tag: its peak; `true peak`: `peak_total`, the high-water mark of all "
      "tags alive at once, the communicator's staging included; `bound`: `peak_bound`, Engine::TruePeakBound with "
      "the root unit and one block open at once and the trainer's activations at their peak). `sum` adds the "
      "per-tag peaks of both tiers: what the report gave before the true peak existed.")
print()
print("| stage | config | " + " | ".join(TAGS) + " | sum of tag peaks | true peak device | true peak host "
      "| bound device | bound host | true peak / bound (both tiers) |")
print("|" + "---|" * (len(TAGS) + 8))
ok = True
bounded_peaks = []
for bounded in (False, True):
    for stage in range(4):
        d = run(stage, bounded)
        mem = d["memory"]
        tags = []
        total_tags = 0
        for t in TAGS:
            peak = sum(v["peak"] for k, v in mem.items() if k == t or k.startswith(t + "@"))
            total_tags += peak
            tags.append(mib(peak) if peak else "0")
        pt, pb = mem["peak_total"], d["peak_bound"]
        ratio = (pt["device"] + pt["host"]) / (pb["device"] + pb["host"])
        within = pt["device"] <= pb["device"] and pt["host"] <= pb["host"]
        ok &= within
        if bounded:
            bounded_peaks.append(pt["device"] + pt["host"])
        print(f"| {stage} | {'bounded' if bounded else 'defaults'} | " + " | ".join(tags) +
              f" | {mib(total_tags)} | {mib(pt['device'])} | {mib(pt['host'])} | {mib(pb['device'])} | "
              f"{mib(pb['host'])} | {ratio:.3f}{'' if within else ' EXCEEDS'} |")
falling = all(a > b for a, b in zip(bounded_peaks, bounded_peaks[1:]))
print()
print(f"Every true peak at or below its bound: {'yes' if ok else 'NO'}. With the bounded window the true peaks "
      f"(device + host) fall strictly from stage 0 to 3: {'yes' if falling else 'NO'} "
      f"({', '.join(mib(p) for p in bounded_peaks)} MiB).")
sys.exit(0 if ok and falling else 1)
