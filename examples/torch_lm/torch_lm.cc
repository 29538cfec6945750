// zero-torch-lm: a small transformer language model (examples/torch_lm/model.h) trained the way a libtorch user
// trains one, with torch::optim::AdamW or with zero::TorchOptimizer, one flag apart:
//
//   zero-torch-lm --optimizer torch                           # torch's AdamW, one process, the whole batch
//   zero-run -n 4 -- zero-torch-lm --optimizer torch          # torch's AdamW, gradients all-reduced after backward
//   zero-run -n 4 -- zero-torch-lm --optimizer zero           # zero/torch.h, ZeRO stage 2 (the embedded config)
//   zero-run -n 4 -- zero-torch-lm --optimizer zero --stage 1 --no-overlap --json --time
//
// Both modes: each of the N ranks (processes under zero-run, or one process alone) takes its slice
// [rank*B/N, (rank+1)*B/N) of step t's global batch of B sequences (torch_lm::MakeBatch), computes the mean
// cross-entropy of its slice and runs backward; the printed loss is the mean over the ranks, which is the global
// batch's mean. Then
//   torch  the DDP-less baseline: every trainable gradient is copied into one flat buffer, averaged with one
//          all-reduce through zero's Communicator (Gloo), copied back; torch::nn::utils::clip_grad_norm_, the
//          schedule's lr set on both parameter groups, opt.step(). (Rank 0's initial parameters are broadcast
//          first, as DDP does when it wraps a model.)
//   zero   opt->zero_grad(); loss.backward(); opt->step(lr): the buckets are reduced from backward's hooks
//          (unless --no-overlap), clipped, updated on this rank's shard and gathered back into the module.
// Both take the config's AdamW (lr as the peak of a warmup + cosine schedule, betas, eps, weight decay on the
// matrices only: torch_lm::TwoGroups) and its gradient_clipping, so with the same flags the two print the same
// losses up to rounding (tests/examples/torch_lm_test.cc checks 1e-6 relative).
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model.h"
#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/memory.h"
#include "zero/sharded_optimizer.h"
#include "zero/status.h"
#include "zero/torch.h"

namespace {

constexpr char kProg[] = "zero-torch-lm";

struct Flags {
  std::string optimizer = "zero";  // "torch" or "zero"
  int stage = -1;                  // -1: the config's
  bool overlap = true;
  int steps = 20;
  int warmup = -1;  // -1: a tenth of the steps, at least 1
  std::string config_path;
  torch_lm::LMOptions shape{.vocab = 128, .seq = 32, .dim = 64, .heads = 4, .layers = 2, .tied = false};
  int batch = 16;  // the global batch, in sequences
  bool freeze_embeddings = false;
  uint64_t seed = 1234;
  bool json = false;
  bool time = false;
  int threads = 1;
  std::string save_dir, resume_dir;
  int save_every = 0;
};

// The embedded DeepSpeed config: AdamW, clipping, stage 2, buckets of 32 Ki elements (several at the default shape).
// overlap_comm as DeepSpeed users set it for overlap: without it every reduction a backward hook starts is waited
// for inside that hook, so backward would carry the whole reduction.
constexpr char kDefaultConfig[] = R"({
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 2, "reduce_bucket_size": 32768, "overlap_comm": true}
})";

