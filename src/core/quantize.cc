// core/quantize.cc — blockwise int8 quantization (core/internal/quantize.h).
//
// Highway compiles this file once per target (foreach_target.h re-includes it); HWY_DYNAMIC_DISPATCH picks the
// best the CPU supports. Per block, two passes: the integer maximum of |x|'s bits, then x · (127 / max) rounded to
// the nearest even integer (cvtps2dq under the default MXCSR, as std::nearbyint in the scalar reference) and
// narrowed to int8. The vector kernels run the coding pass of one block together with the maximum pass of the next:
// the coding pass reads its block from cache (a block is at most a few tens of KiB), so each element comes from
// memory once, and the memory stream does not pause while the core codes.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/quantize.cc"
// The same target set as core/convert_simd.cc (ForceSimdTargetForTest relies on it).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// defines: the per-target ops (must follow foreach_target.h)
#include "core/internal/convert_simd.h"
#include "core/internal/hwy_convert-inl.h"
#include "core/internal/quantize.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "zero/dtype.h"

#ifndef ZERO_CORE_QUANTIZE_SHARED_
#define ZERO_CORE_QUANTIZE_SHARED_
namespace zero::internal {

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kMinNormalBits = 0x00800000u;  // FLT_MIN
constexpr uint32_t kMaxFiniteBits = 0x7F7FFFFFu;  // FLT_MAX

// A block's scale (written out) and the factor its elements are multiplied by (0: the block quantizes to zeros),
// from the largest |x| bits of the block. For finite non-negative floats the bit patterns order as the values, and
// every NaN or infinity is above FLT_MAX's pattern.
struct BlockScale {
  float scale;
  float inv;
};
// A block whose factor 127 / max overflows (max below about 3.7e-37, subnormals included) quantizes to zeros like
// an all-zero one: a factor of infinity would code 0 · inf = NaN and saturate the rest, which the vector kernels'
// conversions and the device's would turn into different codes.
inline BlockScale ScaleOfBits(uint32_t max_bits) {
  if (max_bits > kMaxFiniteBits) return {std::numeric_limits<float>::quiet_NaN(), 0.0f};
  if (max_bits < kMinNormalBits) return {0.0f, 0.0f};
  const float m = BitsToFloat(max_bits);
  const float inv = 127.0f / m;
  if (inv > std::numeric_limits<float>::max()) return {0.0f, 0.0f};
  return {m / 127.0f, inv};
}

inline int8_t QuantizeOne(float x, float inv) {
  if (inv == 0.0f) return 0;
  const float r = std::nearbyint(x * inv);  // |x · inv| <= 127 rounds to at most 127
  return static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
}

}  // namespace zero::internal
#endif  // ZERO_CORE_QUANTIZE_SHARED_

