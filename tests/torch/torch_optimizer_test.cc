// zero/torch.h against torch itself. The trainer is a libtorch transformer LM (examples/torch_lm/model.h) trained
// the way torch users train: two parameter groups (decay on matrices only), a warmup + cosine learning rate set
// each step, gradient clipping that engages, frozen token and position embeddings. The reference is
// torch::optim::AdamW in one process over the whole global batch, accumulated slice by slice as DDP averages it;
// zero runs the same slices on N thread-ranks over Gloo at stages 0-2. Then: overlap on vs off (bitwise), the
// storage swaps that would train silently (each caught, then reload()), checkpoints across world and stage, and
// the wrapper's errors.
#include "zero/torch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model.h"
#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/forwarding_comm.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/tolerance.h"
#include "zero/sharded_optimizer.h"

namespace zero {
namespace {

using torch_lm::LMOptions;

constexpr int kGlobalBatch = 8;
constexpr int kSteps = 8;
constexpr double kPeakLr = 3e-3, kWd = 0.1, kClip = 0.5;
constexpr uint64_t kSeed = 1234;

LMOptions Shape() { return LMOptions{}; }

// The DeepSpeed JSON a torch user hands over: AdamW, clipping, the stage, small buckets (several per model).
Config TorchConfig(int stage, int64_t bucket = 6000) {
  const std::string json =
      absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": )",
                   kPeakLr, R"(, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}},
    "gradient_clipping": )",
                   kClip, R"(, "zero_optimization": {"stage": )", stage, R"(, "reduce_bucket_size": )", bucket, "}}");
  StatusOr<Config> c = Config::FromJsonString(json);
  ZERO_CHECK(c.ok()) << c.status();
  return *c;
}

torch_lm::TransformerLM FrozenEmbeddingsModel() {
  torch_lm::TransformerLM m = torch_lm::MakeModel(Shape(), kSeed);
  m->tok->weight.set_requires_grad(false);
  m->pos->weight.set_requires_grad(false);
  return m;
}

std::vector<float> Flatten(torch::nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : m.named_parameters()) {
    torch::Tensor t = p.value().detach().to(torch::kFloat32).contiguous();
    out.insert(out.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  return out;
}

std::vector<torch::Tensor> Trainable(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

struct Trace {
  std::vector<std::vector<double>> loss;  // [step][rank]: rank r's slice's loss
  std::vector<double> grad_norm;          // [step]
  std::vector<float> params;              // every parameter after the last step
  double eval = 0;                        // the loss of the whole batch of step steps + 1 after the last step
};

double EvalLoss(torch_lm::TransformerLM& model, int steps) {
  torch::NoGradGuard no_grad;
  torch_lm::Batch b = torch_lm::MakeBatch(Shape(), steps + 1, 0, kGlobalBatch);
  return model->forward(b.idx, b.targets).item<double>();
}

// torch::optim::AdamW, one process: each step the N slices' losses / N backward into the same gradients (DDP's
// average), clip_grad_norm_ over the trainable parameters, the schedule's lr set on both groups.
Trace Reference(int world, int steps) {
  torch::manual_seed(kSeed);
  torch_lm::TransformerLM model = FrozenEmbeddingsModel();
  torch::optim::AdamW opt(torch_lm::TwoGroups(*model, kPeakLr, kWd));
  Trace run;
  const int per = kGlobalBatch / world;
  for (int t = 1; t <= steps; ++t) {
    opt.zero_grad();
    run.loss.emplace_back();
    for (int r = 0; r < world; ++r) {
      torch_lm::Batch b = torch_lm::MakeBatch(Shape(), t, r * per, (r + 1) * per);
      torch::Tensor loss = model->forward(b.idx, b.targets);
      run.loss.back().push_back(loss.item<double>());
      (loss / world).backward();
    }
    run.grad_norm.push_back(torch::nn::utils::clip_grad_norm_(Trainable(*model), kClip));
    const double lr = torch_lm::ScheduleLr(kPeakLr, t, 3, steps);
    for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    opt.step();
  }
  run.params = Flatten(*model);
  run.eval = EvalLoss(model, steps);
  return run;
}

struct ZeroRunOptions {
  int stage = 2;
  bool overlap = true;
  int64_t bucket = 6000;
  int steps = kSteps;
};

// zero/torch.h on `world` thread-ranks: each rank its slice of every step's global batch.
Trace ZeroRun(int world, const ZeroRunOptions& o) {
  Trace run;
  run.loss.assign(o.steps, std::vector<double>(world));
  run.grad_norm.assign(o.steps, 0.0);
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    torch_lm::TransformerLM model = FrozenEmbeddingsModel();
    TorchOptions options;
    options.overlap = o.overlap;
    ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(o.stage, o.bucket), testing::Borrow(comm), *model,
                                                          torch_lm::TwoGroups(*model, kPeakLr, kWd), options));
    const int per = kGlobalBatch / world;
    for (int t = 1; t <= o.steps; ++t) {
      opt->zero_grad();
      torch_lm::Batch b = torch_lm::MakeBatch(Shape(), t, rank * per, (rank + 1) * per);
      torch::Tensor loss = model->forward(b.idx, b.targets);
      run.loss[t - 1][rank] = loss.item<double>();
      loss.backward();
      ASSERT_OK_AND_ASSIGN(StepResult r, opt->step(torch_lm::ScheduleLr(kPeakLr, t, 3, o.steps)));
      if (rank == 0) run.grad_norm[t - 1] = r.grad_norm;
    }
    if (rank == 0) {
      run.params = Flatten(*model);
      run.eval = EvalLoss(model, o.steps);
    }
  });
  return run;
}

