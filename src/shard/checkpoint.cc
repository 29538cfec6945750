// shard/checkpoint.cc — the engine's checkpoints: Save, Load (at any world size, stage and offload setting) and
// parameters from a safetensors file. The format and its reader and writer are the checkpoint layer's
// (checkpoint/internal/format.h); this file knows where each value lives in the engine's buffers.
//
// A unit's values are addressed by unit element e in [0, numel). What a rank holds of a stream is a list of
// segments, each a buffer that holds elements [begin, begin + n) from its index 0:
//   param   the parameters (compute dtype): [0, padded) at stages 0-2 and for persistent units, the rank's shard
//           [r·S, r·S + S) at stage 3
//   master  fp32: under mixed precision the master's host part [base, base + host_n) (offload) and device part
//           [base + host_n, base + range); in fp32 the parameters themselves (and, written, the host master)
//   state.k fp32: host part and device part of state k, like the master
// where base = r·S and range = S at stages 1-3, base = 0 and range = padded at stage 0.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/internal/file.h"
#include "checkpoint/internal/format.h"
#include "core/internal/convert_simd.h"
#include "core/internal/fault.h"
#include "io/internal/io_engine.h"
#include "optim/internal/thread_pool.h"
#include "shard/internal/engine_impl.h"
#include "shard/internal/qgz.h"
#include "zero/logging.h"

namespace zero {

namespace {

// The NVMe tier (offload_optimizer.device "nvme") keeps a unit's host-part master and optimizer state in its file,
// not in host buffers. For a checkpoint they are staged, one unit at a time, into temporary host buffers
// (u.host_master, u.host_state, tagged staging) that the streams below read and write as CPU offload's own; the
// destructor drops them, so the host holds at most the largest unit's host part beside the tier's staging. The
// parameter tier (offload_param.device "nvme") likewise: the unit's shard is read into a buffer of the tier's pool
// (internal::ParamStage) that the streams see as u.params, and written back after a load.
class NvmeUnitStage {
 public:
  NvmeUnitStage(internal::EngineContext& ctx, internal::Unit& u, int ui)
      : ctx_(ctx), u_(u), ui_(ui), param_(ctx, u, ui) {}
  ~NvmeUnitStage() {
    if (!active_) return;
    u_.host_master.Reset();
    u_.host_state.clear();
  }
  NvmeUnitStage(const NvmeUnitStage&) = delete;
  NvmeUnitStage& operator=(const NvmeUnitStage&) = delete;

  // Allocates the buffers, filled from the file when `read` (saving), zeros otherwise (loading); the parameter
  // shard is read either way (a load writes all of it, but what it leaves is then what was there).
  Status Begin(bool read) {
    ZERO_RETURN_IF_ERROR(param_.Begin(/*read=*/true, /*in_step=*/false));
    if (!ctx_.nvme || u_.frozen || u_.host_n() <= 0) return absl::OkStatus();
    active_ = true;
    int field = 0;
    auto take = [&](Buffer* b) -> Status {
      Status err;
      *b = Buffer::Host(&ctx_.tracker, MemTag::kStaging, static_cast<size_t>(u_.host_n()) * 4, MemTier::kHost, &err);
      if (!err.ok()) {
        return Status(err.code(), absl::StrCat("unit ", u_.name(), ": staging its NVMe-tier state on rank ",
                                               ctx_.world_rank, ": ", err.message()));
      }
      if (read) ZERO_RETURN_IF_ERROR(ctx_.nvme->ReadField(ui_, field, 0, u_.host_n(), b->as<float>()));
      ++field;
      return absl::OkStatus();
    };
    if (!ctx_.policy.MasterIsHostParams()) ZERO_RETURN_IF_ERROR(take(&u_.host_master));
    u_.host_state.resize(static_cast<size_t>(ctx_.policy.optimizer_states));
    for (Buffer& b : u_.host_state) ZERO_RETURN_IF_ERROR(take(&b));
    return absl::OkStatus();
  }
  // Writes the buffers (as loaded) to the file.
  Status WriteBack() {
    ZERO_RETURN_IF_ERROR(param_.Commit());
    if (!active_) return absl::OkStatus();
    int field = 0;
    if (!u_.host_master.empty()) {
      ZERO_RETURN_IF_ERROR(ctx_.nvme->WriteField(ui_, field++, 0, u_.host_n(), u_.host_master.as<float>()));
    }
    for (const Buffer& b : u_.host_state) {
      ZERO_RETURN_IF_ERROR(ctx_.nvme->WriteField(ui_, field++, 0, u_.host_n(), b.as<float>()));
    }
    return absl::OkStatus();
  }

 private:
  internal::EngineContext& ctx_;
  internal::Unit& u_;
  const int ui_;
  bool active_ = false;
  internal::ParamStage param_;
};

}  // namespace

using internal::Unit;

namespace {

// Elements per piece while streaming a unit's values through host memory: 1 MiB of fp32, one checksum block of
// the format (which the reader reads and checks whole anyway), so Save and Load stage a small fixed chunk, not
// a whole unit (at 16 MiB a piece was the whole unit of most models: 4 bytes per element beside the model state).
constexpr int64_t kPieceElems = int64_t{1} << 18;
constexpr int64_t kMinPieceElems = 4096;

std::string StatePrefix(const std::string& name) { return "state." + name; }

// The name a parameter has in a checkpoint or file: through LoadOptions::name_map, else its own.
std::string TheirName(const LoadOptions& options, const std::string& mine) {
  auto mapped = options.name_map.find(mine);
  return mapped == options.name_map.end() ? mine : mapped->second;
}

// SaveOptions::save_qgz_residuals: refused where there is nothing to save or it cannot be saved.
Status CheckQgzResidualsSavable(const internal::EngineContext& c) {
  if (c.policy.qgz_bits == 0 || !c.policy.qgz_loco) {
    return absl::InvalidArgumentError(
        "Save: SaveOptions::save_qgz_residuals is set, but this run keeps no qgZ residuals (they exist with "
        "zero_quantized_gradients and its error feedback, zero_quantized_gradients_error_feedback, on)");
  }
  if (c.world_size != c.world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Save: SaveOptions::save_qgz_residuals with hybrid sharding (", c.world_size / c.world, " groups of ", c.world,
        " ranks): every group keeps its own residuals and only the first group writes the checkpoint"));
  }
  return absl::OkStatus();
}

// Rank `rank`'s rank-state section of unit `unit`, stream k, in checkpoint `m` (null: none).
const ckpt::Section* RankStateSection(const ckpt::Meta& m, int rank, int unit, int k) {
  for (const ckpt::Section& s : m.ranks[rank].rank_state) {
    if (s.unit == unit && s.stream == k) return &s;
  }
  return nullptr;
}

// The elements of a unit's residual for rank-state stream k (0 where it has none).
int64_t QgzResidualElems(internal::EngineContext& c, Unit& u, int k) {
  return static_cast<int64_t>(internal::QgzResidual(u, k).size() / DTypeSize(c.cd()));
}

// This rank's qgZ residuals in the order its rank file holds them (by unit, then rank-state stream), those it keeps.
struct ResidualRef {
  int unit, stream;
  int64_t elems;
};
std::vector<ResidualRef> KeptQgzResiduals(internal::EngineContext& c) {
  std::vector<ResidualRef> out;
  for (size_t ui = 0; ui < c.units.size(); ++ui) {
    for (int k = 0; k < ckpt::kRankStateStreamCount; ++k) {
      const int64_t n = QgzResidualElems(c, c.units[ui], k);
      if (n > 0) out.push_back({static_cast<int>(ui), k, n});
    }
  }
  return out;
}

}  // namespace