HWY_BEFORE_NAMESPACE();
namespace zero {
namespace internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_SCALAR
// One-lane vectors: the scalar reference is this target's loop.
void QuantizeImpl(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales) {
  QuantizeInt8Scalar(x, t, n, block, q, scales);
}
void DequantizeImpl(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t) {
  DequantizeInt8Scalar(q, scales, n, block, out, t);
}
#else
// The largest |x| of elements [begin, end), as f32 bits. 16-bit types compare their own bits: |x|'s bit patterns
// order as the values in f16 and bf16 too (NaN and infinity above every finite one), and the conversion to f32 is
// exact and keeps that order, so converting only the largest gives the f32 maximum the scalar reference finds.
template <DType kT>
HWY_INLINE uint32_t MaxAbsBits(const void* x, size_t begin, size_t end) {
  if constexpr (kT == DType::kF32) {
    const hn::ScalableTag<uint32_t> du;
    const size_t L = hn::Lanes(du);
    const auto* p = static_cast<const uint32_t*>(x);
    const auto abs_mask = hn::Set(du, kAbsMask);
    auto vmax = hn::Zero(du);
    size_t i = begin;
    for (; i + L <= end; i += L) vmax = hn::Max(vmax, hn::And(hn::LoadU(du, p + i), abs_mask));
    uint32_t m = hn::GetLane(hn::MaxOfLanes(du, vmax));
    for (; i < end; ++i) m = std::max(m, p[i] & kAbsMask);
    return m;
  } else {
    const hn::ScalableTag<uint16_t> du;
    const size_t L = hn::Lanes(du);
    const auto* p = static_cast<const uint16_t*>(x);
    const auto abs_mask = hn::Set(du, uint16_t{0x7FFF});
    auto vmax = hn::Zero(du);
    size_t i = begin;
    for (; i + L <= end; i += L) vmax = hn::Max(vmax, hn::And(hn::LoadU(du, p + i), abs_mask));
    uint16_t m = hn::GetLane(hn::MaxOfLanes(du, vmax));
    for (; i < end; ++i) m = std::max<uint16_t>(m, p[i] & 0x7FFF);
    return FloatBits(LoadAsF32(&m, kT, 0));
  }
}

// Outputs of at least this many bytes are written with non-temporal stores (where aligned): they cannot stay in
// cache anyway, and an ordinary store first reads each line it writes (a read-for-ownership): for dequantize's f32
// half as much traffic again (measured: 0.40 -> 0.95 of memcpy). Smaller outputs stay in cache for whoever reads them
// next (the forward reads the gathered parameters at once; a shard's codes are sent at once). Quantize's codes:
// see StreamCodes4.
constexpr size_t kStreamBytes = size_t{4} << 20;

// x rounded to the nearest integer, ties to even. On x86 one cvtps2dq: under the default MXCSR it rounds as
// std::nearbyint does in the scalar reference. Highway 1.0.3's NearestInt adds a round and an overflow fix-up per
// vector (vrndscaleps, vcvttps2dq and compares) that products within ±127.5 never need. Outside x86, NearestInt.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
HWY_INLINE __m128i CvtNearest(__m128 v) { return _mm_cvtps_epi32(v); }
#if HWY_TARGET <= HWY_AVX2
HWY_INLINE __m256i CvtNearest(__m256 v) { return _mm256_cvtps_epi32(v); }
#endif
#if HWY_TARGET <= HWY_AVX3
HWY_INLINE __m512i CvtNearest(__m512 v) { return _mm512_cvtps_epi32(v); }
#endif
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF> > RoundToInt(DF, hn::Vec<DF> v) {
  return hn::Vec<hn::RebindToSigned<DF> >{CvtNearest(v.raw)};
}
#else
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF> > RoundToInt(DF, hn::Vec<DF> v) {
  return hn::NearestInt(v);
}
#endif

// f32 values of elements [i, i + Lanes(df)) for coding. f16 through vcvtph2ps alone where F16C exists
// (LoadF16Value): only finite blocks are coded, so the NaN payloads it does not keep never matter; LoadF16's fix-up
// for them, with the clamp below, measured 7.4 GiB/s against 11.5 (f32 in one run: 10.5 against 11.7).
template <DType kT, class DF>
HWY_INLINE hn::Vec<DF> LoadForCoding(DF df, const void* x, size_t i) {
  if constexpr (kT == DType::kF16) {
    return LoadF16Value(df, static_cast<const uint16_t*>(x) + i);
  } else {
    return LoadAsF32Vec<kT>(df, x, i);
  }
}

// The int8 codes of elements [i, i + Lanes(df)) of a finite block whose factor is inv.
template <DType kT, class DF>
HWY_INLINE hn::Vec<hn::Rebind<int8_t, DF> > CodeVec(DF df, const void* x, size_t i, hn::Vec<DF> inv) {
  return hn::DemoteTo(hn::Rebind<int8_t, DF>(), RoundToInt(df, hn::Mul(LoadForCoding<kT>(df, x, i), inv)));
}

// Codes of outputs of at least kStreamBytes are stored non-temporally on AVX-512, four vectors narrowed into one
// 64-byte line: the line is not read before it is written, and the codes would not stay in cache anyway. Measured
// in a throwaway loop (f32, with the L2 prefetch; medians of nine): 0.72 of memcpy against 0.66 with the same
// 64-byte stores cached and 0.68 with a 16-byte store per vector. The second version's streaming through a stack
// buffer was slower (0.45-0.50 against 0.57). Elsewhere, and for smaller outputs, the codes are stored as usual.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr bool kStreamCodes = true;
template <DType kT, class DF>
HWY_INLINE void StreamCodes4(DF df, const void* x, size_t i, hn::Vec<DF> inv, int8_t* q) {
  const size_t L = hn::Lanes(df);  // 16
  const __m512i lo =
      _mm512_castsi256_si512(_mm256_set_m128i(CodeVec<kT>(df, x, i + L, inv).raw, CodeVec<kT>(df, x, i, inv).raw));
  const __m256i hi = _mm256_set_m128i(CodeVec<kT>(df, x, i + 3 * L, inv).raw, CodeVec<kT>(df, x, i + 2 * L, inv).raw);
  _mm512_stream_si512(reinterpret_cast<__m512i*>(q + i), _mm512_inserti64x4(lo, hi, 1));
}
#else
constexpr bool kStreamCodes = false;
template <DType kT, class DF>
HWY_INLINE void StreamCodes4(DF, const void*, size_t, hn::Vec<DF>, int8_t*) {}
#endif

// Block b is coded from cache while the maximum of block b + 1 is read from memory, a vector of each per step:
// the memory stream does not stop while the core codes (the two passes one after the other left the memory idle
// during the coding pass, or, with the next block prefetched into L2 then, the core idle during the maximum pass).
// The coding pass needs no clamp to [-127, 127]: |x| <= max, so |x · (127 / max)| <= 127 · (1 + 2^-24) rounds to at
// most 127, and DemoteTo saturates besides.
template <DType kT>
HWY_NOINLINE void QuantizeLoop(const void* x, size_t n, size_t block, int8_t* q, float* scales) {
  constexpr size_t kElemBytes = kT == DType::kF32 ? 4 : 2;
  using TU = std::conditional_t<kT == DType::kF32, uint32_t, uint16_t>;  // the input's bits
  constexpr TU kMask = static_cast<TU>(kT == DType::kF32 ? kAbsMask : 0x7FFFu);
  const hn::ScalableTag<float> df;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const hn::Rebind<TU, decltype(df)> du;  // as many lanes as df: one maximum vector per coded vector
  const size_t L = hn::Lanes(df);
  const auto* p = static_cast<const TU*>(x);
  // The plan, read once per call (a prefetch past the end of the input is harmless: prefetches do not fault).
  const auto [l1, l2] = CurrentQuantizePrefetch();
  const char* ahead = static_cast<const char*>(x) + l1;
  const char* ahead_l2 = static_cast<const char*>(x) + l2;
  const auto mask = hn::Set(du, kMask);
  const bool stream = kStreamCodes && n >= kStreamBytes;
  uint32_t next_max = MaxAbsBits<kT>(x, 0, std::min(n, block));
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const size_t end = std::min(n, begin + block);
    const size_t next_end = std::min(n, end + block);
    const BlockScale s = ScaleOfBits(next_max);
    scales[b] = s.scale;
    auto vmax = hn::Zero(du);
    size_t i = begin, j = end;  // j: the next block's maximum pass
    // One vector of the next block's maximum, with the prefetches for the line it starts.
    auto max_step = [&] {
      if (j + L <= next_end) {
        if ((j * kElemBytes) % 64 == 0) {
          if (l1 != 0) __builtin_prefetch(ahead + j * kElemBytes, 0, 3);
          if (l2 != 0) __builtin_prefetch(ahead_l2 + j * kElemBytes, 0, 2);
        }
        vmax = hn::Max(vmax, hn::And(hn::LoadU(du, p + j), mask));
        j += L;
      }
    };
    if (s.inv == 0.0f) {
      std::fill(q + begin, q + end, int8_t{0});
    } else {
      const auto inv = hn::Set(df, s.inv);
      if (stream) {
        for (; i + L <= end && reinterpret_cast<uintptr_t>(q + i) % 64 != 0; i += L) {
          max_step();
          hn::StoreU(CodeVec<kT>(df, x, i, inv), d8, q + i);
        }
        if (reinterpret_cast<uintptr_t>(q + i) % 64 == 0) {
          for (; i + 4 * L <= end; i += 4 * L) {
            for (int k = 0; k < 4; ++k) max_step();
            StreamCodes4<kT>(df, x, i, inv, q);
          }
        }
      }
      for (; i + L <= end; i += L) {
        max_step();
        hn::StoreU(CodeVec<kT>(df, x, i, inv), d8, q + i);
      }
      for (; i < end; ++i) q[i] = QuantizeOne(LoadAsF32(x, kT, i), s.inv);
    }
    // The rest of the next block's maximum (all of it after a block of zeros or NaN), as MaxAbsBits.
    for (; j + L <= next_end; j += L) vmax = hn::Max(vmax, hn::And(hn::LoadU(du, p + j), mask));
    TU m = hn::GetLane(hn::MaxOfLanes(du, vmax));
    for (; j < next_end; ++j) m = std::max<TU>(m, p[j] & kMask);
    if constexpr (kT == DType::kF32) {
      next_max = m;
    } else {
      next_max = FloatBits(LoadAsF32(&m, kT, 0));  // see MaxAbsBits
    }
  }
  if (stream) hwy::FlushStream();  // the codes are visible before the caller (or another thread) reads them
}

