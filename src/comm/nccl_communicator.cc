// The NCCL communicator: device-memory collectives on one library-owned CUDA stream per communicator.
//
// Ordering: an op's `stream` argument names the stream that produced its input. The op records an event
// there and makes the communication stream wait for it (cudaStreamWaitEvent), so compute and communication
// are ordered by events only and the host never blocks at issue. Each op records an end event on the
// communication stream; Work::WaitStream joins a consumer stream to it, Work::Wait polls it.
//
// Failure handling: the communicator is created non-blocking (ncclConfig_t::blocking = 0) so that neither
// init nor any call can block the host forever; calls may return ncclInProgress, after which we poll
// ncclCommGetAsyncError until the call is enqueued. Work::Wait polls cudaEventQuery and
// ncclCommGetAsyncError; when the comm reports an error, or the op outlives CommOptions::timeout, the
// communicator is aborted (ncclCommAbort) and every later op fails at once with the cause.
//
// CUDA and NCCL error codes become Status in exactly two functions below: CudaToStatus and NcclToStatus.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/internal/env.h"
#include "comm/internal/nccl.h"
#include "comm/internal/op.h"
#include "comm/internal/rendezvous.h"
#include "comm/internal/work_state.h"
#include "zero/advanced/communicator_ext.h"
#include "zero/communicator.h"
#include "zero/logging.h"

namespace zero {
namespace {

using internal::OpDesc;
using internal::OpKind;

// ---------------------------------------------------------------------------------------------------------
// The error seam.

// Maps a CUDA runtime error; clears the thread's last-error state so a later call does not report it again.
Status CudaToStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  const std::string msg = absl::StrCat(what, ": CUDA error ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  switch (e) {
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidValue: return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable: return absl::UnavailableError(msg);
    default: return absl::InternalError(msg);
  }
}

// Maps an NCCL result. ncclInProgress is not an error (a non-blocking call is still being enqueued).
Status NcclToStatus(ncclResult_t r, const std::string& what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  const std::string msg = absl::StrCat(what, ": NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r), ")",
                                       last != nullptr && last[0] != '\0' ? absl::StrCat(": ", last) : "");
  switch (r) {
    case ncclInvalidArgument: return absl::InvalidArgumentError(msg);
    case ncclInvalidUsage: return absl::FailedPreconditionError(msg);
    case ncclRemoteError:
    case ncclSystemError: return absl::UnavailableError(msg);
    default:  // ncclUnhandledCudaError, ncclInternalError
      return absl::InternalError(msg);
  }
}

#define ZERO_CUDA_RETURN_IF_ERROR(expr, what) ZERO_RETURN_IF_ERROR(CudaToStatus((expr), (what)))
#define ZERO_NCCL_RETURN_IF_ERROR(expr, what, comm) ZERO_RETURN_IF_ERROR(NcclToStatus((expr), (what), (comm)))

ncclDataType_t ToNccl(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
  }
  return ncclFloat32;
}

// At world size 1 an average is the sum (x / 1 == x exactly), and asking NCCL for ncclAvg there is wrong:
// with one rank NCCL runs ncclAvg as a single-rank "pre-multiplied sum" kernel (oneRankReduce) whose blocks
// split the count by floor division, so an out-of-place reduction leaves the last count % blocks elements of
// the output unwritten (NVIDIA/nccl#1950, fixed in NCCL 2.29.7). Seen here on an H200 with NCCL 2.28: stage 2-3
// reduce-scatters of 49984-element units lost their last 12 gradients every step
// (bench/results/gpu-2026-11-30.md). ncclSum at one rank is a plain copy.
ncclRedOp_t ToNccl(ReduceOp op, int world) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return world == 1 ? ncclSum : ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

// Makes `device` current for the scope and restores the caller's device.
// Used around ops and in the destructor: the caller's device is restored (it already has a context there, so
// restoring creates none). Creation instead leaves the communicator's device current (MakeDeviceCurrent):
// restoring a thread's never-chosen default device 0 would create a context on GPU 0 in every local rank.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
  }
  ~ScopedDevice() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

