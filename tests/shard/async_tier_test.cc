// The engine's CUDA-tier code paths, exercised in CI without a GPU: the engine runs over an emulated
// asynchronous compute tier — every compute-tier operation is queued on a "late stream" (one thread that runs
// them in order, each after a delay, so the engine's thread runs ahead of it as it runs ahead of a GPU) — and
// must produce bit for bit what the ordinary host engine produces.
//
// What it proves about the device engine's logic (src/shard/engine.cc with ComputeTier::device() true): the
// engine never reads or writes compute-tier memory on the host except through the tier (a direct access
// would see the late stream's stale data), it joins every collective before enqueuing work on its output (a join
// is a wait on the late stream only, as on a GPU: the host runs on, so a buffer the engine reuses or gives back
// while its collective may still run shows too),
// collectives see their inputs complete (the wrapper communicator below drains the stream before issuing,
// as the NCCL communicator makes its stream wait on the producer stream), offload's copy-stream tasks wait
// for the compute stream's work queued before them (as the CUDA tier's recorded event makes them), and the
// device-only paths (host arrays staged through compute-tier copies, pooled full gradients, the stage-in of
// host-tier parameter shards) compute the same numbers. What it cannot prove: CUDA's own semantics (events,
// streams, NCCL) — tests/shard/cuda_engine_test.cc checks those on a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "checkpoint/internal/format.h"
#include "comm/internal/work_state.h"
#include "shard/internal/compute.h"
#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/forwarding_comm.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/dtype.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

using testing::Borrow;
using testing::TrainConfig;

// One thread running queued operations in FIFO order, each `delay` after it reaches the front.
class LateStream {
 public:
  explicit LateStream(absl::Duration delay) : delay_(delay), thread_([this] { Run(); }) {}
  ~LateStream() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  uint64_t Enqueue(std::function<void()> op) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(op));
    return ++issued_;
  }
  // Until every operation queued so far ran.
  void Drain() {
    absl::MutexLock lock(&mu_);
    const uint64_t target = issued_;
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= target; };
    mu_.Await(absl::Condition(&done));
  }
  void WaitFor(uint64_t ticket) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= ticket; };
    mu_.Await(absl::Condition(&done));
  }
  uint64_t issued() {
    absl::MutexLock lock(&mu_);
    return issued_;
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> op;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stop_; };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::SleepFor(delay_);
      op();
      absl::MutexLock lock(&mu_);
      ++done_;
    }
  }

  const absl::Duration delay_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t issued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the state above exists
};

// The CUDA tier's contract (shard/internal/compute.h), on host memory, with every stream operation late.
class AsyncTier final : public internal::ComputeTier {
 public:
  explicit AsyncTier(MemoryTracker* tracker) : host_(internal::MakeHostCompute(tracker)) {}

  bool device() const override { return true; }  // the engine takes its device paths
  CUstream_st* stream() const override { return nullptr; }
  Status status() const override { return status_; }

