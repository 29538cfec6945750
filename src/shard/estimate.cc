// shard/estimate.cc — zero::Estimate (zero/estimate.h): a rank's bytes by tag and tier, and its collectives per
// step, from the placement plan and its bound on the true peak, the functions the engine itself allocates and
// bounds by (shard/internal/plan.h). Nothing here re-derives a placement rule: what the plan lists is the model
// state, what TruePeakBound counts is the transient, and this file only sorts them into the tags the engine's
// report uses.
#include "zero/estimate.h"

#include <algorithm>
#include <array>
#include <memory>
#include <numeric>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/internal/format.h"
#include "comm/internal/gloo_staging.h"
#include "comm/internal/op.h"
#include "io/internal/io_engine.h"
#include "shard/internal/plan.h"
#include "zero/optimizer.h"

namespace zero {

const char* CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kAllToAll: return "all_to_all";
  }
  return "?";
}

int64_t RankEstimate::BytesSentPerStep() const {
  int64_t total = 0;
  for (const CollectiveEstimate& c : comm) total += c.bytes_sent;
  return total;
}

std::string RankEstimate::MemoryJson() const {
  // The naming rule of MemoryReport::ToJson (what zero-gpt --json prints), with one figure per tag.
  std::ostringstream os;
  os << "{";
  for (size_t g = 0; g < static_cast<size_t>(MemTag::kCount); ++g) {
    for (size_t t = 0; t < static_cast<size_t>(MemTier::kCount); ++t) {
      const int64_t bytes = memory.usage[t][g].peak;
      if (bytes == 0) continue;
      std::string name = MemTagName(static_cast<MemTag>(g));
      if (t == static_cast<size_t>(MemTier::kDevice) && memory.usage[0][g].peak != 0) name += "@device";
      if (t == static_cast<size_t>(MemTier::kNvme) && (memory.usage[0][g].peak != 0 || memory.usage[1][g].peak != 0)) {
        name += "@nvme";
      }
      os << "\"" << name << "\": {\"tier\": \"" << MemTierName(static_cast<MemTier>(t)) << "\", \"bytes\": " << bytes;
      if (floor.usage[t][g].peak != bytes) os << ", \"min_bytes\": " << floor.usage[t][g].peak;
      os << "}, ";
    }
  }
  os << "\"peak_total\": {\"host\": " << memory.PeakTotal(MemTier::kHost)
     << ", \"device\": " << memory.PeakTotal(MemTier::kDevice);
  if (memory.PeakTotal(MemTier::kNvme) != 0) os << ", \"nvme\": " << memory.PeakTotal(MemTier::kNvme);
  os << "}}";
  return os.str();
}

std::string RankEstimate::CommJson() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < comm.size(); ++i) {
    const CollectiveEstimate& c = comm[i];
    os << (i ? ", " : "") << "{\"what\": \"" << c.what << "\", \"kind\": \"" << CollectiveKindName(c.kind)
       << "\", \"dtype\": \"" << DTypeName(c.dtype) << "\", \"calls\": " << c.calls << ", \"elements\": " << c.elements
       << ", \"bytes_sent\": " << c.bytes_sent << "}";
  }
  os << "]";
  return os.str();
}

