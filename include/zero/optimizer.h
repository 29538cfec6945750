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
//
// ERRORS AND ABORTS. The factories (MakeOptimizer, MakeLrScheduler) return a Status for bad values. Update and
// ParallelUpdate are raw-pointer kernels, the unchecked fast form: the engine is their usual caller and builds
// every ShardUpdate itself, so a null buffer or step < 1 there is zero's bug and aborts (ZERO_CHECK, naming the
// field). A trainer that calls them directly checks its ShardUpdate once with ValidateShardUpdate, which returns
// the same conditions as a Status.
//
// Thread-safety: the built-in optimizers are immutable once made (Update is const), so one serves concurrent
// Update calls on disjoint tiles and several thread ranks; a trainer's own must be too (see ElementwiseOptimizer).
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
  float* master = nullptr;     // fp32 master weights (updated in place)
  const void* grad = nullptr;  // gradient (already averaged over ranks and micro-steps)
  DType grad_dtype = DType::kF32;
  float grad_scale = 1.0f;        // each gradient element is multiplied by this first
  float* const* state = nullptr;  // StateNames().size() buffers, zero-initialized at start
  void* param_out = nullptr;      // optional: the updated master written here (16-bit or f32)
  DType param_out_dtype = DType::kBF16;
  size_t n = 0;
  int64_t step = 1;  // 1-based count of applied (not skipped) steps
  // Double, like a Python float in torch.optim: the step's scalars (lr / (1 - beta1^step), 1 - lr * wd, ...)
  // are formed in double and rounded to f32 once, exactly as torch forms them.
  double lr = 0.0;
  // Where the tile lies, for a trainer's own optimizer (the built-ins ignore it): the unit (Engine's UnitId), its
  // parameter group (an EngineOptions::param_groups index; -1: none), and the unit-wide index of element 0 —
  // parameters are packed in registration order, so Engine::UnitParams gives each one's range. A tile never
  // spans two groups.
  int unit = -1;
  int group = -1;
  int64_t first_element = 0;

  // Elements [begin, begin + n) of this update: master, gradient, state, param_out and first_element moved by
  // `begin`. The moved state pointers are written to `states` (n_states of them, one per state buffer), which must
  // outlive the result.
  ShardUpdate Slice(size_t begin, size_t n, size_t n_states, float** states) const;
};

// An optimizer whose update of element i reads and writes only element i of the master, the gradient, the
// state buffers and param_out. Implementations must be thread-safe for concurrent Update calls on disjoint
// tiles (ParallelUpdate makes them).
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

// Hyperparameters are double for the same reason as ShardUpdate::lr (torch computes 1 - beta1 etc. in double).
// They are not validated here; MakeOptimizer validates config values the way torch.optim does.
struct AdamParams {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled_weight_decay = true;  // true: AdamW; false: Adam with L2 (decay added to the gradient)
  bool bias_correction = true;
};
struct SgdParams {
  double momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

// The built-in optimizers (CPU). Update follows torch.optim's single-tensor CPU formulas operation by
// operation in f32 (AdamW: param.mul_(1 - lr*wd); exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2)
// .addcmul_(grad, grad, 1 - beta2); denom = exp_avg_sq.sqrt() / sqrt(1 - beta2^step) + eps;
// param.addcdiv_(exp_avg, denom, -lr / (1 - beta1^step)); SGD as torch.optim.SGD, whose first step sets the
// momentum buffer to the gradient), never fusing a multiply-add, so results are bitwise identical on every CPU
// and SIMD target. (torch's own vectorized add/lerp use FMA on AVX2 builds: expect ulp-level differences from
// torch, not from one machine to the next.) The gradient is multiplied by grad_scale before anything else.
// Adam's state: {"exp_avg", "exp_avg_sq"}; SGD's: {"momentum_buffer"} when momentum != 0, else none.
// Update aborts (a bug in the caller) on step < 1 or null master/grad/state with n > 0 (ValidateShardUpdate
// checks the same as a Status).
std::unique_ptr<ElementwiseOptimizer> MakeAdam(const AdamParams& p);
std::unique_ptr<ElementwiseOptimizer> MakeSgd(const SgdParams& p);
// From the config's "optimizer" section, with DeepSpeed's naming: "Adam" is AdamW unless adam_w_mode is false,
// "AdamW" is always decoupled, "SGD" (case-insensitive). kInvalidArgument naming optimizer.type for unknown
// types and optimizer.params.* for values torch.optim rejects (lr, eps, weight_decay < 0, betas outside
// [0, 1), nesterov without momentum or with dampening).
StatusOr<std::unique_ptr<ElementwiseOptimizer>> MakeOptimizer(const OptimizerConfig& cfg);

// The hyperparameters of a built-in optimizer (from MakeAdam / MakeSgd / MakeOptimizer), or nullptr when `opt`
// is another implementation. The CUDA engine runs the built-ins as fused device kernels (zero/advanced/cuda_kernels.h)
// with these; a trainer's own ElementwiseOptimizer updates host memory only.
const AdamParams* BuiltinAdamParams(const ElementwiseOptimizer& opt);
const SgdParams* BuiltinSgdParams(const ElementwiseOptimizer& opt);

// Runs opt.Update over `u` split into tiles of at most `tile_elems` elements on `threads` threads (the
// calling thread included). Results are independent of `threads` and `tile_elems` (element-wise math).
// threads < 1 means 1; tile_elems 0 means no limit. Tiles are also capped at n / threads (rounded to 64
// elements) so every thread gets work, and small shards (< 32K elements per thread) use fewer threads. The
// helper threads come from a process-wide pool that grows to the largest `threads` requested; concurrent
// calls from several threads (thread ranks) are safe and share it. Blocks until the whole shard is updated.
void ParallelUpdate(const ElementwiseOptimizer& opt, const ShardUpdate& u, int threads, size_t tile_elems);

// The checked form of Update's and ParallelUpdate's preconditions: with n > 0, master and grad non-null, a state
// array with a non-null buffer for each of opt.StateNames(), and step >= 1. kInvalidArgument naming the optimizer
// and the field otherwise.
[[nodiscard]] Status ValidateShardUpdate(const ElementwiseOptimizer& opt, const ShardUpdate& u);

// Learning-rate schedules as DeepSpeed defines them (deepspeed/runtime/lr_schedules.py).
class LrScheduler {
 public:
  virtual ~LrScheduler() = default;
  // The learning rate for the given 0-based count of applied steps: the lr DeepSpeed's engine uses for step
  // number `step` + 1, i.e. get_lr() at last_batch_iteration = scheduler.params.last_batch_iteration + step
  // (DeepSpeed steps the scheduler after the optimizer, and its constructor already applies get_lr() at -1, so
  // a fresh run's first step uses warmup_min_lr, or 0 for WarmupCosineLR). Thread-safe (const, no state).
  virtual double LrAt(int64_t step) const = 0;
};
// type "" gives a constant `base_lr`; "WarmupLR", "WarmupDecayLR", "WarmupCosineLR" follow DeepSpeed's formulas
// (WarmupCosineLR scales `base_lr`, the optimizer's lr; the others use warmup_min_lr/warmup_max_lr).
// kInvalidArgument naming scheduler.type / scheduler.params.* for unknown types, warmup_num_steps <= 0, a
// warmup_type other than "log"/"linear" (DeepSpeed would warn and use "log"), last_batch_iteration < -1, or a
// missing (<= 0) total_num_steps for the decaying schedules.
StatusOr<std::unique_ptr<LrScheduler>> MakeLrScheduler(const SchedulerConfig& cfg, double base_lr);

}  // namespace zero
