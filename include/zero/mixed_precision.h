// zero/mixed_precision.h — the loss scaler for fp16 training, with DeepSpeed's exact semantics.
//
//   zero::LossScaler scaler = zero::LossScaler::FromConfig(cfg.fp16);
//   loss *= scaler.scale();                 // the trainer scales its loss before backward
//   ...
//   ZERO_ASSIGN_OR_RETURN(bool skip, scaler.Update(/*overflow=*/found_inf_on_any_rank));
//
// Dynamic scaling (DeepSpeed deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale):
// - start at 2^initial_scale_power;
// - on overflow: if hysteresis is used up (delayed_shift == 1 or cur_hysteresis == 1), halve the scale, never
//   below min_loss_scale — and if the scale is already at the minimum, fail (DeepSpeed raises "Current loss
//   scale already at minimum"); otherwise spend one unit of hysteresis and keep the scale. Either way the step
//   is skipped.
// - on a clean step: with consecutive_hysteresis refill the hysteresis; after loss_scale_window clean steps
//   since the last overflow ((iter - last_overflow_iter) % window == 0) refill the hysteresis and double the
//   scale (no cap).
// loss_scale > 0 in the config means a static scale: never changes, overflow steps are still skipped.
// One deliberate difference from DeepSpeed: its defaults change (2^32, no hysteresis) when the fp16 section has
// none of the dynamic keys; zero always applies the documented defaults (2^16, hysteresis 2).
//
// A LossScaler is a plain value, used from one thread (the rank's); its only error is the kFailedPrecondition
// above. GradStats is thread-safe and has no error.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/status.h"

namespace zero {

class LossScaler {
 public:
  struct Options {
    double initial_scale = 65536.0;
    double min_scale = 1.0;
    int64_t window = 1000;
    int hysteresis = 2;
    bool consecutive_hysteresis = false;
    bool dynamic = true;
  };

  explicit LossScaler(const Options& o);
  // From the "fp16" section; fp16 disabled gives a static scale of 1.
  static LossScaler FromConfig(const Fp16Config& fp16);

  double scale() const { return scale_; }
  int hysteresis_left() const { return cur_hysteresis_; }
  int64_t iteration() const { return iter_; }
  bool dynamic() const { return opt_.dynamic; }

  // Everything Update changes, for checkpoints: a restored scaler continues exactly as the saved one would.
  struct State {
    double scale = 1.0;
    int hysteresis = 0;
    int64_t iteration = 0;
    int64_t last_overflow_iteration = -1;
  };
  State state() const { return {scale_, cur_hysteresis_, iter_, last_overflow_iter_}; }
  void Restore(const State& s) {
    scale_ = s.scale;
    cur_hysteresis_ = s.hysteresis;
    iter_ = s.iteration;
    last_overflow_iter_ = s.last_overflow_iteration;
  }

  // Records one optimizer step's outcome. Returns true when the step must be skipped (overflow).
  // kFailedPrecondition when an overflow arrives with the scale already at min_loss_scale (DeepSpeed's
  // "cannot decrease scale anymore"): training cannot make progress.
  StatusOr<bool> Update(bool overflow);

 private:
  Options opt_;
  double scale_;
  int cur_hysteresis_;
  int64_t iter_ = 0;
  int64_t last_overflow_iter_ = -1;
};

// Rounds n fp32 values to bf16 stochastically: a finite value goes to the upper of its two bf16 neighbours
// with probability equal to its distance from the lower one (in bf16 ulps), so the rounding is unbiased in
// expectation. The randomness is a counter-based hash of (key, first_index + i): reproducible, and independent
// of how an array is split into shards or tiles. Non-finite values round to nearest even (NaN stays NaN).
void StochasticRoundToBF16(const float* src, uint16_t* dst, size_t n, uint64_t key, int64_t first_index);

// What GradStats reads off a gradient shard: the host GradStats below, and zero::cuda::GradStats
// (zero/advanced/cuda_kernels.h), which writes it to device memory with the elements scaled first.
struct GradStatsResult {
  // Sum of the elements' squares, each square and the sum in double (an f32's square is exact in double).
  // Not finite (+inf or NaN) when nonfinite > 0 on the host; meaningful only when nonfinite == 0 on the device.
  double sumsq = 0.0;
  // Number of elements that are inf or NaN (either sign, any payload).
  uint64_t nonfinite = 0;
};

// One read-only pass over n elements of type t at g (host memory, element-aligned): the overflow check and
// the sum of squares for the global gradient norm, fused so a shard is read once. Unscaling and clipping are
// not applied here: the engine folds both into the optimizer's grad_scale (one factor in its fused pass), and
// the norm of the unscaled gradient is sqrt(sumsq) / loss_scale.
//
// Vectorized with runtime dispatch over SIMD targets (Google Highway). Deterministic: element i is added to
// partial sum i mod 32 in index order, and the 32 partial sums are added in a fixed pairwise tree. That order
// is fixed by the code, not by the dispatched target's lane count (each target keeps 32 / lanes accumulators of
// `lanes` doubles), and the squares are exact (so FMA and multiply-then-add agree): the same input gives the
// same bits on every target and machine. It differs from a sequential sum only by rounding (the relative
// difference is within n * 2^-53 of the sum). Thread-safe; reads g only.
GradStatsResult GradStats(const void* g, DType t, size_t n);

}  // namespace zero
