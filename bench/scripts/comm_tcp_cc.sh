#!/usr/bin/env bash
# zero-bench-comm under each named TCP congestion control, alternating, ROUNDS rounds; each round runs the A/A
# control (--aa: the raw Gloo call against itself over a second set of connections) and then the real
# comparison. Prints one line per run: cc, mode, and op:MiB=ratio for every size. Changes the kernel's default
# (net.ipv4.tcp_congestion_control, so it needs root) and restores it on exit; only connections opened while a
# setting is in force use it, and every run opens its own.
#   bench/scripts/comm_tcp_cc.sh BUILD_DIR ROUNDS "CC ..." [zero-bench-comm args...]
#   e.g. bench/scripts/comm_tcp_cc.sh build 3 "bbr cubic" --world 4 --min-bytes 1M --max-bytes 4M --ops ag,rs
set -euo pipefail
B=${1:-build}; ROUNDS=${2:-3}; CCS=${3:-"bbr cubic"}; shift 3 || true
key=/proc/sys/net/ipv4/tcp_congestion_control
orig=$(cat "$key")
for cc in $CCS; do
  if ! echo "$cc" > "$key" 2>/dev/null; then
    echo "comm_tcp_cc.sh: cannot set $key to '$cc' (needs root, and the algorithm loaded:" \
         "$(cat /proc/sys/net/ipv4/tcp_available_congestion_control))" >&2
    echo "$orig" > "$key" 2>/dev/null || true
    exit 2
  fi
done
trap 'echo "$orig" > "$key"' EXIT
summary() {
  python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
cells = ["%s:%g=%.3f%s" % (r["op"][:2], r["bytes"] / 2**20, r["ratio"], "!" if r["wrong"] else "") for r in rows]
print(" ".join(cells))'
}
echo "# $(nproc) cores, $(uname -r); ratio = raw_time/time (--aa: raw over its own connections / raw)"
for round in $(seq "$ROUNDS"); do
  for cc in $CCS; do
    echo "$cc" > "$key"
    for mode in aa zero; do
      extra=(); [ "$mode" = aa ] && extra=(--aa)
      line=$("$B/bin/zero-bench-comm" "$@" "${extra[@]}" --json 2>/dev/null | summary)
      printf '%-6s round %d %-5s %s\n' "$cc" "$round" "$mode" "$line"
    done
  done
done