  // Zeroed before return. `fail_alloc` (tests) makes an allocation fail as a device out of memory would.
  Buffer Alloc(MemTag tag, size_t bytes) override {
    if (fail_alloc && fail_alloc(tag, bytes)) {
      if (status_.ok()) {
        status_ = absl::ResourceExhaustedError(absl::StrCat("out of device memory (", bytes, " bytes)"));
      }
      return Buffer();
    }
    return host_->Alloc(tag, bytes);
  }
  std::function<bool(MemTag, size_t)> fail_alloc;
  void Zero(void* p, size_t bytes) override {
    stream_.Enqueue([=] { std::memset(p, 0, bytes); });
  }
  void Convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n) override {
    stream_.Enqueue([=] { ConvertBuffer(src, sdt, dst, ddt, n); });
  }
  void Land(const void* src, DType sdt, void* dst, DType ddt, int64_t n, bool add) override {
    stream_.Enqueue([=] { internal::LandOnHost(src, sdt, dst, ddt, n, add); });
  }
  void AddGradStats(const void* g, DType dt, int64_t n) override {
    if (n <= 0) return;
    stream_.Enqueue([=, this] {
      const GradStatsResult r = GradStats(g, dt, static_cast<size_t>(n));
      stats_.sumsq += r.sumsq;
      stats_.nonfinite += r.nonfinite;
    });
  }
  GradStatsResult TakeGradStatsSync() override {
    stream_.Drain();
    return std::exchange(stats_, GradStatsResult{});
  }
  void Update(const ElementwiseOptimizer& opt, const ShardUpdate& u, int threads, size_t tile) override {
    // The state array is the engine's local: copy it, as a kernel launch copies its arguments.
    std::vector<float*> states(u.state, u.state + opt.StateNames().size());
    stream_.Enqueue([&opt, up = u, states, threads, tile]() mutable {
      up.state = states.data();
      ParallelUpdate(opt, up, threads, tile);
    });
  }
  void StochasticRound(const float* src, uint16_t* dst, size_t n, uint64_t key, int64_t first_index) override {
    stream_.Enqueue([=] { StochasticRoundToBF16(src, dst, n, key, first_index); });
  }
  void QuantizeInt8(const void* x, DType dt, int64_t n, int64_t block, int8_t* q, float* scales) override {
    stream_.Enqueue([=, this] { host_->QuantizeInt8(x, dt, n, block, q, scales); });
  }
  void DequantizeInt8(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out, DType dt) override {
    stream_.Enqueue([=, this] { host_->DequantizeInt8(q, scales, n, block, out, dt); });
  }
  void QuantizeInt4(const float* x, int64_t n, int64_t block, uint8_t* q, float* scales, float* scratch) override {
    stream_.Enqueue([=, this] { host_->QuantizeInt4(x, n, block, q, scales, scratch); });
  }
  void DequantizeInt4(const uint8_t* q, const float* scales, int64_t n, int64_t block, float* out) override {
    stream_.Enqueue([=, this] { host_->DequantizeInt4(q, scales, n, block, out); });
  }
  void LocoResidual(const float* y, const float* sent, float* e, float beta, int64_t n) override {
    stream_.Enqueue([=] { internal::LocoResidualOnHost(y, sent, e, beta, n); });
  }
  void Divide(const float* src, float* dst, int64_t n, float divisor) override {
    stream_.Enqueue([=] { internal::DivideOnHost(src, dst, n, divisor); });
  }
  void CopyToHostSync(void* host_dst, const void* src, size_t bytes) override {
    stream_.Drain();
    if (bytes > 0) std::memcpy(host_dst, src, bytes);
  }
  void CopyFromHostSync(void* dst, const void* host_src, size_t bytes) override {
    stream_.Drain();
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
  }
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    stream_.Enqueue([=] { std::memcpy(dst, host_src, bytes); });  // reads the source late, like a DMA
  }
  std::function<void()> LandOnHostTask(const void* src, DType sdt, void* host_dst, DType ddt, int64_t n,
                                       bool add) override {
    const uint64_t ready = stream_.issued();  // the CUDA tier's event: everything queued so far
    return [=, this] {
      stream_.WaitFor(ready);
      internal::LandOnHost(src, sdt, host_dst, ddt, n, add);
    };
  }
  void CopyInOnCopyStream(void* dst, const void* host_src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
  }
  // A stream wait, as the CUDA tier's (Work::WaitStream: cudaStreamWaitEvent): the host does not wait. The
  // communicator's Works (DrainingComm's LateJoinState) queue their wait on this stream; any other Work (a
  // completed one, an error) waits on the host, as Work::WaitStream does on the host path.
  Status Join(Work& w) override { return w.WaitStream(nullptr); }
  void EnqueueWait(std::function<void()> wait) { stream_.Enqueue(std::move(wait)); }

  void Drain() { stream_.Drain(); }

 private:
  std::unique_ptr<internal::ComputeTier> host_;
  Status status_;
  GradStatsResult stats_;  // the late stream's only
  LateStream stream_{absl::Microseconds(50)};
};

// The Work of a DrainingComm op: WaitStream queues the wait on the late stream and returns at once (the CUDA
// tier's Join), so the engine's host thread runs on while the op may still be in flight, as it does on a GPU: a
// buffer the engine gives back or reuses before the op completed is then the bug it would be there.
class LateJoinState final : public internal::WorkState, public std::enable_shared_from_this<LateJoinState> {
 public:
  LateJoinState(internal::OpDesc d, Work inner, std::function<AsyncTier*()> tier)
      : WorkState(std::move(d)), inner_(std::move(inner)), tier_(std::move(tier)) {}
  Status Wait(absl::Duration timeout) override { return inner_.Wait(timeout); }
  Status WaitStream(CUstream_st*) override {
    AsyncTier* t = tier_();
    if (t == nullptr) return inner_.Wait();
    t->EnqueueWait([self = shared_from_this()] { (void)self->inner_.Wait(); });  // errors surface at the fences
    return absl::OkStatus();
  }
  bool IsCompleted() const override { return inner_.IsCompleted(); }
  Status status() const override { return inner_.status(); }

