#!/usr/bin/env bash
# Installs zero's build and test dependencies from Debian 12 packages. Idempotent: packages already present are
# skipped, and apt-get runs only when something is missing. Set ZERO_DEPS_EXTRA="pkg ..." for more.
#   --bench   also install what the benchmarks compare against (python3-torch).
#   --fuzz    also install clang and its runtimes for scripts/fuzz.sh (libFuzzer, ASan, UBSan live in
#             libclang-rt-14-dev, which clang-14 only recommends); the build and the corpus replay tests need neither.
set -euo pipefail

pkgs=(
  cmake g++ make ninja-build ccache pkg-config
  clang-format         # scripts/check-format.sh (Debian 12: clang-format 14)
  libgloo-dev          # collectives on host memory (TCP transport, Hash/File/Redis stores)
  libabsl-dev          # absl::Status / StatusOr, strings, time, synchronization
  nlohmann-json3-dev   # config parsing
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libhwy-dev           # portable SIMD with runtime dispatch for the CPU optimizer
  libopenblas-dev      # matrix products in the reference GPT trainer
  liburing-dev         # the I/O engine's io_uring backend (src/io); without it CMake builds the thread-pool backend only
  python3-numpy        # tests/checkpoint: an independent safetensors reader checks zero-ckpt export
  gnuplot-nox          # zero-demo's picture (its pngcairo terminal needs no X server)
  libtorch-dev         # the optional zero::torch component (zero/torch.h), its tests and examples/torch_lm;
                       # CPU-only libtorch 1.13. A build without it skips them (ZERO_ENABLE_TORCH=AUTO).
)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(python3-torch)
fi
if [[ "${1:-}" == "--fuzz" ]]; then
  pkgs+=(clang libclang-rt-14-dev)
fi
# shellcheck disable=SC2206
pkgs+=(${ZERO_DEPS_EXTRA:-})

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
