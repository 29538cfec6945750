// Gloo collectives on N thread-ranks against closed-form expected values, for world sizes 1-8 (powers of two
// and not: ReduceScatterHalvingDoubling has a separate code path for non-power-of-two worlds), element counts
// {0, 1, 7, 1000} everywhere and (1 << 20) + 3 on worlds 3 and 4 (for reductions: one op per dtype, to keep the
// test fast on two cores), dtypes f32/f16/bf16, and every reduce op.
//
// Inputs are small integers so every sum, average and maximum is exact in all three dtypes; the expected
// values are formulas of (rank, index), not a second implementation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/gloo_testing.h"
#include "support/forwarding_comm.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/advanced/communicator_ext.h"
#include "zero/communicator.h"

namespace zero {
namespace {

using testing::RunRanks;

constexpr size_t kBig = (size_t{1} << 20) + 3;

// Element i of rank r for sum/avg: (r + 1) * g(i). g stays small enough that the sum over 8 ranks (36 g) is
// exact in bf16's 8 significant bits for 16-bit types (g <= 7), and varies over a longer period for f32.
float G(size_t i, DType t) { return static_cast<float>(i % (t == DType::kF32 ? 1021 : 7) + 1); }
float SumInput(int r, size_t i, DType t) { return static_cast<float>(r + 1) * G(i, t); }
float SumExpected(int world, size_t i, DType t) { return G(i, t) * static_cast<float>(world * (world + 1) / 2); }
float AvgExpected(int world, size_t i, DType t) { return G(i, t) * static_cast<float>(world + 1) / 2.0f; }
// For max the largest value moves between ranks with the index.
float MaxInput(int r, size_t i, int world) { return static_cast<float>((r + i) % world + i % 3); }
float MaxExpected(int world, size_t i) { return static_cast<float>(world - 1 + i % 3); }

float Input(ReduceOp op, int r, size_t i, int world, DType t) {
  return op == ReduceOp::kMax ? MaxInput(r, i, world) : SumInput(r, i, t);
}
float Expected(ReduceOp op, size_t i, int world, DType t) {
  switch (op) {
    case ReduceOp::kSum: return SumExpected(world, i, t);
    case ReduceOp::kAvg: return AvgExpected(world, i, t);
    case ReduceOp::kMax: return MaxExpected(world, i);
  }
  return 0;
}

// A typed buffer filled through f32.
std::vector<uint8_t> Make(size_t n, DType t) { return std::vector<uint8_t>(n * DTypeSize(t), 0xAB); }

// Raw bit pattern of element j of rank r for copy-only ops (any bits, NaNs included, must survive).
uint32_t Pattern(int r, size_t j) {
  return static_cast<uint32_t>((r + 1) * 2654435761u) ^ static_cast<uint32_t>(j * 40503u);
}
void FillPattern(std::vector<uint8_t>& buf, size_t n, DType t, int r) {
  for (size_t j = 0; j < n; ++j) {
    const uint32_t p = Pattern(r, j);
    std::memcpy(buf.data() + j * DTypeSize(t), &p, DTypeSize(t));
  }
}
bool SamePattern(const uint8_t* got, size_t n, DType t, int r) {
  for (size_t j = 0; j < n; ++j) {
    const uint32_t p = Pattern(r, j);
    if (std::memcmp(got + j * DTypeSize(t), &p, DTypeSize(t)) != 0) return false;
  }
  return true;
}

// Returns "" or the first mismatch, so a failure prints one line instead of a million.
std::string CheckReduced(const std::vector<uint8_t>& got, DType t, size_t n, ReduceOp op, int world,
                         size_t index_offset) {
  for (size_t j = 0; j < n; ++j) {
    const float want = Expected(op, index_offset + j, world, t);
    const float have = LoadAsF32(got.data(), t, j);
    if (have != want) return absl::StrCat("element ", j, ": got ", have, ", want ", want);
  }
  return "";
}

std::vector<size_t> CountsFor(int world) {
  std::vector<size_t> counts = {0, 1, 7, 1000};
  if (world == 3 || world == 4) counts.push_back(kBig);
  return counts;
}

// The big count runs one reduce op per dtype: sum for f32, avg for f16, max for bf16.
bool RunReduction(size_t n, DType t, ReduceOp op) {
  if (n != kBig) return true;
  return (t == DType::kF32 && op == ReduceOp::kSum) || (t == DType::kF16 && op == ReduceOp::kAvg) ||
         (t == DType::kBF16 && op == ReduceOp::kMax);
}

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

class CollectivesTest : public ::testing::TestWithParam<int> {};

// The matrix runs without the per-op fingerprint exchange (it triples small-op latency on two cores); check
// mode has its own tests, and ZERO_COMM_CHECK=1 turns it back on here.
testing::RunRanksOptions MatrixOptions() {
  testing::RunRanksOptions o;
  o.comm.check_order = false;
  return o;
}

TEST_P(CollectivesTest, AllGather) {
  const int world = GetParam();
  RunRanks(
      world,
      [world](Communicator& comm, int rank) {
        for (size_t n : CountsFor(world)) {
          for (DType t : kDTypes) {
            SCOPED_TRACE(absl::StrCat("count ", n, " dtype ", std::string(DTypeName(t))));
            auto send = Make(n, t);
            FillPattern(send, n, t, rank);
            auto recv = Make(n * world, t);
            ASSERT_OK(comm.AllGather(send.data(), recv.data(), n, t).Wait());
            for (int r = 0; r < world; ++r) {
              ASSERT_TRUE(SamePattern(recv.data() + r * n * DTypeSize(t), n, t, r)) << "block of rank " << r;
            }
            // In place: this rank's block already sits in the output.
            auto inplace = Make(n * world, t);
            // (std::copy, not memcpy: at count 0 both vectors are empty and their data() may be null.)
            std::copy(send.begin(), send.end(), inplace.begin() + rank * n * DTypeSize(t));
            ASSERT_OK(comm.AllGather(inplace.data() + rank * n * DTypeSize(t), inplace.data(), n, t).Wait());
            ASSERT_EQ(inplace, recv);
          }
        }
      },
      MatrixOptions());
}

// The strided all-gather (Gloo's ring with the blocks' offsets moved): block r at recv + r*stride, the same bits
// as AllGather's block r, in place or not, every byte between the blocks untouched; strides of the count (the
// contiguous layout), one more (every block but rank 0's unaligned) and 2*count + 3.
TEST_P(CollectivesTest, AllGatherStrided) {
  const int world = GetParam();
  RunRanks(
      world,
      [world](Communicator& comm, int rank) {
        ASSERT_TRUE(advanced::Extended(comm)->SupportsAllGatherStrided());
        for (size_t n : CountsFor(world)) {
          for (DType t : kDTypes) {
            const size_t es = DTypeSize(t);
            auto send = Make(n, t);
            FillPattern(send, n, t, rank);
            auto contiguous = Make(n * world, t);
            ASSERT_OK(comm.AllGather(send.data(), contiguous.data(), n, t).Wait());
            for (size_t stride : {n, n + 1, 2 * n + 3}) {
              SCOPED_TRACE(absl::StrCat("count ", n, " stride ", stride, " dtype ", std::string(DTypeName(t))));
              const size_t extent = (world - 1) * stride + n;
              auto recv = Make(extent, t);
              ASSERT_OK(advanced::Extended(comm)->AllGatherStrided(send.data(), recv.data(), n, stride, t).Wait());
              auto inplace = Make(extent, t);
              std::copy(send.begin(), send.end(), inplace.begin() + rank * stride * es);
              ASSERT_OK(advanced::Extended(comm)
                            ->AllGatherStrided(inplace.data() + rank * stride * es, inplace.data(), n, stride, t)
                            .Wait());
              ASSERT_EQ(inplace, recv);
              for (int r = 0; r < world; ++r) {
                ASSERT_TRUE(std::equal(recv.begin() + r * stride * es, recv.begin() + (r * stride + n) * es,
                                       contiguous.begin() + r * n * es))
                    << "block of rank " << r;
                const size_t gap_end = r + 1 < world ? (r + 1) * stride : r * stride + n;
                for (size_t b = (r * stride + n) * es; b < gap_end * es; ++b) {
                  ASSERT_EQ(recv[b], 0xAB) << "byte " << b << " after the block of rank " << r;
                }
              }
            }
          }
        }
      },
      MatrixOptions());
}

// All-to-all (gloo::alltoall): block r of every rank's input arrives as block `rank` of rank r's output, the same
// bits (NaN patterns included), at every world and count of the matrix; overlapping buffers are refused; the bytes
// counted per peer are one block to each other rank.
TEST_P(CollectivesTest, AllToAll) {
  const int world = GetParam();
  RunRanks(
      world,
      [world](Communicator& comm, int rank) {
        advanced::ExtendedCommunicator* x = advanced::Extended(comm);
        ASSERT_TRUE(x->SupportsAllToAll());
        for (size_t n : CountsFor(world)) {
          for (DType t : kDTypes) {
            SCOPED_TRACE(absl::StrCat("count ", n, " dtype ", std::string(DTypeName(t))));
            const size_t es = DTypeSize(t);
            // Block p of rank r's input: the pattern of "rank" r * world + p.
            auto send = Make(n * world, t);
            for (int p = 0; p < world; ++p) {
              auto block = Make(n, t);
              FillPattern(block, n, t, rank * world + p);
              std::copy(block.begin(), block.end(), send.begin() + p * n * es);
            }
            auto recv = Make(n * world, t);
            const std::vector<int64_t> before = comm.bytes_sent_to_ranks();
            ASSERT_OK(x->AllToAll(send.data(), recv.data(), n, t).Wait());
            for (int r = 0; r < world; ++r) {
              auto want = Make(n, t);
              FillPattern(want, n, t, r * world + rank);
              ASSERT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + r * n * es)) << "block from rank " << r;
            }
            std::vector<int64_t> after = comm.bytes_sent_to_ranks();
            after.resize(static_cast<size_t>(world), 0);
            for (int r = 0; r < world; ++r) {
              const int64_t was = r < static_cast<int>(before.size()) ? before[r] : 0;
              EXPECT_EQ(after[r] - was, r == rank ? 0 : static_cast<int64_t>(n * es)) << "bytes to rank " << r;
            }
          }
        }
        if (world > 1) {
          std::vector<float> buf(8 * world);
          const Status s = x->AllToAll(buf.data(), buf.data() + 1, 8, DType::kF32).Wait();
          EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
          EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("overlap"));
        }
      },
      MatrixOptions());
}

