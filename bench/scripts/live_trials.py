#!/usr/bin/env python3
"""Fault trials for live recovery across replica groups (zero/elastic.h): a 4-rank zero-gpt run under
`zero-run --live-groups 2 --max-restarts 3`, two replica groups of two ranks (hybrid sharding, mics_shard_size 2),
no checkpoint. One rank gets SIGKILL or SIGSTOP at a random step; only its group may be restarted, the other group
must train on without a restart, the restarted group must rejoin, and the job must finish its steps with every
rank's final parameters bitwise equal (the params_hash each rank prints in its final "live" line).

    bench/scripts/live_trials.py [--build build] [--trials 10] [--steps 40] [--seed 1] [--timeout 120] [--out FILE]
                                 [--logs DIR] [--model tiny|small]
                                 [--comm-timeout S]

--trials N runs N trials with SIGKILL, then N with SIGSTOP. Per trial it records the step the fault hit, the fault
rank and its group, the step the survivors went on from (their "lost; groups {..} go on at step S" decision), the
time from the signal to that decision, the time from the signal to the surviving group's first step printed past
both the last step printed before the signal and S ("training again"), the time from the signal to the rejoin
decision, the steps lost (the most `redone_steps` of any rank: the steps applied before the fault that the
survivors dropped and ran again), the restarts zero-run made and of which groups, the return code, whether all four
params_hash are equal, and the last step reached. Each trial runs in a temp dir of its own, under a per-trial
timeout; every process it started (found by an environment tag the ranks inherit) is killed after it. --logs DIR
keeps every trial's output there (by default only the failed trials' output is kept, in a folder the summary
names).

There is no uninterrupted reference here: after the fault the surviving group trains alone (a global batch half
the size) until the other rejoins, so the run's parameters differ from an uninterrupted run's by design; the check
is that the groups agree with each other, bit for bit, at the end.
"""
import argparse
import json
import os
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2, "mics_shard_size": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "comm_timeout_s": 3,
}
NPROC, GROUP = 4, 2
STEP_RE = re.compile(r'^\[r(\d+)\] \{"step": (\d+), "loss"')
LIVE_RE = re.compile(r'^\[r(\d+)\] (\{"live": .*\})\s*$')
LOST_RE = re.compile(r"live recovery: epoch (\d+): .*lost; groups \{[^}]*\} go on at step (\d+)")
REJOIN_RE = re.compile(r"live recovery: epoch (\d+): group\(s\) \{([^}]*)\} rejoin")
RESTART_RE = re.compile(r"^zero-run: restarting group (\d+) ")
FINISHED_FIRST_RE = re.compile(r"ReplicaGroups::Join: the job finished before group (\d+)")
TAG = "ZERO_LIVE_TRIAL_TAG"


MODEL = "tiny"  # --model


def command(build, cfg, steps):
    return [f"{build}/bin/zero-run", "-n", str(NPROC), "--live-groups", str(GROUP), "--max-restarts", "3",
            "--grace", "5", "--", f"{build}/bin/zero-gpt", "--model", MODEL, "--steps", str(steps),
            "--config", cfg, "--json", "--live"]


def environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)


def rank_pids(launcher):
    """zero-run's children that are ranks (the watchdog is a child too, without RANK), by RANK."""
    out = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split()
    pids = {}
    for pid in out:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
            env = environ(pid)
            if argv0.endswith(b"zero-gpt") and b"RANK" in env:
                pids[int(env[b"RANK"])] = int(pid)
        except (OSError, KeyError, ValueError):
            continue
    return pids


