// zero/torch.h — zero for libtorch trainers: a torch::optim-shaped optimizer over a torch::nn::Module's parameters,
// ZeRO stages 0-2 (ShardedOptimizer underneath), with gradient reduction started from autograd hooks so that it
// runs under the rest of backward, as DDP's reducer does. Optional component: find_package(zero COMPONENTS torch),
// target zero::torch (built when CMake finds Torch).
//
//   auto comm = zero::Communicator::FromEnv().value();                   // zero-run, torchrun, mpirun, srun
//   auto cfg = zero::Config::FromJsonFile("ds_config.json").value();
//   auto opt = zero::TorchOptimizer::Create(cfg, comm, *model).value();  // was torch::optim::AdamW(...)
//   for (...) {
//     opt->zero_grad();
//     torch::Tensor loss = model->forward(x, y);
//     loss.backward();                                                   // buckets reduce as backward finishes them
//     zero::StepResult r = opt->step(lr).value();                        // clip, update, all-gather
//   }
//
// WHAT IT DOES TO THE MODEL. Create packs every parameter into flat buffers that zero reduces and updates in
// place: each parameter becomes a view into its bucket's parameter buffer (Tensor::set_data, so autograd and the
// module keep the same tensors), and each trainable parameter's .grad() a view into the bucket's gradient buffer
// (autograd accumulates into a defined gradient in place). Buckets are cut in reverse registration order, the
// order backward produces gradients, up to zero_optimization.reduce_bucket_size elements each (a larger
// parameter is a bucket of its own); frozen parameters (requires_grad false) go into buckets of their own with no
// gradient, master or optimizer state. Parameters keep their torch names everywhere: parameter groups, errors,
// and the checkpoints Save writes ("blocks.0.attn.weight"), so a checkpoint saved before freezing loads after.
// A parameter registered under two names (tied weights) is one parameter, under its first name. With fp16/bf16
// in the config the parameters become 16-bit views over zero's fp32 master (DeepSpeed's engine halves the module
// the same way); otherwise they stay float32. The model's parameters must be float32 CPU tensors at Create.
//
// OVERLAP (TorchOptions::overlap, on by default). A post-hook on every trainable parameter's gradient accumulator
// counts the bucket's gradients; when the last one is accumulated the bucket's reduction starts
// (ShardedOptimizer::GradientsReady) while backward computes the earlier layers' gradients. Overlap turns the
// config's zero_optimization.overlap_comm on (without it the engine would wait for each reduction as it is issued).
// The engine keeps at most reduce_bucket_size gradient elements in flight, so a bucket's hook waits for the
// previous bucket's reduction to finish: one bucket reduces while backward fills the next. The result is the same
// bits as reducing everything at step(). Every rank must produce the same gradients in the same order (no
// parameter unused on one rank only), as with DDP without find_unused_parameters; a bucket whose gradients never
// all arrive is reduced at step(). Gradient accumulation: backward passes while no_sync()'s guard lives (DDP's
// no_sync()) only accumulate; the pass after it hands the buckets over. A second backward without no_sync() is an
// error at step(): the first one's buckets were already reduced.
//
// STEP. step() reduces what is left, clips by gradient_clipping, runs the config's optimizer (the groups'
// options, see Create) on this rank's shard with fp32 master state, and all-gathers the updated parameters back
// into the module's tensors. Unlike torch's optimizer.step(), it leaves every .grad() zero (the reduction happens
// in the gradient buffer, which is then cleared for the next backward): read the norm from StepResult::grad_norm.
//
// NO SILENT STORAGE SWAP. torch::load(model, ...), module->to(...), Tensor::set_data and a gradient set to none
// (module->zero_grad(true), p.mutable_grad() = {}) leave the tensor viewing memory zero no longer trains. step()
// checks every parameter and gradient first and returns kFailedPrecondition naming the first that moved, before
// any collective. reload() adopts the module's current values instead (after torch::load: the loaded ones),
// makes them views into zero's buffers again and re-reads the fp32 master; the optimizer state is kept.
//
// Collective: every rank calls Create, step, reload, Save and Load together, with the same model. Not
// thread-safe; CPU tensors (the host engine over Gloo). The CUDA engine under libtorch is not built yet.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero {

