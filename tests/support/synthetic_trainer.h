// tests/support/synthetic_trainer.h — a small synthetic trainer for comparing two engines step for step.
//
//   auto e = zero::testing::MakeSyntheticEngine(cfg, comm).value();
//   zero::testing::SyntheticTrace t;
//   zero::testing::TrainSynthetic(*e, /*steps=*/4, /*ga=*/2, io, &t);   // io: how the trainer reaches a view
//
// Four units of odd shapes (a parameter straddles shards at every world size), initial values a hash of
// (unit, param, index), and per micro-step each unit's gradient g_i = 0.01 sin(0.37 i + step + 0.5 micro + rank)
// + 0.1 p_i (p the parameter as the view holds it), ACCUMULATED into the view in f32 and rounded once to the
// compute dtype: the same host arithmetic whatever the engine, so two runs differ only by the engine. The
// trace records every StepResult, every final fp32 parameter, the memory report and the compute-tier
// allocation count after the second and the last step.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "support/status_matchers.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/engine.h"
#include "zero/estimate.h"
#include "zero/status.h"

namespace zero::testing {

inline const std::vector<std::pair<std::string, std::vector<ParamSpec>>>& SyntheticUnits() {
  static const auto* u = new std::vector<std::pair<std::string, std::vector<ParamSpec>>>{
      {"a", {{"w", {37, 19}}, {"b", {19}}}},
      {"b", {{"w", {19, 23}}}},
      {"c", {{"v", {101}}}},
      {"d", {{"w", {64, 33}}}},
  };
  return *u;
}

// The same units as zero::Estimate takes them (a name, an element count and the parameters each).
inline std::vector<EstimateUnit> SyntheticEstimateUnits() {
  std::vector<EstimateUnit> units;
  for (const auto& [name, specs] : SyntheticUnits()) {
    int64_t n = 0;
    for (const ParamSpec& p : specs) n += p.numel();
    units.push_back({.name = name, .numel = n, .params = specs});
  }
  return units;
}

inline float SyntheticInit(const std::string& unit, const std::string& param, int64_t i) {
  const uint64_t h = std::hash<std::string>{}(unit + "/" + param) ^ static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  return static_cast<float>(static_cast<int64_t>(h % 2001) - 1000) * 1e-4f;
}

struct SyntheticTrace {
  std::vector<StepResult> steps;
  std::map<std::string, std::vector<float>> params;  // "unit.param" -> fp32 values
  MemoryReport after_second, after_last;
  int64_t device_allocs_after_second = 0, device_allocs_after_last = 0;  // MemoryTracker::allocations(kDevice)
};

// How the trainer reads a view into host bytes and writes host bytes back (a device engine: copies on its
// stream; an emulated asynchronous tier: wait for it first). Each must leave no gtest fatal failure behind
// to succeed.
struct ViewIo {
  std::function<void(const TensorView& v, std::vector<unsigned char>* out)> read;
  std::function<void(const std::vector<unsigned char>& in, const TensorView& v)> write;
};

inline StatusOr<std::unique_ptr<Engine>> MakeSyntheticEngine(const Config& cfg, std::shared_ptr<Communicator> comm,
                                                             EngineOptions options = {}) {
  ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, std::move(comm), std::move(options)));
  for (const auto& [name, specs] : SyntheticUnits()) ZERO_RETURN_IF_ERROR(e->AddUnit(name, specs).status());
  ZERO_RETURN_IF_ERROR(e->Finalize([](const std::string& unit, const ParamSpec& p, float* out) {
    for (int64_t i = 0; i < p.numel(); ++i) out[i] = SyntheticInit(unit, p.name, i);
  }));
  return e;
}