// Dequantize to bf16 reads its codes this many bytes ahead.
constexpr size_t kDequantizePrefetchBytes = 2048;

// The values q[0..Lanes(df)) · scale in f32.
template <class DF>
HWY_INLINE hn::Vec<DF> CodesTimes(DF df, const int8_t* q, hn::Vec<DF> vs) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  return hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, q))), vs);
}

// bf16 bits of 2·Lanes(df) consecutive values q[k..] · scale, in order, as one full vector of u16, for a finite
// scale (no NaN among the products, so dtype.h's rounding is the carry alone). The codes are widened to 16 bits, so
// each 32-bit lane holds an even and an odd element: the even one rounds into the low half (shifted down), the odd
// one into the high half (masked), and no narrowing shuffle is needed.
template <class DF>
HWY_INLINE hn::Vec<hn::Repartition<uint16_t, DF> > DequantBF16Pairs(DF df, const int8_t* q, hn::Vec<DF> vs) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  const hn::Repartition<int16_t, DF> dw;
  const hn::Rebind<int8_t, decltype(dw)> d8w;
  const auto pairs = hn::BitCast(di, hn::PromoteTo(dw, hn::LoadU(d8w, q)));
  const auto even = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::ShiftRight<16>(hn::ShiftLeft<16>(pairs))), vs));
  const auto odd = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::ShiftRight<16>(pairs)), vs));
  const auto half = hn::Set(du, 0x7FFFu), one = hn::Set(du, 1u);
  const auto even_r = hn::ShiftRight<16>(hn::Add(hn::Add(even, half), hn::And(hn::ShiftRight<16>(even), one)));
  const auto odd_r =
      hn::And(hn::Add(hn::Add(odd, half), hn::And(hn::ShiftRight<16>(odd), one)), hn::Set(du, 0xFFFF0000u));
  return hn::BitCast(hn::Repartition<uint16_t, DF>(), hn::Or(even_r, odd_r));
}

