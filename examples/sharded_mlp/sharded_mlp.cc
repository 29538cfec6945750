// The same MLP, keeping its own memory: one flat parameter buffer, one flat gradient buffer, its own forward and
// backward, and zero::ShardedOptimizer's Step in place of an optimizer loop (ZeRO stages 0-2). Saves every 50
// steps and resumes from the latest checkpoint when started again.
//   ./build/bin/zero-sharded-mlp [CKPT_DIR]                                # one process
//   ./build/bin/zero-run -n 4 -- ./build/bin/zero-sharded-mlp [CKPT_DIR]   # 4 ranks, ZeRO stage 2
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "zero/zero.h"

constexpr int kIn = 16, kHidden = 64, kBatch = 32, kSteps = 200;

zero::Status Train(const std::string& ckpt) {
  ZERO_ASSIGN_OR_RETURN(zero::Config cfg, zero::Config::FromJsonString(R"({
    "train_micro_batch_size_per_gpu": 32, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
    "zero_optimization": {"stage": 2}})"));
  ZERO_ASSIGN_OR_RETURN(std::shared_ptr<zero::Communicator> comm,
                        zero::Communicator::FromEnv(zero::Backend::kGloo, cfg));
  const int rank = comm->rank();

  // The trainer's buffers: tensors packed in order, with room for the padding the collectives move.
  const int64_t n = kIn * kHidden + kHidden + kHidden + 1;
  const int64_t cap = zero::ShardedOptimizer::Capacity(n, comm->world_size());
  std::vector<float> params(cap), grads(cap);
  float *w1 = &params[0], *b1 = w1 + kIn * kHidden, *w2 = b1 + kHidden, *b2 = w2 + kHidden;
  float *gw1 = &grads[0], *gb1 = gw1 + kIn * kHidden, *gw2 = gb1 + kHidden, *gb2 = gw2 + kHidden;
  std::mt19937 init(42);  // every rank draws the same values (and Create makes them agree anyway)
  std::normal_distribution<float> g(0.f, 0.25f);
  for (int i = 0; i < kIn * kHidden; ++i) w1[i] = g(init);
  for (int j = 0; j < kHidden; ++j) w2[j] = g(init);
  zero::FlatBuffers flat{.params = params.data(),
                         .grads = grads.data(),
                         .capacity = cap,
                         .tensors = {{"w1", {kIn, kHidden}}, {"b1", {kHidden}}, {"w2", {kHidden}}, {"b2", {1}}}};
  ZERO_ASSIGN_OR_RETURN(auto opt, zero::ShardedOptimizer::Create(cfg, comm, {flat}));

  int start = 0;  // resume where the last run saved; start over only where there is no checkpoint at all
  if (!ckpt.empty() && !absl::IsNotFound(zero::ResumeCheckpointTag(ckpt).status())) {
    ZERO_ASSIGN_OR_RETURN(zero::LoadResult loaded, opt->Load(ckpt));
    start = static_cast<int>(loaded.step);
  }

  std::vector<float> x(kIn), h(kHidden);
  for (int step = start; step < kSteps; ++step) {
    std::mt19937 data(step * 1000 + rank);  // this rank's micro-batch of this step: y = sum(sin(x))
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    std::fill(grads.begin(), grads.end(), 0.f);
    float loss = 0;
    for (int b = 0; b < kBatch; ++b) {  // forward and backward, one sample at a time
      float y = 0, out = b2[0];
      for (int i = 0; i < kIn; ++i) y += std::sin(x[i] = u(data));
      for (int j = 0; j < kHidden; ++j) {
        float a = b1[j];
        for (int i = 0; i < kIn; ++i) a += x[i] * w1[i * kHidden + j];
        out += (h[j] = std::tanh(a)) * w2[j];
      }
      loss += (out - y) * (out - y) / kBatch;
      const float dout = 2 * (out - y) / kBatch;
      gb2[0] += dout;
      for (int j = 0; j < kHidden; ++j) {
        const float dh = dout * w2[j] * (1 - h[j] * h[j]);
        gw2[j] += h[j] * dout;
        gb1[j] += dh;
        for (int i = 0; i < kIn; ++i) gw1[i * kHidden + j] += x[i] * dh;
      }
    }
    ZERO_ASSIGN_OR_RETURN(zero::StepResult r, opt->Step());  // average, clip, AdamW on this rank's shard
    if (rank == 0 && step % 40 == 0) std::printf("step %3d  loss %.4f  grad_norm %.3f\n", step, loss, r.grad_norm);
    if (!ckpt.empty() && (step + 1) % 50 == 0) ZERO_RETURN_IF_ERROR(opt->Save(ckpt).status());
  }
  return zero::OkStatus();
}

int main(int argc, char** argv) {
  const std::string arg = argc > 1 ? argv[1] : "";
  if (arg == "--help" || arg == "-h") return std::printf("usage: zero-sharded-mlp [CHECKPOINT_DIR]\n"), 0;
  if (argc > 2 || arg.rfind('-', 0) == 0) {  // one optional folder, no options
    std::fprintf(stderr, "zero-sharded-mlp: unknown argument '%s'\nusage: zero-sharded-mlp [CHECKPOINT_DIR]\n",
                 argv[argc > 2 && arg.rfind('-', 0) != 0 ? 2 : 1]);
    return 2;
  }
  zero::Status s = Train(arg);
  if (!s.ok()) std::fprintf(stderr, "zero-sharded-mlp: %s\n", zero::ErrorText(s).c_str());
  return s.ok() ? 0 : 1;
}
