// A consumer of an installed zero: a bf16 round trip, and one Gloo all-reduce over the ranks zero-run started
// (the install test launches it with the installed zero-run; run alone, it is world size 1).
#include <cstdio>

#include "zero/zero.h"

int main() {
  uint16_t h = zero::F32ToBF16(1.5f);
  std::printf("zero consumer: bf16(1.5) = 0x%04x, back = %g\n", h, zero::BF16ToF32(h));
  if (zero::BF16ToF32(h) != 1.5f) return 1;

  auto comm = zero::Communicator::FromEnv(zero::Backend::kGloo);
  if (!comm.ok()) {
    std::fprintf(stderr, "zero consumer: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  const int rank = (*comm)->rank(), world = (*comm)->world_size();
  float v = static_cast<float>(rank + 1);
  zero::Status s = (*comm)->AllReduce(&v, 1, zero::DType::kF32, zero::ReduceOp::kSum).Wait();
  if (!s.ok()) {
    std::fprintf(stderr, "zero consumer: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("zero consumer: rank %d of %d, all-reduced sum = %g\n", rank, world, v);
  return v == world * (world + 1) / 2.f ? 0 : 1;
}
