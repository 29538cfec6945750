// A trainer that saves a checkpoint after every step until it is killed (checkpoint_format_test's crash
// trials): one unit of 2 Mi fp32 parameters, AdamW, so each save writes 24 MiB (master and two states) and
// takes long enough for a random SIGKILL to land inside it. Prints "saved <tag>" after each save. With "async",
// each save is asynchronous (SaveOptions::async): it returns once staged, the file is written while the next step
// runs, and the next save waits for it and makes it `latest`, so most kills land inside a background write.
//   zero_ckpt_kill_worker DIR [async]
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "zero/zero.h"

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 3 && std::string(argv[2]) == "async")) {
    std::fprintf(stderr, "usage: zero_ckpt_kill_worker DIR [async]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const bool async = argc == 3;
  zero::Config cfg = zero::Config::Default();
  cfg.train_micro_batch_size_per_gpu = 1;
  cfg.train_batch_size.reset();
  zero::OptimizerConfig o;
  o.type = "AdamW";
  o.lr = 1e-3;
  cfg.optimizer = o;
  auto comm = zero::Communicator::FromEnv(zero::Backend::kGloo);
  if (!comm.ok()) return std::fprintf(stderr, "%s\n", comm.status().ToString().c_str()), 1;
  auto e = zero::Engine::Create(cfg, std::move(*comm));
  if (!e.ok()) return std::fprintf(stderr, "%s\n", e.status().ToString().c_str()), 1;
  zero::Engine& engine = **e;
  constexpr int64_t kN = int64_t{1} << 21;
  const zero::UnitId w = engine.AddUnit("w", {{"v", {kN}}}).value();
  zero::Status s = engine.Finalize([](const std::string&, const zero::ParamSpec& p, float* v) {
    for (int64_t i = 0; i < p.numel(); ++i) v[i] = std::sin(0.001f * static_cast<float>(i));
  });
  if (!s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  for (int step = 0; step < 100000; ++step) {
    {
      auto b = engine.Backward(w);
      if (!b.ok()) return 1;
      auto g = b->Grad<float>("v");
      auto p = b->Param<const float>("v");
      if (!g.ok() || !p.ok()) return 1;
      for (int64_t i = 0; i < kN; ++i) (*g)[i] += (*p)[i] - 0.5f;
    }
    auto r = engine.Step();
    if (!r.ok()) return std::fprintf(stderr, "%s\n", r.status().ToString().c_str()), 1;
    auto tag = engine.Save(dir, {.async = async});
    if (!tag.ok()) return std::fprintf(stderr, "%s\n", tag.status().ToString().c_str()), 1;
    std::printf("saved %s\n", tag->c_str());
    std::fflush(stdout);
  }
  return 0;
}
