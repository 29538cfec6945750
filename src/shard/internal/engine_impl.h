// shard/internal/engine_impl.h — Engine::Impl: the shared context and the components, wired (shard/engine.cc);
// values in and out live in shard/values.cc. defines: Engine::Impl.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/internal/format.h"
#include "offload/copy_stream.h"
#include "shard/internal/async_save.h"
#include "shard/internal/context.h"
#include "shard/internal/gather.h"
#include "shard/internal/grad_reducer.h"
#include "shard/internal/plan.h"
#include "shard/internal/registration.h"
#include "shard/internal/step.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"
#include "zero/sharded_optimizer.h"

namespace zero {

class Engine::Impl {
 public:
  // `shard`/`replica`: hybrid sharding's groups (Engine::Create), or null; `hpz`: hpZ's host group, or null;
  // `qgz_host`/`qgz_across`: qgZ's two hops' groups, or null.
  Impl(const Config& cfg, std::shared_ptr<Communicator> comm, std::shared_ptr<Communicator> shard,
       std::shared_ptr<Communicator> replica, EngineOptions opts, std::shared_ptr<Communicator> hpz = nullptr,
       std::shared_ptr<Communicator> qgz_host = nullptr, std::shared_ptr<Communicator> qgz_across = nullptr);
  ~Impl();

  Status Init();
  StatusOr<UnitId> AddUnit(const std::string& name, std::vector<ParamSpec> params);
  UnitId FindUnit(const std::string& name) const;
  // The placement plan of the units registered so far under this engine's policy.
  internal::StagePlan Plan() const;
  Status Finalize(const ParamInit& init);
  Status CopyIn(UnitId id, const std::string& name, const float* values);
  StatusOr<UnitScope> Open(Engine* engine, UnitId id, bool backward);
  Status Close(UnitId id, bool backward);
  StatusOr<StepResult> Step(const StepOptions& options);
  // zero/sharded_optimizer.h: a unit over the trainer's buffers, and a step that reduces them first.
  Status ReloadTrainerParams(UnitId id);
  // Buffer pair `index` of ShardedOptimizer::Create (its errors say "FlatBuffers[index] \"name\"").
  StatusOr<UnitId> AddTrainerUnit(FlatBuffers fb, int index);
  // After Finalize's groups are resolved: a pair without a gradient buffer must be frozen.
  Status CheckTrainerGrads() const;
  StatusOr<StepResult> StepTrainerOwned(const StepOptions& options);
  Status GradientsReady(UnitId id);
  Status ReduceTrainerUnit(UnitId id);
  StatusOr<TensorView> ParamView(UnitId id, const std::string& name) const;
  // A view / the base for an open UnitScope of unit `id` (`scope_backward`: the scope's kind): errors for an
  // unknown name, and for a gradient outside a backward scope or of a frozen unit.
  StatusOr<TensorView> ScopeView(UnitId id, bool scope_backward, const std::string& name, bool grad) const;
  StatusOr<void*> ScopeBase(UnitId id, bool scope_backward, bool grad) const;
  StatusOr<std::vector<float>> GatherParam(UnitId id, const std::string& name);
  // Checkpoints (shard/checkpoint.cc).
  StatusOr<std::string> Save(const std::string& dir, const SaveOptions& options);
  Status WaitForSave();
  // At the end of a successful Step, when an asynchronous save is in flight: the ranks look whether every
  // background write is done, without waiting for one; if so it is committed (or its failure kept for the next
  // Save, WaitForSave or Load). Collective (the same on every rank: in_flight is).
  void PollSave();
  StatusOr<LoadResult> Load(const std::string& dir, const LoadOptions& options);
  Status LoadSafetensors(const std::string& path, const LoadOptions& options);
  // Live recovery (shard/regroup.cc, zero/elastic.h), between steps only. Regroup: `world` (every rank of the
  // groups now present, this group's ranks at the same places modulo the group size) becomes the job-wide
  // communicator and the replica group is split from it (none when `world` is this group alone); the config is
  // validated at the new world size, whose accumulation steps must stay. Collective on `world`.
  Status Regroup(std::shared_ptr<Communicator> world);
  // Forgets the job-wide communicators after a replica group was lost (this group alone until Regroup).
  void DropJobComms();
  // Every persistent buffer of every unit (parameters, master, optimizer state, in both tiers) and the step's
  // counters and loss scale, from replica group `root` to the others: bitwise the root group's state.
  // Collective on the replica group.
  Status BroadcastState(int root);
  // A registered unit, or nullptr for an id no unit has.
  const internal::Unit* UnitOrNull(UnitId id) const;

  // Members in construction order; destroyed in reverse, so the copy stream (last) finishes every queued copy
  // while the buffers it reads still exist.
  internal::EngineContext ctx;
  internal::HostCollectives host;        // over ctx.comm: the shard group (the step's norm and checks, gathers)
  internal::HostCollectives world_host;  // over ctx.world_comm: every rank (Finalize's and checkpoints' agreement)
  internal::GatherScheduler gathers;
  internal::GradReducer reducer;
  internal::ShardedStep step;
  int64_t num_params_ = 0;
  internal::CopyStream copies;
  // Last: destroyed first, joining a background write while the tracker its staging is counted in still exists.
  internal::AsyncSave async_save;