 private:
  Work inner_;  // Work's methods are thread-safe (the late stream waits while the engine polls)
  std::function<AsyncTier*()> tier_;
};

// A communicator whose ops first wait for the late stream, as the NCCL communicator's stream waits on the
// producer stream's event.
class DrainingComm final : public testing::ForwardingComm {
 public:
  // `root`: the communicator this one was split from (its tier is bound later), or null for the rank's own.
  explicit DrainingComm(Communicator& inner, DrainingComm* root = nullptr)
      : ForwardingComm(inner), root_(root != nullptr ? root : this) {}
  void Bind(AsyncTier* tier) { tier_ = tier; }

  // The engine's split communicators (hpZ's host group) wait for the same late stream: Engine::Create splits
  // before Init makes the tier, so they drain the tier bound to the root when they issue.
  StatusOr<std::shared_ptr<Communicator>> Split(int color, int key) override {
    StatusOr<std::shared_ptr<Communicator>> child = ForwardingComm::Split(color, key);
    if (!child.ok()) return child.status();
    struct Owned {
      std::shared_ptr<Communicator> inner;
      std::unique_ptr<DrainingComm> outer;
    };
    auto owned = std::make_shared<Owned>();
    owned->inner = *std::move(child);
    owned->outer = std::make_unique<DrainingComm>(*owned->inner, root_);
    root_->splits.push_back(owned->outer.get());
    return std::shared_ptr<Communicator>(owned, owned->outer.get());
  }
  std::vector<DrainingComm*> splits;  // on the root: the communicators split from it and from them, in order

  Work AllGather(const void* send, void* recv, size_t count, DType dtype, CUstream_st* s) override {
    Drain();
    CheckBuffers(send, recv, count);
    return Late(internal::OpKind::kAllGather, dtype, count, ForwardingComm::AllGather(send, recv, count, dtype, s));
  }
  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, CUstream_st* s) override {
    Drain();
    CheckBuffers(send, recv, count);
    return Late(internal::OpKind::kReduceScatter, dtype, count,
                ForwardingComm::ReduceScatter(send, recv, count, dtype, op, s));
  }
  Work ReduceScatterDestructive(void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                CUstream_st* s) override {
    Drain();
    CheckBuffers(send, recv, count);
    return Late(internal::OpKind::kReduceScatter, dtype, count,
                ForwardingComm::ReduceScatterDestructive(send, recv, count, dtype, op, s));
  }
  // The strided ops too (Gloo has them; NCCL's communicator does not, but whichever the engine issues must wait):
  // without these the chunked configurations read shards the late stream was still writing (TSan's report).
  Work AllGatherStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype,
                        CUstream_st* s) override {
    Drain();
    CheckBuffers(send, recv, count);
    return Late(internal::OpKind::kAllGatherStrided, dtype, count,
                ForwardingComm::AllGatherStrided(send, recv, count, stride, dtype, s));
  }
  Work ReduceScatterStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype, ReduceOp op,
                            CUstream_st* s) override {
    Drain();
    CheckBuffers(send, recv, count);
    return Late(internal::OpKind::kReduceScatterStrided, dtype, count,
                ForwardingComm::ReduceScatterStrided(send, recv, count, stride, dtype, op, s));
  }
  Work AllToAll(const void* send, void* recv, size_t count, DType dtype, CUstream_st* s) override {
    Drain();
    CheckBuffers(send, recv, count);
    return Late(internal::OpKind::kAllToAll, dtype, count, ForwardingComm::AllToAll(send, recv, count, dtype, s));
  }
  Work AllReduce(void* buf, size_t count, DType dtype, ReduceOp op, CUstream_st* s) override {
    Drain();
    CheckBuffers(buf, buf, count);
    return Late(internal::OpKind::kAllReduce, dtype, count, ForwardingComm::AllReduce(buf, count, dtype, op, s));
  }
  Work Broadcast(void* buf, size_t count, DType dtype, int root, CUstream_st* s) override {
    Drain();
    return Late(internal::OpKind::kBroadcast, dtype, count, ForwardingComm::Broadcast(buf, count, dtype, root, s));
  }
  // What the NCCL communicator's fence reports when a peer died (tests set fail_fence); counts the calls.
  Work Fence() override {
    ++fences;
    if (!fail_fence) return ForwardingComm::Fence();
    internal::OpDesc d{.kind = internal::OpKind::kFence};
    return Work(std::make_shared<internal::CompletedWorkState>(
        d, absl::UnavailableError("Fence after#41 on rank 0 of 2: a peer was lost")));
  }
  bool fail_fence = false;
  int fences = 0;

 private:
  void Drain() {
    if (root_->tier_ != nullptr) root_->tier_->Drain();
  }
  Work Late(internal::OpKind kind, DType dtype, size_t count, Work inner) {
    internal::OpDesc d{.kind = kind, .dtype = dtype, .count = count};
    d.seq = inner.sequence();
    DrainingComm* root = root_;
    return Work(std::make_shared<LateJoinState>(std::move(d), std::move(inner), [root] { return root->tier_; }));
  }
  // NCCL would fail a null buffer and abort the communicator for every rank.
  static void CheckBuffers(const void* send, const void* recv, size_t count) {
    if (count > 0 && (send == nullptr || recv == nullptr)) ADD_FAILURE() << "a collective got a null buffer";
  }
  DrainingComm* root_;
  AsyncTier* tier_ = nullptr;
};

