#!/usr/bin/python3
"""torch.optim.AdamW on one flat tensor, timed the way zero-bench-optim times its own kernels.

Kernels (the same work as zero-bench-optim's):
  fp32  p, grad, exp_avg, exp_avg_sq all f32: opt.step()
  bf16  f32 master/state, bf16 gradient in, bf16 parameter copy out -- what a torch user writes for that:
        p.grad.copy_(g16); opt.step(); p16.copy_(p)
Each kernel exists in two modes, foreach=False ("single") and foreach=True ("foreach").

Two ways to run it:
  torch_adamw.py --params N --threads T [--reps R]
      one-shot: best (minimum) time of R steps per kernel and mode after a warm-up step; one JSON line.
  torch_adamw.py --serve --params N --threads T
      what zero-bench-optim uses, so torch steps interleave with its own and see the same machine state.
      Prints "ready <torch version> <threads>", then answers one line per command read from stdin:
        setup fp32|bf16  -> "ok" (builds both modes and runs one warm-up step of each; drops the previous kernel)
        step single|foreach -> the step's wall time in seconds
        quit
Exits 3 (printing an error line) if torch cannot be imported.
"""
import argparse
import json
import sys
import time

try:
    import torch
except ImportError:
    print("error torch not importable", flush=True)
    sys.exit(3)


class Kernel:
    """One AdamW kernel in one mode, warmed up (optimizer state allocated)."""

    def __init__(self, kernel, n, foreach):
        torch.manual_seed(0)
        self.p = torch.nn.Parameter(torch.empty(n).uniform_(-0.1, 0.1))
        self.opt = torch.optim.AdamW([self.p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                     foreach=foreach)
        self.bf16 = kernel == "bf16"
        if self.bf16:
            self.g16 = torch.empty(n).uniform_(-1e-3, 1e-3).to(torch.bfloat16)
            self.p16 = torch.empty(n, dtype=torch.bfloat16)
            self.p.grad = torch.empty(n)
        else:
            self.p.grad = torch.empty(n).uniform_(-1e-3, 1e-3)
        self.step()  # warm-up: allocates exp_avg / exp_avg_sq

    def step(self):
        if self.bf16:
            self.p.grad.copy_(self.g16)
            self.opt.step()
            with torch.no_grad():
                self.p16.copy_(self.p)
        else:
            self.opt.step()

    def timed_step(self):
        t0 = time.perf_counter()
        self.step()
        return time.perf_counter() - t0


def serve(n):
    print(f"ready {torch.__version__} {torch.get_num_threads()}", flush=True)
    kernels = {}
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "setup":
            kernels = {}  # free the previous kernel's tensors first
            kernels = {"single": Kernel(cmd[1], n, False), "foreach": Kernel(cmd[1], n, True)}
            print("ok", flush=True)
        elif cmd[0] == "step":
            print(f"{kernels[cmd[1]].timed_step():.9f}", flush=True)
        else:
            print(f"error unknown command {cmd[0]}", flush=True)


def one_shot(n, reps, kernel_names):
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "params": n, "kernels": {}}
    for name in kernel_names:
        times = {}
        for mode, foreach in (("single", False), ("foreach", True)):
            k = Kernel(name, n, foreach)
            times[mode] = min(k.timed_step() for _ in range(reps))
            del k
        out["kernels"][name] = {"single_tensor_s": times["single"], "foreach_s": times["foreach"],
                                "params_per_s": n / min(times.values())}
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kernels", default="fp32,bf16")
    ap.add_argument("--serve", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.serve:
        serve(args.params)
    else:
        one_shot(args.params, args.reps, args.kernels.split(","))


if __name__ == "__main__":
    main()
