#!/usr/bin/env bash
# Runs the tolerance tests (ctest label `tolerance`), or the whole suite, once per SIMD target and OpenBLAS kernel,
# so a bound that holds only on the kernels of one CPU shows up on any machine (docs/internals/design.md, "SIMD targets
# and tolerances"; bench/results/cpu-targets.md: the measurements the bounds come from).
#   scripts/test-targets.sh [options] [ctest args]
#     --targets "A B"  Highway targets to force (ZERO_SIMD_TARGET), default every one this CPU offers; `best` and
#                      `fallback` name the first and the last offered (EMU128, or SCALAR with some compilers)
#     --blas "A B"     OpenBLAS kernels to force (OPENBLAS_CORETYPE) beside the environment's, default
#                      "Prescott Haswell SkylakeX"; "" for none. A kernel this CPU cannot run is reported and skipped.
#                      `auto`: OpenBLAS's own pick for this CPU, with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset
#                      (a machine image may set them: a user's machine of the same CPU then runs another kernel);
#                      skipped where the environment sets neither (the other runs had OpenBLAS's own pick)
#     --product        every target with every OpenBLAS kernel (default: each target with the environment's OpenBLAS
#                      kernel, OpenBLAS's own pick unless OPENBLAS_CORETYPE is set, then each OpenBLAS kernel with the CPU's best target)
#     --full           the whole suite through scripts/test.sh instead of the tolerance tests (Highway targets only)
#     --no-build       use build/ as it is
# Prints the CPU and, per run, the target and kernel; at the end a table of runs (tests, failures, seconds) and,
# for the tolerance tests, the worst deviation each compared quantity reached over all runs beside its bound.
# Exits non-zero when any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

targets="" blas="Prescott Haswell SkylakeX" product=0 full=0 build=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --targets) targets=$2 && shift 2 ;;
    --blas) blas=$2 && shift 2 ;;
    --product) product=1 && shift ;;
    --full) full=1 && shift ;;
    --no-build) build=0 && shift ;;
    *) break ;;
  esac
done

if [[ $build == 1 ]]; then
  ./scripts/build.sh -DZERO_WERROR="${ZERO_WERROR:-ON}"
fi

cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: //' || true)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(sse|ssse3|sse4|avx|fma|f16c)' | tr '\n' ' ' || true)
# The targets Highway offers here, from the library itself (its debug line at the first dispatch).
offered=$(env -u ZERO_SIMD_TARGET ZERO_LOG_LEVEL=debug build/bin/simd_target_test --gtest_also_run_disabled_tests \
  --gtest_filter=SimdTargetChild.DISABLED_Convert 2>&1 | sed -n 's/.*offered here: //p' | head -1 | tr -d ',')
if [[ -z "$offered" ]]; then
  echo "test-targets: could not read the SIMD targets from build/bin/simd_target_test" >&2
  exit 2
fi
best=${offered%% *}
fallback=${offered##* }
[[ -n "$targets" ]] || targets=$offered
targets=${targets//best/$best}
targets=${targets//fallback/$fallback}
echo "CPU: ${cpu:-unknown}"
echo "SIMD flags: $flags"
echo "Highway targets offered: $offered"

# The OpenBLAS kernel a run gets: OpenBLAS names it when OPENBLAS_VERBOSE=2 ("Core: Haswell"); read from the GPT
# model test, which calls sgemm.
# The env(1) arguments that choose kernel $1: none for "" (the environment's), the variables unset for auto.
blas_env() {
  case "$1" in
    "") ;;
    auto) echo "-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE" ;;
    *) echo "OPENBLAS_CORETYPE=$1" ;;
  esac
}
blas_core() {
  # shellcheck disable=SC2046  # blas_env's words are env's arguments
  env $(blas_env "$1") OPENBLAS_VERBOSE=2 build/bin/gpt_model_test --gtest_filter='GptOpsTest.Matmul*' 2>&1 |
    sed -n 's/^Core: //p' | head -1 || true  # a failing or missing test binary: no name, not an exit
}
native=""
if [[ -x build/bin/gpt_model_test ]]; then native=$(blas_core ""); fi

runs=()  # "target|blas" (blas empty: the environment's kernel; auto: OpenBLAS's own pick)
if [[ $full == 1 ]]; then
  for t in $targets; do runs+=("$t|"); done
