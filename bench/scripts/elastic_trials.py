#!/usr/bin/env python3
"""Fault trials for restart from the last checkpoint (issue 35): a 4-rank zero-gpt run under
`zero-run --max-restarts 3`, one rank SIGKILLed or SIGSTOPped at a random step; the job must finish its steps,
and its final parameters (a hash of every fp32 bit) and last losses must equal an uninterrupted run's.

    bench/scripts/elastic_trials.py [--build build] [--trials 10] [--steps 40] [--seed 1] [--out FILE]

Per trial it records the step the fault hit, the checkpoint the restart resumed from, the steps lost (the last
step trained before the fault minus that checkpoint's step), and the time from the fault to the first step
trained after the restart. The world size does not change (zero-run restarts every rank), so equality is bitwise.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "comm_timeout_s": 3,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2},
}
STEP_RE = re.compile(r'^\[r0\] \{"step": (\d+), "loss": ([0-9.]+)')


def command(build, cfg, ckpt, steps):
    return [f"{build}/bin/zero-run", "-n", "4", "--max-restarts", "3", "--grace", "5", "--",
            f"{build}/bin/zero-gpt", "--model", "tiny", "--steps", str(steps), "--config", cfg, "--json",
            "--params-hash", "--save", ckpt, "--save-every", "5", "--resume", ckpt]


def rank_pids(ckpt):
    """The zero-gpt processes of this job (their argv names its checkpoint folder), by RANK."""
    pids = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if not argv or not argv[0].endswith(b"zero-gpt") or ckpt.encode() not in argv:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            pids[int(env[b"RANK"])] = int(pid)
        except (OSError, KeyError, ValueError):
            continue
    return pids


def run_job(build, cfg, ckpt, steps, fault=None):
    """Runs one job; with fault=(mode, step, rank), signals that rank once rank 0 has printed that step.
    Returns (rc, lines with their arrival times, fault time, output)."""
    proc = subprocess.Popen(command(build, cfg, ckpt, steps), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    lines, fired_at = [], None
    for line in proc.stdout:
        now = time.monotonic()
        lines.append((now, line.rstrip("\n")))
        m = STEP_RE.match(line)
        if fault and fired_at is None and m and int(m.group(1)) == fault[1]:
            pid = rank_pids(ckpt).get(fault[2])
            if pid is not None:
                os.kill(pid, signal.SIGKILL if fault[0] == "kill" else signal.SIGSTOP)
                fired_at = time.monotonic()
    rc = proc.wait()
    return rc, lines, fired_at


def summary(lines):
    steps = [(t, int(m.group(1)), m.group(2)) for t, l in lines if (m := STEP_RE.match(l))]
    hashes = [json.loads(l[5:])["params_hash"] for _, l in lines if '"params_hash"' in l and l.startswith("[r0]")]
    return steps, hashes[-1] if hashes else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="zero-elastic-")
    cfg = os.path.join(tmp, "config.json")
    with open(cfg, "w") as f:
        json.dump(CONFIG, f)
    out = []

    def say(s=""):
        print(s, flush=True)
        out.append(s)

    try:
        rc, lines, _ = run_job(args.build, cfg, os.path.join(tmp, "ref"), args.steps)
        ref_steps, ref_hash = summary(lines)
        if rc != 0 or ref_hash is None:
            sys.exit(f"elastic_trials: the uninterrupted run failed (rc {rc}):\n" + "\n".join(l for _, l in lines[-10:]))
        ref_loss = {s: loss for _, s, loss in ref_steps}
        say(f"uninterrupted: {args.steps} steps, params_hash {ref_hash}, last loss {ref_loss[args.steps]}")
        say()
        say("| trial | fault | rank | at step | resumed from | steps lost | fault to training again (s) | restarts | rc | "
            "losses equal | params bitwise equal |")
        say("|---|---|---|---|---|---|---|---|---|---|---|")
        results = {"kill": [], "stop": []}
        for trial in range(1, 2 * args.trials + 1):
            mode = "kill" if trial <= args.trials else "stop"
            at, rank = rng.randint(3, args.steps - 3), rng.randint(0, 3)
            ckpt = os.path.join(tmp, f"t{trial}")
            rc, lines, fired = run_job(args.build, cfg, ckpt, args.steps, (mode, at, rank))
            steps, h = summary(lines)
            restarts = sum("zero-run: restarting" in l for _, l in lines)
            resumed = [int(m.group(1)) for _, l in lines if (m := re.search(r"resumed from .*step-0*(\d+)", l))]
            # A fault before the first checkpoint (step 5) restarts from step 0: "resumed from" step 0.
            start = resumed[0] if resumed else 0
            after = [(t, s) for t, s, _ in steps if fired is not None and t > fired]
            # The first step printed after a restart is the first step past the checkpoint resumed from.
            again = next((t for t, s in after if s == start + 1), None)
            last_before = max((s for t, s, _ in steps if fired is not None and t <= fired), default=0)
            lost = last_before - start if fired is not None else None
            losses_equal = all(ref_loss.get(s) == loss for _, s, loss in steps)
            final = dict((s, loss) for _, s, loss in steps).get(args.steps)
            ok = rc == 0 and h == ref_hash and final == ref_loss[args.steps]
            results[mode].append((ok, lost, (again - fired) if again and fired else None))
            say(f"| {trial} | SIG{mode.upper()} | {rank} | {at} | {('step ' + str(start)) if resumed else 'step 0 (none saved yet)'} | "
                f"{lost if lost is not None else '-'} | {f'{again - fired:.2f}' if again and fired else '-'} | "
                f"{restarts} | {rc} | {'yes' if losses_equal and final is not None else 'NO'} | "
                f"{'yes' if h == ref_hash else 'NO'} |")
            shutil.rmtree(ckpt, ignore_errors=True)
        say()
        for mode, rs in results.items():
            times = [t for _, _, t in rs if t is not None]
            lost = [l for _, l, _ in rs if l is not None]
            say(f"SIG{mode.upper()}: {sum(ok for ok, _, _ in rs)}/{len(rs)} finished with parameters bitwise equal to "
                f"the uninterrupted run; fault to training again: median {statistics.median(times):.2f} s, "
                f"max {max(times):.2f} s; steps lost: median {statistics.median(lost)}, max {max(lost)}"
                if times and lost else f"SIG{mode.upper()}: no timing (see the table)")
        failed = sum(not ok for rs in results.values() for ok, _, _ in rs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