struct TorchOptions {
  // cpu_threads, initial_value_sync and the rest as for the Engine. Its param_groups are matched by the torch
  // names, after the groups Create makes from torch's OptimizerParamGroups.
  EngineOptions engine;
  // Start each bucket's reduction from backward's hooks, with zero_optimization.overlap_comm on (see the file
  // comment); false: all at step(), overlap_comm as the config says.
  bool overlap = true;
};

class TorchOptimizer;

// TorchOptimizer::no_sync()'s guard: backward passes while it lives accumulate without handing buckets over.
class TorchNoSync {
 public:
  explicit TorchNoSync(TorchOptimizer* opt);
  ~TorchNoSync();
  TorchNoSync(const TorchNoSync&) = delete;
  TorchNoSync& operator=(const TorchNoSync&) = delete;

 private:
  TorchOptimizer* opt_;
};

class TorchOptimizer {
 public:
  // Over every parameter of `model` (named_parameters()), the config's "optimizer" section as the options.
  static StatusOr<std::unique_ptr<TorchOptimizer>> Create(const Config& config, std::shared_ptr<Communicator> comm,
                                                          torch::nn::Module& model, TorchOptions options = {});
  // Over torch's parameter groups, which name parameters of `model`. Each group's options must be of the
  // config's optimizer (AdamWOptions for "AdamW", AdamOptions for "Adam" with adam_w_mode false, SGDOptions for
  // "SGD"); their weight_decay, betas and eps (SGD: weight_decay) become a zero ParamGroup, and their lr,
  // relative to the config's optimizer.params.lr, its lr_scale: the schedule (or step's lr) sets the config's
  // lr and every group keeps its ratio. A parameter of `model` in no group is frozen; one in two groups, or
  // amsgrad, is an error.
  static StatusOr<std::unique_ptr<TorchOptimizer>> Create(const Config& config, std::shared_ptr<Communicator> comm,
                                                          torch::nn::Module& model,
                                                          std::vector<torch::optim::OptimizerParamGroup> groups,
                                                          TorchOptions options = {});
  ~TorchOptimizer();  // removes the hooks; the module's tensors keep their values (they own the buffers' storage)
  TorchOptimizer(const TorchOptimizer&) = delete;
  TorchOptimizer& operator=(const TorchOptimizer&) = delete;

  // One optimizer step (see the file comment); `lr` sets this step's base learning rate instead of the config's
  // schedule. Collective.
  StatusOr<StepResult> step(std::optional<double> lr = std::nullopt);
  // Zeroes every gradient in place, keeping the views (torch's set_to_none would break them).
  void zero_grad();
  // Adopts the module's current parameter values and tensors (see the file comment). Collective.
  Status reload();

  // While the returned guard lives, backward's hooks only accumulate (gradient accumulation's early micro-steps;
  // DDP's no_sync()).
  TorchNoSync no_sync();

  // Checkpoints under the torch names (zero/checkpoint.h): world size and stage may differ at Load. Collective.
  StatusOr<std::string> Save(const std::string& dir, const SaveOptions& options = {});
  StatusOr<LoadResult> Load(const std::string& dir, const LoadOptions& options = {});

  // This rank's bytes by tag and tier, without the module's own buffers (trainer_bytes: the flat parameter and
  // gradient buffers the module's tensors view).
  MemoryReport memory_report() const;
  int64_t trainer_bytes() const;
  // The buckets, in the order their reductions are issued, as the torch names of their parameters.
  std::vector<std::vector<std::string>> buckets() const;
  int64_t steps() const;
  double loss_scale() const;
  int rank() const;
  int world_size() const;

 private:
  friend class TorchNoSync;
  struct State;
  explicit TorchOptimizer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace zero
