#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (GPU tests skip themselves without a GPU), then checks
# the formatting. Warnings are errors here (-DZERO_WERROR=ON), always, so a local run fails where CI (.ci/run)
# would; ZERO_WERROR=OFF in the environment turns that off. ZERO_CHECK_FORMAT=0 skips the format check.
#   scripts/test.sh [ctest args]                      Release build in build/, every test, the format check
#   scripts/test.sh --sanitize address [ctest args]   ASan + UBSan build in build-asan/, every CPU test
#   scripts/test.sh --sanitize thread [ctest args]    TSan build in build-tsan/, the communicator, engine,
#                                                     checkpoint and offload tests (TSAN_TESTS below)
# The sanitizer runs build without CUDA, skip the format check (the plain run has it), and fail when any process
# (a test, or a rank or worker it started) wrote a sanitizer report, whatever that process's exit status was.
# docs/internals/sanitizers.md: what they cover and what they do not.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=none
if [[ "${1:-}" == "--sanitize" ]]; then
  sanitize=${2:-}
  shift
  [[ $# -gt 0 ]] && shift
fi

if [[ "$sanitize" == "none" ]]; then
  ./scripts/build.sh -DZERO_WERROR="${ZERO_WERROR:-ON}"
  rc=0
  (cd build && ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@") || rc=$?
  # After the tests, so a formatting slip does not hide their results; either one fails the run.
  if [[ "${ZERO_CHECK_FORMAT:-1}" != "0" ]]; then
    ./scripts/check-format.sh || rc=$((rc == 0 ? 1 : rc))
  fi
  exit "$rc"
fi

# TSan's executables: the communicator (collectives, store, Work/executor and failures, real processes under
# zero-run, launch variables, Split), the engine (host and emulated asynchronous compute tier, chunked
# collectives, desync detection, hybrid sharding, checkpoints and their background writes), offload (the NVMe tier's
# disk worker included), the I/O engine's thread pool and ring, and qgZ (its all-to-all hops on split
# communicators). tsan_absl_sync_test checks the annotations of Abseil's locks (tests/support/tsan_absl_sync.cc)
# themselves. ZERO_TSAN_TESTS="a_test b_test"
# runs other executables instead (docs/internals/sanitizers.md: what CI leaves out).
TSAN_TESTS=(tsan_absl_sync_test comm_collectives_test comm_store_test comm_failure_test comm_process_test
  comm_from_env_test comm_split_test engine_test async_tier_test chunked_collectives_test desync_test hybrid_test
  checkpoint_test async_checkpoint_test offload_unit_test offload_engine_test nvme_test io_test qgz_test)
if [[ -n "${ZERO_TSAN_TESTS:-}" ]]; then
  read -r -a TSAN_TESTS <<<"$ZERO_TSAN_TESTS"
fi

case "$sanitize" in
  address)
    dir=build-asan
    targets=()
    ;;
  thread)
    dir=build-tsan
    targets=("${TSAN_TESTS[@]}")
    ;;
  *)
    echo "test.sh: --sanitize takes address or thread, not '${sanitize}'" >&2
    exit 2
    ;;
esac

# -O1 -g1: line numbers in the reports, and less than half the compile time of -O2 -g under instrumentation
# (the tests' own code at -O0, tests/CMakeLists.txt; docs/internals/sanitizers.md). No -DNDEBUG: the assertions in
# third-party headers (nlohmann-json, Abseil) stay on.
ZERO_BUILD_DIR=$dir ZERO_BUILD_TARGETS="${targets[*]}" ./scripts/build.sh -DZERO_WERROR="${ZERO_WERROR:-ON}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DZERO_ENABLE_CUDA=OFF -DZERO_SANITIZE="$sanitize"

# Reports go to files, one per process, rather than to stderr: a rank that a test expects to fail (a survivor
# exits 1 by design) would otherwise hide its report in a log nobody reads. Any file there fails the run.
logs=$PWD/$dir/sanitizer-reports
rm -rf "$logs"
mkdir -p "$logs"
# Distinct exit codes, so a test that expects a child to exit 1 sees something else.
# Options given in the environment come last, so they win.
asan=log_path=$logs/asan:exitcode=86:detect_leaks=1:detect_stack_use_after_return=1
asan+=:check_initialization_order=1:strict_init_order=1
export ASAN_OPTIONS="$asan${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
ubsan=log_path=$logs/ubsan:exitcode=87:print_stacktrace=1:halt_on_error=1
export UBSAN_OPTIONS="$ubsan${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
tsan=log_path=$logs/tsan:exitcode=88:suppressions=$PWD/scripts/tsan.supp:second_deadlock_stack=1
export TSAN_OPTIONS="$tsan${TSAN_OPTIONS:+:$TSAN_OPTIONS}"

ctest_args=(--output-on-failure -j "$(nproc)" --timeout 900)
if [[ "$sanitize" == "thread" ]]; then
  ctest_args+=(-L "^($(
    IFS='|'
    echo "${TSAN_TESTS[*]}"
  ))\$")
fi
rc=0
(cd "$dir" && ctest "${ctest_args[@]}" "$@") || rc=$?

mapfile -t reports < <(find "$logs" -type f | sort)
if [[ ${#reports[@]} -gt 0 ]]; then
  for f in "${reports[@]}"; do
    echo "==== ${f#"$PWD"/}"
    cat "$f"
  done
  echo "test.sh: ${#reports[@]} sanitizer report(s) (--sanitize ${sanitize}), above" >&2
  rc=$((rc == 0 ? 1 : rc))
else
  echo "test.sh: no sanitizer reports (--sanitize ${sanitize})"
fi
exit "$rc"
