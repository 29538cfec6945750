// shard/unit.cc — a unit's layout and views (shard/internal/unit.h).
#include "shard/internal/unit.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/internal/format.h"

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

TensorView Unit::View(const ParamSlot& slot, void* base, DType dtype, int rank, bool grad) const {
  TensorView v;
  v.data = static_cast<char*>(base) + slot.offset * DTypeSize(dtype);
  v.dtype = dtype;
  v.numel = slot.numel;
  v.shape = &slot.spec.shape;
  v.unit = &layout.name;
  v.param = &slot.spec.name;
  v.rank = rank;
  v.is_grad = grad;
  return v;
}

std::string Unit::ParamNames() const {
  constexpr size_t kShown = 16;
  std::vector<std::string> names;
  for (size_t i = 0; i < layout.params.size() && i < kShown; ++i) names.push_back(layout.params[i].spec.name);
  std::string out = absl::StrJoin(names, ", ");
  if (layout.params.size() > kShown) absl::StrAppend(&out, ", ... (", layout.params.size() - kShown, " more)");
  return out;
}

namespace {

bool GlobOne(const char* p, const char* pe, const char* s, const char* se) {
  // Iterative glob with backtracking to the last '*'.
  const char *star = nullptr, *resume = nullptr;
  while (s < se) {
    if (p < pe && (*p == '?' || *p == *s)) {
      ++p;
      ++s;
    } else if (p < pe && *p == '*') {
      star = p++;
      resume = s;
    } else if (star != nullptr) {
      p = star + 1;
      s = ++resume;
    } else {
      return false;
    }
  }
  while (p < pe && *p == '*') ++p;
  return p == pe;
}

}  // namespace

bool GlobMatch(const std::string& pattern, const std::string& name) {
  size_t begin = 0;
  while (begin <= pattern.size()) {
    size_t end = pattern.find('|', begin);
    if (end == std::string::npos) end = pattern.size();
    if (GlobOne(pattern.data() + begin, pattern.data() + end, name.data(), name.data() + name.size())) return true;
    begin = end + 1;
  }
  return false;
}

std::string Unit::FullName(const ParamSlot& slot) const {
  return ckpt::FullParamName(name(), bare_names, slot.spec.name);
}

int MatchGroup(const std::vector<ParamGroup>& groups, const std::string& full_name) {
  for (size_t g = 0; g < groups.size(); ++g) {
    if (GlobMatch(groups[g].match, full_name)) return static_cast<int>(g);
  }
  return -1;
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
