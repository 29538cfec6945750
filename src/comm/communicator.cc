// Backend-independent parts of the Communicator factory set.
#include "zero/communicator.h"

#include "zero/advanced/communicator_ext.h"

#include "absl/strings/str_cat.h"
#include "comm/internal/op.h"
#include "comm/internal/work_state.h"
#include "core/internal/cuda_backend.h"

namespace zero {

StatusOr<std::shared_ptr<Communicator>> Communicator::Split(int color, int key) {
  return absl::UnimplementedError(absl::StrCat("Split(color ", color, ", key ", key, "): rank ", rank(), " of ",
                                               world_size(), ": this communicator cannot be split"));
}

Work advanced::ExtendedCommunicator::AllGatherStrided(const void*, void*, size_t count, size_t stride, DType dtype,
                                                      CUstream_st*) {
  internal::OpDesc d{.kind = internal::OpKind::kAllGatherStrided, .dtype = dtype, .count = count, .stride = stride};
  return Work(std::make_shared<internal::CompletedWorkState>(
      d, absl::UnimplementedError(absl::StrCat(internal::DescribeOp(d), " on rank ", rank(), " of ", world_size(),
                                               ": this communicator has no strided all-gather "
                                               "(SupportsAllGatherStrided() is false)"))));
}

Work advanced::ExtendedCommunicator::ReduceScatterStrided(const void*, void*, size_t count, size_t stride, DType dtype,
                                                          ReduceOp op, CUstream_st*) {
  internal::OpDesc d{
      .kind = internal::OpKind::kReduceScatterStrided, .dtype = dtype, .reduce = op, .count = count, .stride = stride};
  return Work(std::make_shared<internal::CompletedWorkState>(
      d, absl::UnimplementedError(absl::StrCat(internal::DescribeOp(d), " on rank ", rank(), " of ", world_size(),
                                               ": this communicator has no strided reduce-scatter for ", count,
                                               " elements per rank of ", std::string(DTypeName(dtype)),
                                               " (SupportsReduceScatterStrided is false)"))));
}

Work advanced::ExtendedCommunicator::AllToAll(const void*, void*, size_t count, DType dtype, CUstream_st*) {
  internal::OpDesc d{.kind = internal::OpKind::kAllToAll, .dtype = dtype, .count = count};
  return Work(std::make_shared<internal::CompletedWorkState>(
      d,
      absl::UnimplementedError(absl::StrCat(internal::DescribeOp(d), " on rank ", rank(), " of ", world_size(),
                                            ": this communicator has no all-to-all (SupportsAllToAll() is false)"))));
}

advanced::ExtendedCommunicator* advanced::Extended(Communicator& comm) {
  return dynamic_cast<ExtendedCommunicator*>(&comm);
}

const advanced::ExtendedCommunicator* advanced::Extended(const Communicator& comm) {
  return dynamic_cast<const ExtendedCommunicator*>(&comm);
}

// The NCCL communicator lives in zero::cuda (comm/nccl_communicator.cc), which registers it: the CPU library
// references no NCCL symbol (core/internal/cuda_backend.h).
StatusOr<std::shared_ptr<Communicator>> Communicator::CreateNccl(std::shared_ptr<Store> store, int rank, int world_size,
                                                                 const CommOptions& options) {
  const internal::CudaBackend* cuda = internal::GetCudaBackend();
  if (cuda == nullptr) {
    return internal::CudaNotLinkedError(absl::StrCat("CreateNccl (rank ", rank, " of ", world_size, ")"));
  }
  return cuda->create_nccl(std::move(store), rank, world_size, options);
}

}  // namespace zero
