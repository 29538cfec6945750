#!/usr/bin/env python3
"""bench/gpu/torch_gpt.py — a plain PyTorch GPT of zero-gpt's `small` shape, timed per step on one GPU.

The side-by-side anchor for bench/gpu/check.sh part 5 (zero-gpt --device cuda --model small): the same model
(examples/gpt/model.h: GptConfig::Small — vocab 256, 6 layers, 6 heads, 384 channels, seq 128, GPT-2 blocks with
biases, tanh GELU, pre-LayerNorm, LM head tied to wte; 10.8 M parameters), the same micro-batch (8 x 128 tokens),
torch.optim.AdamW(fused=True) with check.sh's hyperparameters (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay
0.1) and gradient clipping at 1.0. A step is what zero-gpt's step_ms times: a host batch copied to the device,
forward, backward, clip, optimizer step, then a synchronize; median over the steps after the warm-up.

Configurations (--configs, comma-separated; all by default):
  bf16      torch.autocast(bfloat16) over fp32 parameters, scaled_dot_product_attention(is_causal) — the usual
            PyTorch mixed-precision recipe (what the check's table compares zero's stage 0 with);
  fp32      fp32 everywhere with TF32 off, scaled_dot_product_attention: zero-gpt's forward and backward compute
            in fp32 with cuBLAS's default math (no TF32), whatever the engine's storage dtype;
  fp32-naive  as fp32, with the attention written out (the T x T scores materialized, as zero-gpt's kernels do).

Prints one line per configuration:
  TORCH_RESULT config=bf16 ms_per_step=7.123 tokens_per_s=143800 loss_first=5.61 loss_last=5.20 peak_mib=210.3
and exits 0; exit 3 when no CUDA device is there (unless --device cpu, a smoke test of this script's logic).
"""
import argparse
import math
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="bf16,fp32,fp32-naive")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per configuration")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-seconds", type=float, default=30.0, help="no configuration starts after this")
    args = ap.parse_args()
    t_start = time.time()

    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 — any import failure is reported the same way
        print(f"TORCH_UNAVAILABLE {type(e).__name__}: {e}")
        return 4
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"device available: {torch.cuda.is_available()}", flush=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("TORCH_NO_DEVICE torch sees no CUDA device")
        return 3
    dev = torch.device(args.device)
    if dev.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(dev)}", flush=True)
    have_sdpa = hasattr(F, "scaled_dot_product_attention")

    V, L, H, C, TMAX = 256, 6, 6, 384, 128  # GptConfig::Small
    B, T = args.batch, args.seq

    class Block(nn.Module):
        def __init__(self, naive):
            super().__init__()
            self.naive = naive or not have_sdpa
            self.ln1 = nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C)
            self.fc = nn.Linear(C, 4 * C)
            self.fc_proj = nn.Linear(4 * C, C)
            self.register_buffer("mask", torch.tril(torch.ones(TMAX, TMAX, dtype=torch.bool)), persistent=False)

        def attention(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).split(C, dim=2)
            q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
            if self.naive:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
                att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
                y = att @ v
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.attn_proj(y.transpose(1, 2).reshape(b, t, C))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self, naive):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(TMAX, C)
            self.blocks = nn.ModuleList(Block(naive) for _ in range(L))
            self.lnf = nn.LayerNorm(C)
            for name, p in self.named_parameters():  # GPT-2 init, as InitParam
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith(("attn_proj.weight", "fc_proj.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.lnf(x) @ self.wte.weight.t()  # the LM head tied to wte
            return F.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))

    def adamw(params):
        kw = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        if dev.type == "cuda":
            return torch.optim.AdamW(params, fused=True, **kw), "fused"
        return torch.optim.AdamW(params, **kw), "default"

    gen = torch.Generator().manual_seed(1234)
    status = 0
    for config in [c for c in args.configs.split(",") if c]:
        if time.time() - t_start > args.max_seconds:
            print(f"TORCH_SKIPPED config={config} (past --max-seconds {args.max_seconds:g})")
            continue
        if config not in ("bf16", "fp32", "fp32-naive"):
            print(f"TORCH_ERROR config={config}: unknown configuration")
            status = 2
            continue
        try:
            if dev.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
                torch.cuda.reset_peak_memory_stats(dev)
            torch.manual_seed(0)
            model = Gpt(naive=config == "fp32-naive").to(dev)
            nparams = sum(p.numel() for p in model.parameters())
            opt, kind = adamw(model.parameters())
            autocast = (torch.autocast(device_type=dev.type, dtype=torch.bfloat16) if config == "bf16"
                        else torch.autocast(device_type=dev.type, enabled=False))
            pin = dev.type == "cuda"
            times, losses = [], []
            for step in range(args.warmup + args.steps):
                t0 = time.perf_counter()
                # A host batch per step, as zero-gpt copies its tokens and targets (speed does not depend on them).
                tok = torch.randint(0, V, (B, T + 1), generator=gen)
                if pin:
                    tok = tok.pin_memory()
                tok = tok.to(dev, non_blocking=pin)
                x, y = tok[:, :T], tok[:, 1:]
                opt.zero_grad(set_to_none=True)
                with autocast:
                    loss = model(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                dt = time.perf_counter() - t0
                if step >= args.warmup:
                    times.append(dt)
                losses.append(loss.item())
            ms = statistics.median(times) * 1e3
            peak = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else 0.0
            print(f"TORCH_RESULT config={config} ms_per_step={ms:.3f} tokens_per_s={B * T / (ms / 1e3):.0f} "
                  f"loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} peak_mib={peak:.1f} params={nparams} "
                  f"adamw={kind} attention={'naive' if model.blocks[0].naive else 'sdpa'} "
                  f"min_ms={min(times) * 1e3:.3f} steps={len(times)}", flush=True)
            del model, opt
        except Exception as e:  # noqa: BLE001 — one configuration's failure is reported, the next still runs
            print(f"TORCH_ERROR config={config}: {type(e).__name__}: {e}", flush=True)
            status = 1
    print(f"torch_gpt.py: {time.time() - t_start:.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