namespace {

// The bytes of one rank's qgZ record of each part of a unit's reduction: the whole shard, or each chunk.
std::vector<int64_t> QgzRecords(const internal::PlanPolicy& p, const internal::UnitPlan& u) {
  if (u.qgz_chunks.chunks() == 0) return {internal::QgzUnitRecordBytes(p, u)};
  std::vector<int64_t> r;
  for (int64_t k = 0; k < u.qgz_chunks.chunks(); ++k) r.push_back(u.qgz_chunks.bytes(k));
  return r;
}

// The collectives of one step (docs/internals/design.md, "The step" and "Gradient reduction"): stage-3 units are
// gathered once per scope; gradients are all-reduced (stage 0) or reduce-scattered (stages 1-3) once per step, or every
// micro-step where the plan reduces every micro-step; full parameters (stages 1-2, persistent stage-3 units) are
// refreshed by an all-gather after the update. Frozen units are gathered but neither reduced nor refreshed.
std::vector<CollectiveEstimate> StepCollectives(const internal::StagePlan& plan, const std::vector<EstimateUnit>& units,
                                                int replicas) {
  const internal::PlanPolicy& p = plan.policy;
  const int64_t N = p.world, ga = p.accumulation_steps;
  const int64_t cds = static_cast<int64_t>(DTypeSize(p.compute)), ws = static_cast<int64_t>(DTypeSize(p.wire));
  CollectiveEstimate gathers{"stage-3 gathers", CollectiveKind::kAllGather, p.compute};
  CollectiveEstimate hpz_gathers{"hpZ backward gathers", CollectiveKind::kAllGather, p.compute};
  CollectiveEstimate rs{"gradient reduce-scatter", CollectiveKind::kReduceScatter, p.wire};
  CollectiveEstimate ar{"gradient all-reduce", CollectiveKind::kAllReduce, p.wire};
  CollectiveEstimate refresh{"parameter refresh", CollectiveKind::kAllGather, p.compute};
  // Hybrid sharding: each gradient shard averaged across its replicas once per step (ShardedStep), in two parts
  // under offload (the host part and the rest).
  CollectiveEstimate across{"gradient all-reduce across replicas", CollectiveKind::kAllReduce, DType::kF32};
  // qgZ: records moved as 16-bit words (shard/internal/qgz.h); `elements` counts the words sent to each peer.
  CollectiveEstimate qgz1{"qgZ all-to-all", CollectiveKind::kAllToAll, DType::kF16};
  CollectiveEstimate qgz2{"qgZ across hosts", CollectiveKind::kAllToAll, DType::kF16};
  const int64_t R = replicas;
  auto add = [](CollectiveEstimate& c, int64_t calls, int64_t count, int64_t bytes_per_call) {
    c.calls += calls;
    c.elements += calls * count;
    c.bytes_sent += calls * bytes_per_call;
  };
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const internal::UnitPlan& u = plan.units[i];
    const int64_t S = u.shard;
    if (u.sharded_params) {
      // qwZ: every gather, forward and backward, moves the int8 messages (a chunked one, every chunk's); hpZ: the
      // backward gather runs in the host group over the secondary copy (padded / H per rank).
      const int64_t forwards = (units[i].scopes_per_pass - 1) * ga;
      const int64_t message = p.qwz_block == 0            ? S * cds
                              : u.qwz_chunks.chunks() > 0 ? u.qwz_chunks.total()
                                                          : internal::QwzUnitMessageBytes(p, u);
      add(gathers, forwards, S, (N - 1) * message);
      if (p.hpz > 1 && forwards > 0) {  // a unit with no forward scope has no fresh secondary copy
        add(hpz_gathers, ga, u.padded / p.hpz, (p.hpz - 1) * (u.padded / p.hpz) * cds);
      } else {
        add(gathers, ga, S, (N - 1) * message);
      }
    }
    if (u.frozen) continue;
    const int64_t reductions = p.ReduceEveryMicroStep() ? ga : 1;
    if (p.stage == 0) {
      add(ar, 1, u.padded, 2 * (N - 1) * u.padded / N * ws);
    } else if (internal::QgzOn(p)) {
      // One call per reduction, a chunked one's records summed over its chunks (as a chunked gather or reduce-scatter
      // counts once).
      const int64_t L = p.qgz_local, M = N / L;
      const std::vector<int64_t> parts = QgzRecords(p, u);
      const int64_t rec = std::accumulate(parts.begin(), parts.end(), int64_t{0});
      add(qgz1, reductions, M * rec / 2, (L - 1) * M * rec);
      if (M > 1) add(qgz2, reductions, rec / 2, (M - 1) * rec);
    } else {
      add(rs, reductions, S, (N - 1) * S * ws);
    }
    if (p.stage >= 1 && !u.sharded_params) add(refresh, 1, S, (N - 1) * S * cds);
    if (R > 1) {
      across.dtype = u.grad_shard_dtype;
      const int64_t gs = static_cast<int64_t>(DTypeSize(u.grad_shard_dtype)), hn = std::min(S, u.host_n);
      for (const int64_t part : {hn, S - hn}) {
        if (part > 0) add(across, 1, part, 2 * (R - 1) * part * gs / R);
      }
    }
  }
  std::vector<CollectiveEstimate> out;
  for (CollectiveEstimate* c : {&gathers, &hpz_gathers, &rs, &qgz1, &qgz2, &ar, &refresh, &across}) {
    if (c->calls > 0) out.push_back(std::move(*c));
  }
  return out;
}

