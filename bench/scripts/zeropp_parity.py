#!/usr/bin/env python3
"""Loss parity of ZeRO++ on the small GPT (issue 37): the same job with and without ZeRO++'s keys, as thread-ranks
of one zero-gpt and as processes under zero-run, each --steps steps.

    bench/scripts/zeropp_parity.py [--build build] [--steps 300] [--world 4] [--modes threads,processes]
                                   [--bf16] [--ranks-per-host L]
                                   [--zeropp '{"zero_quantized_weights": true}']  (the default)
                                   [--extra-config '{"zero_hpz_partition_size": 2}']
                                   [--recipe '{"gradient_clipping": 1.0, "scheduler": {...}}'] [--seeds 2,3] [--floor] [--no-zeropp]
                                   [--eval K] [--perturb K] [--perturb-scale F] [--cache DIR]

--zeropp may be given more than once: each ZeRO++ config is run and compared with the one exact run of its mode.
--recipe is merged into the top level of every run's config (exact and ZeRO++ alike: a warmup schedule, clipping).
--seed S runs every job with zero-gpt --seed S. --seeds runs the exact job again with each of those zero-gpt --seed
values (other initial weights and batches; threads only) and prints how far their losses lie from the exact run's,
measured the same way: the spread a ZeRO++ gap is to be read against. --floor runs the exact job again at half the
world with gradient_accumulation_steps 2 (threads only): each step trains the same samples from the same weights
(zero-gpt's data order does not depend on the split), only summed in another order, so its gap is what rounding
alone, a perturbation of about 1e-7, grows into over the run: the floor below which no quantization can be judged.

--eval K (threads only) judges the trained fp32 master weights rather than the training loss: every run saves a
checkpoint after its last step, and each is then resumed for K more steps with the learning rate 0 (AdamW with lr 0
moves no weight), so those steps' losses are the saved weights' losses on the next K batches, which no run trained
on. Each trained model is read with the exact forward (ZeRO++ off), and a ZeRO++ run's also with its own ZeRO++
config, whose forward gathers the weights quantized as in training: the first is the model a user keeps, the
difference between the two is what reading the same weights through qwZ's int8 adds to the loss.

--perturb K (threads only) is the control for a single run's gap: the exact job again, K times, each from the
exact run's initial weights with noise of int8's size added once (every tensor of two or more dimensions, in blocks
of 4096 of its elements: uniform in +-half a code step, max|w| / 127 of the block, from Python's random seeded 1..K,
so noise seed k draws the same numbers under every --seed and only the blocks' scales differ; 1-D parameters as they
were; qwZ's blocks run over each rank's flattened shard instead, so the noise is of the same size, not in the same
blocks). Nothing is quantized and every step is exact: each run's gap is what one perturbation
of the size qwZ makes at every forward grows into. The initial weights are the exact job's checkpoint after one step
at lr 0 (AdamW with lr 0 moves no weight), exported with zero-ckpt; every run then starts with zero-gpt --init-from,
after a check that the unperturbed export trains the exact job's weights bit for bit (zero-gpt --params-hash).
--perturb-scale F multiplies that noise by F (default 1): F = -1 adds each seed's noise mirrored (the antithetic run:
if the noise and its mirror both end above the exact run, a perturbation costs loss, not the sign it took), and
smaller |F| (0.0625, 0.00390625, ...) shows at what size a perturbation starts to move the run (the floor, rounding's
1e-7, moved nothing on the literal recipe; int8's 1e-2 moved it by per cents).

--zeropp and --extra-config are merged into the ZeRO++ run's zero_optimization (--extra-config is kept for the
commands recorded before --zeropp existed); --ranks-per-host lays the ranks out L per host (zero-gpt
--ranks-per-host), where hpZ's groups and qgZ's two hops run.

The config (printed) is stage 3 with stage3_param_persistence_threshold 0, so every block is gathered, AdamW at lr
1e-3, micro-batch 2. For each mode: the loss at the last step of each run and their gap, and for every window of 10
steps the mean loss of each run and the signed gap (ZeRO++ - exact) / exact (+: the ZeRO++ run's loss is higher). The
issue's bar: the final loss within 1 % and the curve within a stated band every 10 steps (the largest window gap's
magnitude is printed as the band measured).

--cache DIR keeps each run's per-step losses in DIR, keyed by the zero-gpt and zero-run binaries' bytes, the shared
libraries zero-gpt loads and the CPU they choose kernels for (OpenBLAS and Highway dispatch at run time), the command
and the config, and reads them back when all match: the same config and seed give the same bits, so another ZeRO++
config against the same exact run costs one run, not two. Runs that save or resume a checkpoint (--eval) always run.
"""
import argparse
import array
import functools
import hashlib
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = "<config>"  # the command's config path until run() writes the file (a cache hit writes none)
ROOT = os.path.dirname(os.path.dirname(HERE))