TEST(Collectives, AllGatherStridedErrors) {
  RunRanks(2, [](Communicator& comm, int rank) {
    std::vector<float> send(8), recv(32);
    const Status s = advanced::Extended(comm)->AllGatherStrided(send.data(), recv.data(), 8, 7, DType::kF32).Wait();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("stride 7 is less than the count 8"));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(absl::StrCat("rank ", rank, " of 2")));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("AllGatherStrided#"));
  });
}

// A communicator without the capability: the base class's op fails with kUnimplemented, naming rank and op.
TEST(Collectives, AllGatherStridedUnsupportedIsUnimplemented) {
  RunRanks(2, [](Communicator& comm, int rank) {
    struct NoStrided final : testing::ForwardingComm {
      using ForwardingComm::ForwardingComm;
      bool SupportsAllGatherStrided() const override { return false; }
      Work AllGatherStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype,
                            CUstream_st* s) override {
        return ExtendedCommunicator::AllGatherStrided(send, recv, count, stride, dtype, s);
      }
    } plain(comm);
    std::vector<float> send(8), recv(32);
    const Status s = static_cast<advanced::ExtendedCommunicator&>(plain)
                         .AllGatherStrided(send.data(), recv.data(), 8, 16, DType::kF32)
                         .Wait();
    EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(absl::StrCat("rank ", rank, " of 2")));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("AllGatherStrided"));
  });
}

