#!/usr/bin/env python3
"""The NVMe tier (offload_optimizer.device "nvme") on the host engine, side by side with CPU offload in one run:

  - the disk, measured first with zero-io-bench on the same folder (engine reads and writes, the aio settings of
    the runs);
  - zero-gpt with CPU offload and with the NVMe tier, alternating (cpu, nvme, cpu, nvme): step time (median of the
    steps after the first), the NVMe tier's bytes moved per step against the formula 2 × (4 + 4k) × S (S = the
    host-updated elements per rank, Ψ/N with full offload; k = 2 Adam states; read once and written once per step),
    and the fraction of the disk's bandwidth the tier's worker reached while it moved them: the time zero-io-bench's
    rates give for those reads and writes over the time the worker was busy; for all W ranks at once, against
    zero-io-bench --jobs W (W streams at once, each its own file and engine, as the W ranks' tiers share the disk);
  - a budget for the host tier (zero-gpt --host-limit) between what the NVMe tier needs and what CPU offload
    needs: CPU offload fails naming it, the NVMe tier trains, and its losses are compared with CPU offload's
    without the budget.

  bench/scripts/nvme_tier.py [--build build] [--dir FOLDER] [--model small] [--world 2] [--stage 2] [--steps 8]

With --params, the parameter tier (offload_param.device "nvme", stage 3) instead, beside offload_param "cpu" (both
with offload_optimizer "cpu"), alternating (cpu, nvme, cpu, nvme): step time (median of the steps after the first),
and the tier's bytes per rank against the formula: each gather reads its unit's shard (the root unit once per
micro-step, each block twice: forward and backward), each step writes every shard once (bf16: nothing is read
for the update); losses compared.

FOLDER defaults to the system's temporary folder. Prints a markdown report.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def config(args, device):
    with open(os.path.join(ROOT, "examples/gpt/configs/zero3_offload.json")) as f:
        c = json.load(f)
    c.pop("steps_per_print", None)
    c["wall_clock_breakdown"] = False
    z = c["zero_optimization"]
    z["stage"] = args.stage
    z["sub_group_size"] = args.sub_group
    z.pop("offload_param", None)
    z["offload_optimizer"] = {"device": device, "pin_memory": True}
    if device == "nvme":
        z["offload_optimizer"].update({"nvme_path": args.dir, "buffer_count": args.buffers, "pipeline_read": True,
                                       "pipeline_write": True})
    c["aio"] = {"block_size": args.block, "queue_depth": args.queue_depth}
    return c


def zero_gpt(args, cfg, host_limit=0, check=True):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
        path = f.name
    cmd = [os.path.join(args.build, "bin/zero-gpt"), "--model", args.model, "--world", str(args.world), "--steps",
           str(args.steps), "--config", path, "--json"]
    if host_limit:
        cmd += ["--host-limit", str(host_limit)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        os.unlink(path)
    if check and p.returncode != 0:
        sys.exit("zero-gpt failed:\n" + p.stderr[-3000:])
    out = {"rc": p.returncode, "stderr": p.stderr, "steps": [], "summary": None, "nvme": None}
    for line in p.stdout.splitlines():
        if not line.startswith("{"):
            continue
        o = json.loads(line)
        if "step" in o and "loss" in o:
            out["steps"].append(o)
        elif "memory" in o:
            out["summary"] = o
        elif "nvme" in o:
            out["nvme"] = o["nvme"]
        elif "nvme_param" in o:
            out["nvme_param"] = o["nvme_param"]
    return out


def param_config(args, device):
    with open(os.path.join(ROOT, "examples/gpt/configs/zero3_offload.json")) as f:
        c = json.load(f)
    c.pop("steps_per_print", None)
    c["wall_clock_breakdown"] = False
    z = c["zero_optimization"]
    z["stage"] = 3
    z["stage3_param_persistence_threshold"] = 0  # every unit's shard in the tier
    z["sub_group_size"] = args.sub_group
    z["offload_param"] = {"device": device, "pin_memory": True}
    if device == "nvme":
        z["offload_param"].update({"nvme_path": args.dir, "buffer_count": args.buffers})
    c["aio"] = {"block_size": args.block, "queue_depth": args.queue_depth}
    return c


def param_tier(args):
    est = subprocess.run([os.path.join(args.build, "bin/zero-estimate"), "--model", args.model, "--world",
                          str(args.world), "--json"], capture_output=True, text=True, check=True)
    m = json.loads(est.stdout.strip().splitlines()[-1])["model"]
    h, L = m["hidden"], m["layers"]
    root = m["vocab"] * h + m["seq"] * h + 2 * h  # embeddings, positions, final layernorm (examples/gpt/model.h)
    block = 12 * h * h + 13 * h

    def shard(n):
        q = 32 * args.world
        return (n + q - 1) // q * q // args.world

    runs = {"cpu": [], "nvme": []}
    for _ in range(2):
        for dev in ("cpu", "nvme"):
            runs[dev].append(zero_gpt(args, param_config(args, dev)))

    def step_ms(rs):
        return statistics.median([s["step_ms"] for r in rs for s in r["steps"][1:]])

    cpu_ms, nvme_ms = step_ms(runs["cpu"]), step_ms(runs["nvme"])
    n = runs["nvme"][-1]
    nv = n["nvme_param"]
    cds = 2  # bf16 (zero3_offload.json)
    read = args.steps * (shard(root) + 2 * L * shard(block)) * cds
    written = args.steps * (shard(root) + L * shard(block)) * cds
    same = all(a["loss"] == b["loss"] for a, b in zip(runs["cpu"][-1]["steps"], n["steps"]))
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}; folder {args.dir}")
    print(f"model {args.model} ({n['summary']['params']} parameters), world {args.world} (thread-ranks of one "
          f"zero-gpt), stage 3, bf16, offload_optimizer cpu, offload_param nvme: buffer_count {args.buffers}, "
          f"aio block {args.block} depth {args.queue_depth}, {args.steps} steps")
    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| parameter tier bytes read, measured (rank 0, {args.steps} steps, {nv['gathers']} gathers) | "
          f"{nv['step_bytes_read']:,} |")
    print(f"| formula steps × (S_root + 2·L·S_block) × 2 | {read:,} |")
    print(f"| parameter tier bytes written, measured (rank 0) | {nv['step_bytes_written']:,} |")
    print(f"| formula steps × (S_root + L·S_block) × 2 | {written:,} |")
    print(f"| shards in the \"nvme\" tier (memory report, params) | {tier_bytes(n['summary'], 'nvme'):,} |")
    print(f"| step time, median: offload_param cpu {cpu_ms:.1f} ms, nvme {nvme_ms:.1f} ms | nvme / cpu "
          f"{nvme_ms / cpu_ms:.2f} |")
    print(f"| losses nvme == cpu (every step, bitwise as printed) | {same} |")
    for name, r in (("cpu", runs["cpu"][-1]), ("nvme", n)):
        mem = {k: (v["tier"], v["current"]) for k, v in r["summary"]["memory"].items() if isinstance(v, dict)
               and "tier" in v}
        print(f"- memory of {name} (rank-max, current bytes): {mem}")


def io_bench(args, jobs=1):
    p = subprocess.run([os.path.join(args.build, "bin/zero-io-bench"), args.dir, "--size", args.io_size, "--block",
                        str(args.block), "--queue-depth", str(args.queue_depth), "--iters", "3", "--json",
                        "--jobs", str(jobs)],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def tier_bytes(summary, tier):
    return sum(v["current"] for k, v in summary["memory"].items()
               if isinstance(v, dict) and v.get("tier") == tier and k != "peak_total")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--model", default="small")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--sub-group", type=int, default=1 << 18)
    ap.add_argument("--buffers", type=int, default=4)
    ap.add_argument("--block", type=int, default=1 << 20)
    ap.add_argument("--queue-depth", type=int, default=8)
    ap.add_argument("--io-size", default="512M")
    ap.add_argument("--params", action="store_true", help="the parameter tier (offload_param nvme, stage 3)")
    args = ap.parse_args()
    if args.params:
        param_tier(args)
        return

    disk = io_bench(args)
    rbw = statistics.median(disk["read"]["engine_gbps"]) * 1e9
    wbw = statistics.median(disk["write"]["engine_gbps"]) * 1e9
    disk_all = io_bench(args, args.world) if args.world > 1 else disk
    rbw_all = statistics.median(disk_all["read"]["engine_gbps"]) * 1e9
    wbw_all = statistics.median(disk_all["write"]["engine_gbps"]) * 1e9
    runs = {"cpu": [], "nvme": []}
    for _ in range(2):
        for dev in ("cpu", "nvme"):
            runs[dev].append(zero_gpt(args, config(args, dev)))

    def step_ms(rs):
        return statistics.median([s["step_ms"] for r in rs for s in r["steps"][1:]])

    cpu_ms, nvme_ms = step_ms(runs["cpu"]), step_ms(runs["nvme"])
    n = runs["nvme"][-1]
    nv = n["nvme"]
    params = n["summary"]["params"]
    per_rank = params / args.world
    formula = 2 * (4 + 4 * 2) * per_rank
    moved = (nv["step_bytes_read"] + nv["step_bytes_written"]) / args.steps
    tier = tier_bytes(n["summary"], "nvme")
    ideal_s = nv["step_bytes_read"] / rbw + nv["step_bytes_written"] / wbw
    ideal_all_s = args.world * (nv["step_bytes_read"] / rbw_all + nv["step_bytes_written"] / wbw_all)
    busy_s = nv["io_busy_ms"] / 1e3
    same = all(a["loss"] == b["loss"] for a, b in zip(runs["cpu"][-1]["steps"], n["steps"]))

    # The budget: the NVMe tier's host peak and 1 % more, the least it trains under. CPU offload's master and state
    # are allocated at Finalize, before the communicator's staging (counted in the host tier but never refused) has
    # grown to its peak; so the budget refuses CPU offload only where those allocations alone pass it. With large
    # sub-groups the NVMe tier's staging buffers (buffer_count × sub_group_size) can hold as much as CPU offload's
    # state of a small model: then no budget tells the two apart, and the report says so instead of a refusal.
    cpu_sum, nvme_sum = runs["cpu"][-1]["summary"], n["summary"]
    cpu_peak, nvme_peak = cpu_sum["memory"]["peak_total"]["host"], nvme_sum["memory"]["peak_total"]["host"]
    budget = nvme_peak + nvme_peak // 100
    refused = zero_gpt(args, config(args, "cpu"), host_limit=budget, check=False)
    fits = zero_gpt(args, config(args, "nvme"), host_limit=budget, check=False)
    err = next((l for l in refused["stderr"].splitlines() if "budget" in l), None)
    if err is None:
        err = (f"(not refused: CPU offload's allocations fit under the NVMe tier's own host peak at these settings, so "
               f"this run does not show a model that fits only with the NVMe tier)" if refused["rc"] == 0
               else "(failed without naming the budget)")
    fit_same = fits["rc"] == 0 and all(a["loss"] == b["loss"]
                                      for a, b in zip(runs["cpu"][-1]["steps"], fits["steps"]))

    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}; folder {args.dir}")
    print(f"model {args.model} ({params} parameters), world {args.world} (thread-ranks of one zero-gpt), "
          f"stage {args.stage}, bf16, sub_group_size {args.sub_group}, buffer_count {args.buffers}, "
          f"aio block {args.block} depth {args.queue_depth}, {args.steps} steps")
    print(f"disk (zero-io-bench, engine, median of 3): read {rbw / 1e9:.3f} GB/s, write {wbw / 1e9:.3f} GB/s "
          f"({disk['backend']}, direct {disk['direct']})")
    if args.world > 1:
        print(f"disk, {args.world} streams at once (zero-io-bench --jobs {args.world}, all streams, median of 3): "
              f"read {rbw_all / 1e9:.3f} GB/s, write {wbw_all / 1e9:.3f} GB/s")
    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| NVMe tier bytes per step per rank, measured (rank 0) | {moved:,.0f} |")
    print(f"| formula 2 × 12 × Ψ/N (Ψ = {params:,}) | {formula:,.0f} |")
    print(f"| measured / formula | {moved / formula:.4f} |")
    print(f"| NVMe tier held per rank (memory report, \"nvme\") | {tier:,} |")
    print(f"| disk busy while training: {busy_s * 1e3:.0f} ms for {nv['step_bytes_read'] + nv['step_bytes_written']:,} "
          f"bytes; zero-io-bench's rates would take {ideal_s * 1e3:.0f} ms | fraction {ideal_s / busy_s:.2f} |")
    print(f"| all {args.world} ranks (their workers share the disk at once; ranks alike), against zero-io-bench "
          f"--jobs {args.world}: its rates would take {ideal_all_s * 1e3:.0f} ms | fraction "
          f"{ideal_all_s / busy_s:.2f} |")
    print(f"| steps waiting for the disk (rank 0) | {nv['wait_ms']:.0f} ms over {args.steps} steps |")
    print(f"| step time, median: CPU offload {cpu_ms:.1f} ms, NVMe tier {nvme_ms:.1f} ms | NVMe / CPU "
          f"{nvme_ms / cpu_ms:.2f} |")
    print(f"| losses NVMe == CPU offload (every step, bitwise as printed) | {same} |")
    print()
    print(f"host budget {budget:,} bytes per rank (CPU offload's host peak {cpu_peak:,}, the NVMe tier's {nvme_peak:,})")
    print(f"- CPU offload under it: exit {refused['rc']}: {err.strip()}")
    print(f"- NVMe tier under it: exit {fits['rc']}, host peak "
          f"{fits['summary']['memory']['peak_total']['host'] if fits['summary'] else 'n/a':,}, "
          f"nvme {tier_bytes(fits['summary'], 'nvme') if fits['summary'] else 0:,} bytes; losses equal to CPU "
          f"offload without the budget: {fit_same}")
    if fits["steps"]:
        print("- losses: " + ", ".join(f"{s['loss']:.6f}" for s in fits["steps"]))
    for name, r in (("cpu", runs["cpu"][-1]), ("nvme", n)):
        mem = {k: (v["tier"], v["current"]) for k, v in r["summary"]["memory"].items() if isinstance(v, dict)
               and "tier" in v}
        print(f"- memory of {name} (rank-max, current bytes): {mem}")


if __name__ == "__main__":
    main()
