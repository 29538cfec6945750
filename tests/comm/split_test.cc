// Communicator::Split on Gloo: ranks that pass the same color get a communicator of their own, numbered by
// (key, rank); it works while the parent keeps working, fails like any communicator, and counts its own bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/communicator.h"

namespace zero {
namespace {

// Communicator::bytes_sent_to_ranks follows Gloo's algorithms message by message, at world 4 (check mode: each op
// is preceded by a ring all-gather of its 32-byte fingerprint, 3 · 32 bytes to the next rank): the ring all-gather
// sends 3 blocks to rank + 1; the halving-doubling reduce-scatter (in f32 whatever the dtype) sends half of the
// buffer to rank ^ 1, a quarter to rank ^ 2, and ranks 1 and 2 their reduced block to each other; the binomial
// broadcast from rank 0 goes 0 -> 1, 0 -> 2, 1 -> 3.
TEST(SplitTest, BytesSentToRanksFollowGlooAlgorithms) {
  testing::RunRanks(4, [](Communicator& comm, int rank) {
    std::vector<float> f(40, 1.0f);
    std::vector<float> out(40);
    ASSERT_OK(comm.AllGather(f.data(), out.data(), 10, DType::kF32).Wait());
    std::vector<uint16_t> h(32, 0x3f80), hr(8);  // bf16 ones
    ASSERT_OK(comm.ReduceScatter(h.data(), hr.data(), 8, DType::kBF16, ReduceOp::kSum).Wait());
    ASSERT_OK(comm.Broadcast(f.data(), 5, DType::kF32, 0).Wait());
    std::vector<int64_t> want(4, 0);
    want[(rank + 1) % 4] += 3 * 3 * 32 + 3 * 10 * 4;
    want[rank ^ 1] += 16 * 4;
    want[rank ^ 2] += 8 * 4;
    if (rank == 1 || rank == 2) want[3 - rank] += 8 * 4;
    if (rank == 0) want[1] += 20, want[2] += 20;
    if (rank == 1) want[3] += 20;
    EXPECT_EQ(comm.bytes_sent_to_ranks(), want);
  });
}

// Five ranks, colors rank % 2, keys 10 - rank: color 0 holds ranks 4, 2, 0 in that order (keys 6, 8, 10), color
// 1 holds ranks 3, 1.
TEST(SplitTest, ColorsMakeGroupsNumberedByKey) {
  testing::RunRanks(5, [](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> child, comm.Split(rank % 2, 10 - rank));
    const std::vector<int> members = rank % 2 == 0 ? std::vector<int>{4, 2, 0} : std::vector<int>{3, 1};
    ASSERT_EQ(child->world_size(), static_cast<int>(members.size()));
    EXPECT_EQ(members[child->rank()], rank);
    // The child's all-gather returns its members' parent ranks in its own order.
    const float mine = static_cast<float>(rank);
    std::vector<float> all(members.size());
    ASSERT_OK(child->AllGather(&mine, all.data(), 1, DType::kF32).Wait());
    for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(all[i], static_cast<float>(members[i]));
    // Bus bytes: the child's all-gather of one float over its members; the parent's count did not move.
    EXPECT_EQ(child->bus_bytes(), static_cast<int64_t>((members.size() - 1) * sizeof(float)));
    const int64_t parent_before = comm.bus_bytes();
    // The parent still works beside its child, and a second split (another generation of keys) too.
    float sum = 1.0f;
    ASSERT_OK(comm.AllReduce(&sum, 1, DType::kF32, ReduceOp::kSum).Wait());
    EXPECT_EQ(sum, 5.0f);
    EXPECT_GT(comm.bus_bytes(), parent_before);
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> all_in_one, comm.Split(7, rank));
    EXPECT_EQ(all_in_one->world_size(), 5);
    EXPECT_EQ(all_in_one->rank(), rank);
    float one = 1.0f;
    ASSERT_OK(all_in_one->AllReduce(&one, 1, DType::kF32, ReduceOp::kSum).Wait());
    EXPECT_EQ(one, 5.0f);
  });
}

TEST(SplitTest, RefusesNegativeColorsAndKeys) {
  testing::RunRanks(2, [](Communicator& comm, int) {
    EXPECT_EQ(comm.Split(-1, 0).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.Split(0, -3).status().code(), absl::StatusCode::kInvalidArgument);
  });
}

// A child fails like any communicator: a peer that never issues the op is a timeout error, not a hang.
TEST(SplitTest, ChildKeepsTheParentsTimeout) {
  testing::RunRanksOptions o;
  o.comm.timeout = absl::Seconds(2);
  testing::RunRanks(
      2,
      [](Communicator& comm, int rank) {
        ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> child, comm.Split(0, rank));
        if (rank == 1) return;  // never joins the all-reduce
        float x = 1.0f;
        const Status s = child->AllReduce(&x, 1, DType::kF32, ReduceOp::kSum).Wait();
        EXPECT_FALSE(s.ok());
      },
      o);
}

}  // namespace
}  // namespace zero
