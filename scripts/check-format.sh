#!/usr/bin/env bash
# Checks that the C++/CUDA sources match .clang-format (clang-format 14, Debian's clang-format package): prints
# every file clang-format would change and exits 1 if there is one. Only tracked files of the source folders are
# checked, so build trees, generated headers (build/include/zero/features.h) and data files are never looked at.
#   scripts/check-format.sh          check
#   scripts/check-format.sh --fix    reformat those files in place
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$clang_format" >/dev/null; then
  clang_format=clang-format
fi
if ! command -v "$clang_format" >/dev/null; then
  echo "check-format: clang-format not found (scripts/install-deps.sh installs it)" >&2
  exit 2
fi

mapfile -t files < <(git ls-files -- src include tests examples tools bench fuzz | grep -E '\.(h|cc|cu|cuh)$')
if [[ "${1:-}" == "--fix" ]]; then
  "$clang_format" -i --style=file "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$clang_format" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "$f"
    bad=$((bad + 1))
  fi
done
if [[ $bad -gt 0 ]]; then
  echo "check-format: ${bad} of ${#files[@]} files differ from .clang-format (scripts/check-format.sh --fix)" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files match .clang-format"