elif [[ $product == 1 ]]; then
  for t in $targets; do for b in "" $blas; do runs+=("$t|$b"); done; done
else
  for t in $targets; do runs+=("$t|"); done
  for b in $blas; do runs+=("$best|$b"); done
fi

logs=build/test-targets
rm -rf "$logs"
mkdir -p "$logs"
summary=() rc=0 i=0
for run in "${runs[@]}"; do
  i=$((i + 1))
  t=${run%%|*} b=${run#*|}
  kernel=${native:-?} label=""
  if [[ $b == auto ]]; then
    if [[ -z "${OPENBLAS_CORETYPE:-}${OPENBLAS_L2_SIZE:-}" ]]; then
      echo "== run $i/${#runs[@]}: OpenBLAS's own pick: the environment sets no OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE, so the runs above had it; skipped"
      summary+=("$(printf '%-8s %-15s %s' "$t" auto "skipped: the environment's kernel is OpenBLAS's own")")
      continue
    fi
    own=$(blas_core auto)
    label="${own:-?}/own"
    kernel="$label (OpenBLAS's own pick; the environment's: ${OPENBLAS_CORETYPE:-its pick}, L2 ${OPENBLAS_L2_SIZE:-read})"
  elif [[ -n "$b" ]]; then
    kernel=$(blas_core "$b")
    if [[ "$kernel" != "$b" ]]; then
      echo "== run $i/${#runs[@]}: OPENBLAS_CORETYPE=$b is not a kernel OpenBLAS runs here (it chose '${kernel:-?}'); skipped"
      summary+=("$(printf '%-8s %-15s %s' "$t" "$b" "skipped: OpenBLAS chose '${kernel:-?}'")")
      continue
    fi
  fi
  echo "== run $i/${#runs[@]}: SIMD target $t, OpenBLAS kernel $kernel${b:+ ($(blas_env "$b"))}, on ${cpu:-unknown}"
  log=$logs/run$i-$t-${b:-native}.log
  start=$SECONDS
  status=0
  if [[ $full == 1 ]]; then
    ZERO_SIMD_TARGET=$t ./scripts/test.sh "$@" 2>&1 | tee "$log" || status=$?
  else
    # shellcheck disable=SC2046  # blas_env's words are env's arguments
    (cd build && env $(blas_env "$b") ZERO_SIMD_TARGET="$t" ctest -L tolerance -V -j "$(nproc)" \
      --timeout 900 "$@") >"$log" 2>&1 || status=$?
    # The failures and the summary ("Not Run (Disabled)": the child bodies and timing tests gtest lists disabled).
    grep -E '^[0-9]+: \[  FAILED  \]|tests passed|\(Failed\)|\*\*\*' "$log" |
      grep -v -e '^[0-9]*: \[  FAILED  \] [0-9]* test' -e 'Not Run (Disabled)' || true
  fi
  [[ $status == 0 ]] || rc=1
  counts=$(grep -Eo '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1 || true)
  summary+=("$(printf '%-8s %-15s %-50s %5d s' "$t" "${label:-$kernel}" "${counts:-no ctest summary (exit $status)}" $((SECONDS - start)))")
done

echo
echo "== runs on ${cpu:-unknown} (logs: $logs/)"
printf '%-8s %-15s %-50s %s\n' target OpenBLAS result time
printf '%s\n' "${summary[@]}"
if [[ $full == 0 ]]; then
  echo
  echo "== worst deviation per compared quantity over all runs (tests/support/tolerance.h), its bound, the run"
  # ctest -V prefixes each line with the test's number; the logs are named run<i>-<target>-<OpenBLAS kernel>.
  grep -H -o '\[tolerance\] .*' "$logs"/*.log | awk '
    { file = $0; sub(/:\[tolerance\].*/, "", file); sub(/.*\//, "", file); sub(/\.log$/, "", file)
      n = split($0, f, " "); bound = f[n]; worst = f[n - 2]
      key = $0; sub(/: worst [^ ]* bound [^ ]*$/, "", key); sub(/^.*\[tolerance\] /, "", key)
      if (!(key in w) || worst + 0 > w[key] + 0) { w[key] = worst; at[key] = file }
      b[key] = bound }
    END { for (k in w) printf "%-8s %-8s %-24s %s%s\n", w[k], b[k], at[k], k, (w[k] + 0 > b[k] + 0 ? "   ** over the bound" : "") }' |
    sort -k4
fi
exit "$rc"
