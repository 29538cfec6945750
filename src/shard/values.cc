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

Status Engine::Impl::InitialValues(const ParamInit& init) {
  std::vector<std::string> differed;
  for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
    const Unit& u = ctx.units[ui];
    for (const auto& slot : u.layout.params) {
      std::vector<float> values(slot.numel);  // one parameter at a time: the most any rank holds beyond its part
      if (init) init(u.name(), slot.spec, values.data());
      ZERO_ASSIGN_OR_RETURN(const std::vector<int> ranks, DifferingRanks(u, slot, values.data(), "Finalize"));
      if (!ranks.empty()) {
        ZERO_RETURN_IF_ERROR(host.Broadcast(values.data(), values.size(), 0));
        if (differed.size() < 8) {
          differed.push_back(absl::StrCat(u.name(), ".", slot.spec.name, " (ranks ", absl::StrJoin(ranks, ","), ")"));
        } else if (differed.size() == 8) {
          differed.push_back("...");
        }
      }
      ZERO_RETURN_IF_ERROR(Place(static_cast<UnitId>(ui), slot, values.data()));
    }
  }
  if (!differed.empty() && ctx.rank == 0) {
    ZERO_LOG(WARNING) << "Finalize: the ranks' initial values differed for " << absl::StrJoin(differed, ", ")
                      << "; every rank now holds rank 0's values (EngineOptions::initial_value_sync; seed every "
                         "rank's initializer alike to skip the broadcast)";
  }
  return absl::OkStatus();
}

StatusOr<std::vector<int>> Engine::Impl::DifferingRanks(const Unit& u, const internal::ParamSlot& slot,
                                                        const float* values, const char* what) {
  std::vector<int> ranks;
  if (ctx.opts.initial_value_sync == InitialValueSync::kTrust || ctx.world == 1) return ranks;
  const uint64_t h = internal::HashValues(values, static_cast<size_t>(slot.numel));
  float send[2];
  std::memcpy(send, &h, sizeof(h));
  std::vector<float> recv(2 * ctx.world);
  ZERO_RETURN_IF_ERROR(host.AllGather(send, recv.data(), 2));
  uint64_t h0;
  std::memcpy(&h0, recv.data(), sizeof(h0));
  for (int r = 1; r < ctx.world; ++r) {
    uint64_t hr;
    std::memcpy(&hr, recv.data() + 2 * r, sizeof(hr));
    if (hr != h0) ranks.push_back(r);
  }
  if (!ranks.empty() && ctx.opts.initial_value_sync == InitialValueSync::kRequireEqual) {
    // Every rank saw the same hashes, so every rank fails here alike.
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the values of unit ", u.name(), " parameter ", slot.spec.name, " differ across ranks: ",
        ranks.size() > 1 ? "ranks " : "rank ", absl::StrJoin(ranks, ","), ranks.size() > 1 ? " hold" : " holds",
        " other values than rank 0 (a rank-dependent seed?); initial_value_sync is kRequireEqual (kFromRank0 takes "
        "rank 0's values instead)"));
  }
  return ranks;
}

Status Engine::Impl::CopyIn(UnitId id, const std::string& name, const float* values) {
  ZERO_RETURN_IF_ERROR(CheckUnit(id, "CopyIn"));
  const Unit& u = ctx.units[id];
  const internal::ParamSlot* slot = u.Slot(name);
  if (slot == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("CopyIn: unit ", u.name(), " has no parameter \"", name, "\""));
  }
  ZERO_ASSIGN_OR_RETURN(const std::vector<int> ranks, DifferingRanks(u, *slot, values, "CopyIn"));
  if (ranks.empty()) return Place(id, *slot, values);
  ZERO_LOG_ONCE(WARNING) << "CopyIn: the ranks' values of unit " << u.name() << " parameter " << name
                         << " differed (ranks " << absl::StrJoin(ranks, ",") << " against rank 0); every rank now "
                         << "holds rank 0's (logged once)";
  std::vector<float> agreed(values, values + slot->numel);
  ZERO_RETURN_IF_ERROR(host.Broadcast(agreed.data(), agreed.size(), 0));
  return Place(id, *slot, agreed.data());
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
    ToCompute(values + (lo - slot.offset), u.params, static_cast<char*>(u.params.data()) + (lo - s_begin) * cds, cd,
              hi - lo);
  }
  // The master keeps the exact fp32 values, not the rounded 16-bit copy.
  if (ctx.stage() == 0) {
    if (ctx.mixed()) ToCompute(values, u.master, u.master.as<float>() + slot.offset, DType::kF32, slot.numel);
  } else if (lo < hi) {
    const float* v = values + (lo - slot.offset);
    const int64_t i0 = lo - s_begin, i1 = hi - s_begin;  // range within this rank's shard
    const int64_t h_end = std::min(i1, u.host_n());      // host part [0, host_n)
    if (!u.host_master.empty() && i0 < h_end) std::memcpy(u.host_master.as<float>() + i0, v, (h_end - i0) * 4);
    const int64_t d_begin = std::max(i0, u.host_n());    // device part [host_n, shard)
    if (ctx.mixed() && d_begin < i1) {
      ToCompute(v + (d_begin - i0), u.master, u.master.as<float>() + (d_begin - u.host_n()), DType::kF32, i1 - d_begin);
    }
  }
  return ctx.compute->status();
}

StatusOr<std::vector<float>> Engine::Impl::GatherParam(UnitId id, const std::string& name) {
  ZERO_RETURN_IF_ERROR(CheckUnit(id, "GatherParam"));
  Unit& u = ctx.units[id];
  const internal::ParamSlot* slot = u.Slot(name);
  if (slot == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unit ", u.name(), " has no parameter \"", name, "\""));
  }
  // The fp32 master: the master buffer under mixed precision (with offload: its host part, then its compute-tier
  // part), else the parameters themselves; this rank's part is read into host memory first.
  const bool full_here = ctx.stage() == 0 || (!ctx.mixed() && !u.sharded_params());
  const int64_t S = u.layout.shard;
  std::vector<float> mine(full_here ? u.layout.padded : S);
  auto fetch = [&](float* dst, const Buffer& b, int64_t n) {
    if (n <= 0) return;
    if (b.tier() == MemTier::kHost) {
      std::memcpy(dst, b.data(), n * 4);
    } else {
      ctx.compute->CopyToHostSync(dst, b.data(), n * 4);
    }
  };
  if (ctx.mixed()) {
    if (full_here) {
      fetch(mine.data(), u.master, u.layout.padded);
    } else {
      fetch(mine.data(), u.host_master, u.host_n());
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
