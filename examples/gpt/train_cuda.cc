#include "train_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data.h"
#include "gpt/cuda/model_cuda.h"
#include "model.h"
#include "train_common.h"
#include "zero/advanced/cuda_kernels.h"
#include "zero/engine.h"

namespace zero::gpt {

namespace {

namespace gc = ::zero::gpt::cuda;
using internal::GatherReports;

Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(
      absl::StrCat("zero-gpt (CUDA): ", what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}
Status Cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("zero-gpt (CUDA): ", what, ": cuBLAS status ", static_cast<int>(s)));
}

// The stream and cuBLAS handle of the run (the engine's compute stream).
class DeviceContext {
 public:
  ~DeviceContext() {
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  Status Init() {
    ZERO_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the stream"));
    ZERO_RETURN_IF_ERROR(Cublas(cublasCreate(&handle_), "cublasCreate"));
    return Cublas(cublasSetStream(handle_, stream_), "cublasSetStream");
  }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t handle() const { return handle_; }

 private:
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
};

// Under fp16/bf16: an fp32 copy of a unit's 16-bit weights (converted on the device) and an fp32 gradient
// buffer whose contents, times the loss scale, are added into the 16-bit gradient at Flush — the device
// version of train.cc's UnitWork. fp32: the views themselves.
class DeviceUnitWork {
 public:
  DeviceUnitWork(MemoryTracker* tracker, int64_t numel, DType dtype, const DeviceContext* ctx)
      : numel_(numel), dtype_(dtype), ctx_(ctx) {
    if (dtype_ != DType::kF32) {
      w_ = Buffer::Device(tracker, MemTag::kStaging, numel * 4, &status_);
      if (status_.ok()) g_ = Buffer::Device(tracker, MemTag::kStaging, numel * 4, &status_);
    }
  }
  const Status& status() const { return status_; }
  StatusOr<const float*> Weights(const UnitScope& s) {
    if (dtype_ == DType::kF32) return static_cast<const float*>(s.param_base());
    ZERO_RETURN_IF_ERROR(zero::cuda::Convert(s.param_base(), dtype_, w_.data(), DType::kF32, numel_, ctx_->stream()));
    return w_.as<const float>();
  }
  StatusOr<float*> Grads(const UnitScope& s) {
    if (dtype_ == DType::kF32) return static_cast<float*>(s.grad_base());
    ZERO_RETURN_IF_ERROR(Cuda(cudaMemsetAsync(g_.data(), 0, numel_ * 4, ctx_->stream()), "zeroing gradients"));
    return g_.as<float>();
  }
  Status Flush(const UnitScope& s, double loss_scale) {
    if (dtype_ == DType::kF32) return absl::OkStatus();
    if (loss_scale != 1.0) {
      const float scale = static_cast<float>(loss_scale);
      ZERO_RETURN_IF_ERROR(Cublas(cublasSscal(ctx_->handle(), static_cast<int>(numel_), &scale, g_.as<float>(), 1),
                                  "scaling gradients"));
    }
    return zero::cuda::Add(g_.data(), DType::kF32, s.grad_base(), dtype_, numel_, ctx_->stream());
  }

