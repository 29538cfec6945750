// shard/internal/registration.h — small collectives over host arrays, and the check that every rank registered
// the same units. defines: HostCollectives, DescribeRegistration, Fnv1a64, CheckRegistrationAgrees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shard/internal/compute.h"
#include "shard/internal/layout.h"
#include "zero/communicator.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero::internal {

// Collectives over small host arrays (the registration check, the norm, GatherParam). The NCCL communicator
// reads device memory only, so on the CUDA engine they go through compute-tier copies; all of them wait.
class HostCollectives {
 public:
  HostCollectives(Communicator* comm, const std::unique_ptr<ComputeTier>& compute) : comm_(comm), compute_(compute) {}
  Status AllGather(const float* send, float* recv, size_t n);
  // Every step (the norm): the device scratch is kept, so the steady state allocates nothing.
  Status AllReduceSum(float* buf, size_t n);
  // Rank `root`'s n values into every rank's `buf`. On the CUDA engine through a device buffer of at most
  // kBroadcastChunk elements at a time, so no rank holds more than that beyond `buf`.
  Status Broadcast(float* buf, size_t n, int root);
  static constexpr size_t kBroadcastChunk = size_t{1} << 20;
  // All-gather of arbitrary bytes through f32 slots (all-gather is a copy, so any bit pattern survives).
  StatusOr<std::vector<std::string>> AllGatherStrings(const std::string& mine);
  Communicator* comm() const { return comm_; }
  void set_comm(Communicator* comm) { comm_ = comm; }  // live recovery's new job-wide communicator

 private:
  Communicator* comm_;
  const std::unique_ptr<ComputeTier>& compute_;
  Buffer reduce_scratch_;  // CUDA engine: the norm's all-reduce
};

// FNV-1a over bytes: the registration hash.
uint64_t Fnv1a64(const void* data, size_t bytes);
// The per-parameter value hash of InitialValueSync: every bit of every value counts (-0 and +0, NaN payloads);
// four independent 64-bit multiply-xor lanes over 8-byte words, so it runs near memory speed where a bytewise
// FNV-1a would add about 40 % to Finalize (measured on the small GPT, bench/results/initial-value-sync.md).
uint64_t HashValues(const float* values, size_t n);

// Canonical text of a registration, one line per parameter, used for the cross-rank agreement check.
std::string DescribeRegistration(const std::vector<UnitLayout>& units);
inline uint64_t Fnv1a64(const std::string& s) { return Fnv1a64(s.data(), s.size()); }

// Finalize's check: the ranks' registration hashes agree, or the first differing line against rank 0's is
// named ("rank 0 has `unit h.1 param w shape [4,4]` where rank 2 has `... [4,5]`"). Collective.
Status CheckRegistrationAgrees(HostCollectives& host, int world, const std::vector<UnitLayout>& layouts);

}  // namespace zero::internal
