#!/usr/bin/env bash
# bench/gpu/make_bundle.sh — packs the GPU binaries of a build tree, with the shared libraries they need that a
# bare CUDA machine lacks (absl, hwy, Gloo, gtest, cudart...), into one small folder that bench/gpu/check.sh
# runs on the GPU machine (ZERO_BUILD_DIR=<bundle>). Run it here, after building, from the repository root:
#
#   cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release   # CMAKE_CUDA_ARCHITECTURES defaults to 90
#   cmake --build build-cuda --target cuda_test zero-bench-gpu zero-gpt [zero-bench-comm <other gpu tests>]
#   bench/gpu/make_bundle.sh build-cuda build-gpu-bundle
#
# The bundle holds bin/ (every executable of a test labelled `gpu`, zero-bench-gpu, zero-bench-comm, zero-gpt when
# built), lib/ (their non-system shared libraries), lib/compat/ (this machine's libstdc++/libgcc_s, used only
# if the GPU machine's are older), gpu_tests.txt and MANIFEST. libcuda (the driver), libnccl (218 MB) and
# libcublas/libcublasLt (570 MB) are not bundled: check.sh finds them on the GPU machine (system CUDA or the
# PyTorch image's nvidia-* wheels). The folder is also packed as DEST.tar.xz (~9 MB with zero-gpt and
# OpenBLAS, which alone is 35 MB unpacked): carry that, and pass it as ZERO_BUILD_DIR. `build-*` folders are git-ignored, so pass the bundle
# in the device run's `carry`.
set -euo pipefail
BUILD=${1:?usage: make_bundle.sh BUILD_DIR [DEST]}
DEST=${2:-build-gpu-bundle}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
[ -f "$BUILD/CMakeCache.txt" ] || { echo "make_bundle: $BUILD is not a CMake build tree" >&2; exit 2; }
# The device code generated (from the compile lines: the cache may not hold CMAKE_CUDA_ARCHITECTURES when the
# project's default "90-real;90-virtual" applied). The H200 needs sm_90.
ARCHS=$(grep -rho 'arch=compute_[0-9a-z]*,code=\[[a-z_0-9]*\]' "$BUILD"/build.ninja "$BUILD"/CMakeFiles/*.make \
          "$BUILD"/src/CMakeFiles/*/flags.make 2>/dev/null | sort -u | tr '\n' ' ' || true)
case "$ARCHS" in
  *sm_90*) ;;
  *) echo "make_bundle: $BUILD generates no sm_90 code ($ARCHS); configure with -DCMAKE_CUDA_ARCHITECTURES=90" >&2
     exit 2 ;;
esac

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib/compat"

# The executables of tests labelled gpu (ctest's JSON lists each discovered test's command).
ctest --test-dir "$BUILD" -L gpu --show-only=json-v1 2>/dev/null > "$DEST/.ctest.json" || true
python3 - "$DEST/.ctest.json" > "$DEST/.gpu_bins" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
seen = []
for t in data.get("tests", []):
    cmd = t.get("command") or []
    if cmd and cmd[0] not in seen:
        seen.append(cmd[0])
print("\n".join(seen))
PY
rm -f "$DEST/.ctest.json"
: > "$DEST/gpu_tests.txt"
while read -r exe; do
  [ -n "$exe" ] && [ -x "$exe" ] || continue
  cp "$exe" "$DEST/bin/"
  basename "$exe" >> "$DEST/gpu_tests.txt"
done < "$DEST/.gpu_bins"
rm -f "$DEST/.gpu_bins"
if [ ! -s "$DEST/gpu_tests.txt" ] && [ -x "$BUILD/bin/cuda_test" ]; then  # no ctest metadata: the known one
  cp "$BUILD/bin/cuda_test" "$DEST/bin/" && echo cuda_test > "$DEST/gpu_tests.txt"
fi
for exe in zero-bench-gpu zero-bench-comm zero-gpt; do
  [ -x "$BUILD/bin/$exe" ] && cp "$BUILD/bin/$exe" "$DEST/bin/"
done

# Shared libraries: everything ldd resolves except the C runtime, the driver and NCCL.
for exe in "$DEST"/bin/*; do
  ldd "$exe" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libnvidia*|libnccl*|libcublas*) ;;
    libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$DEST/lib/compat/" ;;
    *) cp -L "$lib" "$DEST/lib/" ;;
  esac
done

{
  echo "built_on: $(hostname) $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "build_dir: $BUILD"
  echo "cmake_build_type: $(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")"
  echo "cuda_architectures: $ARCHS"
  echo "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"
  echo "glibc: $(ldd --version | head -1)"
} > "$DEST/MANIFEST"
echo "bundle $DEST:"
cat "$DEST/MANIFEST"
echo "gpu test binaries: $(tr '\n' ' ' < "$DEST/gpu_tests.txt")"
ls "$DEST/bin"
du -sh "$DEST"
tar cJf "$DEST.tar.xz" -C "$(dirname "$DEST")" "$(basename "$DEST")"
ls -la "$DEST.tar.xz"
SIZE_KB=$(du -sk "$DEST.tar.xz" | cut -f1)
if [ "$SIZE_KB" -gt 40000 ]; then
  echo "WARNING: the packed bundle is $((SIZE_KB / 1024)) MiB; the device run carries at most 64 MiB with the tree" >&2
fi