// The strided reduce-scatter (change 5 of RetargetableReduceScatter): rank r's block read at send + r*stride.
// Inputs are not small integers here, so a different summation order would show: the result must be
// ReduceScatter's on the packed blocks bit for bit, the input unchanged, in place (recv = send + rank*stride) or
// not. Power-of-two worlds (the only ones that have it), counts at and above the 1024-element minimum, odd ones.
TEST(Collectives, ReduceScatterStridedEqualsThePackedReduceScatterBitForBit) {
  for (int world : {2, 4, 8}) {
    RunRanks(
        world,
        [world](Communicator& comm, int rank) {
          for (size_t n : {size_t{1024}, size_t{1031}, size_t{4099}}) {
            ASSERT_TRUE(advanced::Extended(comm)->SupportsReduceScatterStrided(n, DType::kF32));
            for (size_t stride : {n, n + 1, 2 * n + 3}) {
              for (ReduceOp op : kOps) {
                SCOPED_TRACE(
                    absl::StrCat("world ", world, " count ", n, " stride ", stride, " op ", static_cast<int>(op)));
                const size_t extent = (world - 1) * stride + n;
                std::vector<float> strided(extent, -7.0f), packed(n * world);
                for (int r = 0; r < world; ++r) {
                  for (size_t j = 0; j < n; ++j) {
                    const float v = std::sin(0.37f * static_cast<float>(rank * 7919 + r * 131 + j)) * 1e3f / 3.0f;
                    strided[r * stride + j] = packed[r * n + j] = v;
                  }
                }
                const std::vector<float> input = strided;
                std::vector<float> want(n), got(n);
                ASSERT_OK(comm.ReduceScatter(packed.data(), want.data(), n, DType::kF32, op).Wait());
                ASSERT_OK(advanced::Extended(comm)
                              ->ReduceScatterStrided(strided.data(), got.data(), n, stride, DType::kF32, op)
                              .Wait());
                ASSERT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0);
                ASSERT_EQ(strided, input) << "the input was modified";
                // In place: the result overwrites this rank's block of the input.
                ASSERT_OK(advanced::Extended(comm)
                              ->ReduceScatterStrided(strided.data(), strided.data() + rank * stride, n, stride,
                                                     DType::kF32, op)
                              .Wait());
                ASSERT_EQ(std::memcmp(strided.data() + rank * stride, want.data(), n * 4), 0);
              }
            }
          }
        },
        MatrixOptions());
  }
}

