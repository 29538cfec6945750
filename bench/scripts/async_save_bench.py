#!/usr/bin/env python3
"""Asynchronous checkpoints against synchronous ones on the small GPT (issue 36): zero-gpt --model small saving
every 10 steps, run without saving, with synchronous saves and with --save-async, the three modes alternating
(--rounds times each) in one invocation, each save into a fresh folder on the same disk.

    bench/scripts/async_save_bench.py [--build build] [--steps 60] [--every 10] [--rounds 2] [--dir /tmp]
                                      [--extra "--world 2 --stage 2"] [--rate MB/S]

Figures (zero-gpt --json: each step's step_ms and whether an asynchronous save was in flight when it began; the
summary's "saves": the time each Save call held the trainer, and the final WaitForSave):
  blocked      median time a Save call held the trainer, async / sync (the goal: <= 0.1)
  slowdown     mean step time of the async run's steps that began with a save in flight, over the mean of the same
               steps in the runs without saves (the goal: <= 1.10)
  in-run       the same run's steps that began with a save in flight over its steps (after step 2) that began
               with none: the same process minutes apart at most, so less moved by a shared machine's load
Two asynchronous modes run: "async" (the writer at SCHED_IDLE, zero-gpt's default) and "async_normal"
(--save-priority normal), and with --rate a third, "async_paced" (idle priority, --save-rate MB/S: the write
spread over file bytes / rate seconds); each gets its blocked, slowdown and total figures.
  total        wall time of all steps plus all Save calls (and the final wait), each mode over the no-save run
  steal        CPU time the hypervisor took from this machine's cores during each run (/proc/stat's steal column,
               all CPUs, in ms), mean per run: on a VM whose disk is emulated by the host, what a write costs the
               host's cores shows up here, out of the guest scheduler's reach
Steps 1-2 (warm-up) are left out of the step means.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile


def run(args, mode):
    cmd = [os.path.join(args.build, "bin", "zero-gpt"), "--model", "small", "--steps", str(args.steps), "--json"]
    cmd += args.extra.split()
    folder = None
    if mode != "none":
        folder = tempfile.mkdtemp(prefix="zero_async_bench_", dir=args.dir)
        cmd += ["--save", folder, "--save-every", str(args.every)]
        if mode.startswith("async"):
            cmd.append("--save-async")
        if mode == "async_normal":
            cmd += ["--save-priority", "normal"]
        if mode == "async_paced":
            cmd += ["--save-rate", str(args.rate)]
    steal0 = steal_ms()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    steal = steal_ms() - steal0
    if folder:
        shutil.rmtree(folder)
    steps, summary = {}, None
    for line in out.splitlines():
        line = line[line.find("{"):] if "{" in line else ""
        if line.startswith('{"step"'):
            j = json.loads(line)
            steps[j["step"]] = j
        elif line.startswith('{"params"'):
            summary = json.loads(line)
    return {"cmd": " ".join(cmd), "steps": steps, "saves": summary["saves"], "steal_ms": steal}


def steal_ms():
    """The machine's stolen CPU time so far, in ms (0 where /proc/stat has no steal column)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    ticks = int(fields[8]) if len(fields) > 8 else 0
    return ticks * 1000.0 / os.sysconf("SC_CLK_TCK")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dir", default="/tmp")
    p.add_argument("--extra", default="")
    p.add_argument("--rate", type=float, default=0, help="MB/s: also run async_paced at this write rate")
    args = p.parse_args()
    modes = ("none", "sync", "async", "async_normal") + (("async_paced",) if args.rate > 0 else ())
    runs = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            runs[mode].append(run(args, mode))
    for mode, rs in runs.items():
        print(f"{mode}: {rs[0]['cmd']}")
    def step_ms(mode, pick=lambda s: True):
        return [s["step_ms"] for r in runs[mode] for k, s in r["steps"].items() if k > 2 and pick(s)]
    base_by_step = {}
    for r in runs["none"]:
        for k, s in r["steps"].items():
            base_by_step.setdefault(k, []).append(s["step_ms"])
    sync_saves = [ms for r in runs["sync"] for ms in r["saves"]["ms"]]
    res = {
        "step_ms_none": statistics.mean(step_ms("none")),
        "step_ms_sync": statistics.mean(step_ms("sync")),
        "save_ms_sync_median": statistics.median(sync_saves),
        "save_ms_sync": sync_saves,
    }
    def busy_ms(r):  # all steps plus all Save calls
        return sum(s["step_ms"] for s in r["steps"].values()) + sum(r["saves"]["ms"])
    total = {m: statistics.mean(busy_ms(r) + r["saves"]["final_wait_ms"] for r in runs[m]) for m in runs}
    res["total_ms"] = total
    # The same without the final WaitForSave: a run's last save is waited for once, however long the run.
    res["total_ratio_without_final_wait"] = {
        m: statistics.mean(busy_ms(r) for r in runs[m]) / statistics.mean(busy_ms(r) for r in runs["none"])
        for m in runs}
    res["steal_ms_per_run"] = {m: statistics.mean(r["steal_ms"] for r in runs[m]) for m in runs}
    res["total_ratio_sync"] = total["sync"] / total["none"]
    for mode in [m for m in modes if m.startswith("async")]:
        inflight = [(k, s["step_ms"]) for r in runs[mode] for k, s in r["steps"].items()
                    if k > 2 and s.get("save_in_flight")]
        saves = [ms for r in runs[mode] for ms in r["saves"]["ms"]]
        m = {
            "step_ms": statistics.mean(step_ms(mode)),
            "save_ms_median": statistics.median(saves),
            "save_ms": saves,
            "final_wait_ms": [r["saves"]["final_wait_ms"] for r in runs[mode]],
            "inflight_steps": len(inflight),
            "inflight_step_ms": statistics.mean(ms for _, ms in inflight) if inflight else None,
            "same_steps_no_save_ms": statistics.mean(statistics.mean(base_by_step[k]) for k, _ in inflight)
            if inflight else None,
        }
        m["blocked_ratio"] = m["save_ms_median"] / res["save_ms_sync_median"]
        if inflight:
            m["slowdown_inflight"] = m["inflight_step_ms"] / m["same_steps_no_save_ms"]
            quiet = step_ms(mode, lambda s: not s.get("save_in_flight"))
            m["slowdown_in_run"] = m["inflight_step_ms"] / statistics.mean(quiet)
        m["total_ratio"] = total[mode] / total["none"]
        res[mode] = m
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
