#!/usr/bin/env python3
"""Fails on a path in README.md or docs/**.md that does not exist, so moving a file cannot leave a doc behind.

Checked, outside fenced code blocks:
  - relative markdown links [text](path) and [text](path#anchor), resolved from the linking file's folder; the
    anchor, where the target is markdown, must be one of its headings (GitHub's slugs);
  - backticked repository paths (`docs/...`, `examples/...`, `src/...`, `include/...`, `tests/...`, `scripts/...`,
    `tools/...`, `bench/...`, `fuzz/...`, `cmake/...`), resolved from the repository root. A span that is a pattern
    rather than a path (`*`, `<`, `|`, `{`, `...`) is skipped, and so are a command's flags after the path.

  tests/docs/links_test.py [ROOT] [FILE.md ...]   # default: this checkout's README.md and docs/**/*.md
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIXES = ("docs/", "examples/", "src/", "include/", "tests/", "scripts/", "tools/", "bench/", "fuzz/", "cmake/")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")
SPAN = re.compile(r"`([^`]+)`")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    seen, out, fenced = {}, set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            if fenced or not line.startswith("#"):
                continue
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                yield number, line


def check(root, md):
    errors = []
    rel = os.path.relpath(md, root)
    for number, line in prose_lines(md):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#") and not target[1:]:
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(resolved):
                errors.append(f"{rel}:{number}: link ({target}): {os.path.relpath(resolved, root)} does not exist")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                errors.append(f"{rel}:{number}: link ({target}): no heading with anchor #{anchor} in "
                              f"{os.path.relpath(resolved, root)}")
        for span in SPAN.findall(LINK.sub("", line)):
            path = span.split()[0] if span.split() else ""
            if not path.startswith(PREFIXES) or re.search(r"[*<>|{}]|\.\.\.", path):
                continue
            path = re.sub(r"[:,;.)]+$", "", path.split("#")[0])
            if not os.path.exists(os.path.join(root, path)):
                errors.append(f"{rel}:{number}: `{span}`: {path} does not exist")
    return errors


def main(argv):
    root = os.path.abspath(argv[1]) if len(argv) > 1 else ROOT
    files = [os.path.abspath(f) for f in argv[2:]]
    if not files:
        files = [os.path.join(root, "README.md")]
        for folder, _, names in os.walk(os.path.join(root, "docs")):
            # A symlink (docs/design.md) is checked where it points: its links are relative to that folder.
            files += [os.path.join(folder, n) for n in sorted(names)
                      if n.endswith(".md") and not os.path.islink(os.path.join(folder, n))]
    errors = [e for md in files for e in check(root, md)]
    for e in errors:
        print(e)
    print(f"links_test: {len(files)} files, {len(errors)} broken paths")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
