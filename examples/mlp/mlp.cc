// A two-layer MLP trained with zero's Engine: the whole integration on one screen.
//   ./build/bin/zero-mlp                                # one process, world size 1
//   ./build/bin/zero-run -n 4 -- ./build/bin/zero-mlp   # 4 ranks, ZeRO stage 3
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "zero/zero.h"

constexpr int kIn = 16, kHidden = 64, kBatch = 32;

zero::Status Train() {
  ZERO_ASSIGN_OR_RETURN(zero::Config cfg, zero::Config::FromJsonString(R"({
    "train_micro_batch_size_per_gpu": 32, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})"));
  ZERO_ASSIGN_OR_RETURN(auto comm, zero::Communicator::FromEnv(zero::Backend::kGloo, cfg));  // cfg's timeout
  const int rank = comm->rank(), world = comm->world_size();
  ZERO_ASSIGN_OR_RETURN(auto engine, zero::Engine::Create(cfg, std::move(comm)));

  // One unit per layer; the engine owns (and shards) every parameter.
  ZERO_ASSIGN_OR_RETURN(zero::UnitId l1, engine->AddUnit("l1", {{"w", {kIn, kHidden}}, {"b", {kHidden}}}));
  ZERO_ASSIGN_OR_RETURN(zero::UnitId l2, engine->AddUnit("l2", {{"w", {kHidden, 1}}, {"b", {1}}}));
  ZERO_RETURN_IF_ERROR(engine->Finalize([](const std::string& unit, const zero::ParamSpec& p, float* v) {
    std::mt19937 rng(std::hash<std::string>{}(unit + p.name));  // same values at any world size
    std::normal_distribution<float> n(0.f, p.name == "b" ? 0.f : 1.f / std::sqrt(float(p.shape[0])));
    for (int64_t i = 0; i < p.numel(); ++i) v[i] = n(rng);
  }));

  std::mt19937 data(rank);  // each rank draws its own micro-batch: y = sum(sin(x))
  std::vector<float> x(kBatch * kIn), h(kBatch * kHidden), y(kBatch), out(kBatch), dh(kBatch * kHidden);
  for (int step = 0; step < 200; ++step) {
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (int b = 0; b < kBatch; ++b) {
      y[b] = 0;
      for (int i = 0; i < kIn; ++i) y[b] += std::sin(x[b * kIn + i] = u(data));
    }
    // Forward: each scope gathers its unit's full parameters (stage 3) and releases them when it closes.
    {
      ZERO_ASSIGN_OR_RETURN(zero::UnitScope s1, engine->Forward(l1));
      ZERO_ASSIGN_OR_RETURN(const float* w1, s1.Param<float>("w"));  // checked: the name, the scope, the dtype
      ZERO_ASSIGN_OR_RETURN(const float* b1, s1.Param<float>("b"));
      for (int b = 0; b < kBatch; ++b)
        for (int j = 0; j < kHidden; ++j) {
          float a = b1[j];
          for (int i = 0; i < kIn; ++i) a += x[b * kIn + i] * w1[i * kHidden + j];
          h[b * kHidden + j] = std::tanh(a);
        }
    }
    float loss = 0;
    {
      ZERO_ASSIGN_OR_RETURN(zero::UnitScope s2, engine->Forward(l2));
      ZERO_ASSIGN_OR_RETURN(const float* w2, s2.Param<float>("w"));
      ZERO_ASSIGN_OR_RETURN(const float* b2, s2.Param<float>("b"));
      for (int b = 0; b < kBatch; ++b) {
        out[b] = b2[0];
        for (int j = 0; j < kHidden; ++j) out[b] += h[b * kHidden + j] * w2[j];
        loss += (out[b] - y[b]) * (out[b] - y[b]) / kBatch;
      }
    }
    // Backward, last layer first: the trainer accumulates into the scope's gradients; closing the scope starts
    // their reduction, which overlaps the next layer's backward.
    {
      ZERO_ASSIGN_OR_RETURN(zero::UnitScope s2, engine->Backward(l2));
      ZERO_ASSIGN_OR_RETURN(const float* w2, s2.Param<float>("w"));
      ZERO_ASSIGN_OR_RETURN(float* gw2, s2.Grad<float>("w"));
      ZERO_ASSIGN_OR_RETURN(float* gb2, s2.Grad<float>("b"));
      for (int b = 0; b < kBatch; ++b) {
        const float dout = 2 * (out[b] - y[b]) / kBatch;
        gb2[0] += dout;
        for (int j = 0; j < kHidden; ++j) {
          gw2[j] += h[b * kHidden + j] * dout;
          dh[b * kHidden + j] = dout * w2[j] * (1 - h[b * kHidden + j] * h[b * kHidden + j]);
        }
      }
    }
    {
      ZERO_ASSIGN_OR_RETURN(zero::UnitScope s1, engine->Backward(l1));
      ZERO_ASSIGN_OR_RETURN(float* gw1, s1.Grad<float>("w"));
      ZERO_ASSIGN_OR_RETURN(float* gb1, s1.Grad<float>("b"));
      for (int b = 0; b < kBatch; ++b)
        for (int j = 0; j < kHidden; ++j) {
          gb1[j] += dh[b * kHidden + j];
          for (int i = 0; i < kIn; ++i) gw1[i * kHidden + j] += x[b * kIn + i] * dh[b * kHidden + j];
        }
    }
    ZERO_ASSIGN_OR_RETURN(zero::StepResult r, engine->Step());  // clip, AdamW on this rank's shards
    if (rank == 0 && step % 40 == 0)
      std::printf("step %3d  loss %.4f  grad_norm %.3f  (world %d)\n", step, loss, r.grad_norm, world);
  }
  return zero::OkStatus();
}

int main(int argc, char** argv) {
  const std::string arg = argc > 1 ? argv[1] : "";
  if (arg == "--help" || arg == "-h") return std::printf("usage: zero-mlp  (no options)\n"), 0;
  if (argc > 1) {
    std::fprintf(stderr, "zero-mlp: unknown argument '%s'\nusage: zero-mlp  (no options)\n", argv[1]);
    return 2;
  }
  zero::Status s = Train();
  if (!s.ok()) std::fprintf(stderr, "zero-mlp: %s\n", zero::ErrorText(s).c_str());
  return s.ok() ? 0 : 1;
}