def config(zeropp, bf16, extra, recipe=None, accumulation=1):
    c = {"train_micro_batch_size_per_gpu": 2,
         "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    if zeropp is not None:
        c["zero_optimization"].update(zeropp)
        c["zero_optimization"].update(extra)
    if bf16:
        c["bf16"] = {"enabled": True}
    c.update(recipe or {})
    if accumulation > 1:
        c["gradient_accumulation_steps"] = accumulation
    return c


@functools.lru_cache(maxsize=None)
def runtime_digest(build):
    """What decides a run's bits besides its command and config, read once per build directory: the zero-gpt and
    zero-run binaries, the shared libraries zero-gpt loads (OpenBLAS and Highway choose their kernels at run time), the
    CPU they choose for (model and flags), and the variables that force a choice. A rebuilt zero-gpt, a cache folder
    carried to another machine or kept across a library upgrade then runs the exact job again."""
    try:
        ldd = subprocess.run(["ldd", os.path.join(build, "bin/zero-gpt")], capture_output=True, text=True).stdout
    except OSError:
        ldd = ""
    libs = [l.split("=>")[1].split("(")[0].strip() for l in sorted(ldd.splitlines()) if "=>" in l]
    h = hashlib.sha256()
    for path in [os.path.join(build, "bin/zero-gpt"), os.path.join(build, "bin/zero-run")] + libs:
        if path and os.path.isfile(path):
            h.update(os.path.basename(path).encode())
            with open(os.path.realpath(path), "rb") as f:
                h.update(f.read())
    try:
        with open("/proc/cpuinfo") as f:
            cpu = [l for l in f if l.startswith(("vendor_id", "cpu family", "model", "flags"))]
        h.update("".join(dict.fromkeys(cpu)).encode())  # the first core's lines; the others repeat them
    except OSError:
        pass
    for v in ("ZERO_SIMD_TARGET", "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        h.update(f"{v}={os.environ.get(v, '')};".encode())
    return h.hexdigest()


def cache_path(args, cmd, cfg):
    """Where --cache keeps a run's losses: keyed by runtime_digest, the command (its config's path a placeholder) and
    the config, so a rebuilt zero-gpt, another machine or any other flag or key runs again."""
    h = hashlib.sha256(runtime_digest(args.build).encode())
    h.update(json.dumps([c.replace(args.build, "BUILD") for c in cmd]).encode())  # not where the build lies
    h.update(json.dumps(cfg, sort_keys=True).encode())
    return os.path.join(args.cache, h.hexdigest()[:32] + ".json")


def run(args, mode, cfg, seed=None, world=None, save=None, resume=None, steps=None, init=None, params_hash=False):
    """The job's per-step losses (and, with params_hash, also zero-gpt --params-hash's hash of the final weights)."""
    seed = seed if seed is not None else args.seed
    world = world or args.world
    gpt = [os.path.join(args.build, "bin/zero-gpt"), "--model", "small", "--steps", str(steps or args.steps), "--config",
           CONFIG, "--json"]
    if save:
        gpt += ["--save", save]
    if resume:
        gpt += ["--resume", resume]
    if init:
        gpt += ["--init-from", init]
    if params_hash:
        gpt += ["--params-hash"]
    if args.ranks_per_host > 0:
        gpt += ["--ranks-per-host", str(args.ranks_per_host)]
    if seed is not None:
        gpt += ["--seed", str(seed)]
    if mode == "threads":
        cmd = gpt + ["--world", str(world)]
    else:
        cmd = [os.path.join(args.build, "bin/zero-run"), "-n", str(world), "--"] + gpt
    # A run that saves or resumes a checkpoint always runs: --eval needs the checkpoint, not the losses. One from
    # --init-from too (its file is made afresh each time), and one whose hash is wanted (the cache keeps losses).
    cached = None
    if args.cache and not save and not resume and not init and not params_hash:
        cached = cache_path(args, cmd, cfg)
        if os.path.exists(cached):
            with open(cached) as f:
                return " ".join(cmd) + "  (losses from --cache)", json.load(f)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
        path = f.name
    cmd = [path if c is CONFIG else c for c in cmd]
    p = subprocess.run(cmd, capture_output=True, text=True)
    os.unlink(path)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
    losses = {}
    digest = None
    for line in p.stdout.splitlines():
        h = line.find('"params_hash": "')
        if h >= 0:
            digest = line[h + 16:h + 32]
        j = line.find('{"step"')
        if j < 0:
            continue
        s = json.loads(line[j:])
        losses.setdefault(s["step"], s["loss"])  # processes: every rank prints the same step; the first wins
    out = [losses[k] for k in sorted(losses)]
    if cached and out:  # a run that printed no step is not kept
        os.makedirs(args.cache, exist_ok=True)
        with open(cached, "w") as f:
            json.dump(out, f)
    if params_hash:
        return " ".join(cmd), out, digest
    return " ".join(cmd), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--modes", default="threads,processes")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--extra-config", default="{}")
    ap.add_argument("--zeropp", action="append", help='default: {"zero_quantized_weights": true}')
    ap.add_argument("--ranks-per-host", type=int, default=0)
    ap.add_argument("--recipe", default="{}")
    ap.add_argument("--seeds", default="")
    ap.add_argument("--floor", action="store_true", help="the exact job at --world/2 with 2 accumulation steps too")
    ap.add_argument("--no-zeropp", action="store_true", help="no ZeRO++ run: the exact one, with --seeds / --floor")
    ap.add_argument("--seed", type=int, default=None, help="zero-gpt --seed for every run (default: zero-gpt's, 1234)")
    ap.add_argument("--cache", default="", metavar="DIR",
                    help="keep each run's losses in DIR and reuse them when the binaries, command and config match "
                         "(the same config and seed give the same bits): the exact run is not run again")
    ap.add_argument("--perturb", type=int, default=0, metavar="K",
                    help="threads: the exact job K more times from its initial weights with int8-sized noise added once")
    ap.add_argument("--perturb-scale", type=float, default=1.0, metavar="F",
                    help="--perturb's noise times F (-1: each seed's noise mirrored, up to each weight's float32 "
                         "rounding; 0.0625: a sixteenth of int8's size)")
    ap.add_argument("--eval", type=int, default=0, metavar="K",
                    help="threads: each trained model's loss on the next K steps' batches at lr 0, exact and quantized")
    args = ap.parse_args()
    if (args.eval or args.perturb) and args.modes != "threads":
        sys.exit("--eval and --perturb run with --modes threads")
    # Removed when the script ends, a run's failure (sys.exit) included: the checkpoints are a few hundred MB.
    ckpts = tempfile.TemporaryDirectory(prefix="zeropp_parity_") if args.eval or args.perturb else None
    trained = []  # (name, checkpoint dir, its ZeRO++ config or None)

    def saved(name, zeropp=None):
        if not args.eval:
            return None
        d = os.path.join(ckpts.name, str(len(trained)))
        trained.append((name, d, zeropp))
        return d

    extra = json.loads(args.extra_config)
    recipe = json.loads(args.recipe)
    zeropps = [] if args.no_zeropp else [json.loads(z) for z in (args.zeropp or ['{"zero_quantized_weights": true}'])]
    print(f"config (exact run): {json.dumps(config(None, args.bf16, extra, recipe))}")
    exact = {}
    for mode in args.modes.split(","):
        cmd_e, e = run(args, mode, config(None, args.bf16, extra, recipe), save=saved("exact"))
        exact[mode] = e
        print(f"\n## {mode}, exact: {cmd_e}")
        for zeropp in zeropps:
            cfg = config(zeropp, args.bf16, extra, recipe)
            cmd_q, q = run(args, mode, cfg, save=saved(f"ZeRO++ {json.dumps(zeropp)}", zeropp))
            print(f"\n### {mode}, ZeRO++ {json.dumps(cfg['zero_optimization'])}: {cmd_q}")
            compare(e, q, "ZeRO++")
    for seed in [int(x) for x in args.seeds.split(",") if x]:
        cmd_s, q = run(args, "threads", config(None, args.bf16, extra, recipe), seed)
        print(f"\n### threads, exact with --seed {seed}: {cmd_s}")
        if "threads" not in exact:
            exact["threads"] = run(args, "threads", config(None, args.bf16, extra, recipe))[1]
        compare(exact["threads"], q, f"seed {seed}")
    if args.floor:
        if args.world % 2 != 0:
            sys.exit("--floor needs an even --world")
        cmd_f, q = run(args, "threads", config(None, args.bf16, extra, recipe, accumulation=2), world=args.world // 2,
                       save=saved("re-summed (the floor)"))
        print(f"\n### threads, exact at world {args.world // 2} with 2 accumulation steps: {cmd_f}")
        if "threads" not in exact:
            exact["threads"] = run(args, "threads", config(None, args.bf16, extra, recipe))[1]
        compare(exact["threads"], q, "re-summed")
    if args.perturb:
        if "threads" not in exact:
            exact["threads"] = run(args, "threads", config(None, args.bf16, extra, recipe))[1]
        perturbed(args, config(None, args.bf16, extra, recipe), exact["threads"], ckpts.name)
    if args.eval:
        evaluate(args, extra, trained)


def perturbed(args, cfg, exact, tmp):
    """--perturb: the exact job from its initial weights plus int8-sized noise, once per noise seed 1..K."""
    frozen = json.loads(json.dumps(cfg))
    frozen.pop("scheduler", None)
    frozen["optimizer"]["params"]["lr"] = 0.0
    d = os.path.join(tmp, "init")
    run(args, "threads", frozen, save=d, steps=1)
    init = os.path.join(tmp, "init.safetensors")
    p = subprocess.run([os.path.join(args.build, "bin/zero-ckpt"), "export", d, init], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"zero-ckpt export {d}: exit {p.returncode}\n{p.stderr[-3000:]}")
    with open(init, "rb") as f:
        raw = f.read()
    # The method's check: the unperturbed export, loaded with --init-from, trains the exact job bit for bit: the same
    # hash of every final fp32 weight after `check` steps (and the same printed losses).
    check = min(args.steps, 20)
    _, e, e_hash = run(args, "threads", cfg, steps=check, params_hash=True)
    _, q, q_hash = run(args, "threads", cfg, init=init, steps=check, params_hash=True)
    if e_hash is None or q_hash != e_hash or q != e or e != exact[:check]:
        sys.exit(f"--perturb: the exact job from its own exported initial weights is not the exact job after {check} "
                 f"steps (weights' hash {q_hash} against {e_hash})")
    print(f"\n--perturb: the exact job restarted from its exported initial weights trains the same weights bit for bit "
          f"(hash {e_hash} after {check} steps)")
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    swap = sys.byteorder != "little"  # safetensors is little-endian; array.array uses the machine's order
    for k in range(1, args.perturb + 1):
        rng = random.Random(k)
        data = bytearray(raw[8 + n:])
        moved = 0
        for name, t in sorted(header.items()):
            if name == "__metadata__" or len(t["shape"]) < 2:
                continue
            if t["dtype"] != "F32":
                sys.exit(f"--perturb: {name} is {t['dtype']}, not F32")
            lo, hi = t["data_offsets"]
            w = array.array("f")
            w.frombytes(bytes(data[lo:hi]))
            if swap:
                w.byteswap()
            for b in range(0, len(w), 4096):
                step = args.perturb_scale * max(abs(x) for x in w[b:b + 4096]) / 127
                for i in range(b, min(len(w), b + 4096)):
                    w[i] += step * (rng.random() - 0.5)
            if swap:
                w.byteswap()
            data[lo:hi] = w.tobytes()
            moved += len(w)
        path = os.path.join(tmp, f"init{k}.safetensors")
        with open(path, "wb") as f:
            f.write(raw[:8 + n] + bytes(data))
        cmd_p, q = run(args, "threads", cfg, init=path)
        print(f"\n### threads, exact from initial weights with int8-sized noise times {args.perturb_scale:g} (noise "
              f"seed {k}, {moved} elements of 2-D tensors): {cmd_p}")
        compare(exact, q, f"perturbed {k}")


def evaluate(args, extra, trained):
    """Each saved model resumed for --eval steps at lr 0: its fp32 weights' losses on batches no step trained on."""
    def frozen(zeropp):
        c = config(zeropp, args.bf16, extra)  # no scheduler, no clipping: the learning rate is 0 throughout
        c["optimizer"]["params"]["lr"] = 0.0
        return c

    print(f"\n## the trained weights, each resumed for {args.eval} steps at lr 0 "
          f"(steps {args.steps + 1}-{args.steps + args.eval}: the mean loss)")
    print("| model | read exact | gap to the exact run's model | read with its ZeRO++ forward | gap |")
    print("|---|---|---|---|---|")
    base = None  # the exact run's model: saved first
    for name, d, zeropp in trained:
        _, e = run(args, "threads", frozen(None), resume=d, steps=args.steps + args.eval)
        me = statistics.mean(e)
        base = base or me
        cells = [f"{me:.4f}", f"{100 * (me - base) / base:+.2f} %"]
        if zeropp is not None:
            _, q = run(args, "threads", frozen(zeropp), resume=d, steps=args.steps + args.eval)
            mq = statistics.mean(q)
            cells += [f"{mq:.4f}", f"{100 * (mq - base) / base:+.2f} %"]
        else:
            cells += ["", ""]
        print(f"| {name} | " + " | ".join(cells) + " |")


def compare(e, q, name):
    print(f"| steps | exact | {name} | gap |")
    print("|---|---|---|---|")
    worst = 0.0
    for w in range(0, len(e), 10):
        me, mq = statistics.mean(e[w:w + 10]), statistics.mean(q[w:w + 10])
        gap = (mq - me) / me
        worst = max(worst, abs(gap))
        print(f"| {w + 1}-{min(w + 10, len(e))} | {me:.4f} | {mq:.4f} | {100 * gap:+.2f} % |")
    if any(x != x for x in q):  # NaN: max() above drops a NaN window, so the band says so instead
        print(f"{name} has a NaN loss")
        worst = float("nan")
    final = (q[-1] - e[-1]) / e[-1]
    last10 = (statistics.mean(q[-10:]) - statistics.mean(e[-10:])) / statistics.mean(e[-10:])
    print(f"\nfinal loss (step {len(e)}): exact {e[-1]:.4f}, {name} {q[-1]:.4f}, gap {100 * final:+.2f} %; "
          f"last 10 steps' mean gap {100 * last10:+.2f} %; largest window gap (the band) {100 * worst:.2f} %")


if __name__ == "__main__":
    main()
