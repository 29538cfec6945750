#include "train.h"
#include "train_common.h"

#include "support_threads.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data.h"
#include "estimate.h"
#include "model.h"
#include "zero/advanced/engine_stats.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"
#include "zero/logging.h"
#include "zero/recompute.h"

namespace zero::gpt {

namespace internal {

// CPU time of this process so far: unlike wall time, it does not grow while other tenants of a shared machine
// hold the cores.
double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Gathers every rank's memory report (int64 counters carried bit-exactly through f32 all-gather slots).
StatusOr<std::vector<MemoryReport>> GatherReports(int world, const MemoryReport& mine,
                                                  const HostAllGather& all_gather) {
  constexpr size_t kTiers = static_cast<size_t>(MemTier::kCount), kTags = static_cast<size_t>(MemTag::kCount);
  constexpr size_t kWords = kTiers * kTags * 2 + kTiers + 1;
  std::vector<int64_t> flat;
  for (size_t t = 0; t < kTiers; ++t) {
    for (size_t g = 0; g < kTags; ++g) {
      flat.push_back(mine.usage[t][g].current);
      flat.push_back(mine.usage[t][g].peak);
    }
    flat.push_back(mine.peak_total[t]);
  }
  flat.push_back(mine.padding_bytes);
  std::vector<float> send(kWords * 2), recv(kWords * 2 * world);
  std::memcpy(send.data(), flat.data(), kWords * 8);
  ZERO_RETURN_IF_ERROR(all_gather(send.data(), recv.data(), send.size()));
  std::vector<MemoryReport> out(world);
  for (int r = 0; r < world; ++r) {
    std::vector<int64_t> v(kWords);
    std::memcpy(v.data(), recv.data() + r * kWords * 2, kWords * 8);
    size_t k = 0;
    for (size_t t = 0; t < kTiers; ++t) {
      for (size_t g = 0; g < kTags; ++g) {
        out[r].usage[t][g].current = v[k++];
        out[r].usage[t][g].peak = v[k++];
      }
      out[r].peak_total[t] = v[k++];
    }
    out[r].padding_bytes = v[k];
  }
  return out;
}

namespace {

// The largest next_step a resumed run accepts: far beyond any run, far below where step × batch × sequence
// (the data position) could overflow.
constexpr int64_t kMaxResumeStep = int64_t{1} << 40;
// The largest data cursor (global samples trained) a resumed run accepts: 2^20 samples per step for kMaxResumeStep
// steps, still far from overflowing when a step's samples are added.
constexpr int64_t kMaxResumeSamples = int64_t{1} << 60;

StatusOr<GptUnits> RegisterGpt(Engine& engine, const GptConfig& mc, uint64_t seed) {
  GptUnits u;
  ZERO_ASSIGN_OR_RETURN(u.root, engine.AddUnit(kRootUnit, ToEngineSpecs(RootParams(mc))));
  for (int l = 0; l < mc.layers; ++l) {
    ZERO_ASSIGN_OR_RETURN(UnitId b, engine.AddUnit(BlockUnitName(l), ToEngineSpecs(BlockParams(mc))));
    u.blocks.push_back(b);
  }
  Status init_status;
  ZERO_RETURN_IF_ERROR(engine.Finalize([&](const std::string& unit, const zero::ParamSpec& p, float* out) {
    Status s = InitParam(seed, mc, unit, gpt::ParamSpec{p.name, p.shape}, out);
    if (!s.ok() && init_status.ok()) init_status = s;
  }));
  ZERO_RETURN_IF_ERROR(init_status);
  return u;
}

StatusOr<ByteDataset> LoadData(const TrainOptions& options) {
  ByteDatasetOptions dopt;
  dopt.seed = options.seed;
  if (!options.data_file.empty()) dopt.files = {options.data_file};
  return ByteDataset::Load(dopt);
}

}  // namespace

void RecordStep(int64_t step, float loss, const StepResult& r, const StepClock& started, double tokens, int64_t samples,
                int rank, const std::function<void(const StepLog&)>& on_step, TrainResult* result) {
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started.wall).count();
  StepLog log{step,
              loss,
              r.grad_norm,
              ms,
              ProcessCpuMs() - started.cpu_ms,
              tokens / (ms / 1000.0),
              r.skipped,
              started.save_in_flight,
              r.shard_group_bus_bytes,
              r.replica_bus_bytes,
              samples,
              r.intra_host_bytes,
              r.inter_host_bytes};
  result->steps.push_back(log);
  if (rank == 0 && on_step) on_step(log);
}

void RecordEngineStats(const Engine& engine, const GptUnits& units, TrainResult* result,
                       std::array<int64_t, 2> trainer_bytes) {
  result->memory = engine.memory_report();
  const zero::advanced::EngineStats stats = zero::advanced::Stats(engine);
  result->prefetch_gathers = stats.prefetch_gathers;
  result->demand_gathers = stats.demand_gathers;
  result->peak_live_elements = stats.peak_live_elements;
  result->nvme_step_bytes_read = stats.nvme_step_bytes_read;
  result->nvme_step_bytes_written = stats.nvme_step_bytes_written;
  result->nvme_io_busy_ms = stats.nvme_io_busy_ms;
  result->nvme_wait_ms = stats.nvme_wait_ms;
  result->nvme_param_step_bytes_read = stats.nvme_param_step_bytes_read;
  result->nvme_param_step_bytes_written = stats.nvme_param_step_bytes_written;
  // The bound on the true peak: the trainer keeps the root unit open for the whole pass beside one block, and its
  // activations (the Checkpointer's arena) and its own buffers are in the engine's tracker.
  auto padded = [&](UnitId u) {
    int64_t n = 0;
    for (const zero::ParamSpec& p : engine.UnitParams(u)) n += p.numel();
    const int64_t q = int64_t{32} * engine.world_size();
    return (n + q - 1) / q * q;
  };
  PeakBoundOptions o;
  int64_t block = 0;
  for (UnitId b : units.blocks) block = std::max(block, padded(b));
  o.open_elements = padded(units.root) + block;
  o.trainer_host_bytes = result->memory.Get(MemTier::kHost, MemTag::kActivations).peak + trainer_bytes[0];
  o.trainer_device_bytes = result->memory.Get(MemTier::kDevice, MemTag::kActivations).peak + trainer_bytes[1];
  for (MemTier tier : {MemTier::kHost, MemTier::kDevice}) {
    result->peak_bound[static_cast<size_t>(tier)] = engine.TruePeakBound(tier, o);
  }
}

StatusOr<GptRun> OpenRun(const Config& config, std::shared_ptr<Communicator> comm, const EngineOptions& engine_options,
                         const GptConfig& mc, const TrainOptions& options) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, std::move(comm), engine_options));
  if (options.host_limit > 0) engine->memory_tracker().SetLimit(MemTier::kHost, options.host_limit);
  const Config& cfg = engine->config();
  const DType dtype = cfg.fp16.enabled ? DType::kF16 : cfg.bf16.enabled ? DType::kBF16 : DType::kF32;
  ZERO_ASSIGN_OR_RETURN(GptUnits units, RegisterGpt(*engine, mc, options.seed));
  ZERO_ASSIGN_OR_RETURN(ByteDataset data, LoadData(options));
  const int B = static_cast<int>(cfg.micro_batch());
  const int ga = static_cast<int>(cfg.accumulation_steps());
  GptRun run{std::move(engine), B, ga, dtype, std::move(units), std::move(data)};
  // The data's key stride: this run's global batch, unless a resumed checkpoint says the first run's (below).
  run.data.set_stride(static_cast<int64_t>(B) * run.engine->world_size() * ga);
  if (!options.init_from.empty()) {
    LoadOptions lo;
    lo.name_map = options.init_map;
    ZERO_RETURN_IF_ERROR(run.engine->LoadSafetensors(options.init_from, lo));
  }
  if (!options.resume_dir.empty()) {
    // "No checkpoint yet" only where the folder has none at all: complete checkpoints beside a missing or
    // unusable `latest` are an error naming the newest (a run that started over beside them failed at its
    // first save, onto an existing tag).
    StatusOr<std::string> tag = ResumeCheckpointTag(options.resume_dir);
    if (tag.ok()) {
      LoadOptions lo;
      lo.tag = *tag;
      // next_step drives the data order; checked inside Load, so that a bad value fails every rank at once
      // (a negative one aborted the run, one that did not parse on one rank stalled the others).
      lo.check_trainer_state = [](const TrainerState& ts) -> Status {
        StatusOr<int64_t> next = TrainerStateInt(ts, "next_step", 0, kMaxResumeStep);
        if (absl::IsNotFound(next.status())) {
          return absl::InvalidArgumentError(absl::StrCat(next.status().message(), " (not saved by zero-gpt)"));
        }
        ZERO_RETURN_IF_ERROR(next.status());
        StatusOr<int64_t> samples = TrainerStateInt(ts, "samples", 0, kMaxResumeSamples);
        return absl::IsNotFound(samples.status()) ? absl::OkStatus() : samples.status();
      };
      StatusOr<LoadResult> r = run.engine->Load(options.resume_dir, lo);
      if (!r.ok()) {
        return Status(r.status().code(),
                      absl::StrCat("--resume ", PrintableName(options.resume_dir), ": ", r.status().message()));
      }
      ZERO_ASSIGN_OR_RETURN(run.first_step, TrainerStateInt(r->trainer_state, "next_step", 0, kMaxResumeStep));
      StatusOr<int64_t> stride = TrainerStateInt(r->trainer_state, "sample_stride", 1, kMaxResumeSamples);
      if (stride.ok()) run.data.set_stride(*stride);
      StatusOr<int64_t> samples = TrainerStateInt(r->trainer_state, "samples", 0, kMaxResumeSamples);
      if (samples.ok()) {
        run.first_sample = *samples;
      } else {
        // A checkpoint of a zero-gpt that had no cursor: its steps each took this run's global batch, unless the
        // world or the batch changed since.
        run.first_sample = run.first_step * B * run.engine->world_size() * ga;
        if (run.engine->rank() == 0) {
          ZERO_LOG(WARNING) << "--resume: " << r->tag << " has no data cursor (trainer state \"samples\"); assuming "
                            << "each of its " << run.first_step << " steps trained this run's global batch of "
                            << B * run.engine->world_size() * ga << " samples";
        }
      }
      if (run.engine->rank() == 0) {
        ZERO_LOG(INFO) << "resumed from " << options.resume_dir << "/" << r->tag << " (saved at world size "
                       << r->saved_world_size << ", stage " << r->saved_stage << "): continuing at step "
                       << run.first_step << ", sample " << run.first_sample;
      }
    } else if (absl::IsNotFound(tag.status())) {
      if (run.engine->rank() == 0) {
        ZERO_LOG(INFO) << "--resume " << options.resume_dir << ": no checkpoint there yet; starting at step 0";
      }
    } else {
      return Status(tag.status().code(),
                    absl::StrCat("--resume ", PrintableName(options.resume_dir), ": ", tag.status().message()));
    }
  }
  return run;
}