TEST(Collectives, ReduceScatterStridedWhereItIsNot) {
  RunRanks(3, [](Communicator& comm, int rank) {
    EXPECT_FALSE(advanced::Extended(comm)->SupportsReduceScatterStrided(4096, DType::kF32));  // not a power of two
    std::vector<float> send(3 * 4096), recv(4096);
    const Status s = advanced::Extended(comm)
                         ->ReduceScatterStrided(send.data(), recv.data(), 4096, 4096, DType::kF32, ReduceOp::kSum)
                         .Wait();
    EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(absl::StrCat("rank ", rank, " of 3")));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("ReduceScatterStrided#"));
  });
  RunRanks(2, [](Communicator& comm, int) {
    EXPECT_TRUE(advanced::Extended(comm)->SupportsReduceScatterStrided(1024, DType::kF32));
    EXPECT_FALSE(
        advanced::Extended(comm)->SupportsReduceScatterStrided(1023, DType::kF32));  // below the input-reading minimum
    EXPECT_FALSE(
        advanced::Extended(comm)->SupportsReduceScatterStrided(4096, DType::kBF16));  // 16-bit inputs are staged in f32
    std::vector<float> send(2 * 4096), recv(4096);
    const Status s = advanced::Extended(comm)
                         ->ReduceScatterStrided(send.data(), recv.data(), 4096, 4095, DType::kF32, ReduceOp::kSum)
                         .Wait();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("stride 4095 is less than the count 4096"));
  });
}

TEST_P(CollectivesTest, ReduceScatter) {
  const int world = GetParam();
  RunRanks(
      world,
      [world](Communicator& comm, int rank) {
        for (size_t n : CountsFor(world)) {
          for (DType t : kDTypes) {
            for (ReduceOp op : kOps) {
              if (!RunReduction(n, t, op)) continue;
              SCOPED_TRACE(
                  absl::StrCat("count ", n, " dtype ", std::string(DTypeName(t)), " op ", static_cast<int>(op)));
              auto send = Make(n * world, t);
              for (size_t i = 0; i < n * world; ++i) StoreFromF32(send.data(), t, i, Input(op, rank, i, world, t));
              const auto send_before = send;
              auto recv = Make(n, t);
              Status s = comm.ReduceScatter(send.data(), recv.data(), n, t, op).Wait();
              ASSERT_OK(s);
              ASSERT_EQ(CheckReduced(recv, t, n, op, world, rank * n), "");
              ASSERT_EQ(send, send_before) << "ReduceScatter must not modify its input";
            }
          }
        }
      },
      MatrixOptions());
}

// The destructive variant reduces in place in the caller's buffer (f32) and keeps Gloo's algorithm built over
// it. Ranks deliberately use different buffer-reuse patterns (rank r switches buffers every r+1 calls), so
// some ranks rebuild the algorithm while others reuse theirs; the slots must still match.
TEST_P(CollectivesTest, ReduceScatterDestructive) {
  const int world = GetParam();
  RunRanks(
      world,
      [world](Communicator& comm, int rank) {
        for (size_t n : {size_t{1}, size_t{7}, size_t{1000}}) {
          for (DType t : kDTypes) {
            std::vector<std::vector<uint8_t>> bufs = {Make(n * world, t), Make(n * world, t)};
            for (int call = 0; call < 6; ++call) {
              const ReduceOp op = kOps[call % 3];
              SCOPED_TRACE(absl::StrCat("count ", n, " dtype ", std::string(DTypeName(t)), " call ", call));
              auto& send = bufs[(call / (rank + 1)) % 2];
              for (size_t i = 0; i < n * world; ++i) StoreFromF32(send.data(), t, i, Input(op, rank, i, world, t));
              // Every other call reduces into the rank's own block of the input (recv aliases send).
              auto recv = Make(n, t);
              uint8_t* out = call % 2 == 0 ? recv.data() : send.data() + rank * n * DTypeSize(t);
              Status s = comm.ReduceScatterDestructive(send.data(), out, n, t, op).Wait();
              ASSERT_OK(s);
              std::vector<uint8_t> got(out, out + n * DTypeSize(t));
              ASSERT_EQ(CheckReduced(got, t, n, op, world, rank * n), "");
            }
          }
        }
      },
      MatrixOptions());
}

TEST_P(CollectivesTest, AllReduce) {
  const int world = GetParam();
  RunRanks(
      world,
      [world](Communicator& comm, int rank) {
        for (size_t n : CountsFor(world)) {
          for (DType t : kDTypes) {
            for (ReduceOp op : kOps) {
              if (!RunReduction(n, t, op)) continue;
              SCOPED_TRACE(
                  absl::StrCat("count ", n, " dtype ", std::string(DTypeName(t)), " op ", static_cast<int>(op)));
              auto buf = Make(n, t);
              for (size_t i = 0; i < n; ++i) StoreFromF32(buf.data(), t, i, Input(op, rank, i, world, t));
              Status s = comm.AllReduce(buf.data(), n, t, op).Wait();
              ASSERT_OK(s);
              ASSERT_EQ(CheckReduced(buf, t, n, op, world, 0), "");
            }
          }
        }
      },
      MatrixOptions());
}