class TorchParity : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

// Loss to 1e-6 relative at every step and rank, the clipping engaged, the frozen embeddings bit-identical.
TEST_P(TorchParity, MatchesTorchAdamWWithGroupsScheduleClippingAndFrozenEmbeddings) {
  const auto [world, stage] = GetParam();
  const Trace ref = Reference(world, kSteps);
  const Trace got = ZeroRun(world, {.stage = stage});
  ASSERT_EQ(got.params.size(), ref.params.size());
  testing::Deviation loss("loss", 1e-6), norm("grad_norm", 1e-5);
  for (int t = 0; t < kSteps; ++t) {
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(loss.Add(std::abs(got.loss[t][r] - ref.loss[t][r]) / std::abs(ref.loss[t][r])))
          << "step " << t + 1 << " rank " << r << ": " << got.loss[t][r] << " vs " << ref.loss[t][r];
    }
    EXPECT_TRUE(norm.Add(std::abs(got.grad_norm[t] - ref.grad_norm[t]) / ref.grad_norm[t])) << "step " << t + 1;
  }
  EXPECT_GT(*std::max_element(ref.grad_norm.begin(), ref.grad_norm.end()), kClip) << "clipping never engaged";
  // The frozen embeddings (first in registration order: tok, pos) never moved.
  const int64_t frozen = Shape().vocab * Shape().dim + Shape().seq * Shape().dim;
  torch_lm::TransformerLM init = torch_lm::MakeModel(Shape(), kSeed);
  const std::vector<float> init_params = Flatten(*init);
  for (int64_t i = 0; i < frozen; ++i) ASSERT_EQ(got.params[i], init_params[i]) << "frozen element " << i;
  // The last update too: the loss of the next batch under the final parameters.
  EXPECT_TRUE(loss.Add(std::abs(got.eval - ref.eval) / ref.eval)) << got.eval << " vs " << ref.eval;
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStages, TorchParity,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(0, 1, 2)),
                         [](const auto& info) {
                           return absl::StrCat("world", std::get<0>(info.param), "_stage", std::get<1>(info.param));
                         });

