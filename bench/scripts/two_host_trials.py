#!/usr/bin/env python3
"""Restart trials across two hosts (issue 35): a 2 x 2 zero-gpt job, one `zero-run --nnodes 2` agent per host (two
network namespaces joined by a veth pair, made by scripts/two-hosts.sh), with `--max-restarts 3`. One rank is
SIGKILLed or SIGSTOPped at a random step, or the link between the hosts is cut (the veth taken down) and restored
once the agents have stopped their ranks; the job must finish its steps with final parameters (a hash of every fp32
bit) and last loss equal to the uninterrupted 2 x 2 run's (the world size does not change, so bitwise).

    scripts/two-hosts.sh --exec "python3 bench/scripts/two_host_trials.py [--trials 10] [--cuts 5] [--steps 40]
                                 [--seed 1] [--out FILE]" [BUILD_DIR]

The agents agree through a folder both hosts see (as a shared file system would be); the ranks rendezvous in it
too (ZERO_STORE_DIR) and talk Gloo over the link (GLOO_SOCKET_IFNAME, MASTER_ADDR the address of host 0). The
checkpoints go to one folder both hosts see. Per trial: the step the fault hit, the checkpoint resumed from, the
steps lost, the time from the fault until every rank of the failed attempt had exited on both hosts (what the
issue bounds by max(2 s, 2 x comm_timeout_s) for a hang), and the time to the first step trained after the restart.
"""
import argparse
import os
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_trials import CONFIG, finish, rank_pids, summary  # noqa: E402  (the single-host trials' parts)

import json  # noqa: E402

ENDED_RE = re.compile(r"zero-run: attempt (\d+) ended:")


def env(name):
    v = os.environ.get(name)
    if not v:
        sys.exit(f"two_host_trials: {name} is not set: run me through scripts/two-hosts.sh --exec")
    return v


