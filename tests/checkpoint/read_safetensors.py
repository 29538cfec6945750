#!/usr/bin/env python3
"""An independent safetensors reader: the standard library and numpy only, following the format description
(huggingface/safetensors README): 8 bytes little-endian header length N, N bytes of JSON header mapping each
tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte after the header),
an optional "__metadata__" of strings, then the data with no holes.

Usage: read_safetensors.py IN.safetensors OUT
Writes OUT as lines "name<TAB>dims<TAB>hex" where dims is the shape joined by ',' and hex is the tensor's values
widened to float32 little-endian, so the C++ test compares them bit for bit with Engine::GatherParam.
Exits 1 naming the problem if the file breaks the format.
"""
import json
import struct
import sys

import numpy as np


def fail(msg):
    print(f"read_safetensors: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    src, out = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("shorter than the header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        fail(f"header length {n} past the end")
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    data = blob[8 + n :]
    spans = []
    lines = []
    for name, t in header.items():
        if name == "__metadata__":
            if not all(isinstance(v, str) for v in t.values()):
                fail("__metadata__ values must be strings")
            continue
        begin, end = t["data_offsets"]
        shape = t["shape"]
        count = int(np.prod(shape)) if shape else 1
        raw = data[begin:end]
        if t["dtype"] == "F32":
            values = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "F16":
            values = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif t["dtype"] == "BF16":
            # bfloat16 is the upper half of a float32: widen by a 16-bit shift.
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            fail(f"{name}: dtype {t['dtype']}")
        if values.size != count:
            fail(f"{name}: {values.size} values for shape {shape}")
        spans.append((begin, end))
        lines.append(f"{name}\t{','.join(str(d) for d in shape)}\t{values.astype('<f4').tobytes().hex()}")
    spans.sort()
    at = 0
    for begin, end in spans:
        if begin != at:
            fail(f"a hole or an overlap at data byte {at}")
        at = end
    if at != len(data):
        fail(f"the tensors end at {at} but the data holds {len(data)} bytes")
    with open(out, "w") as f:
        f.write("\n".join(sorted(lines)) + "\n")


if __name__ == "__main__":
    main()