Status MaybeSave(Engine& engine, const TrainOptions& options, int64_t next_step, int64_t samples, int64_t stride,
                 TrainResult* result) {
  if (options.save_dir.empty()) return absl::OkStatus();
  const bool every = options.save_every > 0 && next_step % options.save_every == 0;
  if (!every && next_step != options.steps) return absl::OkStatus();
  SaveOptions so;
  so.tag = absl::StrFormat("step-%08d", next_step);
  so.trainer_state["next_step"] = absl::StrCat(next_step);
  so.trainer_state["samples"] = absl::StrCat(samples);       // the data cursor: a resume reads on from here
  so.trainer_state["sample_stride"] = absl::StrCat(stride);  // how the data's keys cut the stream
  so.async = options.save_async;
  so.writer_priority = options.save_priority;
  so.max_write_bytes_per_s = options.save_bytes_per_s;
  so.save_qgz_residuals = options.save_qgz_residuals;
  const auto t0 = std::chrono::steady_clock::now();
  ZERO_ASSIGN_OR_RETURN(std::string tag, engine.Save(options.save_dir, so));
  result->save_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  result->saved.push_back(tag);
  return absl::OkStatus();
}

Status WaitForLastSave(Engine& engine, TrainResult* result) {
  const auto t0 = std::chrono::steady_clock::now();
  ZERO_RETURN_IF_ERROR(engine.WaitForSave());
  result->save_wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

StatusOr<std::vector<float>> FinalParams(Engine& engine, const GptUnits& units) {
  std::vector<UnitId> order = {units.root};
  order.insert(order.end(), units.blocks.begin(), units.blocks.end());
  std::vector<float> out;
  for (UnitId u : order) {
    for (const auto& p : engine.UnitParams(u)) {
      ZERO_ASSIGN_OR_RETURN(std::vector<float> v, engine.GatherParam(u, p.name));
      out.insert(out.end(), v.begin(), v.end());
    }
  }
  return out;
}

}  // namespace internal

