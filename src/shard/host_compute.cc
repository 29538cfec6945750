// The host compute tier: the Gloo engine computes in host DRAM (see shard/internal/compute.h).
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "core/internal/cuda_backend.h"
#include "core/internal/quantize.h"
#include "shard/internal/compute.h"
#include "zero/dtype.h"

namespace zero::internal {

void LocoResidualOnHost(const float* y, const float* sent, float* e, float beta, int64_t n) {
  const float keep = 1.0f - beta;
  for (int64_t i = 0; i < n; ++i) {
    const float next = beta * e[i] + keep * (y[i] - sent[i]);
    e[i] = std::isfinite(next) ? next : 0.0f;
  }
}

void DivideOnHost(const float* src, float* dst, int64_t n, float divisor) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] / divisor;
}

void LandOnHost(const void* src, DType sdt, void* dst, DType ddt, int64_t n, bool add) {
  if (n <= 0) return;
  if (!add) {
    ConvertBuffer(src, sdt, dst, ddt, n);
  } else if (ddt == DType::kF32 && sdt == DType::kF32) {
    float* d = static_cast<float*>(dst);
    const float* r = static_cast<const float*>(src);
    for (int64_t i = 0; i < n; ++i) d[i] += r[i];
  } else {
    for (int64_t i = 0; i < n; ++i) StoreFromF32(dst, ddt, i, LoadAsF32(dst, ddt, i) + LoadAsF32(src, sdt, i));
  }
}

namespace {

class HostCompute final : public ComputeTier {
 public:
  explicit HostCompute(MemoryTracker* tracker) : tracker_(tracker) {}

  bool device() const override { return false; }
  CUstream_st* stream() const override { return nullptr; }
  Status status() const override {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  // A failure is kept, as the CUDA tier keeps its errors: the engine is then done (every later call returns
  // it), which is what an out-of-memory in the middle of a step leaves (docs/internals/design.md, "Running out of
  // memory").
  Buffer Alloc(MemTag tag, size_t bytes) override {
    Status s;
    Buffer b = Buffer::Host(tracker_, tag, bytes, MemTier::kDevice, &s);
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      if (status_.ok()) status_ = s;
    }
    return b;
  }
  void Zero(void* p, size_t bytes) override {
    if (bytes > 0) std::memset(p, 0, bytes);
  }
  void Convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n) override {
    if (n > 0) ConvertBuffer(src, sdt, dst, ddt, n);
  }
  void Land(const void* src, DType sdt, void* dst, DType ddt, int64_t n, bool add) override {
    LandOnHost(src, sdt, dst, ddt, n, add);
  }
  void AddGradStats(const void* g, DType dt, int64_t n) override {
    if (n <= 0) return;
    const GradStatsResult r = GradStats(g, dt, static_cast<size_t>(n));
    stats_.sumsq += r.sumsq;
    stats_.nonfinite += r.nonfinite;
  }
  GradStatsResult TakeGradStatsSync() override { return std::exchange(stats_, GradStatsResult{}); }
  void Update(const ElementwiseOptimizer& opt, const ShardUpdate& u, int threads, size_t tile) override {
    ParallelUpdate(opt, u, threads, tile);
  }
  void StochasticRound(const float* src, uint16_t* dst, size_t n, uint64_t key, int64_t first_index) override {
    StochasticRoundToBF16(src, dst, n, key, first_index);
  }
  void QuantizeInt8(const void* x, DType dt, int64_t n, int64_t block, int8_t* q, float* scales) override {
    if (n > 0) internal::QuantizeInt8(x, dt, static_cast<size_t>(n), static_cast<size_t>(block), q, scales);
  }
  void DequantizeInt8(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out, DType dt) override {
    if (n > 0) internal::DequantizeInt8(q, scales, static_cast<size_t>(n), static_cast<size_t>(block), out, dt);
  }
  void QuantizeInt4(const float* x, int64_t n, int64_t block, uint8_t* q, float* scales, float*) override {
    if (n > 0) internal::QuantizeInt4(x, static_cast<size_t>(n), static_cast<size_t>(block), q, scales);
  }
  void DequantizeInt4(const uint8_t* q, const float* scales, int64_t n, int64_t block, float* out) override {
    if (n > 0) internal::DequantizeInt4(q, scales, static_cast<size_t>(n), static_cast<size_t>(block), out);
  }
  void LocoResidual(const float* y, const float* sent, float* e, float beta, int64_t n) override {
    LocoResidualOnHost(y, sent, e, beta, n);
  }
  void Divide(const float* src, float* dst, int64_t n, float divisor) override { DivideOnHost(src, dst, n, divisor); }

  void CopyToHostSync(void* host_dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(host_dst, src, bytes);
  }
  void CopyFromHostSync(void* dst, const void* host_src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
  }
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override { CopyFromHostSync(dst, host_src, bytes); }
  std::function<void()> LandOnHostTask(const void* src, DType sdt, void* host_dst, DType ddt, int64_t n,
                                       bool add) override {
    return [=] { LandOnHost(src, sdt, host_dst, ddt, n, add); };
  }
  void CopyInOnCopyStream(void* dst, const void* host_src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
  }
  Status Join(Work& w) override { return w.Wait(); }

 private:
  MemoryTracker* const tracker_;
  GradStatsResult stats_;
  mutable absl::Mutex mu_;
  Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ComputeTier> MakeHostCompute(MemoryTracker* tracker) { return std::make_unique<HostCompute>(tracker); }

namespace {
absl::Mutex g_factory_mu;
ComputeTierFactory* g_factory ABSL_GUARDED_BY(g_factory_mu) = nullptr;
}  // namespace

std::unique_ptr<ComputeTier> MakeGlooEngineCompute(MemoryTracker* tracker) {
  {
    absl::MutexLock lock(&g_factory_mu);
    if (g_factory != nullptr) return (*g_factory)(tracker);
  }
  return MakeHostCompute(tracker);
}

void SetGlooEngineComputeForTesting(ComputeTierFactory factory) {
  absl::MutexLock lock(&g_factory_mu);
  delete g_factory;
  g_factory = factory ? new ComputeTierFactory(std::move(factory)) : nullptr;
}

// The CUDA tier lives in zero::cuda (shard/cuda_compute.cc), which registers it (core/internal/cuda_backend.h).
StatusOr<std::unique_ptr<ComputeTier>> MakeCudaCompute(MemoryTracker* tracker, int device, CUstream_st* stream) {
  const CudaBackend* cuda = GetCudaBackend();
  if (cuda == nullptr) return CudaNotLinkedError("the CUDA engine (an NCCL communicator)");
  return cuda->make_compute(tracker, device, stream);
}

}  // namespace zero::internal
