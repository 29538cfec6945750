// shard/values.cc — values in and out of the engine: Finalize's initial values, CopyIn, GatherParam, and the
// ranks' agreement on the values that come in (EngineOptions::initial_value_sync).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shard/internal/engine_impl.h"
#include "zero/logging.h"

namespace zero {

using internal::Unit;

void Engine::Impl::ToCompute(const float* values, const Buffer& in, void* dst, DType dtype, int64_t n) {
  if (n <= 0) return;
  if (!ctx.compute->device() || in.tier() == MemTier::kHost) {
    ConvertBuffer(values, DType::kF32, dst, dtype, n);
    return;
  }
  std::vector<unsigned char> tmp(n * DTypeSize(dtype));
  ConvertBuffer(values, DType::kF32, tmp.data(), dtype, n);
  ctx.compute->CopyFromHostSync(dst, tmp.data(), tmp.size());
}

void Engine::Impl::ReadTrainerValues(const Unit& u, const internal::ParamSlot& slot, float* out) {
  const size_t es = DTypeSize(ctx.cd());
  const char* src = static_cast<const char*>(u.trainer_params) + slot.offset * es;
  if (!ctx.compute->device()) {
    ConvertBuffer(src, ctx.cd(), out, DType::kF32, slot.numel);
    return;
  }
  std::vector<unsigned char> tmp(slot.numel * es);
  ctx.compute->CopyToHostSync(tmp.data(), src, tmp.size());
  ConvertBuffer(tmp.data(), ctx.cd(), out, DType::kF32, slot.numel);
}

Status Engine::Impl::InitialValues(const ParamInit& init) {
  CommLabel label(ctx.world_comm.get(), "Finalize: initial values");
  // Parameters are evaluated and agreed on in batches of at most kAgreeBatchBytes (or one parameter, if larger):
  // one hash exchange per batch instead of one per parameter (a collective costs milliseconds of latency on
  // Gloo), while no rank holds more than a batch beyond its shards.
  std::vector<std::string> differed;
  std::vector<ValuesToAgree> batch;
  size_t batch_bytes = 0;
  auto flush = [&]() -> Status {
    ZERO_ASSIGN_OR_RETURN(const auto ranks, DifferingRanks(batch, "Finalize"));
    for (size_t i = 0; i < batch.size(); ++i) {
      ValuesToAgree& v = batch[i];
      if (!ranks[i].empty()) {
        ZERO_RETURN_IF_ERROR(world_host.Broadcast(v.values.data(), v.values.size(), 0));
        if (differed.size() < 8) {
          differed.push_back(
              absl::StrCat(ctx.units[v.unit].FullName(*v.slot), " (ranks ", absl::StrJoin(ranks[i], ","), ")"));
        } else if (differed.size() == 8) {
          differed.push_back("...");
        }
      }
      ZERO_RETURN_IF_ERROR(Place(v.unit, *v.slot, v.values.data()));
    }
    batch.clear();
    batch_bytes = 0;
    return absl::OkStatus();
  };
  for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
    const Unit& u = ctx.units[ui];
    for (const auto& slot : u.layout.params) {
      ValuesToAgree v{static_cast<UnitId>(ui), &slot, std::vector<float>(slot.numel)};
      if (u.trainer_params != nullptr) {
        ReadTrainerValues(u, slot, v.values.data());  // the trainer's buffer holds its initial values
      } else if (init) {
        init(u.name(), slot.spec, v.values.data());
      }
      batch_bytes += v.values.size() * sizeof(float);
      batch.push_back(std::move(v));
      if (batch_bytes >= kAgreeBatchBytes) ZERO_RETURN_IF_ERROR(flush());
    }
  }
  ZERO_RETURN_IF_ERROR(flush());
  if (!differed.empty() && ctx.world_rank == 0) {
    ZERO_LOG(WARNING) << "Finalize: the ranks' initial values differed for " << absl::StrJoin(differed, ", ")
                      << "; every rank now holds rank 0's values (EngineOptions::initial_value_sync; seed every "
                         "rank's initializer alike to skip the broadcast)";
  }
  return absl::OkStatus();
}