std::function<void(int world_rank)>& internal::AsyncSaveTestHook() {
  static std::function<void(int)> hook;
  return hook;
}

std::function<void(int, int64_t, int64_t, double)>& internal::AsyncSavePaceHook() {
  static std::function<void(int, int64_t, int64_t, double)> hook;
  return hook;
}

int64_t internal::PacedChunkBytes(int64_t bytes_per_s, int64_t align) {
  constexpr int64_t kMax = int64_t{8} << 20;
  return std::max(align, std::min(bytes_per_s / 50, kMax) / align * align);
}

size_t Engine::Impl::PieceElems() const {
  int64_t largest = 0;
  for (const Unit& u : ctx.units) largest = std::max(largest, u.layout.padded);
  // And at most an eighth of the largest unit (at least kMinPieceElems): for a small model registered as one
  // unit (ShardedOptimizer's flat buffer), a piece of the whole unit would be 4 bytes per element beside model
  // state of 8/N (the optimizer's shard): more than stage 1 saves at 2 ranks.
  return static_cast<size_t>(std::min({kPieceElems, largest, std::max(largest / 8, kMinPieceElems)}));
}

std::vector<Engine::Impl::StreamDesc> Engine::Impl::Streams(const Unit& u) const {
  std::vector<StreamDesc> s;
  if (!u.frozen) s.push_back({"master", DType::kF32, StreamDesc::kMaster, -1, true});
  // The 16-bit parameters are the master rounded to nearest even, except under stochastic rounding: only then
  // (and for a frozen unit, which has no master) are they saved.
  const bool stochastic = ctx.cd() == DType::kBF16 && ctx.cfg.bf16.stochastic_rounding;
  if (u.frozen || ctx.mixed()) {
    s.push_back({"param", ctx.cd(), StreamDesc::kParam, -1, /*saved=*/u.frozen || stochastic});
  }
  if (!u.frozen) {
    const std::vector<std::string> names = step.optimizer().StateNames();
    for (size_t k = 0; k < names.size(); ++k) {
      s.push_back({StatePrefix(names[k]), DType::kF32, StreamDesc::kState, static_cast<int>(k), true});
    }
  }
  return s;
}

std::vector<Engine::Impl::StreamDesc> Engine::Impl::SavedStreams(const Unit& u) const {
  std::vector<StreamDesc> s = Streams(u);
  s.erase(std::remove_if(s.begin(), s.end(), [](const StreamDesc& d) { return !d.saved; }), s.end());
  return s;
}

std::vector<Engine::Impl::Segment> Engine::Impl::Segments(Unit& u, const StreamDesc& s, bool for_write) {
  const int64_t S = u.layout.shard, padded = u.layout.padded;
  const int64_t base = ctx.stage() == 0 ? 0 : static_cast<int64_t>(ctx.rank) * S;
  const int64_t range = ctx.stage() == 0 ? padded : S;
  const int64_t hn = u.host_n();
  std::vector<Segment> out;
  auto add = [&](Buffer* b, int64_t begin, int64_t n) {
    if (b != nullptr && !b->empty() && n > 0) out.push_back({b, begin, n});
  };
  auto params = [&] {
    if (u.sharded_params()) {
      add(&u.params, static_cast<int64_t>(ctx.rank) * S, S);
    } else {
      add(&u.params, 0, padded);
    }
  };
  switch (s.kind) {
    case StreamDesc::kParam: params(); break;
    case StreamDesc::kMaster:
      if (ctx.mixed()) {
        add(&u.host_master, base, hn);
        add(&u.master, base + hn, range - hn);
      } else {
        params();  // fp32: the parameters are the master
        if (for_write) add(&u.host_master, base, hn);
      }
      break;
    case StreamDesc::kState:
      if (s.state < static_cast<int>(u.host_state.size())) add(&u.host_state[s.state], base, hn);
      if (s.state < static_cast<int>(u.state.size())) add(&u.state[s.state], base + hn, range - hn);
      break;
  }
  return out;
}

void Engine::Impl::ReadBuffer(const Buffer& b, int64_t at, size_t es, void* dst, int64_t n) {
  const char* src = static_cast<const char*>(b.data()) + at * es;
  if (b.tier() == MemTier::kHost || !ctx.compute->device()) {
    std::memcpy(dst, src, n * es);
  } else {
    ctx.compute->CopyToHostSync(dst, src, n * es);
  }
}

void Engine::Impl::WriteBuffer(Buffer& b, int64_t at, size_t es, const void* src, int64_t n) {
  char* dst = static_cast<char*>(b.data()) + at * es;
  if (b.tier() == MemTier::kHost || !ctx.compute->device()) {
    std::memcpy(dst, src, n * es);
  } else {
    ctx.compute->CopyFromHostSync(dst, src, n * es);
  }
}

Status Engine::Impl::CheckCheckpointable(const char* what) const {
  if (!ctx.finalized) return absl::FailedPreconditionError(absl::StrCat(what, ": call Finalize first"));
  for (const Unit& u : ctx.units) {
    if (u.scope_open) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": unit ", u.name(), " has an open ",
                                                        u.scope_backward ? "backward" : "forward",
                                                        " scope; close it first"));
    }
    if (u.backward_count != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": unit ", u.name(), " is in the middle of a gradient-accumulation cycle (", u.backward_count, " of ",
          ctx.ga(), u.trainer_params != nullptr ? " gradient hand-overs" : " micro-steps",
          " done): the partial gradients are not saved, so save or load right after Step()"));
    }
  }
  return ctx.deferred;
}

StatusOr<std::string> Engine::Impl::AgreeOnStatus(const Status& mine, const char* what) {
  CommLabel label(ctx.world_comm.get(), absl::StrCat(what, ": the ranks' outcome"));
  ZERO_ASSIGN_OR_RETURN(auto all, world_host.AllGatherStrings(mine.ok() ? std::string() : std::string(mine.message())));
  if (!mine.ok()) return mine;  // this rank's own error, with its code
  for (int r = 0; r < ctx.world_size; ++r) {
    if (!all[r].empty()) return absl::AbortedError(absl::StrCat(what, ": failed on rank ", r, ": ", all[r]));
  }
  return std::string();
}

// DeepSpeed's checkpoint.tag_validation, always "Fail" here: ranks saving under different tags would write their
// files into different folders, and rank 0 would commit a meta.json (and move `latest`) listing files its folder
// does not have. One all-gather of the tags, before anything is written; every rank fails alike, naming them.
Status Engine::Impl::CheckTagAgrees(const std::string& tag) {
  if (ctx.world_size == 1) return absl::OkStatus();
  CommLabel label(ctx.world_comm.get(), "Save: the ranks' tags");
  ZERO_ASSIGN_OR_RETURN(std::vector<std::string> all, world_host.AllGatherStrings(tag));
  for (int r = 1; r < ctx.world_size; ++r) {
    if (all[r] != all[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("Save: the ranks asked for different tags: rank 0 \"", all[0], "\", rank ", r, " \"", all[r],
                       "\" (every rank must save under the same tag; an empty tag is step-%08d of the applied steps)"));
    }
  }
  return absl::OkStatus();
}

