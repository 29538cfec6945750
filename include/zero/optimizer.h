// zero/optimizer.h — element-wise optimizers that run on each rank's shard.
//
//   auto opt = zero::MakeOptimizer(cfg.optimizer.value());           // AdamW, Adam (L2) or SGD
//   // or wrap your own: class Lion : public zero::ElementwiseOptimizer { ... };
//   zero::ShardUpdate u{.master = m, .grad = g, .grad_dtype = zero::DType::kBF16, .grad_scale = 1.f / scale,
//                       .state = states, .param_out = p16, .param_out_dtype = zero::DType::kBF16,
//                       .n = n, .step = step, .lr = lr};
//   zero::ParallelUpdate(*opt, u, /*threads=*/2, /*tile=*/cfg.zero.sub_group_size);
//
// "Wrap its optimizer": a trainer's own element-wise update plugs in by implementing ElementwiseOptimizer.
// It declares its state buffers by name; the engine allocates them for the shard only (zeroed), and calls
// Update on tiles of the shard. The built-in AdamW/Adam/SGD are fused fast paths: one pass reads the fp32 or
// 16-bit gradient, applies grad_scale, updates master and state, and writes the 16-bit parameter copy.
// Formulas match PyTorch's torch.optim.{AdamW, Adam, SGD}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/status.h"

namespace zero {

// One tile of one shard. All pointers are host memory and cover `n` elements.
struct ShardUpdate {
  float* master = nullptr;                    // fp32 master weights (updated in place)
  const void* grad = nullptr;                 // gradient (already averaged over ranks and micro-steps)
  DType grad_dtype = DType::kF32;
  float grad_scale = 1.0f;                    // each gradient element is multiplied by this first
  float* const* state = nullptr;              // StateNames().size() buffers, zero-initialized at start
  void* param_out = nullptr;                  // optional: the updated master written here (16-bit or f32)
  DType param_out_dtype = DType::kBF16;
  size_t n = 0;
  int64_t step = 1;                           // 1-based count of applied (not skipped) steps
  float lr = 0.0f;
};

class ElementwiseOptimizer {
 public:
  virtual ~ElementwiseOptimizer() = default;
  virtual std::string Name() const = 0;
  // Names of per-element fp32 state buffers ("exp_avg", "exp_avg_sq", "momentum_buffer", ...).
  virtual std::vector<std::string> StateNames() const = 0;
  // Applies one step to one tile. Called concurrently on disjoint tiles: must not keep mutable state
  // outside the buffers it is given.
  virtual void Update(const ShardUpdate& u) const = 0;
};

struct AdamParams {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool decoupled_weight_decay = true;  // true: AdamW; false: Adam with L2 (decay added to the gradient)
  bool bias_correction = true;
};
struct SgdParams {
  float momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
};

std::unique_ptr<ElementwiseOptimizer> MakeAdam(const AdamParams& p);
std::unique_ptr<ElementwiseOptimizer> MakeSgd(const SgdParams& p);
// From the config's "optimizer" section; kInvalidArgument naming optimizer.type for unknown types.
StatusOr<std::unique_ptr<ElementwiseOptimizer>> MakeOptimizer(const OptimizerConfig& cfg);

// Runs opt.Update over `u` split into tiles of at most `tile_elems` elements on `threads` threads (the
// calling thread included). Results are independent of `threads` and `tile_elems` (element-wise math).
void ParallelUpdate(const ElementwiseOptimizer& opt, const ShardUpdate& u, int threads, size_t tile_elems);

// Learning-rate schedules as DeepSpeed defines them (deepspeed/runtime/lr_schedules.py).
class LrScheduler {
 public:
  virtual ~LrScheduler() = default;
  // The learning rate for the given 0-based count of applied steps.
  virtual double LrAt(int64_t step) const = 0;
};
// type "" gives a constant `base_lr`. kInvalidArgument naming scheduler.type / scheduler.params.* otherwise.
StatusOr<std::unique_ptr<LrScheduler>> MakeLrScheduler(const SchedulerConfig& cfg, double base_lr);

}  // namespace zero
