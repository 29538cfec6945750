// The Checkpointer: runs segments by policy, keeps checkpoints (saved inputs) in their tier, rebuilds a
// checkpointed segment's intermediates before its backward with the RNG state captured at its forward.
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "zero/logging.h"
#include "zero/recompute.h"

namespace zero {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// 64-bit FNV-1a over the bytes, eight at a time (a fingerprint for verify_recompute, not a cryptographic hash).
uint64_t Fingerprint(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

// ---- SegmentContext -----------------------------------------------------------------------------------------

int SegmentContext::num_inputs() const { return static_cast<int>(inputs_.size()); }
int SegmentContext::num_outputs() const { return static_cast<int>(outputs_.size()); }

const void* SegmentContext::InputData(int i) const {
  ZERO_CHECK(forward_) << "segment " << segment_ << ": inputs are available in its forward only";
  ZERO_CHECK(i >= 0 && i < num_inputs()) << "segment " << segment_ << ": input " << i << " of " << num_inputs();
  return inputs_[i].data;
}

void* SegmentContext::OutputData(int i) const {
  ZERO_CHECK(forward_) << "segment " << segment_ << ": outputs are available in its forward only";
  ZERO_CHECK(i >= 0 && i < num_outputs()) << "segment " << segment_ << ": output " << i << " of " << num_outputs();
  return outputs_[i].data;
}

void* SegmentContext::Allocate(size_t bytes) { return arena_->Allocate(bytes); }

CounterRng& SegmentContext::rng() {
  ZERO_CHECK(rng_ != nullptr) << "segment " << segment_ << ": rng() is available in its forward only";
  return *rng_;
}

// ---- options ------------------------------------------------------------------------------------------------

StatusOr<CheckpointerOptions> CheckpointerOptions::FromConfig(const Config& config, int num_segments, bool enabled) {
  const ActivationCheckpointingConfig& ac = config.activation_checkpointing;
  if (num_segments < 1) {
    return absl::InvalidArgumentError(absl::StrCat("recompute: num_segments must be >= 1, got ", num_segments));
  }
  if (ac.partition_activations) {
    return absl::InvalidArgumentError(
        "activation_checkpointing.partition_activations: not supported (it shards saved activations across "
        "model-parallel ranks; zero has no model parallelism)");
  }
  if (ac.number_checkpoints && *ac.number_checkpoints < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation_checkpointing.number_checkpoints: must be >= 1, got ", *ac.number_checkpoints));
  }
  CheckpointerOptions o;
  o.num_segments = num_segments;
  if (!enabled) {
    o.policy = CheckpointPolicy::None();
  } else if (ac.number_checkpoints && *ac.number_checkpoints < num_segments) {
    const int64_t n = *ac.number_checkpoints;
    o.policy = CheckpointPolicy::EveryKth(static_cast<int>((num_segments + n - 1) / n));
  } else {
    o.policy = CheckpointPolicy::Every();
  }
  o.cpu_checkpointing = ac.cpu_checkpointing;
  o.contiguous_checkpoints = ac.contiguous_memory_optimization;
  o.checkpoint_slots = ac.number_checkpoints.value_or(0);
  o.seed = config.seed;
  o.profile = ac.profile;
  return o;
}

// ---- Checkpointer -------------------------------------------------------------------------------------------

class Checkpointer::Impl {
 public:
  Impl(MemoryTracker* tracker, const CheckpointerOptions& o)
      : options(o),
        arena(tracker, ArenaOptions{.tier = o.compute_tier, .contiguous = true}),
        store(tracker, ArenaOptions{.tier = o.cpu_checkpointing ? MemTier::kHost : o.compute_tier,
                                    .contiguous = o.contiguous_checkpoints}),
        open(o.num_segments, false) {}

  // One outstanding forward.
  struct Record {
    int segment = -1;
    bool checkpointed = false;
    ActivationArena::Mark arena_mark = 0;  // arena top before the forward
    ActivationArena::Mark arena_end = 0;   // arena top after it (== arena_mark when checkpointed)
    ActivationArena::Mark store_mark = 0;  // checkpoint store top before the inputs were saved
    std::vector<SegmentInput> saved;       // the checkpoint: copies of the inputs
    std::vector<size_t> output_bytes;
    CounterRng::State rng_start;
    uint64_t rng_draws = 0;
    uint64_t fingerprint = 0;  // of the outputs, with verify_recompute
  };

  Status CheckSegment(int segment) const {
    if (segment < 0 || segment >= options.num_segments) {
      return absl::InvalidArgumentError(
          absl::StrCat("recompute: segment ", segment, " outside [0, ", options.num_segments, ")"));
    }
    return absl::OkStatus();
  }

  uint64_t OutputFingerprint(absl::Span<const SegmentOutput> outputs) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const SegmentOutput& o : outputs) h = Fingerprint(o.data, o.bytes, h);
    return h;
  }