Status Engine::Impl::SettleSave(const char* what, SaveOptions::InFlight policy) {
  internal::AsyncSave& a = async_save;
  if (a.in_flight) {
    if (policy == SaveOptions::InFlight::kRefuse) {
      // A look, not a wait: the ranks agree whether it is done (and commit it if so) before refusing.
      ZERO_ASSIGN_OR_RETURN(const bool finished, FinishSave(/*wait=*/false, what));
      if (!finished) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": the asynchronous save of ", a.dir, "/", a.tag,
                         " is still being written (SaveOptions::if_in_flight = kRefuse); WaitForSave waits for it"));
      }
    } else {
      ZERO_RETURN_IF_ERROR(FinishSave(/*wait=*/true, what).status());
    }
  }
  if (!a.failed.ok()) {  // found by a Step; reported once, on every rank (they all found it in one collective)
    Status f = std::move(a.failed);
    a.failed = absl::OkStatus();
    return f;
  }
  return absl::OkStatus();
}

Status Engine::Impl::WaitForSave() { return SettleSave("WaitForSave", SaveOptions::InFlight::kWait); }

void Engine::Impl::PollSave() {
  if (!async_save.in_flight) return;
  StatusOr<bool> r = FinishSave(/*wait=*/false, "Step");
  if (!r.ok()) async_save.failed = r.status();
}

Status Engine::Impl::CommitSave(const std::string& dir, ckpt::Meta meta, ckpt::RankFileMeta mine, const char* what) {
  const bool writer = ctx.world_rank < ctx.world;
  Status committed = absl::OkStatus();
  std::vector<std::string> all;
  if (writer) {  // a collective of the first group only
    CommLabel label(ctx.comm.get(), absl::StrCat(what, ": the rank files' sections"));
    ZERO_ASSIGN_OR_RETURN(all, host.AllGatherStrings(ctx.rank == 0 ? std::string() : ckpt::RankFileMetaToJson(mine)));
  }
  if (ctx.world_rank == 0) {
    committed = [&]() -> Status {
      meta.ranks.push_back(std::move(mine));
      for (int r = 1; r < ctx.world; ++r) {
        ZERO_ASSIGN_OR_RETURN(ckpt::RankFileMeta theirs, ckpt::RankFileMetaFromJson(all[r], meta, r));
        meta.ranks.push_back(std::move(theirs));
      }
      return ckpt::CommitCheckpoint(dir, meta);
    }();
  }
  return AgreeOnStatus(committed, what).status();
}

StatusOr<std::string> Engine::Impl::Save(const std::string& dir, const SaveOptions& options) {
  // An earlier asynchronous save first: its failure is this call's (on every rank), before anything new starts.
  ZERO_RETURN_IF_ERROR(SettleSave("Save", options.if_in_flight));
  const std::string tag = options.tag.empty() ? ckpt::DefaultTag(step.applied_steps()) : options.tag;
  ZERO_RETURN_IF_ERROR(CheckTagAgrees(tag));
  const std::string folder = absl::StrCat(dir, "/", tag);
  ckpt::RankFileMeta mine;
  // Under hybrid sharding every group holds the whole model: the first group (ranks 0 to G - 1) writes it, as a
  // checkpoint of a world of G; the other ranks check and agree.
  const bool writer = ctx.world_rank < ctx.world;
  // Everything local first; the ranks then agree on the outcome, so a failure anywhere fails everywhere
  // before rank 0 writes meta.json and `latest`.
  Status local = [&]() -> Status {
    ZERO_RETURN_IF_ERROR(CheckCheckpointable("Save"));
    if (options.max_write_bytes_per_s < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Save: SaveOptions::max_write_bytes_per_s is ",
                                                     options.max_write_bytes_per_s,
                                                     "; a rate in bytes per second, or 0 for as fast as the disk"));
    }
    if (!ckpt::SafeTag(tag)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Save: tag \"", tag, "\" is not a plain folder name (nor \"", ckpt::kLatestFile, "\")"));
    }
    if (options.save_qgz_residuals) ZERO_RETURN_IF_ERROR(CheckQgzResidualsSavable(ctx));
    if (ckpt::Exists(absl::StrCat(folder, "/", ckpt::kMetaFile))) {
      return absl::AlreadyExistsError(absl::StrCat("Save: checkpoint ", folder,
                                                   " already exists; choose another tag (a checkpoint is never "
                                                   "overwritten in place)"));
    }
    if (!writer) return absl::OkStatus();
    ZERO_RETURN_IF_ERROR(ckpt::MakeDirs(folder));
    if (options.async) return StartAsyncSave(dir, tag, options);
    ckpt::RankFileWriter w;
    ZERO_RETURN_IF_ERROR(
        w.Open(absl::StrCat(folder, "/", ckpt::RankFileName(ctx.rank, ctx.world)), ctx.rank, ctx.world));
    Buffer piece;
    const int64_t piece_elems = static_cast<int64_t>(PieceElems());
    for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
      Unit& u = ctx.units[ui];
      NvmeUnitStage nvme(ctx, u, static_cast<int>(ui));
      ZERO_RETURN_IF_ERROR(nvme.Begin(/*read=*/true));
      const int64_t begin = std::min(u.layout.numel, static_cast<int64_t>(ctx.rank) * u.layout.shard);
      const int64_t end = begin + u.layout.OwnedElems(ctx.rank);
      const std::vector<StreamDesc> streams = SavedStreams(u);
      for (size_t si = 0; si < streams.size(); ++si) {
        const StreamDesc& s = streams[si];
        const size_t es = DTypeSize(s.dtype);
        const std::vector<Segment> segs = Segments(u, s, /*for_write=*/false);
        ZERO_RETURN_IF_ERROR(w.BeginSection(static_cast<int>(ui), static_cast<int>(si), begin, end, s.dtype));
        for (int64_t x = begin; x < end; x += piece_elems) {
          const int64_t n = std::min(piece_elems, end - x);
          if (piece.empty()) piece = Buffer::Host(&ctx.tracker, MemTag::kStaging, piece_elems * 4);
          int64_t covered = 0;
          for (const Segment& g : segs) {
            const int64_t lo = std::max(x, g.begin), hi = std::min(x + n, g.begin + g.n);
            if (lo >= hi) continue;
            ReadBuffer(*g.buffer, lo - g.begin, es, piece.as<char>() + (lo - x) * es, hi - lo);
            covered += hi - lo;
          }
          ZERO_CHECK(covered == n) << "Save: unit " << u.name() << " stream " << s.name << " elements " << x << "-"
                                   << x + n << " are not all held by rank " << ctx.rank;
          ZERO_RETURN_IF_ERROR(ctx.compute->status());
          ZERO_RETURN_IF_ERROR(w.Append(piece.data(), static_cast<size_t>(n) * es));
        }
        ZERO_RETURN_IF_ERROR(w.EndSection());
        internal::MaybeInjectFault("save", ctx.world_rank, step.applied_steps());  // a rank file half written
      }
    }
    // This rank's qgZ residuals, after every unit's sections (in the compute tier: read through `piece` there).
    if (options.save_qgz_residuals) {
      const size_t es = DTypeSize(ctx.cd());
      for (const ResidualRef& r : KeptQgzResiduals(ctx)) {
        const Buffer& b = internal::QgzResidual(ctx.units[r.unit], r.stream);
        ZERO_RETURN_IF_ERROR(w.BeginRankStateSection(r.unit, r.stream, r.elems));
        for (int64_t x = 0; x < r.elems; x += piece_elems) {
          const int64_t n = std::min(piece_elems, r.elems - x);
          if (piece.empty()) piece = Buffer::Host(&ctx.tracker, MemTag::kStaging, piece_elems * 4);
          ReadBuffer(b, x, es, piece.data(), n);
          ZERO_RETURN_IF_ERROR(ctx.compute->status());
          ZERO_RETURN_IF_ERROR(w.Append(piece.data(), static_cast<size_t>(n) * es));
        }
        ZERO_RETURN_IF_ERROR(w.EndSection());
      }
    }
    ZERO_ASSIGN_OR_RETURN(mine, w.Commit());
    mine.trainer_state = options.trainer_state;
    return absl::OkStatus();
  }();
  if (options.async) {
    // The staging is this rank's (the worker may already be writing): a failure elsewhere stops nothing here, so
    // the worker is joined and its file removed before the ranks' shared error is returned.
    const StatusOr<std::string> agreed = AgreeOnStatus(local, "Save");
    internal::AsyncSave& a = async_save;
    if (!agreed.ok()) {
      a.SetPace(internal::AsyncSave::Pace::kCancel);
      if (a.worker.joinable()) a.worker.join();
      if (writer && local.ok() && a.result.ok()) {
        ::unlink(absl::StrCat(folder, "/", ckpt::RankFileName(ctx.rank, ctx.world)).c_str());
      }
      return agreed.status();
    }
    a.in_flight = true;
    a.dir = dir;
    a.tag = tag;
    a.meta = DescribeForCheckpoint(tag, options.save_qgz_residuals);  // now: Steps run on while the files are written
    a.trainer_state = options.trainer_state;
    if (!writer) a.done = true;  // nothing to write: only the agreement
    return tag;
  }
  ZERO_RETURN_IF_ERROR(AgreeOnStatus(local, "Save").status());
  // Every rank's file is durable. Rank 0 needs their sections and checksums for meta.json.
  ZERO_RETURN_IF_ERROR(
      CommitSave(dir, DescribeForCheckpoint(tag, options.save_qgz_residuals), std::move(mine), "Save"));
  return tag;
}

