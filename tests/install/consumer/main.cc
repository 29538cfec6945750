// A consumer of an installed zero: a bf16 round trip, which NCCL path it has, and one Gloo all-reduce over the
// ranks zero-run started (the install test launches it with the installed zero-run; run alone, it is world size 1).
// Built twice by the install test: linking zero::zero only, and with ZERO_CONSUMER_CUDA linking zero::cuda.
#include <cstdio>
#include <string>

#include "zero/zero.h"

int main() {
  uint16_t h = zero::F32ToBF16(1.5f);
  std::printf("zero consumer: bf16(1.5) = 0x%04x, back = %g\n", h, zero::BF16ToF32(h));
  if (zero::BF16ToF32(h) != 1.5f) return 1;

  // Rank 5 of 1 fails on every machine, GPU or not, without touching a device: with zero::cuda linked the NCCL
  // communicator's own argument check answers; without it the CPU library says to link zero::cuda. The install
  // test reads which.
  auto nccl = zero::Communicator::CreateNccl(zero::Store::Hash(), 5, 1);
  if (nccl.ok()) return 1;
  std::printf("zero consumer: CreateNccl says: %s\n", std::string(nccl.status().message()).c_str());

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
