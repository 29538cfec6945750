// zero/communicator.h — every collective zero performs goes through a Communicator.
//
//   auto store = zero::Store::Hash();
//   ZERO_ASSIGN_OR_RETURN(auto comm, zero::Communicator::CreateGloo(store, rank, world, {}));
//   zero::Work w = comm->AllGather(my_shard, full, shard_elems, zero::DType::kF32);
//   ZERO_RETURN_IF_ERROR(w.Wait());
//
// ORDERING CONTRACT: all ranks issue the same collectives, with the same counts and dtypes, in the same order
// (as in NCCL and torch.distributed). Each op gets a per-communicator sequence number; with
// CommOptions::check_order (or ZERO_COMM_CHECK=1) every op also exchanges a fingerprint (op, dtype, count,
// root) first, so a desync fails with an error naming both ranks' ops instead of hanging or corrupting data.
//
// Ops are asynchronous: they return a Work at once and run in issue order on a communication thread (Gloo,
// host memory; a caller blocked in Work::Wait may run queued ops itself) or on a library-owned CUDA stream
// (NCCL, device memory). A buffer passed to an op must stay
// alive and untouched until its Work completes. Ops are not thread-safe with respect to each other: issue
// them from one thread per communicator.
//
// Failures: a peer that dies, hangs or never arrives makes every pending and later op fail with
// kUnavailable or kDeadlineExceeded within CommOptions::timeout; after the first failure the communicator
// is broken and every later op fails at once with the same cause.
//
// Lifetime: the factories (FromEnv, CreateGloo, CreateNccl, Split) return a shared_ptr, the type Engine::Create and
// ShardedOptimizer::Create take, so `Engine::Create(cfg, *comm)` shares it with the engine; the engine keeps it
// alive as long as it lives.
//
// Subclassing: a trainer may implement its own Communicator (another transport, or a wrapper that counts or
// delays ops) by overriding the pure virtuals; the Engine runs over any Communicator. The strided collectives,
// staging sizes and op hash the engine also uses when a communicator offers them are in
// zero/advanced/communicator_ext.h (advanced::ExtendedCommunicator, which the Gloo and NCCL communicators are).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/memory.h"
#include "zero/status.h"
#include "zero/store.h"
#include "zero/work.h"

struct CUstream_st;

namespace zero {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };

enum class Backend : uint8_t { kGloo, kNccl };

struct CommOptions {
  // Per-op and rendezvous timeout (config key comm_timeout_s; torch's default is 30 min), in [1 ms, 1e9 s].
  // Engine::Create and ShardedOptimizer::Create hold it against the config's comm_timeout_s (see
  // Communicator::FromEnv(backend, config)).
  absl::Duration timeout = absl::Seconds(1800);
  // The job this rank belongs to: ranks whose ids differ refuse each other at rendezvous, before any data moves
  // (two jobs on one MASTER_PORT). "" = no id (then any rank can join). FromEnv fills it from ZERO_JOB_ID,
  // TORCHELASTIC_RUN_ID or SLURM_JOB_ID when it is empty. See docs/internals/comm.md, "Rendezvous checks".
  std::string job_id = "";
  // Exchange an op fingerprint before every op to detect desync (also ZERO_COMM_CHECK=1).
  bool check_order = false;
  // Gloo: the address to bind the TCP transport to ("" = the host's name; tests use 127.0.0.1).
  std::string hostname = "";
  // Prefix for store keys, so several communicators can share one store.
  std::string prefix = "zero";
  // NCCL: the CUDA device ordinal.
  int device = 0;
  // Gloo: the most bytes of staging kept cached between ops — the reduce-scatter instances (Gloo's receive
  // buffers, about twice an op's input, and a staged copy of the input where there is one) and the f32 scratch
  // of 16-bit all-reduces. An op that needs a new instance or more scratch first releases least recently used
  // instances until what stays cached and what it needs fit; after the op, what is cached beyond the budget is
  // released (an op that alone needs more still runs, and rebuilds its instance the next time). So the staging
  // is at most cache_bytes between ops and at most the larger of cache_bytes and one op's need during one
  // (advanced::ExtendedCommunicator::ReduceScatterStagingBytes). Every rank must give the same value: CreateGloo
  // checks it.
  int64_t cache_bytes = int64_t{1} << 30;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual Backend backend() const = 0;
  // The per-op timeout it was created with (CommOptions::timeout after ZERO_COMM_TIMEOUT_S); zero where the
  // implementation does not say (then Engine::Create does not hold it against the config).
  virtual absl::Duration timeout() const { return absl::ZeroDuration(); }