Status Engine::Impl::StartAsyncSave(const std::string& dir, const std::string& tag, const SaveOptions& options) {
  const SaveOptions::WriterPriority priority = options.writer_priority;
  const int64_t rate = options.max_write_bytes_per_s;
  internal::AsyncSave& a = async_save;
  if (a.plan_rank != ctx.rank || a.plan_world != ctx.world || a.plan_qgz != options.save_qgz_residuals) {
    // The write plan: the sections in the order the synchronous writer appends them, so the file is the same.
    a.plan.clear();
    int64_t offset = ckpt::kRankHeaderBytes;
    for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
      const Unit& u = ctx.units[ui];
      const int64_t begin = std::min(u.layout.numel, static_cast<int64_t>(ctx.rank) * u.layout.shard);
      const int64_t end = begin + u.layout.OwnedElems(ctx.rank);
      const std::vector<StreamDesc> streams = SavedStreams(u);
      for (size_t si = 0; si < streams.size(); ++si) {
        a.plan.push_back({static_cast<int>(ui), static_cast<int>(si), begin, end, offset, streams[si].dtype});
        offset += (end - begin) * static_cast<int64_t>(DTypeSize(streams[si].dtype));
      }
    }
    if (options.save_qgz_residuals) {
      for (const ResidualRef& r : KeptQgzResiduals(ctx)) {
        a.plan.push_back({r.unit, r.stream, 0, r.elems, offset, ctx.cd(), /*rank_state=*/true});
        offset += r.elems * static_cast<int64_t>(DTypeSize(ctx.cd()));
      }
    }
    a.file_bytes = offset;
    a.plan_rank = ctx.rank;
    a.plan_world = ctx.world;
    a.plan_qgz = options.save_qgz_residuals;
    a.staging.Reset();
  }
  if (a.io == nullptr) {
    io::IoOptions o = io::IoOptionsFromConfig(ctx.cfg);
    o.tracker = &ctx.tracker;  // its staging buffers are this engine's bytes
    ZERO_ASSIGN_OR_RETURN(a.io, io::IoEngine::Create(o));
  }
  const int64_t align = a.io->options().alignment;
  if (a.staging.empty()) {
    Status error;
    a.staging = Buffer::Pinned(&ctx.tracker, MemTag::kStaging, static_cast<size_t>(a.file_bytes + align), &error);
    if (a.staging.empty()) {
      return Status(error.code(), absl::StrCat("Save (async): the staging for rank ", ctx.world_rank, "'s file (",
                                               a.file_bytes, " bytes): ", error.message()));
    }
    const auto p = reinterpret_cast<uintptr_t>(a.staging.data());
    a.image = reinterpret_cast<char*>((p + static_cast<uintptr_t>(align) - 1) & ~static_cast<uintptr_t>(align - 1));
  }
  ckpt::RankFileHeader(ctx.rank, ctx.world, a.image);
  // The NVMe tiers' values are staged into host memory one unit at a time (the plan lists a unit's sections
  // together), as the synchronous Save stages them.
  std::unique_ptr<NvmeUnitStage> nvme;
  int staged_unit = -1;
  // The copies out of host memory run on this rank's optimizer threads (ctx.threads) in tiles of 4 MiB: the trainer
  // waits for this copy, so the cores are free, and one thread's memcpy moved 124 MiB in 19 ms where two finish
  // sooner. Queued per unit and run before the unit's NVMe staging (if any) is let go. The stores bypass the cache
  // (CopyStreaming): the staging is read next by the disk, not by the trainer, and a 4 MiB tile is below the size
  // where glibc's memcpy streams by itself (bench/results/io.md: the copy's time with and without).
  struct Copy {
    char* dst;
    const char* src;
    int64_t bytes;
  };
  std::vector<Copy> copies;
  auto run_copies = [&] {
    constexpr int64_t kTile = int64_t{4} << 20;
    std::vector<Copy> tiles;
    for (const Copy& c : copies) {
      for (int64_t at = 0; at < c.bytes; at += kTile) {
        tiles.push_back({c.dst + at, c.src + at, std::min(kTile, c.bytes - at)});
      }
    }
    copies.clear();
    optim_internal::ParallelFor(tiles.size(), ctx.threads, [&](size_t i) {
      internal::CopyStreaming(tiles[i].dst, tiles[i].src, static_cast<size_t>(tiles[i].bytes));
    });
  };
  // n elements of `es` bytes from element `at` of `b` into the image at `dst`: host memory by the queued copies, a
  // device's through the compute tier at once.
  auto stage = [&](char* dst, const Buffer& b, int64_t at, size_t es, int64_t n) {
    if (b.tier() == MemTier::kHost || !ctx.compute->device()) {
      copies.push_back(
          {dst, static_cast<const char*>(b.data()) + at * static_cast<int64_t>(es), n * static_cast<int64_t>(es)});
    } else {
      ReadBuffer(b, at, es, dst, n);
    }
  };
  for (const internal::AsyncSave::PlannedSection& sec : a.plan) {
    Unit& u = ctx.units[sec.unit];
    if (sec.rank_state) {  // a residual, in the compute tier (no NVMe staging to change to)
      const Buffer& b = internal::QgzResidual(u, sec.stream);
      stage(a.image + sec.offset, b, 0, 1, static_cast<int64_t>(b.size()));
      ZERO_RETURN_IF_ERROR(ctx.compute->status());
      continue;
    }
    if (sec.unit != staged_unit) {
      run_copies();
      nvme.reset();
      nvme = std::make_unique<NvmeUnitStage>(ctx, u, sec.unit);
      ZERO_RETURN_IF_ERROR(nvme->Begin(/*read=*/true));
      staged_unit = sec.unit;
    }
    const StreamDesc s = SavedStreams(u)[sec.stream];
    const size_t es = DTypeSize(s.dtype);
    int64_t covered = 0;
    for (const Segment& g : Segments(u, s, /*for_write=*/false)) {
      const int64_t lo = std::max(sec.begin, g.begin), hi = std::min(sec.end, g.begin + g.n);
      if (lo >= hi) continue;
      stage(a.image + sec.offset + (lo - sec.begin) * static_cast<int64_t>(es), *g.buffer, lo - g.begin, es, hi - lo);
      covered += hi - lo;
    }
    ZERO_CHECK(covered == sec.end - sec.begin)
        << "Save: unit " << u.name() << " stream " << s.name << " is not all held by rank " << ctx.rank;
    ZERO_RETURN_IF_ERROR(ctx.compute->status());
  }
  run_copies();
  if (a.worker.joinable()) a.worker.join();  // the previous save's, finished (FinishSave saw it done)
  a.done = false;
  a.result = absl::OkStatus();
  a.written = {};
  a.SetPace(internal::AsyncSave::Pace::kPaced);
  const std::string path = absl::StrCat(dir, "/", tag, "/", ckpt::RankFileName(ctx.rank, ctx.world));
  const int world_rank = ctx.world_rank;
  const int64_t step_now = step.applied_steps();
  a.worker = std::thread([&a, path, world_rank, step_now, priority, rate] {
    if (priority == SaveOptions::WriterPriority::kIdle) {
      // This thread only (pid 0 is the caller): SCHED_IDLE, and the io_uring workers it starts inherit it. A
      // refusal (a seccomp policy) leaves it at normal priority: slower steps, never a failed save.
      struct sched_param none {};
      if (::sched_setscheduler(0, SCHED_IDLE, &none) != 0) {
        ZERO_LOG(DEBUG) << "Save (async): SCHED_IDLE refused (" << std::strerror(errno) << "); normal priority";
      }
    }
    ckpt::RankFileMeta meta;
    const size_t slash = path.find_last_of('/');
    meta.file = path.substr(slash + 1);
    meta.bytes = a.file_bytes;
    for (const internal::AsyncSave::PlannedSection& sec : a.plan) {
      const int64_t bytes = (sec.end - sec.begin) * static_cast<int64_t>(DTypeSize(sec.dtype));
      // A yield after each 1 MiB block (about 0.1 ms of checksum): a trainer whose threads wait for each other
      // by spinning on sched_yield (OpenBLAS's do, thousands of times a step) hands its core to any runnable
      // thread, SCHED_IDLE or not, and gets it back only when that thread yields or its slice ends. Checksumming
      // a whole section at once held the core for milliseconds at each such hand-over: with training on both
      // cores, the checksum of a 124 MiB file slowed the step beside it 1.14x, and 1.03-1.04x yielding
      // (bench/results/io.md, "Where the steps beside a write lose their time").
      (sec.rank_state ? meta.rank_state : meta.sections)
          .push_back({sec.unit, sec.stream, sec.begin, sec.end, sec.offset,
                      ckpt::SectionCrcs(a.image + sec.offset, bytes, [] { ::sched_yield(); }), sec.rank_state});
    }
    const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
    if (internal::AsyncSaveTestHook()) internal::AsyncSaveTestHook()(world_rank);
    Status st = [&]() -> Status {
      ZERO_ASSIGN_OR_RETURN(io::IoFile f, io::IoFile::Open(tmp, io::IoFile::Mode::kTruncate));
      // [lo, hi) of the image: at once, or paced (chunk k not before t0 + its offset / rate).
      const int64_t chunk = rate > 0 ? internal::PacedChunkBytes(rate, 4096) : a.file_bytes;
      const auto t0 = std::chrono::steady_clock::now();
      auto write = [&](int64_t lo, int64_t hi) -> Status {
        for (int64_t at = lo; at < hi;) {
          const int64_t n = std::min(chunk, hi - at);
          if (rate > 0) {
            const double not_before = static_cast<double>(at) / static_cast<double>(rate);
            if (internal::AsyncSavePaceHook()) internal::AsyncSavePaceHook()(world_rank, at, n, not_before);
            const auto when = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(not_before));
            std::unique_lock<std::mutex> lock(a.pace_mu);
            a.pace_cv.wait_until(lock, when, [&] { return a.pace != internal::AsyncSave::Pace::kPaced; });
            if (a.pace == internal::AsyncSave::Pace::kCancel) {
              return absl::CancelledError("the ranks did not agree to this save; its paced write was stopped");
            }
          }
          ZERO_RETURN_IF_ERROR(a.io->Write(f, at, a.image + at, n));
          at += n;
        }
        return absl::OkStatus();
      };
      // Half the file, then the fault point (tests kill a process here), then the rest.
      const int64_t half = a.file_bytes / 2 / 4096 * 4096;
      ZERO_RETURN_IF_ERROR(write(0, half));
      internal::MaybeInjectFault("save_async", world_rank, step_now);
      ZERO_RETURN_IF_ERROR(write(half, a.file_bytes));
      ZERO_RETURN_IF_ERROR(f.Sync());
      f.Close();
      if (::rename(tmp.c_str(), path.c_str()) != 0) {
        return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
      }
      return ckpt::FsyncDir(path.substr(0, slash));
    }();
    if (!st.ok()) ::unlink(tmp.c_str());
    a.result = std::move(st);
    a.written = std::move(meta);
    a.done.store(true, std::memory_order_release);
  });
  return absl::OkStatus();
}

