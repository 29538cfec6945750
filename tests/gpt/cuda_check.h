// tests/gpt/cuda_check.h — comparisons and tolerances shared by the GPT's CUDA tests: the host emulation
// (cuda_ops_emulation_test.cc, runs in CI) and the device test (cuda_ops_test.cc, label `gpu`).
//
// Tolerances, and why:
// - kBitwise: ops whose device arithmetic is the CPU's, operation for operation, with nothing nvcc could fuse
//   (a single add, or sums of float / double additions in the same order): residual, embeddings, bias gradient.
//   In the host emulation every body is bitwise (same code, same order, -ffp-contract=off).
// - GEMMs: per element |got - cpu| <= 2 * gamma(K + 2) * (sum_k |a||b| + |beta c0|), gamma(n) = n 2^-24 / (1 - n
//   2^-24): the classical worst-case bound of a K-term dot product in any summation order (plus alpha and beta
//   roundings), once for each side. It holds whatever order / blocking / FMA use cuBLAS and OpenBLAS pick, and
//   is still tiny next to any indexing error (which moves elements by O(|value|)).
// - kElementwiseRel (normwise, relative to max |cpu|): CUDA's expf / tanhf are within 2 ulp of the rounded
//   result, nvcc fuses a*b+c into FMAs, and the bodies chain a handful of such operations: a few ulp
//   (~1e-6 relative at worst); 1e-5 leaves a 10x margin. Normwise because GELU' and layernorm backward cancel
//   near zero, where elementwise relative error means nothing.
// - kAttentionRel: GEMMs around a softmax. The emulation, with its GEMMs summed in two orders unlike OpenBLAS's
//   (sequential, and reversed with FMAs), measures <= 5e-7 up to hs = 64, T = 128; 2e-5 leaves 40x for
//   cuBLAS's order and CUDA's expf.
// - whole model (Tiny GPT, two blocks, forward + backward): loss within kLossRel = 1e-5 relative, and each
//   parameter gradient tensor within kModelGradRel = 1e-4 of its own max |g|. Rounding differences compound
//   through ~40 ops and cancel in the layernorm backwards; the emulation (both GEMM orders) measures <= 1.5e-6,
//   a 70x margin. A wrong index or a missing accumulation moves a tensor by O(1).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpt/model.h"

namespace zero::gpt::cuda_testing {

inline constexpr double kElementwiseRel = 1e-5;
inline constexpr double kAttentionRel = 2e-5;
inline constexpr double kLossRel = 1e-5;
inline constexpr double kModelGradRel = 1e-4;

inline std::vector<float> RandomFloats(std::mt19937_64& rng, size_t n, float stddev, float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<int32_t> RandomIds(std::mt19937_64& rng, size_t n, int32_t bound) {
  std::uniform_int_distribution<int32_t> dist(0, bound - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every element identical (NaN matches NaN only where `want` is NaN: a poisoned, unwritten output fails).
inline ::testing::AssertionResult Bitwise(const float* got, const float* want, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const bool same = (std::isnan(got[i]) && std::isnan(want[i])) || Bits(got[i]) == Bits(want[i]);
    if (!same) {
      return ::testing::AssertionFailure() << "element " << i << " of " << n << ": " << got[i] << " vs " << want[i]
                                           << " (bits " << std::hex << Bits(got[i]) << " vs " << Bits(want[i]) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}
inline ::testing::AssertionResult Bitwise(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  return Bitwise(got.data(), want.data(), got.size());
}

// max |got - want| / max |want| (0 when both are all zeros); NaN / inf in got gives +inf.
inline double NormwiseError(const float* got, const float* want, size_t n, size_t* worst = nullptr) {
  double err = 0.0;
  double scale = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double e = std::isfinite(got[i]) ? std::abs(static_cast<double>(got[i]) - want[i]) : INFINITY;
    if (!(e <= err)) {
      err = e;
      if (worst != nullptr) *worst = i;
    }
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  if (err == 0.0) return 0.0;
  return scale == 0.0 ? INFINITY : err / scale;
}

// Normwise: max |got - want| <= rel * max |want|.
inline ::testing::AssertionResult NormwiseClose(const float* got, const float* want, size_t n, double rel) {
  size_t worst = 0;
  const double e = NormwiseError(got, want, n, &worst);
  if (e <= rel) return ::testing::AssertionSuccess() << "normwise error " << e;
  return ::testing::AssertionFailure() << "normwise error " << e << " > " << rel << "; worst element " << worst
                                       << " of " << n << ": " << got[worst] << " vs " << want[worst];
}
inline ::testing::AssertionResult NormwiseClose(const std::vector<float>& got, const std::vector<float>& want,
                                                double rel) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  return NormwiseClose(got.data(), want.data(), got.size(), rel);
}

// Row-major sum_k |op(A)[i, k]| |op(B)[k, j]| (+ |c0[i, j]| when c0 is given), in double: the scale of the GEMM
// error bound.
inline std::vector<double> AbsGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                                   const float* B, int64_t ldb, const float* c0 = nullptr, int64_t ldc0 = 0) {
  std::vector<double> out(static_cast<size_t>(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = c0 == nullptr ? 0.0 : std::abs(static_cast<double>(c0[i * ldc0 + j]));
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += std::abs(a * b);
      }
      out[i * N + j] = s;
    }
  }
  return out;
}

// |got - want| <= 2 gamma(K + 2) * scale elementwise (see the file comment), got / want row-major [M, ld].
inline ::testing::AssertionResult WithinGemmBound(const float* got, const float* want, const std::vector<double>& scale,
                                                  int64_t M, int64_t N, int64_t ld, int64_t K) {
  const double u = std::ldexp(1.0, -24);
  const double nu = static_cast<double>(K + 2) * u;
  const double tol = 2.0 * nu / (1.0 - nu);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      const double g = got[i * ld + j];
      const double w = want[i * ld + j];
      const double bound = tol * scale[i * N + j] + 1e-37;
      if (!(std::abs(g - w) <= bound)) {
        return ::testing::AssertionFailure() << "element (" << i << ", " << j << "): " << g << " vs " << w
                                             << ", |diff| " << std::abs(g - w) << " > bound " << bound;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// A model's parameter gradients / loss against the CPU model's, parameter by parameter (normwise per tensor).
// Returns the largest relative error seen (for the record) via *worst.
inline void ExpectModelMatches(const GptModel& cpu, float cpu_loss, float loss,
                               const std::vector<std::vector<float>>& grads, double* worst_grad_err) {
  const GptConfig& cfg = cpu.config();
  EXPECT_LE(std::abs(static_cast<double>(loss) - cpu_loss), kLossRel * std::abs(cpu_loss))
      << "loss " << loss << " vs CPU " << cpu_loss;
  double worst = 0.0;
  for (int u = 0; u < cpu.num_units(); ++u) {
    int64_t off = 0;
    for (const ParamSpec& spec : u == 0 ? RootParams(cfg) : BlockParams(cfg)) {
      const int64_t n = spec.numel();
      const float* want = cpu.grads(u) + off;
      const float* got = grads[u].data() + off;
      worst = std::max(worst, NormwiseError(got, want, n));
      EXPECT_TRUE(NormwiseClose(got, want, n, kModelGradRel)) << cpu.unit_names()[u] << "." << spec.name;
      off += n;
    }
  }
  if (worst_grad_err != nullptr) *worst_grad_err = worst;
}

}  // namespace zero::gpt::cuda_testing