def tagged(tag):
    """Every live process whose environment carries this trial's tag (zero-run, its watchdog, the ranks)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if environ(pid).get(TAG.encode()) == tag.encode():
                found.append(int(pid))
        except OSError:
            continue
    return found


def run_trial(build, cfg, workdir, steps, mode, at, rank, timeout):
    """Runs one job; signals `rank` once a step >= `at` is printed. Returns (rc, [(t, line)], fired, timed_out,
    leftovers)."""
    tag = workdir
    env = dict(os.environ, **{TAG: tag})
    proc = subprocess.Popen(command(build, cfg, steps), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, cwd=workdir, env=env)
    q = queue.Queue()

    def reader():
        for line in proc.stdout:
            q.put((time.monotonic(), line.rstrip("\n")))
        q.put(None)

    threading.Thread(target=reader, daemon=True).start()
    deadline = time.monotonic() + timeout
    lines, fired, timed_out = [], None, False
    while True:
        try:
            item = q.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            timed_out = True
            break
        if item is None:
            break
        lines.append(item)
        m = STEP_RE.match(item[1])
        if fired is None and m and int(m.group(2)) >= at:
            pid = rank_pids(proc.pid).get(rank)
            if pid is not None:
                os.kill(pid, signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
                fired = (time.monotonic(), int(m.group(2)), pid)
                lines.append((fired[0], f"live_trials: sent SIG{mode.upper()} to rank {rank} (pid {pid}) after "
                                        f"step {m.group(2)} was printed"))
            else:
                lines.append((time.monotonic(), f"live_trials: rank {rank} not found among zero-run's children"))
    if timed_out:
        subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)])
        proc.kill()
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    leftovers = tagged(tag)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return rc, lines, fired, timed_out, leftovers


def analyse(lines, fired, fault_group):
    t0 = fired[0] if fired else None
    steps = [(t, int(m.group(2))) for t, l in lines if (m := STEP_RE.match(l))]
    last_before = max((s for t, s in steps if t0 is not None and t <= t0), default=0)
    lost = [(t, int(m.group(2))) for t, l in lines if t0 is not None and t > t0 and (m := LOST_RE.search(l))]
    # Training again: the first step printed after the signal past the last one printed before it and past the
    # step the survivors went on from ("go on at step S": S steps applied, step S+1 is run again). The second bound
    # matters when a step in flight at the signal still completes and is printed before the failure is seen.
    past = max(last_before, lost[0][1] if lost else 0)
    again = next((t for t, s in steps if t0 is not None and t > t0 and s > past), None)
    rejoin = next((t for t, l in lines if t0 is not None and t > t0 and REJOIN_RE.search(l)), None)
    restarted = [int(m.group(1)) for _, l in lines if (m := RESTART_RE.match(l))]
    live = {}
    for _, l in lines:
        if m := LIVE_RE.match(l):
            try:
                live[int(m.group(1))] = json.loads(m.group(2))["live"]
            except (ValueError, KeyError):
                pass
    hashes = {r: v.get("params_hash") for r, v in live.items()}
    redone = max((v.get("redone_steps", 0) for v in live.values()), default=None)
    survivors = [r for r in range(NPROC) if r // GROUP != fault_group]
    return {
        "last_before": last_before,
        "again": (again - t0) if again is not None else None,
        "decided": (lost[0][0] - t0) if lost else None,
        "go_on_at": lost[0][1] if lost else None,
        "rejoin": (rejoin - t0) if rejoin is not None else None,
        "restarted": restarted,
        "hashes_equal": len(hashes) == NPROC and len(set(hashes.values())) == 1 and None not in hashes.values(),
        "hash": next(iter(hashes.values())) if hashes else None,
        "ranks_reported": len(live),
        "redone": redone,
        # The survivors were never restarted: zero-run restarted only the faulty group, and the survivors trained
        # from step 0 (first_step 0: never (re)joined after the start).
        "only_faulty_restarted": bool(restarted) and set(restarted) == {fault_group}
        and all(live.get(r, {}).get("first_step") == 0 for r in survivors),
        "final_step": max((s for _, s in steps), default=0),
        "live_steps": {v.get("steps") for v in live.values()},
        "first_step": {r: v.get("first_step") for r, v in live.items()},
    }


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120, help="per trial, seconds")
    ap.add_argument("--out")
    ap.add_argument("--logs", help="keep every trial's output in this folder")
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"], help="zero-gpt's model")
    ap.add_argument("--comm-timeout", type=float, default=3,
                    help="comm_timeout_s (the all-reduce across groups times out in a third of it, so a model whose "
                         "steps take seconds needs more than the tiny model's 3)")
    args = ap.parse_args()
    global MODEL
    MODEL = args.model
    build = os.path.abspath(args.build)
    rng = random.Random(args.seed)
    logs = args.logs or tempfile.mkdtemp(prefix="zero-live-logs-")
    os.makedirs(logs, exist_ok=True)
    out = []

    def say(s=""):
        print(s, flush=True)
        out.append(s)

    say("| trial | fault | rank | group | at step | survivors went on after step | fault to decision (s) | "
        "fault to training again (s) | "
        "fault to rejoin (s) | steps lost | restarts (groups) | only faulty group restarted | rc | final step | "
        "4 hashes equal | pass |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    results = {"kill": [], "stop": []}
    failures = []
    kept = []
    for trial in range(1, 2 * args.trials + 1):
        mode = "kill" if trial <= args.trials else "stop"
        at, rank = rng.randint(4, 30), rng.randint(0, NPROC - 1)
        group = rank // GROUP
        workdir = tempfile.mkdtemp(prefix=f"zero-live-t{trial}-")
        cfg = os.path.join(workdir, "config.json")
        with open(cfg, "w") as f:
            json.dump(dict(CONFIG, comm_timeout_s=args.comm_timeout), f)
        rc, lines, fired, timed_out, leftovers = run_trial(build, cfg, workdir, args.steps, mode, at, rank,
                                                           args.timeout)
        a = analyse(lines, fired, group)
        why = []
        if fired is None:
            why.append("the signal was never sent")
        if timed_out:
            why.append(f"timed out after {args.timeout:.0f} s")
        if rc != 0:
            why.append(f"rc {rc}")
        if a["final_step"] != args.steps or a["live_steps"] != {args.steps}:
            why.append(f"final step {a['final_step']}, live steps {sorted(x for x in a['live_steps'] if x is not None)}")
        if not a["hashes_equal"]:
            why.append(f"params_hash not all equal ({a['ranks_reported']} ranks reported)")
        if not a["only_faulty_restarted"]:
            why.append(f"restarted groups {a['restarted']}, first_step {a['first_step']}")
        if a["go_on_at"] is None:
            why.append("no 'lost; groups ... go on' decision after the fault")
        if a["again"] is None:
            why.append("the surviving group never printed a step after the fault")
        if a["rejoin"] is None:
            if any(FINISHED_FIRST_RE.search(l) for _, l in lines):
                # Join returns kCancelled (zero/elastic.h): the survivors reached the last step before the restarted
                # group was admitted, so its ranks exit 0 without a final "live" line.
                why.append(f"no rejoin: the survivors finished step {a['final_step']} before the restarted group "
                           "was admitted (its ranks: 'the job finished before group ... was admitted')")
            else:
                why.append("no rejoin line after the fault")
        if leftovers:
            why.append(f"{len(leftovers)} process(es) outlived the trial (killed)")
        ok = not why
        # The fault step: the last step printed before the signal (the step the signal was triggered by).
        fault_step = fired[1] if fired else None
        results[mode].append({"ok": ok, "again": a["again"], "rejoin": a["rejoin"], "lost": a["redone"],
                              "decided": a["decided"]})
        say(f"| {trial} | SIG{mode.upper()} | {rank} | {group} | {fmt(fault_step, 'd')} | {fmt(a['go_on_at'], 'd')} | "
            f"{fmt(a['decided'])} | {fmt(a['again'])} | {fmt(a['rejoin'])} | {fmt(a['redone'], 'd')} | "
            f"{len(a['restarted'])} ({', '.join(map(str, a['restarted'])) or '-'}) | "
            f"{'yes' if a['only_faulty_restarted'] else 'NO'} | {rc} | {a['final_step']} | "
            f"{'yes' if a['hashes_equal'] else 'NO'} | {'yes' if ok else 'NO: ' + '; '.join(why)} |")
        log = os.path.join(logs, f"trial{trial:02d}-{mode}.txt")
        if args.logs or not ok:
            with open(log, "w") as f:
                f.write("".join(f"{t:.3f} {l}\n" for t, l in lines))
            kept.append(log)
        if not ok:
            failures.append((trial, why, log))
        shutil.rmtree(workdir, ignore_errors=True)

    say()
    for mode, rs in results.items():
        def mmm(key):
            v = [r[key] for r in rs if r[key] is not None]
            return (f"min {min(v):.2f}, median {statistics.median(v):.2f}, max {max(v):.2f}" if v else "-")

        lost = [r["lost"] for r in rs if r["lost"] is not None]
        say(f"SIG{mode.upper()}: {sum(r['ok'] for r in rs)}/{len(rs)} passed; fault to training again (s): "
            f"{mmm('again')}; fault to rejoin (s): {mmm('rejoin')}; steps lost: "
            + (f"min {min(lost)}, median {statistics.median(lost)}, max {max(lost)}" if lost else "-"))
    for trial, why, log in failures:
        say(f"trial {trial} failed: {'; '.join(why)} (log: {log})")
    if not kept:
        shutil.rmtree(logs, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
