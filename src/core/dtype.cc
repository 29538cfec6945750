#include "zero/dtype.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "absl/strings/str_cat.h"

namespace zero {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

StatusOr<DType> ParseDType(std::string_view name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return DType::kF32;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", std::string(name), "\": expected one of fp32, fp16, bf16"));
}

namespace {
// Separate loops per type pair keep the bodies branch-free so GCC vectorizes them.
template <typename Load, typename Store>
void ConvertLoop(size_t n, Load load, Store store) {
  for (size_t i = 0; i < n; ++i) store(i, load(i));
}
}  // namespace

void ConvertBuffer(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    if (src != dst && n > 0) std::memcpy(dst, src, n * DTypeSize(st));
    return;
  }
  const auto* s32 = static_cast<const float*>(src);
  const auto* s16 = static_cast<const uint16_t*>(src);
  auto* d32 = static_cast<float*>(dst);
  auto* d16 = static_cast<uint16_t*>(dst);
  if (st == DType::kF32 && dt == DType::kBF16) {
    ConvertLoop(n, [&](size_t i) { return s32[i]; }, [&](size_t i, float v) { d16[i] = F32ToBF16(v); });
  } else if (st == DType::kF32 && dt == DType::kF16) {
    ConvertLoop(n, [&](size_t i) { return s32[i]; }, [&](size_t i, float v) { d16[i] = F32ToF16(v); });
  } else if (st == DType::kBF16 && dt == DType::kF32) {
    ConvertLoop(n, [&](size_t i) { return BF16ToF32(s16[i]); }, [&](size_t i, float v) { d32[i] = v; });
  } else if (st == DType::kF16 && dt == DType::kF32) {
    ConvertLoop(n, [&](size_t i) { return F16ToF32(s16[i]); }, [&](size_t i, float v) { d32[i] = v; });
  } else if (st == DType::kBF16 && dt == DType::kF16) {
    ConvertLoop(n, [&](size_t i) { return BF16ToF32(s16[i]); }, [&](size_t i, float v) { d16[i] = F32ToF16(v); });
  } else {  // f16 -> bf16
    ConvertLoop(n, [&](size_t i) { return F16ToF32(s16[i]); }, [&](size_t i, float v) { d16[i] = F32ToBF16(v); });
  }
}

}  // namespace zero