  // The host buffers this communicator holds (f32 staging for 16-bit reductions, reduce-scatter input copies and
  // working buffers, and Gloo's receive buffers inside cached reduce-scatter instances), under
  // MemTag::kStaging; the Engine adds them to its report. Thread-safe.
  virtual MemoryReport memory_report() const { return {}; }
  // The tracker behind memory_report(), or nullptr when there is none. Each Engine over this communicator
  // counts it into its own tracker while it lives (MemoryTracker::CountAlsoIn), so the engine's peak_total is
  // the high-water mark of the engine's bytes and this staging alive at once, not a sum of two peaks. A
  // communicator that reports memory but returns nullptr here makes the engine's peak_total an upper bound.
  virtual MemoryTracker* memory_tracker() { return nullptr; }
  // Gathers `count` elements from every rank: recv[r*count .. (r+1)*count) receives rank r's `send`.
  // `send` may alias recv + rank*count (in-place).
  virtual Work AllGather(const void* send, void* recv, size_t count, DType dtype, CUstream_st* stream = nullptr) = 0;

  // Reduces `send` (world_size*count elements) across ranks and leaves block `rank` (count elements) of the
  // result in `recv`. kAvg divides by world_size. 16-bit inputs: Gloo reduces them in f32 and rounds once;
  // NCCL reduces in the 16-bit type at each step of its algorithm (as torch.distributed does), so at world
  // sizes above 2 the two can differ in the last bits (the engine's default wire type is fp32 for this reason).
  virtual Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                             CUstream_st* stream = nullptr) = 0;

  // Like ReduceScatter, but `send` is scratch: once the Work completes its contents are unspecified (block
  // `rank` of the result is in `recv`, which may alias send + rank*count). Gloo reduces f32 in place in the
  // caller's buffer instead of staging a copy of it (the copy is ~15% of a large reduce-scatter at world 4 on
  // a 2-core host); it keeps Gloo's algorithm built over the buffer, so it pays off when the same buffer is
  // reduce-scattered again and again (gradient buckets), while a new buffer each call costs a rebuild.
  // 16-bit inputs and NCCL behave exactly like ReduceScatter. All ranks must use the same variant for an op.
  virtual Work ReduceScatterDestructive(void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                        CUstream_st* stream = nullptr) {
    return ReduceScatter(send, recv, count, dtype, op, stream);
  }

  // In-place all-reduce of `count` elements.
  virtual Work AllReduce(void* buf, size_t count, DType dtype, ReduceOp op, CUstream_st* stream = nullptr) = 0;

  // Copies `count` elements of `root`'s buffer into every rank's buffer.
  virtual Work Broadcast(void* buf, size_t count, DType dtype, int root, CUstream_st* stream = nullptr) = 0;

  virtual Work Barrier() = 0;

  // A Work that completes once every op issued before it has completed; it issues nothing and involves no
  // other rank. Its Wait notices a dead or hung peer like an op's Wait (the communicator's timeout, NCCL's
  // asynchronous error), which a stream-ordered join (Work::WaitStream) cannot: a host that only stream-waits
  // and then synchronizes a stream behind a hung collective would block forever. NCCL: an event at the end of
  // the communication stream. Gloo (whose Waits already notice failures): an already completed Work.
  virtual Work Fence() { return Work(); }

  // What the caller is doing, for error messages and the desync check: every op issued while a label is set
  // carries it ("AllGather#12(bf16, 4096 elements) [forward gather of unit h.3]") and its hash joins the op's
  // fingerprint, so ranks that issue the same ops for different reasons (another unit order) differ. The
  // Engine labels its collectives with the phase and the unit; a trainer may label its own. Issuing thread only.
  void SetLabel(std::string label) { label_ = std::move(label); }
  const std::string& label() const { return label_; }
  // The last ops issued (up to 12), oldest first, as error messages describe them.
  virtual std::vector<std::string> RecentOps() const { return {}; }
  // The bytes this rank has sent so far by the bandwidth-optimal algorithm of each op issued: nccl-tests' bus
  // bytes (all-gather and reduce-scatter: (N - 1) per-rank blocks; all-reduce: 2 (N - 1) / N of the buffer;
  // broadcast: the buffer). A model of the traffic, not a count of the wire's bytes: Gloo's reduce-scatter at a
  // world that is not a power of two sends more. 0 when the implementation does not count.
  virtual int64_t bus_bytes() const { return 0; }
  // The payload bytes this rank has sent to each rank of this communicator (indexed by rank here), as the
  // implementation's algorithms send them: Gloo's ring all-gather and all-reduce, halving-doubling reduce-scatter
  // and binomial broadcast, message by message (comm/internal/op.h, AddGlooSends). What the library sends, not
  // a measurement of the wire (no protocol headers). Empty when the implementation does not count (NCCL).
  virtual std::vector<int64_t> bytes_sent_to_ranks() const { return {}; }

  // A communicator over the ranks of this one that pass the same `color` (>= 0), ranked by (`key`, rank here),
  // as MPI_Comm_split and ncclCommSplit: hybrid sharding's shard groups and replica groups. Collective: every
  // rank calls it, in the same place in its sequence of ops. The new communicator has this one's options
  // (timeout, checks) and fails the same ways; it is independent of this one once made (its own connections
  // and ops), and either may be destroyed first. kUnimplemented where the implementation cannot split.
  virtual StatusOr<std::shared_ptr<Communicator>> Split(int color, int key);

  // The CUDA device the communicator's memory and streams are on (NCCL), or -1 (Gloo: host memory).
  virtual int cuda_device() const { return -1; }

  // Host-memory communicator over Gloo's TCP transport. Blocks until all `world_size` ranks connected
  // through `store` or `options.timeout` passed (kDeadlineExceeded naming the store key of a missing rank).
  // The communicator keeps `store` alive. Destroying it waits for its queued ops to finish or fail, then for
  // the other ranks to destroy theirs (a barrier, at most min(timeout, 60 s), skipped once an op failed), so
  // that no rank closes its connections while a peer is still finishing an op with it.
  static StatusOr<std::shared_ptr<Communicator>> CreateGloo(std::shared_ptr<Store> store, int rank, int world_size,
                                                            const CommOptions& options = {});

  // Device-memory communicator over NCCL (ncclUniqueId exchanged through `store`). kUnimplemented when zero
  // was built without CUDA. `stream` arguments of ops name the stream the input was produced on: the
  // library's communication stream waits for it by event. Leaves options.device the calling thread's current
  // device (as torch.cuda.set_device would), so that thread's later CUDA work goes to the same GPU.
  // Part of zero::cuda: kUnimplemented too, saying so, when the program does not link zero::cuda.
  static StatusOr<std::shared_ptr<Communicator>> CreateNccl(std::shared_ptr<Store> store, int rank, int world_size,
                                                            const CommOptions& options = {});

  // Builds a communicator from launcher variables: torchrun (RANK, WORLD_SIZE, LOCAL_RANK), OpenMPI
  // (OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK), Slurm's srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID), in
  // that order of precedence; Slurm's variables without SLURM_STEP_NUM_TASKS are an sbatch script's, one process,
  // refused with kInvalidArgument where they say more than one task. Rendezvous: ZERO_STORE_DIR selects a file store
  // (zero-run sets it), else MASTER_ADDR and MASTER_PORT a TCP store served by rank 0; without launcher variables,
  // world size 1. kNccl uses LOCAL_RANK as the CUDA device. ZERO_COMM_CHECK / ZERO_COMM_TIMEOUT_S override `options`.
  // See docs/guide/launching.md. Rendezvous checks (docs/internals/comm.md): the ranks must agree on the world size and
  // the job id (options.job_id, else ZERO_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID) before any transport is built; a
  // disagreement fails every rank that arrived with kFailedPrecondition naming both sides.
  static StatusOr<std::shared_ptr<Communicator>> FromEnv(Backend backend, const CommOptions& options = {});
  // The communicator for an engine: as above, with the timeout (rendezvous and ops) taken from the config's
  // comm_timeout_s, so that the config is the one place it is set (ZERO_COMM_TIMEOUT_S still overrides it).
  // `options` gives the rest (its timeout is ignored).
  static StatusOr<std::shared_ptr<Communicator>> FromEnv(Backend backend, const Config& config,
                                                         const CommOptions& options = {});
  // Whether this process was started as one rank by a launcher FromEnv understands (a rank variable of torchrun or
  // zero-run, OpenMPI or Slurm is set): a trainer then takes its rank from FromEnv instead of spawning its own.
  static bool Launched();
  // The ranks on this host, as the launcher says: LOCAL_WORLD_SIZE (torchrun, zero-run), OMPI_COMM_WORLD_LOCAL_SIZE
  // (OpenMPI), or this node's count in SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE (Slurm's srun); 0 where
  // it does not say (or its variables do not read; FromEnv then says why). What EngineOptions::local_world_size
  // defaults to, and what a trainer divides the host's cores by.
  static int LaunchedLocalWorldSize();
  // The ranks in the launched job (WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_STEP_NUM_TASKS, as FromEnv reads them); 0
  // where no launcher started this process or its variables do not read (FromEnv says why). A trainer that runs
  // alone unless told otherwise checks this, whichever launcher started it.
  static int LaunchedWorldSize();

 private:
  std::string label_;
};

// Sets a communicator's label for a scope and restores the previous one at its end.
class CommLabel {
 public:
  CommLabel(Communicator* comm, std::string label) : comm_(comm), saved_(comm->label()) {
    comm_->SetLabel(std::move(label));
  }
  ~CommLabel() { comm_->SetLabel(std::move(saved_)); }
  CommLabel(const CommLabel&) = delete;
  CommLabel& operator=(const CommLabel&) = delete;

 private:
  Communicator* comm_;
  std::string saved_;
};

}  // namespace zero