// f16 bits of 2·Lanes(df) consecutive values q[k..] · scale, in order, as one full vector (AVX-512: two vcvtps2ph
// halves joined), for DequantizeLoop's streamed stores. Only where F16C exists; elsewhere f16 is not streamed.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && !defined(HWY_DISABLE_F16C)
constexpr bool kStreamF16 = true;
template <class DF>
HWY_INLINE hn::Vec<hn::Repartition<uint16_t, DF> > DequantF16Halves(DF df, const int8_t* q, hn::Vec<DF> vs) {
  const __m256i lo = _mm512_cvtps_ph(CodesTimes(df, q, vs).raw, _MM_FROUND_TO_NEAREST_INT);
  const __m256i hi = _mm512_cvtps_ph(CodesTimes(df, q + hn::Lanes(df), vs).raw, _MM_FROUND_TO_NEAREST_INT);
  return hn::Vec<hn::Repartition<uint16_t, DF> >{_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)};
}
#else
constexpr bool kStreamF16 = false;
template <class DF>
HWY_INLINE hn::Vec<hn::Repartition<uint16_t, DF> > DequantF16Halves(DF, const int8_t*, hn::Vec<DF>) {
  return hn::Zero(hn::Repartition<uint16_t, DF>());
}
#endif

template <DType kT>
HWY_NOINLINE void DequantizeLoop(const int8_t* q, const float* scales, size_t n, size_t block, void* out) {
  const hn::ScalableTag<float> df;
  const hn::Repartition<uint16_t, decltype(df)> dw;  // a full vector of 16-bit outputs: 2·Lanes(df)
  const size_t L = hn::Lanes(df);
  constexpr size_t kOutBytes = kT == DType::kF32 ? 4 : 2;
  // Large outputs are streamed (non-temporal stores, see kStreamBytes) in whole vectors: f32 on every target, from
  // the first vector boundary of each block; 16-bit outputs on targets that build one full vector per 2·Lanes(df)
  // codes (bf16 on every target, f16 on AVX-512), in blocks whose outputs start on that vector's boundary, as the
  // engine's do (shards of multiples of 32 elements in 64-byte aligned buffers), with the codes prefetched.
  // Measured, AVX-512, 64-byte aligned buffers, one run of three rounds: bf16 0.84-0.86 of memcpy streamed against
  // 0.64-0.69 stored as usual, f16 0.85-0.88 against 0.59-0.64. Outputs 16 bytes past a line (malloc's) measured
  // slower streamed (bf16 0.55-0.58 against 0.61-0.62: each block's unaligned ends mix ordinary and streamed stores
  // in one line), so such blocks are stored as usual.
  const bool stream = (kT != DType::kF16 || kStreamF16) && n * kOutBytes >= kStreamBytes;
  const size_t per_store = kT == DType::kF32 ? L : 2 * L;  // outputs per streamed vector
  const size_t align = per_store * kOutBytes;
  auto* const o = static_cast<uint8_t*>(out);
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const size_t end = std::min(n, begin + block);
    const float scale = scales[b];
    const auto vs = hn::Set(df, scale);
    size_t i = begin;
    if constexpr (kT == DType::kF32) {
      if (stream) {
        // One at a time up to the first element on a vector boundary, then whole vectors streamed.
        for (; i < end && reinterpret_cast<uintptr_t>(o + i * kOutBytes) % align != 0; ++i)
          StoreFromF32(out, kT, i, static_cast<float>(q[i]) * scale);
        if (reinterpret_cast<uintptr_t>(o + i * kOutBytes) % align == 0) {
          for (; i + L <= end; i += L) hn::Stream(CodesTimes(df, q + i, vs), df, reinterpret_cast<float*>(o) + i);
        }
      }
    } else {
      // 16-bit outputs as full vectors of 2·Lanes(df) values (a NaN scale's block takes the loops below:
      // dtype.h's NaN rounding is StoreBF16's, not DequantBF16Pairs'): bf16 as the pairs, streamed or cached (no
      // narrowing shuffle: in cache 19.7 GiB/s against 14.2; the codes read kDequantizePrefetchBytes ahead: one
      // run, 0.51 of memcpy before, 0.62 with the prefetch alone, 0.65 with both); f16 only where streamed.
      const bool streamed = stream && reinterpret_cast<uintptr_t>(o + begin * kOutBytes) % align == 0;
      if (std::isfinite(scale) && (kT == DType::kBF16 || streamed)) {
        auto* const o16 = static_cast<uint16_t*>(out);
        for (; i + 2 * L <= end; i += 2 * L) {
          if (i % 64 == 0) __builtin_prefetch(q + i + kDequantizePrefetchBytes, 0, 3);
          hn::Vec<decltype(dw)> v;
          if constexpr (kT == DType::kBF16) {
            v = DequantBF16Pairs(df, q + i, vs);
          } else {
            v = DequantF16Halves(df, q + i, vs);
          }
          if (streamed) {
            hn::Stream(v, dw, o16 + i);
          } else {
            hn::StoreU(v, dw, o16 + i);
          }
        }
      }
    }
    for (; i + L <= end; i += L) StoreF32VecAs<kT>(df, CodesTimes(df, q + i, vs), out, i);
    for (; i < end; ++i) StoreFromF32(out, kT, i, static_cast<float>(q[i]) * scale);
  }
  if (stream) hwy::FlushStream();  // the values are visible before the caller (or another thread) reads them
}

