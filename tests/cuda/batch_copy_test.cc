// BatchCopy / Flatten / Unflatten and Convert at odd alignments: exact bytes, poisoned destinations, guard bytes
// around every destination untouched, segment lists longer than one launch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "support/status_matchers.h"
#include "zero/advanced/cuda_kernels.h"

namespace zero {
namespace {

using ::zero::testing::StatusIs;

using testing_cuda::DeviceBuffer;

class CudaCopyTest : public testing_cuda::GpuTest {};

constexpr size_t kGuard = 32;

TEST_F(CudaCopyTest, BatchCopyAnySizesAndAlignments) {
  const uint32_t seed = testing_cuda::FreshSeed();
  std::mt19937 rng(seed);
  for (size_t count : {1u, 5u, 256u, 600u}) {  // 600: three launches
    SCOPED_TRACE(::testing::Message() << "count=" << count << " seed=" << seed);
    std::vector<size_t> sizes(count), src_off(count), dst_off(count);
    size_t src_total = 0, dst_total = 0;
    for (size_t i = 0; i < count; ++i) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      sizes[i] = kind == 0   ? 0
                 : kind == 1 ? std::uniform_int_distribution<size_t>(1, 17)(rng)
                 : kind == 2 ? (size_t{1} << 20) + std::uniform_int_distribution<size_t>(0, 100)(rng)
                             : std::uniform_int_distribution<size_t>(1, 200000)(rng);
      if (count > 256 && kind == 2) sizes[i] = 4096;  // keep the long list small
      src_off[i] = src_total + std::uniform_int_distribution<size_t>(0, 15)(rng);
      src_total = src_off[i] + sizes[i] + 16;
      dst_off[i] = dst_total + kGuard + std::uniform_int_distribution<size_t>(0, 15)(rng);
      dst_total = dst_off[i] + sizes[i] + kGuard;
    }
    std::vector<unsigned char> src(src_total);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    DeviceBuffer dsrc(src_total), ddst(dst_total);
    ZERO_ASSERT_CUDA(dsrc.Upload(src.data(), src_total));
    ZERO_ASSERT_CUDA(ddst.Poison());
    std::vector<cuda::CopySegment> segs(count);
    for (size_t i = 0; i < count; ++i) segs[i] = {dsrc.get() + src_off[i], ddst.get() + dst_off[i], sizes[i]};
    ASSERT_OK(cuda::BatchCopy(segs.data(), count, nullptr));
    std::vector<unsigned char> dst(dst_total);
    ZERO_ASSERT_CUDA(ddst.Download(dst.data(), dst_total));
    std::vector<char> inside(dst_total, 0);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(std::memcmp(dst.data() + dst_off[i], src.data() + src_off[i], sizes[i]), 0) << "segment " << i;
      std::fill(inside.begin() + dst_off[i], inside.begin() + dst_off[i] + sizes[i], 1);
    }
    for (size_t b = 0; b < dst_total; ++b) {
      if (!inside[b]) {
        ASSERT_EQ(dst[b], 0xA5) << "byte " << b << " outside every segment was written";
      }
    }
  }
}

TEST_F(CudaCopyTest, FlattenThenUnflattenRoundTrips) {
  const uint32_t seed = testing_cuda::FreshSeed();
  std::mt19937 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  // A transformer block's tensors (bf16), at 2-byte-aligned offsets in separate allocations.
  const std::vector<size_t> elems = {768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072, 3072 * 768, 1, 3};
  std::vector<std::unique_ptr<DeviceBuffer>> tensors;
  std::vector<cuda::DeviceSpan> parts;
  std::vector<std::vector<unsigned char>> host;
  size_t total = 0;
  for (size_t e : elems) {
    const size_t bytes = e * 2;
    const size_t off = 2 * std::uniform_int_distribution<size_t>(0, 7)(rng);
    tensors.push_back(std::make_unique<DeviceBuffer>(bytes + 16));
    host.emplace_back(bytes);
    for (auto& b : host.back()) b = static_cast<unsigned char>(rng());
    ZERO_ASSERT_CUDA(tensors.back()->Upload(host.back().data(), bytes, off));
    parts.push_back({tensors.back()->get() + off, bytes});
    total += bytes;
  }
  DeviceBuffer flat(total);
  ZERO_ASSERT_CUDA(flat.Poison());
  ASSERT_OK(cuda::Flatten(parts.data(), parts.size(), flat.get(), nullptr));
  std::vector<unsigned char> got(total);
  ZERO_ASSERT_CUDA(flat.Download(got.data(), total));
  size_t off = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    ASSERT_EQ(std::memcmp(got.data() + off, host[i].data(), host[i].size()), 0) << "part " << i;
    off += host[i].size();
  }
  // Scatter back into poisoned tensors.
  for (auto& t : tensors) ZERO_ASSERT_CUDA(t->Poison());
  ASSERT_OK(cuda::Unflatten(flat.get(), parts.data(), parts.size(), nullptr));
  for (size_t i = 0; i < parts.size(); ++i) {
    std::vector<unsigned char> back(host[i].size());
    ZERO_ASSERT_CUDA(cudaMemcpy(back.data(), parts[i].d_ptr, back.size(), cudaMemcpyDeviceToHost));
    ASSERT_EQ(back, host[i]) << "part " << i;
  }
}

TEST_F(CudaCopyTest, RejectsNullAndSelfOverlap) {
  DeviceBuffer b(1024);
  cuda::CopySegment null_seg{nullptr, b.get(), 16};
  EXPECT_THAT(cuda::BatchCopy(&null_seg, 1, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  cuda::CopySegment overlap{b.get(), b.get() + 8, 16};
  EXPECT_THAT(cuda::BatchCopy(&overlap, 1, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  cuda::CopySegment empty{nullptr, nullptr, 0};
  EXPECT_OK(cuda::BatchCopy(&empty, 1, nullptr));
}

// Convert at misaligned offsets (the vector plan's scalar head and tail), against the host ConvertBuffer.
TEST_F(CudaCopyTest, ConvertMisalignedMatchesHost) {
  const uint32_t seed = testing_cuda::FreshSeed();
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  const size_t n = 100003;
  std::vector<float> src(n);
  for (auto& x : src) x = BitsToFloat(bits(rng));
  for (size_t i = 0; i < testing_cuda::EdgeValues().size(); ++i) src[i] = testing_cuda::EdgeValues()[i];
  for (DType st : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (size_t mis : {0u, 1u, 3u}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(st) << "->" << DTypeName(dt) << " mis=" << mis << " seed=" << seed);
        std::vector<unsigned char> s(n * DTypeSize(st)), ref(n * DTypeSize(dt)), got(n * DTypeSize(dt));
        ConvertBuffer(src.data(), DType::kF32, s.data(), st, n);
        ConvertBuffer(s.data(), st, ref.data(), dt, n);
        DeviceBuffer ds((n + 8) * DTypeSize(st)), dd((n + 8) * DTypeSize(dt));
        ZERO_ASSERT_CUDA(ds.Upload(s.data(), s.size(), mis * DTypeSize(st)));
        ZERO_ASSERT_CUDA(dd.Poison());
        ASSERT_OK(cuda::Convert(ds.get() + mis * DTypeSize(st), st, dd.get(), dt, n, nullptr));
        ZERO_ASSERT_CUDA(dd.Download(got.data(), got.size()));
        ASSERT_EQ(got, ref);
      }
    }
  }
}

}  // namespace
}  // namespace zero