// The rank thread's communicator being handed to Engine::Create, so the tier factory can bind the two.
thread_local DrainingComm* t_binding = nullptr;
thread_local AsyncTier* t_tier = nullptr;

using testing::SyntheticTrace;

// Makes the Gloo engine's compute tier an AsyncTier (set up by `configure`) bound to the rank's DrainingComm
// for engines created while t_binding is set, and the host tier for the others (the reference engines).
void InstallAsyncTier(std::function<void(AsyncTier&)> configure = {}) {
  internal::SetGlooEngineComputeForTesting(
      [configure = std::move(configure)](MemoryTracker* tracker) -> std::unique_ptr<internal::ComputeTier> {
        if (t_binding == nullptr) return internal::MakeHostCompute(tracker);
        auto tier = std::make_unique<AsyncTier>(tracker);
        if (configure) configure(*tier);
        t_binding->Bind(tier.get());
        t_tier = tier.get();
        return tier;
      });
}

// An engine of the synthetic model over `draining`, its compute tier an AsyncTier (InstallAsyncTier), and the ViewIo a
// trainer uses with it: its host accesses wait for the late stream first (its kernels would run on the stream).
struct AsyncEngine {
  std::unique_ptr<Engine> engine;
  AsyncTier* tier = nullptr;
  testing::ViewIo io() const {
    AsyncTier* t = tier;
    return testing::HostViewIo([t] { t->Drain(); });
  }
};
StatusOr<AsyncEngine> MakeAsyncEngine(const Config& cfg, DrainingComm& draining, const EngineOptions& options) {
  t_binding = &draining;
  auto e = testing::MakeSyntheticEngine(cfg, Borrow(draining), options);
  t_binding = nullptr;
  if (!e.ok()) return e.status();
  return AsyncEngine{*std::move(e), t_tier};
}

struct Case {
  const char* name;
  int world;
  int stage;
  DType dtype;
  int ga;
  GradAccumulationMode mode = GradAccumulationMode::kLowMemory;
  bool stochastic = false;
  int offload = 0;  // 1: offload_optimizer; 2: + offload_param
  double ratio = 1.0;
  double clip = 1.0;
  bool chunked = false;   // 200-element buckets: units move in chunks (shard/internal/collective.h)
  int64_t qwz_block = 0;  // ZeRO++ qwZ with blocks of this many elements: the gathers' messages built on the stream
  int hpz = 1;            // ZeRO++ hpZ with this H (all ranks on one host): the secondary copy in the compute tier
  int qgz_bits = 0;       // ZeRO++ qgZ with these bits (blocks of 32, LoCo on): its records coded on the stream
  int per_host = 0;       // ranks per host (0: all on one host); 2 of 4: qgZ's two hops, hpZ's groups inside
  bool int8_residuals = false;  // qgZ: LoCo's residuals as int8 blocks, dequantized and requantized on the stream
};

