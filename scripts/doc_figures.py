#!/usr/bin/env python3
"""Regenerates the figures of docs/guide/scale.md from zero-estimate, so the doc never drifts from what the tool prints.

docs/guide/scale.md.in is the text with {{name}} placeholders; this script runs the zero-estimate commands the doc names
(each with --json), computes every figure from their output and writes docs/guide/scale.md. A test (tests/docs) runs
it with --check, which fails, printing the difference, when the committed docs/guide/scale.md is not what the template
and today's zero-estimate give.

  scripts/doc_figures.py [--build build] [--check]
"""
import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = float(1 << 30)

# The run docs/guide/scale.md describes: Megatron-LM's 76.1B shape on 1,024 ranks.
SHAPE = ["--layers", "60", "--hidden", "10240", "--heads", "80", "--vocab", "51200", "--seq", "2048"]
LAYERS, HIDDEN, SEQ, MICRO_BATCH = 60, 10240, 2048, 1
CONFIG = os.path.join("examples", "gpt", "configs", "zero3_scale.json")


def estimate(build, extra, config_overrides=None):
    """zero-estimate's --json output for the scale run, with `extra` flags and keys set in a copy of the config."""
    with open(os.path.join(ROOT, CONFIG)) as f:
        cfg = json.load(f)
    for path, value in (config_overrides or {}).items():
        node = cfg
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as tmp:
        json.dump(cfg, tmp)
    try:
        cmd = [os.path.join(build, "bin", "zero-estimate")] + SHAPE + ["--world", "1024", "--config", tmp.name]
        out = subprocess.run(cmd + extra + ["--json"], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(tmp.name)
    return json.loads(out)


def gib(b, digits=3):
    return f"{b / GIB:.{digits}f}"


def mem(run, tag):
    return run["memory"][tag]["bytes"]


def mem_min(run, tag):
    return run["memory"][tag].get("min_bytes", run["memory"][tag]["bytes"])


def thousands(x):
    return f"{x:,}"


def figures(build):
    fp32 = estimate(build, ["--recompute", "--fit-gib", "80"])
    bf16 = estimate(build, ["--recompute", "--fit-gib", "80"], {"communication_data_type": "bf16"})
    cuda = estimate(build, ["--device", "cuda", "--fit-gib", "80"])
    lowcomm = estimate(build, ["--recompute"],
                       {"communication_data_type": "bf16", "gradient_accumulation_mode": "low_communication"})
    hybrid = {g: estimate(build, ["--recompute", "--shard-group", str(g)]) for g in (64, 8)}
    # ZeRO++ on nodes of 8 ranks: the three parts (hpZ over the node), LoCo on (zero's default) and off, beside
    # stage 3 with the same nodes and a bf16 wire.
    node = ["--recompute", "--ranks-per-host", "8"]
    zeropp = {"zero_optimization.zero_quantized_weights": True, "zero_optimization.zero_hpz_partition_size": 8,
              "zero_optimization.zero_quantized_gradients": True}
    nodes = {"s3": estimate(build, node, {"communication_data_type": "bf16"}),
             "zpp": estimate(build, node, zeropp),
             "zpp_noloco": estimate(build, node,
                                    dict(zeropp, **{"zero_optimization.zero_quantized_gradients_error_feedback": False})),
             "zpp_loco8": estimate(build, node,
                                   dict(zeropp, **{
                                       "zero_optimization.zero_quantized_gradients_error_feedback_dtype": "int8"}))}

    f = {}
    params = fp32["params"]
    block = 12 * HIDDEN * HIDDEN + 13 * HIDDEN  # a pre-LN block with biases: attention 4h² + 4h, MLP 8h² + 5h, 2 LNs
    root = params - LAYERS * block
    f["params"] = thousands(params)
    f["units"] = str(LAYERS + 1)
    f["root_m"] = f"{root / 1e6:.0f} M"
    f["block_g"] = f"{block / 1e9:.2f} G"
    f["block_gb_bf16"] = f"{2 * block / 1e9:.1f} GB"
    for name, run in (("fp32", fp32), ("bf16", bf16)):
        for tag in ("params", "grads", "optimizer", "master", "gather", "buckets", "staging", "activations"):
            entry = run["memory"].get(tag)
            if entry is None or entry["tier"] != "device":
                f[f"{tag}_{name}"] = "0"
                continue
            text = gib(entry["bytes"])
            if "min_bytes" in entry and entry["min_bytes"] != entry["bytes"]:
                text += " / " + gib(entry["min_bytes"])
            f[f"{tag}_{name}"] = text
        f[f"state_{name}"] = gib(run["model_state"])
        f[f"device_{name}"] = gib(run["memory"]["peak_total"]["device"], 2)
        f[f"host_{name}"] = gib(run["memory"]["peak_total"]["host"], 1)
        f[f"fit_layers_{name}"] = str(run["fit"]["layers"])
        f[f"fit_params_{name}"] = f"{run['fit']['params'] / 1e9:.0f} B"
        for c in run["communication"]:
            key = "gathers" if c["kind"] == "all_gather" else "rs"
            f[f"{key}_calls"] = str(c["calls"])
            f[f"{key}_gib_{name}"] = f"{c['bytes_sent'] / GIB:,.1f}"
            f[f"{key}_dtype_{name}"] = c["dtype"]
        f[f"sent_gib_{name}"] = f"{run['bytes_sent_per_step'] / GIB:,.0f}"
        f[f"sent_s_{name}"] = f"{run['bytes_sent_per_step'] / 25e9:.0f}"
    f["calls_total"] = str(sum(c["calls"] for c in fp32["communication"]))
    f["state_gib"] = gib(fp32["model_state"], 2)
    # The reference GPT's activations with every block recomputed: one fp32 checkpoint of the residual stream per
    # block (B × T × C floats), the rest the arena.
    acts = mem(fp32, "activations")
    ckpts = LAYERS * MICRO_BATCH * SEQ * HIDDEN * 4
    f["acts_gib"] = gib(acts, 2)
    f["acts_ckpt_gib"] = gib(ckpts, 1)
    f["acts_arena_gib"] = gib(acts - ckpts, 1)
    f["acts_cuda_gib"] = gib(mem(cuda, "activations"), 1)
    f["fit_layers_cuda"] = str(cuda["fit"]["layers"])
    f["fit_params_cuda"] = f"{cuda['fit']['params'] / 1e9:.1f} B"
    f["lowcomm_sent_gib"] = f"{lowcomm['bytes_sent_per_step'] / GIB:,.0f}"
    lowcomm_total = lowcomm["memory"]["peak_total"]["device"]
    f["lowcomm_device_gib"] = f"{lowcomm_total / GIB:,.0f}"
    f["device_range"] = f"{min(fp32['memory']['peak_total']['device'], bf16['memory']['peak_total']['device']) / GIB:.0f}" \
        f"-{max(fp32['memory']['peak_total']['device'], bf16['memory']['peak_total']['device']) / GIB:.0f}"
    for g, run in hybrid.items():
        f[f"h{g}_state"] = gib(run["model_state"], 1)
        f[f"h{g}_device"] = gib(run["memory"]["peak_total"]["device"], 1)
        inside = sum(c["bytes_sent"] for c in run["communication"] if "replica" not in c["what"])
        across = sum(c["bytes_sent"] for c in run["communication"] if "replica" in c["what"])
        f[f"h{g}_inside"] = f"{inside / GIB:,.1f}"
        f[f"h{g}_across"] = f"{across / GIB:,.1f}"
    for name, run in nodes.items():
        f[f"{name}_across"] = f"{run['host_bytes_per_step']['inter'] / GIB:,.1f}"
        f[f"{name}_inside"] = f"{run['host_bytes_per_step']['intra'] / GIB:,.0f}"
        f[f"{name}_device"] = gib(run["memory"]["peak_total"]["device"], 1)
        f[f"{name}_state"] = gib(run["model_state"], 1)
    f["zpp_across_ratio"] = f"{nodes['s3']['host_bytes_per_step']['inter'] / nodes['zpp']['host_bytes_per_step']['inter']:.2f}"
    f["full_device"] = gib(fp32["memory"]["peak_total"]["device"], 1)
    f["full_sent"] = f"{fp32['bytes_sent_per_step'] / GIB:,.0f}"
    return f


def render(template, figs):
    missing = sorted(set(re.findall(r"\{\{(\w+)\}\}", template)) - set(figs))
    if missing:
        sys.exit(f"doc_figures: the template uses figures this script does not compute: {', '.join(missing)}")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: figs[m.group(1)], template)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--check", action="store_true", help="compare with the committed doc instead of writing it")
    args = ap.parse_args()
    os.chdir(ROOT)
    with open(os.path.join("docs", "guide", "scale.md.in")) as fh:
        template = fh.read()
    text = render(template, figures(os.path.abspath(args.build)))
    target = os.path.join("docs", "guide", "scale.md")
    if args.check:
        with open(target) as fh:
            current = fh.read()
        if current != text:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), target,
                                                       target + " (regenerated)"))
            print("doc_figures: docs/guide/scale.md differs from what zero-estimate prints today; run "
                  "scripts/doc_figures.py and commit the result")
            return 1
        print("doc_figures: docs/guide/scale.md matches zero-estimate")
        return 0
    with open(target, "w") as fh:
        fh.write(text)
    print(f"doc_figures: wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