void QuantizeImpl(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales) {
  switch (t) {
    case DType::kF32: return QuantizeLoop<DType::kF32>(x, n, block, q, scales);
    case DType::kF16: return QuantizeLoop<DType::kF16>(x, n, block, q, scales);
    case DType::kBF16: return QuantizeLoop<DType::kBF16>(x, n, block, q, scales);
  }
}
void DequantizeImpl(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t) {
  switch (t) {
    case DType::kF32: return DequantizeLoop<DType::kF32>(q, scales, n, block, out);
    case DType::kF16: return DequantizeLoop<DType::kF16>(q, scales, n, block, out);
    case DType::kBF16: return DequantizeLoop<DType::kBF16>(q, scales, n, block, out);
  }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace internal
}  // namespace zero
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace zero::internal {

HWY_EXPORT(QuantizeImpl);

// Measured with the f32 kernel on blocks of 4096, 512 MiB, one thread, ratios to memcpy (bench/results/zeropp.md):
// on the Intel Xeon VMs the hardware prefetchers alone left the single stream far short of the memory's rate (L1
// alone, one run: 1 KiB ahead 0.58, 2 KiB 0.65, 4 KiB 0.70, 8 KiB 0.68; none, another run: 0.35), and an L2
// prefetch 16 KiB ahead added about 0.04 (a throwaway AVX-512 loop, medians of nine: 0.68 against 0.64). On an
// AMD EPYC (Zen 5) that plan reached means of 0.77 and 0.79 of memcpy in two runs of the bench's QuantizePlan side by
// side, L1 alone 8 KiB ahead 0.85 and 0.81 (none at all 0.68 and 0.72; each level's part and three more comparisons,
// all favouring it by 0.01-0.13: bench/results/zeropp.md). Other AMD cores are not measured; they take Zen 5's plan.
QuantizePrefetch DefaultQuantizePrefetch() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // may run before the constructors that would initialize what __builtin_cpu_is reads
  if (__builtin_cpu_is("amd")) return kQuantizePrefetchL1Only;
#endif
  return kQuantizePrefetchL1L2;
}

