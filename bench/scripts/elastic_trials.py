#!/usr/bin/env python3
"""Fault trials for restart from the last checkpoint (issue 35): a 4-rank zero-gpt run under
`zero-run --max-restarts 3`, one rank SIGKILLed or SIGSTOPped at a random step; the job must finish its steps,
and its final parameters (a hash of every fp32 bit) and last losses must equal an uninterrupted run's.

    bench/scripts/elastic_trials.py [--build build] [--trials 10] [--steps 40] [--seed 1] [--shrink [--keep-micro]]
                                    [--out FILE]

Per trial it records the step the fault hit, the checkpoint the restart resumed from, the steps lost (the last
step trained before the fault minus that checkpoint's step), and the time from the fault to the first step
trained after the restart. The world size does not change (zero-run restarts every rank), so equality is bitwise.

--shrink: zero-run --min-nproc 3, so the restart runs 3 ranks; the config keeps the global batch (train_batch_size
12, micro-batch 1: accumulation 3 at 4 ranks, 4 at 3 ranks, as DeepSpeed derives it). The reference is then the
run that changed world size at the same checkpoint: 4 ranks up to the checkpoint the trial resumed from, 3 ranks
from it to the end; equality with it is bitwise too.

--keep-micro (with --shrink): the config keeps the micro-batch instead (elastic_batch keep_micro, reference world 4,
lr_scaling sqrt): micro-batch 2 and no accumulation at every world, so the global batch is 8 at 4 ranks and 6 at 3,
and the learning rate is multiplied by sqrt(3/4) from the restart on. The reference is built the same way.
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


SHRINK_BATCH = {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 1}
KEEP_MICRO_BATCH = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                    "elastic_batch": {"policy": "keep_micro", "reference_world_size": 4, "lr_scaling": "sqrt"}}


def command(build, cfg, ckpt, steps, nproc=4, min_nproc=None):
    launch = [f"{build}/bin/zero-run", "-n", str(nproc), "--max-restarts", "3", "--grace", "5"]
    if min_nproc:
        launch += ["--min-nproc", str(min_nproc)]
    return launch + ["--", f"{build}/bin/zero-gpt", "--model", "tiny", "--steps", str(steps), "--config", cfg,
                     "--json", "--params-hash", "--save", ckpt, "--save-every", "5", "--resume", ckpt]


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


def run_job(build, cfg, ckpt, steps, fault=None, nproc=4, min_nproc=None):
    """Runs one job; with fault=(mode, step, rank), signals that rank once rank 0 has printed that step.
    Returns (rc, lines with their arrival times, fault time)."""
    proc = subprocess.Popen(command(build, cfg, ckpt, steps, nproc, min_nproc), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
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


def finish(out, path, failed):
    """Writes the report's lines to `path` (when given) and exits 1 when any trial failed."""
    if path:
        with open(path, "w") as f:
            f.write("\n".join(out) + "\n")
    sys.exit(1 if failed else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shrink", action="store_true")
    ap.add_argument("--keep-micro", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="zero-elastic-")
    cfg = os.path.join(tmp, "config.json")
    config = dict(CONFIG)
    if args.keep_micro and not args.shrink:
        sys.exit("elastic_trials: --keep-micro changes what a restart at fewer ranks does: give --shrink too")
    if args.shrink:
        del config["gradient_accumulation_steps"]
        config.update(KEEP_MICRO_BATCH if args.keep_micro else SHRINK_BATCH)
    with open(cfg, "w") as f:
        json.dump(config, f)
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
        shrunk = {}  # checkpoint step -> (hash, losses) of the run that went from 4 to 3 ranks there

        def shrunk_reference(c):
            if c not in shrunk:
                d = os.path.join(tmp, f"shrunk{c}")
                lines = []
                if c > 0:
                    rc1, lines, _ = run_job(args.build, cfg, d, c)
                    if rc1 != 0:
                        sys.exit(f"elastic_trials: the 4-rank run to step {c} failed")
                rc2, more, _ = run_job(args.build, cfg, d, args.steps, nproc=3)
                if rc2 != 0:
                    sys.exit(f"elastic_trials: the 3-rank run from step {c} failed")
                st, h = summary(lines + more)
                shrunk[c] = (h, {s: loss for _, s, loss in st})
                shutil.rmtree(d, ignore_errors=True)
            return shrunk[c]
        say()
        say("| trial | fault | rank | at step | resumed from | steps lost | fault to training again (s) | restarts | ranks after | rc | "
            "losses equal | params bitwise equal |")
        say("|---|---|---|---|---|---|---|---|---|---|---|---|")
        results = {"kill": [], "stop": []}
        for trial in range(1, 2 * args.trials + 1):
            mode = "kill" if trial <= args.trials else "stop"
            at, rank = rng.randint(3, args.steps - 3), rng.randint(0, 3)
            ckpt = os.path.join(tmp, f"t{trial}")
            rc, lines, fired = run_job(args.build, cfg, ckpt, args.steps, (mode, at, rank),
                                       min_nproc=3 if args.shrink else None)
            steps, h = summary(lines)
            restarts = sum("zero-run: restarting" in l for _, l in lines)
            ranks_after = [m.group(1) for _, l in lines if (m := re.search(r"zero-run: restarting all (\d+) rank", l))]
            resumed = [int(m.group(1)) for _, l in lines if (m := re.search(r"resumed from .*step-0*(\d+)", l))]
            # A fault before the first checkpoint (step 5) restarts from step 0: "resumed from" step 0.
            start = resumed[0] if resumed else 0
            after = [(t, s) for t, s, _ in steps if fired is not None and t > fired]
            # The first step printed after a restart is the first step past the checkpoint resumed from.
            again = next((t for t, s in after if s == start + 1), None)
            last_before = max((s for t, s, _ in steps if fired is not None and t <= fired), default=0)
            lost = last_before - start if fired is not None else None
            want_hash, want_loss = (ref_hash, ref_loss) if not args.shrink else shrunk_reference(start)
            # Each step's last printing: a step trained again after the restart replaces the one before the fault.
            trial_loss = {s: loss for _, s, loss in steps}
            losses_equal = all(want_loss.get(s) == loss for s, loss in trial_loss.items())
            final = trial_loss.get(args.steps)
            ok = rc == 0 and h == want_hash and final == want_loss[args.steps]
            results[mode].append((ok, lost, (again - fired) if again and fired else None))
            say(f"| {trial} | SIG{mode.upper()} | {rank} | {at} | {('step ' + str(start)) if resumed else 'step 0 (none saved yet)'} | "
                f"{lost if lost is not None else '-'} | {f'{again - fired:.2f}' if again and fired else '-'} | "
                f"{restarts} | {ranks_after[-1] if ranks_after else '-'} | {rc} | {'yes' if losses_equal and final is not None else 'NO'} | "
                f"{'yes' if h == want_hash else 'NO'} |")
            shutil.rmtree(ckpt, ignore_errors=True)
        say()
        for mode, rs in results.items():
            times = [t for _, _, t in rs if t is not None]
            lost = [l for _, l, _ in rs if l is not None]
            against = "the run that went from 4 to 3 ranks at the same checkpoint" if args.shrink else \
                "the uninterrupted run"
            say(f"SIG{mode.upper()}: {sum(ok for ok, _, _ in rs)}/{len(rs)} finished with parameters bitwise equal to "
                f"{against}; fault to training again: median {statistics.median(times):.2f} s, "
                f"max {max(times):.2f} s; steps lost: median {statistics.median(lost)}, max {max(lost)}"
                if times and lost else f"SIG{mode.upper()}: no timing (see the table)")
        failed = sum(not ok for rs in results.values() for ok, _, _ in rs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish(out, args.out, failed)


if __name__ == "__main__":
    main()
