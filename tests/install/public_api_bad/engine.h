// Fixture for public_api_headers_fail: a public nested Impl, a moved counter and an advanced include.
#pragma once

#include <cstdint>

#include "zero/advanced/engine_stats.h"

namespace zero {

class Engine {
 public:
  int64_t prefetch_gathers() const;
  class Impl;

 private:
  Impl* impl_;
};

struct GradStatsResult {};

}  // namespace zero