namespace {
std::atomic<size_t>* QuantizePrefetchSlots() {
  static const QuantizePrefetch initial = DefaultQuantizePrefetch();
  static std::atomic<size_t> slots[2] = {initial.l1_bytes, initial.l2_bytes};
  return slots;
}
}  // namespace

QuantizePrefetch CurrentQuantizePrefetch() {
  return {.l1_bytes = QuantizePrefetchSlots()[0].load(), .l2_bytes = QuantizePrefetchSlots()[1].load()};
}

void SetQuantizePrefetch(const QuantizePrefetch& plan) {
  QuantizePrefetchSlots()[0].store(plan.l1_bytes);
  QuantizePrefetchSlots()[1].store(plan.l2_bytes);
}
HWY_EXPORT(DequantizeImpl);

void QuantizeInt8Scalar(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales) {
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const size_t end = std::min(n, begin + block);
    uint32_t max_bits = 0;
    for (size_t i = begin; i < end; ++i) max_bits = std::max(max_bits, FloatBits(LoadAsF32(x, t, i)) & kAbsMask);
    const BlockScale s = ScaleOfBits(max_bits);
    scales[b] = s.scale;
    for (size_t i = begin; i < end; ++i) q[i] = QuantizeOne(LoadAsF32(x, t, i), s.inv);
  }
}

void DequantizeInt8Scalar(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t) {
  for (size_t i = 0; i < n; ++i) StoreFromF32(out, t, i, static_cast<float>(q[i]) * scales[i / block]);
}

void QuantizeInt8(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales) {
  if (n == 0) return;
  ApplySimdTargetFromEnv();  // ZERO_SIMD_TARGET, before the process's first dispatch
  HWY_DYNAMIC_DISPATCH(QuantizeImpl)(x, t, n, block, q, scales);
}

void DequantizeInt8(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t) {
  if (n == 0) return;
  ApplySimdTargetFromEnv();
  HWY_DYNAMIC_DISPATCH(DequantizeImpl)(q, scales, n, block, out, t);
}

}  // namespace zero::internal
#endif  // HWY_ONCE