// `c` with qgZ at `bits`, its ranks laid out as hosts of `per_host`.
Case Qgz(Case c, int bits, int per_host) {
  c.qgz_bits = bits;
  c.per_host = per_host;
  return c;
}

Config CaseConfig(const Case& c) {
  Config cfg = TrainConfig(c.stage, /*micro=*/1, c.ga, 3e-3, c.clip, c.mode);
  cfg.bf16.enabled = c.dtype == DType::kBF16;
  cfg.bf16.stochastic_rounding = c.stochastic;
  cfg.fp16.enabled = c.dtype == DType::kF16;
  cfg.zero.reduce_bucket_size = 3000;  // several reductions in flight, retired both at scope close and by the bound
  if (c.offload >= 1) {
    cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
    cfg.zero.offload_optimizer.ratio = c.ratio;
    cfg.zero.sub_group_size = 300;
  }
  if (c.offload >= 2) cfg.zero.offload_param.device = OffloadDevice::kCpu;
  if (c.chunked) cfg.zero.reduce_bucket_size = cfg.zero.allgather_bucket_size = 200;
  testing::SetQuantized(cfg, c.qwz_block, c.qgz_bits);
  if (c.int8_residuals) cfg.zero.zero_quantized_gradients_error_feedback_dtype = QgzResidualDType::kInt8;
  cfg.zero.zero_hpz_partition_size = c.hpz;
  return cfg;
}

EngineOptions CaseOptions(const Case& c) {
  EngineOptions o;
  o.local_world_size = c.per_host > 0 ? c.per_host : c.world;  // hpZ's groups are H consecutive ranks of a host
  return o;
}

class AsyncTierTest : public ::testing::TestWithParam<Case> {
 protected:
  void TearDown() override { internal::SetGlooEngineComputeForTesting({}); }
};

