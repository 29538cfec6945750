// examples/gpt/train_common.h — pieces the host (train.cc) and CUDA (train_cuda.cc) training loops share.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "data.h"
#include "model.h"
#include "train.h"
#include "zero/communicator.h"
#include "zero/engine.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero::gpt::internal {

// The model's parameter specs as the engine's.
std::vector<zero::ParamSpec> ToEngineSpecs(const std::vector<gpt::ParamSpec>& specs);
// CPU time of this process so far: unlike wall time, it does not grow while other tenants of a shared machine
// hold the cores.
double ProcessCpuMs();
// An all-gather of n floats per rank between host arrays (a Gloo communicator directly; NCCL through device
// copies). Collective.
using HostAllGather = std::function<Status(const float* send, float* recv, size_t n)>;
// Gathers every rank's memory report (int64 counters carried bit-exactly through f32 all-gather slots).
StatusOr<std::vector<MemoryReport>> GatherReports(int world, const MemoryReport& mine,
                                                  const HostAllGather& all_gather);

// The model's units in an engine: the root (embeddings, final layernorm, tied head) and one per block.
struct GptUnits {
  UnitId root = -1;
  std::vector<UnitId> blocks;
};
// Registers the units and finalizes the engine with the model's initial values (seeded). Collective.
StatusOr<GptUnits> RegisterGpt(Engine& engine, const GptConfig& mc, uint64_t seed);
// The byte corpus of the options (their seed and data file).
StatusOr<ByteDataset> LoadData(const TrainOptions& options);
// Every final parameter in fp32, unit by unit in registration order (the master weights). Collective.
StatusOr<std::vector<float>> FinalParams(Engine& engine, const GptUnits& units);

}  // namespace zero::gpt::internal