// Reductions started from backward's hooks give the same bits as reductions at step().
TEST(TorchOverlap, OnAndOffAreBitwiseEqual) {
  torch::set_num_threads(1);
  for (int stage : {0, 1, 2}) {
    const Trace on = ZeroRun(2, {.stage = stage, .overlap = true, .steps = 4});
    const Trace off = ZeroRun(2, {.stage = stage, .overlap = false, .steps = 4});
    EXPECT_EQ(on.params, off.params) << "stage " << stage;
    EXPECT_EQ(on.loss, off.loss) << "stage " << stage;
  }
}

// Counts the gradient reductions issued (reduce-scatters at stages 1-2, all-reduces of buckets at stage 0, not the
// step's own small ones: the norm's 2 floats, the desync check's 32), to see whether they started inside backward
// or only at step().
class ReductionCounter : public testing::ForwardingComm {
 public:
  using ForwardingComm::ForwardingComm;
  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, CUstream_st* s) override {
    ++issued;
    return ForwardingComm::ReduceScatter(send, recv, count, dtype, op, s);
  }
  Work ReduceScatterDestructive(void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                CUstream_st* s) override {
    ++issued;
    return ForwardingComm::ReduceScatterDestructive(send, recv, count, dtype, op, s);
  }
  Work ReduceScatterStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype, ReduceOp op,
                            CUstream_st* s) override {
    ++issued;
    return ForwardingComm::ReduceScatterStrided(send, recv, count, stride, dtype, op, s);
  }
  Work AllReduce(void* buf, size_t count, DType dtype, ReduceOp op, CUstream_st* s) override {
    if (count > 64) ++issued;
    return ForwardingComm::AllReduce(buf, count, dtype, op, s);
  }
  int issued = 0;
};

// With overlap every bucket's reduction is issued inside backward (the last bucket's too, from its last
// gradient's hook), so none is left for step(); without it, none is issued before step().
TEST(TorchOverlap, EveryBucketIsIssuedInsideBackward) {
  torch::set_num_threads(1);
  for (int stage : {0, 2}) {
    for (bool overlap : {true, false}) {
      testing::RunRanks(2, [&](Communicator& comm, int rank) {
        auto counter = std::make_shared<ReductionCounter>(comm);
        torch_lm::TransformerLM model = FrozenEmbeddingsModel();
        TorchOptions options;
        options.overlap = overlap;
        ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(stage), counter, *model, options));
        for (int t = 1; t <= 2; ++t) {
          opt->zero_grad();
          torch_lm::Batch b = torch_lm::MakeBatch(Shape(), t, rank * 4, rank * 4 + 4);
          const int before = counter->issued;
          model->forward(b.idx, b.targets).backward();
          const int in_backward = counter->issued - before;
          ASSERT_OK(opt->step().status());
          const int in_step = counter->issued - before - in_backward;
          if (overlap) {
            EXPECT_GE(in_backward, static_cast<int>(opt->buckets().size()) - 1) << "stage " << stage;
            EXPECT_EQ(in_step, 0) << "stage " << stage;
          } else {
            EXPECT_EQ(in_backward, 0) << "stage " << stage;
            EXPECT_GE(in_step, static_cast<int>(opt->buckets().size()) - 1) << "stage " << stage;
          }
        }
      });
    }
  }
}

// The buckets follow backward's order and reduce_bucket_size; frozen parameters are in buckets of their own.
TEST(TorchBuckets, ReverseRegistrationOrderWithinTheBucketSize) {
  torch::set_num_threads(1);
  testing::RunRanks(1, [&](Communicator& comm, int) {
    torch_lm::TransformerLM model = FrozenEmbeddingsModel();
    ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(2, 6000), testing::Borrow(comm), *model));
    const auto buckets = opt->buckets();
    ASSERT_GE(buckets.size(), 4u);
    EXPECT_EQ(buckets.front().front(), "head.weight");  // the last registered, the first gradient backward makes
    EXPECT_EQ(buckets.back(), (std::vector<std::string>{"pos.weight", "tok.weight"}));
  });
}