// The bytes rank `world_rank` sends per step to ranks of its host ([0]) and of other hosts ([1]): every
// collective the engine issues in a step (the ones StepCollectives lists, qwZ's int8 gathers, hpZ's
// backward gathers in the host group, the step's norm and desync-check all-reduces of 3 and 32 floats) through
// the same message-by-message model of Gloo's algorithms the communicator counts with (AddGlooSends), so it is
// what StepResult::intra_host_bytes / inter_host_bytes report on the host engine (tested equal at stages 0-3,
// power-of-two groups; the trainer's own collectives are not included).
std::array<int64_t, 2> HostTraffic(const internal::StagePlan& plan, const std::vector<EstimateUnit>& units,
                                   const Config& cfg, int world, int world_rank, int ranks_per_host, int hpz,
                                   bool fingerprints) {
  const internal::PlanPolicy& p = plan.policy;
  const int N = p.world, R = world / N, me = world_rank, host = me / ranks_per_host;
  const int64_t ga = p.accumulation_steps;
  std::array<int64_t, 2> out{0, 0};
  // `calls` ops of `kind` on a communicator of `n` ranks, its rank i being world rank rank_of(i).
  auto add = [&](internal::OpKind kind, DType dtype, int64_t count, int64_t calls, int n, int rank, auto rank_of) {
    if (n <= 1 || calls <= 0 || count <= 0) return;
    std::vector<int64_t> to(static_cast<size_t>(n), 0);
    internal::OpDesc d{.kind = kind, .dtype = dtype, .count = static_cast<uint64_t>(count)};
    internal::AddGlooSends(d, n, rank, fingerprints, &to);
    for (int i = 0; i < n; ++i) out[rank_of(i) / ranks_per_host == host ? 0 : 1] += calls * to[i];
  };
  auto group_of = [&](int i) { return me / N * N + i; };
  auto replica_of = [&](int i) { return i * N + me % N; };
  auto hpz_of = [&](int i) { return me / hpz * hpz + i; };
  const int grank = me % N;
  using K = internal::OpKind;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const internal::UnitPlan& u = plan.units[i];
    const int64_t S = u.shard;
    if (u.sharded_params) {
      const int64_t forwards = (units[i].scopes_per_pass - 1) * ga, backwards = ga;
      // qwZ quantizes every gather, forward and backward (shard/gather.cc): one message, or one per chunk.
      auto gather = [&](int64_t calls) {
        if (p.qwz_block > 0 && u.qwz_chunks.chunks() > 0) {
          for (int64_t k = 0; k < u.qwz_chunks.chunks(); ++k) {
            add(K::kAllGather, DType::kF16, u.qwz_chunks.bytes(k) / 2, calls, N, grank, group_of);
          }
        } else if (p.qwz_block > 0) {
          add(K::kAllGather, DType::kF16, internal::QwzUnitMessageBytes(p, u) / 2, calls, N, grank, group_of);
        } else {
          add(K::kAllGather, p.compute, S, calls, N, grank, group_of);
        }
      };
      gather(forwards);
      if (hpz > 1 && forwards > 0) {
        // hpZ: the backward gathers the unit's secondary shards (padded / H each) inside the host group; a unit
        // whose only scope is a backward one (scopes_per_pass 1) has no forward gather to copy from.
        add(K::kAllGather, p.compute, u.padded / hpz, backwards, hpz, me % hpz, hpz_of);
      } else {
        gather(backwards);
      }
    }
    if (u.frozen) continue;
    const int64_t reductions = p.ReduceEveryMicroStep() ? ga : 1;
    if (p.stage == 0) {
      add(K::kAllReduce, p.wire, u.padded, 1, N, grank, group_of);
    } else if (internal::QgzOn(p)) {
      // qgZ: inside the host group of L (the shard group in one hop), then across the M ranks of this local index;
      // a unit above reduce_bucket_size, chunk by chunk.
      const int L = p.qgz_local, M = N / L;
      for (const int64_t Rb : QgzRecords(p, u)) {
        add(K::kAllToAll, DType::kF16, M * Rb / 2, reductions, L, grank % L,
            [&](int i) { return group_of(grank / L * L + i); });
        add(K::kAllToAll, DType::kF16, Rb / 2, reductions, M, grank / L,
            [&](int i) { return group_of(i * L + grank % L); });
      }
    } else {
      add(K::kReduceScatter, p.wire, S, reductions, N, grank, group_of);
    }
    if (p.stage >= 1 && !u.sharded_params) add(K::kAllGather, p.compute, S, 1, N, grank, group_of);
    if (R > 1) {
      const int64_t hn = std::min(S, u.host_n);
      for (const int64_t part : {hn, S - hn}) add(K::kAllReduce, u.grad_shard_dtype, part, 1, R, me / N, replica_of);
    }
  }
  add(K::kAllReduce, DType::kF32, 3, 1, N, grank, group_of);   // the gradient norm (ShardedStep::GradNorm)
  add(K::kAllReduce, DType::kF32, 32, 1, N, grank, group_of);  // the desync check (ShardedStep::CheckInSync)
  return out;
}

