#!/usr/bin/python3
"""torch.optim.AdamW on one flat tensor, timed the way zero-bench-optim times its own kernels.

usage: torch_adamw.py --params N --threads T [--reps R]

Kernels (the same work as zero-bench-optim's):
  fp32  p, grad, exp_avg, exp_avg_sq all f32: opt.step()
  bf16  f32 master/state, bf16 gradient in, bf16 parameter copy out -- what a torch user writes for that:
        p.grad.copy_(g16); opt.step(); p16.copy_(p)
Each runs with foreach=False and foreach=True after one warm-up step (which allocates the state); the best
(minimum) time of R steps is reported per mode. Prints one JSON object on stdout; exits 3 if torch is missing.
"""
import argparse
import json
import sys
import time

try:
    import torch
except ImportError:
    print(json.dumps({"error": "torch not importable"}))
    sys.exit(3)


def time_steps(step, reps):
    step()  # warm-up: allocates exp_avg / exp_avg_sq
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return best


def run(kernel, n, foreach, reps):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.empty(n).uniform_(-0.1, 0.1))
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=foreach)
    if kernel == "fp32":
        p.grad = torch.empty(n).uniform_(-1e-3, 1e-3)
        step = opt.step
    else:
        g16 = torch.empty(n).uniform_(-1e-3, 1e-3).to(torch.bfloat16)
        p16 = torch.empty(n, dtype=torch.bfloat16)
        p.grad = torch.empty(n)

        def step():
            p.grad.copy_(g16)
            opt.step()
            with torch.no_grad():
                p16.copy_(p)

    return time_steps(step, reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kernels", default="fp32,bf16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "params": args.params, "kernels": {}}
    for kernel in args.kernels.split(","):
        single = run(kernel, args.params, False, args.reps)
        foreach = run(kernel, args.params, True, args.reps)
        best = min(single, foreach)
        out["kernels"][kernel] = {
            "single_tensor_s": single,
            "foreach_s": foreach,
            "params_per_s": args.params / best,
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
