// zero::recompute on its own: Philox known answers, RNG capture/replay, the arena (stack order, reuse,
// coalescing, tiers), and the Checkpointer on a toy model whose segments use dropout — gradients with every
// policy equal those without recomputation bitwise, the memory is what the policy says, misuse is an error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/status_matchers.h"
#include "zero/config.h"
#include "zero/recompute.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

// ---- RNG ----------------------------------------------------------------------------------------------------

// Random123's tests/kat_vectors, the three "philox4x32 10" lines (counter[4], key[2] -> result[4]).
TEST(CounterRngTest, PhiloxKnownAnswers) {
  EXPECT_EQ(CounterRng::Philox({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(CounterRng::Philox({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(CounterRng::Philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(CounterRngTest, SequenceIsBlocksAndReplays) {
  CounterRng rng(/*seed=*/0x1234'5678'9abc'def0ull, /*stream=*/(7ull << 32) + 3);
  const CounterRng::State start = rng.state();
  std::vector<uint32_t> first;
  for (int i = 0; i < 10; ++i) first.push_back(rng.NextU32());
  EXPECT_EQ(rng.position(), 10u);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(first[i], rng.Block(i / 4)[i % 4]) << i;
  // The counter layout: block index in words 0-1, stream in 2-3; seed is the key.
  EXPECT_EQ(rng.Block(1), CounterRng::Philox({1, 0, 3, 7}, {0x9abcdef0u, 0x12345678u}));

  rng.set_state(start);  // replay
  for (int i = 0; i < 10; ++i) EXPECT_EQ(rng.NextU32(), first[i]);
  CounterRng::State mid = start;
  mid.position = 6;  // replay from the middle of a block
  rng.set_state(mid);
  EXPECT_EQ(rng.NextU32(), first[6]);

  CounterRng other(start.seed, start.stream + 1);  // the next segment's stream
  int same = 0;
  for (int i = 0; i < 10; ++i) same += other.NextU32() == first[i];
  EXPECT_LT(same, 2);

  CounterRng u(1, 2);
  for (int i = 0; i < 1000; ++i) {
    const float f = u.NextFloat();
    ASSERT_GE(f, 0.0f);
    ASSERT_LT(f, 1.0f);
  }
}

// ---- arena --------------------------------------------------------------------------------------------------

TEST(ActivationArenaTest, StackReuseAndCoalescing) {
  MemoryTracker tracker;
  ActivationArena arena(&tracker, {.tier = MemTier::kDevice, .contiguous = true});
  auto device = [&] { return tracker.Report().Get(MemTier::kDevice, MemTag::kActivations); };

  // Pass 1: grows by exact-size overflow blocks, so the bytes held are the bytes in use; every allocation is
  // 64-byte aligned; peak is the high-water mark of live bytes.
  void* a = arena.Allocate(100);  // 128
  const ActivationArena::Mark m1 = arena.mark();
  void* b = arena.Allocate(1000);  // 1024
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  EXPECT_EQ(arena.used(), 128u + 1024u);
  EXPECT_EQ(arena.reserved(), 128u + 1024u);
  ASSERT_OK(arena.Release(m1));
  EXPECT_EQ(arena.reserved(), 128u);  // the overflow block went back
  arena.Allocate(512);
  EXPECT_EQ(arena.peak_used(), 128u + 1024u);
  EXPECT_EQ(static_cast<size_t>(device().current), arena.reserved());
  EXPECT_FALSE(arena.Release(arena.mark() + 1).ok());  // beyond the top
  EXPECT_FALSE(arena.Reserve(1 << 20).ok());           // not empty
  ASSERT_OK(arena.Release(0));
  EXPECT_EQ(device().peak, static_cast<int64_t>(128 + 1024));

  // Empty after pass 1: one block of exactly the peak; pass 2 fits in it with no new system allocation, and
  // a released range is handed out again.
  EXPECT_EQ(arena.blocks(), 1u);
  EXPECT_EQ(arena.reserved(), 128u + 1024u);
  const int64_t allocs = arena.system_allocations();
  void* a2 = arena.Allocate(100);
  const ActivationArena::Mark m2 = arena.mark();
  void* b2 = arena.Allocate(1000);
  EXPECT_EQ(static_cast<std::byte*>(b2), static_cast<std::byte*>(a2) + 128);  // contiguous
  ASSERT_OK(arena.Release(m2));
  EXPECT_EQ(arena.Allocate(512), b2);  // reuse
  ASSERT_OK(arena.Release(0));
  EXPECT_EQ(arena.system_allocations(), allocs);
  EXPECT_EQ(device().current, static_cast<int64_t>(128 + 1024));
  EXPECT_EQ(device().peak, static_cast<int64_t>(128 + 1024));
  EXPECT_EQ(tracker.Report().Get(MemTier::kHost, MemTag::kActivations).peak, 0);

  ASSERT_OK(arena.Reserve(4096));
  EXPECT_EQ(arena.reserved(), 4096u);
}

TEST(ActivationArenaTest, PerAllocationArenaReportsLiveBytes) {
  MemoryTracker tracker;
  {
    ActivationArena arena(&tracker, {.tier = MemTier::kHost, .contiguous = false});
    arena.Allocate(64);
    const auto m = arena.mark();
    arena.Allocate(640);
    EXPECT_EQ(arena.reserved(), arena.used());
    ASSERT_OK(arena.Release(m));
    EXPECT_EQ(arena.reserved(), 64u);
    EXPECT_EQ(tracker.Report().Get(MemTier::kHost, MemTag::kActivations).current, 64);
    EXPECT_EQ(tracker.Report().Get(MemTier::kHost, MemTag::kActivations).peak, 704);
  }
  EXPECT_EQ(tracker.Report().Get(MemTier::kHost, MemTag::kActivations).current, 0);  // destructor frees
}

// ---- a toy model: S segments of y = dropout(tanh(x W_s)), in place on one [N, D] buffer ---------------------

constexpr int kN = 8, kD = 16, kS = 5;
constexpr float kDrop = 0.25f;

struct Toy {
  std::vector<std::vector<float>> w;  // [S][D*D]
  std::vector<float> x0, r;           // input [N*D], loss weights: L = sum(y_final * r)

  Toy() : w(kS, std::vector<float>(kD * kD)), x0(kN * kD), r(kN * kD) {
    std::mt19937 g(7);
    std::normal_distribution<float> n(0.0f, 0.4f);
    for (auto& ws : w) {
      for (float& v : ws) v = n(g);
    }
    for (float& v : x0) v = n(g);
    for (float& v : r) v = n(g);
  }
};

// Per-segment views the trainer keeps (pointers into arena memory, rebound by each (re)computation).
struct ToyActs {
  float* x = nullptr;     // copy of the input
  float* a = nullptr;     // tanh(x W)
  float* keep = nullptr;  // dropout mask (1 or 0)
};

// `external` draws the mask from a generator outside the Checkpointer (a bug the tests must catch).
void ToyForward(SegmentContext& c, const std::vector<float>& w, ToyActs* acts, std::mt19937* external) {
  const float* x = c.input<float>(0);
  float* y = c.output<float>(0);
  acts->x = c.Allocate<float>(kN * kD);
  acts->a = c.Allocate<float>(kN * kD);
  acts->keep = c.Allocate<float>(kN * kD);
  std::memcpy(acts->x, x, sizeof(float) * kN * kD);
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < kD; ++j) {
      float h = 0;
      for (int k = 0; k < kD; ++k) h += acts->x[i * kD + k] * w[k * kD + j];
      acts->a[i * kD + j] = std::tanh(h);
    }
  }
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int i = 0; i < kN * kD; ++i) {
    const float draw = external ? u(*external) : c.rng().NextFloat();
    acts->keep[i] = draw >= kDrop ? 1.0f : 0.0f;
    y[i] = acts->a[i] * acts->keep[i] / (1.0f - kDrop);  // may overwrite x: the input was copied first
  }
}

void ToyBackward(const ToyActs& acts, const std::vector<float>& w, float* dx, float* dw) {
  std::vector<float> dh(kN * kD);
  for (int i = 0; i < kN * kD; ++i) {
    const float da = dx[i] * acts.keep[i] / (1.0f - kDrop);
    dh[i] = da * (1.0f - acts.a[i] * acts.a[i]);
  }
  for (int k = 0; k < kD; ++k) {
    for (int j = 0; j < kD; ++j) {
      float s = 0;
      for (int i = 0; i < kN; ++i) s += acts.x[i * kD + k] * dh[i * kD + j];
      dw[k * kD + j] += s;
    }
  }
  for (int i = 0; i < kN; ++i) {
    for (int k = 0; k < kD; ++k) {
      float s = 0;
      for (int j = 0; j < kD; ++j) s += dh[i * kD + j] * w[k * kD + j];
      dx[i * kD + k] = s;
    }
  }
}

struct ToyRun {
  std::vector<float> grads;       // dL/dW, all segments, over `passes` passes
  std::vector<float> masks;       // every mask the forwards drew (first forwards only)
  std::vector<float> recomputed;  // every mask the recomputes drew
  RecomputeStats stats;
  MemoryReport memory;
  Status status;
};

ToyRun RunToy(const CheckpointerOptions& options, int passes = 2, std::mt19937* external = nullptr) {
  Toy toy;
  ToyRun out;
  MemoryTracker tracker;
  auto made = Checkpointer::Create(&tracker, options);
  EXPECT_OK(made);
  Checkpointer& ckpt = **made;
  out.grads.assign(kS * kD * kD, 0.0f);
  std::vector<float> x(kN * kD), dx(kN * kD);
  std::vector<ToyActs> acts(kS);
  for (int p = 0; p < passes; ++p) {
    x = toy.x0;
    for (int s = 0; s < kS; ++s) {
      const SegmentInput in{x.data(), x.size() * sizeof(float)};
      const SegmentOutput outb{x.data(), x.size() * sizeof(float)};
      Status st = ckpt.Forward(s, {in}, {outb}, [&](SegmentContext& c) {
        EXPECT_FALSE(c.recomputing());
        ToyForward(c, toy.w[s], &acts[s], external);
        out.masks.insert(out.masks.end(), acts[s].keep, acts[s].keep + kN * kD);
      });
      if (!st.ok()) {
        out.status = st;
        return out;
      }
    }
    dx = toy.r;
    for (int s = kS - 1; s >= 0; --s) {
      Status st = ckpt.Backward(
          s,
          [&](SegmentContext& c) {
            EXPECT_TRUE(c.recomputing());
            ToyForward(c, toy.w[s], &acts[s], external);
            out.recomputed.insert(out.recomputed.end(), acts[s].keep, acts[s].keep + kN * kD);
          },
          [&](SegmentContext& c) {
            EXPECT_FALSE(c.recomputing());
            ToyBackward(acts[s], toy.w[s], dx.data(), out.grads.data() + s * kD * kD);
          });
      if (!st.ok()) {
        out.status = st;
        return out;
      }
    }
    EXPECT_TRUE(ckpt.outstanding().empty());
    EXPECT_EQ(ckpt.pass(), static_cast<uint64_t>(p + 1));
  }
  out.stats = ckpt.stats();
  out.memory = tracker.Report();
  return out;
}

CheckpointerOptions ToyOptions(CheckpointPolicy policy) {
  CheckpointerOptions o;
  o.num_segments = kS;
  o.policy = policy;
  o.seed = 99;
  return o;
}

constexpr size_t kActBytes = kN * kD * sizeof(float);  // 512: one [N, D] tensor, already a multiple of 64

TEST(CheckpointerTest, GradientsBitwiseEqualForEveryPolicy) {
  const ToyRun base = RunToy(ToyOptions(CheckpointPolicy::None()));
  ASSERT_OK(base.status);
  EXPECT_EQ(base.stats.recomputes, 0);
  EXPECT_EQ(base.stats.forwards, 2 * kS);
  EXPECT_TRUE(base.recomputed.empty());
  // Dropout is live: about a quarter of the units dropped, and the two passes drew different masks.
  const size_t per_pass = kS * kN * kD;
  int dropped = 0, differ = 0;
  for (size_t i = 0; i < per_pass; ++i) {
    dropped += base.masks[i] == 0.0f;
    differ += base.masks[i] != base.masks[per_pass + i];
  }
  EXPECT_GT(dropped, static_cast<int>(per_pass) / 8);
  EXPECT_LT(dropped, static_cast<int>(per_pass) * 3 / 8);
  EXPECT_GT(differ, 0);

  for (int k : {1, 2, 3, kS}) {
    for (bool cpu : {false, true}) {
      for (bool contiguous : {false, true}) {
        CheckpointerOptions o = ToyOptions(CheckpointPolicy::EveryKth(k));
        o.cpu_checkpointing = cpu;
        o.contiguous_checkpoints = contiguous;
        o.verify_recompute = true;
        const ToyRun run = RunToy(o);
        SCOPED_TRACE(::testing::Message() << "every_k " << k << " cpu " << cpu << " contiguous " << contiguous);
        ASSERT_OK(run.status);
        const int checkpointed = (kS + k - 1) / k;
        EXPECT_EQ(run.stats.recomputes, 2 * checkpointed);
        EXPECT_EQ(run.masks, base.masks);  // first forwards draw what the plain run draws
        ASSERT_EQ(run.grads.size(), base.grads.size());
        EXPECT_EQ(std::memcmp(run.grads.data(), base.grads.data(), base.grads.size() * sizeof(float)), 0);
        // The recomputes replayed exactly the masks of the checkpointed segments' forwards (in backward order).
        std::vector<float> want;
        for (int p = 0; p < 2; ++p) {
          for (int s = kS - 1; s >= 0; --s) {
            if (s % k != 0) continue;
            const float* m = base.masks.data() + (p * kS + s) * kN * kD;
            want.insert(want.end(), m, m + kN * kD);
          }
        }
        EXPECT_EQ(run.recomputed, want);
      }
    }
  }
}

// The test above would notice a broken replay: a forward drawing from a generator the Checkpointer does not
// control gets different masks when recomputed, so its gradients differ — and verify_recompute reports it.
TEST(CheckpointerTest, UncontrolledRandomnessIsCaught) {
  std::mt19937 g1(5), g2(5);
  const ToyRun base = RunToy(ToyOptions(CheckpointPolicy::None()), 1, &g1);
  ASSERT_OK(base.status);
  const ToyRun run = RunToy(ToyOptions(CheckpointPolicy::Every()), 1, &g2);
  ASSERT_OK(run.status);
  EXPECT_NE(std::memcmp(run.grads.data(), base.grads.data(), base.grads.size() * sizeof(float)), 0);

  std::mt19937 g3(5);
  CheckpointerOptions o = ToyOptions(CheckpointPolicy::Every());
  o.verify_recompute = true;
  const ToyRun verified = RunToy(o, 1, &g3);
  EXPECT_THAT(verified.status,
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("segment 4 recomputed outputs that differ")));
}

TEST(CheckpointerTest, RecomputeDrawingDifferentlyIsAnError) {
  MemoryTracker tracker;
  auto ckpt = Checkpointer::Create(&tracker, ToyOptions(CheckpointPolicy::Every())).value();
  float x = 1;
  ASSERT_OK(ckpt->Forward(0, {{&x, 4}}, {}, [](SegmentContext& c) { c.rng().NextU32(); }));
  const Status s = ckpt->Backward(
      0,
      [](SegmentContext& c) {
        c.rng().NextU32();
        c.rng().NextU32();
      },
      [](SegmentContext&) {});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          HasSubstr("segment 0 drew 2 random values when recomputed but 1")));
  EXPECT_TRUE(ckpt->outstanding().empty());  // the failed segment is dropped, its memory freed
  EXPECT_EQ(ckpt->arena().used(), 0u);
  EXPECT_EQ(ckpt->checkpoint_store().used(), 0u);
}

// Peak bytes: without recomputation every segment's intermediates (3 tensors) are live at the end of forward;
// with it only the checkpoints (1 tensor per segment) plus one segment's intermediates, its scratch output and
// its backward's temporaries. cpu_checkpointing moves exactly the checkpoints to the host tier.
TEST(CheckpointerTest, MemoryByPolicyAndTier) {
  const ToyRun none = RunToy(ToyOptions(CheckpointPolicy::None()));
  ASSERT_OK(none.status);
  EXPECT_EQ(none.stats.peak_arena_bytes, kS * 3 * kActBytes);
  EXPECT_EQ(none.stats.peak_checkpoint_bytes, 0u);
  EXPECT_EQ(none.memory.Get(MemTier::kDevice, MemTag::kActivations).peak, static_cast<int64_t>(kS * 3 * kActBytes));

  const ToyRun every = RunToy(ToyOptions(CheckpointPolicy::Every()));
  ASSERT_OK(every.status);
  EXPECT_EQ(every.stats.peak_checkpoint_bytes, kS * kActBytes);
  EXPECT_EQ(every.stats.peak_arena_bytes, 4 * kActBytes);  // scratch output + x, a, keep of one segment
  EXPECT_EQ(every.stats.checkpointed_bytes, static_cast<int64_t>(2 * kS * kActBytes));
  EXPECT_EQ(every.stats.checkpoint_tier, MemTier::kDevice);
  const auto& dev = every.memory.Get(MemTier::kDevice, MemTag::kActivations);
  EXPECT_EQ(dev.peak, static_cast<int64_t>(kS * kActBytes + 4 * kActBytes));
  EXPECT_EQ(dev.current, static_cast<int64_t>(4 * kActBytes));  // the arena keeps its coalesced block
  EXPECT_EQ(every.memory.Get(MemTier::kHost, MemTag::kActivations).peak, 0);

  CheckpointerOptions o = ToyOptions(CheckpointPolicy::Every());
  o.cpu_checkpointing = true;
  const ToyRun cpu = RunToy(o);
  ASSERT_OK(cpu.status);
  EXPECT_EQ(cpu.stats.checkpoint_tier, MemTier::kHost);
  EXPECT_EQ(cpu.memory.Get(MemTier::kHost, MemTag::kActivations).peak, static_cast<int64_t>(kS * kActBytes));
  EXPECT_EQ(cpu.memory.Get(MemTier::kHost, MemTag::kActivations).current, 0);  // per-checkpoint allocations
  EXPECT_EQ(cpu.memory.Get(MemTier::kDevice, MemTag::kActivations).peak, static_cast<int64_t>(4 * kActBytes));

  // Every 2nd of 5: segments 0, 2, 4 checkpointed (3 checkpoints); 1 and 3 keep their intermediates.
  const ToyRun k2 = RunToy(ToyOptions(CheckpointPolicy::EveryKth(2)));
  ASSERT_OK(k2.status);
  EXPECT_EQ(k2.stats.peak_checkpoint_bytes, 3 * kActBytes);
  // Arena peak: segment 4's recompute (4 tensors) on top of the kept intermediates of 1 and 3 (6 tensors).
  EXPECT_EQ(k2.stats.peak_arena_bytes, 10 * kActBytes);
}

TEST(CheckpointerTest, ContiguousCheckpointsArePreallocated) {
  CheckpointerOptions o = ToyOptions(CheckpointPolicy::Every());
  o.contiguous_checkpoints = true;
  o.checkpoint_slots = 7;  // DeepSpeed's number_checkpoints: slots of the buffer, more than needed here
  const ToyRun run = RunToy(o);
  ASSERT_OK(run.status);
  EXPECT_EQ(run.memory.Get(MemTier::kDevice, MemTag::kActivations).peak,
            static_cast<int64_t>(7 * kActBytes + 4 * kActBytes));

  MemoryTracker tracker;
  auto ckpt = Checkpointer::Create(&tracker, o).value();
  std::vector<float> x(kN * kD);
  for (int s = 0; s < kS; ++s) {
    ASSERT_OK(ckpt->Forward(s, {{x.data(), kActBytes}}, {}, [](SegmentContext&) {}));
  }
  EXPECT_EQ(ckpt->checkpoint_store().blocks(), 1u);
  EXPECT_EQ(ckpt->checkpoint_store().reserved(), 7 * kActBytes);
  EXPECT_EQ(ckpt->checkpoint_store().system_allocations(), 1);
  EXPECT_THAT(ckpt->SetPass(9), StatusIs(absl::StatusCode::kFailedPrecondition));  // segments outstanding
  ckpt->Abandon();
  EXPECT_EQ(ckpt->pass(), 1u);
  EXPECT_EQ(ckpt->checkpoint_store().used(), 0u);
  ASSERT_OK(ckpt->SetPass(9));
  // The RNG stream follows the pass: segment 2 of pass 9 draws from stream 9 * 2^32 + 2.
  uint32_t drawn = 0;
  ASSERT_OK(ckpt->Forward(2, {}, {}, [&](SegmentContext& c) { drawn = c.rng().NextU32(); }));
  EXPECT_EQ(drawn, CounterRng(o.seed, (9ull << 32) + 2).NextU32());
}

TEST(CheckpointerTest, Misuse) {
  MemoryTracker tracker;
  EXPECT_FALSE(Checkpointer::Create(&tracker, ToyOptions(CheckpointPolicy{-1})).ok());
  CheckpointerOptions zero_segments = ToyOptions(CheckpointPolicy::Every());
  zero_segments.num_segments = 0;
  EXPECT_FALSE(Checkpointer::Create(&tracker, zero_segments).ok());

  auto ckpt = Checkpointer::Create(&tracker, ToyOptions(CheckpointPolicy::Every())).value();
  float x = 0;
  auto nop = [](SegmentContext&) {};
  EXPECT_THAT(ckpt->Forward(kS, {}, {}, nop), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ckpt->Forward(0, {{nullptr, 4}}, {}, nop), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ckpt->Backward(0, nop, nop), StatusIs(absl::StatusCode::kFailedPrecondition));  // no forward
  ASSERT_OK(ckpt->Forward(0, {{&x, 4}}, {}, nop));
  EXPECT_THAT(ckpt->Forward(0, {{&x, 4}}, {}, nop), StatusIs(absl::StatusCode::kFailedPrecondition));  // twice
  ASSERT_OK(ckpt->Forward(1, {{&x, 4}}, {}, nop));
  EXPECT_THAT(ckpt->Backward(0, nop, nop),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("segment 1 was forwarded after it")));
  // The trainer allocated after segment 1's forward and did not release before its backward.
  const auto mark = ckpt->arena().mark();
  ckpt->arena().Allocate(64);
  EXPECT_THAT(ckpt->Backward(1, nop, nop), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("still live")));
  ASSERT_OK(ckpt->arena().Release(mark));
  EXPECT_OK(ckpt->Backward(1, nop, nop));
  EXPECT_OK(ckpt->Backward(0, nop, nop));
  EXPECT_EQ(ckpt->stats().passes, 1);
}

// ---- config -------------------------------------------------------------------------------------------------

TEST(CheckpointerOptionsTest, FromConfig) {
  auto parse = [](const std::string& json) { return Config::FromJsonString(json).value(); };
  // cpu_checkpointing alone is accepted (DeepSpeed requires partition_activations for it; zero does not).
  Config c = parse(R"({"train_micro_batch_size_per_gpu": 1, "seed": 7,
                       "activation_checkpointing": {"cpu_checkpointing": true, "profile": true}})");
  CheckpointerOptions o = CheckpointerOptions::FromConfig(c, 6, true).value();
  EXPECT_EQ(o.policy, CheckpointPolicy::Every());
  EXPECT_TRUE(o.cpu_checkpointing);
  EXPECT_FALSE(o.contiguous_checkpoints);
  EXPECT_TRUE(o.profile);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(CheckpointerOptions::FromConfig(c, 6, false).value().policy, CheckpointPolicy::None());

  // number_checkpoints n of S segments: every_k = ceil(S / n), so at most n are checkpointed.
  struct Case {
    int n, segments, k;
  };
  for (const Case& t :
       {Case{6, 6, 1}, Case{9, 6, 1}, Case{3, 6, 2}, Case{4, 6, 2}, Case{2, 5, 3}, Case{3, 5, 2}, Case{1, 5, 5}}) {
    Config cn = parse(absl::StrCat(R"({"activation_checkpointing": {"contiguous_memory_optimization": true,
                                      "number_checkpoints": )",
                                   t.n, "}}"));
    CheckpointerOptions on = CheckpointerOptions::FromConfig(cn, t.segments, true).value();
    EXPECT_EQ(on.policy.every_k, t.k) << "n " << t.n << " S " << t.segments;
    EXPECT_LE(on.policy.Count(t.segments), t.n);
    EXPECT_EQ(on.checkpoint_slots, t.n);
    EXPECT_TRUE(on.contiguous_checkpoints);
  }
  EXPECT_FALSE(CheckpointerOptions::FromConfig(c, 0, true).ok());
  Config partitioned = Config::Default();
  partitioned.activation_checkpointing.partition_activations = true;  // the parser rejects it; so do we
  EXPECT_THAT(CheckpointerOptions::FromConfig(partitioned, 4, true), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(Config::FromJsonString(R"({"activation_checkpointing": {"partition_activations": true}})").ok());
}

}  // namespace
}  // namespace zero
