#!/usr/bin/python3
"""Runs torch.optim on the inputs optimizer_test.cc wrote, for its TorchCrossCheck test.

usage: torch_crosscheck.py DIR N STEPS
Reads DIR/p0.bin (N f32) and DIR/grads.bin (STEPS x N f32); writes DIR/<variant>.bin, the parameters after
STEPS steps of each variant (same hyperparameters as the C++ test).
"""
import array
import sys

import torch


def read_f32(path, count):
    a = array.array("f")
    with open(path, "rb") as f:
        a.fromfile(f, count)
    return torch.tensor(a, dtype=torch.float32)


def main():
    d, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    p0 = read_f32(f"{d}/p0.bin", n)
    grads = read_f32(f"{d}/grads.bin", n * steps).view(steps, n)
    variants = {
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                              foreach=False),
        "adam_l2": lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.01, foreach=False),
        "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4, nesterov=True,
                                                   foreach=False),
        "sgd_dampening": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, foreach=False),
    }
    for name, make in variants.items():
        p = torch.nn.Parameter(p0.clone())
        opt = make([p])
        for s in range(steps):
            p.grad = grads[s].clone()
            opt.step()
        with open(f"{d}/{name}.bin", "wb") as f:
            array.array("f", p.detach().tolist()).tofile(f)


if __name__ == "__main__":
    main()
