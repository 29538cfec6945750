// zero-gpt: trains the reference GPT with zero's Engine.
//
//   zero-gpt --model tiny --steps 20 --world 4 --config ds_zero3.json --json
//   zero-run -n 4 -- zero-gpt --model small --config ds_zero2.json      # one rank per process
//   zero-gpt --model small --recompute --config ds.json   # recompute blocks (ds.json's activation_checkpointing)
//   zero-gpt --device cuda --model small --stage 3 --bf16  # on one GPU (NCCL, the CUDA engine)
//
// --world N runs N ranks as threads in one process (Gloo over loopback); under a launcher (RANK / WORLD_SIZE,
// OpenMPI or Slurm variables) it runs this process's rank. Without --config, an embedded default is used
// (stage 0 unless --stage is given; AdamW lr 1e-3; micro-batch 4).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model.h"
#include "progress.h"
#include "train.h"
#if ZERO_GPT_CUDA
#include "train_cuda.h"
#endif
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/logging.h"

namespace {

struct Flags {
  std::string config_path;
  std::string model = "tiny";
  int64_t steps = 20;
  uint64_t seed = 1234;
  int world = 1;
  int ranks_per_host = 0;  // 0: every thread-rank on one host; under a launcher, its ranks on this host
  int stage = -1;
  int seq = 0;
  bool json = false;
  bool recompute = false;
  bool bf16 = false;
  int blas_threads = 0;
  std::string data_file;
  std::string device = "cpu";
  std::string save_dir, resume_dir, init_from, init_map;
  int64_t save_every = 0;
  bool save_async = false;
  bool save_qgz_residuals = false;
  std::string save_priority = "idle";
  double save_rate_mb = 0;
  int64_t host_limit = 0;
  bool params_hash = false;
  bool live = false;
};

void Usage() {
  std::fprintf(stdout,
               "usage: zero-gpt [--config FILE] [--model tiny|small] [--steps K] [--seed S] [--world N]\n"
               "                [--stage 0-3] [--seq T] [--data FILE] [--recompute] [--blas-threads N] [--json]\n"
               "                [--device cpu|cuda] [--bf16] [--save DIR] [--save-every K] [--save-async]\n"
               "                [--save-priority idle|normal] [--save-rate MB/S] [--save-qgz-residuals]\n"
               "                [--resume DIR]\n"
               "                [--init-from FILE.safetensors] [--init-map FILE] [--params-hash] [--live]\n"
               "                [--host-limit BYTES] [--ranks-per-host L]\n"
               "  --device cuda  the model on the GPU and the engine's CUDA tier over NCCL: one rank on this\n"
               "               process's GPU (under a launcher: the GPU LOCAL_RANK); --world must be 1\n"
               "  --bf16       bf16 mixed precision (the config's bf16.enabled)\n"
               "  --ranks-per-host L  the ranks laid out host by host, L per host (EngineOptions::local_world_size;\n"
               "               default: --world's thread-ranks are one host, launched ranks the launcher's count,\n"
               "               LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or Slurm's tasks per node): what\n"
               "               StepResult counts as crossing hosts, and where ZeRO++'s hpZ and qgZ hops run\n"
               "  --recompute  recompute every block's activations in backward (every k-th with the config's\n"
               "               activation_checkpointing.number_checkpoints; checkpoints on the host with its\n"
               "               cpu_checkpointing); without it nothing is recomputed\n"
               "  --blas-threads N  OpenBLAS threads per process (default: cores / ranks on this host)\n"
               "  --save DIR   save a checkpoint (zero/checkpoint.h) every --save-every steps and after the last\n"
               "  --save-async each save returns once this rank's state is staged; the files are written in the\n"
               "               background while training goes on (zero/checkpoint.h, SaveOptions::async); on a CPU,\n"
               "               run with OPENBLAS_THREAD_TIMEOUT=4 so OpenBLAS's idle threads sleep rather than spin\n"
               "               on the cores the writer needs (docs/guide/checkpoints.md)\n"
               "  --save-priority idle|normal  the background writer's CPU priority (SaveOptions::writer_priority;\n"
               "               default idle: it runs on cores training leaves idle)\n"
               "  --save-rate MB/S  the background write at most this many MB (10^6 bytes) per second\n"
               "               (SaveOptions::max_write_bytes_per_s; default 0: as fast as the disk)\n"
               "  --save-qgz-residuals  each rank's ZeRO++ qgZ error-feedback residuals in the checkpoints too, so a\n"
               "               resume at the same world and --ranks-per-host is bit for bit (SaveOptions::\n"
               "               save_qgz_residuals; a whole model of compute-dtype bytes more per rank)\n"
               "  --resume DIR continue from DIR's latest checkpoint (at any world size and stage); --steps K is the\n"
               "               step to stop at, so a resumed run stops where the uninterrupted one does; a DIR\n"
               "               with no checkpoint starts at step 0, one with complete checkpoints but no usable\n"
               "               `latest` is an error naming the newest\n"
               "  --init-from FILE  initial weights from a safetensors file by \"unit.param\" name (zero-ckpt export\n"
               "               writes one); --init-map FILE: lines \"ours theirs\" renaming parameters\n"
               "  --params-hash  with --json: a 64-bit hash of every final fp32 parameter\n"
               "  --host-limit BYTES  a budget for each rank's host tier (MemoryTracker::SetLimit): an allocation\n"
               "               past it fails naming the budget, as on a machine with that much host memory\n"
               "  --live       live recovery across replica groups (zero/elastic.h) under zero-run --live-groups G,\n"
               "               G the config's mics_shard_size: a lost group's ranks restart and rejoin while the\n"
               "               others train on; with --json every rank prints its own final line (its hash and\n"
               "               the membership decisions it saw)\n");
}

// FNV-1a over fp32 parameters' bits: equal hashes, equal parameters.
uint64_t ParamsHash(const std::vector<float>& params) {
  uint64_t h = 1469598103934665603ull;
  for (float v : params) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    for (int k = 0; k < 4; ++k) h = (h ^ ((bits >> (8 * k)) & 0xFF)) * 1099511628211ull;
  }
  return h;
}