namespace {

using internal::GatherReports;

// The model's math is fp32. Under fp16/bf16 the engine hands out 16-bit parameters and gradient buffers: the
// trainer computes on an fp32 copy of the (rounded) 16-bit weights and adds its fp32 gradients, times the
// loss scale, into the 16-bit gradient buffer — the 16-bit tensors are exactly what a 16-bit trainer would
// see and produce.
class UnitWork {
 public:
  UnitWork(MemoryTracker* tracker, int64_t numel, DType dtype) : numel_(numel), dtype_(dtype) {
    if (dtype_ != DType::kF32) {
      w_ = Buffer::Host(tracker, MemTag::kStaging, numel * 4);
      g_ = Buffer::Host(tracker, MemTag::kStaging, numel * 4);
    }
  }
  const float* Weights(const UnitScope& s) {
    if (dtype_ == DType::kF32) return static_cast<const float*>(s.param_base());
    ConvertBuffer(s.param_base(), dtype_, w_.data(), DType::kF32, numel_);
    return w_.as<float>();
  }
  float* Grads(const UnitScope& s) {
    if (dtype_ == DType::kF32) return static_cast<float*>(s.grad_base());
    std::memset(g_.data(), 0, numel_ * 4);
    return g_.as<float>();
  }
  void Flush(const UnitScope& s, double loss_scale) {
    if (dtype_ == DType::kF32) return;
    void* g16 = s.grad_base();
    const float* g = g_.as<float>();
    const float scale = static_cast<float>(loss_scale);
    for (int64_t i = 0; i < numel_; ++i) StoreFromF32(g16, dtype_, i, LoadAsF32(g16, dtype_, i) + scale * g[i]);
  }