// Model state from the plan (exactly what Finalize allocates, offload's copy-back staging included), the pools by
// the tag they allocate under (shard/internal/gather.h, grad_reducer.h, step.h) — gathers kGather; buckets, wire
// copies, reduce-scatter outputs and reduction chunks kBuckets; low-communication full gradients kGrads;
// all-gather chunk staging and the communicator's cache kStaging — and the trainer's bytes by their own tags.
MemoryReport ByTag(const internal::StagePlan& plan, const std::array<internal::PeakTerms, 2>& terms,
                   const std::vector<TrainerBytes>& trainer) {
  MemoryReport r = plan.Report();
  auto add = [&r](MemTier tier, MemTag tag, int64_t bytes) {
    MemoryUsage& m = r.usage[static_cast<size_t>(tier)][static_cast<size_t>(tag)];
    m.current += bytes;
    m.peak = m.current;
  };
  for (MemTier tier : {MemTier::kHost, MemTier::kDevice}) {
    const internal::PeakTerms& t = terms[static_cast<size_t>(tier)];
    add(tier, MemTag::kGather, t.gathers);
    add(tier, MemTag::kBuckets, t.reductions - t.full_grads);
    add(tier, MemTag::kGrads, t.full_grads);
    add(tier, MemTag::kStaging, t.staging);
    r.peak_total[static_cast<size_t>(tier)] = t.total();
  }
  // The NVMe tier holds model state only (file regions, allocated once at Finalize).
  r.peak_total[static_cast<size_t>(MemTier::kNvme)] = r.Current(MemTier::kNvme);
  for (const TrainerBytes& t : trainer) add(t.tier, t.tag, t.bytes);
  return r;
}

