// The libtorch component against an installed zero: a Linear layer's optimizer, one step on one rank.
#include <torch/torch.h>

#include <cstdio>

#include "zero/torch.h"
#include "zero/zero.h"

int main() {
  auto cfg = zero::Config::FromJsonString(
      R"({"train_micro_batch_size_per_gpu": 3, "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}})");
  auto comm = zero::Communicator::FromEnv(zero::Backend::kGloo, *cfg);
  if (!cfg.ok() || !comm.ok()) return 1;
  torch::nn::Linear layer(4, 2);
  auto opt = zero::TorchOptimizer::Create(*cfg, *comm, *layer);
  if (!opt.ok()) {
    std::fprintf(stderr, "%s\n", zero::ErrorText(opt.status()).c_str());
    return 1;
  }
  const float before = layer->weight[0][0].item<float>();
  layer->forward(torch::ones({3, 4})).sum().backward();
  auto r = (*opt)->step();
  if (!r.ok()) return 1;
  std::printf("zero torch consumer: step %lld, weight moved %d\n", static_cast<long long>(r->step),
              layer->weight[0][0].item<float>() != before);
  return 0;
}