  // Frees the top record's memory and pops it; ends the pass when nothing is outstanding.
  void Pop() {
    Record& r = stack.back();
    ZERO_CHECK_OK(arena.Release(r.arena_mark));
    ZERO_CHECK_OK(store.Release(r.store_mark));
    open[r.segment] = false;
    stack.pop_back();
    if (stack.empty()) {
      ++pass;
      ++stats.passes;
    }
  }

  CheckpointerOptions options;
  ActivationArena arena;
  ActivationArena store;
  std::vector<bool> open;
  std::vector<Record> stack;
  uint64_t pass = 0;
  RecomputeStats stats;
};

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpointer::~Checkpointer() = default;

StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(MemoryTracker* tracker,
                                                             const CheckpointerOptions& options) {
  if (options.num_segments < 1) {
    return absl::InvalidArgumentError(absl::StrCat("recompute: num_segments must be >= 1, got ", options.num_segments));
  }
  if (options.policy.every_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recompute: policy every_k must be >= 0 (0 = none), got ", options.policy.every_k));
  }
  if (options.checkpoint_slots < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recompute: checkpoint_slots must be >= 0, got ", options.checkpoint_slots));
  }
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::make_unique<Impl>(tracker, options)));
}

Status Checkpointer::Forward(int segment, absl::Span<const SegmentInput> inputs,
                             absl::Span<const SegmentOutput> outputs, SegmentFn forward) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckSegment(segment));
  if (m.open[segment]) {
    return absl::FailedPreconditionError(
        absl::StrCat("recompute: segment ", segment, " already has a forward without a backward"));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].data == nullptr && inputs[i].bytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat("recompute: segment ", segment, " input ", i, " is null"));
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].data == nullptr && outputs[i].bytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat("recompute: segment ", segment, " output ", i, " is null"));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  Impl::Record r;
  r.segment = segment;
  r.checkpointed = m.options.policy.Checkpoints(segment);
  r.store_mark = m.store.mark();
  for (const SegmentOutput& o : outputs) r.output_bytes.push_back(o.bytes);
  if (r.checkpointed) {
    if (m.options.contiguous_checkpoints && m.store.mark() == 0) {
      // DeepSpeed's contiguous_memory_optimization: one buffer of `slots` checkpoints, sized at the first one.
      size_t bytes = 0;
      for (const SegmentInput& in : inputs) bytes += (in.bytes + 63) / 64 * 64;
      const int64_t slots =
          m.options.checkpoint_slots > 0 ? m.options.checkpoint_slots : m.options.policy.Count(m.options.num_segments);
      ZERO_RETURN_IF_ERROR(m.store.Reserve(bytes * static_cast<size_t>(slots)));
    }
    // Saved before the forward runs: an output may alias an input (in-place residual streams).
    for (const SegmentInput& in : inputs) {
      void* copy = m.store.Allocate(in.bytes);
      if (in.bytes > 0) std::memcpy(copy, in.data, in.bytes);
      r.saved.push_back({copy, in.bytes});
      m.stats.checkpointed_bytes += static_cast<int64_t>(in.bytes);
    }
  }
  CounterRng rng(m.options.seed, (m.pass << 32) + static_cast<uint64_t>(segment));
  r.rng_start = rng.state();
  SegmentContext ctx;
  ctx.segment_ = segment;
  ctx.arena_ = &m.arena;
  ctx.rng_ = &rng;
  ctx.inputs_ = inputs;
  ctx.outputs_ = outputs;
  r.arena_mark = m.arena.mark();
  forward(ctx);
  r.rng_draws = rng.position() - r.rng_start.position;
  if (m.options.verify_recompute && r.checkpointed) r.fingerprint = m.OutputFingerprint(outputs);
  if (r.checkpointed) ZERO_RETURN_IF_ERROR(m.arena.Release(r.arena_mark));  // intermediates discarded
  r.arena_end = m.arena.mark();
  m.open[segment] = true;
  m.stack.push_back(std::move(r));
  ++m.stats.forwards;
  if (m.options.profile) m.stats.forward_s += Seconds(t0);
  return absl::OkStatus();
}

