"""Reads zero-gpt --json output on stdin; prints one markdown row: stage, losses, memory vs the ZeRO formula."""
import json
import sys

stage, world, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
lines = [json.loads(l) for l in sys.stdin if l.startswith("{")]
steps = [l for l in lines if "loss" in l]
end = [l for l in lines if "memory" in l][0]
mem = end["memory"]


def get(tag, field="current"):
    return mem.get(tag, {}).get(field, 0)


layers, C, T = {"tiny": (2, 64, 32), "small": (6, 384, 128)}[model]
root = 256 * C + T * C + 2 * C
block = 2 * C + C * 3 * C + 3 * C + C * C + C + 2 * C + C * 4 * C + 4 * C + 4 * C * C + C
assert root + layers * block == end["params"], (root + layers * block, end["params"])
q = 32 * world
padded = sum((n + q - 1) // q * q for n in [root] + [block] * layers)
a, b = [(16, 0), (8, 8), (4, 12), (0, 16)][stage]
formula = a * padded + b * padded // world
state = get("params") + get("grads") + get("optimizer") + get("master")
ms = sorted(l["step_ms"] for l in steps[1:]) or [steps[0]["step_ms"]]
row = [stage, end["params"], f'{steps[0]["loss"]:.4f}', f'{steps[-1]["loss"]:.4f}', get("params"), get("grads"),
       get("optimizer"), state, formula, "yes" if state == formula else "NO", get("gather", "peak"),
       get("buckets", "peak"), f"{ms[len(ms) // 2]:.0f}"]
print("| " + " | ".join(str(x) for x in row) + " |")