 private:
  Status InitDevice();
  Status CheckUnit(UnitId id, const char* what) const;
  Status ResolveGroups();
  Status CreateNvmeStore(const internal::StagePlan& plan);
  Status CreateNvmeParamTier(const internal::StagePlan& plan);
  Status CheckGroupsMatch() const;
  // kInvalidArgument: `what`("name") on this rank, unit `u` has no such parameter, listing the ones it has.
  Status UnknownParam(const char* what, const internal::Unit& u, const std::string& name) const;
  Status CheckScopeGrad(const internal::Unit& u, bool scope_backward, const char* what, const std::string& name) const;
  void LogUnshardedUnits(const internal::StagePlan& plan) const;
  // Checkpoints: a unit's values by stream (see shard/checkpoint.cc for the streams and where they live).
  struct StreamDesc {
    std::string name;  // "master", "param", "state.<name>"
    DType dtype;
    enum Kind { kMaster, kParam, kState } kind;
    int state;   // kState: the optimizer state's index
    bool saved;  // written by Save (else only loaded: the 16-bit parameters are derived from the master)
  };
  // A buffer holding unit elements [begin, begin + n) from its index 0.
  struct Segment {
    Buffer* buffer;
    int64_t begin, n;
  };
  std::vector<StreamDesc> Streams(const internal::Unit& u) const;       // what Load fills
  std::vector<StreamDesc> SavedStreams(const internal::Unit& u) const;  // what Save writes
  // Where this rank holds stream `s` of `u`; for_write adds the copies a load must also fill (fp32's host master).
  std::vector<Segment> Segments(internal::Unit& u, const StreamDesc& s, bool for_write);
  void ReadBuffer(const Buffer& b, int64_t at, size_t elem_size, void* host_dst, int64_t n);
  void WriteBuffer(Buffer& b, int64_t at, size_t elem_size, const void* host_src, int64_t n);
  size_t PieceElems() const;
  // Save and Load run between Steps only: no scope open, no gradient-accumulation cycle begun.
  Status CheckCheckpointable(const char* what) const;
  // Every rank's outcome of a collective operation: this rank's error, or one naming the first rank that
  // failed, so a failure anywhere fails everywhere.
  StatusOr<std::string> AgreeOnStatus(const Status& mine, const char* what);
  // with_qgz: the description records the qgZ residuals' layout and reset_T counts (SaveOptions::save_qgz_residuals).
  ckpt::Meta DescribeForCheckpoint(const std::string& tag, bool with_qgz = false) const;
  // Asynchronous saves (shard/checkpoint.cc). StartAsyncSave: this rank's part into the staging, the worker
  // started (local). FinishSave: the ranks' agreement on the save in flight (collective): `wait` joins this
  // rank's worker first; without it, returns false (nothing changed) while any rank's worker still writes.
  // Once all are done: a failure anywhere is returned on every rank (latest unchanged); else rank 0 writes
  // meta.json and latest, and true.
  Status CheckTagAgrees(const std::string& tag);  // collective: every rank's Save asks for the same tag
  Status StartAsyncSave(const std::string& dir, const std::string& tag, const SaveOptions& options);
  StatusOr<bool> FinishSave(bool wait, const char* what);
  // Save's and Load's first step while a save is in flight: wait for it (or refuse, for a Save that asks),
  // returning its failure or one a Step found.
  Status SettleSave(const char* what, SaveOptions::InFlight policy);
  // Save's last step: every writer's RankFileMeta to rank 0, which writes meta.json and `latest`; the ranks
  // agree on the outcome. Collective.
  Status CommitSave(const std::string& dir, ckpt::Meta meta, ckpt::RankFileMeta mine, const char* what);
  // Finalize: every rank evaluates each parameter in full and keeps its part.
  Status InitialValues(const ParamInit& init);
  // One parameter's full values on their way in (Finalize, CopyIn), before the ranks agree on them.
  struct ValuesToAgree {
    UnitId unit;
    const internal::ParamSlot* slot;
    std::vector<float> values;
  };
  static constexpr size_t kAgreeBatchBytes = size_t{16} << 20;
  // For each parameter, the ranks whose values differ from rank 0's: one exchange of 8-byte hashes for the
  // whole batch (none with kTrust or at world size 1); with kRequireEqual a difference is the error. Collective
  // unless kTrust.
  StatusOr<std::vector<std::vector<int>>> DifferingRanks(const std::vector<ValuesToAgree>& params, const char* what);
  // Stores one parameter's full values: this rank's part of the parameters and the fp32 master. Local.
  Status Place(UnitId id, const internal::ParamSlot& slot, const float* values);
  // A trainer-owned unit's current values of one parameter, as fp32 on the host.
  void ReadTrainerValues(const internal::Unit& u, const internal::ParamSlot& slot, float* out);
  // Writes n fp32 host values as `dtype` at `dst`, inside buffer `in` (compute or host tier).
  void ToCompute(const float* values, const Buffer& in, void* dst, DType dtype, int64_t n);
};

}  // namespace zero