class Job:
    """Both agents of one job, their merged output with arrival times."""

    def __init__(self, build, tmp, tag, cfg, ckpt, steps):
        self.lines, self.lock = [], threading.Lock()
        rdzv = os.path.join(tmp, f"rdzv-{tag}")
        self.procs, self.readers = [], []
        for node, (ns, ifname) in enumerate([(env("NS0"), env("IF0")), (env("NS1"), env("IF1"))]):
            cmd = ["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={ifname}", f"{build}/bin/zero-run", "-n", "2",
                   "--nnodes", "2", "--node-rank", str(node), "--rdzv-dir", rdzv, "--master-addr", env("A0"),
                   "--max-restarts", "3", "--grace", "5", "--", f"{build}/bin/zero-gpt", "--model", "tiny", "--steps",
                   str(steps), "--config", cfg, "--json", "--params-hash", "--save", ckpt, "--save-every", "5",
                   "--resume", ckpt]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
            t = threading.Thread(target=self._read, args=(node, p), daemon=True)
            t.start()
            self.procs.append(p)
            self.readers.append(t)

    def _read(self, node, p):
        for line in p.stdout:
            with self.lock:
                self.lines.append((time.monotonic(), line.rstrip("\n"), node))

    def snapshot(self):
        with self.lock:
            return list(self.lines)

    def wait(self, limit=600):
        deadline = time.monotonic() + limit
        rcs = []
        for p in self.procs:
            try:
                rcs.append(p.wait(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                rcs.append(p.wait())
        for t in self.readers:
            t.join(timeout=5)
        return rcs


def link(up):
    subprocess.run(["ip", "-n", env("NS0"), "link", "set", env("IF0"), "up" if up else "down"], check=True)


def run_job(build, tmp, tag, cfg, ckpt, steps, fault=None):
    """fault = (mode, step, rank): once rank 0 printed `step`, SIGKILL/SIGSTOP that rank, or ("cut", step, None):
    take the link down, and up again once an agent says the attempt ended. Returns (rcs, lines, fired, ended)."""
    job = Job(build, tmp, tag, cfg, ckpt, steps)
    fired = ended = None
    restored = False
    seen = 0
    while any(p.poll() is None for p in job.procs):
        lines = job.snapshot()
        for t, line, _ in lines[seen:]:
            m = re.match(r'^\[r0\] \{"step": (\d+),', line)
            if fault and fired is None and m and int(m.group(1)) == fault[1]:
                if fault[0] == "cut":
                    link(False)
                    fired = time.monotonic()
                else:
                    pid = rank_pids(ckpt).get(fault[2])
                    if pid is not None:
                        os.kill(pid, signal.SIGKILL if fault[0] == "kill" else signal.SIGSTOP)
                        fired = time.monotonic()
            if fired is not None and ended is None and ENDED_RE.search(line) and t >= fired:
                ended = t
        seen = len(lines)
        # The cut lasts until the agents have stopped every rank: the restart needs the link again.
        if fault and fault[0] == "cut" and fired is not None and not restored and \
                (ended is not None or time.monotonic() - fired > 30):
            link(True)
            restored = True
        time.sleep(0.02)
    rcs = job.wait()
    if fault and fault[0] == "cut" and not restored:
        link(True)
    lines = job.snapshot()
    if ended is None and fired is not None:
        ended = next((t for t, l, _ in lines if t >= fired and ENDED_RE.search(l)), None)
    return rcs, [(t, l) for t, l, _ in lines], fired, ended


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--cuts", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    build = env("BUILD")
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="zero-two-host-")
    cfg = os.path.join(tmp, "config.json")
    with open(cfg, "w") as f:
        json.dump(CONFIG, f)
    timeout = CONFIG["comm_timeout_s"]
    out = []

    def say(s=""):
        print(s, flush=True)
        out.append(s)

    failed = 0
    try:
        rcs, lines, _, _ = run_job(build, tmp, "ref", cfg, os.path.join(tmp, "ref"), args.steps)
        ref_steps, ref_hash = summary(lines)
        if any(rcs) or ref_hash is None:
            sys.exit(f"two_host_trials: the uninterrupted run failed ({rcs}):\n" + "\n".join(l for _, l in lines[-15:]))
        ref_loss = {s: loss for _, s, loss in ref_steps}
        say(f"uninterrupted 2 x 2 run: {args.steps} steps, params_hash {ref_hash}, last loss {ref_loss[args.steps]}")
        say()
        say("| trial | fault | rank | at step | resumed from | steps lost | fault to every rank stopped (s) | "
            "fault to training again (s) | restarts | agents' rc | params bitwise equal |")
        say("|---|---|---|---|---|---|---|---|---|---|---|")
        results = {"kill": [], "stop": [], "cut": []}
        modes = ["kill"] * args.trials + ["stop"] * args.trials + ["cut"] * args.cuts
        for trial, mode in enumerate(modes, 1):
            at = rng.randint(3, args.steps - 3)
            rank = rng.randint(0, 3) if mode != "cut" else None
            ckpt = os.path.join(tmp, f"t{trial}")
            rcs, lines, fired, ended = run_job(build, tmp, f"t{trial}", cfg, ckpt, args.steps, (mode, at, rank))
            steps, h = summary(lines)
            restarts = sum(bool(re.search(r"zero-run: node 0: restarting all", l)) for _, l in lines)
            resumed = [int(m.group(1)) for _, l in lines if (m := re.search(r"resumed from .*step-0*(\d+)", l))]
            start = resumed[0] if resumed else 0
            after = [(t, s) for t, s, _ in steps if fired is not None and t > fired]
            again = next((t for t, s in after if s == start + 1), None)
            last_before = max((s for t, s, _ in steps if fired is not None and t <= fired), default=0)
            lost = last_before - start if fired is not None else None
            final = {s: loss for _, s, loss in steps}.get(args.steps)
            ok = not any(rcs) and h == ref_hash and final == ref_loss[args.steps]
            failed += not ok
            stopped_s = (ended - fired) if ended and fired else None
            again_s = (again - fired) if again and fired else None
            results[mode].append((ok, lost, stopped_s, again_s))
            name = {"kill": "SIGKILL", "stop": "SIGSTOP", "cut": "link cut"}[mode]
            say(f"| {trial} | {name} | {rank if rank is not None else '-'} | {at} | "
                f"{('step ' + str(start)) if resumed else 'step 0 (none saved yet)'} | "
                f"{lost if lost is not None else '-'} | {f'{stopped_s:.2f}' if stopped_s else '-'} | "
                f"{f'{again_s:.2f}' if again_s else '-'} | {restarts} | {rcs} | {'yes' if h == ref_hash else 'NO'} |")
            shutil.rmtree(ckpt, ignore_errors=True)
        say()
        bound = max(2, 2 * timeout)
        for mode, rs in results.items():
            if not rs:
                continue
            name = {"kill": "SIGKILL", "stop": "SIGSTOP", "cut": "link cut"}[mode]
            stop = [s for _, _, s, _ in rs if s is not None]
            again = [a for _, _, _, a in rs if a is not None]
            lost = [l for _, l, _, _ in rs if l is not None]
            say(f"{name}: {sum(ok for ok, _, _, _ in rs)}/{len(rs)} finished with parameters bitwise equal to the "
                f"uninterrupted run; fault to every rank stopped: median {statistics.median(stop):.2f} s, max "
                f"{max(stop):.2f} s (bound max(2 s, 2 x comm_timeout_s) = {bound} s, plus the grace where a rank could "
                f"still run); fault to training again: median {statistics.median(again):.2f} s, max {max(again):.2f} s; "
                f"steps lost: median {statistics.median(lost)}, max {max(lost)}"
                if stop and again and lost else f"{name}: no timing (see the table)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish(out, args.out, failed)


if __name__ == "__main__":
    main()
