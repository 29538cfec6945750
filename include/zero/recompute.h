// zero/recompute.h — activation recomputation (checkpointing) for C++ trainers, which have no autograd to hook.
//
//   ZERO_ASSIGN_OR_RETURN(zero::CheckpointerOptions opt,
//                         zero::CheckpointerOptions::FromConfig(cfg, /*num_segments=*/L, /*enabled=*/true));
//   ZERO_ASSIGN_OR_RETURN(auto ckpt, zero::Checkpointer::Create(&engine->memory_tracker(), opt));
//   // forward, segment l (inside the engine's Forward scope of its unit):
//   auto fwd = [&](zero::SegmentContext& c) {                        // a pure function of its inputs,
//     acts[l].Bind(cfg, B, T, c.Allocate(BlockActs::Bytes(cfg, B, T)));   // the weights and c.rng()
//     BlockForward(cfg, w, c.input<float>(0), c.output<float>(0), &acts[l]);
//   };
//   ZERO_RETURN_IF_ERROR(ckpt->Forward(l, {{x, bytes}}, {{x, bytes}}, fwd));
//   // backward, segment l (inside the engine's Backward scope: with stage 3 the unit is gathered for it):
//   ZERO_RETURN_IF_ERROR(ckpt->Backward(l, fwd_with_backward_scope_weights, [&](zero::SegmentContext& c) {
//     BlockBackward(cfg, w, g, acts[l], dx, dx, &scratch);
//   }));
//
// A SEGMENT is a piece of the trainer's forward (one transformer block, say) given as a callable from input
// activations to outputs, which allocates the intermediates its backward needs from zero's activation arena
// (SegmentContext::Allocate). The Checkpointer runs it:
// - not checkpointed: the forward runs once and its intermediates stay in the arena until the segment's
//   backward has run (ordinary training);
// - checkpointed: its inputs are copied into a checkpoint (in host-tier memory with cpu_checkpointing), the
//   forward runs and its intermediates are freed at once (the next segment reuses the memory). Backward runs
//   the forward again on the saved inputs to rebuild the intermediates, then the backward, then frees both.
// Randomness: each forward gets a counter-based generator (SegmentContext::rng) whose state is captured before
// the forward and restored for the recompute, so dropout masks are bit-identical; a recompute that draws a
// different number of values than the forward is an error (the forward was not deterministic).
//
// Order: segments are backwarded in the reverse order of their forwards (LIFO), as in any sequential model;
// the arena is a stack. Whatever the trainer allocated from arena() after a segment's forward must be released
// before that segment's backward. A PASS (one micro-step) starts with the first Forward while no segment is
// outstanding and ends when the last outstanding segment's Backward returns; at the end of a pass the arena is
// empty and, after the first pass, is one contiguous block of the pass's peak (no allocation in steady state).
//
// Memory accounting: every byte is reported to the MemoryTracker under MemTag::kActivations — intermediates
// in the compute tier, checkpoints in the compute tier or (cpu_checkpointing) the host tier. On zero's host
// engine there is no device: MemTier::kDevice bytes are host memory, reported in the device tier to show where
// they would live on an accelerator (see docs/guide/recompute.md).
//
// Stage 3: call Backward inside the unit's Engine::Backward scope. The recompute then uses the parameters that
// scope gathered — the recompute's gather IS the backward gather, issued (and prefetched) by the engine's
// recorded order; the Checkpointer itself never communicates.
//
// Not thread-safe: one Checkpointer per rank, used from that rank's thread.
//
// ERRORS AND ABORTS. Checkpointer's and ActivationArena's calls return a Status for the trainer's mistakes
// (segment out of range, backward out of LIFO order, arena memory still live, a non-deterministic recompute, a
// release beyond the top). Two things abort: ActivationArena::Allocate (and SegmentContext::Allocate) when the
// system has no memory, like operator new; and SegmentContext's accessors used outside their contract (input(i)
// or output(i) with i outside [0, num_inputs()) / [0, num_outputs()), input/output/rng() in a backward), which
// print the segment and the index. Those run inside the trainer's segment callable, which returns void, so no
// Status could reach the trainer, and the pointer they would hand back instead would crash later without a word;
// num_inputs(), num_outputs() and recomputing() let a callable check first. Everything else that aborts is an
// invariant of the Checkpointer itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "zero/config.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero {

// ---- counter-based random numbers -------------------------------------------------------------------------

