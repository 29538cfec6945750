#!/usr/bin/env bash
# zero's collectives vs the raw Gloo call, each timed in a process of its own (zero-bench-comm --only), the
# two alternating REPS times (which goes first alternates too): nothing one call leaves behind (a thread still waking up, a cache state) can
# land in the other's time. Per size: the median over repetitions of raw_time/time, each repetition pairing
# the two processes run back to back, and every repetition's ratio.
#   bench/scripts/comm_separate.sh [BUILD_DIR] [REPS] [zero-bench-comm args...]
#   e.g. bench/scripts/comm_separate.sh build 5 --world 4 --min-bytes 1M --max-bytes 4M --ops ag,rs
set -euo pipefail
B=${1:-build}; REPS=${2:-5}; shift 2 || true
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$REPS"); do
  order="zero raw"; [ $((i % 2)) -eq 0 ] && order="raw zero"  # alternate which process goes first
  for side in $order; do
    "$B/bin/zero-bench-comm" "$@" --only "$side" --json > "$tmp/$i.$side.json"
  done
done
python3 - "$tmp" "$REPS" <<'PY'
import json, statistics, sys
d, reps = sys.argv[1], int(sys.argv[2])
def load(i, side):
    return {(o["op"], o["bytes"]): o for o in map(json.loads, open(f"{d}/{i}.{side}.json"))}
runs = [(load(i, "zero"), load(i, "raw")) for i in range(1, reps + 1)]
print(f"# each call in its own process, {reps} alternating repetitions; time = median over repetitions of the "
      "per-process median (us); ratio = median over repetitions of raw_time/time")
print(f"# {'op':<15}{'bytes':>11}{'time':>12}{'raw_time':>12}{'ratio':>8}  {'#wrong':>6}  ratios")
for key in runs[0][0]:
    z = [r[0][key]["time_us"] for r in runs]
    w = [r[1][key]["raw_time_us"] for r in runs]
    ratios = [b / a for a, b in zip(z, w)]
    wrong = sum(r[0][key]["wrong"] for r in runs)
    print(f"  {key[0]:<15}{key[1]:>11}{statistics.median(z):>12.1f}{statistics.median(w):>12.1f}"
          f"{statistics.median(ratios):>8.3f}  {wrong:>6}  " + " ".join(f"{x:.3f}" for x in ratios))
PY
