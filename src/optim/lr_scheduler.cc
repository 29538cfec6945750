// optim/lr_scheduler.cc — DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR
// (deepspeed/runtime/lr_schedules.py), evaluated in double in the same order as the Python code.
//
// Step mapping. DeepSpeed's engine calls optimizer.step() and then lr_scheduler.step(), and the scheduler's
// constructor (with last_batch_iteration = -1) already writes get_lr() into the optimizer. So the k-th optimizer
// step (k = 1, 2, ...) runs with get_lr() evaluated at last_batch_iteration = L0 + k - 1, where L0 is the
// configured last_batch_iteration (-1 for a fresh run). LrAt(step) takes the 0-based count of steps already
// applied, so LrAt(s) = get_lr(L0 + s); with L0 = -1 the first step uses get_lr(-1): warmup_min_lr for
// WarmupLR/WarmupDecayLR and 0 for WarmupCosineLR, exactly as DeepSpeed trains.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "zero/logging.h"
#include "zero/optimizer.h"
#include "zero/status.h"

namespace zero {
namespace {

constexpr double kPi = 3.14159265358979323846;  // math.pi

enum class Warmup { kLog, kLinear };

class ConstantLr final : public LrScheduler {
 public:
  explicit ConstantLr(double lr) : lr_(lr) {}
  double LrAt(int64_t) const override { return lr_; }

 private:
  double lr_;
};

// WarmupLR and WarmupDecayLR share get_lr(): min_lr + delta_lr * gamma; they differ in gamma after warmup.
class WarmupLr final : public LrScheduler {
 public:
  WarmupLr(const SchedulerConfig& c, Warmup warmup, bool decay)
      : min_lr_(c.warmup_min_lr),
        delta_lr_(c.warmup_max_lr - c.warmup_min_lr),
        warmup_steps_(std::max<int64_t>(2, c.warmup_num_steps)),  // DeepSpeed: max(2, warmup_num_steps)
        inverse_log_warmup_(1.0 / std::log(static_cast<double>(warmup_steps_))),
        warmup_(warmup),
        decay_(decay),
        total_steps_(c.total_num_steps),
        last_batch_iteration0_(c.last_batch_iteration) {}

  double LrAt(int64_t step) const override {
    const int64_t it = last_batch_iteration0_ + step;
    if (it < 0) return min_lr_;  // "before it has started"
    return min_lr_ + delta_lr_ * Gamma(it);
  }

 private:
  double Gamma(int64_t it) const {
    if (it < warmup_steps_) {
      if (warmup_ == Warmup::kLog) return inverse_log_warmup_ * std::log(static_cast<double>(it + 1));
      return static_cast<double>(it) / static_cast<double>(warmup_steps_);
    }
    if (!decay_) return 1.0;
    // max(0.0, float(total - it) / float(max(1.0, total - warmup)))
    const double denom = std::max(1.0, static_cast<double>(total_steps_ - warmup_steps_));
    return std::max(0.0, static_cast<double>(total_steps_ - it) / denom);
  }

  double min_lr_;
  double delta_lr_;
  int64_t warmup_steps_;
  double inverse_log_warmup_;
  Warmup warmup_;
  bool decay_;
  int64_t total_steps_;
  int64_t last_batch_iteration0_;
};

class WarmupCosineLr final : public LrScheduler {
 public:
  WarmupCosineLr(const SchedulerConfig& c, Warmup warmup, double base_lr)
      : base_lr_(base_lr),
        warmup_min_ratio_(c.warmup_min_ratio),
        cos_min_ratio_(c.cos_min_ratio),
        warmup_steps_(std::max<int64_t>(2, c.warmup_num_steps)),
        inverse_log_warmup_(1.0 / std::log(static_cast<double>(warmup_steps_))),
        warmup_(warmup),
        total_steps_(c.total_num_steps),
        last_batch_iteration0_(c.last_batch_iteration) {}

