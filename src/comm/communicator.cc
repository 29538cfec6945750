// Backend-independent parts of the Communicator factory set.
#include "zero/communicator.h"
#include "zero/features.h"

namespace zero {

#if !ZERO_HAVE_CUDA
StatusOr<std::unique_ptr<Communicator>> Communicator::CreateNccl(std::shared_ptr<Store>, int, int, const CommOptions&) {
  return absl::UnimplementedError("CreateNccl: zero was built without CUDA (ZERO_ENABLE_CUDA=OFF or no nvcc)");
}
#endif

}  // namespace zero
