#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (GPU tests skip themselves without a GPU), then checks
# the formatting. Warnings are errors here (-DZERO_WERROR=ON), always, so a local run fails where CI (.ci/run)
# would; ZERO_WERROR=OFF in the environment turns that off. ZERO_CHECK_FORMAT=0 skips the format check.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh -DZERO_WERROR="${ZERO_WERROR:-ON}"
rc=0
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@") || rc=$?
# After the tests, so a formatting slip does not hide their results; either one fails the run.
if [[ "${ZERO_CHECK_FORMAT:-1}" != "0" ]]; then
  ./scripts/check-format.sh || rc=$((rc == 0 ? 1 : rc))
fi
exit "$rc"