// Hooks hand each bucket over once per backward: a second backward before step() is refused (it would be
// reduced twice); inside no_sync() backward passes only accumulate, and the result is the big batch's.
TEST(TorchOverlap, AccumulationNeedsNoSyncAndMatchesOneBackward) {
  torch::set_num_threads(1);
  std::vector<float> accumulated, whole;
  for (int pass = 0; pass < 3; ++pass) {
    testing::RunRanks(2, [&](Communicator& comm, int rank) {
      torch_lm::TransformerLM model = FrozenEmbeddingsModel();
      ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(2), testing::Borrow(comm), *model,
                                                            torch_lm::TwoGroups(*model, kPeakLr, kWd)));
      const int per = kGlobalBatch / 2;
      auto slice = [&](int half) {
        const int begin = rank * per + half * per / 2;
        torch_lm::Batch b = torch_lm::MakeBatch(Shape(), 1, begin, begin + per / 2);
        return model->forward(b.idx, b.targets) / 2;
      };
      if (pass == 0) {  // two micro-batches, the first inside no_sync()
        {
          auto guard = opt->no_sync();
          slice(0).backward();
        }
        slice(1).backward();
        ASSERT_OK(opt->step().status());
        if (rank == 0) accumulated = Flatten(*model);
      } else if (pass == 1) {  // the same two as one backward
        (slice(0) + slice(1)).backward();
        ASSERT_OK(opt->step().status());
        if (rank == 0) whole = Flatten(*model);
      } else {  // two backward passes without no_sync(): the first one's buckets were already reduced
        slice(0).backward();
        slice(1).backward();
        EXPECT_THAT(opt->step(),
                    testing::StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("inside no_sync()")));
      }
    });
  }
  ASSERT_FALSE(whole.empty());
  double max_diff = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(accumulated[i] - whole[i])));
  }
  EXPECT_LE(max_diff, 1e-6);
}

// After step() every .grad() is zero (the reduction happened in the gradient buffer), unlike torch's step().
TEST(TorchContract, StepLeavesGradientsZeroAndTheNormInTheResult) {
  torch::set_num_threads(1);
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    torch_lm::TransformerLM model = FrozenEmbeddingsModel();
    ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(1), testing::Borrow(comm), *model));
    torch_lm::Batch b = torch_lm::MakeBatch(Shape(), 1, rank * 4, rank * 4 + 4);
    model->forward(b.idx, b.targets).backward();
    ASSERT_OK_AND_ASSIGN(StepResult r, opt->step());
    EXPECT_GT(r.grad_norm, 0.0);
    for (const auto& p : model->named_parameters()) {
      if (!p.value().requires_grad()) continue;
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_EQ(p.value().grad().abs().max().item<float>(), 0.0f) << p.key();
    }
  });
}

