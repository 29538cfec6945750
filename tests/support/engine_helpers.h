// tests/support/engine_helpers.h — small helpers for engine-level tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "support/status_matchers.h"  // IWYU pragma: export (engine tests use ASSERT_OK_AND_ASSIGN)
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/status.h"

namespace zero::testing {

// A non-owning shared_ptr to a communicator the test fixture owns (the Engine shares its communicator).
inline std::shared_ptr<Communicator> Borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

// The config engine tests train with: fp32 AdamW (lr, weight decay 0.01), `stage`, `micro` sequences per rank,
// `ga` micro-steps, every stage-3 unit really sharded (persistence threshold 0), overlapped reductions, clipping 1.
inline Config TrainConfig(int stage, int micro, int ga = 1, double lr = 3e-3, double clip = 1.0,
                          GradAccumulationMode mode = GradAccumulationMode::kLowMemory) {
  Config c = Config::Default();
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.overlap_comm = true;
  c.train_micro_batch_size_per_gpu = micro;
  c.gradient_accumulation_steps = ga;
  c.train_batch_size.reset();
  c.gradient_clipping = clip;
  c.gradient_accumulation_mode = mode;
  OptimizerConfig o;
  o.type = "AdamW";
  o.lr = lr;
  o.weight_decay = 0.01;
  c.optimizer = o;
  return c;
}

// ZeRO++'s quantized collectives on `c`: qwZ in blocks of `qwz_block` elements (0: off) and qgZ at `qgz_bits` (0:
// off) in blocks of `qgz_block`, LoCo as the config has it.
inline void SetQuantized(Config& c, int64_t qwz_block, int qgz_bits, int64_t qgz_block = 32) {
  if (qwz_block > 0) {
    c.zero.zero_quantized_weights = true;
    c.zero.zero_quantized_weights_block_size = qwz_block;
  }
  if (qgz_bits > 0) {
    c.zero.zero_quantized_gradients = true;
    c.zero.zero_quantized_gradients_bits = qgz_bits;
    c.zero.zero_quantized_gradients_block_size = qgz_block;
  }
}

}  // namespace zero::testing
