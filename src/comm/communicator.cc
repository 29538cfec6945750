// Backend-independent parts of the Communicator factory set.
#include "zero/communicator.h"

#include "absl/strings/str_cat.h"
#include "zero/features.h"

namespace zero {

StatusOr<std::unique_ptr<Communicator>> Communicator::Split(int color, int key) {
  return absl::UnimplementedError(absl::StrCat("Split(color ", color, ", key ", key, "): rank ", rank(), " of ",
                                               world_size(), ": this communicator cannot be split"));
}

#if !ZERO_HAVE_CUDA
StatusOr<std::unique_ptr<Communicator>> Communicator::CreateNccl(std::shared_ptr<Store>, int, int, const CommOptions&) {
  return absl::UnimplementedError("CreateNccl: zero was built without CUDA (ZERO_ENABLE_CUDA=OFF or no nvcc)");
}
#endif

}  // namespace zero
