// shard/unit.cc — a unit's layout and views (shard/internal/unit.h).
#include "shard/internal/unit.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zero::internal {

const char* UnitStatusName(UnitStatus s) {
  switch (s) {
    case UnitStatus::kNotAvailable: return "NOT_AVAILABLE";
    case UnitStatus::kInflight: return "INFLIGHT";
    case UnitStatus::kAvailable: return "AVAILABLE";
  }
  return "?";
}

const ParamSlot* Unit::Slot(const std::string& name) const {
  auto it = layout.index.find(name);
  return it == layout.index.end() ? nullptr : &layout.params[it->second];
}

TensorView Unit::View(const ParamSlot& slot, void* base, DType dtype) {
  TensorView v;
  v.data = static_cast<char*>(base) + slot.offset * DTypeSize(dtype);
  v.dtype = dtype;
  v.numel = slot.numel;
  v.shape = &slot.spec.shape;
  return v;
}

StatusOr<UnitLayout> BuildUnitLayout(const std::string& name, const std::vector<ParamSpec>& params) {
  UnitLayout layout;
  layout.name = name;
  int64_t offset = 0;
  for (const auto& p : params) {
    if (p.name.empty()) return absl::InvalidArgumentError(absl::StrCat("unit ", name, ": a parameter has no name"));
    if (layout.index.count(p.name)) {
      return absl::InvalidArgumentError(absl::StrCat("unit ", name, ": parameter \"", p.name, "\" registered twice"));
    }
    for (int64_t d : p.shape) {
      if (d <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("unit ", name, " param ", p.name, ": shape [",
                                                       absl::StrJoin(p.shape, ","), "] has a non-positive dim"));
      }
    }
    ParamSlot slot{p, offset, p.numel()};
    offset += slot.numel;
    layout.index[p.name] = static_cast<int>(layout.params.size());
    layout.params.push_back(std::move(slot));
  }
  layout.numel = offset;
  return layout;
}

}  // namespace zero::internal