StatusOr<std::vector<std::vector<int>>> Engine::Impl::DifferingRanks(const std::vector<ValuesToAgree>& params,
                                                                     const char* what) {
  std::vector<std::vector<int>> ranks(params.size());
  if (ctx.opts.initial_value_sync == InitialValueSync::kTrust || ctx.world_size == 1 || params.empty()) return ranks;
  const size_t k = params.size();
  std::vector<float> send(2 * k), recv(2 * k * ctx.world_size);
  for (size_t i = 0; i < k; ++i) {
    const uint64_t h = internal::HashValues(params[i].values.data(), params[i].values.size());
    std::memcpy(send.data() + 2 * i, &h, sizeof(h));
  }
  ZERO_RETURN_IF_ERROR(world_host.AllGather(send.data(), recv.data(), 2 * k));
  for (size_t i = 0; i < k; ++i) {
    uint64_t h0;
    std::memcpy(&h0, recv.data() + 2 * i, sizeof(h0));
    for (int r = 1; r < ctx.world_size; ++r) {
      uint64_t hr;
      std::memcpy(&hr, recv.data() + 2 * (k * r + i), sizeof(hr));
      if (hr != h0) ranks[i].push_back(r);
    }
    if (!ranks[i].empty() && ctx.opts.initial_value_sync == InitialValueSync::kRequireEqual) {
      // Every rank saw the same hashes, so every rank fails here alike, on the first differing parameter.
      const std::vector<int>& d = ranks[i];
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": the values of unit ", ctx.units[params[i].unit].name(), " parameter ",
                       params[i].slot->spec.name, " differ across ranks: ", d.size() > 1 ? "ranks " : "rank ",
                       absl::StrJoin(d, ","), d.size() > 1 ? " hold" : " holds",
                       " other values than rank 0 (a rank-dependent seed?); initial_value_sync "
                       "is kRequireEqual (kFromRank0 takes rank 0's values instead)"));
    }
  }
  return ranks;
}

Status Engine::Impl::CopyIn(UnitId id, const std::string& name, const float* values) {
  CommLabel label(ctx.world_comm.get(), absl::StrCat("CopyIn of parameter ", name));
  ZERO_RETURN_IF_ERROR(CheckUnit(id, "CopyIn"));
  ctx.StaleSecondaries();
  const Unit& u = ctx.units[id];
  const internal::ParamSlot* slot = u.Slot(name);
  if (slot == nullptr) return UnknownParam("Engine::CopyIn", u, name);
  if (ctx.opts.initial_value_sync == InitialValueSync::kTrust || ctx.world_size == 1) return Place(id, *slot, values);
  // One parameter: its values are copied once, for the hash exchange and, where they differ, the broadcast.
  std::vector<ValuesToAgree> one{{id, slot, std::vector<float>(values, values + slot->numel)}};
  ZERO_ASSIGN_OR_RETURN(const auto ranks, DifferingRanks(one, "CopyIn"));
  if (ranks[0].empty()) return Place(id, *slot, values);
  ZERO_LOG_ONCE(WARNING) << "CopyIn: the ranks' values of unit " << u.name() << " parameter " << name
                         << " differed (ranks " << absl::StrJoin(ranks[0], ",") << " against rank 0); every rank now "
                         << "holds rank 0's (logged once)";
  ZERO_RETURN_IF_ERROR(world_host.Broadcast(one[0].values.data(), one[0].values.size(), 0));
  return Place(id, *slot, one[0].values.data());
}

Status Engine::Impl::Place(UnitId id, const internal::ParamSlot& slot, const float* values) {
  Unit& u = ctx.units[id];
  const DType cd = ctx.cd();
  const size_t cds = DTypeSize(cd);
  if (!u.sharded_params()) {
    ToCompute(values, u.params, static_cast<char*>(u.params.data()) + slot.offset * cds, cd, slot.numel);
  }
  // The part of [offset, offset+numel) in this rank's shard: the stage-3 parameter shard and the master shard.
  const int64_t s_begin = static_cast<int64_t>(ctx.rank) * u.layout.shard, s_end = s_begin + u.layout.shard;
  const int64_t lo = std::max(s_begin, slot.offset), hi = std::min(s_end, slot.offset + slot.numel);
  if (u.sharded_params() && lo < hi) {
    internal::ParamStage staged(ctx, u, static_cast<int>(id));  // offload_param "nvme": read, placed, written back
    ZERO_RETURN_IF_ERROR(staged.Begin(/*read=*/true, /*in_step=*/false));
    ToCompute(values + (lo - slot.offset), u.params, static_cast<char*>(u.params.data()) + (lo - s_begin) * cds, cd,
              hi - lo);
    ZERO_RETURN_IF_ERROR(ctx.compute->status());
    ZERO_RETURN_IF_ERROR(staged.Commit());
  }
  // The master keeps the exact fp32 values, not the rounded 16-bit copy.
  // The NVMe tier keeps the host part's master in its file (field 0 of the unit's region).
  const bool nvme_master = ctx.nvme && !u.frozen && u.host_n() > 0 && !ctx.policy.MasterIsHostParams();
  if (u.master.empty() && u.host_master.empty() && !nvme_master) {
    return ctx.compute->status();  // frozen, or fp32: no master
  }
  if (ctx.stage() == 0) {
    if (ctx.mixed()) ToCompute(values, u.master, u.master.as<float>() + slot.offset, DType::kF32, slot.numel);
  } else if (lo < hi) {
    const float* v = values + (lo - slot.offset);
    const int64_t i0 = lo - s_begin, i1 = hi - s_begin;  // range within this rank's shard
    const int64_t h_end = std::min(i1, u.host_n());      // host part [0, host_n)
    if (!u.host_master.empty() && i0 < h_end) std::memcpy(u.host_master.as<float>() + i0, v, (h_end - i0) * 4);
    if (nvme_master && i0 < h_end)
      ZERO_RETURN_IF_ERROR(ctx.nvme->WriteField(static_cast<int>(id), 0, i0, h_end - i0, v));
    const int64_t d_begin = std::max(i0, u.host_n());  // device part [host_n, shard)
    if (ctx.mixed() && d_begin < i1) {
      ToCompute(v + (d_begin - i0), u.master, u.master.as<float>() + (d_begin - u.host_n()), DType::kF32, i1 - d_begin);
    }
  }
  return ctx.compute->status();
}