Status MakeDeviceCurrent(int device) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return absl::OkStatus();
  ZERO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "CreateNccl: cudaSetDevice");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------------------
// State shared by the communicator and its Works (a Work may outlive its communicator).

class NcclShared {
 public:
  NcclShared(ncclComm_t comm, int rank, int world) : comm_(comm), rank_(rank), world_(world) {}

  // Polls the comm's asynchronous state until it leaves ncclInProgress (a non-blocking call finished
  // enqueueing) or `deadline`; aborts the comm on error or timeout. Requires mu_.
  Status AwaitNotInProgressLocked(absl::Time deadline, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return AbortLocked(NcclToStatus(r, what, comm_));
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return AbortLocked(NcclToStatus(state, what, comm_));
      if (absl::Now() >= deadline) {
        return AbortLocked(absl::DeadlineExceededError(absl::StrCat(what, " did not finish within the timeout")));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // One poll: the comm's asynchronous error, if any, aborts the comm and is returned.
  Status PollAsyncError(const std::string& what) {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return AbortLocked(NcclToStatus(r, what, comm_));
    if (state != ncclSuccess && state != ncclInProgress) return AbortLocked(NcclToStatus(state, what, comm_));
    return absl::OkStatus();
  }

  Status Abort(Status cause) {
    absl::MutexLock lock(&mu_);
    return AbortLocked(std::move(cause));
  }

  // Aborts once; the first cause is what every later op reports.
  Status AbortLocked(Status cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (broken_.ok()) {
      broken_ = absl::Status(cause.code(), absl::StrCat(cause.message(), " [rank ", rank_, " of ", world_,
                                                        "; the NCCL communicator was aborted]"));
      ZERO_LOG(ERROR) << broken_.message();
      if (comm_ != nullptr) (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    return broken_;
  }

  Status broken() {
    absl::MutexLock lock(&mu_);
    return broken_;
  }

  absl::Mutex mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_);
  Status broken_ ABSL_GUARDED_BY(mu_);
  const int rank_;
  const int world_;
};

class NcclWorkState final : public internal::WorkState {
 public:
  NcclWorkState(OpDesc desc, cudaEvent_t end, std::shared_ptr<NcclShared> shared, absl::Duration op_timeout)
      : WorkState(desc), end_(end), shared_(std::move(shared)), deadline_(absl::Now() + op_timeout) {}
  ~NcclWorkState() override {
    if (end_ != nullptr) (void)cudaEventDestroy(end_);
  }

  // Polls rather than blocking in cudaEventSynchronize, so that the communicator's asynchronous error and
  // the op's deadline are noticed. It spins (yielding) for the first 2 ms, which covers most ops at the
  // latency of a stream synchronize, then sleeps between polls (sleeps of a few tens of microseconds cost
  // the kernel's timer slack on top, which tripled the latency of short ops when used from the start).
  Status Wait(absl::Duration timeout) override {
    const absl::Time start = absl::Now();
    const absl::Time wait_deadline = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : start + timeout;
    for (int polls = 0;; ++polls) {
      if (IsFinished()) return Result();
      if (polls % 64 == 0) {
        Status async = shared_->PollAsyncError(Describe());
        if (!async.ok()) return Fail(async);
      }
      const absl::Time now = absl::Now();
      if (now >= deadline_) {
        return Fail(shared_->Abort(absl::DeadlineExceededError(
            absl::StrCat(Describe(),
                         " did not complete within the communicator's timeout (a peer died, hung, or issued a "
                         "different op)"))));
      }
      if (now >= wait_deadline) {
        return absl::DeadlineExceededError(absl::StrCat("wait for ", Describe(), " timed out after ",
                                                        absl::FormatDuration(timeout), " (the op is still pending)"));
      }
      if (now - start < absl::Milliseconds(2)) {
        std::this_thread::yield();
      } else {
        absl::SleepFor(absl::Microseconds(200));
      }
    }
  }

  Status WaitStream(CUstream_st* stream) override {
    {
      absl::MutexLock lock(&mu_);
      if (!status_.ok()) return status_;
    }
    ZERO_RETURN_IF_ERROR(shared_->broken());
    return CudaToStatus(cudaStreamWaitEvent(stream, end_, 0), absl::StrCat("WaitStream for ", Describe()));
  }

  bool IsCompleted() const override { return const_cast<NcclWorkState*>(this)->IsFinished(); }

  Status status() const override {
    auto* self = const_cast<NcclWorkState*>(this);
    if (!self->IsFinished()) return absl::UnavailableError(absl::StrCat(Describe(), " is pending"));
    return self->Result();
  }

 private:
  // True once the end event fired or the op failed. A failed event query (a sticky CUDA error) fails the op.
  bool IsFinished() {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return true;
    }
    cudaError_t q = cudaEventQuery(end_);
    if (q == cudaErrorNotReady) return false;
    absl::MutexLock lock(&mu_);
    finished_ = true;
    if (q != cudaSuccess && status_.ok()) status_ = CudaToStatus(q, Describe());
    return true;
  }

  Status Result() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  Status Fail(Status s) {
    absl::MutexLock lock(&mu_);
    finished_ = true;
    if (status_.ok()) status_ = absl::Status(s.code(), absl::StrCat(Describe(), ": ", s.message()));
    return status_;
  }

  cudaEvent_t end_;
  const std::shared_ptr<NcclShared> shared_;
  const absl::Time deadline_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  Status status_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------------------------

class NcclCommunicator final : public advanced::ExtendedCommunicator {
 public:
  NcclCommunicator(std::shared_ptr<Store> store, int rank, int world, int device, CommOptions options)
      : store_(std::move(store)), rank_(rank), world_(world), device_(device), options_(std::move(options)) {}

  ~NcclCommunicator() override {
    ScopedDevice guard(device_);
    if (shared_ != nullptr) {
      absl::MutexLock lock(&shared_->mu_);
      if (shared_->comm_ != nullptr) {
        // Finalize flushes issued ops; bounded by the op timeout so a dead peer cannot hang the destructor.
        Status s = NcclToStatus(ncclCommFinalize(shared_->comm_), "ncclCommFinalize", shared_->comm_);
        if (s.ok()) s = shared_->AwaitNotInProgressLocked(absl::Now() + options_.timeout, "ncclCommFinalize");
        if (s.ok()) {
          (void)ncclCommDestroy(shared_->comm_);
          shared_->comm_ = nullptr;
          shared_->broken_ = absl::FailedPreconditionError("the NCCL communicator was destroyed");
        }
      }
    }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
    if (d_barrier_ != nullptr) (void)cudaFree(d_barrier_);
  }

  Status Init(absl::Time deadline) {
    int count = 0;
    ZERO_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count), "CreateNccl: cudaGetDeviceCount");
    if (device_ < 0 || device_ >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateNccl: CUDA device ", device_, " does not exist (", count, " devices visible)"));
    }
    ZERO_RETURN_IF_ERROR(MakeDeviceCurrent(device_));
    ZERO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "CreateNccl: stream");
    ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "CreateNccl: event");
    ZERO_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_barrier_, sizeof(float)), "CreateNccl: barrier scalar");
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemset(d_barrier_, 0, sizeof(float)), "CreateNccl: barrier scalar");
    return absl::OkStatus();
  }

  Status Connect(const ncclUniqueId& id, absl::Time deadline) {
    ZERO_RETURN_IF_ERROR(MakeDeviceCurrent(device_));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const std::string what =
        absl::StrCat("ncclCommInitRankConfig(rank ", rank_, " of ", world_, ", device ", device_, ")");
    ncclResult_t r = ncclCommInitRankConfig(&comm, world_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm != nullptr) (void)ncclCommAbort(comm);
      return NcclToStatus(r, what);
    }
    shared_ = std::make_shared<NcclShared>(comm, rank_, world_);
    absl::MutexLock lock(&shared_->mu_);
    Status s = shared_->AwaitNotInProgressLocked(deadline, what);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(
          absl::StrCat(s.message(), " (a rank never arrived within ", absl::FormatDuration(options_.timeout), ")"));
    }
    return s;
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Backend backend() const override { return Backend::kNccl; }
  absl::Duration timeout() const override { return options_.timeout; }

  // ncclCommSplit on this communicator (collective over it; non-blocking like every comm here, so polled to
  // completion within the timeout); NCCL numbers the new ranks by (key, rank), as Split promises.
  StatusOr<std::shared_ptr<Communicator>> Split(int color, int key) override {
    const std::string what = absl::StrCat("ncclCommSplit(color ", color, ", key ", key, ") on rank ", rank_, " of ",
                                          world_, ", device ", device_);
    if (color < 0 || key < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": color and key must be >= 0"));
    if (shared_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(what, ": not connected"));
    ScopedDevice guard(device_);
    const absl::Time deadline = absl::Now() + options_.timeout;
    ncclComm_t child = nullptr;
    {
      absl::MutexLock lock(&shared_->mu_);
      if (!shared_->broken_.ok()) return shared_->broken_;
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t r = ncclCommSplit(shared_->comm_, color, key, &child, &config);
      if (r != ncclSuccess && r != ncclInProgress) return shared_->AbortLocked(NcclToStatus(r, what, shared_->comm_));
      ZERO_RETURN_IF_ERROR(shared_->AwaitNotInProgressLocked(deadline, what));
    }
    if (child == nullptr) return absl::InternalError(absl::StrCat(what, ": NCCL returned no communicator"));
    auto made = std::make_shared<NcclShared>(child, 0, 1);
    {
      absl::MutexLock lock(&made->mu_);
      ZERO_RETURN_IF_ERROR(made->AwaitNotInProgressLocked(deadline, what));
    }
    int new_rank = 0, new_world = 0;
    ZERO_RETURN_IF_ERROR(NcclToStatus(ncclCommUserRank(child, &new_rank), what, child));
    ZERO_RETURN_IF_ERROR(NcclToStatus(ncclCommCount(child, &new_world), what, child));
    auto comm = std::make_unique<NcclCommunicator>(store_, new_rank, new_world, device_, options_);
    ZERO_RETURN_IF_ERROR(comm->Init(deadline));
    comm->shared_ = std::make_shared<NcclShared>(child, new_rank, new_world);
    {
      absl::MutexLock lock(&made->mu_);
      made->comm_ = nullptr;  // handed over: the placeholder must not abort it
    }
    return std::shared_ptr<Communicator>(std::move(comm));
  }

  Work AllGather(const void* send, void* recv, size_t count, DType dtype, CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kAllGather, .dtype = dtype, .count = count};
    return Issue(d, stream, [=](ncclComm_t comm, cudaStream_t s) {
      return ncclAllGather(send, recv, count, ToNccl(dtype), comm, s);
    });
  }

  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kReduceScatter, .dtype = dtype, .reduce = op, .count = count};
    const ncclRedOp_t rop = ToNccl(op, world_);
    return Issue(d, stream, [=](ncclComm_t comm, cudaStream_t s) {
      return ncclReduceScatter(send, recv, count, ToNccl(dtype), rop, comm, s);
    });
  }

  Work AllReduce(void* buf, size_t count, DType dtype, ReduceOp op, CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kAllReduce, .dtype = dtype, .reduce = op, .count = count};
    const ncclRedOp_t rop = ToNccl(op, world_);
    return Issue(d, stream, [=](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(buf, buf, count, ToNccl(dtype), rop, comm, s);
    });
  }

  Work Broadcast(void* buf, size_t count, DType dtype, int root, CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kBroadcast, .dtype = dtype, .root = root, .count = count};
    if (root < 0 || root >= world_) {
      d.seq = next_seq_++;
      history_.Record(d, label(), world_);
      return Work(std::make_shared<internal::CompletedWorkState>(
          d, absl::InvalidArgumentError(
                 absl::StrCat(internal::DescribeOp(d), ": root ", root, " is not a rank of a world of ", world_))));
    }
    return Issue(d, stream, [=](ncclComm_t comm, cudaStream_t s) {
      return ncclBroadcast(buf, buf, count, ToNccl(dtype), root, comm, s);
    });
  }

  // NCCL has no all-to-all collective: one ncclSend and one ncclRecv per peer in one group, which NCCL runs as a
  // single operation (its documented all-to-all); block `rank` goes through NCCL too (a send to self).
  bool SupportsAllToAll() const override { return true; }
  Work AllToAll(const void* send, void* recv, size_t count, DType dtype, CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kAllToAll, .dtype = dtype, .count = count};
    const size_t block = count * DTypeSize(dtype);
    const int world = world_;
    return Issue(d, stream, [=](ncclComm_t comm, cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (int p = 0; p < world && (r == ncclSuccess || r == ncclInProgress); ++p) {
        r = ncclSend(static_cast<const char*>(send) + p * block, count, ToNccl(dtype), p, comm, s);
        if (r == ncclSuccess || r == ncclInProgress) {
          r = ncclRecv(static_cast<char*>(recv) + p * block, count, ToNccl(dtype), p, comm, s);
        }
      }
      const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failed call in it
      return r == ncclSuccess || r == ncclInProgress ? end : r;
    });
  }

  int cuda_device() const override { return device_; }
  uint64_t IssuedOpsHash() const override { return history_.hash(); }
  std::vector<std::string> RecentOps() const override { return history_.Recent(); }
  int64_t bus_bytes() const override { return history_.bus_bytes(); }

  // No op: the Work of an event at the communication stream's current end (Communicator::Fence).
  Work Fence() override {
    OpDesc d{.kind = OpKind::kFence};
    d.seq = next_seq_ - 1;  // the last op it covers
    const std::string what = absl::StrCat(internal::DescribeOp(d), " on rank ", rank_, " of ", world_);
    if (shared_ == nullptr) return Failed(d, what, absl::FailedPreconditionError("the communicator is not connected"));
    ScopedDevice guard(device_);
    absl::MutexLock lock(&shared_->mu_);
    if (!shared_->broken_.ok()) return Failed(d, what, BrokenLocked());
    return EndOfStreamLocked(d, what);
  }

  // A one-float all-reduce; the Work completes once every rank reached the barrier.
  Work Barrier() override {
    OpDesc d{.kind = OpKind::kBarrier};
    float* scalar = d_barrier_;
    return Issue(d, nullptr, [=](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(scalar, scalar, 1, ncclFloat32, ncclSum, comm, s);
    });
  }

 private:
  template <typename Call>
  Work Issue(OpDesc d, CUstream_st* producer, Call call) {
    d.seq = next_seq_++;
    history_.Record(d, label(), world_);
    const std::string what = absl::StrCat(internal::DescribeOp(d), " on rank ", rank_, " of ", world_);
    if (shared_ == nullptr) return Failed(d, what, absl::FailedPreconditionError("the communicator is not connected"));
    ScopedDevice guard(device_);
    absl::MutexLock lock(&shared_->mu_);
    if (!shared_->broken_.ok()) return Failed(d, what, BrokenLocked());
    // Cross-stream order by events only: the comm stream waits for the producer's work so far. One event is
    // reused because cudaStreamWaitEvent captures the event's most recent record at the time of the call.
    Status s = CudaToStatus(cudaEventRecord(ready_, producer), what);
    if (s.ok()) s = CudaToStatus(cudaStreamWaitEvent(stream_, ready_, 0), what);
    if (!s.ok()) return Failed(d, what, s);
    if (d.count > 0 || d.kind == OpKind::kBarrier) {
      s = NcclToStatus(call(shared_->comm_, stream_), what, shared_->comm_);
      if (s.ok()) s = shared_->AwaitNotInProgressLocked(absl::Now() + options_.timeout, what);
      if (!s.ok()) return Failed(d, what, shared_->AbortLocked(s));
    }
    return EndOfStreamLocked(d, what);
  }

  // A Work that completes when the communication stream reaches its current end (an event recorded now).
  Work EndOfStreamLocked(const OpDesc& d, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu_) {
    cudaEvent_t end = nullptr;
    Status s = CudaToStatus(cudaEventCreateWithFlags(&end, cudaEventDisableTiming), what);
    if (s.ok()) s = CudaToStatus(cudaEventRecord(end, stream_), what);
    if (!s.ok()) {
      if (end != nullptr) (void)cudaEventDestroy(end);
      return Failed(d, what, s);
    }
    return Work(std::make_shared<NcclWorkState>(d, end, shared_, options_.timeout));
  }

  Status BrokenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu_) {
    return absl::Status(shared_->broken_.code(),
                        absl::StrCat("not run: the communicator failed earlier: ", shared_->broken_.message()));
  }

  static Work Failed(const OpDesc& d, const std::string& what, const Status& s) {
    return Work(std::make_shared<internal::CompletedWorkState>(
        d, absl::Status(s.code(), absl::StrCat(what, ": ", s.message()))));
  }

  const std::shared_ptr<Store> store_;
  const int rank_;
  const int world_;
  const int device_;
  const CommOptions options_;
  std::shared_ptr<NcclShared> shared_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  float* d_barrier_ = nullptr;
  int64_t next_seq_ = 0;
  internal::OpHistory history_;  // issuing thread only
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> internal::CreateNcclCommunicator(std::shared_ptr<Store> store, int rank,
                                                                         int world_size, const CommOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("CreateNccl: store is null");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateNccl: rank ", rank, " is not in [0, world_size ", world_size, ")"));
  }
  ZERO_ASSIGN_OR_RETURN(CommOptions opts, internal::ApplyCommEnvOverrides(options, internal::ProcessEnv()));
  ZERO_RETURN_IF_ERROR(internal::CheckCommTimeout(opts.timeout));
  const absl::Time deadline = absl::Now() + opts.timeout;
  auto comm = std::make_unique<NcclCommunicator>(store, rank, world_size, opts.device, opts);
  ZERO_RETURN_IF_ERROR(comm->Init(deadline));

  // Rank 0 creates the unique id and publishes it; the k-th communicator of every rank uses the k-th key.
  const std::string scope = internal::JobScope(opts.prefix, opts.job_id);
  ZERO_ASSIGN_OR_RETURN(int64_t generation, store->Add(absl::StrCat(scope, "/nccl_generation/", rank), 1));
  const std::string key = absl::StrCat(scope, "/nccl_id/", generation - 1);
  ZERO_RETURN_IF_ERROR(internal::AgreeAtRendezvous(*store, opts.prefix, absl::StrCat(scope, "/nccl/", generation - 1),
                                                   rank, world_size, opts.job_id, opts.timeout));
  ncclUniqueId id;
  if (rank == 0) {
    ZERO_RETURN_IF_ERROR(NcclToStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    const auto* p = reinterpret_cast<const uint8_t*>(&id);
    ZERO_RETURN_IF_ERROR(store->Set(key, std::vector<uint8_t>(p, p + sizeof(id))));
  } else {
    ZERO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, store->Get(key, opts.timeout));
    if (bytes.size() != sizeof(id)) {
      return absl::InternalError(absl::StrCat("CreateNccl: store key '", key, "' holds ", bytes.size(),
                                              " bytes, not an ncclUniqueId (", sizeof(id), ")"));
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ZERO_RETURN_IF_ERROR(comm->Connect(id, deadline));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace zero