// Each way a libtorch trainer can replace a parameter's or gradient's storage is an error at the next step()
// naming the parameter, before any collective; reload() adopts what the module holds then.
TEST(TorchStorageSwap, EachCaseIsCaughtAndReloadAdoptsTheModulesValues) {
  torch::set_num_threads(1);
  const std::string dir = testing::MakeTempDir("torch_swap");
  const std::string saved = dir + "/model.pt";
  {
    torch_lm::TransformerLM other = torch_lm::MakeModel(Shape(), 99);  // other values than kSeed's
    torch::save(other, saved);
  }
  enum Case { kTorchLoad, kTo, kSetData, kGradNone, kGradAssigned };
  for (Case c : {kTorchLoad, kTo, kSetData, kGradNone, kGradAssigned}) {
    SCOPED_TRACE(absl::StrCat("case ", static_cast<int>(c)));
    testing::RunRanks(2, [&](Communicator& comm, int rank) {
      torch_lm::TransformerLM model = FrozenEmbeddingsModel();
      ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(2), testing::Borrow(comm), *model,
                                                            torch_lm::TwoGroups(*model, kPeakLr, kWd)));
      torch_lm::Batch b = torch_lm::MakeBatch(Shape(), 1, rank * 4, rank * 4 + 4);
      // The first parameter (registration order) whose storage or gradient moved.
      std::string who = "blocks.0.qkv.weight";
      switch (c) {
        case kTorchLoad:
          torch::load(model, saved);
          who = "tok.weight";
          break;
        case kTo: model->to(torch::kFloat64); break;
        case kSetData: {
          torch::NoGradGuard g;
          model->blocks[0]->as<torch_lm::Block>()->named_parameters()["qkv.weight"].set_data(torch::zeros({96, 32}));
          break;
        }
        case kGradNone:
          model->zero_grad(/*set_to_none=*/true);
          who = "blocks.0.ln1.weight";  // the first trainable parameter
          break;
        case kGradAssigned:
          model->named_parameters()["blocks.0.qkv.weight"].mutable_grad() = torch::zeros({96, 32});
          break;
      }
      if (c == kTo) {
        // .to() changes dtype: the model cannot run forward as float now; the step is refused all the same.
        EXPECT_THAT(opt->step(), testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                                   ::testing::HasSubstr("no longer views zero's buffer")));
        model->to(torch::kFloat32);
      } else {
        model->forward(b.idx, b.targets).backward();
        const StatusOr<StepResult> r = opt->step();
        EXPECT_THAT(r, testing::StatusIs(absl::StatusCode::kFailedPrecondition));
        if (c == kGradNone || c == kGradAssigned) {
          EXPECT_THAT(r.status().message(), ::testing::HasSubstr("the gradient of parameter"));
        } else {
          EXPECT_THAT(r.status().message(), ::testing::HasSubstr("no longer views zero's buffer"));
        }
        EXPECT_THAT(r.status().message(), ::testing::HasSubstr(absl::StrCat("parameter ", who, " ")));
      }
      const std::vector<float> before = Flatten(*model);
      ASSERT_OK(opt->reload());
      EXPECT_EQ(Flatten(*model), before) << "reload() keeps the module's values";
      opt->zero_grad();
      model->forward(b.idx, b.targets).backward();
      ASSERT_OK(opt->step().status());
      if (c == kTorchLoad) {
        // The loaded values were adopted: the frozen embeddings are the loaded model's, after a step.
        torch_lm::TransformerLM other = torch_lm::MakeModel(Shape(), 99);
        EXPECT_TRUE(torch::equal(model->tok->weight, other->tok->weight));
      }
    });
  }
}