// --live: this process's rank in its replica group (zero/elastic.h). The progress comes from the first rank of
// the current world; with --json every rank ends with a line of its own: its final parameters' hash (equal
// across the groups) and the decisions it saw.
int RunLive(const zero::Config& cfg, zero::gpt::TrainOptions opt, const Flags& flags,
            const std::function<void(const zero::gpt::StepLog&)>& on_step) {
  auto groups = zero::ReplicaGroups::FromEnv(cfg);
  if (!groups.ok()) {
    std::fprintf(stderr, "zero-gpt: %s\n", zero::ErrorText(groups.status()).c_str());
    return 1;
  }
  opt.live = groups->get();
  opt.local_world_size = std::max(1, zero::Communicator::LaunchedLocalWorldSize());
  auto res = zero::gpt::TrainRank(cfg, (*groups)->group_comm(), opt, on_step, /*collect_final_params=*/true);
  if (!res.ok()) {
    if (res.status().code() == absl::StatusCode::kCancelled) {
      std::fprintf(stderr, "zero-gpt: %s\n", std::string(res.status().message()).c_str());
      return 0;  // the job finished before this group was admitted: nothing left to do
    }
    std::fprintf(stderr, "zero-gpt: %s\n", zero::ErrorText(res.status()).c_str());
    return 1;
  }
  if (flags.json) {
    std::string decisions;
    for (const zero::Membership& m : res->live_history) {
      if (!decisions.empty()) decisions += ", ";
      decisions += "{\"epoch\": " + std::to_string(m.epoch) + ", \"step\": " + std::to_string(m.step) +
                   ", \"groups\": " + std::to_string(m.groups.size()) +
                   ", \"after_failure\": " + (m.after_failure ? "true" : "false") + "}";
    }
    std::printf(
        "{\"live\": {\"group\": %d, \"steps\": %lld, \"first_step\": %lld, \"redone_steps\": %lld, "
        "\"params_hash\": \"%016llx\", \"decisions\": [%s]}}\n",
        (*groups)->group(), static_cast<long long>(flags.steps), static_cast<long long>(res->first_step),
        static_cast<long long>(res->live_redone_steps), static_cast<unsigned long long>(ParamsHash(res->final_params)),
        decisions.c_str());
  }
  return 0;
}

// What ParseFlags found: run, print the usage to stdout (--help), or a usage error (already said on stderr).
enum class Parsed { kRun, kHelp, kUsageError };