TEST_P(AsyncTierTest, BitwiseEqualToTheHostEngine) {
  const Case& c = GetParam();
  const Config cfg = CaseConfig(c);
  constexpr int kSteps = 4;
  InstallAsyncTier();
  testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
    SyntheticTrace host, async;
    {
      t_binding = nullptr;
      auto e = testing::MakeSyntheticEngine(cfg, Borrow(comm), CaseOptions(c));
      ASSERT_OK(e);
      ASSERT_FALSE((*e)->on_device());
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(**e, kSteps, c.ga, testing::HostViewIo(), &host));
    }
    {
      DrainingComm draining(comm);
      ASSERT_OK_AND_ASSIGN(AsyncEngine e, MakeAsyncEngine(cfg, draining, CaseOptions(c)));
      ASSERT_TRUE(e.engine->on_device());
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e.engine, kSteps, c.ga, e.io(), &async));
    }
    for (int k = 0; k < kSteps; ++k) {
      SCOPED_TRACE(::testing::Message() << "step " << k);
      EXPECT_EQ(async.steps[k].skipped, host.steps[k].skipped);
      EXPECT_EQ(async.steps[k].grad_norm, host.steps[k].grad_norm);
      EXPECT_EQ(async.steps[k].loss_scale, host.steps[k].loss_scale);
    }
    size_t moved = 0;
    for (const auto& [name, hv] : host.params) {
      const std::vector<float>& av = async.params.at(name);
      ASSERT_EQ(av.size(), hv.size());
      for (size_t i = 0; i < hv.size(); ++i) {
        ASSERT_EQ(std::memcmp(&av[i], &hv[i], 4), 0) << name << "[" << i << "]: " << av[i] << " vs " << hv[i];
      }
      moved += testing::MovedElements(name, hv);
    }
    EXPECT_GT(moved, 0u);
    // The device paths allocate nothing after the pools warmed up (a cudaMalloc/cudaFree would synchronize
    // the device every step).
    EXPECT_EQ(async.device_allocs_after_last, async.device_allocs_after_second);
    for (MemTag tag : {MemTag::kParams, MemTag::kGrads, MemTag::kOptimizer, MemTag::kMaster}) {
      for (MemTier tier : {MemTier::kHost, MemTier::kDevice}) {
        // The device keeps low-communication mode's full gradients pooled (freeing would synchronize it).
        if (tag == MemTag::kGrads && tier == MemTier::kDevice && c.mode == GradAccumulationMode::kLowCommunication) {
          EXPECT_GT(async.after_last.Get(tier, tag).current, host.after_last.Get(tier, tag).current);
          continue;
        }
        EXPECT_EQ(async.after_last.Get(tier, tag).current, host.after_last.Get(tier, tag).current)
            << MemTagName(tag) << "@" << MemTierName(tier);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Engine, AsyncTierTest,
    ::testing::Values(
        Case{"w1_s0_f32", 1, 0, DType::kF32, 1}, Case{"w2_s0_bf16_ga2", 2, 0, DType::kBF16, 2},
        Case{"w2_s1_f32", 2, 1, DType::kF32, 1}, Case{"w2_s1_bf16_ga2", 2, 1, DType::kBF16, 2},
        Case{"w2_s2_bf16", 2, 2, DType::kBF16, 1},
        Case{"w2_s2_bf16_ga3_lowcomm", 2, 2, DType::kBF16, 3, GradAccumulationMode::kLowCommunication},
        Case{"w3_s3_f32", 3, 3, DType::kF32, 1}, Case{"w2_s3_bf16_ga2", 2, 3, DType::kBF16, 2},
        Case{"w2_s3_f16", 2, 3, DType::kF16, 1},
        Case{"w2_s3_bf16_sr", 2, 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, true},
        Case{"w2_s1_bf16_offload", 2, 1, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 1},
        Case{"w2_s2_f32_offload_ga2", 2, 2, DType::kF32, 2, GradAccumulationMode::kLowMemory, false, 1},
        Case{"w2_s3_bf16_offload_all", 2, 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 2},
        Case{"w2_s3_f32_offload_all", 2, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 2},
        Case{"w2_s3_bf16_twinflow", 2, 3, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 1, 0.5},
        Case{"w2_s1_bf16_ga2_chunked", 2, 1, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0,
             true},
        Case{"w3_s2_f32_chunked", 3, 2, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0, true},
        Case{"w3_s3_bf16_ga2_chunked", 3, 3, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0,
             true},
        Case{"w2_s3_f32_qwz", 2, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0, false, 32},
        Case{"w3_s3_bf16_ga2_qwz", 3, 3, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0, false,
             48},
        Case{"w2_s3_bf16_offload_all_qwz", 2, 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 2, 1.0, 1.0,
             false, 32},
        // qwZ in quantized chunks (200-element buckets): blocks of 48 in chunks of 48 per rank; with hpZ, blocks of 32.
        Case{"w3_s3_bf16_ga2_qwz_chunked", 3, 3, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0,
             true, 48},
        Case{"w4_s3_f16_hpz_qwz_chunked", 4, 3, DType::kF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0,
             true, 32, 2},
        Case{"w2_s3_f32_hpz", 2, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0, false, 0, 2},
        Case{"w4_s3_bf16_ga2_hpz", 4, 3, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0, false,
             0, 2},
        Case{"w4_s3_f16_hpz_qwz", 4, 3, DType::kF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0, false, 32,
             2},
        Case{"w4_s3_bf16_offload_hpz_qwz", 4, 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 1, 1.0, 1.0,
             false, 32, 2},
        // qgZ: one hop over every rank, and two (2 hosts × 2 ranks), int8 and int4, with LoCo's residuals.
        Qgz(Case{"w2_s1_f16_qgz", 2, 1, DType::kF16, 1}, 8, 0),
        Qgz(Case{"w4_s3_f32_qgz_two_hops", 4, 3, DType::kF32, 1}, 8, 2),
        Qgz(Case{"w4_s2_bf16_ga2_qgz4_two_hops", 4, 2, DType::kBF16, 2}, 4, 2),
        // ... in quantized chunks (200-element buckets).
        Qgz(Case{"w4_s3_f32_qgz_two_hops_chunked", 4, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0,
                 1.0, 1.0, true},
            8, 2),
        Qgz(Case{"w3_s2_bf16_ga2_qgz4_chunked", 3, 2, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0, 1.0,
                 1.0, true},
            4, 0),
        Qgz(Case{"w4_s3_f32_offload_qgz_two_hops", 4, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 1}, 8,
            2),
        Qgz(Case{"w4_s3_bf16_qgz_qwz_hpz", 4, 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1.0, 1.0,
                 false, 32, 2},
            8, 2),
        // ... with LoCo's residuals in int8 blocks, whole and in chunks.
        Qgz(Case{"w4_s3_bf16_qgz_int8_residuals", 4, 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0,
                 1.0, 1.0, false, 0, 1, 0, 0, true},
            8, 2),
        Qgz(Case{"w4_s2_f32_qgz4_int8_residuals_chunked", 4, 2, DType::kF32, 1, GradAccumulationMode::kLowMemory, false,
                 0, 1.0, 1.0, true, 0, 1, 0, 0, true},
            4, 2)),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// qgZ's LoCo residuals live in the compute tier, so a device engine saves and loads them through the tier's copies
// (SaveOptions::save_qgz_residuals): its rank files, synchronous and asynchronous, are the host engine's byte for
// byte, and a device engine that loads them trains on as the host engine does without a pause, bit for bit. (On this
// emulated tier the memory is host memory, so a direct host read would read the right bytes too; what this proves
// is the flow: the same bytes saved and restored where the device paths run.)
TEST(AsyncTierCheckpointTest, QgzResidualsSaveAndResumeThroughTheTier) {
  const Case c = Qgz(Case{"", 4, 3, DType::kBF16, 1}, 8, 2);
  const Config cfg = CaseConfig(c);
  constexpr int kBefore = 3, kAfter = 2;
  const std::string dir = testing::MakeTempDir("zero_async_tier_qgz");
  InstallAsyncTier();
  SyntheticTrace whole[4], resumed[4];
  testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
    // Host engine: kBefore steps, a save with the residuals, kAfter steps.
    {
      t_binding = nullptr;
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm), CaseOptions(c)));
      SyntheticTrace before;
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kBefore, c.ga, testing::HostViewIo(), &before));
      SaveOptions so;
      so.save_qgz_residuals = true;
      so.tag = "host";
      ASSERT_OK(e->Save(dir, so).status());
      ASSERT_NO_FATAL_FAILURE(
          testing::TrainSynthetic(*e, kAfter, c.ga, testing::HostViewIo(), &whole[rank], /*first_step=*/kBefore));
    }
    // Device engines: the same kBefore steps and saves, synchronous and asynchronous; then one that loads.
    for (const bool async : {false, true}) {
      DrainingComm draining(comm);
      ASSERT_OK_AND_ASSIGN(AsyncEngine e, MakeAsyncEngine(cfg, draining, CaseOptions(c)));
      ASSERT_TRUE(e.engine->on_device());
      SyntheticTrace before;
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e.engine, kBefore, c.ga, e.io(), &before));
      SaveOptions so;
      so.save_qgz_residuals = true;
      so.async = async;
      so.tag = async ? "device_async" : "device";
      ASSERT_OK(e.engine->Save(dir, so).status());
      ASSERT_OK(e.engine->WaitForSave());
    }
    DrainingComm draining(comm);
    ASSERT_OK_AND_ASSIGN(AsyncEngine e, MakeAsyncEngine(cfg, draining, CaseOptions(c)));
    LoadOptions lo;
    lo.tag = "device_async";
    ASSERT_OK(e.engine->Load(dir, lo).status());
    ASSERT_NO_FATAL_FAILURE(
        testing::TrainSynthetic(*e.engine, kAfter, c.ga, e.io(), &resumed[rank], /*first_step=*/kBefore));
  });
  for (int r = 0; r < c.world; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    const std::string name = ckpt::RankFileName(r, c.world);
    const std::string host = testing::ReadWholeFile(absl::StrCat(dir, "/host/", name));
    EXPECT_GT(host.size(), 0u);
    EXPECT_TRUE(testing::ReadWholeFile(absl::StrCat(dir, "/device/", name)) == host) << "synchronous save";
    EXPECT_TRUE(testing::ReadWholeFile(absl::StrCat(dir, "/device_async/", name)) == host) << "asynchronous save";
    testing::ExpectSameParams(resumed[r], whole[r]);
  }
  ASSERT_OK_AND_ASSIGN(auto reader, ckpt::CheckpointReader::Open(dir, "device_async"));
  EXPECT_EQ(reader->meta().ranks[1].rank_state.size(), 2 * testing::SyntheticUnits().size())
      << "both hops' residuals of every unit";
}