 private:
  int64_t numel_;
  DType dtype_;
  Buffer w_, g_;
};

}  // namespace

StatusOr<TrainResult> TrainRank(const Config& config, std::shared_ptr<Communicator> comm, const TrainOptions& options,
                                const std::function<void(const StepLog&)>& on_step, bool collect_final_params) {
  ZERO_ASSIGN_OR_RETURN(GptConfig mc, GptConfig::FromName(options.model));
  const int T = options.seq > 0 ? options.seq : mc.max_seq;
  if (T > mc.max_seq) {
    return absl::InvalidArgumentError(absl::StrCat("--seq ", T, " exceeds the model's max_seq ", mc.max_seq));
  }
  const int rank = comm->rank(), world = comm->world_size();
  const int local = std::max(1, options.local_world_size);
  SetBlasThreads(options.blas_threads > 0 ? options.blas_threads
                                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local));

  EngineOptions eopt;
  eopt.local_world_size = local;
  ZERO_ASSIGN_OR_RETURN(internal::GptRun run, internal::OpenRun(config, comm, eopt, mc, options));
  const std::unique_ptr<Engine>& engine = run.engine;
  const Config& cfg = engine->config();
  const int B = run.micro_batch, ga = run.accumulation_steps;
  const DType dtype = run.dtype;
  const internal::GptUnits& units = run.units;
  const UnitId root = units.root;
  const std::vector<UnitId>& blocks = units.blocks;
  ByteDataset& data = run.data;

  // Activations come from the Checkpointer's arena (a stack): per micro-step the residual stream x and its
  // gradient dx at the bottom, then each block's saved activations (kept, or only its input with
  // recomputation), then the head's; freed in reverse. One segment per block.
  ZERO_ASSIGN_OR_RETURN(CheckpointerOptions copt, CheckpointerOptions::FromConfig(cfg, mc.layers, options.recompute));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Checkpointer> ckpt, Checkpointer::Create(&engine->memory_tracker(), copt));
  ActivationArena& arena = ckpt->arena();
  std::vector<BlockActs> acts(mc.layers);
  HeadActs head;
  BlockScratch scratch;
  const size_t stream_bytes = static_cast<size_t>(B) * T * mc.channels * sizeof(float);
  // Block l's forward as a segment: input and output are the residual stream (in place; the Checkpointer saves
  // the input before the block overwrites it). `w` comes from the scope the call runs in: the forward scope,
  // or in backward the backward scope (with stage 3 the recompute uses the parameters that scope gathered).
  auto block_forward = [&](int l, const BlockWeights& w) {
    return [&, l, w](SegmentContext& c) {
      acts[l].Bind(mc, B, T, c.Allocate(BlockActs::Bytes(mc, B, T)));
      BlockForward(mc, w, c.input<float>(0), c.output<float>(0), &acts[l]);
    };
  };
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  MemoryTracker& tracker = engine->memory_tracker();
  UnitWork root_work(&tracker, UnitNumel(RootParams(mc)), dtype);
  UnitWork block_work(&tracker, UnitNumel(BlockParams(mc)), dtype);

  TrainResult result;
  result.params = engine->num_params();
  ReplicaGroups* live = options.live;
  if (live != nullptr) {
    ZERO_RETURN_IF_ERROR(live->Join(*engine));
    data.set_stride(static_cast<int64_t>(B) * live->launched_world_size() * ga);  // every group alike
    run.first_step = engine->steps();  // a group that rejoins continues where the others are
  }
  result.first_step = run.first_step;
  int64_t samples = run.first_sample;  // the data cursor: global samples trained before `step`
  for (int64_t step = run.first_step;; ++step) {
    if (live != nullptr) {
      ZERO_RETURN_IF_ERROR(live->AtStepBoundary(*engine));
      step = engine->steps();
      // The groups present changed the global batch step by step; the decisions in the store say how.
      samples = live->SamplesBefore(step, static_cast<int64_t>(B) * ga);
    }
    if (step >= options.steps) break;
    // Under live recovery the world is the groups present, and this rank's place in it.
    const int drank = live != nullptr ? live->world_rank() : rank,
              dworld = live != nullptr ? live->world_size() : world;
    internal::StepClock started;
    started.save_in_flight = engine->save_in_flight();
    double loss_sum = 0;
    for (int m = 0; m < ga; ++m) {
      // Micro-step m of this step reads the samples [(m*world + rank)*B, +B) past the cursor: the same samples a
      // world-1 run with batch B*world*ga reads, whatever the split.
      data.Batch(samples + (static_cast<int64_t>(m) * dworld + drank) * B, B, T, tokens.data(), targets.data());
      ZERO_ASSIGN_OR_RETURN(UnitScope rs, engine->Backward(root));  // root: whole forward + backward
      const RootWeights rw = RootWeightsFromFlat(mc, root_work.Weights(rs));
      const RootGrads rg = RootGradsFromFlat(mc, root_work.Grads(rs));
      const ActivationArena::Mark pass_mark = arena.mark();
      float* x = static_cast<float*>(arena.Allocate(stream_bytes));
      float* dx = static_cast<float*>(arena.Allocate(stream_bytes));
      EmbeddingForward(mc, rw, tokens.data(), B, T, x);
      for (int l = 0; l < mc.layers; ++l) {
        ZERO_ASSIGN_OR_RETURN(UnitScope s, engine->Forward(blocks[l]));
        const BlockWeights w = BlockWeightsFromFlat(mc, block_work.Weights(s));
        ZERO_RETURN_IF_ERROR(ckpt->Forward(l, {{x, stream_bytes}}, {{x, stream_bytes}}, block_forward(l, w)));
        ZERO_RETURN_IF_ERROR(s.Close());
      }
      const ActivationArena::Mark head_mark = arena.mark();
      head.Bind(mc, B, T, arena.Allocate(HeadActs::Bytes(mc, B, T)));
      loss_sum += HeadForward(mc, rw, x, targets.data(), &head);
      HeadBackward(mc, rw, rg, &head, dx);
      ZERO_RETURN_IF_ERROR(arena.Release(head_mark));
      for (int l = mc.layers - 1; l >= 0; --l) {
        ZERO_ASSIGN_OR_RETURN(UnitScope s, engine->Backward(blocks[l]));
        const BlockWeights w = BlockWeightsFromFlat(mc, block_work.Weights(s));
        const BlockGrads g = BlockGradsFromFlat(mc, block_work.Grads(s));
        ZERO_RETURN_IF_ERROR(ckpt->Backward(l, block_forward(l, w), [&](SegmentContext& c) {
          scratch.Bind(mc, B, T, c.Allocate(BlockScratch::Bytes(mc, B, T)));
          BlockBackward(mc, w, g, acts[l], dx, dx, &scratch);
        }));
        block_work.Flush(s, engine->loss_scale());
        ZERO_RETURN_IF_ERROR(s.Close());
      }
      EmbeddingBackward(mc, rg, tokens.data(), B, T, dx);
      ZERO_RETURN_IF_ERROR(arena.Release(pass_mark));
      root_work.Flush(rs, engine->loss_scale());
      ZERO_RETURN_IF_ERROR(rs.Close());
    }
    StatusOr<StepResult> stepped = engine->Step();
    if (!stepped.ok() && live != nullptr) {
      // Another group was lost: the step was dropped here and runs again in the groups left (any other error
      // is this group's own, and ends this rank).
      ZERO_RETURN_IF_ERROR(live->Recover(*engine, stepped.status()));
      ++result.live_redone_steps;
      continue;
    }
    ZERO_ASSIGN_OR_RETURN(StepResult r, std::move(stepped));
    float loss = static_cast<float>(loss_sum / ga);
    {
      // The mean over this rank's communicator: under live recovery its group's ranks.
      CommLabel label(comm.get(), "zero-gpt: mean loss");
      ZERO_RETURN_IF_ERROR(comm->AllReduce(&loss, 1, DType::kF32, ReduceOp::kAvg).Wait());
    }
    const int reporter = live != nullptr ? live->world_rank() : rank;
    samples += static_cast<int64_t>(B) * dworld * ga;  // a skipped step (fp16 overflow) consumed its samples too
    internal::RecordStep(step, loss, r, started, static_cast<double>(B) * T * dworld * ga, samples, reporter, on_step,
                         &result);
    if (live == nullptr)
      ZERO_RETURN_IF_ERROR(internal::MaybeSave(*engine, options, step + 1, samples, data.stride(), &result));
  }
  if (live != nullptr) {
    result.live_history = live->history();
    ZERO_RETURN_IF_ERROR(live->Leave());
  }
  ZERO_RETURN_IF_ERROR(internal::WaitForLastSave(*engine, &result));
  // UnitWork's fp32 copies of 16-bit weights and gradients are the trainer's, in the host tier.
  const int64_t unit_work = dtype == DType::kF32 ? 0 : 8 * (UnitNumel(RootParams(mc)) + UnitNumel(BlockParams(mc)));
  internal::RecordEngineStats(*engine, units, &result, {unit_work, 0});
  result.recompute = ckpt->stats();
  ZERO_ASSIGN_OR_RETURN(result.all_ranks,
                        GatherReports(world, result.memory, [&](const float* send, float* recv, size_t n) {
                          return comm->AllGather(send, recv, n, DType::kF32).Wait();
                        }));
  if (collect_final_params) {
    ZERO_ASSIGN_OR_RETURN(result.final_params, internal::FinalParams(*engine, units));
  }
  return result;
}

StatusOr<std::vector<TrainResult>> RunThreadRanks(int world, const Config& cfg, const TrainOptions& options,
                                                  const std::function<void(const StepLog&)>& on_step) {
  auto store = Store::Hash();
  std::vector<StatusOr<TrainResult>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      CommOptions copt;
      copt.timeout = absl::Seconds(cfg.comm_timeout_s);
      copt.hostname = "127.0.0.1";
      auto comm = Communicator::CreateGloo(store, r, world, copt);
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      results[r] = TrainRank(cfg, std::move(*comm), options, r == 0 ? on_step : std::function<void(const StepLog&)>());
    });
  }
  for (auto& t : threads) t.join();
  std::vector<TrainResult> out;
  for (int r = 0; r < world; ++r) {
    if (!results[r].ok()) {
      return absl::Status(results[r].status().code(), absl::StrCat("rank ", r, ": ", results[r].status().message()));
    }
    out.push_back(std::move(*results[r]));
  }
  return out;
}

}  // namespace zero::gpt