// `first_step`: the index of the first step trained here (a resumed run continues the gradients' sequence).
inline void TrainSynthetic(Engine& e, int steps, int ga, const ViewIo& io, SyntheticTrace* t, int first_step = 0) {
  std::vector<UnitId> ids;
  for (const auto& [name, specs] : SyntheticUnits()) ids.push_back(e.FindUnit(name));
  std::vector<unsigned char> pbuf, gbuf;
  for (int k = 0; k < steps; ++k) {
    for (int m = 0; m < ga; ++m) {
      for (UnitId id : ids) {
        auto f = e.Forward(id);
        ASSERT_OK(f);
      }
      for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
        auto b = e.Backward(*it);
        ASSERT_OK(b);
        for (const ParamSpec& spec : e.UnitParams(*it)) {
          ASSERT_OK_AND_ASSIGN(const TensorView pv, b->Param(spec.name));
          ASSERT_OK_AND_ASSIGN(const TensorView gv, b->Grad(spec.name));
          ASSERT_NO_FATAL_FAILURE(io.read(pv, &pbuf));
          ASSERT_NO_FATAL_FAILURE(io.read(gv, &gbuf));
          for (int64_t i = 0; i < gv.numel; ++i) {
            const float g = 0.01f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(k + first_step) +
                                             0.5f * m + static_cast<float>(e.rank())) +
                            0.1f * LoadAsF32(pbuf.data(), pv.dtype, i);
            StoreFromF32(gbuf.data(), gv.dtype, i, LoadAsF32(gbuf.data(), gv.dtype, i) + g);
          }
          ASSERT_NO_FATAL_FAILURE(io.write(gbuf, gv));
        }
      }
    }
    auto r = e.Step();
    ASSERT_OK(r);
    t->steps.push_back(*r);
    if (k == 1) {
      t->after_second = e.memory_report();
      t->device_allocs_after_second = e.memory_tracker().allocations(MemTier::kDevice);
    }
  }
  t->after_last = e.memory_report();
  t->device_allocs_after_last = e.memory_tracker().allocations(MemTier::kDevice);
  for (size_t u = 0; u < ids.size(); ++u) {
    for (const ParamSpec& spec : e.UnitParams(ids[u])) {
      auto v = e.GatherParam(ids[u], spec.name);
      ASSERT_OK(v);
      t->params[SyntheticUnits()[u].first + "." + spec.name] = *v;
    }
  }
}

// Whether `name` ("unit.param") moved from its initial value somewhere: training really happened.
inline size_t MovedElements(const std::string& name, const std::vector<float>& values) {
  const size_t dot = name.find('.');
  size_t moved = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    moved += values[i] != SyntheticInit(name.substr(0, dot), name.substr(dot + 1), static_cast<int64_t>(i));
  }
  return moved;
}

// A ViewIo for host memory the trainer may touch directly (after `before`, if given).
inline ViewIo HostViewIo(std::function<void()> before = {}) {
  ViewIo io;
  io.read = [before](const TensorView& v, std::vector<unsigned char>* out) {
    if (before) before();
    const auto* p = static_cast<const unsigned char*>(v.data);
    out->assign(p, p + static_cast<size_t>(v.numel) * DTypeSize(v.dtype));
  };
  io.write = [before](const std::vector<unsigned char>& in, const TensorView& v) {
    if (before) before();
    std::copy(in.begin(), in.end(), static_cast<unsigned char*>(v.data));
  };
  return io;
}

// Two runs' steps equal field by field (the norm exactly), and their final parameters bit for bit.
inline void ExpectSameSteps(const std::vector<StepResult>& a, const std::vector<StepResult>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].step, b[i].step) << "step " << i;
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "step " << i;  // exact
    EXPECT_EQ(a[i].lr, b[i].lr) << "step " << i;
    EXPECT_EQ(a[i].loss_scale, b[i].loss_scale) << "step " << i;
    EXPECT_EQ(a[i].skipped, b[i].skipped) << "step " << i;
  }
}

inline void ExpectSameParams(const SyntheticTrace& a, const SyntheticTrace& b) {
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, values] : a.params) {
    const std::vector<float>& other = b.params.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    size_t diff = 0;
    for (size_t i = 0; i < values.size(); ++i) diff += std::memcmp(&values[i], &other[i], 4) != 0;
    EXPECT_EQ(diff, 0u) << name << ": " << diff << " of " << values.size() << " values differ";
  }
}

}  // namespace zero::testing
