// The smallest libtorch trainer on zero: examples/torch_lm/model.h's transformer LM, its optimizer replaced by
// zero::TorchOptimizer. The README quotes the integration from here.
//   ./build/bin/zero-torch-lm-minimal                                # one process
//   ./build/bin/zero-run -n 4 -- ./build/bin/zero-torch-lm-minimal   # 4 ranks, ZeRO stage 2
#include <torch/torch.h>

#include <cstdio>

#include "model.h"
#include "zero/torch.h"
#include "zero/zero.h"

zero::Status Train() {
  torch::set_num_threads(1);  // the ranks share the machine's cores
  const torch_lm::LMOptions shape;
  torch_lm::TransformerLM model = torch_lm::MakeModel(shape, /*seed=*/1);
  ZERO_ASSIGN_OR_RETURN(zero::Config cfg, zero::Config::FromJsonString(R"({
    "train_batch_size": 8, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 20000}})"));
  ZERO_ASSIGN_OR_RETURN(auto comm, zero::Communicator::FromEnv(zero::Backend::kGloo, cfg));
  ZERO_ASSIGN_OR_RETURN(auto opt, zero::TorchOptimizer::Create(cfg, comm, *model));  // was torch::optim::AdamW
  const int per = 8 / comm->world_size(), first = comm->rank() * per;
  for (int step = 1; step <= 30; ++step) {
    const torch_lm::Batch b = torch_lm::MakeBatch(shape, step, first, first + per);
    opt->zero_grad();
    torch::Tensor loss = model->forward(b.idx, b.targets);
    loss.backward();                                         // each bucket's reduction starts as backward ends it
    ZERO_ASSIGN_OR_RETURN(zero::StepResult r, opt->step());  // clip, AdamW on this rank's shard, all-gather
    if (comm->rank() == 0 && step % 10 == 0) {
      std::printf("step %d: loss %.4f (rank 0's slice), grad norm %.3f\n", step, loss.item<double>(), r.grad_norm);
    }
  }
  return zero::OkStatus();
}

int main() {
  const zero::Status s = Train();
  if (!s.ok()) std::fprintf(stderr, "zero-torch-lm-minimal: %s\n", zero::ErrorText(s).c_str());
  return s.ok() ? 0 : 1;
}