// What Engine::Impl::StartAsyncSave keeps (shard/checkpoint.cc): the rank file's image (the header, then every
// saved stream of every unit over the elements this rank owns) in one buffer with an alignment's slack, and the I/O
// engine's staging buffers.
int64_t AsyncSaveStaging(const internal::StagePlan& plan, const Config& cfg) {
  const internal::PlanPolicy& p = plan.policy;
  const bool stochastic = p.compute == DType::kBF16 && cfg.bf16.stochastic_rounding;
  int64_t file = ckpt::kRankHeaderBytes;
  for (const internal::UnitPlan& u : plan.units) {
    const int64_t begin = static_cast<int64_t>(p.rank) * u.shard;
    const int64_t owned = std::clamp<int64_t>(u.numel - begin, 0, u.shard);
    int64_t per_elem = 0;
    if (!u.frozen) per_elem += 4 * (1 + p.optimizer_states);                             // master and each state, fp32
    if (u.frozen || stochastic) per_elem += static_cast<int64_t>(DTypeSize(p.compute));  // the 16-bit parameters
    file += owned * per_elem;
  }
  const io::IoOptions io = io::IoOptionsFromConfig(cfg);
  return file + io.alignment + static_cast<int64_t>(io.queue_depth) * io.block_size;
}

}  // namespace

