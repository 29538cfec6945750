// The CUDA compute tier: the NCCL engine's buffers in device memory, its operations as the stream-ordered
// kernels of zero/advanced/cuda_kernels.h on the trainer's compute stream (see shard/internal/compute.h).
#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "shard/internal/compute.h"
#include "zero/advanced/cuda_kernels.h"

namespace zero::internal {

namespace {

class CudaCompute final : public ComputeTier {
 public:
  CudaCompute(MemoryTracker* tracker, int device, cudaStream_t stream, bool owns_stream)
      : tracker_(tracker), device_(device), stream_(stream), owns_stream_(owns_stream) {}

  ~CudaCompute() override {
    UseDevice();
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);  // nothing may still use what is freed below
    workspace_.Reset();
    result_.Reset();
    result_host_.Reset();
    land_staging_.Reset();
    if (owns_stream_) (void)cudaStreamDestroy(stream_);
    if (copy_stream_ != nullptr) (void)cudaStreamDestroy(copy_stream_);
    cudaGetLastError();
  }

  Status Init() {
    UseDevice();
    // The copy stream of offload: D2H of reduced shards and H2D of updated parameters, driven by the engine's
    // copy-stream worker thread (offload/copy_stream.h), ordered after the compute stream by events.
    if (cudaError_t e = cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking); e != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat("the CUDA engine: creating its copy stream: ", cudaGetErrorString(e)));
    }
    Status s;
    workspace_ = Buffer::Device(tracker_, MemTag::kStaging, cuda::kGradStatsWorkspaceBytes, &s);
    if (s.ok()) result_ = Buffer::Device(tracker_, MemTag::kStaging, sizeof(GradStatsResult), &s);
    if (!s.ok()) return s;
    result_host_ = Buffer::Pinned(tracker_, MemTag::kStaging, sizeof(GradStatsResult));
    return absl::OkStatus();
  }

  bool device() const override { return true; }
  CUstream_st* stream() const override { return stream_; }
  Status status() const override {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  Buffer Alloc(MemTag tag, size_t bytes) override {
    UseDevice();
    Status s;
    Buffer b = Buffer::Device(tracker_, tag, bytes, &s);
    Keep(s, "");
    return b;
  }
  void Zero(void* p, size_t bytes) override {
    UseDevice();  // launches go to a stream of the current device
    if (bytes > 0) Keep(cudaMemsetAsync(p, 0, bytes, stream_), "zeroing a buffer");
  }
  void Convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n) override {
    UseDevice();  // launches go to a stream of the current device
    if (n > 0) Keep(cuda::Convert(src, sdt, dst, ddt, static_cast<size_t>(n), stream_), "");
  }
  void Land(const void* src, DType sdt, void* dst, DType ddt, int64_t n, bool add) override {
    UseDevice();  // launches go to a stream of the current device
    if (n <= 0) return;
    Keep(add ? cuda::Add(src, sdt, dst, ddt, static_cast<size_t>(n), stream_)
             : cuda::Convert(src, sdt, dst, ddt, static_cast<size_t>(n), stream_),
         "");
  }
  void AddGradStats(const void* g, DType dt, int64_t n) override {
    UseDevice();  // launches go to a stream of the current device
    if (n <= 0) return;
    Keep(cuda::GradStats(g, dt, static_cast<size_t>(n), 1.0f, result_.as<GradStatsResult>(),
                         /*accumulate=*/stats_pending_, workspace_.data(), stream_),
         "");
    stats_pending_ = true;
  }
  GradStatsResult TakeGradStatsSync() override {
    if (!std::exchange(stats_pending_, false)) return {};
    UseDevice();
    Keep(cudaMemcpyAsync(result_host_.data(), result_.data(), sizeof(GradStatsResult), cudaMemcpyDeviceToHost, stream_),
         "reading the gradient statistics");
    Keep(cudaStreamSynchronize(stream_), "reading the gradient statistics");
    return *result_host_.as<GradStatsResult>();
  }
  void Update(const ElementwiseOptimizer& opt, const ShardUpdate& u, int, size_t) override {
    UseDevice();  // launches go to a stream of the current device
    if (u.n == 0) return;
    if (const AdamParams* p = BuiltinAdamParams(opt)) {
      Keep(cuda::AdamStep(u, *p, stream_), "");
    } else if (const SgdParams* p = BuiltinSgdParams(opt)) {
      Keep(cuda::SgdStep(u, *p, stream_), "");
    } else {
      Keep(absl::UnimplementedError(absl::StrCat("optimizer \"", opt.Name(),
                                                 "\": a trainer's own ElementwiseOptimizer updates host memory; the "
                                                 "CUDA engine runs the built-in Adam/AdamW/SGD")),
           "");
    }
  }
  void StochasticRound(const float* src, uint16_t* dst, size_t n, uint64_t key, int64_t first_index) override {
    UseDevice();  // launches go to a stream of the current device
    Keep(cuda::StochasticRoundToBF16(src, dst, n, key, first_index, stream_), "");
  }
  void QuantizeInt8(const void* x, DType dt, int64_t n, int64_t block, int8_t* q, float* scales) override {
    UseDevice();  // launches go to a stream of the current device
    if (n > 0)
      Keep(cuda::QuantizeInt8(x, dt, static_cast<size_t>(n), static_cast<size_t>(block), q, scales, stream_), "");
  }
  void DequantizeInt8(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out, DType dt) override {
    UseDevice();  // launches go to a stream of the current device
    if (n > 0) {
      Keep(cuda::DequantizeInt8(q, scales, static_cast<size_t>(n), static_cast<size_t>(block), out, dt, stream_), "");
    }
  }
  void QuantizeInt4(const float* x, int64_t n, int64_t block, uint8_t* q, float* scales, float* scratch) override {
    UseDevice();  // launches go to a stream of the current device
    if (n > 0) {
      Keep(cuda::QuantizeInt4(x, static_cast<size_t>(n), static_cast<size_t>(block), q, scales, scratch, stream_), "");
    }
  }
  void DequantizeInt4(const uint8_t* q, const float* scales, int64_t n, int64_t block, float* out) override {
    UseDevice();  // launches go to a stream of the current device
    if (n > 0)
      Keep(cuda::DequantizeInt4(q, scales, static_cast<size_t>(n), static_cast<size_t>(block), out, stream_), "");
  }
  void LocoResidual(const float* y, const float* sent, float* e, float beta, int64_t n) override {
    UseDevice();  // launches go to a stream of the current device
    if (n > 0) Keep(cuda::LocoResidual(y, sent, e, beta, static_cast<size_t>(n), stream_), "");
  }
  void Divide(const float* src, float* dst, int64_t n, float divisor) override {
    UseDevice();  // launches go to a stream of the current device
    if (n > 0) Keep(cuda::Divide(src, dst, divisor, static_cast<size_t>(n), stream_), "");
  }

  void CopyToHostSync(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    UseDevice();
    Keep(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to the host");
    Keep(cudaStreamSynchronize(stream_), "copy to the host");
  }
  void CopyFromHostSync(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    UseDevice();
    Keep(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "copy from the host");
    Keep(cudaStreamSynchronize(stream_), "copy from the host");
  }
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    UseDevice();  // launches go to a stream of the current device
    if (bytes > 0) Keep(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "copy from the host");
  }
  std::function<void()> LandOnHostTask(const void* src, DType sdt, void* host_dst, DType ddt, int64_t n,
                                       bool add) override {
    UseDevice();  // launches go to a stream of the current device
    if (n <= 0) return [] {};
    cudaEvent_t ready = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ready, stream_);  // src is final once the stream gets here
    if (e != cudaSuccess) {
      Keep(e, "offload: recording the gradient's ready event");
      if (ready != nullptr) cudaEventDestroy(ready);
      return [] {};
    }
    return [this, ready, src, sdt, host_dst, ddt, n, add] {
      UseDevice();
      const size_t bytes = static_cast<size_t>(n) * DTypeSize(sdt);
      const bool direct = !add && sdt == ddt;  // store without conversion: straight into the host shard
      void* into = host_dst;
      if (!direct) {
        if (land_staging_.size() < bytes) {
          land_staging_.Reset();
          land_staging_ = Buffer::Pinned(tracker_, MemTag::kStaging, bytes);
        }
        into = land_staging_.data();
      }
      Keep(cudaStreamWaitEvent(copy_stream_, ready, 0), "offload: gradient copy to the host");
      Keep(cudaMemcpyAsync(into, src, bytes, cudaMemcpyDeviceToHost, copy_stream_),
           "offload: gradient copy to the host");
      Keep(cudaStreamSynchronize(copy_stream_), "offload: gradient copy to the host");
      cudaEventDestroy(ready);
      if (!direct) LandOnHost(into, sdt, host_dst, ddt, n, add);
    };
  }
  void CopyInOnCopyStream(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    UseDevice();
    Keep(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, copy_stream_), "offload: parameter copy back");
    Keep(cudaStreamSynchronize(copy_stream_), "offload: parameter copy back");
  }
  Status Join(Work& w) override { return w.WaitStream(stream_); }

 private:
  // Makes the tier's device current on the calling thread (the engine's, or the copy-stream worker's).
  void UseDevice() {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device_) Keep(cudaSetDevice(device_), "cudaSetDevice");
  }
  void Keep(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    cudaGetLastError();
    Keep(absl::InternalError(absl::StrCat("CUDA engine on device ", device_, ": ", what, ": CUDA error ",
                                          cudaGetErrorName(e), ": ", cudaGetErrorString(e))),
         "");
  }
  // Called from the engine's thread and from the copy-stream worker (offload tasks).
  void Keep(const Status& s, const char*) {
    if (s.ok()) return;
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = s;
  }

  MemoryTracker* const tracker_;
  const int device_;
  cudaStream_t stream_;
  const bool owns_stream_;
  cudaStream_t copy_stream_ = nullptr;
  mutable absl::Mutex mu_;
  Status status_ ABSL_GUARDED_BY(mu_);
  Buffer land_staging_;  // pinned; the copy-stream worker's only (its tasks run one at a time)
  Buffer workspace_;     // GradStats scratch
  Buffer result_;        // GradStats running result (device)
  Buffer result_host_;   // ... read back into pinned memory
  bool stats_pending_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<ComputeTier>> MakeCudaComputeTier(MemoryTracker* tracker, int device, CUstream_st* stream) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("the CUDA engine (an NCCL communicator): no CUDA device is visible");
  }
  if (device < 0) {  // the calling thread's current device
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat("the CUDA engine: cudaGetDevice: ", cudaGetErrorString(e)));
    }
  }
  if (device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("the CUDA engine: device ", device, " is not in [0, ", count, ")"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("the CUDA engine: cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
  }
  cudaStream_t s = stream;
  const bool own = s == nullptr;
  if (own) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat("the CUDA engine: creating its stream: ", cudaGetErrorString(e)));
    }
  }
  auto c = std::make_unique<CudaCompute>(tracker, device, s, own);
  ZERO_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<ComputeTier>(std::move(c));
}

}  // namespace zero::internal