void Usage() {
  std::fprintf(
      stdout,
      "usage: zero-torch-lm [--optimizer torch|zero] [--stage 0-2] [--no-overlap] [--steps K] [--warmup K]\n"
      "                     [--config FILE] [--dim D] [--layers L] [--heads H] [--seq T] [--vocab V] [--batch B]\n"
      "                     [--tied] [--freeze-embeddings] [--seed S] [--threads N] [--json] [--time]\n"
      "                     [--save DIR [--save-every K]] [--resume DIR]\n"
      "A transformer LM (libtorch) on synthetic sequences, one process or one rank per process under zero-run\n"
      "(zero-run -n 4 -- zero-torch-lm); each rank trains on its 1/N slice of every global batch.\n"
      "  --optimizer torch  torch::optim::AdamW; gradients averaged by one all-reduce after backward (Gloo)\n"
      "  --optimizer zero   zero::TorchOptimizer (default): ZeRO stages 0-2, buckets reduced during backward\n"
      "  --stage S        (zero) the ZeRO stage instead of the config's\n"
      "  --no-overlap     (zero) reduce every bucket at step() instead of from backward's hooks\n"
      "  --steps K        steps to run (default 20); --warmup K: linear warmup steps of the lr schedule (default\n"
      "                   a tenth of the steps), then cosine decay to a tenth of the config's lr\n"
      "  --config FILE    DeepSpeed JSON (default: embedded; AdamW lr 3e-3, betas 0.9/0.95, weight decay 0.1 on\n"
      "                   matrices, gradient_clipping 1.0, stage 2, reduce_bucket_size 32768, overlap_comm);\n"
      "                   both modes take its optimizer and clipping; the batch keys are the program's. Without\n"
      "                   overlap_comm each bucket's reduction is waited for inside its backward hook\n"
      "  --dim --layers --heads --seq --vocab  the model's shape (default 64, 2, 4, 32, 128); --tied ties the head\n"
      "                   to the token embedding; --batch B the global batch in sequences (default 16), split\n"
      "                   evenly over the ranks\n"
      "  --freeze-embeddings  token and position embeddings get no gradient and no update\n"
      "  --seed S         the model's initial values (default 1234); --threads N torch's threads per rank (1)\n"
      "  --json           one {\"step\", \"loss\", \"lr\", \"grad_norm\"} line per step on rank 0, then one line\n"
      "                   per rank with its optimizer-state bytes against the formula (and zero's memory report)\n"
      "  --time           per step: forward+backward ms, step ms (zero: StepResult::times; torch: the\n"
      "                   all-reduce's blocking ms, the copies, clipping and AdamW), total ms\n"
      "  --save DIR       (zero) a checkpoint every --save-every steps and after the last; --resume DIR\n"
      "                   continues from DIR's latest (any world size or stage; none there: start)\n");
}

enum class Parsed { kRun, kHelp, kUsageError };

bool ParseInt(const std::string& flag, const char* v, int lo, int* out) {
  if (absl::SimpleAtoi(v, out) && *out >= lo) return true;
  std::fprintf(stderr, "%s: %s needs an integer >= %d, got '%s' (%s --help for usage)\n", kProg, flag.c_str(), lo, v,
               kProg);
  return false;
}