StatusOr<bool> Engine::Impl::FinishSave(bool wait, const char* what) {
  internal::AsyncSave& a = async_save;
  if (!a.in_flight) return true;
  if (wait && a.worker.joinable()) {
    a.SetPace(internal::AsyncSave::Pace::kHurry);
    a.worker.join();
  }
  const bool done = a.done.load(std::memory_order_acquire);
  std::string mine = !done ? "R" : a.result.ok() ? "" : absl::StrCat("E", a.result.message());
  std::vector<std::string> all;
  {
    CommLabel label(ctx.world_comm.get(), absl::StrCat(what, ": the asynchronous save's outcome"));
    ZERO_ASSIGN_OR_RETURN(all, world_host.AllGatherStrings(mine));
  }
  for (const std::string& s : all) {
    if (s == "R") return false;  // not yet everywhere (never when waiting)
  }
  if (a.worker.joinable()) a.worker.join();
  a.in_flight = false;
  const std::string where = absl::StrCat(a.dir, "/", a.tag);
  for (int r = 0; r < ctx.world_size; ++r) {
    if (all[r].empty()) continue;
    const std::string msg = absl::StrCat(what, ": the asynchronous save of ", where, " failed on rank ", r, ": ",
                                         all[r].substr(1), " (`latest` still names the checkpoint before it)");
    return r == ctx.world_rank ? Status(a.result.code(), msg) : absl::AbortedError(msg);
  }
  a.written.trainer_state = std::move(a.trainer_state);
  ZERO_RETURN_IF_ERROR(CommitSave(a.dir, std::move(a.meta), std::move(a.written), what));
  return true;
}

