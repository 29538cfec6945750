// checkpoint/crc32c.cc — CRC-32C in hardware where the CPU has SSE4.2, by table otherwise.
#include "checkpoint/internal/crc32c.h"

#include <array>
#include <cstring>

namespace zero::ckpt {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

// What n zero bytes do to the CRC register (raw: without the inversions at either end). The register's update is
// linear over GF(2) in the register and the data together, so the register after A then B, both of n bytes, is
// Shift_n(register after A) XOR (the register after B from 0): three independent chains over three lanes of a chunk
// join into one. Shift_n is built from the one-zero-bit step (shift right, fold in the polynomial), squared up to
// 8n bits, and applied as four byte tables.
struct ZeroShift {
  std::array<std::array<uint32_t, 256>, 4> table{};
  uint32_t operator()(uint32_t s) const {
    return table[0][s & 0xFF] ^ table[1][(s >> 8) & 0xFF] ^ table[2][(s >> 16) & 0xFF] ^ table[3][s >> 24];
  }
};

// A linear map of 32-bit registers as the images of the 32 unit vectors.
using Op = std::array<uint32_t, 32>;
constexpr uint32_t Apply(const Op& op, uint32_t s) {
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) r ^= ((s >> i) & 1) ? op[i] : 0;
  return r;
}

constexpr ZeroShift MakeZeroShift(size_t bytes) {
  Op op{};  // one zero bit
  for (int i = 0; i < 32; ++i) {
    const uint32_t e = uint32_t{1} << i;
    op[i] = (e & 1) ? (e >> 1) ^ kPoly : e >> 1;
  }
  for (size_t bits = 1; bits < 8 * bytes; bits *= 2) {  // bytes is a power of two: op becomes the map of 8·bytes bits
    Op sq{};
    for (int i = 0; i < 32; ++i) sq[i] = Apply(op, op[i]);
    op = sq;
  }
  ZeroShift z;
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) z.table[k][b] = Apply(op, b << (8 * k));
  }
  return z;
}

#if defined(__x86_64__)
// The crc32 instruction takes 3 cycles and starts one a cycle: one chain moves 8 bytes every 3 cycles (measured
// 20-30 ms for 124 MiB on the writer thread, bench/results/io.md). Three chains over three lanes of a chunk fill
// the pipeline (bench/results/host-kernels.md: CRC-32C against the read-only pass). Lanes of 8 KiB, then of 256
// bytes for what is left, then one chain for the last bytes; each join costs eight table reads.
constexpr size_t kLongLane = 8192;
constexpr size_t kShortLane = 256;

inline uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The raw register after chunks of three lanes of kLane bytes, as many as fit in n.
template <size_t kLane>
__attribute__((target("sse4.2"))) uint32_t ThreeLanes(uint32_t reg, const unsigned char*& p, size_t& n) {
  static constexpr ZeroShift shift = MakeZeroShift(kLane);
  while (n >= 3 * kLane) {
    uint64_t a = reg, b = 0, c = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      a = __builtin_ia32_crc32di(a, Load64(p + i));
      b = __builtin_ia32_crc32di(b, Load64(p + kLane + i));
      c = __builtin_ia32_crc32di(c, Load64(p + 2 * kLane + i));
    }
    reg = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(c);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  return reg;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t reg = ThreeLanes<kLongLane>(~crc, p, n);
  reg = ThreeLanes<kShortLane>(reg, p, n);
  uint64_t c = reg;
  for (; n >= 8; p += 8, n -= 8) c = __builtin_ia32_crc32di(c, Load64(p));
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}
const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

namespace internal {
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}
}  // namespace internal

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (kHaveSse42) return Crc32cHardware(crc, data, n);
#endif
  return internal::Crc32cPortable(crc, data, n);
}

}  // namespace zero::ckpt
