// tests/support/forwarding_comm.h — a Communicator that hands every call to another one, for test wrappers that
// watch or delay some ops (count them, drain a stream first) and must pass everything else through unchanged:
// derive, override what is watched, and call ForwardingComm's version to forward. Every virtual of
// zero/communicator.h and zero/advanced/communicator_ext.h is forwarded here, so a wrapper never silently falls
// back to a base-class default (an inner communicator that is not an ExtendedCommunicator gets the defaults).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/advanced/communicator_ext.h"
#include "zero/communicator.h"

namespace zero::testing {

class ForwardingComm : public advanced::ExtendedCommunicator {
 public:
  explicit ForwardingComm(Communicator& inner) : inner_(inner), ext_(advanced::Extended(inner)) {}

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  Backend backend() const override { return inner_.backend(); }
  MemoryReport memory_report() const override { return inner_.memory_report(); }
  MemoryTracker* memory_tracker() override { return inner_.memory_tracker(); }
  int64_t cache_bytes() const override { return ext_ ? ext_->cache_bytes() : 0; }
  int64_t ReduceScatterStagingBytes(size_t count, DType dtype, bool destructive) const override {
    return ext_ ? ext_->ReduceScatterStagingBytes(count, dtype, destructive) : 0;
  }
  int64_t AllReduceStagingBytes(size_t count, DType dtype) const override {
    return ext_ ? ext_->AllReduceStagingBytes(count, dtype) : 0;
  }
  Work AllGather(const void* send, void* recv, size_t count, DType dtype, CUstream_st* s) override {
    return inner_.AllGather(send, recv, count, dtype, s);
  }
  bool SupportsAllGatherStrided() const override { return ext_ && ext_->SupportsAllGatherStrided(); }
  Work AllGatherStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype,
                        CUstream_st* s) override {
    if (ext_ == nullptr) return ExtendedCommunicator::AllGatherStrided(send, recv, count, stride, dtype, s);
    return ext_->AllGatherStrided(send, recv, count, stride, dtype, s);
  }
  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, CUstream_st* s) override {
    return inner_.ReduceScatter(send, recv, count, dtype, op, s);
  }
  Work ReduceScatterDestructive(void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                CUstream_st* s) override {
    return inner_.ReduceScatterDestructive(send, recv, count, dtype, op, s);
  }
  bool SupportsReduceScatterStrided(size_t count, DType dtype) const override {
    return ext_ && ext_->SupportsReduceScatterStrided(count, dtype);
  }
  Work ReduceScatterStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype, ReduceOp op,
                            CUstream_st* s) override {
    if (ext_ == nullptr) return ExtendedCommunicator::ReduceScatterStrided(send, recv, count, stride, dtype, op, s);
    return ext_->ReduceScatterStrided(send, recv, count, stride, dtype, op, s);
  }
  bool SupportsAllToAll() const override { return ext_ && ext_->SupportsAllToAll(); }
  Work AllToAll(const void* send, void* recv, size_t count, DType dtype, CUstream_st* s) override {
    if (ext_ == nullptr) return ExtendedCommunicator::AllToAll(send, recv, count, dtype, s);
    return ext_->AllToAll(send, recv, count, dtype, s);
  }
  Work AllReduce(void* buf, size_t count, DType dtype, ReduceOp op, CUstream_st* s) override {
    return inner_.AllReduce(buf, count, dtype, op, s);
  }
  Work Broadcast(void* buf, size_t count, DType dtype, int root, CUstream_st* s) override {
    return inner_.Broadcast(buf, count, dtype, root, s);
  }
  Work Barrier() override { return inner_.Barrier(); }
  Work Fence() override { return inner_.Fence(); }
  uint64_t IssuedOpsHash() const override { return ext_ ? ext_->IssuedOpsHash() : 0; }
  std::vector<std::string> RecentOps() const override { return inner_.RecentOps(); }
  int64_t bus_bytes() const override { return inner_.bus_bytes(); }
  std::vector<int64_t> bytes_sent_to_ranks() const override { return inner_.bytes_sent_to_ranks(); }
  StatusOr<std::shared_ptr<Communicator>> Split(int color, int key) override { return inner_.Split(color, key); }
  int cuda_device() const override { return inner_.cuda_device(); }

 protected:
  Communicator& inner_;
  advanced::ExtendedCommunicator* ext_;  // inner_ as one, or nullptr
};

}  // namespace zero::testing