// Gloo's Fence: Waits there already notice failures, so it is a completed Work that issues nothing; host memory
// has no CUDA device.
TEST(GlooFenceTest, CompletedAndIssuesNothing) {
  RunRanks(2, [](Communicator& comm, int) {
    std::vector<float> v(8, 1.0f);
    ASSERT_OK(comm.AllReduce(v.data(), v.size(), DType::kF32, ReduceOp::kSum).Wait());
    Work f = comm.Fence();
    EXPECT_TRUE(f.IsCompleted());
    EXPECT_OK(f.Wait());
    Work next = comm.Barrier();
    EXPECT_EQ(next.sequence(), 1);
    EXPECT_OK(next.Wait());
    EXPECT_EQ(comm.cuda_device(), -1);
  });
}

TEST_P(CollectivesTest, BroadcastAndBarrier) {
  const int world = GetParam();
  RunRanks(
      world,
      [world](Communicator& comm, int rank) {
        for (size_t n : CountsFor(world)) {
          for (DType t : kDTypes) {
            for (int root : {0, world - 1}) {
              SCOPED_TRACE(absl::StrCat("count ", n, " dtype ", std::string(DTypeName(t)), " root ", root));
              auto buf = Make(n, t);
              if (rank == root) FillPattern(buf, n, t, root);
              ASSERT_OK(comm.Broadcast(buf.data(), n, t, root).Wait());
              ASSERT_TRUE(SamePattern(buf.data(), n, t, root));
              ASSERT_OK(comm.Barrier().Wait());
            }
          }
        }
      },
      MatrixOptions());
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectivesTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) { return absl::StrCat("world", info.param); });

// Works complete in issue order with consecutive sequence numbers, and many ops may be in flight at once.
TEST(Collectives, PipelinedOpsCompleteInOrder) {
  RunRanks(3, [](Communicator& comm, int rank) {
    constexpr int kOpsInFlight = 24;
    std::vector<std::vector<float>> bufs(kOpsInFlight, std::vector<float>(513));
    std::vector<Work> works;
    for (int k = 0; k < kOpsInFlight; ++k) {
      for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = static_cast<float>(rank + k + i % 5);
      works.push_back(comm.AllReduce(bufs[k].data(), bufs[k].size(), DType::kF32, ReduceOp::kMax));
    }
    for (int k = 0; k < kOpsInFlight; ++k) {
      EXPECT_EQ(works[k].sequence(), k);
      EXPECT_EQ(works[k].Describe(), absl::StrCat("AllReduce#", k, "(f32, 513 elements, max)"));
      ASSERT_OK(works[k].Wait());
      EXPECT_TRUE(works[k].IsCompleted());
      EXPECT_OK(works[k].status());
      for (size_t i = 0; i < bufs[k].size(); ++i) ASSERT_EQ(bufs[k][i], static_cast<float>(2 + k + i % 5));
    }
  });
}

// Reduce-scatters larger than Gloo's int-sized limit run in column chunks; lower the limit to exercise that
// path (including a last chunk shorter than the others) on powers of two and not.
TEST(Collectives, ChunkedReduceScatter) {
  internal::SetGlooReduceScatterChunkLimitForTesting(100);
  for (int world : {3, 4}) {
    RunRanks(world, [world](Communicator& comm, int rank) {
      for (size_t n : {size_t{7}, size_t{1000}}) {
        for (DType t : {DType::kF32, DType::kBF16}) {
          for (ReduceOp op : kOps) {
            auto send = Make(n * world, t);
            for (size_t i = 0; i < n * world; ++i) StoreFromF32(send.data(), t, i, Input(op, rank, i, world, t));
            auto recv = Make(n, t);
            ASSERT_OK(comm.ReduceScatter(send.data(), recv.data(), n, t, op).Wait());
            ASSERT_EQ(CheckReduced(recv, t, n, op, world, rank * n), "") << "n " << n;
          }
        }
      }
    });
  }
  internal::SetGlooReduceScatterChunkLimitForTesting(0);
}

