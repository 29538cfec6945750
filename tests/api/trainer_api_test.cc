// The trainer's API as a program that links zero sees it: this file includes zero/zero.h and no other header of
// zero's (its target has no include directory of zero's sources or tests), so it compiles only while the umbrella
// holds everything used here. It checks two promises of that API:
//   - the communicator FromEnv returns goes to Engine::Create and to ShardedOptimizer::Create as it is (no cast,
//     no std::move out of the StatusOr);
//   - a trainer's own Communicator, derived from zero::Communicator alone (not from zero/advanced/'s
//     ExtendedCommunicator), drives an Engine: the engine takes the defaults for what only the extension offers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "zero/zero.h"

namespace {

// FromEnv without launcher variables: a world of one, whatever the environment ctest runs in.
void ClearLauncherVariables() {
  for (const char* v :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
        "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "ZERO_STORE_DIR", "MASTER_ADDR", "MASTER_PORT"}) {
    ::unsetenv(v);
  }
}

zero::Config MakeConfig(int stage) {
  auto cfg = zero::Config::FromJsonString(
      R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.5}},
          "zero_optimization": {"stage": )" +
      std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0}})");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return cfg.ok() ? *cfg : zero::Config::Default();
}

TEST(TrainerApi, FromEnvFeedsBothEntryPointsWithoutACast) {
  ClearLauncherVariables();
  const zero::Config cfg = MakeConfig(1);
  auto comm = zero::Communicator::FromEnv(zero::Backend::kGloo);
  ASSERT_TRUE(comm.ok()) << comm.status();

  auto engine = zero::Engine::Create(cfg, *comm);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(&(*engine)->comm(), comm->get()) << "the engine shares the communicator it was given";

  const int64_t cap = zero::ShardedOptimizer::Capacity(4, (*comm)->world_size());
  std::vector<float> params(static_cast<size_t>(cap), 1.0f), grads(static_cast<size_t>(cap), 0.0f);
  zero::FlatBuffers flat{.params = params.data(), .grads = grads.data(), .capacity = cap, .tensors = {{"w", {4}}}};
  auto opt = zero::ShardedOptimizer::Create(cfg, *comm, {flat});
  ASSERT_TRUE(opt.ok()) << opt.status();
  for (int i = 0; i < 4; ++i) grads[static_cast<size_t>(i)] = 1.0f;
  auto step = (*opt)->Step();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FLOAT_EQ(params[0], 0.5f) << "SGD, lr 0.5, gradient 1";

  // The overload that takes the config's timeout returns the same type.
  auto from_config = zero::Communicator::FromEnv(zero::Backend::kGloo, cfg);
  ASSERT_TRUE(from_config.ok()) << from_config.status();
  auto second = zero::Engine::Create(cfg, *from_config);
  ASSERT_TRUE(second.ok()) << second.status();
}

// A trainer's own communicator: forwards to another and counts the ops it is given.
class CountingComm final : public zero::Communicator {
 public:
  explicit CountingComm(std::shared_ptr<zero::Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  zero::Backend backend() const override { return inner_->backend(); }
  absl::Duration timeout() const override { return inner_->timeout(); }
  zero::Work AllGather(const void* send, void* recv, size_t count, zero::DType dtype, CUstream_st* s) override {
    ++ops;
    return inner_->AllGather(send, recv, count, dtype, s);
  }
  zero::Work ReduceScatter(const void* send, void* recv, size_t count, zero::DType dtype, zero::ReduceOp op,
                           CUstream_st* s) override {
    ++ops;
    return inner_->ReduceScatter(send, recv, count, dtype, op, s);
  }
  zero::Work AllReduce(void* buf, size_t count, zero::DType dtype, zero::ReduceOp op, CUstream_st* s) override {
    ++ops;
    return inner_->AllReduce(buf, count, dtype, op, s);
  }
  zero::Work Broadcast(void* buf, size_t count, zero::DType dtype, int root, CUstream_st* s) override {
    ++ops;
    return inner_->Broadcast(buf, count, dtype, root, s);
  }
  zero::Work Barrier() override {
    ++ops;
    return inner_->Barrier();
  }
  int64_t ops = 0;

 private:
  std::shared_ptr<zero::Communicator> inner_;
};

TEST(TrainerApi, ATrainersOwnCommunicatorDrivesTheEngine) {
  ClearLauncherVariables();
  const zero::Config cfg = MakeConfig(3);
  auto inner = zero::Communicator::FromEnv(zero::Backend::kGloo);
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto comm = std::make_shared<CountingComm>(*inner);
  auto engine = zero::Engine::Create(cfg, comm);
  ASSERT_TRUE(engine.ok()) << engine.status();
  zero::Engine& e = **engine;
  auto unit = e.AddUnit("fc", {{"w", {8, 4}}});
  ASSERT_TRUE(unit.ok()) << unit.status();
  ASSERT_TRUE(e.Finalize([](const std::string&, const zero::ParamSpec& p, float* v) {
                 for (int64_t i = 0; i < p.numel(); ++i) v[i] = 1.0f;
               }).ok());
  {
    auto scope = e.Forward(*unit);
    ASSERT_TRUE(scope.ok()) << scope.status();
  }
  {
    auto scope = e.Backward(*unit);
    ASSERT_TRUE(scope.ok()) << scope.status();
    auto g = scope->Grad<float>("w");
    ASSERT_TRUE(g.ok()) << g.status();
    for (int i = 0; i < 32; ++i) (*g)[i] = 1.0f;
  }
  auto step = e.Step();
  ASSERT_TRUE(step.ok()) << step.status();
  auto w = e.GatherParam(*unit, "w");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FLOAT_EQ((*w)[31], 0.5f) << "SGD, lr 0.5, gradient 1";
  EXPECT_GT(comm->ops, 0) << "the engine's collectives went through the trainer's communicator";
  // Without the extension the bound counts no communicator staging; it still holds the model's state.
  EXPECT_GT(e.TruePeakBound(zero::MemTier::kDevice).model_state, 0);
}

}  // namespace