// A device out of memory while the engine fills its pools is an error naming the buffer and the unit, returned
// before any collective sees a null buffer (NCCL would abort the communicator for every rank).
TEST(AsyncTierFailureTest, AllocationFailureIsAnErrorNotANullCollective) {
  for (MemTag failing : {MemTag::kGather, MemTag::kBuckets}) {
    SCOPED_TRACE(MemTagName(failing));
    InstallAsyncTier(
        [failing](AsyncTier& tier) { tier.fail_alloc = [failing](MemTag tag, size_t) { return tag == failing; }; });
    testing::RunRanks(1, [&](Communicator& comm, int) {
      DrainingComm draining(comm);
      t_binding = &draining;
      auto e = testing::MakeSyntheticEngine(TrainConfig(3, 1), Borrow(draining));
      t_binding = nullptr;
      ASSERT_OK(e);
      const UnitId a = (*e)->FindUnit("a");
      Status s;
      if (failing == MemTag::kGather) {
        s = (*e)->Forward(a).status();
      } else {
        auto b = (*e)->Backward(a);  // the gather works; the gradient bucket fails
        s = b.status();
      }
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("unit a")));
    });
    internal::SetGlooEngineComputeForTesting({});
  }
}

// The device engine's stream-ordered joins cannot see a dead peer; Step waits on the communicator's fence
// first, once per step, and a failed fence is Step's error (not a hang behind a stream synchronize).
TEST(AsyncTierFailureTest, StepWaitsOnTheFenceAndReportsItsFailure) {
  InstallAsyncTier();
  testing::RunRanks(1, [&](Communicator& comm, int) {
    DrainingComm draining(comm);
    t_binding = &draining;
    auto e = testing::MakeSyntheticEngine(TrainConfig(2, 1), Borrow(draining));
    t_binding = nullptr;
    ASSERT_OK(e);
    AsyncTier* tier = t_tier;
    testing::SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(**e, 2, 1, testing::HostViewIo([tier] { tier->Drain(); }), &t));
    EXPECT_EQ(draining.fences, 2);  // one per step
    draining.fail_fence = true;
    for (UnitId id = 0; id < 4; ++id) {
      auto b = (*e)->Backward(id);
      ASSERT_OK(b);
    }
    auto r = (*e)->Step();
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("waiting for this step's collectives")));
  });
  internal::SetGlooEngineComputeForTesting({});
}