  double LrAt(int64_t step) const override {
    const int64_t it = last_batch_iteration0_ + step;
    if (it < 0) return 0.0;  // get_lr() returns 0.0 "before it has started"
    return base_lr_ * Ratio(it);
  }

 private:
  double Ratio(int64_t it) const {
    if (it < warmup_steps_) {
      double ratio = warmup_ == Warmup::kLog ? inverse_log_warmup_ * std::log(static_cast<double>(it + 1))
                                             : static_cast<double>(it) / static_cast<double>(warmup_steps_);
      const double ratio_delta = 1.0 - warmup_min_ratio_;
      return warmup_min_ratio_ + ratio * ratio_delta;
    }
    const int64_t real_last_step = it - warmup_steps_ + 1;
    const int64_t real_total_steps = std::max<int64_t>(1, total_steps_ - warmup_steps_);
    // Current DeepSpeed clamps the progress to 1 so the lr stays at the floor after total_num_steps.
    const double progress = std::min(1.0, static_cast<double>(real_last_step) / static_cast<double>(real_total_steps));
    const double ratio_delta = 1.0 - cos_min_ratio_;
    const double ratio = (1.0 + std::cos(kPi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + ratio_delta * ratio);
  }

  double base_lr_;
  double warmup_min_ratio_;
  double cos_min_ratio_;
  int64_t warmup_steps_;
  double inverse_log_warmup_;
  Warmup warmup_;
  int64_t total_steps_;
  int64_t last_batch_iteration0_;
};

}  // namespace

StatusOr<std::unique_ptr<LrScheduler>> MakeLrScheduler(const SchedulerConfig& cfg, double base_lr) {
  if (cfg.type.empty()) return std::unique_ptr<LrScheduler>(std::make_unique<ConstantLr>(base_lr));
  const bool warmup_lr = cfg.type == "WarmupLR";
  const bool decay_lr = cfg.type == "WarmupDecayLR";
  const bool cosine_lr = cfg.type == "WarmupCosineLR";
  if (!warmup_lr && !decay_lr && !cosine_lr) {
    return absl::InvalidArgumentError(absl::StrCat("scheduler.type: unknown scheduler \"", cfg.type,
                                                   "\"; zero implements WarmupLR, WarmupDecayLR and WarmupCosineLR"));
  }
  // DeepSpeed raises ValueError for a non-positive warmup_num_steps.
  if (cfg.warmup_num_steps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.params.warmup_num_steps: must be a positive integer, got ", cfg.warmup_num_steps));
  }
  // DeepSpeed only warns and falls back to "log" here; zero refuses to ignore a value silently.
  Warmup warmup;
  if (cfg.warmup_type == "log") {
    warmup = Warmup::kLog;
  } else if (cfg.warmup_type == "linear") {
    warmup = Warmup::kLinear;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.params.warmup_type: must be \"log\" or \"linear\", got \"", cfg.warmup_type, "\""));
  }
  if (cfg.last_batch_iteration < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.params.last_batch_iteration: must be >= -1, got ", cfg.last_batch_iteration));
  }
  if (decay_lr || cosine_lr) {
    // A required argument of both DeepSpeed classes (no default).
    if (cfg.total_num_steps <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("scheduler.params.total_num_steps: ", cfg.type,
                                                     " needs a positive total_num_steps, got ", cfg.total_num_steps));
    }
    if (cfg.total_num_steps < std::max<int64_t>(2, cfg.warmup_num_steps)) {
      ZERO_LOG(WARNING) << "scheduler.params.total_num_steps " << cfg.total_num_steps
                        << " is less than warmup_num_steps " << cfg.warmup_num_steps;
    }
  }
  if (cosine_lr) return std::unique_ptr<LrScheduler>(std::make_unique<WarmupCosineLr>(cfg, warmup, base_lr));
  return std::unique_ptr<LrScheduler>(std::make_unique<WarmupLr>(cfg, warmup, decay_lr));
}

}  // namespace zero
