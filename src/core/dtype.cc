#include "zero/dtype.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/internal/convert_simd.h"

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

void ConvertBuffer(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    if (src != dst && n > 0) std::memcpy(dst, src, n * DTypeSize(st));
    return;
  }
  // Highway kernels, runtime-dispatched, bit-identical to dtype.h's scalar conversions (convert_simd.cc).
  internal::ConvertSimd(src, st, dst, dt, n);
}

}  // namespace zero