// A checkpoint saved at world 4, stage 2 resumes at world 2, stage 1: the parameters bitwise, the loss of the
// continued run to 1e-6 of world 4's own continuation; the checkpoint holds the torch names.
TEST(TorchCheckpoint, SavedAtWorldFourStageTwoResumesAtWorldTwoStageOne) {
  torch::set_num_threads(1);
  const std::string dir = testing::MakeTempDir("torch_ckpt");
  constexpr int kBefore = 4, kAfter = 4;
  std::vector<float> at_save, loaded;
  std::vector<double> four(kAfter), two(kAfter);
  auto train = [&](TorchOptimizer& opt, torch_lm::TransformerLM& model, int world, int rank, int from, int to,
                   std::vector<double>* losses) {
    const int per = kGlobalBatch / world;
    for (int t = from; t <= to; ++t) {
      opt.zero_grad();
      torch_lm::Batch b = torch_lm::MakeBatch(Shape(), t, rank * per, (rank + 1) * per);
      torch::Tensor loss = model->forward(b.idx, b.targets);
      loss.backward();
      const double mean = loss.item<double>() / world;
      ASSERT_OK(opt.step(torch_lm::ScheduleLr(kPeakLr, t, 3, kBefore + kAfter)).status());
      if (losses != nullptr) (*losses)[t - from] += mean;  // summed over ranks below, under a lock
    }
  };
  std::mutex mu;
  testing::RunRanks(4, [&](Communicator& comm, int rank) {
    torch_lm::TransformerLM model = FrozenEmbeddingsModel();
    ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(2), testing::Borrow(comm), *model,
                                                          torch_lm::TwoGroups(*model, kPeakLr, kWd)));
    train(*opt, model, 4, rank, 1, kBefore, nullptr);
    ASSERT_OK(opt->Save(dir).status());
    if (rank == 0) at_save = Flatten(*model);
    std::vector<double> mine(kAfter);
    train(*opt, model, 4, rank, kBefore + 1, kBefore + kAfter, &mine);
    std::lock_guard<std::mutex> l(mu);
    for (int i = 0; i < kAfter; ++i) four[i] += mine[i];
  });
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    torch_lm::TransformerLM model = torch_lm::MakeModel(Shape(), 7);  // other initial values: Load replaces them
    model->tok->weight.set_requires_grad(false);
    model->pos->weight.set_requires_grad(false);
    ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(1), testing::Borrow(comm), *model,
                                                          torch_lm::TwoGroups(*model, kPeakLr, kWd)));
    ASSERT_OK(opt->Load(dir).status());
    EXPECT_EQ(opt->steps(), kBefore);
    if (rank == 0) loaded = Flatten(*model);
    std::vector<double> mine(kAfter);
    train(*opt, model, 2, rank, kBefore + 1, kBefore + kAfter, &mine);
    std::lock_guard<std::mutex> l(mu);
    for (int i = 0; i < kAfter; ++i) two[i] += mine[i];
  });
  EXPECT_EQ(loaded, at_save);
  for (int i = 0; i < kAfter; ++i) EXPECT_LE(std::abs(two[i] - four[i]), 1e-6 * four[i]) << "step " << kBefore + 1 + i;
  // The torch names, as a torch user reads them (zero-ckpt show lists the same).
  std::string meta;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().filename() == "meta.json") meta = testing::ReadWholeFile(e.path().string());
  }
  EXPECT_NE(meta.find("\"blocks.1.fc.weight\""), std::string::npos);
  EXPECT_NE(meta.find("\"bare_names\""), std::string::npos);
}

// A checkpoint saved with every parameter trainable loads into the model with frozen embeddings: the names do not
// change with freezing.
TEST(TorchCheckpoint, SavedBeforeFreezingLoadsAfter) {
  torch::set_num_threads(1);
  const std::string dir = testing::MakeTempDir("torch_freeze");
  std::vector<float> saved;
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    torch_lm::TransformerLM model = torch_lm::MakeModel(Shape(), kSeed);
    ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(2), testing::Borrow(comm), *model));
    torch_lm::Batch b = torch_lm::MakeBatch(Shape(), 1, rank * 4, rank * 4 + 4);
    model->forward(b.idx, b.targets).backward();
    ASSERT_OK(opt->step().status());
    ASSERT_OK(opt->Save(dir).status());
    if (rank == 0) saved = Flatten(*model);
  });
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    torch_lm::TransformerLM model = FrozenEmbeddingsModel();
    ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(TorchConfig(2), testing::Borrow(comm), *model,
                                                          torch_lm::TwoGroups(*model, kPeakLr, kWd)));
    ASSERT_OK(opt->Load(dir).status());
    if (rank == 0) {
      EXPECT_EQ(Flatten(*model), saved);
    }
  });
}