StatusOr<RankEstimate> Estimate(const Config& config, const std::vector<EstimateUnit>& units,
                                const EstimateOptions& options) {
  const int world = options.world;
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("Estimate: world must be >= 1, got ", world));
  if (options.rank < 0 || options.rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("Estimate: rank ", options.rank, " is not in [0, world ", world, ")"));
  }
  if (options.shard_group < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Estimate: shard_group must be >= 0, got ", options.shard_group));
  }
  if (units.empty()) return absl::InvalidArgumentError("Estimate: no units");
  std::vector<int64_t> numels;
  std::vector<bool> frozen;
  std::vector<std::vector<internal::ExactParam>> params;
  for (const EstimateUnit& u : units) {
    int64_t numel = 0;
    for (const ParamSpec& ps : u.params) {
      if (ps.numel() <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("Estimate: unit \"", u.name, "\", parameter \"", ps.name, "\" has ", ps.numel(), " elements"));
      }
      numel += ps.numel();
    }
    params.push_back(internal::ExactParams(u.params));
    if (!u.params.empty() && u.numel != 0 && u.numel != numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("Estimate: unit \"", u.name, "\" has numel ", u.numel, " but its params add up to ", numel));
    }
    if (u.params.empty()) numel = u.numel;
    if (numel <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("Estimate: unit \"", u.name, "\" has ", numel, " elements"));
    }
    if (u.scopes_per_pass < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("Estimate: unit \"", u.name, "\": scopes_per_pass must be >= 1, got ", u.scopes_per_pass));
    }
    numels.push_back(numel);
    frozen.push_back(u.frozen);
  }
  for (const TrainerBytes& t : options.trainer) {
    if (t.bytes < 0 || t.tag >= MemTag::kCount || t.tier >= MemTier::kCount) {
      return absl::InvalidArgumentError(absl::StrCat("Estimate: trainer bytes ", t.bytes, " under tag ",
                                                     static_cast<int>(t.tag), ", tier ", static_cast<int>(t.tier)));
    }
  }
  // The engine validates the config at its world size (Engine::Create) before it plans: so does the estimate.
  Config cfg = config;
  if (options.shard_group > 0) cfg.zero.mics_shard_size = options.shard_group;
  ZERO_RETURN_IF_ERROR(cfg.Validate(world));
  // Hybrid sharding (docs/internals/design.md): the engine runs as at a world of G over its group, and all-reduces the
  // gradient shards across the R = world / G replicas.
  const int64_t mics = cfg.zero.mics_shard_size;
  const int group = mics > 0 && mics < world ? static_cast<int>(mics) : world;
  const int replicas = world / group;
  ZERO_ASSIGN_OR_RETURN(internal::PlanPolicy policy,
                        internal::PlanPolicy::FromConfig(cfg, group, options.rank % group));
  if (policy.qgz_bits > 0) {  // as Engine::Create splits qgZ's hops
    policy.qgz_local = internal::QgzLocalRanks(group, std::max(1, options.ranks_per_host), replicas > 1);
  }
  if (options.optimizer_states >= 0) {
    policy.optimizer_states = options.optimizer_states;
  } else if (cfg.optimizer.has_value()) {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<ElementwiseOptimizer> opt, MakeOptimizer(*cfg.optimizer));
    policy.optimizer_states = static_cast<int>(opt->StateNames().size());
  } else {
    return absl::InvalidArgumentError(
        "optimizer: the config has no \"optimizer\" section; give one, or EstimateOptions::optimizer_states");
  }
  const internal::StagePlan plan = internal::MakePlan(policy, numels, {}, frozen, params);
  if (plan.param_too_large >= 0) {  // Finalize refuses it (Engine::Impl::CreateNvmeParamTier): so does the estimate
    const internal::UnitPlan& u = plan.units[static_cast<size_t>(plan.param_too_large)];
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_param.buffer_size: ", cfg.zero.offload_param.buffer_size,
        " elements with device \"nvme\", but unit \"", units[static_cast<size_t>(plan.param_too_large)].name,
        "\"'s parameter shard is ", u.shard, " elements; a staging buffer holds a whole shard"));
  }

  internal::PeakInputs in;
  in.open_elems = options.open_elements;
  for (const TrainerBytes& t : options.trainer) in.trainer_bytes[static_cast<size_t>(t.tier)] += t.bytes;
  if (options.backend == Backend::kGloo) {
    in.comm_cache_bytes = options.comm_cache_bytes >= 0 ? options.comm_cache_bytes : CommOptions{}.cache_bytes;
    in.rs_staging = [group](int64_t count, DType dtype, bool destructive) {
      return internal::GlooReduceScatterStagingBytes(group, static_cast<size_t>(count), dtype, destructive);
    };
    in.ar_staging = [group](int64_t count, DType dtype) {
      return internal::GlooAllReduceStagingBytes(group, static_cast<size_t>(count), dtype);
    };
    in.ag_strided = true;
    in.rs_strided = [group](int64_t count, DType dtype) {
      return internal::GlooSupportsReduceScatterStrided(group, static_cast<size_t>(count), dtype);
    };
    if (replicas > 1) {
      in.replica_ar_staging = [replicas](int64_t count, DType dtype) {
        return internal::GlooAllReduceStagingBytes(replicas, static_cast<size_t>(count), dtype);
      };
    }
  }
  std::array<internal::PeakTerms, 2> terms = internal::TruePeakBound(plan, in);
  const int64_t async_staging = options.async_save && options.rank < group ? AsyncSaveStaging(plan, cfg) : 0;
  terms[static_cast<size_t>(MemTier::kHost)].staging += async_staging;

  RankEstimate e;
  e.memory = ByTag(plan, terms, options.trainer);
  e.planned = plan.Report();
  for (MemTier tier : {MemTier::kHost, MemTier::kDevice}) {
    const internal::PeakTerms& t = terms[static_cast<size_t>(tier)];
    e.peak_bound[static_cast<size_t>(tier)] = PeakBound{t.model_state, t.gathers, t.reductions, t.staging, t.trainer};
  }
  // The same run with every reduction complete before the next scope opens: what overlap_comm's reductions add
  // when they are slow is the difference.
  internal::StagePlan serial = plan;
  serial.policy.overlap_comm = false;
  std::array<internal::PeakTerms, 2> serial_terms = internal::TruePeakBound(serial, in);
  serial_terms[static_cast<size_t>(MemTier::kHost)].staging += async_staging;
  e.floor = ByTag(serial, serial_terms, options.trainer);
  for (const internal::UnitPlan& u : plan.units) {
    e.params += u.numel;
    e.padded += u.padded;
    e.persistent_units += u.persistent ? 1 : 0;
  }
  e.micro_steps = policy.accumulation_steps;
  e.shard_group = group;
  e.comm = StepCollectives(plan, units, replicas);
  const int per_host = options.ranks_per_host > 0 ? options.ranks_per_host : 1;
  const std::array<int64_t, 2> host_bytes =
      HostTraffic(plan, units, cfg, world, options.rank, per_host,
                  static_cast<int>(std::max<int64_t>(1, cfg.zero.zero_hpz_partition_size)), options.check_order);
  e.intra_host_bytes = host_bytes[0];
  e.inter_host_bytes = host_bytes[1];
  return e;
}

}  // namespace zero