Parsed ParseFlags(int argc, char** argv, Flags* f) {
  std::map<std::string, int*> ints = {{"--steps", &f->steps},
                                      {"--warmup", &f->warmup},
                                      {"--batch", &f->batch},
                                      {"--threads", &f->threads},
                                      {"--save-every", &f->save_every}};
  std::map<std::string, int64_t*> shape = {{"--dim", &f->shape.dim},
                                           {"--layers", &f->shape.layers},
                                           {"--heads", &f->shape.heads},
                                           {"--seq", &f->shape.seq},
                                           {"--vocab", &f->shape.vocab}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // A flag's value is read only once the flag is known, so an unknown last flag is named as unknown.
    const bool has_value = i + 1 < argc;
    const char* v = has_value ? argv[i + 1] : "";
    bool takes_value = true;
    if (a == "--help" || a == "-h") return Parsed::kHelp;
    const bool known = a == "--no-overlap" || a == "--tied" || a == "--freeze-embeddings" || a == "--json" ||
                       a == "--time" || a == "--optimizer" || a == "--stage" || a == "--config" || a == "--seed" ||
                       a == "--save" || a == "--resume" || ints.count(a) || shape.count(a);
    if (!known) {
      std::fprintf(stderr, "%s: unknown flag %s (%s --help for usage)\n", kProg, a.c_str(), kProg);
      return Parsed::kUsageError;
    }
    if (a == "--no-overlap") {
      f->overlap = false, takes_value = false;
    } else if (a == "--tied") {
      f->shape.tied = true, takes_value = false;
    } else if (a == "--freeze-embeddings") {
      f->freeze_embeddings = true, takes_value = false;
    } else if (a == "--json") {
      f->json = true, takes_value = false;
    } else if (a == "--time") {
      f->time = true, takes_value = false;
    }
    if (!takes_value) continue;
    if (!has_value) {
      std::fprintf(stderr, "%s: %s needs a value (%s --help for usage)\n", kProg, a.c_str(), kProg);
      return Parsed::kUsageError;
    }
    ++i;
    if (a == "--optimizer") {
      f->optimizer = v;
      if (f->optimizer != "torch" && f->optimizer != "zero") {
        std::fprintf(stderr, "%s: --optimizer is torch or zero, got '%s' (%s --help for usage)\n", kProg, v, kProg);
        return Parsed::kUsageError;
      }
    } else if (a == "--stage") {
      if (!absl::SimpleAtoi(v, &f->stage) || f->stage < 0 || f->stage > 2) {
        std::fprintf(stderr,
                     "%s: --stage is 0, 1 or 2, got '%s' (stage 3 shards the parameters between uses: zero::Engine; "
                     "%s --help for usage)\n",
                     kProg, v, kProg);
        return Parsed::kUsageError;
      }
    } else if (a == "--config") {
      f->config_path = v;
    } else if (a == "--seed") {
      if (!absl::SimpleAtoi(v, &f->seed)) {
        std::fprintf(stderr, "%s: --seed needs an unsigned integer, got '%s' (%s --help for usage)\n", kProg, v, kProg);
        return Parsed::kUsageError;
      }
    } else if (a == "--save") {
      f->save_dir = v;
    } else if (a == "--resume") {
      f->resume_dir = v;
    } else if (auto it = ints.find(a); it != ints.end()) {
      if (!ParseInt(a, v, a == "--steps" || a == "--save-every" ? 0 : 1, it->second)) return Parsed::kUsageError;
    } else if (auto s = shape.find(a); s != shape.end()) {
      int n = 0;
      if (!ParseInt(a, v, 1, &n)) return Parsed::kUsageError;
      *s->second = n;
    }
  }
  if (f->optimizer == "torch" &&
      (f->stage >= 0 || !f->overlap || !f->save_dir.empty() || !f->resume_dir.empty() || f->save_every > 0)) {
    std::fprintf(stderr,
                 "%s: --stage, --no-overlap, --save, --save-every and --resume are zero's: use them with "
                 "--optimizer zero (%s --help for usage)\n",
                 kProg, kProg);
    return Parsed::kUsageError;
  }
  if (f->shape.dim % f->shape.heads != 0) {
    std::fprintf(stderr, "%s: --dim %lld is not a multiple of --heads %lld (%s --help for usage)\n", kProg,
                 static_cast<long long>(f->shape.dim), static_cast<long long>(f->shape.heads), kProg);
    return Parsed::kUsageError;
  }
  if (f->warmup < 0) f->warmup = std::max(1, f->steps / 10);
  return Parsed::kRun;
}

// The config of both modes: embedded or FILE, --stage over it, the batch keys from --batch and the world size.
zero::StatusOr<zero::Config> MakeConfig(const Flags& f, int world) {
  ZERO_ASSIGN_OR_RETURN(zero::Config cfg, f.config_path.empty() ? zero::Config::FromJsonString(kDefaultConfig)
                                                                : zero::Config::FromJsonFile(f.config_path));
  if (f.stage >= 0) cfg.zero.stage = f.stage;
  if (f.batch % world != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the global batch ", f.batch, " (--batch) does not split evenly over ", world, " ranks"));
  }
  cfg.train_batch_size = f.batch;
  cfg.train_micro_batch_size_per_gpu = f.batch / world;
  cfg.gradient_accumulation_steps = 1;
  const std::optional<zero::OptimizerConfig>& o = cfg.optimizer;
  if (!o.has_value() || o->type == "SGD" || !o->adam_w_mode || !o->bias_correction) {
    return absl::InvalidArgumentError(
        "the config's optimizer must be AdamW with bias_correction (both modes run torch AdamW groups)");
  }
  if (!cfg.scheduler.type.empty()) {
    return absl::InvalidArgumentError(
        "the config has a scheduler; zero-torch-lm sets each step's lr itself (warmup, then cosine decay from the "
        "optimizer's lr): remove the scheduler section");
  }
  if (cfg.fp16.enabled || cfg.bf16.enabled) {
    return absl::InvalidArgumentError("zero-torch-lm trains in fp32: disable fp16 and bf16 in the config");
  }
  return cfg;
}