Parsed ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    // A flag's value is read only once the flag is known, so an unknown last flag is named as unknown.
    const bool has_value = i + 1 < argc;
    const char* v = has_value ? argv[i + 1] : "";
    bool takes_value = true;
    if (a == "--json") {
      f->json = true, takes_value = false;
    } else if (a == "--live") {
      f->live = true, takes_value = false;
    } else if (a == "--recompute") {
      f->recompute = true, takes_value = false;
    } else if (a == "--save-async") {
      f->save_async = true, takes_value = false;
    } else if (a == "--save-qgz-residuals") {
      f->save_qgz_residuals = true, takes_value = false;
    } else if (a == "--bf16") {
      f->bf16 = true, takes_value = false;
    } else if (a == "--params-hash") {
      f->params_hash = true, takes_value = false;
    } else if (a == "--help" || a == "-h") {
      return Parsed::kHelp;
    } else if (a == "--config") {
      f->config_path = v;
    } else if (a == "--model") {
      f->model = v;
    } else if (a == "--steps") {
      f->steps = std::atoll(v);
    } else if (a == "--seed") {
      f->seed = std::strtoull(v, nullptr, 10);
    } else if (a == "--world") {
      f->world = std::atoi(v);
    } else if (a == "--ranks-per-host") {
      f->ranks_per_host = std::atoi(v);
      if (has_value && f->ranks_per_host < 1) {
        std::fprintf(stderr, "zero-gpt: --ranks-per-host \"%s\": a positive integer\n", v);
        return Parsed::kUsageError;
      }
    } else if (a == "--stage") {
      f->stage = std::atoi(v);
    } else if (a == "--seq") {
      f->seq = std::atoi(v);
    } else if (a == "--blas-threads") {
      f->blas_threads = std::atoi(v);
    } else if (a == "--data") {
      f->data_file = v;
    } else if (a == "--device") {
      f->device = v;
    } else if (a == "--save") {
      f->save_dir = v;
    } else if (a == "--save-priority") {
      f->save_priority = v;
      if (has_value && f->save_priority != "idle" && f->save_priority != "normal") {
        std::fprintf(stderr, "zero-gpt: --save-priority \"%s\": one of idle, normal\n", v);
        return Parsed::kUsageError;
      }
    } else if (a == "--save-rate") {
      char* end = nullptr;
      f->save_rate_mb = std::strtod(v, &end);
      if (has_value && (end == v || *end != '\0' || !(f->save_rate_mb >= 0))) {
        std::fprintf(stderr, "zero-gpt: --save-rate \"%s\": MB per second, 0 or more\n", v);
        return Parsed::kUsageError;
      }
    } else if (a == "--save-every") {
      f->save_every = std::atoll(v);
    } else if (a == "--resume") {
      f->resume_dir = v;
    } else if (a == "--init-from") {
      f->init_from = v;
    } else if (a == "--init-map") {
      f->init_map = v;
    } else if (a == "--host-limit") {
      f->host_limit = std::atoll(v);
    } else {
      std::fprintf(stderr, "zero-gpt: unknown flag %s (zero-gpt --help for usage)\n", a.c_str());
      return Parsed::kUsageError;
    }
    if (takes_value && !has_value) {
      std::fprintf(stderr, "zero-gpt: %s needs a value (zero-gpt --help for usage)\n", a.c_str());
      return Parsed::kUsageError;
    }
    if (takes_value) ++i;
  }
  if (f->world >= 1 && f->steps >= 0 && (f->device == "cpu" || f->device == "cuda")) return Parsed::kRun;
  std::fprintf(stderr,
               "zero-gpt: --world must be at least 1, --steps at least 0, --device cpu or cuda "
               "(zero-gpt --help for usage)\n");
  return Parsed::kUsageError;
}

std::string MemoryJson(const std::vector<zero::MemoryReport>& ranks) {
  // Per tag, the largest rank's figures (by peak); per tier, the largest rank's true peak (peak_total).
  zero::MemoryReport worst;
  for (const auto& r : ranks) {
    for (size_t t = 0; t < r.usage.size(); ++t) {
      for (size_t g = 0; g < r.usage[t].size(); ++g) {
        auto& w = worst.usage[t][g];
        if (r.usage[t][g].peak > w.peak || (r.usage[t][g].peak == w.peak && r.usage[t][g].current > w.current)) {
          w = r.usage[t][g];
        }
      }
      worst.peak_total[t] = std::max(worst.peak_total[t], r.peak_total[t]);
    }
    worst.padding_bytes = std::max(worst.padding_bytes, r.padding_bytes);
  }
  return absl::StrCat("\"memory\": ", worst.ToJson(), ", \"padding_bytes\": ", worst.padding_bytes);
}