// Philox-4x32-10 (Salmon et al., SC'11; the generator of cuRAND and of PyTorch's CUDA dropout): block `i` of
// stream `s` under key `seed` is Philox(counter = {i, s}, key = seed), four 32-bit words. No sequential state
// beyond the position, so a state is three integers, it is captured and replayed exactly, and any element can
// be drawn directly (Block), as one GPU thread per element would.
class CounterRng {
 public:
  struct State {
    uint64_t seed = 0;
    uint64_t stream = 0;
    uint64_t position = 0;  // 32-bit values drawn so far
    bool operator==(const State&) const = default;
  };

  CounterRng() = default;
  CounterRng(uint64_t seed, uint64_t stream) : state_{seed, stream, 0} {}

  // The next 32 random bits of the stream.
  uint32_t NextU32();
  // Uniform in [0, 1) with 24 random bits (every value exactly representable as a float).
  float NextFloat();
  // Block `index` of this stream (words 4*index .. 4*index+3 of the sequence), without advancing.
  std::array<uint32_t, 4> Block(uint64_t index) const;

  State state() const { return state_; }
  void set_state(const State& s) {
    state_ = s;
    block_index_ = ~uint64_t{0};
  }
  uint64_t position() const { return state_.position; }

  // The Philox-4x32-10 bijection itself (Random123's philox4x32_10).
  static std::array<uint32_t, 4> Philox(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

 private:
  State state_;
  std::array<uint32_t, 4> block_{};
  uint64_t block_index_ = ~uint64_t{0};  // which block of the stream `block_` holds (cache of one Philox call)
};

// ---- the activation arena ---------------------------------------------------------------------------------

struct ArenaOptions {
  MemTier tier = MemTier::kDevice;  // where the bytes are reported (see the file comment)
  // true: one contiguous block — allocations that do not fit get overflow blocks of their exact size, and the
  // next time the arena is empty everything is coalesced into one block of the peak, so a steady state
  // allocates nothing. false: every allocation is its own block, freed when released (what a general allocator
  // does; the reported bytes are exactly the live ones).
  bool contiguous = true;
};

// A stack (LIFO) allocator of 64-byte aligned, uninitialized memory, tagged MemTag::kActivations. Reuse across
// segments is the point: a segment's intermediates are released before (checkpointed) or after (its backward)
// the next use of the same bytes. peak_used() is the high-water mark of live bytes; reserved() what is held.
// Not thread-safe.
class ActivationArena {
 public:
  // A position in the stack: Release(mark) frees everything allocated after it.
  using Mark = size_t;

  ActivationArena(MemoryTracker* tracker, ArenaOptions options);
  ~ActivationArena();
  ActivationArena(const ActivationArena&) = delete;
  ActivationArena& operator=(const ActivationArena&) = delete;

  // `bytes` (rounded up to 64) of uninitialized memory, 64-byte aligned; never null (bytes 0 gives a valid
  // 64-byte block). Valid until released. Aborts on out-of-memory like operator new.
  void* Allocate(size_t bytes);
  Mark mark() const { return allocs_.size(); }
  // Frees every allocation made after `m` (kFailedPrecondition if `m` is beyond the top). When a contiguous
  // arena becomes empty and its block is smaller than peak_used(), it is replaced by one of peak_used() bytes.
  [[nodiscard]] Status Release(Mark m);
  // Holds at least `bytes` in one block, so that allocations up to that total need no new memory. Only when
  // empty (kFailedPrecondition otherwise); a no-op for a non-contiguous arena.
  [[nodiscard]] Status Reserve(size_t bytes);

  size_t used() const { return used_; }            // live bytes (allocation sizes rounded up to 64)
  size_t peak_used() const { return peak_used_; }  // high-water mark of used()
  size_t reserved() const { return reserved_; }    // bytes of memory held (what the tracker reports)
  size_t blocks() const { return blocks_.size(); }
  int64_t system_allocations() const { return system_allocs_; }  // blocks obtained from the system so far
  const ArenaOptions& options() const { return options_; }

 private:
  struct Block {
    std::byte* data = nullptr;
    size_t capacity = 0;
    size_t used = 0;
  };
  struct Alloc {
    size_t block = 0;
    size_t offset = 0;
    size_t bytes = 0;
  };
  size_t NewBlock(size_t bytes);
  void FreeBlock(size_t index);