// torch_lm::TwoGroups with the config's betas and eps (TwoGroups writes torch's 0.9/0.95, 1e-8).
std::vector<torch::optim::OptimizerParamGroup> Groups(torch::nn::Module& m, const zero::OptimizerConfig& o) {
  std::vector<torch::optim::OptimizerParamGroup> groups = torch_lm::TwoGroups(m, o.lr, o.weight_decay);
  for (auto& g : groups) {
    static_cast<torch::optim::AdamWOptions&>(g.options()).betas({o.beta1, o.beta2}).eps(o.eps);
  }
  return groups;
}

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

struct StepTimes {
  double fwd_bwd_ms = 0, step_ms = 0, total_ms = 0;
  double reduce_wait_ms = 0, optimizer_ms = 0;
  double copy_ms = 0;                                    // torch: gradients into the flat buffer and back
  double norm_ms = 0, allgather_ms = 0, compute_ms = 0;  // zero: StepResult::times
};

// torch mode's DDP-less data parallelism: one flat buffer over the trainable gradients, averaged in place.
class FlatAllReduce {
 public:
  FlatAllReduce(std::vector<torch::Tensor> params, zero::Communicator* comm) : params_(std::move(params)), comm_(comm) {
    int64_t n = 0;
    for (const torch::Tensor& p : params_) n += p.numel();
    flat_ = torch::zeros({n}, torch::kFloat32);
  }
  int64_t numel() const { return flat_.numel(); }

  // The ranks' mean gradient into every parameter's .grad(); times the copies and the all-reduce's wait.
  zero::Status Average(StepTimes* t) {
    torch::NoGradGuard no_grad;
    const Clock::time_point t0 = Clock::now();
    int64_t off = 0;
    for (const torch::Tensor& p : params_) {
      flat_.narrow(0, off, p.numel()).copy_(p.grad().reshape({-1}));
      off += p.numel();
    }
    const Clock::time_point t1 = Clock::now();
    ZERO_RETURN_IF_ERROR(comm_
                             ->AllReduce(flat_.data_ptr<float>(), static_cast<size_t>(flat_.numel()), zero::DType::kF32,
                                         zero::ReduceOp::kAvg)
                             .Wait());
    const Clock::time_point t2 = Clock::now();
    off = 0;
    for (const torch::Tensor& p : params_) {
      p.mutable_grad().copy_(flat_.narrow(0, off, p.numel()).view_as(p));
      off += p.numel();
    }
    const Clock::time_point t3 = Clock::now();
    t->copy_ms = Ms(t0, t1) + Ms(t2, t3);
    t->reduce_wait_ms = Ms(t1, t2);
    return zero::OkStatus();
  }

 private:
  std::vector<torch::Tensor> params_;
  zero::Communicator* comm_;
  torch::Tensor flat_;
};

// Makes every rank's parameters rank 0's, as DDP does when it wraps a model (one broadcast of a flat copy).
zero::Status BroadcastParameters(torch::nn::Module& model, zero::Communicator* comm) {
  if (comm->world_size() == 1) return zero::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat_parts;
  for (const torch::Tensor& p : model.parameters()) flat_parts.push_back(p.detach().reshape({-1}));
  torch::Tensor flat = torch::cat(flat_parts);
  ZERO_RETURN_IF_ERROR(
      comm->Broadcast(flat.data_ptr<float>(), static_cast<size_t>(flat.numel()), zero::DType::kF32, 0).Wait());
  int64_t off = 0;
  for (torch::Tensor& p : model.parameters()) {
    p.copy_(flat.narrow(0, off, p.numel()).view_as(p));
    off += p.numel();
  }
  return zero::OkStatus();
}