// hpZ's backward gathers run on the host group's communicator, whose stream no shard-group op need follow: Step
// fences it too, and a failed fence there is Step's error naming it (before, a hung peer inside the host group
// went unnoticed until a stream synchronize waited behind the gather forever).
TEST(AsyncTierFailureTest, StepFencesHpzsHostGroupToo) {
  InstallAsyncTier();
  Config cfg = TrainConfig(3, 1);
  cfg.zero.zero_hpz_partition_size = 2;
  EngineOptions o;
  o.local_world_size = 2;
  testing::RunRanks(2, [&](Communicator& comm, int) {
    DrainingComm draining(comm);
    t_binding = &draining;
    auto e = testing::MakeSyntheticEngine(cfg, Borrow(draining), o);
    t_binding = nullptr;
    ASSERT_OK(e);
    ASSERT_EQ(draining.splits.size(), 1u);  // hpZ's host group
    DrainingComm& host_group = *draining.splits[0];
    AsyncTier* tier = t_tier;
    testing::SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(**e, 2, 1, testing::HostViewIo([tier] { tier->Drain(); }), &t));
    EXPECT_EQ(draining.fences, 2);  // one per step on each communicator
    EXPECT_EQ(host_group.fences, 2);
    host_group.fail_fence = true;
    for (UnitId id = 0; id < 4; ++id) {
      { ASSERT_OK((*e)->Forward(id).status()); }
      ASSERT_OK((*e)->Backward(id).status());
    }
    auto r = (*e)->Step();
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("collectives on hpZ's host group")));
  });
  internal::SetGlooEngineComputeForTesting({});
}

}  // namespace
}  // namespace zero