  MemoryTracker* tracker_;
  ArenaOptions options_;
  std::vector<Block> blocks_;
  std::vector<Alloc> allocs_;
  size_t used_ = 0, peak_used_ = 0, reserved_ = 0;
  int64_t system_allocs_ = 0;
};

// ---- policy and options -----------------------------------------------------------------------------------

// Which segments are checkpointed (recomputed in backward). every_k = 0: none; 1: every segment; k > 1: the
// segments i with i % k == 0 (segments 0, k, 2k, ...); the others keep their intermediates.
struct CheckpointPolicy {
  int every_k = 1;

  static CheckpointPolicy None() { return {0}; }
  static CheckpointPolicy Every() { return {1}; }
  static CheckpointPolicy EveryKth(int k) { return {k}; }
  bool Checkpoints(int segment) const { return every_k > 0 && segment % every_k == 0; }
  // How many of `num_segments` segments are checkpointed.
  int Count(int num_segments) const { return every_k > 0 ? (num_segments + every_k - 1) / every_k : 0; }
  bool operator==(const CheckpointPolicy&) const = default;
};

struct CheckpointerOptions {
  int num_segments = 1;  // S: segments are numbered 0 .. S-1
  CheckpointPolicy policy;
  // Checkpoints (saved inputs) in MemTier::kHost instead of the compute tier.
  bool cpu_checkpointing = false;
  // Checkpoints in one preallocated contiguous block of `checkpoint_slots` x (first checkpoint's bytes)
  // instead of one allocation each (DeepSpeed's contiguous_memory_optimization).
  bool contiguous_checkpoints = false;
  int64_t checkpoint_slots = 0;  // 0: the number of checkpointed segments
  // The tier the segments compute in: intermediates live there, and checkpoints unless cpu_checkpointing.
  MemTier compute_tier = MemTier::kDevice;
  uint64_t seed = 0;     // the RNG key; a segment's stream is pass * 2^32 + segment
  bool profile = false;  // time forwards, recomputes and backwards (RecomputeStats)
  // Fingerprint a checkpointed segment's outputs after its forward and compare the recompute's: a mismatch
  // (the forward read something besides its inputs, the parameters and ctx.rng() that changed since) is an
  // error from Backward. Costs one pass over the outputs per forward and per recompute.
  bool verify_recompute = false;

  // From the `activation_checkpointing` section and the top-level `seed`. `enabled` false gives the None
  // policy (the trainer did not ask for recomputation: DeepSpeed too only recomputes what the model wraps).
  // number_checkpoints = n maps to every_k = ceil(S / n) (every segment when absent or n >= S), so at most n
  // segments are checkpointed: in DeepSpeed n is the number of checkpoint slots of the contiguous buffer,
  // and here it also sizes that buffer (checkpoint_slots = n). contiguous_memory_optimization ->
  // contiguous_checkpoints; cpu_checkpointing is allowed without partition_activations (DeepSpeed requires
  // it); partition_activations (model parallelism) is kInvalidArgument; synchronize_checkpoint_boundary has
  // nothing to synchronize on the host; profile -> profile. kInvalidArgument for num_segments < 1.
  static StatusOr<CheckpointerOptions> FromConfig(const Config& config, int num_segments, bool enabled);
};

struct RecomputeStats {
  int64_t forwards = 0;              // segment forwards run (first time)
  int64_t recomputes = 0;            // segment forwards run again in backward
  int64_t backwards = 0;             // segment backwards run
  int64_t passes = 0;                // completed passes
  int64_t checkpointed_bytes = 0;    // bytes copied into checkpoints, in total
  size_t peak_checkpoint_bytes = 0;  // most checkpoint bytes live at once
  size_t peak_arena_bytes = 0;       // the arena's peak_used()
  MemTier checkpoint_tier = MemTier::kDevice;
  double forward_s = 0, recompute_s = 0, backward_s = 0;  // with options.profile only
};

// ---- segments ---------------------------------------------------------------------------------------------

// A segment's input: read-only, `bytes` long. Copied into the checkpoint when the segment is checkpointed.
struct SegmentInput {
  const void* data = nullptr;
  size_t bytes = 0;
};
// A segment's output, written by its forward. May alias an input (the input is saved before the forward runs).
struct SegmentOutput {
  void* data = nullptr;
  size_t bytes = 0;
};

class Checkpointer;

// What a segment's forward (and backward) callable sees. Valid only during the call.
class SegmentContext {
 public:
  int segment() const { return segment_; }
  // True during the forward that rebuilds the intermediates in backward.
  bool recomputing() const { return recomputing_; }
  // Forward only. Input i: the trainer's buffer in the first forward, the saved copy in a recompute.
  template <typename T = void>
  const T* input(int i) const {
    return static_cast<const T*>(InputData(i));
  }
  // Forward only. Output i: the trainer's buffer in the first forward; in a recompute, arena scratch of the
  // same size whose contents are discarded (backward gets the output gradient from the trainer instead).
  template <typename T = void>
  T* output(int i) const {
    return static_cast<T*>(OutputData(i));
  }
  int num_inputs() const;
  int num_outputs() const;
  // Arena memory (64-byte aligned, uninitialized). In a forward: the segment's intermediates, kept until its
  // backward ends (or, in a checkpointed segment's first forward, until that forward returns). In a backward:
  // temporaries, freed when it returns.
  void* Allocate(size_t bytes);
  template <typename T>
  T* Allocate(size_t count) {
    return static_cast<T*>(Allocate(count * sizeof(T)));
  }
  // Forward only: the segment's generator, in the same state at the start of the forward and of its recompute.
  CounterRng& rng();