// Cached destructive instances are rebuilt every N uses (consistently on all ranks) while ranks retarget them
// on different schedules.
TEST(Collectives, DestructiveReduceScatterSurvivesRebuilds) {
  internal::SetGlooReduceScatterRebuildEveryForTesting(3);
  for (int world : {3, 4}) {
    RunRanks(world, [world](Communicator& comm, int rank) {
      const size_t n = 333;
      std::vector<std::vector<uint8_t>> bufs = {Make(n * world, DType::kF32), Make(n * world, DType::kF32)};
      for (int call = 0; call < 10; ++call) {
        auto& send = bufs[(call / (rank + 1)) % 2];
        for (size_t i = 0; i < n * world; ++i) {
          StoreFromF32(send.data(), DType::kF32, i, Input(ReduceOp::kSum, rank, i, world, DType::kF32));
        }
        auto recv = Make(n, DType::kF32);
        Status s = comm.ReduceScatterDestructive(send.data(), recv.data(), n, DType::kF32, ReduceOp::kSum).Wait();
        ASSERT_OK(s);
        ASSERT_EQ(CheckReduced(recv, DType::kF32, n, ReduceOp::kSum, world, rank * n), "") << "call " << call;
      }
    });
  }
  internal::SetGlooReduceScatterRebuildEveryForTesting(0);
}

// The const-input f32 reduce-scatter on power-of-two worlds reads the caller's input at its first step instead
// of a staged copy (>= 1024 elements per rank). Input untouched, exact sums/averages/maxima, output aliasing
// the input (the engine's stage 1 reduces a gradient into its own slice), ranks switching input buffers on
// different schedules, and the cached instance rebuilt every 3 uses.
TEST(Collectives, ConstInputReduceScatterReadsTheInputInPlace) {
  internal::SetGlooReduceScatterRebuildEveryForTesting(3);
  for (int world : {2, 4, 8}) {
    RunRanks(world, [world](Communicator& comm, int rank) {
      for (size_t n : {size_t{1024}, size_t{4099}}) {
        std::vector<std::vector<uint8_t>> bufs = {Make(n * world, DType::kF32), Make(n * world, DType::kF32)};
        for (int call = 0; call < 7; ++call) {
          const ReduceOp op = kOps[call % 3];
          SCOPED_TRACE(absl::StrCat("world ", world, " count ", n, " call ", call));
          auto& send = bufs[(call / (rank + 1)) % 2];
          for (size_t i = 0; i < n * world; ++i) {
            StoreFromF32(send.data(), DType::kF32, i, Input(op, rank, i, world, DType::kF32));
          }
          const auto before = send;
          if (call == 6) {  // the output is this rank's block of the input itself
            uint8_t* out = send.data() + rank * n * 4;
            ASSERT_OK(comm.ReduceScatter(send.data(), out, n, DType::kF32, op).Wait());
            std::vector<uint8_t> got(out, out + n * 4);
            ASSERT_EQ(CheckReduced(got, DType::kF32, n, op, world, rank * n), "");
            continue;
          }
          auto recv = Make(n, DType::kF32);
          Status s = comm.ReduceScatter(send.data(), recv.data(), n, DType::kF32, op).Wait();
          ASSERT_OK(s);
          ASSERT_EQ(CheckReduced(recv, DType::kF32, n, op, world, rank * n), "");
          ASSERT_EQ(send, before) << "ReduceScatter must not modify its input";
        }
      }
    });
  }
  internal::SetGlooReduceScatterRebuildEveryForTesting(0);
}

// On worlds that are not powers of two, ranks of a smaller binary block send their data to ranks of the next
// larger block, and Gloo's protocol has no acknowledgement for those transfers. Here one receiving rank sleeps
// 50 ms before it takes each such transfer (a test hook), each rank queues four ops that run back to back,
// and every call's inputs differ from the previous call's at every element. Ranks that finish first return
// from their body, and their communicator is destroyed. Before zero's reduce-scatter acknowledged those
// transfers and its destructor met the other ranks', the delayed rank's last op failed ("a peer was lost";
// at world 3 the acknowledgement alone fixed it, at worlds 5-7 with rank 2 delayed only the meeting did).
TEST(Collectives, NonPowerOfTwoReduceScatterWithADelayedReceiver) {
  for (int world : {3, 5, 6, 7}) {
    for (int slow : {0, 1, 2}) {
      internal::SetGlooReduceScatterFoldDelayForTesting(slow, 50000);
      RunRanks(
          world,
          [world, slow](Communicator& comm, int rank) {
            const size_t n = 1000;
            constexpr int kQueued = 4;
            std::vector<std::vector<float>> send(kQueued, std::vector<float>(n * world));
            std::vector<std::vector<float>> recv(kQueued, std::vector<float>(n));
            std::vector<Work> works;
            for (int call = 0; call < kQueued; ++call) {
              // Shifting the index by the call changes every element from one call to the next.
              for (size_t i = 0; i < n * world; ++i) send[call][i] = SumInput(rank, i + call, DType::kF32);
              // The staged const-input op and the destructive one (Gloo's algorithm on the caller's buffer).
              works.push_back(call % 2 == 0 ? comm.ReduceScatter(send[call].data(), recv[call].data(), n, DType::kF32,
                                                                 ReduceOp::kSum)
                                            : comm.ReduceScatterDestructive(send[call].data(), recv[call].data(), n,
                                                                            DType::kF32, ReduceOp::kSum));
            }
            for (int call = 0; call < kQueued; ++call) {
              Status s = works[call].Wait();
              ASSERT_OK(s) << "world " << world << ", slow rank " << slow;
              for (size_t i = 0; i < n; ++i) {
                ASSERT_EQ(recv[call][i], SumExpected(world, rank * n + i + call, DType::kF32))
                    << "world " << world << ", slow rank " << slow << ", call " << call << ", element " << i;
              }
            }
          },
          MatrixOptions());  // no check mode: its exchange before each op would keep the sender from running ahead
    }
  }
  internal::SetGlooReduceScatterFoldDelayForTesting(-1, 0);
}