// The wrapper's mistakes are named in torch's words.
TEST(TorchErrors, GroupsOptionsAndParametersAreNamed) {
  torch::set_num_threads(1);
  testing::RunRanks(1, [&](Communicator& comm, int) {
    torch_lm::TransformerLM model = torch_lm::MakeModel(Shape(), kSeed);
    {  // a parameter in two groups
      std::vector<torch::optim::OptimizerParamGroup> g;
      g.emplace_back(std::vector<torch::Tensor>{model->head->weight});
      g.emplace_back(std::vector<torch::Tensor>{model->head->weight});
      EXPECT_THAT(TorchOptimizer::Create(TorchConfig(1), testing::Borrow(comm), *model, g),
                  testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                    ::testing::HasSubstr("parameter head.weight is in param groups 0 and 1")));
    }
    {  // a tensor that is not the module's
      std::vector<torch::optim::OptimizerParamGroup> g;
      g.emplace_back(std::vector<torch::Tensor>{torch::zeros({3, 3}, torch::requires_grad())});
      EXPECT_THAT(
          TorchOptimizer::Create(TorchConfig(1), testing::Borrow(comm), *model, g),
          testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("not a parameter of the module")));
    }
    {  // torch's Adam (L2 decay) against the config's AdamW
      std::vector<torch::optim::OptimizerParamGroup> g;
      g.emplace_back(std::vector<torch::Tensor>{model->head->weight},
                     std::make_unique<torch::optim::AdamOptions>(1e-3));
      EXPECT_THAT(TorchOptimizer::Create(TorchConfig(1), testing::Borrow(comm), *model, g),
                  testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("AdamOptions")));
    }
    {  // amsgrad
      std::vector<torch::optim::OptimizerParamGroup> g;
      g.emplace_back(std::vector<torch::Tensor>{model->head->weight},
                     std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-3).amsgrad(true)));
      EXPECT_THAT(TorchOptimizer::Create(TorchConfig(1), testing::Borrow(comm), *model, g),
                  testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("amsgrad")));
    }
    {  // a float64 model
      torch_lm::TransformerLM dbl = torch_lm::MakeModel(Shape(), kSeed);
      dbl->to(torch::kFloat64);
      EXPECT_THAT(TorchOptimizer::Create(TorchConfig(1), testing::Borrow(comm), *dbl),
                  testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("parameter tok.weight")));
    }
    {  // stage 3 is the Engine's
      EXPECT_THAT(TorchOptimizer::Create(TorchConfig(3), testing::Borrow(comm), *model),
                  testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("stage")));
    }
  });
}

// bf16 in the config: the module's parameters and gradients become bf16 views over zero's fp32 master (as
// DeepSpeed halves the module), the model trains, and the master holds what bf16 cannot.
TEST(TorchMixedPrecision, Bf16ParametersOverAnFp32MasterTrain) {
  torch::set_num_threads(1);
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    torch_lm::TransformerLM model = FrozenEmbeddingsModel();
    Config cfg = TorchConfig(2);
    cfg.bf16.enabled = true;
    ASSERT_OK_AND_ASSIGN(auto opt, TorchOptimizer::Create(cfg, testing::Borrow(comm), *model,
                                                          torch_lm::TwoGroups(*model, kPeakLr, kWd)));
    for (const auto& p : model->named_parameters()) ASSERT_EQ(p.value().scalar_type(), torch::kBFloat16) << p.key();
    std::vector<double> losses;
    for (int t = 1; t <= 30; ++t) {
      opt->zero_grad();
      torch_lm::Batch b = torch_lm::MakeBatch(Shape(), t, rank * 4, rank * 4 + 4);
      torch::Tensor loss = model->forward(b.idx, b.targets);
      losses.push_back(loss.item<double>());
      loss.backward();
      ASSERT_OK(opt->step(kPeakLr).status());
    }
    EXPECT_LT(losses.back(), 0.8 * losses.front());
    // The optimizer state and the master are fp32 of this rank's half of the trainable parameters.
    const MemoryReport mem = opt->memory_report();
    EXPECT_GT(mem.Get(MemTier::kDevice, MemTag::kMaster).current, 0);
  });
}

}  // namespace
}  // namespace zero