 private:
  friend class Checkpointer;
  SegmentContext() = default;
  const void* InputData(int i) const;
  void* OutputData(int i) const;

  int segment_ = -1;
  bool recomputing_ = false;
  bool forward_ = true;
  ActivationArena* arena_ = nullptr;
  CounterRng* rng_ = nullptr;
  absl::Span<const SegmentInput> inputs_;
  absl::Span<const SegmentOutput> outputs_;
};

using SegmentFn = absl::FunctionRef<void(SegmentContext&)>;

// Runs segments with or without recomputation by policy; owns the activation arena and the checkpoints.
class Checkpointer {
 public:
  // kInvalidArgument for num_segments < 1, every_k < 0 or checkpoint_slots < 0. `tracker` (not owned, may be
  // null) outlives the Checkpointer; pass the engine's (Engine::memory_tracker) so its report shows the bytes.
  static StatusOr<std::unique_ptr<Checkpointer>> Create(MemoryTracker* tracker, const CheckpointerOptions& options);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Runs `forward` for `segment`, checkpointing by policy (see the file comment). The inputs must stay
  // unchanged while `forward` runs; afterwards the Checkpointer no longer reads them. kFailedPrecondition if
  // the segment already has a forward without a backward; kInvalidArgument for a segment outside [0, S) or a
  // null input/output with bytes > 0.
  [[nodiscard]] Status Forward(int segment, absl::Span<const SegmentInput> inputs,
                               absl::Span<const SegmentOutput> outputs, SegmentFn forward);
  // For a checkpointed segment: runs `forward` again on the saved inputs with the captured RNG state, then
  // `backward`, then frees the rebuilt intermediates and the checkpoint; otherwise runs `backward` and frees the
  // intermediates. `forward` must compute what the first forward computed (it may read the parameters from
  // the backward scope; it is not called for a segment that is not checkpointed). kFailedPrecondition if the
  // segment is not the most recent outstanding forward (LIFO), if arena allocations made after its forward are
  // still live, or if the recompute drew a different number of random values than the forward.
  [[nodiscard]] Status Backward(int segment, SegmentFn forward, SegmentFn backward);

  // Drops every outstanding segment (a forward-only pass, or after an error) and frees its memory, including
  // whatever was allocated from arena() after the oldest outstanding forward; the pass counter advances if
  // anything was outstanding.
  void Abandon();

  bool checkpointed(int segment) const;
  // Segments forwarded and not yet backwarded, oldest first.
  std::vector<int> outstanding() const;
  // The current pass (the RNG stream's high half), counted from 0.
  uint64_t pass() const;
  // Sets the pass counter, to resume a run with the RNG streams it would have used (e.g. step x accumulation
  // steps). kFailedPrecondition while segments are outstanding.
  [[nodiscard]] Status SetPass(uint64_t pass);

  // The compute-tier arena that holds intermediates; trainers may allocate their other activations here
  // (stack order: release them before the backward of a segment forwarded before them).
  ActivationArena& arena();
  // Where checkpoints live (compute tier, or host tier with cpu_checkpointing).
  const ActivationArena& checkpoint_store() const;
  const CheckpointerOptions& options() const;
  RecomputeStats stats() const;

 private:
  class Impl;
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
