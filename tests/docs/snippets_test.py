#!/usr/bin/env python3
"""Fails when a ```cpp block of a doc is not code that builds: every block must be a verbatim region of a file
under examples/ (which the build compiles and tests run), or be marked as deliberately not compiled by an HTML
comment on the line before it, `<!-- not compiled: why -->` (for a fragment of a line or three).

A region may be quoted with less indentation than it has in its file (a loop body quoted on its own), as long as
every line loses the same amount; otherwise lines must be equal character for character.

  tests/docs/snippets_test.py DOC.md [ROOT]
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_SUFFIXES = (".cc", ".h", ".cu", ".cuh")


def cpp_blocks(path):
    """(line number of the fence, marked not-compiled, lines) of every ```cpp block."""
    blocks, block, start, marked, previous = [], None, 0, False, ""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if block is None and line.strip() == "```cpp":
                block, start, marked = [], number, previous.strip().startswith("<!-- not compiled:")
            elif block is not None and line.strip() == "```":
                blocks.append((start, marked, block))
                block = None
            elif block is not None:
                block.append(line)
            previous = line
    if block is not None:
        blocks.append((start, marked, block))
    return blocks


def example_files(root):
    out = []
    for folder, _, names in os.walk(os.path.join(root, "examples")):
        out += [os.path.join(folder, n) for n in sorted(names) if n.endswith(SOURCE_SUFFIXES)]
    return out


def indent(line):
    return len(line) - len(line.lstrip(" "))


def quoted_in(block, lines):
    """Whether `block` is a run of `lines`, every non-empty line dedented by the same number of spaces."""
    first = next((i for i, l in enumerate(block) if l.strip()), None)
    if first is None:
        return False
    for start in range(len(lines) - len(block) + 1):
        candidate = lines[start + first]
        if candidate.strip() != block[first].strip():
            continue
        shift = indent(candidate) - indent(block[first])
        if shift < 0:
            continue
        if all((not b.strip() and not l.strip()) or l == " " * shift + b for b, l in zip(block, lines[start:])):
            return True
    return False


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    root = os.path.abspath(argv[2]) if len(argv) > 2 else ROOT
    doc = os.path.abspath(argv[1])
    sources = {p: open(p, encoding="utf-8").read().split("\n") for p in example_files(root)}
    failures, checked, marked_count = [], 0, 0
    for start, marked, block in cpp_blocks(doc):
        if marked:
            marked_count += 1
            continue
        checked += 1
        if not any(quoted_in(block, lines) for lines in sources.values()):
            first = next((l.strip() for l in block if l.strip()), "<empty>")
            failures.append(f"{os.path.relpath(doc, root)}:{start}: the ```cpp block starting `{first}` is not a "
                            "verbatim region of any file under examples/; quote the current code, or mark a "
                            "fragment with <!-- not compiled: ... --> on the line before")
    for f in failures:
        print(f)
    print(f"snippets_test: {os.path.relpath(doc, root)}: {checked} quoted blocks, {marked_count} marked not "
          f"compiled, {len(failures)} not found")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
