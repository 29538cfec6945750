#!/usr/bin/env bash
# Runs one libFuzzer target (docs/internals/fuzzing.md) under ASan + UBSan, built with clang in build-fuzz/.
#   scripts/fuzz.sh TARGET [SECONDS]   fuzz for SECONDS (default 60), starting from fuzz/corpus/TARGET; the inputs
#                                      that reach new coverage collect in build-fuzz/corpus/TARGET, a crash or
#                                      failed check in build-fuzz/artifacts/TARGET/, the log in build-fuzz/logs/
#   scripts/fuzz.sh --merge TARGET     minimizes fuzz/corpus/TARGET plus build-fuzz/corpus/TARGET (libFuzzer's
#                                      -merge=1: the fewest inputs with the same edges; named seeds and
#                                      regression-* inputs are always kept) back into fuzz/corpus/TARGET, which
#                                      the replay test (fuzz_replay_TARGET) then runs
#   scripts/fuzz.sh --list             the targets
# Extra libFuzzer flags: FUZZ_FLAGS="-max_len=8192 ...". Installs clang and libclang-rt-14-dev (libFuzzer and
# the sanitizer runtimes; install-deps.sh --fuzz) when missing; the normal build and the replay tests need neither.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(config checkpoint_meta checkpoint_reader safetensors store_protocol trainer_state)
usage() {
  echo "usage: scripts/fuzz.sh TARGET [SECONDS] | --merge TARGET | --list   (targets: ${targets[*]})" >&2
  exit 2
}
merge=0
case "${1:-}" in
  --list) printf '%s\n' "${targets[@]}"; exit 0 ;;
  --merge) merge=1; shift ;;
  ""|-*) usage ;;
esac
target="${1:-}"
[[ " ${targets[*]} " == *" ${target} "* ]] || usage
seconds="${2:-60}"
[[ "$seconds" =~ ^[0-9]+$ ]] || usage

./scripts/install-deps.sh --fuzz
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
if [[ ! -f build-fuzz/CMakeCache.txt ]]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO_BUILD_FUZZERS=ON \
    -DZERO_BUILD_TESTS=OFF -DZERO_BUILD_BENCHMARKS=OFF -DZERO_BUILD_EXAMPLES=OFF -DZERO_BUILD_TOOLS=OFF \
    -DZERO_ENABLE_INSTALL=OFF -DZERO_ENABLE_CUDA=OFF >/dev/null
fi
cmake --build build-fuzz -j "${FUZZ_BUILD_JOBS:-2}" --target "zero_fuzz_${target}" >/dev/null

bin="build-fuzz/bin/zero_fuzz_${target}"
seeds="fuzz/corpus/${target}"
work="build-fuzz/corpus/${target}"
mkdir -p "$work" "build-fuzz/artifacts/${target}" build-fuzz/logs
# The targets that write files do it here (in memory), in a folder removed however the run ends.
scratch=$(mktemp -d "$( [[ -w /dev/shm ]] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/zero-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export ZERO_FUZZ_SCRATCH="$scratch"
dict=()
[[ -f "fuzz/dict/${target}.dict" ]] && dict=(-dict="fuzz/dict/${target}.dict")

if [[ $merge == 1 ]]; then
  # The named inputs (the seeds, regression-*) stay as they are; of the rest (libFuzzer's SHA-1 names, from
  # fuzz/corpus and the runs), only those that add an edge are kept. -use_counters=0 counts edges, not hit-count
  # buckets: the same edges in about a sixth of the bytes (the config corpus: 293 inputs, 101 KB instead of 1058,
  # 687 KB), so the corpora stay small in the repository.
  merged=$(mktemp -d build-fuzz/merged.XXXXXX)
  find "$seeds" -maxdepth 1 -type f -regextype posix-extended ! -regex '.*/[0-9a-f]{40}' -exec cp {} "$merged/" \;
  "$bin" -merge=1 -use_counters=0 "${dict[@]}" "$merged" "$seeds" "$work" 2>&1 | grep MERGE-OUTER
  rm -rf "$seeds"
  mv "$merged" "$seeds"
  chmod 755 "$seeds"
  echo "fuzz: ${seeds}: $(find "$seeds" -type f | wc -l) inputs, $(cat "$seeds"/* | wc -c) bytes"
  exit 0
fi

log="build-fuzz/logs/${target}-$(date +%Y%m%d-%H%M%S).log"
echo "fuzz: $(clang++ --version | head -1); ${target} for ${seconds} s; log ${log}"
rc=0
# shellcheck disable=SC2086
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="build-fuzz/artifacts/${target}/" "${dict[@]}" ${FUZZ_FLAGS:-} "$work" "$seeds" \
  >"$log" 2>&1 || rc=$?
grep -E "^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::|ERROR|SUMMARY|FUZZ_CHECK|^artifact_prefix|Test unit written" "$log" || true
if [[ $rc != 0 ]]; then
  echo "fuzz: ${target} FAILED (exit ${rc}); the input is in build-fuzz/artifacts/${target}/, the log in ${log}" >&2
  exit "$rc"
fi
echo "fuzz: ${target}: no failure in ${seconds} s; $(find "$work" -type f | wc -l) new inputs in ${work}"