ckpt::Meta Engine::Impl::DescribeForCheckpoint(const std::string& tag, bool with_qgz) const {
  ckpt::Meta m;
  m.tag = tag;
  bool wrapper = false;
  for (const Unit& u : ctx.units) wrapper = wrapper || u.trainer_params != nullptr;
  m.kind = wrapper ? "sharded_optimizer" : "engine";
  m.world_size = ctx.world;
  m.stage = ctx.stage();
  m.compute_dtype = ctx.cd();
  m.optimizer = step.optimizer().Name();
  m.state_names = step.optimizer().StateNames();
  m.step = step.applied_steps();
  m.skipped_steps = step.skipped_steps();
  const LossScaler::State ls = step.scaler().state();
  m.loss_scaler = {ls.scale, ls.hysteresis, ls.iteration, ls.last_overflow_iteration};
  for (const ParamGroup& g : ctx.opts.param_groups) {
    ckpt::GroupMeta gm{g.match, g.lr_scale, g.frozen, {}};
    if (g.weight_decay) gm.overrides["weight_decay"] = *g.weight_decay;
    if (g.beta1) gm.overrides["beta1"] = *g.beta1;
    if (g.beta2) gm.overrides["beta2"] = *g.beta2;
    if (g.eps) gm.overrides["eps"] = *g.eps;
    m.param_groups.push_back(std::move(gm));
  }
  for (const Unit& u : ctx.units) {
    ckpt::UnitMeta um;
    um.name = u.name();
    um.numel = u.layout.numel;
    um.frozen = u.frozen;
    um.bare_names = u.bare_names;
    for (size_t i = 0; i < u.layout.params.size(); ++i) {
      const internal::ParamSlot& p = u.layout.params[i];
      um.params.push_back(
          {p.spec.name, p.spec.shape, p.offset, p.numel, i < u.param_group.size() ? u.param_group[i] : -1});
    }
    for (const StreamDesc& s : SavedStreams(u)) um.streams.push_back({s.name, s.dtype});
    m.units.push_back(std::move(um));
  }
  if (with_qgz) {
    const internal::PlanPolicy& p = ctx.policy;
    m.qgz = ckpt::QgzStateMeta{p.qgz_local, p.qgz_bits, p.qgz_block, ctx.cd(), p.qgz_loco_int8, {}};
    for (const Unit& u : ctx.units) m.qgz->rounds.push_back(u.qgz_rounds);
  }
  return m;
}