// The communicator reports what its cached reduce-scatter holds: at world 4 Gloo's instance keeps two receive
// buffers of the whole input (recvBuf_ = chunk << steps, recvBufDist_ = count) and nothing else: the
// destructive variant works in the caller's buffer, the const-input one in Gloo's step-0 receive region.
// Staging a 16-bit input adds a working buffer of the input's size (in f32).
TEST(Collectives, MemoryReportCountsGlooReceiveBuffers) {
  RunRanks(4, [](Communicator& comm, int rank) {
    const size_t n = 4096, total = 4 * n;
    auto staging = [&] { return comm.memory_report().Get(MemTier::kHost, MemTag::kStaging).current; };
    const int64_t before = staging();
    std::vector<float> send(total, 1.0f), recv(n);
    ASSERT_OK(comm.ReduceScatterDestructive(send.data(), recv.data(), n, DType::kF32, ReduceOp::kSum).Wait());
    EXPECT_EQ(staging() - before, static_cast<int64_t>(2 * total * 4));
    ASSERT_OK(comm.ReduceScatter(send.data(), recv.data(), n, DType::kF32, ReduceOp::kSum).Wait());
    EXPECT_EQ(staging() - before, static_cast<int64_t>((2 + 2) * total * 4));  // a second cached instance
    std::vector<uint16_t> send16(total, F32ToBF16(1.0f)), recv16(n);
    ASSERT_OK(comm.ReduceScatter(send16.data(), recv16.data(), n, DType::kBF16, ReduceOp::kSum).Wait());
    EXPECT_EQ(staging() - before, static_cast<int64_t>((2 + 2 + 3) * total * 4));  // a third, staged
  });
}

// ReduceScatterStagingBytes and AllReduceStagingBytes (the engine's bound on its true peak rests on them) are
// exactly what an op holds while it runs: with a budget of 0 nothing stays cached, so each op builds its
// instance (or scratch), and its staging peak is that alone; afterwards nothing is left. Worlds 2-5, f32 and
// bf16, both reduce-scatter variants, counts that run from the input, stage it, and are below one block each.
TEST(Collectives, StagingBytesAreWhatAnOpHolds) {
  testing::RunRanksOptions o = MatrixOptions();
  o.comm.cache_bytes = 0;
  for (int world : {2, 3, 4, 5}) {
    RunRanks(
        world,
        [world](Communicator& comm, int rank) {
          MemoryTracker& tracker = *comm.memory_tracker();
          auto staging = [&] { return comm.memory_report().Get(MemTier::kHost, MemTag::kStaging); };
          for (size_t n : {size_t{7}, size_t{1024}, size_t{4099}}) {
            for (DType t : {DType::kF32, DType::kBF16}) {
              for (bool destructive : {false, true}) {
                SCOPED_TRACE(absl::StrCat("world ", world, " count ", n, " ", std::string(DTypeName(t)),
                                          destructive ? " destructive" : ""));
                auto send = Make(n * world, t);
                for (size_t i = 0; i < n * world; ++i) StoreFromF32(send.data(), t, i, SumInput(rank, i, t));
                auto recv = Make(n, t);
                tracker.ResetPeaks();
                Work w = destructive ? comm.ReduceScatterDestructive(send.data(), recv.data(), n, t, ReduceOp::kSum)
                                     : comm.ReduceScatter(send.data(), recv.data(), n, t, ReduceOp::kSum);
                ASSERT_OK(w.Wait());
                ASSERT_EQ(CheckReduced(recv, t, n, ReduceOp::kSum, world, rank * n), "");
                EXPECT_EQ(staging().peak, advanced::Extended(comm)->ReduceScatterStagingBytes(n, t, destructive));
                EXPECT_GT(staging().peak, 0);
                EXPECT_EQ(staging().current, 0);
              }
              auto buf = Make(n, t);
              for (size_t i = 0; i < n; ++i) StoreFromF32(buf.data(), t, i, SumInput(rank, i, t));
              tracker.ResetPeaks();
              ASSERT_OK(comm.AllReduce(buf.data(), n, t, ReduceOp::kSum).Wait());
              ASSERT_EQ(CheckReduced(buf, t, n, ReduceOp::kSum, world, 0), "");
              EXPECT_EQ(staging().peak, advanced::Extended(comm)->AllReduceStagingBytes(n, t));
              EXPECT_EQ(staging().current, 0);
            }
          }
        },
        o);
  }
}