int64_t MemTagBytes(const zero::MemoryReport& r, zero::MemTag tag) {
  return r.Get(zero::MemTier::kHost, tag).current + r.Get(zero::MemTier::kDevice, tag).current;
}

void PrintStep(const Flags& f, int step, float loss, double lr, double grad_norm, const StepTimes& t, bool zero_mode) {
  if (f.json) {
    std::string line =
        absl::StrFormat(R"({"step": %d, "loss": %.9g, "lr": %.9g, "grad_norm": %.9g)", step, loss, lr, grad_norm);
    if (f.time) {
      absl::StrAppendFormat(&line, R"(, "fwd_bwd_ms": %.3f, "step_ms": %.3f, "reduce_wait_ms": %.3f)", t.fwd_bwd_ms,
                            t.step_ms, t.reduce_wait_ms);
      if (zero_mode) {
        absl::StrAppendFormat(&line, R"(, "norm_ms": %.3f, "optimizer_ms": %.3f, "allgather_ms": %.3f)", t.norm_ms,
                              t.optimizer_ms, t.allgather_ms);
      } else {
        absl::StrAppendFormat(&line, R"(, "copy_ms": %.3f, "optimizer_ms": %.3f)", t.copy_ms, t.optimizer_ms);
      }
      absl::StrAppendFormat(&line, R"(, "total_ms": %.3f)", t.total_ms);
    }
    std::printf("%s}\n", line.c_str());
  } else {
    std::printf("step %4d  loss %.6f  lr %.3e  grad norm %.4f", step, loss, lr, grad_norm);
    if (f.time) {
      std::printf("  fwd+bwd %.1f ms  step %.1f ms (reduce wait %.1f, optimizer %.1f)  total %.1f ms", t.fwd_bwd_ms,
                  t.step_ms, t.reduce_wait_ms, t.optimizer_ms, t.total_ms);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

zero::Status Train(const Flags& f, const zero::Config& cfg, std::shared_ptr<zero::Communicator> comm) {
  const int rank = comm->rank(), world = comm->world_size();
  const bool zero_mode = f.optimizer == "zero";
  const zero::OptimizerConfig& oc = *cfg.optimizer;
  const double clip = cfg.gradient_clipping;
  torch_lm::TransformerLM model = torch_lm::MakeModel(f.shape, f.seed);
  if (f.freeze_embeddings) {
    model->tok->weight.set_requires_grad(false);
    model->pos->weight.set_requires_grad(false);
  }
  std::vector<torch::Tensor> trainable;
  int64_t num_params = 0, num_trainable = 0;
  for (const torch::Tensor& p : model->parameters()) {
    num_params += p.numel();
    if (!p.requires_grad()) continue;
    trainable.push_back(p);
    num_trainable += p.numel();
  }

  std::unique_ptr<zero::TorchOptimizer> zopt;
  std::unique_ptr<torch::optim::AdamW> topt;
  std::unique_ptr<FlatAllReduce> reducer;
  if (zero_mode) {
    zero::TorchOptions options;
    options.overlap = f.overlap;
    ZERO_ASSIGN_OR_RETURN(zopt, zero::TorchOptimizer::Create(cfg, comm, *model, Groups(*model, oc), options));
  } else {
    ZERO_RETURN_IF_ERROR(BroadcastParameters(*model, comm.get()));
    topt = std::make_unique<torch::optim::AdamW>(Groups(*model, oc));
    reducer = std::make_unique<FlatAllReduce>(trainable, comm.get());
  }
  const int per = f.batch / world;
  if (rank == 0 && !f.json) {
    std::printf("%lld parameters (%lld trainable), global batch %d over %d rank%s (%d sequences of %lld each); %s\n",
                static_cast<long long>(num_params), static_cast<long long>(num_trainable), f.batch, world,
                world == 1 ? "" : "s", per, static_cast<long long>(f.shape.seq),
                zero_mode ? absl::StrCat("zero::TorchOptimizer, stage ", cfg.zero.stage, ", ", zopt->buckets().size(),
                                         " buckets", f.overlap ? " reduced during backward" : " reduced at step()")
                                .c_str()
                          : "torch::optim::AdamW, gradients all-reduced after backward");
    std::fflush(stdout);
  }

  int first_step = 1;
  if (zero_mode && !f.resume_dir.empty()) {
    zero::StatusOr<std::string> tag = zero::ResumeCheckpointTag(f.resume_dir);
    if (!tag.ok() && !absl::IsNotFound(tag.status())) {
      return absl::Status(tag.status().code(), absl::StrCat("--resume: ", tag.status().message()));
    }
    if (tag.ok()) {
      constexpr int64_t kMaxStep = int64_t{1} << 30;
      zero::LoadOptions lo;
      lo.tag = *tag;
      lo.check_trainer_state = [](const zero::TrainerState& ts) {
        return zero::TrainerStateInt(ts, "next_step", 1, kMaxStep).status();
      };
      zero::StatusOr<zero::LoadResult> r = zopt->Load(f.resume_dir, lo);
      if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat("--resume: ", r.status().message()));
      ZERO_ASSIGN_OR_RETURN(const int64_t next, zero::TrainerStateInt(r->trainer_state, "next_step", 1, kMaxStep));
      first_step = static_cast<int>(next);
      if (rank == 0 && !f.json) std::printf("resumed from %s at step %d\n", r->tag.c_str(), first_step);
    }
  }

  for (int step = first_step; step <= f.steps; ++step) {
    StepTimes t;
    const Clock::time_point t0 = Clock::now();
    const torch_lm::Batch b = torch_lm::MakeBatch(f.shape, step, rank * per, (rank + 1) * per);
    const double lr = torch_lm::ScheduleLr(oc.lr, step, f.warmup, f.steps);
    if (zero_mode) {
      zopt->zero_grad();
    } else {
      topt->zero_grad();
    }
    const Clock::time_point t1 = Clock::now();
    torch::Tensor loss = model->forward(b.idx, b.targets);
    loss.backward();
    const Clock::time_point t2 = Clock::now();
    t.fwd_bwd_ms = Ms(t1, t2);
    double grad_norm = 0;
    if (zero_mode) {
      ZERO_ASSIGN_OR_RETURN(const zero::StepResult r, zopt->step(lr));
      grad_norm = r.grad_norm;
      t.reduce_wait_ms = r.times.reduce_wait_ms;
      t.norm_ms = r.times.norm_ms;
      t.optimizer_ms = r.times.optimizer_ms;
      t.allgather_ms = r.times.allgather_ms;
    } else {
      ZERO_RETURN_IF_ERROR(reducer->Average(&t));
      const Clock::time_point o0 = Clock::now();
      grad_norm =
          torch::nn::utils::clip_grad_norm_(trainable, clip > 0 ? clip : std::numeric_limits<double>::infinity());
      for (auto& g : topt->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      topt->step();
      t.optimizer_ms = Ms(o0, Clock::now());
    }
    const Clock::time_point t3 = Clock::now();
    t.step_ms = Ms(t2, t3);
    // The global batch's mean loss: every slice has B/N sequences, so the mean of the ranks' means.
    float loss_value = loss.item<float>();
    ZERO_RETURN_IF_ERROR(comm->AllReduce(&loss_value, 1, zero::DType::kF32, zero::ReduceOp::kAvg).Wait());
    if (zero_mode && !f.save_dir.empty() && ((f.save_every > 0 && step % f.save_every == 0) || step == f.steps)) {
      ZERO_RETURN_IF_ERROR(zopt->Save(f.save_dir, {.tag = absl::StrFormat("step-%08d", step),
                                                   .trainer_state = {{"next_step", absl::StrCat(step + 1)}}})
                               .status());
    }
    t.total_ms = Ms(t0, Clock::now());
    if (rank == 0) PrintStep(f, step, loss_value, lr, grad_norm, t, zero_mode);
  }

  // Optimizer state on this rank against the ZeRO paper's count: AdamW keeps 8 bytes (m, v) per element it
  // updates. zero: the elements are the trainable buckets' buffers, each padded to ShardedOptimizer::Capacity
  // (Ψ = their sum); 8Ψ at stage 0, 8Ψ/N at stages 1-2. torch: every trainable parameter on every rank, 8Ψ.
  int64_t state_bytes = 0, psi = 0, formula = 0;
  std::string extra;
  if (zero_mode) {
    std::map<std::string, torch::Tensor> by_name;
    for (const auto& p : model->named_parameters()) by_name[p.key()] = p.value();
    for (const std::vector<std::string>& bucket : zopt->buckets()) {
      int64_t n = 0;
      bool trains = false;
      for (const std::string& name : bucket) {
        n += by_name.at(name).numel();
        trains = trains || by_name.at(name).requires_grad();
      }
      if (trains) psi += zero::ShardedOptimizer::Capacity(n, world);
    }
    const zero::MemoryReport report = zopt->memory_report();
    state_bytes = MemTagBytes(report, zero::MemTag::kOptimizer);
    formula = cfg.zero.stage == 0 ? 8 * psi : 8 * psi / world;
    extra = absl::StrCat(", \"stage\": ", cfg.zero.stage, ", \"buckets\": ", zopt->buckets().size(),
                         ", \"trainer_bytes\": ", zopt->trainer_bytes(), ", \"memory\": ", report.ToJson());
  } else {
    psi = num_trainable;
    for (const auto& [key, state] : topt->state()) {
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
      state_bytes += (s.exp_avg().numel() + s.exp_avg_sq().numel()) * static_cast<int64_t>(sizeof(float));
    }
    formula = 8 * psi;
    extra = absl::StrCat(", \"allreduce_buffer_bytes\": ", reducer->numel() * static_cast<int64_t>(sizeof(float)));
  }
  if (f.json) {
    std::printf(
        "{\"rank\": %d, \"world\": %d, \"optimizer\": \"%s\", \"trainable_params\": %lld, \"psi\": %lld, "
        "\"optimizer_state_bytes\": %lld, \"formula_bytes\": %lld%s}\n",
        rank, world, f.optimizer.c_str(), static_cast<long long>(num_trainable), static_cast<long long>(psi),
        static_cast<long long>(state_bytes), static_cast<long long>(formula), extra.c_str());
  } else if (rank == 0) {
    std::printf("optimizer state on rank 0: %lld bytes; %s = %lld (Psi = %lld elements%s)\n",
                static_cast<long long>(state_bytes),
                zero_mode && cfg.zero.stage > 0 ? absl::StrCat("8 Psi / ", world).c_str() : "8 Psi",
                static_cast<long long>(formula), static_cast<long long>(psi),
                zero_mode ? ": the trainable buckets, padded" : ": the trainable parameters");
  }
  std::fflush(stdout);
  return zero::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  switch (ParseFlags(argc, argv, &flags)) {
    case Parsed::kHelp: Usage(); return 0;
    case Parsed::kUsageError: return 2;
    case Parsed::kRun: break;
  }
  torch::set_num_threads(flags.threads);
  // The communicator's timeout is the config's comm_timeout_s (a config that does not parse is reported below).
  zero::Config for_comm;
  if (!flags.config_path.empty()) {
    if (auto c = zero::Config::FromJsonFile(flags.config_path); c.ok()) for_comm = *c;
  }
  zero::Status status;
  int rank = 0;
  zero::StatusOr<std::shared_ptr<zero::Communicator>> comm =
      zero::Communicator::FromEnv(zero::Backend::kGloo, for_comm);
  if (!comm.ok()) {
    status = comm.status();
  } else {
    rank = (*comm)->rank();
    zero::StatusOr<zero::Config> cfg = MakeConfig(flags, (*comm)->world_size());
    if (!cfg.ok()) {
      status = cfg.status();
    } else {
      try {
        status = Train(flags, *cfg, *comm);
      } catch (const c10::Error& e) {
        status = absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
      } catch (const std::exception& e) {
        status = absl::InternalError(e.what());
      }
    }
  }
  if (status.ok()) return 0;
  const std::string who = zero::Communicator::Launched() ? absl::StrCat("rank ", rank, ": ") : "";
  std::fprintf(stderr, "%s: %s%s\n", kProg, who.c_str(), zero::ErrorText(status).c_str());
  return 1;
}