StatusOr<LoadResult> Engine::Impl::Load(const std::string& dir, const LoadOptions& options) {
  // A save in flight is finished first: it may be the very checkpoint asked for, and a failure is reported.
  ZERO_RETURN_IF_ERROR(SettleSave("Load", SaveOptions::InFlight::kWait));
  ctx.StaleSecondaries();
  LoadResult result;
  ckpt::Meta saved;
  std::vector<bool> gather_after;
  std::string qgz_why;  // why the qgZ residuals restart at zero; empty: restored, or none kept
  const bool keeps_residuals = ctx.policy.qgz_bits > 0 && ctx.policy.qgz_loco;  // else nothing to restore or restart
  // The rank files are read through the I/O engine: the asynchronous saves' (kept), or one for this Load, its
  // staging counted in this engine's tracker while it lives. (Both outlive the lambda: the residuals are read after
  // the ranks agree.)
  std::unique_ptr<io::IoEngine> own_io;
  std::unique_ptr<ckpt::CheckpointReader> reader;
  Status local = [&]() -> Status {
    ZERO_RETURN_IF_ERROR(CheckCheckpointable("Load"));
    ZERO_ASSIGN_OR_RETURN(reader, ckpt::CheckpointReader::Open(dir, options.tag));
    io::IoEngine* io = async_save.io.get();
    if (io == nullptr) {
      io::IoOptions o = io::IoOptionsFromConfig(ctx.cfg);
      o.tracker = &ctx.tracker;
      ZERO_ASSIGN_OR_RETURN(own_io, io::IoEngine::Create(o));
      io = own_io.get();
    }
    reader->UseIoEngine(io);
    const ckpt::Meta& m = reader->meta();
    const std::string from = reader->folder();
    if (options.check_trainer_state) {  // before any value is read; its error fails every rank (AgreeOnStatus)
      const Status st =
          options.check_trainer_state(m.ranks[ctx.world_rank < m.world_size ? ctx.world_rank : 0].trainer_state);
      if (!st.ok()) return Status(st.code(), absl::StrCat("Load: checkpoint ", from, ": ", st.message()));
    }
    // Where each of this model's parameters is in the checkpoint, by full name through the name map.
    std::map<std::string, std::pair<int, int>> by_name;
    for (size_t ui = 0; ui < m.units.size(); ++ui) {
      for (size_t pi = 0; pi < m.units[ui].params.size(); ++pi) {
        by_name[ckpt::FullParamName(m.units[ui].name, m.units[ui].bare_names, m.units[ui].params[pi].name)] = {
            static_cast<int>(ui), static_cast<int>(pi)};
      }
    }
    std::map<std::string, bool> used;
    // A run: local unit elements [local, local + n) are checkpoint unit `unit`'s [theirs, theirs + n).
    struct Run {
      int64_t local, n;
      int unit;
      int64_t theirs;
    };
    std::vector<std::vector<Run>> runs(ctx.units.size());
    for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
      const Unit& u = ctx.units[ui];
      for (const internal::ParamSlot& slot : u.layout.params) {
        const std::string mine = u.FullName(slot);
        const std::string theirs = TheirName(options, mine);
        auto it = by_name.find(theirs);
        if (it == by_name.end()) {
          return absl::NotFoundError(absl::StrCat("Load: parameter ", mine,
                                                  theirs == mine ? "" : absl::StrCat(" (as ", theirs, ")"),
                                                  " is not in checkpoint ", from));
        }
        const ckpt::ParamMeta& p = m.units[it->second.first].params[it->second.second];
        if (p.shape != slot.spec.shape) {
          return absl::InvalidArgumentError(
              absl::StrCat("Load: parameter ", mine, " has shape [", absl::StrJoin(slot.spec.shape, ","), "] but ",
                           theirs, " in checkpoint ", from, " has [", absl::StrJoin(p.shape, ","), "]"));
        }
        used[theirs] = true;
        std::vector<Run>& r = runs[ui];
        if (!r.empty() && r.back().unit == it->second.first && r.back().local + r.back().n == slot.offset &&
            r.back().theirs + r.back().n == p.offset) {
          r.back().n += slot.numel;
        } else {
          r.push_back({slot.offset, slot.numel, it->second.first, p.offset});
        }
      }
    }
    if (options.strict && used.size() != by_name.size()) {
      std::vector<std::string> extra;
      for (const auto& [name, where] : by_name) {
        if (!used.count(name) && extra.size() < 5) extra.push_back(ckpt::Printable(name));
      }
      return absl::InvalidArgumentError(absl::StrCat("Load: checkpoint ", from, " has ", by_name.size() - used.size(),
                                                     " parameters this model does not (", absl::StrJoin(extra, ", "),
                                                     by_name.size() - used.size() > extra.size() ? ", ..." : "",
                                                     "); LoadOptions::strict = false ignores them"));
    }
    const std::vector<std::string> state_names = step.optimizer().StateNames();
    // For every local stream, the checkpoint stream of checkpoint unit U it reads (-1: zeros).
    auto source = [&](const StreamDesc& s, int U) -> StatusOr<int> {
      const ckpt::UnitMeta& cu = m.units[U];
      switch (s.kind) {
        case StreamDesc::kMaster: {
          const int i = cu.Stream("master");
          return i >= 0 ? i : cu.Stream("param");  // a frozen unit's parameters become a trainable one's master
        }
        case StreamDesc::kParam: {
          const int p = cu.Stream("param");
          if (p >= 0 && cu.streams[p].dtype == s.dtype) return p;
          const int i = cu.Stream("master");  // rounded to nearest even from fp32
          return i >= 0 ? i : p;
        }
        case StreamDesc::kState: {
          if (!options.load_optimizer_state || cu.frozen) return -1;  // fresh state: zeros
          const int i = cu.Stream(s.name);
          if (i < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "Load: checkpoint ", from, " was saved with optimizer ", ckpt::Printable(m.optimizer), " (state ",
                absl::StrJoin(m.state_names, ", "), "); this engine's ", step.optimizer().Name(), " needs ",
                s.name.substr(6), " for unit ", ctx.units.empty() ? "" : cu.name,
                "; LoadOptions::load_optimizer_state = false starts the optimizer state at zero"));
          }
          return i;
        }
      }
      return -1;
    };
    Buffer piece, master_piece;
    const int64_t piece_elems = static_cast<int64_t>(PieceElems());
    gather_after.assign(ctx.units.size(), false);
    for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
      Unit& u = ctx.units[ui];
      NvmeUnitStage nvme(ctx, u, static_cast<int>(ui));
      ZERO_RETURN_IF_ERROR(nvme.Begin(/*read=*/false));
      for (const StreamDesc& s : Streams(u)) {
        const size_t es = DTypeSize(s.dtype);
        std::map<int, int> src;  // checkpoint unit -> stream
        for (const Run& r : runs[ui]) {
          if (!src.count(r.unit)) {
            ZERO_ASSIGN_OR_RETURN(src[r.unit], source(s, r.unit));
          }
        }
        // The 16-bit parameters of a trainable unit, where the checkpoint has none of this dtype, are this
        // unit's master (loaded just before: Streams lists it first) rounded to nearest even: converted from
        // memory rather than read from the disk a second time.
        bool from_master = s.kind == StreamDesc::kParam && !u.frozen && !runs[ui].empty();
        for (const auto& [U, si] : src) from_master = from_master && si >= 0 && m.units[U].streams[si].name == "master";
        const std::vector<Segment> master_segs =
            from_master ? Segments(u, Streams(u).front(), /*for_write=*/false) : std::vector<Segment>{};
        for (const Segment& g : Segments(u, s, /*for_write=*/true)) {
          // Full parameters (stages 0-2, persistent units): each rank reads its slice, and an all-gather below
          // fills the rest, as after every step; the disk is read once in all, not once per rank.
          int64_t g_begin = g.begin, g_end = g.begin + g.n;
          if (g.buffer == &u.params && !u.sharded_params() && ctx.world > 1) {
            g_begin = std::max(g_begin, static_cast<int64_t>(ctx.rank) * u.layout.shard);
            g_end = std::min(g_end, static_cast<int64_t>(ctx.rank + 1) * u.layout.shard);
            gather_after[ui] = true;
          }
          for (int64_t x = g_begin; x < g_end; x += piece_elems) {
            const int64_t n = std::min(piece_elems, g_end - x);
            if (piece.empty()) piece = Buffer::Host(&ctx.tracker, MemTag::kStaging, piece_elems * 4);
            std::memset(piece.data(), 0, static_cast<size_t>(n) * es);  // padding and fresh state stay zero
            if (from_master) {
              if (master_piece.empty()) master_piece = Buffer::Host(&ctx.tracker, MemTag::kStaging, piece_elems * 4);
              int64_t covered = 0;
              for (const Segment& ms : master_segs) {
                const int64_t lo = std::max(x, ms.begin), hi = std::min(x + n, ms.begin + ms.n);
                if (lo >= hi) continue;
                ReadBuffer(*ms.buffer, lo - ms.begin, 4, master_piece.as<float>() + (lo - x), hi - lo);
                covered += hi - lo;
              }
              ZERO_CHECK(covered == n) << "Load: unit " << u.name() << ": the master does not cover elements " << x
                                       << "-" << x + n << " of the parameters on rank " << ctx.rank;
              ConvertBuffer(master_piece.data(), DType::kF32, piece.data(), s.dtype, static_cast<size_t>(n));
              WriteBuffer(*g.buffer, x - g.begin, es, piece.data(), n);
              ZERO_RETURN_IF_ERROR(ctx.compute->status());
              continue;
            }
            for (const Run& r : runs[ui]) {
              const int64_t lo = std::max(x, r.local), hi = std::min(x + n, r.local + r.n);
              if (lo >= hi || src[r.unit] < 0) continue;
              ZERO_RETURN_IF_ERROR(reader->Read(r.unit, src[r.unit], r.theirs + (lo - r.local),
                                                r.theirs + (hi - r.local), s.dtype, piece.as<char>() + (lo - x) * es));
            }
            WriteBuffer(*g.buffer, x - g.begin, es, piece.data(), n);
            ZERO_RETURN_IF_ERROR(ctx.compute->status());
          }
        }
        internal::MaybeInjectFault("load", ctx.world_rank, step.applied_steps());  // the engine half loaded
      }
      ZERO_RETURN_IF_ERROR(nvme.WriteBack());
    }
    // The qgZ residuals: restored where the checkpoint holds this rank's for the same layout, else why not.
    const internal::PlanPolicy& p = ctx.policy;
    qgz_why = [&]() -> std::string {
      if (!keeps_residuals) return "";
      if (!m.qgz) return "the checkpoint was saved without SaveOptions::save_qgz_residuals";
      if (!options.load_optimizer_state) return "LoadOptions::load_optimizer_state is false";
      const ckpt::QgzStateMeta& q = *m.qgz;
      if (m.world_size != ctx.world || ctx.world_size != ctx.world || q.local != p.qgz_local) {
        return absl::StrCat("saved at world ", m.world_size, " with ", q.local, " ranks per host, loaded at world ",
                            ctx.world_size, ctx.world_size != ctx.world ? " under hybrid sharding" : "", " with ",
                            p.qgz_local);
      }
      if (q.bits != p.qgz_bits || q.block != p.qgz_block || q.dtype != ctx.cd() || q.int8 != p.qgz_loco_int8) {
        return absl::StrCat("saved as int", q.bits, " in blocks of ", q.block, " with ",
                            q.int8 ? "int8" : std::string(DTypeName(q.dtype)), " residuals, loaded as int", p.qgz_bits,
                            " in blocks of ", p.qgz_block, " with ",
                            p.qgz_loco_int8 ? "int8" : std::string(DTypeName(ctx.cd())));
      }
      bool same_units = m.units.size() == ctx.units.size();
      for (size_t ui = 0; same_units && ui < ctx.units.size(); ++ui) {
        const auto& r = runs[ui];
        same_units = m.units[ui].numel == ctx.units[ui].layout.numel &&
                     (r.empty() || (r.size() == 1 && r[0].unit == static_cast<int>(ui) && r[0].local == 0 &&
                                    r[0].theirs == 0 && r[0].n == ctx.units[ui].layout.numel));
      }
      if (!same_units) return "the checkpoint's units are cut otherwise than this model's";
      // Each residual this rank keeps, as large as the section that holds it in its file (a unit frozen here, or a
      // run with one hop where the saving run had two, keeps none where the saving run kept one).
      for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
        for (int k = 0; k < ckpt::kRankStateStreamCount; ++k) {
          const ckpt::Section* sec = RankStateSection(m, ctx.rank, static_cast<int>(ui), k);
          const int64_t saved_n = sec == nullptr ? 0 : sec->end - sec->begin;
          const int64_t n = QgzResidualElems(ctx, ctx.units[ui], k);
          if (saved_n != n) {
            return absl::StrCat("unit ", ctx.units[ui].name(), "'s ", ckpt::kRankStateStreams[k], " holds ", saved_n,
                                " elements in rank ", ctx.rank, "'s file and ", n, " here");
          }
        }
      }
      return "";
    }();
    saved = m;
    return absl::OkStatus();
  }();
  ZERO_RETURN_IF_ERROR(AgreeOnStatus(local, "Load").status());
  // The qgZ residuals restore on every rank or restart on every rank: each rank decides from its own sections of
  // meta.json, which only a hand-edited file makes differ, and residuals restored on some ranks only would be a state
  // no run had. One all-gather of the reasons; the first rank's that cannot restore is every rank's.
  // Only then are they read, so a Load that restarts them never reads them (a damaged block fails only a Load that
  // restores them), and a failed read fails every rank.
  if (keeps_residuals) {
    if (ctx.world_size > 1) {
      CommLabel label(ctx.world_comm.get(), "Load: whether every rank restores its qgZ residuals");
      ZERO_ASSIGN_OR_RETURN(auto whys, world_host.AllGatherStrings(qgz_why));
      for (int r = 0; r < ctx.world_size && qgz_why.empty(); ++r) {
        if (!whys[r].empty()) qgz_why = absl::StrCat("rank ", r, " cannot restore its own: ", whys[r]);
      }
    }
    if (qgz_why.empty()) {  // every section of every rank matches a residual it keeps, in size
      Status read = [&]() -> Status {
        Buffer staging;  // a device's residuals are read into host memory first
        for (const ckpt::Section& sec : saved.ranks[ctx.rank].rank_state) {
          Buffer& b = internal::QgzResidual(ctx.units[sec.unit], sec.stream);
          if (b.tier() == MemTier::kHost || !ctx.compute->device()) {
            ZERO_RETURN_IF_ERROR(reader->ReadRankState(ctx.rank, sec, b.data()));
            continue;
          }
          if (staging.size() < b.size()) {
            Status error;
            staging = Buffer::Host(&ctx.tracker, MemTag::kStaging, b.size(), MemTier::kHost, &error);
            ZERO_RETURN_IF_ERROR(error);
          }
          ZERO_RETURN_IF_ERROR(reader->ReadRankState(ctx.rank, sec, staging.data()));
          WriteBuffer(b, 0, 1, staging.data(), static_cast<int64_t>(b.size()));
        }
        return ctx.compute->status();
      }();
      ZERO_RETURN_IF_ERROR(AgreeOnStatus(read, "Load").status());
      for (size_t ui = 0; ui < ctx.units.size(); ++ui) ctx.units[ui].qgz_rounds = saved.qgz->rounds[ui];
    }
  }
  std::vector<Work> refresh;
  for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
    if (!gather_after[ui]) continue;
    Unit& u = ctx.units[ui];
    const int64_t S = u.layout.shard;
    char* slice = static_cast<char*>(u.params.data()) + static_cast<int64_t>(ctx.rank) * S * DTypeSize(ctx.cd());
    CommLabel label(ctx.comm.get(), absl::StrCat("Load: parameters of unit ", u.name()));
    refresh.push_back(ctx.comm->AllGather(slice, u.params.data(), S, ctx.cd(), ctx.stream()));
  }
  for (Work& w : refresh) {
    Status st = ctx.compute->Join(w);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("Load: all-gather of the parameters: ", st.message()));
  }
  // Stage 3: a unit gathered before the load holds the old values; the next scope gathers the new ones.
  for (Unit& u : ctx.units) {
    if (u.sharded_params() && u.status != internal::UnitStatus::kNotAvailable) gathers.Release(u);
  }
  if (!qgz_why.empty()) internal::RestartQgzResiduals(ctx, "Load", qgz_why);
  result.tag = saved.tag;
  result.saved_world_size = saved.world_size;
  result.saved_stage = saved.stage;
  result.trainer_state = saved.ranks[ctx.world_rank < saved.world_size ? ctx.world_rank : 0].trainer_state;
  if (options.load_optimizer_state) {
    step.Restore(saved.step, saved.skipped_steps,
                 {saved.loss_scaler.scale, saved.loss_scaler.hysteresis, saved.loss_scaler.iteration,
                  saved.loss_scaler.last_overflow_iteration});
  } else {
    step.Restore(0, 0, step.scaler().state());
  }
  result.step = step.applied_steps();
  return result;
}

