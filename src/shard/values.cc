// shard/values.cc — values in and out of the engine: Finalize's initial values, CopyIn, GatherParam.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shard/internal/engine_impl.h"

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
  for (size_t ui = 0; ui < ctx.units.size(); ++ui) {
    for (const auto& slot : ctx.units[ui].layout.params) {
      std::vector<float> values(slot.numel);
      if (init) init(ctx.units[ui].name(), slot.spec, values.data());
      ZERO_RETURN_IF_ERROR(CopyIn(static_cast<UnitId>(ui), slot.spec.name, values.data()));
    }
  }
  return absl::OkStatus();
}

Status Engine::Impl::CopyIn(UnitId id, const std::string& name, const float* values) {
  ZERO_RETURN_IF_ERROR(CheckUnit(id, "CopyIn"));
  Unit& u = ctx.units[id];
  const internal::ParamSlot* found = u.Slot(name);
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("CopyIn: unit ", u.name(), " has no parameter \"", name, "\""));
  }
  const internal::ParamSlot& slot = *found;
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