// The placement plan's bound on the true peak per tier (Engine::TruePeakBound; the same on every rank, whose
// buffers are alike), then its terms.
std::string PeakBoundJson(const std::array<zero::PeakBound, 2>& b) {
  auto terms = [](const zero::PeakBound& t) {
    return absl::StrCat("{\"model_state\": ", t.model_state, ", \"gathers\": ", t.gathers,
                        ", \"reductions\": ", t.reductions, ", \"staging\": ", t.staging, ", \"trainer\": ", t.trainer,
                        "}");
  };
  const zero::PeakBound &host = b[static_cast<size_t>(zero::MemTier::kHost)],
                        &device = b[static_cast<size_t>(zero::MemTier::kDevice)];
  return absl::StrCat("\"peak_bound\": {\"host\": ", host.total(), ", \"device\": ", device.total(),
                      "}, \"peak_bound_terms\": {\"host\": ", terms(host), ", \"device\": ", terms(device), "}");
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  switch (ParseFlags(argc, argv, &flags)) {
    case Parsed::kHelp: Usage(); return 0;
    case Parsed::kUsageError: return 2;
    case Parsed::kRun: break;
  }
  zero::Config cfg = zero::Config::Default();
  if (!flags.config_path.empty()) {
    auto c = zero::Config::FromJsonFile(flags.config_path);
    if (!c.ok()) {
      std::fprintf(stderr, "zero-gpt: %s\n", zero::ErrorText(c.status()).c_str());
      return 1;
    }
    cfg = *c;
  }
  if (flags.stage >= 0) cfg.zero.stage = flags.stage;
  if (flags.bf16) cfg.bf16.enabled = true;
  cfg.seed = flags.seed;
  const bool cuda = flags.device == "cuda";
#if !ZERO_GPT_CUDA
  if (cuda) {
    std::fprintf(stderr, "zero-gpt: --device cuda: this build has no CUDA (nvcc was not found at configure time)\n");
    return 2;
  }
#endif
  if (cuda && !zero::Communicator::Launched() && flags.world != 1) {
    std::fprintf(stderr, "zero-gpt: --device cuda runs one rank per GPU: use --world 1, or a launcher (zero-run)\n");
    return 2;
  }
  // One rank: on the CPU (Gloo) or the GPU (NCCL).
  using StepCallback = std::function<void(const zero::gpt::StepLog&)>;
  auto train_one = [&](std::shared_ptr<zero::Communicator> comm, const zero::gpt::TrainOptions& o,
                       const StepCallback& cb) -> zero::StatusOr<zero::gpt::TrainResult> {
#if ZERO_GPT_CUDA
    if (cuda) return zero::gpt::TrainRankCuda(cfg, std::move(comm), o, cb, flags.params_hash);
#endif
    return zero::gpt::TrainRank(cfg, std::move(comm), o, cb, flags.params_hash);
  };

  const bool launched = zero::Communicator::Launched();
  const int world = launched ? 0 : flags.world;
  zero::gpt::TrainOptions opt;
  opt.model = flags.model;
  opt.steps = flags.steps;
  opt.seed = flags.seed;
  opt.seq = flags.seq;
  opt.data_file = flags.data_file;
  opt.recompute = flags.recompute;
  opt.blas_threads = flags.blas_threads;
  opt.save_dir = flags.save_dir;
  opt.save_every = flags.save_every;
  opt.save_async = flags.save_async;
  opt.save_qgz_residuals = flags.save_qgz_residuals;
  opt.save_priority = flags.save_priority == "normal" ? zero::SaveOptions::WriterPriority::kNormal
                                                      : zero::SaveOptions::WriterPriority::kIdle;
  opt.save_bytes_per_s = static_cast<int64_t>(flags.save_rate_mb * 1e6);
  opt.host_limit = flags.host_limit;
  opt.resume_dir = flags.resume_dir;
  opt.init_from = flags.init_from;
  if (!flags.init_map.empty()) {
    std::ifstream in(flags.init_map);
    if (!in) {
      std::fprintf(stderr, "zero-gpt: --init-map: cannot read %s\n", flags.init_map.c_str());
      return 2;
    }
    std::string ours, theirs;
    while (in >> ours >> theirs) opt.init_map[ours] = theirs;
  }

  std::mutex print_mu;
  // Rank 0's progress: a line rewritten in place on a terminal, plain lines otherwise, nothing but JSON with --json.
  zero::gpt::Progress progress(stdout, zero::gpt::Progress::ModeFor(stdout, flags.json));
  auto on_step = [&](const zero::gpt::StepLog& s) {
    std::lock_guard<std::mutex> lock(print_mu);
    if (flags.json) {
      std::printf(
          "{\"step\": %lld, \"loss\": %.6f, \"grad_norm\": %.6f, \"step_ms\": %.3f, \"cpu_ms\": %.3f, "
          "\"tokens_per_s\": %.1f, \"bus_bytes\": {\"shard_group\": %lld, \"replicas\": %lld}, "
          "\"host_bytes\": {\"intra\": %lld, \"inter\": %lld}, \"samples\": %lld%s%s}\n",
          static_cast<long long>(s.step + 1), s.loss, s.grad_norm, s.step_ms, s.cpu_ms, s.tokens_per_s,
          static_cast<long long>(s.group_bytes), static_cast<long long>(s.replica_bytes),
          static_cast<long long>(s.intra_host_bytes), static_cast<long long>(s.inter_host_bytes),
          static_cast<long long>(s.samples), s.skipped ? ", \"skipped\": true" : "",
          s.save_in_flight ? ", \"save_in_flight\": true" : "");
      std::fflush(stdout);
    } else {
      progress.Step("", s.step + 1, flags.steps, s);
    }
  };

  if (flags.live) {
    if (!launched || cuda || !flags.save_dir.empty() || !flags.resume_dir.empty()) {
      std::fprintf(stderr,
                   "zero-gpt: --live runs one rank per process under a launcher (zero-run --live-groups G), on the "
                   "CPU, without --save/--resume (checkpoints with live recovery are not built)\n");
      return 2;
    }
    return RunLive(cfg, opt, flags, on_step);
  }
  std::vector<zero::StatusOr<zero::gpt::TrainResult>> results;
  int world_size = 1;
  if (launched) {
    zero::CommOptions copt;
    copt.timeout = absl::Seconds(cfg.comm_timeout_s);
    auto comm = zero::Communicator::FromEnv(cuda ? zero::Backend::kNccl : zero::Backend::kGloo, copt);
    if (!comm.ok()) {
      std::fprintf(stderr, "zero-gpt: %s\n", zero::ErrorText(comm.status()).c_str());
      return 1;
    }
    world_size = (*comm)->world_size();
    opt.local_world_size =
        flags.ranks_per_host > 0 ? flags.ranks_per_host : std::max(1, zero::Communicator::LaunchedLocalWorldSize());
    // The device NCCL's communicator took: the launcher's local rank, whichever launcher (LOCAL_RANK,
    // OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID).
    if (cuda) opt.device = (*comm)->cuda_device();
    std::shared_ptr<zero::Communicator> shared = std::move(*comm);
    const int rank = shared->rank();
    results.push_back(
        train_one(shared, opt, rank == 0 ? std::function<void(const zero::gpt::StepLog&)>(on_step) : nullptr));
    if (rank != 0) {
      if (!results[0].ok()) std::fprintf(stderr, "zero-gpt: %s\n", zero::ErrorText(results[0].status()).c_str());
      return results[0].ok() ? 0 : 1;
    }
  } else {
    world_size = world;
    opt.local_world_size = flags.ranks_per_host > 0 ? flags.ranks_per_host : world;
    auto store = zero::Store::Hash();
    results.resize(world, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        zero::CommOptions copt;
        copt.timeout = absl::Seconds(cfg.comm_timeout_s);
        copt.hostname = "127.0.0.1";
        auto comm = cuda ? zero::Communicator::CreateNccl(store, r, world, copt)
                         : zero::Communicator::CreateGloo(store, r, world, copt);
        if (!comm.ok()) {
          results[r] = comm.status();
          return;
        }
        results[r] = train_one(std::move(*comm), opt,
                               r == 0 ? std::function<void(const zero::gpt::StepLog&)>(on_step) : nullptr);
      });
    }
    for (auto& t : threads) t.join();
  }
  progress.Finish();
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) {
      std::fprintf(stderr, "zero-gpt: rank %zu: %s\n", r, zero::ErrorText(results[r].status()).c_str());
      return 1;
    }
  }
  const auto& res = *results[0];
  const zero::RecomputeStats& rc = res.recompute;
  if (flags.json) {
    // The activation sizes the peaks are made of, per rank: the residual stream, one block's saved
    // activations, the head's, the block backward's scratch (examples/gpt/model.h).
    const zero::gpt::GptConfig mc = zero::gpt::GptConfig::FromName(flags.model).value();  // TrainRank checked it
    const int B = static_cast<int>(cfg.micro_batch()), T = flags.seq > 0 ? flags.seq : mc.max_seq;
    std::printf(
        "{\"params\": %lld, \"world\": %d, \"stage\": %d, %s, %s, \"recompute\": {\"enabled\": %s, "
        "\"forwards\": %lld, \"recomputes\": %lld, \"peak_arena_bytes\": %zu, \"peak_checkpoint_bytes\": %zu, "
        "\"checkpoint_tier\": \"%s\", \"forward_s\": %.6f, \"recompute_s\": %.6f, \"backward_s\": %.6f}, "
        "\"activation_sizes\": {\"layers\": %d, \"stream\": %zu, \"block\": %zu, \"head\": %zu, "
        "\"scratch\": %zu}, \"saves\": {\"async\": %s, \"ms\": [%s], \"final_wait_ms\": %.3f}}\n",
        static_cast<long long>(res.params), world_size, cfg.zero.stage, MemoryJson(res.all_ranks).c_str(),
        PeakBoundJson(res.peak_bound).c_str(), flags.recompute ? "true" : "false", static_cast<long long>(rc.forwards),
        static_cast<long long>(rc.recomputes), rc.peak_arena_bytes, rc.peak_checkpoint_bytes,
        zero::MemTierName(rc.checkpoint_tier), rc.forward_s, rc.recompute_s, rc.backward_s, mc.layers,
        static_cast<size_t>(B) * T * mc.channels * sizeof(float), zero::gpt::BlockActs::Bytes(mc, B, T),
        zero::gpt::HeadActs::Bytes(mc, B, T), zero::gpt::BlockScratch::Bytes(mc, B, T),
        flags.save_async ? "true" : "false",
        absl::StrJoin(res.save_ms, ", ", [](std::string* out, double ms) { absl::StrAppendFormat(out, "%.3f", ms); })
            .c_str(),
        res.save_wait_ms);
    if (res.nvme_step_bytes_read + res.nvme_step_bytes_written > 0) {
      // The NVMe tier of rank 0 over the run's steps (zero/advanced/engine_stats.h).
      std::printf(
          "{\"nvme\": {\"step_bytes_read\": %lld, \"step_bytes_written\": %lld, \"io_busy_ms\": %.3f, "
          "\"wait_ms\": %.3f}}\n",
          static_cast<long long>(res.nvme_step_bytes_read), static_cast<long long>(res.nvme_step_bytes_written),
          res.nvme_io_busy_ms, res.nvme_wait_ms);
    }
    if (res.nvme_param_step_bytes_read + res.nvme_param_step_bytes_written > 0) {
      // The NVMe parameter tier of rank 0 over the run's gathers and steps (zero/advanced/engine_stats.h).
      std::printf("{\"nvme_param\": {\"step_bytes_read\": %lld, \"step_bytes_written\": %lld, \"gathers\": %lld}}\n",
                  static_cast<long long>(res.nvme_param_step_bytes_read),
                  static_cast<long long>(res.nvme_param_step_bytes_written),
                  static_cast<long long>(res.prefetch_gathers + res.demand_gathers));
    }
    if (flags.params_hash) {
      // Equal hashes, equal parameters (a resumed run's check).
      const uint64_t h = ParamsHash(res.final_params);
      std::printf("{\"params_hash\": \"%016llx\", \"first_step\": %lld, \"saved\": %zu}\n",
                  static_cast<unsigned long long>(h), static_cast<long long>(res.first_step), res.saved.size());
    }
  } else {
    std::printf("params %lld, world %d, stage %d; memory of rank 0:\n%s", static_cast<long long>(res.params),
                world_size, cfg.zero.stage, res.memory.ToString().c_str());
    std::printf(
        "activations of rank 0: arena peak %zu bytes, checkpoints peak %zu bytes (%s tier); %lld segment "
        "forwards, %lld recomputed\n",
        rc.peak_arena_bytes, rc.peak_checkpoint_bytes, zero::MemTierName(rc.checkpoint_tier),
        static_cast<long long>(rc.forwards), static_cast<long long>(rc.recomputes));
  }
  return 0;
}
