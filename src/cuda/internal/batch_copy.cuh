// The per-thread body of BatchCopy (many (src, dst, bytes) segments in one launch), shared by the kernel in
// src/cuda/batch_copy.cu and the CPU emulation test.
#pragma once

#include "cuda/internal/device_math.cuh"

namespace zero::cuda::internal {

// Segments per launch. The table travels as a kernel parameter (8 KiB: kernel parameters up to 32 KiB are
// allowed since CUDA 12.1 on Volta and newer), so no device memory and no host->device copy is needed.
constexpr int kCopySegmentsPerLaunch = 256;
// Each block copies one tile at a time; tiles never span segments.
constexpr size_t kCopyTileBytes = 64 * 1024;

struct BatchCopyTable {
  const unsigned char* src[kCopySegmentsPerLaunch];
  unsigned char* dst[kCopySegmentsPerLaunch];
  size_t bytes[kCopySegmentsPerLaunch];
  size_t tile_begin[kCopySegmentsPerLaunch + 1];  // prefix sums of the segments' tile counts
  int count;
};

// The segment holding global tile `tile`: the largest s with tile_begin[s] <= tile (empty segments have no
// tiles, so they are never chosen for a tile inside another segment).
ZERO_HD int FindSegment(const BatchCopyTable& t, size_t tile) {
  int lo = 0, hi = t.count;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (t.tile_begin[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <class W>
ZERO_HD void CopyWords(unsigned char* dst, const unsigned char* src, size_t nw, unsigned t, unsigned nthreads) {
  W* d = reinterpret_cast<W*>(dst);
  const W* s = reinterpret_cast<const W*>(src);
  size_t i = t;
  // Four loads before four stores: without this the compiler must keep each load after the previous store
  // (src and dst may alias as far as it knows), leaving one load in flight per thread.
  for (; i + 3 * static_cast<size_t>(nthreads) < nw; i += 4 * static_cast<size_t>(nthreads)) {
    const W a = s[i];
    const W b = s[i + nthreads];
    const W c = s[i + 2 * nthreads];
    const W e = s[i + 3 * nthreads];
    d[i] = a;
    d[i + nthreads] = b;
    d[i + 2 * nthreads] = c;
    d[i + 3 * nthreads] = e;
  }
  for (; i < nw; i += nthreads) d[i] = s[i];
}

// Thread t of a block of `nthreads` copies its share of [src, src + len) to dst: a byte head until dst is
// 16-byte aligned, then 16-, 4- or 2-byte words as src's alignment allows, then a byte tail.
ZERO_HD void CopyTileThread(unsigned char* dst, const unsigned char* src, size_t len, unsigned t, unsigned nthreads) {
  size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (head > len) head = len;
  for (size_t i = t; i < head; i += nthreads) dst[i] = src[i];
  dst += head;
  src += head;
  len -= head;
  size_t done = 0;
  const uintptr_t sa = reinterpret_cast<uintptr_t>(src);
  if ((sa & 15) == 0) {
    CopyWords<uint4>(dst, src, len / 16, t, nthreads);
    done = len / 16 * 16;
  } else if ((sa & 3) == 0) {
    CopyWords<uint32_t>(dst, src, len / 4, t, nthreads);
    done = len / 4 * 4;
  } else if ((sa & 1) == 0) {
    CopyWords<uint16_t>(dst, src, len / 2, t, nthreads);
    done = len / 2 * 2;
  }
  for (size_t i = done + t; i < len; i += nthreads) dst[i] = src[i];
}

// Block `block` of `nblocks`, thread t of `nthreads`: grid-stride over the table's tiles.
ZERO_HD void BatchCopyThread(const BatchCopyTable& table, size_t block, size_t nblocks, unsigned t, unsigned nthreads) {
  const size_t total = table.tile_begin[table.count];
  for (size_t tile = block; tile < total; tile += nblocks) {
    const int s = FindSegment(table, tile);
    const size_t off = (tile - table.tile_begin[s]) * kCopyTileBytes;
    const size_t rest = table.bytes[s] - off;
    const size_t len = rest < kCopyTileBytes ? rest : kCopyTileBytes;
    CopyTileThread(table.dst[s] + off, table.src[s] + off, len, t, nthreads);
  }
}

}  // namespace zero::cuda::internal