Status Checkpointer::Backward(int segment, SegmentFn forward, SegmentFn backward) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckSegment(segment));
  if (!m.open[segment]) {
    return absl::FailedPreconditionError(absl::StrCat("recompute: segment ", segment, " has no outstanding forward"));
  }
  Impl::Record& r = m.stack.back();
  if (r.segment != segment) {
    return absl::FailedPreconditionError(
        absl::StrCat("recompute: backward of segment ", segment, " while segment ", r.segment,
                     " was forwarded after it and is still outstanding (backward runs in reverse forward order)"));
  }
  if (m.arena.mark() != r.arena_end) {
    return absl::FailedPreconditionError(
        absl::StrCat("recompute: backward of segment ", segment, " with ",
                     static_cast<int64_t>(m.arena.mark()) - static_cast<int64_t>(r.arena_end),
                     " arena allocation(s) made after its forward still live; release them first"));
  }
  if (r.checkpointed) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<SegmentOutput> scratch;
    for (size_t bytes : r.output_bytes) scratch.push_back({m.arena.Allocate(bytes), bytes});
    CounterRng rng;
    rng.set_state(r.rng_start);  // replay: the same stream from the same position
    SegmentContext ctx;
    ctx.segment_ = segment;
    ctx.recomputing_ = true;
    ctx.arena_ = &m.arena;
    ctx.rng_ = &rng;
    ctx.inputs_ = r.saved;
    ctx.outputs_ = scratch;
    forward(ctx);
    ++m.stats.recomputes;
    if (m.options.profile) m.stats.recompute_s += Seconds(t0);
    const uint64_t draws = rng.position() - r.rng_start.position;
    if (draws != r.rng_draws) {
      m.Pop();
      return absl::FailedPreconditionError(absl::StrCat(
          "recompute: segment ", segment, " drew ", draws, " random values when recomputed but ", r.rng_draws,
          " in its forward; a segment's forward must depend only on its inputs, the "
          "parameters and ctx.rng()"));
    }
    if (m.options.verify_recompute && m.OutputFingerprint(scratch) != r.fingerprint) {
      m.Pop();
      return absl::FailedPreconditionError(
          absl::StrCat("recompute: segment ", segment,
                       " recomputed outputs that differ from its forward's (verify_recompute); "
                       "a segment's forward must depend only on its inputs, the parameters and ctx.rng()"));
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  SegmentContext bctx;
  bctx.segment_ = segment;
  bctx.forward_ = false;
  bctx.arena_ = &m.arena;
  backward(bctx);
  ++m.stats.backwards;
  if (m.options.profile) m.stats.backward_s += Seconds(t1);
  m.Pop();
  return absl::OkStatus();
}

void Checkpointer::Abandon() {
  Impl& m = *impl_;
  while (!m.stack.empty()) m.Pop();
}

bool Checkpointer::checkpointed(int segment) const { return impl_->options.policy.Checkpoints(segment); }

std::vector<int> Checkpointer::outstanding() const {
  std::vector<int> out;
  for (const auto& r : impl_->stack) out.push_back(r.segment);
  return out;
}

uint64_t Checkpointer::pass() const { return impl_->pass; }
Status Checkpointer::SetPass(uint64_t pass) {
  if (!impl_->stack.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("recompute: SetPass(", pass, ") with ", impl_->stack.size(), " segment(s) outstanding"));
  }
  impl_->pass = pass;
  return absl::OkStatus();
}

ActivationArena& Checkpointer::arena() { return impl_->arena; }
const ActivationArena& Checkpointer::checkpoint_store() const { return impl_->store; }
const CheckpointerOptions& Checkpointer::options() const { return impl_->options; }

RecomputeStats Checkpointer::stats() const {
  RecomputeStats s = impl_->stats;
  s.peak_checkpoint_bytes = impl_->store.peak_used();
  s.peak_arena_bytes = impl_->arena.peak_used();
  s.checkpoint_tier = impl_->store.options().tier;
  return s;
}

}  // namespace zero