Status Engine::Impl::LoadSafetensors(const std::string& path, const LoadOptions& options) {
  ZERO_RETURN_IF_ERROR(CheckCheckpointable("LoadSafetensors"));
  ctx.StaleSecondaries();
  // Every rank reads the same file, so the ranks agree without an exchange; each keeps its part (Place).
  Status local = [&]() -> Status {
    ZERO_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    size_t used = 0;
    std::vector<float> values;
    for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
      const Unit& u = ctx.units[ui];
      for (const internal::ParamSlot& slot : u.layout.params) {
        const std::string mine = u.FullName(slot);
        const std::string theirs = TheirName(options, mine);
        const SafetensorsFile::Tensor* t = file->Find(theirs);
        if (t == nullptr) {
          return absl::NotFoundError(absl::StrCat("LoadSafetensors: parameter ", mine,
                                                  theirs == mine ? "" : absl::StrCat(" (as ", theirs, ")"),
                                                  " is not in ", path));
        }
        if (t->shape != slot.spec.shape) {
          return absl::InvalidArgumentError(absl::StrCat("LoadSafetensors: parameter ", mine, " has shape [",
                                                         absl::StrJoin(slot.spec.shape, ","), "] but ", path, " holds ",
                                                         theirs, " as [", absl::StrJoin(t->shape, ","), "]"));
        }
        ++used;
        values.resize(slot.numel);
        ZERO_RETURN_IF_ERROR(file->ReadF32(theirs, values.data(), slot.numel));
        ZERO_RETURN_IF_ERROR(Place(static_cast<UnitId>(ui), slot, values.data()));
      }
    }
    if (options.strict && used != file->tensors().size()) {
      return absl::InvalidArgumentError(absl::StrCat("LoadSafetensors: ", path, " has ", file->tensors().size() - used,
                                                     " tensors this model does not use; LoadOptions::strict = false "
                                                     "ignores them"));
    }
    return absl::OkStatus();
  }();
  ZERO_RETURN_IF_ERROR(AgreeOnStatus(local, "LoadSafetensors").status());
  for (Unit& u : ctx.units) {
    if (u.sharded_params() && u.status != internal::UnitStatus::kNotAvailable) gathers.Release(u);
  }
  // qgZ's LoCo residuals are the rounding errors of gradients of the parameters just replaced: fed back into the
  // next reductions they would correct errors the new parameters never made. They restart at zero, as after a
  // Load that does not restore them (a fresh engine has them so already: nothing to say then).
  if (std::any_of(ctx.units.begin(), ctx.units.end(), [](const Unit& u) { return u.qgz_rounds > 0; })) {
    internal::RestartQgzResiduals(ctx, "LoadSafetensors", "they were kept for the parameters it replaced");
  }
  return absl::OkStatus();
}

}  // namespace zero
