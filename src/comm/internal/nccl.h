// comm/internal/nccl.h — the NCCL communicator's factory, in zero::cuda (comm/nccl_communicator.cc).
// defines: CreateNcclCommunicator.
//
// Communicator::CreateNccl (comm/communicator.cc, in the CPU library) calls it through the table of
// core/internal/cuda_backend.h, which zero::cuda's registration fills; its contract is CreateNccl's
// (zero/communicator.h).
#pragma once

#include <memory>

#include "zero/communicator.h"

namespace zero::internal {

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                               const CommOptions& options);

}  // namespace zero::internal