StatusOr<std::vector<float>> Engine::Impl::GatherParam(UnitId id, const std::string& name) {
  CommLabel label(ctx.comm.get(), absl::StrCat("GatherParam of parameter ", name));
  ZERO_RETURN_IF_ERROR(CheckUnit(id, "GatherParam"));
  Unit& u = ctx.units[id];
  const internal::ParamSlot* slot = u.Slot(name);
  if (slot == nullptr) return UnknownParam("Engine::GatherParam", u, name);
  // The fp32 master: the master buffer under mixed precision (with offload: its host part, then its compute-tier
  // part), else the parameters themselves; this rank's part is read into host memory first. A frozen unit has no
  // master: its 16-bit parameters are widened.
  const bool from_params = !ctx.mixed() || u.frozen;
  const bool full_here = (ctx.stage() == 0 && !u.frozen) || (from_params && !u.sharded_params());
  const int64_t S = u.layout.shard;
  std::vector<float> mine(full_here ? u.layout.padded : S);
  internal::ParamStage staged(ctx, u, static_cast<int>(id));  // offload_param "nvme": the shard read from its file
  if (from_params) ZERO_RETURN_IF_ERROR(staged.Begin(/*read=*/true, /*in_step=*/false));
  auto fetch = [&](float* dst, const Buffer& b, int64_t n) {
    if (n <= 0) return;
    if (b.tier() == MemTier::kHost) {
      std::memcpy(dst, b.data(), n * 4);
    } else {
      ctx.compute->CopyToHostSync(dst, b.data(), n * 4);
    }
  };
  if (ctx.mixed() && u.frozen) {
    const int64_t n = full_here ? u.layout.padded : S;
    std::vector<unsigned char> raw(n * DTypeSize(ctx.cd()));
    if (u.params.tier() == MemTier::kHost) {
      std::memcpy(raw.data(), u.params.data(), raw.size());
    } else {
      ctx.compute->CopyToHostSync(raw.data(), u.params.data(), raw.size());
    }
    ConvertBuffer(raw.data(), ctx.cd(), mine.data(), DType::kF32, n);
  } else if (ctx.mixed()) {
    if (full_here) {
      fetch(mine.data(), u.master, u.layout.padded);
    } else {
      if (ctx.nvme && u.host_master.empty() && u.host_n() > 0) {
        ZERO_RETURN_IF_ERROR(ctx.nvme->ReadField(static_cast<int>(id), 0, 0, u.host_n(), mine.data()));
      } else {
        fetch(mine.data(), u.host_master, u.host_n());
      }
      fetch(mine.data() + u.host_n(), u.master, S - u.host_n());
    }
  } else {
    fetch(mine.data(), u.params, full_here ? u.layout.padded : S);  // stage 3: the parameter shard
  }
  ZERO_RETURN_IF_ERROR(ctx.compute->status());
  std::vector<float> full;
  if (full_here) {
    full = std::move(mine);
  } else {
    full.resize(u.layout.padded);
    ZERO_RETURN_IF_ERROR(host.AllGather(mine.data(), full.data(), S));
  }
  return std::vector<float>(full.begin() + slot->offset, full.begin() + slot->offset + slot->numel);
}

}  // namespace zero
