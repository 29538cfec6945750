#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "zero/logging.h"
#include "zero/mixed_precision.h"

namespace zero {

LossScaler::LossScaler(const Options& o) : opt_(o), scale_(o.initial_scale), cur_hysteresis_(o.hysteresis) {}

LossScaler LossScaler::FromConfig(const Fp16Config& fp16) {
  Options o;
  if (!fp16.enabled) {
    o.dynamic = false;
    o.initial_scale = 1.0;
    return LossScaler(o);
  }
  if (fp16.loss_scale > 0) {
    o.dynamic = false;
    o.initial_scale = fp16.loss_scale;
    return LossScaler(o);
  }
  o.initial_scale = std::ldexp(1.0, fp16.initial_scale_power);
  o.min_scale = fp16.min_loss_scale;
  o.window = fp16.loss_scale_window;
  o.hysteresis = fp16.hysteresis;
  o.consecutive_hysteresis = fp16.consecutive_hysteresis;
  return LossScaler(o);
}

StatusOr<bool> LossScaler::Update(bool overflow) {
  if (!opt_.dynamic) {
    ++iter_;
    return overflow;
  }
  if (overflow) {
    if (opt_.hysteresis == 1 || cur_hysteresis_ == 1) {
      if (scale_ == opt_.min_scale) {
        return absl::FailedPreconditionError(absl::StrCat(
            "fp16: gradient overflow with the loss scale already at fp16.min_loss_scale (", opt_.min_scale,
            "); cannot decrease it further (DeepSpeed exits here too). Consider bf16, a lower learning rate or "
            "gradient_clipping"));
      }
      scale_ = std::max(scale_ / 2.0, opt_.min_scale);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = iter_;
  } else {
    if (opt_.consecutive_hysteresis) cur_hysteresis_ = opt_.hysteresis;
    if ((iter_ - last_overflow_iter_) % opt_.window == 0) {
      if (!opt_.consecutive_hysteresis) cur_hysteresis_ = opt_.hysteresis;
      scale_ *= 2.0;
    }
  }
  ++iter_;
  return overflow;
}

}  // namespace zero
