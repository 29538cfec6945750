// examples/gpt/support_threads.h — run TrainRank on N ranks as N threads in this process (Gloo over loopback).
#pragma once

#include <vector>

#include "train.h"

namespace zero::gpt {

// Trains `world` thread-ranks; returns every rank's result, or the first rank's error ("rank r: ...").
StatusOr<std::vector<TrainResult>> RunThreadRanks(int world, const Config& cfg, const TrainOptions& options,
                                                  const std::function<void(const StepLog&)>& on_step = {});

}  // namespace zero::gpt