 private:
  int64_t numel_;
  DType dtype_;
  const DeviceContext* ctx_;
  Status status_;
  Buffer w_, g_;
};

}  // namespace

StatusOr<TrainResult> TrainRankCuda(const Config& config, std::shared_ptr<Communicator> comm,
                                    const TrainOptions& options, const std::function<void(const StepLog&)>& on_step,
                                    bool collect_final_params) {
  if (comm->backend() != Backend::kNccl) {
    return absl::InvalidArgumentError("TrainRankCuda: the communicator must be NCCL (device memory)");
  }
  if (options.recompute) {
    return absl::InvalidArgumentError("--recompute: activation recomputation is not offered on the CUDA path yet");
  }
  ZERO_ASSIGN_OR_RETURN(GptConfig mc, GptConfig::FromName(options.model));
  const int T = options.seq > 0 ? options.seq : mc.max_seq;
  if (T > mc.max_seq) {
    return absl::InvalidArgumentError(absl::StrCat("--seq ", T, " exceeds the model's max_seq ", mc.max_seq));
  }
  const int rank = comm->rank(), world = comm->world_size();
  if (options.device >= 0) ZERO_RETURN_IF_ERROR(Cuda(cudaSetDevice(options.device), "cudaSetDevice"));
  DeviceContext ctx;
  ZERO_RETURN_IF_ERROR(ctx.Init());

  EngineOptions eopt;
  eopt.cuda_stream = ctx.stream();
  eopt.local_world_size = std::max(1, options.local_world_size);
  ZERO_ASSIGN_OR_RETURN(internal::GptRun run, internal::OpenRun(config, comm, eopt, mc, options));
  const std::unique_ptr<Engine>& engine = run.engine;
  const int B = run.micro_batch, ga = run.accumulation_steps;
  const DType dtype = run.dtype;
  const internal::GptUnits& units = run.units;
  const UnitId root = units.root;
  const std::vector<UnitId>& blocks = units.blocks;
  ByteDataset& data = run.data;

  // Activations: one device allocation for the whole model at this (B, T), reported in the device tier.
  MemoryTracker& tracker = engine->memory_tracker();
  ZERO_ASSIGN_OR_RETURN(gc::DeviceActivations acts, gc::DeviceActivations::Create(mc, B, T));
  tracker.Add(MemTier::kDevice, MemTag::kActivations, static_cast<int64_t>(acts.bytes()));
  struct Untrack {
    MemoryTracker& t;
    int64_t bytes;
    ~Untrack() { t.Sub(MemTier::kDevice, MemTag::kActivations, bytes); }
  } untrack{tracker, static_cast<int64_t>(acts.bytes())};
  // Tokens and targets of a micro-step (device), and the per-micro-step losses read back after Step.
  Status buf_status;
  Buffer d_tokens = Buffer::Device(&tracker, MemTag::kActivations, sizeof(int32_t) * B * T, &buf_status);
  Buffer d_targets;
  if (buf_status.ok()) d_targets = Buffer::Device(&tracker, MemTag::kActivations, sizeof(int32_t) * B * T, &buf_status);
  Buffer d_loss;
  if (buf_status.ok()) d_loss = Buffer::Device(&tracker, MemTag::kStaging, sizeof(float), &buf_status);
  ZERO_RETURN_IF_ERROR(buf_status);
  Buffer losses = Buffer::Pinned(&tracker, MemTag::kStaging, sizeof(float) * ga);
  DeviceUnitWork root_work(&tracker, UnitNumel(RootParams(mc)), dtype, &ctx);
  DeviceUnitWork block_work(&tracker, UnitNumel(BlockParams(mc)), dtype, &ctx);
  ZERO_RETURN_IF_ERROR(root_work.status());
  ZERO_RETURN_IF_ERROR(block_work.status());
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  const cudaStream_t stream = ctx.stream();
  const cublasHandle_t h = ctx.handle();

  TrainResult result;
  result.params = engine->num_params();
  result.first_step = run.first_step;
  int64_t samples = run.first_sample;  // the data cursor (ByteDataset): global samples trained before `step`
  for (int64_t step = run.first_step; step < options.steps; ++step) {
    internal::StepClock started;
    started.save_in_flight = engine->save_in_flight();
    for (int m = 0; m < ga; ++m) {
      data.Batch(samples + (static_cast<int64_t>(m) * world + rank) * B, B, T, tokens.data(), targets.data());
      // From pageable memory: the copy has read the host vectors when it returns, so they may be refilled.
      ZERO_RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(d_tokens.data(), tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice, stream),
               "copying tokens"));
      ZERO_RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(d_targets.data(), targets.data(), targets.size() * 4, cudaMemcpyHostToDevice, stream),
               "copying targets"));
      const auto* tok = d_tokens.as<const int32_t>();
      const auto* tgt = d_targets.as<const int32_t>();
      ZERO_ASSIGN_OR_RETURN(UnitScope rs, engine->Backward(root));  // root: whole forward + backward
      ZERO_ASSIGN_OR_RETURN(const float* rwp, root_work.Weights(rs));
      ZERO_ASSIGN_OR_RETURN(float* rgp, root_work.Grads(rs));
      const RootWeights rw = RootWeightsFromFlat(mc, rwp);
      const RootGrads rg = RootGradsFromFlat(mc, rgp);
      ZERO_RETURN_IF_ERROR(gc::EmbeddingForward(mc, rw, tok, B, T, acts.x, stream));
      for (int l = 0; l < mc.layers; ++l) {
        ZERO_ASSIGN_OR_RETURN(UnitScope s, engine->Forward(blocks[l]));
        ZERO_ASSIGN_OR_RETURN(const float* wp, block_work.Weights(s));
        ZERO_RETURN_IF_ERROR(
            gc::BlockForward(mc, BlockWeightsFromFlat(mc, wp), acts.x, acts.x, &acts.blocks[l], h, stream));
        ZERO_RETURN_IF_ERROR(s.Close());
      }
      ZERO_RETURN_IF_ERROR(gc::HeadForward(mc, rw, acts.x, tgt, &acts.head, h, stream));
      ZERO_RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(losses.as<float>() + m, acts.head.loss, sizeof(float), cudaMemcpyDeviceToHost, stream),
               "reading the loss"));
      ZERO_RETURN_IF_ERROR(gc::HeadBackward(mc, rw, rg, &acts.head, acts.dx, h, stream));
      for (int l = mc.layers - 1; l >= 0; --l) {
        ZERO_ASSIGN_OR_RETURN(UnitScope s, engine->Backward(blocks[l]));
        ZERO_ASSIGN_OR_RETURN(const float* wp, block_work.Weights(s));
        ZERO_ASSIGN_OR_RETURN(float* gp, block_work.Grads(s));
        ZERO_RETURN_IF_ERROR(gc::BlockBackward(mc, BlockWeightsFromFlat(mc, wp), BlockGradsFromFlat(mc, gp),
                                               acts.blocks[l], acts.dx, acts.dx, &acts.scratch, h, stream));
        ZERO_RETURN_IF_ERROR(block_work.Flush(s, engine->loss_scale()));
        ZERO_RETURN_IF_ERROR(s.Close());
      }
      ZERO_RETURN_IF_ERROR(gc::EmbeddingBackward(mc, rg, tok, B, T, acts.dx, stream));
      ZERO_RETURN_IF_ERROR(root_work.Flush(rs, engine->loss_scale()));
      ZERO_RETURN_IF_ERROR(rs.Close());
    }
    ZERO_ASSIGN_OR_RETURN(StepResult r, engine->Step());
    ZERO_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "end of step"));  // the losses have landed
    double loss_sum = 0;
    for (int m = 0; m < ga; ++m) loss_sum += losses.as<float>()[m];
    float loss = static_cast<float>(loss_sum / ga);
    if (world > 1) {  // the mean over ranks, through device memory (NCCL)
      ZERO_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(d_loss.data(), &loss, 4, cudaMemcpyHostToDevice, stream), "loss"));
      CommLabel label(comm.get(), "zero-gpt: mean loss");
      ZERO_RETURN_IF_ERROR(comm->AllReduce(d_loss.data(), 1, DType::kF32, ReduceOp::kAvg, stream).Wait());
      ZERO_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(&loss, d_loss.data(), 4, cudaMemcpyDeviceToHost, stream), "loss"));
      ZERO_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "loss"));
    }
    samples += static_cast<int64_t>(B) * world * ga;
    internal::RecordStep(step, loss, r, started, static_cast<double>(B) * T * world * ga, samples, rank, on_step,
                         &result);
    ZERO_RETURN_IF_ERROR(internal::MaybeSave(*engine, options, step + 1, samples, data.stride(), &result));
  }
  ZERO_RETURN_IF_ERROR(internal::WaitForLastSave(*engine, &result));
  internal::RecordEngineStats(*engine, run.units, &result);
  // Every rank's report through device copies (NCCL reads device memory).
  ZERO_ASSIGN_OR_RETURN(
      result.all_ranks, GatherReports(world, result.memory, [&](const float* send, float* recv, size_t n) -> Status {
        Status s;
        Buffer ds = Buffer::Device(nullptr, MemTag::kStaging, n * 4, &s);
        Buffer dr;
        if (s.ok()) dr = Buffer::Device(nullptr, MemTag::kStaging, n * 4 * world, &s);
        ZERO_RETURN_IF_ERROR(s);
        // On the compute stream, which the all-gather waits for (a cudaMemcpy on the legacy stream may return
        // before its DMA lands, and NCCL's stream does not wait for the legacy one).
        ZERO_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(ds.data(), send, n * 4, cudaMemcpyHostToDevice, stream), "report"));
        ZERO_RETURN_IF_ERROR(comm->AllGather(ds.data(), dr.data(), n, DType::kF32, stream).Wait());
        ZERO_RETURN_IF_ERROR(
            Cuda(cudaMemcpyAsync(recv, dr.data(), n * 4 * world, cudaMemcpyDeviceToHost, stream), "report"));
        return Cuda(cudaStreamSynchronize(stream), "report");
      }));
  if (collect_final_params) {
    ZERO_ASSIGN_OR_RETURN(result.final_params, internal::FinalParams(*engine, units));
  }
  return result;
}

}  // namespace zero::gpt