// The cache holds at most CommOptions::cache_bytes between ops: with room for one instance, ops of two sizes
// and both variants alternate (each miss releases the other instance first), a 16-bit all-reduce's scratch
// displaces them too, and an op larger than the budget runs and is released after it. During an op the staging
// is at most the larger of the budget and that op's own; every result is exact.
TEST(Collectives, CacheBudgetBoundsTheStaging) {
  constexpr size_t kSmall = 1024, kLarge = 3000;
  for (int world : {3, 4}) {
    testing::RunRanksOptions o = MatrixOptions();
    o.comm.cache_bytes = static_cast<int64_t>(2 * kSmall * world * sizeof(float)) + 4096;
    RunRanks(
        world,
        [world, budget = o.comm.cache_bytes](Communicator& comm, int rank) {
          EXPECT_EQ(advanced::Extended(comm)->cache_bytes(), budget);
          MemoryTracker& tracker = *comm.memory_tracker();
          auto staging = [&] { return comm.memory_report().Get(MemTier::kHost, MemTag::kStaging); };
          for (int call = 0; call < 8; ++call) {
            const size_t n = call % 4 == 3 ? kLarge : kSmall;
            const bool destructive = call % 2 == 1;
            const DType t = call == 6 ? DType::kBF16 : DType::kF32;
            SCOPED_TRACE(absl::StrCat("world ", world, " call ", call));
            auto send = Make(n * world, t);
            for (size_t i = 0; i < n * world; ++i) StoreFromF32(send.data(), t, i, SumInput(rank, i, t));
            auto recv = Make(n, t);
            tracker.ResetPeaks();
            Work w = destructive ? comm.ReduceScatterDestructive(send.data(), recv.data(), n, t, ReduceOp::kSum)
                                 : comm.ReduceScatter(send.data(), recv.data(), n, t, ReduceOp::kSum);
            ASSERT_OK(w.Wait());
            ASSERT_EQ(CheckReduced(recv, t, n, ReduceOp::kSum, world, rank * n), "");
            const int64_t need = advanced::Extended(comm)->ReduceScatterStagingBytes(n, t, destructive);
            EXPECT_LE(staging().peak, std::max(budget, need));
            EXPECT_LE(staging().current, budget);
            // An op that fits stays cached (the next of its kind needs nothing new); a larger one does not.
            EXPECT_EQ(staging().current >= need, need <= budget) << "need " << need;
            if (call == 4) {
              auto buf = Make(kLarge, DType::kBF16);
              for (size_t i = 0; i < kLarge; ++i)
                StoreFromF32(buf.data(), DType::kBF16, i, SumInput(rank, i, DType::kBF16));
              tracker.ResetPeaks();
              ASSERT_OK(comm.AllReduce(buf.data(), kLarge, DType::kBF16, ReduceOp::kSum).Wait());
              ASSERT_EQ(CheckReduced(buf, DType::kBF16, kLarge, ReduceOp::kSum, world, 0), "");
              EXPECT_LE(staging().peak,
                        std::max(budget, advanced::Extended(comm)->AllReduceStagingBytes(kLarge, DType::kBF16)));
              EXPECT_LE(staging().current, budget);
            }
          }
        },
        o);
  }
}

// The ranks' caches must decide alike, so their budgets must agree: a rank that differs fails every rank's
// CreateGloo with an error that names the option and both values.
TEST(Collectives, CacheBudgetsMustAgree) {
  auto store = Store::Hash();
  testing::RunThreads(3, [&](int rank) {
    CommOptions o = testing::TestCommOptions();
    o.cache_bytes = rank == 1 ? 4096 : 8192;
    auto c = Communicator::CreateGloo(store, rank, 3, o);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr("CommOptions::cache_bytes"));
    EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr(rank == 1 ? "8192" : "4096"));
  });
}

// 16-bit reductions accumulate in f32 and round once (bf16's ulp at 1.0 is 2^-7).
TEST(Collectives, SixteenBitSumsAccumulateInF32) {
  RunRanks(8, [](Communicator& comm, int rank) {
    // Rank 0 holds 1.0, the others 2^-10 each: the exact sum 1 + 7 * 2^-10 rounds (bf16, 8 bits) to
    // 1 + 8 * 2^-10 = 1.0078125. Summing in bf16 starting from rank 0's 1.0 would round each step back to 1.0.
    std::vector<uint16_t> buf(4, F32ToBF16(rank == 0 ? 1.0f : 0.0009765625f));
    ASSERT_OK(comm.AllReduce(buf.data(), buf.size(), DType::kBF16, ReduceOp::kSum).Wait());
    for (uint16_t v : buf) EXPECT_EQ(BF16ToF32(v), 1.0078125f);
  });
}

}  // namespace
}  // namespace zero
