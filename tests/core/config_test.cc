// Tests of zero::Config: the DeepSpeed-style JSON parser, validator, Resolve, ToJson, the generated reference
// (docs/guide/config.md) and the zero-config tool. Every rejection asserts that the message names the key.
#include "zero/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmath>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "support/status_matchers.h"
#include "zero/logging.h"

namespace zero {
namespace {

using ::zero::testing::StatusIs;

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Fixture(const std::string& name) { return std::string(ZERO_CONFIG_TEST_DIR) + "/" + name; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool HasWarning(const Config& c, const std::string& part) {
  for (const std::string& w : c.warnings()) {
    if (w.find(part) != std::string::npos) return true;
  }
  return false;
}

// Silences the warnings the parser logs (they are checked through Config::warnings()).
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([](LogLevel, std::string_view) {});
  }
  void TearDown() override { SetLogSink(nullptr); }

  static Config MustParse(const std::string& json) {
    StatusOr<Config> c = Config::FromJsonString(json);
    EXPECT_OK(c) << json;
    return c.ok() ? *std::move(c) : Config();
  }

  // The config must be rejected with kInvalidArgument and a message containing every part (the key path
  // first, then the value and/or the rule).
  static std::string ExpectRejected(const std::string& json, const std::vector<std::string>& parts) {
    StatusOr<Config> c = Config::FromJsonString(json);
    EXPECT_FALSE(c.ok()) << "accepted: " << json;
    if (c.ok()) return "";
    EXPECT_THAT(c, StatusIs(absl::StatusCode::kInvalidArgument));
    std::string msg(c.status().message());
    for (const std::string& p : parts) EXPECT_THAT(msg, HasSubstr(p)) << json;
    return msg;
  }

  // The config is valid for DeepSpeed but asks for a feature zero lacks: kUnimplemented, the message naming the
  // key and saying it is not implemented in zero.
  static void ExpectNotImplemented(const std::string& json, const std::string& path) {
    EXPECT_THAT(Config::FromJsonString(json),
                StatusIs(absl::StatusCode::kUnimplemented, HasSubstr(path + ": not implemented in zero")))
        << json;
  }
};

// ---------------------------------------------------------------------------------------------------------
// Accepted configs

TEST_F(ConfigTest, HuggingFaceZero2AutoConfigParses) {
  StatusOr<Config> c = Config::FromJsonFile(Fixture("hf_zero2_auto.json"));
  ASSERT_OK(c);
  EXPECT_EQ(c->zero.stage, 2);
  EXPECT_EQ(c->zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c->zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c->zero.allgather_bucket_size, 200'000'000);  // 2e8
  EXPECT_TRUE(c->zero.overlap_comm);
  ASSERT_TRUE(c->optimizer.has_value());
  EXPECT_EQ(c->optimizer->type, "AdamW");
  EXPECT_EQ(c->scheduler.type, "WarmupLR");
  EXPECT_EQ(c->steps_per_print, 2000);
  const std::vector<std::string> expected = {"fp16.enabled",
                                             "bf16.enabled",
                                             "optimizer.params.lr",
                                             "optimizer.params.betas",
                                             "optimizer.params.eps",
                                             "optimizer.params.weight_decay",
                                             "scheduler.params.warmup_min_lr",
                                             "scheduler.params.warmup_max_lr",
                                             "scheduler.params.warmup_num_steps",
                                             "zero_optimization.reduce_bucket_size",
                                             "gradient_accumulation_steps",
                                             "gradient_clipping",
                                             "train_batch_size",
                                             "train_micro_batch_size_per_gpu"};
  EXPECT_THAT(c->unresolved(), ::testing::UnorderedElementsAreArray(expected));
  // Only honest "has no effect" notes (keys the host engine accepts but does not need), nothing else.
  for (const auto& w : c->warnings()) EXPECT_NE(w.find("has no effect"), std::string::npos) << w;
}

TEST_F(ConfigTest, HuggingFaceZero2AutoResolvesLikeTheTrainerAndValidates) {
  StatusOr<Config> parsed = Config::FromJsonFile(Fixture("hf_zero2_auto.json"));
  ASSERT_OK(parsed);
  Config c = *parsed;
  const int world = 4, micro = 8, gas = 2, hidden = 1024;
  ASSERT_OK(c.Resolve("train_micro_batch_size_per_gpu", micro));
  ASSERT_OK(c.Resolve("gradient_accumulation_steps", gas));
  ASSERT_OK(c.Resolve("train_batch_size", world * micro * gas));
  ASSERT_OK(c.Resolve("gradient_clipping", 1.0));
  ASSERT_OK(c.Resolve("optimizer.params.lr", 3e-4));
  ASSERT_OK(c.Resolve("optimizer.params.betas", std::vector<double>{0.9, 0.95}));
  ASSERT_OK(c.Resolve("optimizer.params.eps", 1e-8));
  ASSERT_OK(c.Resolve("optimizer.params.weight_decay", 0.01));
  ASSERT_OK(c.Resolve("scheduler.params.warmup_min_lr", 0));
  ASSERT_OK(c.Resolve("scheduler.params.warmup_max_lr", 3e-4));
  ASSERT_OK(c.Resolve("scheduler.params.warmup_num_steps", 100));
  ASSERT_OK(c.Resolve("fp16.enabled", false));
  ASSERT_OK(c.Resolve("bf16.enabled", true));
  ASSERT_OK(c.Resolve("zero_optimization.reduce_bucket_size", static_cast<int64_t>(hidden) * hidden));
  EXPECT_TRUE(c.unresolved().empty());
  ASSERT_OK(c.Validate(world));
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.micro_batch(), 8);
  EXPECT_EQ(c.accumulation_steps(), 2);
  EXPECT_DOUBLE_EQ(c.optimizer->beta2, 0.95);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c.zero.reduce_bucket_size, 1024 * 1024);
  EXPECT_TRUE(c.bf16.enabled);
}

TEST_F(ConfigTest, Zero3WithCpuOffloadOfOptimizerAndParams) {
  StatusOr<Config> c = Config::FromJsonFile(Fixture("zero3_cpu_offload.json"));
  ASSERT_OK(c);
  EXPECT_EQ(c->zero.stage, 3);
  EXPECT_EQ(c->zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c->zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c->zero.offload_param.pin_memory);
  EXPECT_EQ(c->zero.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c->zero.stage3_param_persistence_threshold, 100'000);
  EXPECT_TRUE(c->zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_TRUE(c->bf16.enabled);
  EXPECT_EQ(c->scheduler.type, "WarmupCosineLR");
  EXPECT_EQ(c->scheduler.warmup_type, "linear");
  EXPECT_DOUBLE_EQ(c->scheduler.cos_min_ratio, 0.1);
  EXPECT_TRUE(c->activation_checkpointing.cpu_checkpointing);
  EXPECT_TRUE(c->unresolved().empty());
  Config v = *c;
  ASSERT_OK(v.Validate(8));
  EXPECT_EQ(v.train_batch_size, 4 * 2 * 8);
}

TEST_F(ConfigTest, DefaultConfigIsStage0Fp32AdamW) {
  Config c = Config::Default();
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16.enabled);
  ASSERT_TRUE(c.optimizer.has_value());
  EXPECT_EQ(c.optimizer->type, "AdamW");
  EXPECT_TRUE(c.optimizer->adam_w_mode);
  ASSERT_OK(c.Validate(2));
  EXPECT_EQ(c.train_batch_size, 2);
}

// The table, not the C++ initializers, is the source of truth; they must agree so that a default-constructed
// Config means what the reference says.
TEST_F(ConfigTest, StructDefaultsMatchTheSchemaTable) {
  EXPECT_TRUE(MustParse("{}") == Config());
  Config with_opt = MustParse(R"({"optimizer": {"type": "AdamW"}})");
  ASSERT_TRUE(with_opt.optimizer.has_value());
  EXPECT_TRUE(*with_opt.optimizer == OptimizerConfig());
}

TEST_F(ConfigTest, DeepSpeedSourceDefaults) {
  Config c = MustParse(R"({"zero_optimization": {"stage": 2}})");
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50'000'000);  // code says 5e7; DeepSpeed's docs say 5e8
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c.zero.stage3_model_persistence_threshold, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNone);  // docs say cpu; code says none
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.aio.block_size, 1'048'576);
  EXPECT_EQ(c.comm_timeout_s, 1800.0);
  EXPECT_EQ(c.gradient_accumulation_mode, GradAccumulationMode::kLowMemory);
}

TEST_F(ConfigTest, OverlapCommDefaultsToTrueOnlyForStage3) {
  EXPECT_FALSE(MustParse(R"({"zero_optimization": {"stage": 1}})").zero.overlap_comm);
  EXPECT_FALSE(MustParse(R"({"zero_optimization": {"stage": 2}})").zero.overlap_comm);
  EXPECT_TRUE(MustParse(R"({"zero_optimization": {"stage": 3}})").zero.overlap_comm);
  EXPECT_FALSE(MustParse(R"({"zero_optimization": {"stage": 3, "overlap_comm": false}})").zero.overlap_comm);
  EXPECT_TRUE(MustParse(R"({"zero_optimization": {"stage": 3, "overlap_comm": null}})").zero.overlap_comm);
  EXPECT_TRUE(MustParse(R"({"zero_optimization": {"stage": 1, "overlap_comm": true}})").zero.overlap_comm);
}

TEST_F(ConfigTest, ScientificNotationAndIntegralFloatsForIntegerKeys) {
  Config c = MustParse(R"({"zero_optimization": {"stage": 3.0, "reduce_bucket_size": 5e8,
      "stage3_max_live_parameters": 1E9, "stage3_prefetch_bucket_size": 5.0e7}, "gradient_clipping": 1})");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1'000'000'000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
}

TEST_F(ConfigTest, FractionForAnIntegerKeyIsRejected) {
  ExpectRejected(R"({"zero_optimization": {"reduce_bucket_size": 3.5}})",
                 {"zero_optimization.reduce_bucket_size", "3.5", "an integer"});
  ExpectRejected(R"({"train_micro_batch_size_per_gpu": 2.5e0})", {"train_micro_batch_size_per_gpu", "2.5"});
}

TEST_F(ConfigTest, CommentsAreAllowedLikeDeepSpeedsHjson) {
  Config c = MustParse("{\n  // ZeRO-1\n  \"zero_optimization\": {\"stage\": 1 /* inline */}\n}");
  EXPECT_EQ(c.zero.stage, 1);
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer and scheduler

TEST_F(ConfigTest, AdamMeansAdamWUnlessAdamWModeIsFalse) {
  Config a = MustParse(R"({"optimizer": {"type": "adam", "params": {"lr": 0.01}}})");
  EXPECT_EQ(a.optimizer->type, "Adam");  // DeepSpeed matches case-insensitively; stored canonically
  EXPECT_TRUE(a.optimizer->adam_w_mode);
  Config b = MustParse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
  EXPECT_FALSE(b.optimizer->adam_w_mode);
  Config w = MustParse(R"({"optimizer": {"type": "ADAMW"}})");
  EXPECT_EQ(w.optimizer->type, "AdamW");
  EXPECT_TRUE(w.optimizer->adam_w_mode);
}

TEST_F(ConfigTest, AdamWWithAdamWModeFalseIsRejected) {
  ExpectRejected(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})",
                 {"optimizer.params.adam_w_mode", "AdamW"});
}

TEST_F(ConfigTest, OptimizerTypeRules) {
  EXPECT_EQ(MustParse(R"({"optimizer": {"type": "sgd", "params": {"momentum": 0.9}}})").optimizer->type, "SGD");
  ExpectNotImplemented(R"({"optimizer": {"type": "Lamb"}})", "optimizer.type");
  ExpectRejected(R"({"optimizer": {"type": "AdamX"}})", {"optimizer.type", "\"AdamX\"", "did you mean"});
  ExpectRejected(R"({"optimizer": {"params": {"lr": 0.1}}})", {"optimizer.type", "required"});
}

TEST_F(ConfigTest, MaxGradNormInOptimizerParamsIsRejectedWithDeepSpeedsMessage) {
  ExpectRejected(R"({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})",
                 {"optimizer.params.max_grad_norm", "gradient_clipping", "not supported as an optimizer parameter"});
}

TEST_F(ConfigTest, TorchAdamIsAcceptedAndIgnoredWithAWarning) {
  Config c = MustParse(R"({"optimizer": {"type": "Adam", "params": {"torch_adam": true}}})");
  EXPECT_TRUE(HasWarning(c, "optimizer.params.torch_adam"));
  EXPECT_TRUE(MustParse(R"({"optimizer": {"type": "Adam", "params": {"torch_adam": false}}})").warnings().empty());
}

TEST_F(ConfigTest, OptimizerParamsMustBelongToTheType) {
  ExpectRejected(R"({"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})",
                 {"optimizer.params.betas", "not a parameter of SGD"});
  ExpectRejected(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})",
                 {"optimizer.params.momentum", "not a parameter of AdamW"});
  ExpectRejected(R"({"optimizer": {"type": "SGD", "params": {"nesterov": true}}})",
                 {"optimizer.params.nesterov", "momentum"});
  ExpectRejected(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.0]}}})",
                 {"optimizer.params.betas", "[0.9,1.0]", "[0, 1)"});
  ExpectRejected(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})", {"optimizer.params.betas"});
}

TEST_F(ConfigTest, SchedulerParamsPerTypeAsInDeepSpeedsLrSchedules) {
  Config warm = MustParse(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.02}},
                              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})");
  EXPECT_DOUBLE_EQ(warm.scheduler.warmup_max_lr, 0.02);  // WarmupLR takes the optimizer's lr by default
  Config decay = MustParse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100,
                               "warmup_max_lr": 0.1, "warmup_type": "linear"}}})");
  EXPECT_EQ(decay.scheduler.total_num_steps, 100);
  ExpectRejected(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10,
                     "warmup_max_lr": 0.1}}})",
                 {"scheduler.params.warmup_max_lr", "not a parameter of WarmupCosineLR"});
  ExpectRejected(R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})",
                 {"scheduler.params.cos_min_ratio", "not a parameter of WarmupLR"});
  ExpectRejected(R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})",
                 {"scheduler.params.total_num_steps", "required"});
  ExpectRejected(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})",
                 {"scheduler.params.warmup_num_steps", ">= 1", "got 0"});
  ExpectRejected(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})",
                 {"scheduler.params.warmup_type", "\"cosine\"", "`log`"});
  ExpectRejected(R"({"scheduler": {"type": "WarmupLr"}})", {"scheduler.type", "did you mean \"WarmupLR\""});
  ExpectNotImplemented(R"({"scheduler": {"type": "OneCycle"}})", "scheduler.type");
  Config warn = MustParse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10,
                              "warmup_num_steps": 100}}})");
  EXPECT_TRUE(HasWarning(warn, "scheduler.params.total_num_steps"));
}

// ---------------------------------------------------------------------------------------------------------
// Unknown keys

TEST_F(ConfigTest, UnknownTopLevelKeySuggestsTheClosest) {
  ExpectRejected(R"({"train_micro_batch_size_per_gpus": 4})",
                 {"train_micro_batch_size_per_gpus: unknown key", "did you mean \"train_micro_batch_size_per_gpu\""});
  ExpectRejected(R"({"tensorbord": {}})", {"tensorbord: unknown key", "did you mean \"tensorboard\""});
}

TEST_F(ConfigTest, UnknownNestedKeyNamesTheFullPath) {
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memroy": true}}})",
                 {"zero_optimization.offload_optimizer.pin_memroy: unknown key",
                  "did you mean \"zero_optimization.offload_optimizer.pin_memory\""});
  ExpectRejected(R"({"zero_optimization": {"stage3_prefetch_bucket": 1}})",
                 {"zero_optimization.stage3_prefetch_bucket: unknown key",
                  "did you mean \"zero_optimization.stage3_prefetch_bucket_size\""});
}

TEST_F(ConfigTest, MisplacedKeySuggestsWhereItBelongs) {
  ExpectRejected(R"({"stage3_param_persistence_threshold": 1000})",
                 {"stage3_param_persistence_threshold: unknown key",
                  "did you mean \"zero_optimization.stage3_param_persistence_threshold\""});
}

TEST_F(ConfigTest, EveryErrorIsReportedAtOnce) {
  std::string msg = ExpectRejected(R"({"zero_optimization": {"stage": 7, "reduce_bucket_size": -1}, "fooo": 1})",
                                   {"zero_optimization.stage", "zero_optimization.reduce_bucket_size", "fooo"});
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 2) << msg;
}

// ---------------------------------------------------------------------------------------------------------
// Invalid values: key, value and rule

TEST_F(ConfigTest, StageOutsideZeroToThree) {
  ExpectRejected(R"({"zero_optimization": {"stage": 4}})", {"zero_optimization.stage", "got 4", "[0, 3]"});
  ExpectRejected(R"({"zero_optimization": {"stage": -1}})", {"zero_optimization.stage", "got -1"});
}

TEST_F(ConfigTest, NegativeSizesAreRejected) {
  ExpectRejected(R"({"zero_optimization": {"reduce_bucket_size": -5}})",
                 {"zero_optimization.reduce_bucket_size", "got -5", ">= 0"});
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": -1e7}})",
                 {"zero_optimization.stage3_prefetch_bucket_size", ">= 0"});
  ExpectRejected(R"({"zero_optimization": {"sub_group_size": -1}})", {"zero_optimization.sub_group_size"});
  ExpectRejected(R"({"gradient_clipping": -1.0})", {"gradient_clipping", "got -1.0", ">= 0"});
  ExpectRejected(R"({"train_batch_size": 0})", {"train_batch_size", "got 0", ">= 1"});
}

TEST_F(ConfigTest, Fp16AndBf16BothEnabledIsRejected) {
  ExpectRejected(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
                 {"fp16.enabled", "bf16.enabled", "cannot both be true"});
}

TEST_F(ConfigTest, BatchKeysThatCannotMultiplyOutAreRejectedAtParse) {
  ExpectRejected(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})",
                 {"train_batch_size", "30", "not a multiple"});
}

TEST_F(ConfigTest, ValidateDerivesBatchKeysLikeDeepSpeed) {
  struct Case {
    const char* json;
    int world;
    int64_t train, micro, gas;
  };
  const Case cases[] = {
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", 4, 32, 4,
       2},
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 2, 32, 4, 4},
      {R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})", 4, 32, 2, 4},
      {R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})", 2, 30, 3, 5},
      {R"({"train_batch_size": 16})", 4, 16, 4, 1},
      {R"({"train_micro_batch_size_per_gpu": 6})", 3, 18, 6, 1},
  };
  for (const Case& tc : cases) {
    Config c = MustParse(tc.json);
    ASSERT_OK(c.Validate(tc.world)) << tc.json;
    EXPECT_EQ(c.train_batch_size, tc.train) << tc.json;
    EXPECT_EQ(c.train_micro_batch_size_per_gpu, tc.micro) << tc.json;
    EXPECT_EQ(c.gradient_accumulation_steps, tc.gas) << tc.json;
  }
  // Derived keys are derived afresh for another world size.
  Config c = MustParse(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})");
  ASSERT_OK(c.Validate(2));
  EXPECT_EQ(c.train_batch_size, 12);
  ASSERT_OK(c.Validate(4));
  EXPECT_EQ(c.train_batch_size, 24);
}

// elastic_batch keep_micro: the batch keys as written for reference_world_size; at another world the micro-batch
// and accumulation stay, the global batch follows, and the learning rate scales by the stated rule. keep_global
// (the default) is DeepSpeed's derivation, with a world the batch does not divide an error naming the numbers.
TEST_F(ConfigTest, ElasticBatchKeepMicroFollowsTheWorldAndScalesTheLearningRate) {
  const std::string keys = R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4)";
  auto at = [&](const std::string& elastic, int world) {
    Config c = MustParse(absl::StrCat("{", keys, R"(, "elastic_batch": {)", elastic, "}}"));
    EXPECT_OK(c.Validate(world)) << elastic << " at world " << world;
    return c;
  };
  // Written for 4 ranks: micro 4, accumulation 2, global 32.
  Config three = at(R"("policy": "keep_micro", "reference_world_size": 4, "lr_scaling": "sqrt")", 3);
  EXPECT_EQ(three.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(three.gradient_accumulation_steps, 2);
  EXPECT_EQ(three.train_batch_size, 24);
  EXPECT_DOUBLE_EQ(three.elastic_batch.lr_multiplier, std::sqrt(0.75));
  Config linear = at(R"("policy": "keep_micro", "reference_world_size": 4, "lr_scaling": "linear")", 2);
  EXPECT_EQ(linear.train_batch_size, 16);
  EXPECT_DOUBLE_EQ(linear.elastic_batch.lr_multiplier, 0.5);
  Config none = at(R"("policy": "keep_micro", "reference_world_size": 4)", 8);
  EXPECT_EQ(none.train_batch_size, 64);
  EXPECT_DOUBLE_EQ(none.elastic_batch.lr_multiplier, 1.0);
  // At the reference world: the keys as written.
  Config same = at(R"("policy": "keep_micro", "reference_world_size": 4, "lr_scaling": "linear")", 4);
  EXPECT_EQ(same.train_batch_size, 32);
  EXPECT_DOUBLE_EQ(same.elastic_batch.lr_multiplier, 1.0);
  // Validated again at another world: from the keys as given, not from the last world's.
  ASSERT_OK(three.Validate(4));
  EXPECT_EQ(three.train_batch_size, 32);
  EXPECT_DOUBLE_EQ(three.elastic_batch.lr_multiplier, 1.0);
  ASSERT_OK(three.Validate(1));
  EXPECT_EQ(three.train_batch_size, 8);
  EXPECT_DOUBLE_EQ(three.elastic_batch.lr_multiplier, 0.5);
  // keep_global at 3 ranks: 32 does not split.
  Config global = MustParse(absl::StrCat("{", keys, "}"));
  const Status s = global.Validate(3);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("train_batch_size 32"), HasSubstr("world_size 3")));
  // Rules between the keys.
  Config no_ref = MustParse(absl::StrCat("{", keys, R"(, "elastic_batch": {"policy": "keep_micro"}})"));
  EXPECT_THAT(std::string(no_ref.Validate(2).message()), HasSubstr("elastic_batch.reference_world_size"));
  Config scaled_global = MustParse(absl::StrCat("{", keys, R"(, "elastic_batch": {"lr_scaling": "linear"}})"));
  EXPECT_THAT(std::string(scaled_global.Validate(4).message()), HasSubstr("keep_global keeps"));
  ExpectRejected(R"({"elastic_batch": {"policy": "keep_both"}})", {"elastic_batch.policy", "keep_micro"});
}

TEST_F(ConfigTest, ValidateRejectsBatchKeysThatDoNotMultiplyOut) {
  StatusOr<Config> parsed = Config::FromJsonFile(Fixture("batch_32_4_2.json"));
  ASSERT_OK(parsed);
  Config c = *parsed;
  Status s = c.Validate(2);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("train_batch_size"), HasSubstr("32"), HasSubstr("world_size 2")));
  EXPECT_TRUE(c == *parsed);  // unchanged on error
  ASSERT_OK(c.Validate(4));

  Config small = MustParse(R"({"train_batch_size": 2})");
  s = small.Validate(4);  // micro = 2 / 4 = 0
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("train_micro_batch_size_per_gpu"));

  Config none = MustParse(R"({"gradient_accumulation_steps": 2})");
  s = none.Validate(1);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("train_batch_size"), HasSubstr("train_micro_batch_size_per_gpu")));
  EXPECT_FALSE(Config::Default().Validate(0).ok());
}

TEST_F(ConfigTest, OffloadParamNeedsStage3) {
  StatusOr<Config> c = Config::FromJsonFile(Fixture("invalid_offload_param_stage2.json"));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              AllOf(HasSubstr("invalid_offload_param_stage2.json: zero_optimization.offload_param.device"),
                    HasSubstr("\"cpu\""), HasSubstr("stage 3")));
  // device none at stage 2 is fine (DeepSpeed's default section).
  MustParse(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "none"}}})");
}

TEST_F(ConfigTest, OffloadOptimizerNeedsAShardingStage) {
  ExpectRejected(R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})",
                 {"zero_optimization.offload_optimizer.device", "stage 0"});
  MustParse(R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})");
}

TEST_F(ConfigTest, OffloadRatioRules) {
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})",
                 {"zero_optimization.offload_optimizer.ratio", "1.5", "[0, 1]"});
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": -0.1}}})",
                 {"zero_optimization.offload_optimizer.ratio", "-0.1"});
  ExpectRejected(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
                 {"zero_optimization.offload_optimizer.ratio", "0.5", "stage 3"});
  EXPECT_DOUBLE_EQ(
      MustParse(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})")
          .zero.offload_optimizer.ratio,
      0.3);
}

TEST_F(ConfigTest, PowerOfTwoAndEvenRules) {
  // An invalid block size is invalid; a valid one other than the default is the NVMe tier's I/O engine's.
  ExpectRejected(R"({"aio": {"block_size": 1000000}})", {"aio.block_size", "1000000", "a power of 2"});
  EXPECT_EQ(MustParse(R"({"aio": {"block_size": 262144}})").aio.block_size, 262'144);
  EXPECT_EQ(MustParse(R"({"aio": {"block_size": 1048576}})").aio.block_size, 1'048'576);
  ExpectRejected(R"({"zero_optimization": {"allgather_bucket_size": 5}})",
                 {"zero_optimization.allgather_bucket_size", "got 5", "a multiple of 2"});
}

TEST_F(ConfigTest, OffloadDeviceMustBeNoneCpuOrNvme) {
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})",
                 {"zero_optimization.offload_param.device", "\"gpu\"", "`none`, `cpu`"});
  // nvme is built (tests/offload/param_nvme_test.cc) and needs its nvme_path.
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})",
                 {"zero_optimization.offload_param.nvme_path", "empty with device \"nvme\""});
  EXPECT_EQ(MustParse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"}}})")
                .zero.offload_param.device,
            OffloadDevice::kNvme);
}

TEST_F(ConfigTest, WrongTypesAreRejected) {
  ExpectRejected(R"({"zero_optimization": {"stage": "two"}})", {"zero_optimization.stage", "\"two\"", "an integer"});
  ExpectRejected(R"({"fp16": {"enabled": "yes"}})", {"fp16.enabled", "\"yes\"", "true or false"});
  ExpectRejected(R"({"fp16": {"enabled": 1}})", {"fp16.enabled", "got 1"});
  ExpectRejected(R"({"fp16": true})", {"fp16", "must be an object"});
  ExpectRejected(R"({"zero_optimization": {"stage": 1, "contiguous_gradients": null}})",
                 {"zero_optimization.contiguous_gradients", "got null"});
  ExpectRejected(R"({"communication_data_type": "int8"})", {"communication_data_type", "\"int8\""});
  ExpectRejected(R"({"seed": -3})", {"seed", "got -3"});
  ExpectRejected(R"({"comm_timeout_s": 0})", {"comm_timeout_s", "in [0.001, 1000000000]"});
  ExpectRejected(R"({"fp16": {"min_loss_scale": 0}})", {"fp16.min_loss_scale", "> 0"});
  ExpectRejected(R"({"fp16": {"hysteresis": 3000000000}})", {"fp16.hysteresis", "out of range"});
  ExpectRejected("[1, 2]", {"JSON object"});
}

TEST_F(ConfigTest, OursKeysParse) {
  Config c = MustParse(R"({"seed": 42, "comm_timeout_s": 30, "gradient_accumulation_mode": "low_communication",
                           "communication_data_type": "BF16",
                           "bf16": {"enabled": true, "nonfinite_grads": "error", "stochastic_rounding": true}})");
  EXPECT_EQ(c.seed, 42u);
  EXPECT_DOUBLE_EQ(c.comm_timeout_s, 30.0);
  EXPECT_EQ(c.gradient_accumulation_mode, GradAccumulationMode::kLowCommunication);
  EXPECT_EQ(c.communication_data_type, "bf16");
  EXPECT_EQ(c.bf16.nonfinite_grads, NonFinitePolicy::kError);
  EXPECT_TRUE(c.bf16.stochastic_rounding);
  ExpectRejected(R"({"gradient_accumulation_mode": "low_mem"})",
                 {"gradient_accumulation_mode", "\"low_mem\"", "did you mean \"low_memory\""});
  EXPECT_TRUE(HasWarning(MustParse(R"({"bf16": {"stochastic_rounding": true}})"), "bf16.stochastic_rounding"));
  // LoCo's residuals in int8 blocks: parsed, a misspelling refused by name, and with nothing to keep (qgZ or its
  // error feedback off) a warning that it has no effect.
  const Config loco = MustParse(R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true,
                                    "zero_quantized_gradients_error_feedback_dtype": "int8"}})");
  EXPECT_EQ(loco.zero.zero_quantized_gradients_error_feedback_dtype, QgzResidualDType::kInt8);
  EXPECT_FALSE(HasWarning(loco, "zero_quantized_gradients_error_feedback_dtype"));
  EXPECT_EQ(MustParse("{}").zero.zero_quantized_gradients_error_feedback_dtype, QgzResidualDType::kCompute);
  ExpectRejected(R"({"zero_optimization": {"zero_quantized_gradients_error_feedback_dtype": "int4"}})",
                 {"zero_optimization.zero_quantized_gradients_error_feedback_dtype", "\"int4\""});
  EXPECT_TRUE(HasWarning(MustParse(R"({"zero_optimization": {"stage": 3,
                                       "zero_quantized_gradients_error_feedback_dtype": "int8"}})"),
                         "zero_quantized_gradients_error_feedback_dtype"));
  EXPECT_TRUE(HasWarning(MustParse(R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true,
                                       "zero_quantized_gradients_error_feedback": false,
                                       "zero_quantized_gradients_error_feedback_dtype": "int8"}})"),
                         "has no effect"));
}

// ---------------------------------------------------------------------------------------------------------
// Keys DeepSpeed knows that zero does not implement

TEST_F(ConfigTest, UnimplementedKeysAreAcceptedAtTheirOffValue) {
  Config c = MustParse(R"({
    "fp16": {"auto_cast": false, "fp16_master_weights_and_grads": false},
    "bf16": {"immediate_grad_update": false},
    "activation_checkpointing": {"partition_activations": false},
    "data_types": {"grad_accum_dtype": "fp32"},
    "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 1, "zero_quantized_weights": false,
      "zero_quantized_gradients": false, "zero_quantized_nontrainable_weights": false, "mics_shard_size": -1,
      "mics_hierarchical_params_gather": false, "elastic_checkpoint": false, "legacy_stage1": false,
      "zeropp_loco_param": null, "zenflow": null, "leaf_module": {}, "stage3_module_granularity_threshold": 0,
      "load_from_fp32_weights": true, "offload_param": {"device": "none"}}})");
  EXPECT_TRUE(c.warnings().empty()) << c.warnings().front();
  EXPECT_EQ(c.zero.zero_hpz_partition_size, 1);
}

TEST_F(ConfigTest, UnimplementedKeysAreErrorsWhenTurnedOn) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"zero_optimization": {"stage": 3, "mics_hierarchical_params_gather": true}})",
       "zero_optimization.mics_hierarchical_params_gather"},
      {R"({"zero_optimization": {"stage": 2, "elastic_checkpoint": true}})", "zero_optimization.elastic_checkpoint"},
      {R"({"zero_optimization": {"stage": 3, "zenflow": {"topk_ratio": 0.1}}})", "zero_optimization.zenflow"},
      {R"({"zero_optimization": {"stage": 3, "load_from_fp32_weights": false}})",
       "zero_optimization.load_from_fp32_weights"},
      {R"({"fp16": {"enabled": true, "auto_cast": true}})", "fp16.auto_cast"},
      {R"({"bf16": {"enabled": true, "immediate_grad_update": true}})", "bf16.immediate_grad_update"},
      {R"({"activation_checkpointing": {"partition_activations": true}})",
       "activation_checkpointing.partition_activations"},
      {R"({"data_types": {"grad_accum_dtype": "bf16"}})", "data_types.grad_accum_dtype"},
  };
  for (const auto& [json, path] : cases) ExpectNotImplemented(json, path);
}

// ZeRO++ hpZ: stage 3 only, a divisor of the world, not with hybrid sharding or offload_param, each refusal naming
// the keys (Engine::Create adds the ranks per host: tests/shard/hpz_test.cc).
TEST_F(ConfigTest, HpzPartitionSizeCrossRules) {
  Config ok = MustParse(
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})");
  EXPECT_EQ(ok.zero.zero_hpz_partition_size, 2);
  EXPECT_OK(ok.Validate(4));
  EXPECT_THAT(ok.Validate(3), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("zero_optimization.zero_hpz_partition_size: 2 does not divide the "
                                                 "world size 3")));
  ExpectRejected(R"({"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}})",
                 {"zero_optimization.zero_hpz_partition_size: 2 with zero_optimization.stage 2", "needs stage 3"});
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2, "mics_shard_size": 2}})",
                 {"zero_optimization.zero_hpz_partition_size: 2 with zero_optimization.mics_shard_size 2"});
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2,
                    "offload_param": {"device": "cpu"}}})",
                 {"zero_optimization.zero_hpz_partition_size: 2 with zero_optimization.offload_param.device"});
}

TEST_F(ConfigTest, KeysWithoutEffectWarnOnlyWhenNotDefault) {
  Config quiet = MustParse(R"({"zero_optimization": {"use_multi_rank_bucket_allreduce": true,
                               "memory_efficient_linear": true}})");
  EXPECT_TRUE(quiet.warnings().empty());
  Config loud = MustParse(R"({"zero_optimization": {"use_multi_rank_bucket_allreduce": false,
                              "override_module_apply": false}, "bf16": {"check_grad_overflow": false}})");
  EXPECT_TRUE(HasWarning(loud, "zero_optimization.use_multi_rank_bucket_allreduce"));
  EXPECT_TRUE(HasWarning(loud, "zero_optimization.override_module_apply"));
  EXPECT_TRUE(HasWarning(loud, "bf16.check_grad_overflow"));
}

TEST_F(ConfigTest, OtherDeepSpeedSubsystemsAreIgnoredWithAOneLineWarning) {
  Config c = MustParse(R"({"tensorboard": {"enabled": true, "output_path": "/tmp/tb"},
      "wandb": {"enabled": true}, "flops_profiler": {"enabled": false}, "comms_logger": {"enabled": true},
      "zero_allow_untested_optimizer": true, "seq_parallel_communication_data_type": "bf16",
      "zero_optimization": {"stage": 1}})");
  for (const char* key : {"tensorboard", "wandb", "flops_profiler", "comms_logger", "zero_allow_untested_optimizer",
                          "seq_parallel_communication_data_type"}) {
    EXPECT_TRUE(HasWarning(c, std::string(key) + ": ")) << key;
  }
  EXPECT_EQ(c.warnings().size(), 6u);
  for (const std::string& w : c.warnings()) {
    EXPECT_THAT(w, HasSubstr("zero ignores it"));
    EXPECT_EQ(w.find('\n'), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Drift against DeepSpeed's current source (runtime/constants.py, zero/config.py, offload_config.py,
// precision_config.py, swap_tensor/aio_config.py)

TEST_F(ConfigTest, SeqParallelCommunicationDataTypeIsSpelledAsInDeepSpeed) {
  Config c = MustParse(R"({"seq_parallel_communication_data_type": "bf16"})");
  EXPECT_TRUE(HasWarning(c, "seq_parallel_communication_data_type: "));
  ExpectRejected(R"({"seq_parallel_comm_data_type": "bf16"})",
                 {"seq_parallel_comm_data_type: unknown key", "did you mean \"seq_parallel_communication_data_type\""});
}

TEST_F(ConfigTest, LogLevelIsAcceptedWithoutEffect) {
  Config c = MustParse(R"({"log_level": "info"})");
  EXPECT_TRUE(HasWarning(c, "log_level: accepted but has no effect in zero"));
  EXPECT_TRUE(HasWarning(c, "ZERO_LOG_LEVEL"));
  EXPECT_EQ(nlohmann::json::parse(c.ToJson())["log_level"], "info");
  // Reading a config changes no process-wide state: zero's own level is untouched.
  const LogLevel before = CurrentLogLevel();
  MustParse(R"({"log_level": "debug"})");
  EXPECT_EQ(CurrentLogLevel(), before);
  EXPECT_TRUE(MustParse(R"({"log_level": null})").warnings().empty());
}

TEST_F(ConfigTest, PinMemoryAndBf16CheckGradOverflowDefaultToTrueAsUpstream) {
  Config c = MustParse(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                           "offload_param": {"device": "cpu"}}})");
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_TRUE(c.zero.offload_param.pin_memory);
  EXPECT_TRUE(Config().zero.offload_optimizer.pin_memory);
  EXPECT_TRUE(Config().zero.offload_param.pin_memory);
  EXPECT_FALSE(MustParse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                             "pin_memory": false}}})")
                   .zero.offload_optimizer.pin_memory);
  // With true the default, DeepSpeed's deprecated cpu_offload_use_pin_memory false is what turns pinning off.
  Config unpinned = MustParse(R"({"zero_optimization": {"stage": 3, "cpu_offload_use_pin_memory": false,
                                  "offload_param": {"device": "cpu"}}})");
  EXPECT_FALSE(unpinned.zero.offload_optimizer.pin_memory);
  EXPECT_FALSE(unpinned.zero.offload_param.pin_memory);
  EXPECT_TRUE(HasWarning(unpinned, "zero_optimization.cpu_offload_use_pin_memory"));
  nlohmann::json j = nlohmann::json::parse(c.ToJson());
  EXPECT_EQ(j["bf16"]["check_grad_overflow"], true);
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["pin_memory"], true);
  // At the new default nothing warns; false warns that zero checks anyway.
  EXPECT_TRUE(MustParse(R"({"bf16": {"enabled": true, "check_grad_overflow": true}})").warnings().empty());
  EXPECT_TRUE(HasWarning(MustParse(R"({"bf16": {"enabled": true, "check_grad_overflow": false}})"),
                         "bf16.check_grad_overflow"));
}

TEST_F(ConfigTest, KeysDeepSpeedNeverHadAreUnknown) {
  ExpectRejected(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                     "convert_grad_on_cpu": true}}})",
                 {"zero_optimization.offload_optimizer.convert_grad_on_cpu: unknown key"});
  ExpectRejected(R"({"zero_optimization": {"stage3_partition_stream_chunk_size": 0}})",
                 {"zero_optimization.stage3_partition_stream_chunk_size: unknown key"});
  ExpectRejected(R"({"zero_optimization": {"partition_stream_chunk_size": 0}})",
                 {"zero_optimization.partition_stream_chunk_size: unknown key"});
  ExpectRejected(R"({"aio": {"io_backend": "posix"}})", {"aio.io_backend: unknown key"});
}

TEST_F(ConfigTest, KeysThatChangeTheMathAreNotImplementedAtNonDefaultValues) {
  ExpectNotImplemented(R"({"gradient_predivide_factor": 2.0})", "gradient_predivide_factor");
  ExpectNotImplemented(R"({"prescale_gradients": true})", "prescale_gradients");
  ExpectNotImplemented(R"({"gradient_allreduce_op": "sum"})", "gradient_allreduce_op");
  ExpectNotImplemented(R"({"gradient_allreduce_op": "SUM"})", "gradient_allreduce_op");  // DeepSpeed lowercases
  ExpectNotImplemented(R"({"checkpoint": {"load_universal": true}})", "checkpoint.load_universal");
  EXPECT_THAT(
      Config::FromJsonFile(Fixture("unimplemented_predivide.json")),
      StatusIs(absl::StatusCode::kUnimplemented,
               HasSubstr("unimplemented_predivide.json: gradient_predivide_factor: not implemented in zero; got 2.0")));
  ExpectRejected(R"({"gradient_allreduce_op": "max"})", {"gradient_allreduce_op", "\"max\"", "`mean`"});
  ExpectRejected(R"({"gradient_predivide_factor": "2"})", {"gradient_predivide_factor", "a number"});
  // DeepSpeed's defaults are accepted without a word.
  Config c = MustParse(R"({"gradient_predivide_factor": 1, "prescale_gradients": false,
                           "gradient_allreduce_op": "Mean", "checkpoint": {"load_universal": false}})");
  EXPECT_TRUE(c.warnings().empty()) << c.warnings().front();
}

// The NVMe keys not built: offload_param.max_in_cpu (the parameter tier keeps no shards in host memory beyond its
// buffers), fast_init, use_gds. The parameter and optimizer tiers' keys are (tests/offload/nvme_test.cc,
// param_nvme_test.cc).
TEST_F(ConfigTest, NvmeKeysAreNotImplementedAtNonDefaultValues) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "max_in_cpu": 1e8}}})",
       "zero_optimization.offload_param.max_in_cpu"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "fast_init": true}}})",
       "zero_optimization.offload_optimizer.fast_init"},
      {R"({"aio": {"use_gds": true}})", "aio.use_gds"},
  };
  for (const auto& [json, path] : cases) ExpectNotImplemented(json, path);
  // The NVMe tier's keys take their values.
  const Config nvme = MustParse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/nvme", "buffer_count": 5, "pipeline_read": true, "pipeline_write": true}},
      "aio": {"block_size": 2097152, "queue_depth": 32, "single_submit": true, "overlap_events": false}})");
  EXPECT_EQ(nvme.zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(nvme.zero.offload_optimizer.nvme_path, "/nvme");
  EXPECT_EQ(nvme.zero.offload_optimizer.buffer_count, 5);
  EXPECT_TRUE(nvme.zero.offload_optimizer.pipeline_read && nvme.zero.offload_optimizer.pipeline_write);
  EXPECT_EQ(nvme.aio.block_size, 2'097'152);
  EXPECT_EQ(nvme.aio.queue_depth, 32);
  EXPECT_TRUE(nvme.aio.single_submit);
  EXPECT_FALSE(nvme.aio.overlap_events);
  const Config params = MustParse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
      "nvme_path": "/nvme", "buffer_count": 8, "buffer_size": 1e9, "pin_memory": false}}})");
  EXPECT_EQ(params.zero.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(params.zero.offload_param.nvme_path, "/nvme");
  EXPECT_EQ(params.zero.offload_param.buffer_count, 8);
  EXPECT_EQ(params.zero.offload_param.buffer_size, 1'000'000'000);
  // intra_op_parallelism (thread_count) is accepted with a warning: a request already runs queue_depth wide.
  const Config threads = MustParse(R"({"aio": {"thread_count": 4}})");
  EXPECT_FALSE(threads.warnings().empty());
  // DeepSpeed's defaults, spelled out as its docs print them, are accepted without a word.
  Config c = MustParse(R"({"zero_optimization": {"stage": 3,
      "offload_param": {"device": "cpu", "nvme_path": null, "buffer_count": 5, "buffer_size": 1e8,
                        "max_in_cpu": 1e9},
      "offload_optimizer": {"device": "cpu", "nvme_path": null, "buffer_count": 4, "pipeline_read": false,
                            "pipeline_write": false, "fast_init": false}},
      "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": false,
              "overlap_events": true, "use_gds": false}})");
  EXPECT_TRUE(c.warnings().empty()) << c.warnings().front();
}

TEST_F(ConfigTest, AnInvalidValueMakesTheWholeConfigInvalidNotUnimplemented) {
  // Both problems are reported; the code says the config must be fixed before anything else.
  ExpectRejected(R"({"gradient_predivide_factor": 2.0, "zero_optimization": {"stage": 9}})",
                 {"gradient_predivide_factor: not implemented in zero", "zero_optimization.stage"});
}

TEST_F(ConfigTest, ATopLevelKeyInsideASectionSaysItIsTopLevel) {
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "aio": {"block_size": 1048576}}})",
                 {"zero_optimization.aio: \"aio\" is a top-level key, not part of zero_optimization"});
  ExpectRejected(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "aio": {}}}})",
                 {"zero_optimization.offload_param.aio: \"aio\" is a top-level key, not part of "
                  "zero_optimization.offload_param"});
  ExpectRejected(R"({"fp16": {"bf16": {"enabled": true}}})",
                 {"fp16.bf16: \"bf16\" is a top-level key, not part of fp16"});
  ExpectRejected(R"({"bfloat16": {"gradient_clipping": 1.0}})",
                 {"bfloat16.gradient_clipping: \"gradient_clipping\" is a top-level key, not part of bfloat16"});
  ExpectRejected(R"({"zero_optimization": {"bfloat16": {}}})",
                 {"zero_optimization.bfloat16: \"bfloat16\" is a top-level key"});
}

TEST_F(ConfigTest, CheckpointOptionsSayZeroHasNoCheckpointApiYet) {
  Config quiet = MustParse(R"({"checkpoint": {"tag_validation": "warn", "use_node_local_storage": false,
                               "parallel_write": {"pipeline_stage": false}}})");
  EXPECT_TRUE(quiet.warnings().empty()) << quiet.warnings().front();
  Config loud = MustParse(R"({"checkpoint": {"tag_validation": "Fail", "use_node_local_storage": true,
                              "writer": {"type": "fast"}}})");
  for (const char* key : {"checkpoint.tag_validation", "checkpoint.use_node_local_storage", "checkpoint.writer"}) {
    EXPECT_TRUE(HasWarning(loud, std::string(key) + ": accepted but has no effect in zero (zero")) << key;
  }
  EXPECT_TRUE(HasWarning(loud, "checkpoint.tag_validation: accepted but has no effect in zero (zero always checks"));
  ExpectRejected(R"({"checkpoint": {"tag_validation": "Strict"}})", {"checkpoint.tag_validation", "\"Strict\""});
  ExpectRejected(R"({"checkpoint": {"load_universel": true}})",
                 {"checkpoint.load_universel: unknown key", "did you mean \"checkpoint.load_universal\""});
  const std::string md = ConfigReferenceMarkdown();
  for (const char* promise : {"its own checkpoint API", "checkpoints always hold"}) {
    EXPECT_EQ(md.find(promise), std::string::npos) << promise;
  }
  // Since Engine::Save and Load exist, the section says so (it said "zero has no checkpoint API yet" before).
  EXPECT_EQ(md.find("no checkpoint API"), std::string::npos);
  EXPECT_NE(md.find("zero saves and loads with Engine::Save and Load"), std::string::npos);
}

TEST_F(ConfigTest, TheReferenceStandsAlone) {
  // No path outside the repository: the reference is read on other machines and in other checkouts, so it names
  // no absolute path (a '/' that starts a word: URLs, whose '//' follows a ':', do not count) and none that climbs
  // out of the checkout ('../').
  const std::string md = ConfigReferenceMarkdown();
  for (size_t i = 0; i < md.size(); ++i) {
    const bool starts_word = i == 0 || std::isspace(static_cast<unsigned char>(md[i - 1])) || md[i - 1] == '(' ||
                             md[i - 1] == '`' || md[i - 1] == '"' || md[i - 1] == '\'';
    const bool absolute =
        md[i] == '/' && starts_word && i + 1 < md.size() && std::isalpha(static_cast<unsigned char>(md[i + 1]));
    const bool climbs = md.compare(i, 3, "../") == 0;
    EXPECT_FALSE(absolute || climbs) << "at offset " << i << ": " << md.substr(i, 40);
    if (absolute || climbs) break;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Aliases and deprecated keys

TEST_F(ConfigTest, PydanticFieldNamesAreSynonymsWithoutWarning) {
  Config c = MustParse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1e6,
      "param_persistence_threshold": 10, "max_live_parameters": 7, "max_reuse_distance": 8,
      "gather_16bit_weights_on_model_save": true, "model_persistence_threshold": 99}})");
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 1'000'000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 10);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 7);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 8);
  EXPECT_EQ(c.zero.stage3_model_persistence_threshold, 99);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  // The synonyms themselves warn about nothing; the keys zero accepts without effect say so.
  for (const auto& w : c.warnings()) {
    EXPECT_NE(w.find("has no effect"), std::string::npos) << w;
    EXPECT_EQ(w.find("deprecated"), std::string::npos) << w;
  }
}

TEST_F(ConfigTest, DeprecatedAliasesMapWithAWarning) {
  Config c = MustParse(R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true,
      "cpu_offload": true, "cpu_offload_param": true, "cpu_offload_use_pin_memory": true},
      "bfloat16": {"enabled": true}, "aio": {"thread_count": 1}})");
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_TRUE(c.zero.offload_param.pin_memory);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  for (const char* key : {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
                          "zero_optimization.cpu_offload:", "zero_optimization.cpu_offload_param",
                          "zero_optimization.cpu_offload_use_pin_memory", "bfloat16", "aio.thread_count"}) {
    EXPECT_TRUE(HasWarning(c, key)) << key;
  }
}

TEST_F(ConfigTest, ZeroOptimizationAsABoolIsDeepSpeedsOldestFormat) {
  Config c = MustParse(R"({"zero_optimization": true})");
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_TRUE(HasWarning(c, "zero_optimization"));
  EXPECT_EQ(MustParse(R"({"zero_optimization": false})").zero.stage, 0);
}

TEST_F(ConfigTest, AKeyAndItsAliasTogetherAreRejected) {
  ExpectRejected(
      R"({"zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})",
      {"zero_optimization.stage3_prefetch_bucket_size", "given twice", "zero_optimization.prefetch_bucket_size"});
  ExpectRejected(R"({"zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})",
                 {"zero_optimization.offload_optimizer", "given twice", "zero_optimization.cpu_offload"});
  ExpectRejected(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": false}})", {"bfloat16", "given twice"});
}

// ---------------------------------------------------------------------------------------------------------
// JSON-level errors

TEST_F(ConfigTest, DuplicateKeysAreErrorsNamingThePath) {
  StatusOr<Config> c = Config::FromJsonFile(Fixture("invalid_duplicate.json"));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              AllOf(HasSubstr("zero_optimization.reduce_bucket_size: duplicate key"), Not(HasSubstr("[config.cc"))));
  ExpectRejected(R"({"stage": 1, "stage": 1})", {"stage: duplicate key"});
  ExpectRejected(R"({"tensorboard": {"jobs": [{"a": 1}, {"b": 1, "b": 2}]}})",
                 {"tensorboard.jobs[1].b: duplicate key"});
}

TEST_F(ConfigTest, MalformedJsonReportsLineAndColumn) {
  StatusOr<Config> c = Config::FromJsonFile(Fixture("invalid_malformed.json"));
  ASSERT_FALSE(c.ok());
  // Line 5 is `    "overlap_comm": tru`; the parser gives up at the newline right after "tru" (column 24).
  EXPECT_THAT(std::string(c.status().message()),
              AllOf(HasSubstr("invalid_malformed.json: malformed JSON at line 5, column 24"), HasSubstr("tru")));
  ExpectRejected("{\n  \"a\": 1,\n  \"b\": 2,,\n}", {"line 3, column 10"});
  ExpectRejected("{\"zero_optimization\": {\"stage\": 1}", {"line 1, column 35"});  // missing closing brace
  ExpectRejected("", {"line 1, column 1"});
  ExpectRejected("{\n \"gradient_clipping\": 1e400}", {"number out of range at line 2, column 23", "1e400"});
  ExpectRejected(R"({"seed": 18446744073709551615})", {"seed", "out of range"});
}

// Arrays nested a million deep once overflowed the stack (nlohmann's dump and comparisons recurse per level;
// fuzz/, docs/internals/fuzzing.md): deeper than 128 levels is refused before parsing, wherever the brackets are.
TEST_F(ConfigTest, DeepNestingIsRefusedNotACrash) {
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  // The outer object is level 1, so the 128th '[' (column 15 + 127) is level 129.
  ExpectRejected("{\"optimizer\": " + deep + "}", {"nested deeper than 128 levels at line 1, column 142"});
  ExpectRejected("{\n\"tensorboard\": {\"x\": " + deep + "}}", {"deeper than 128 levels at line 2"});
  // 128 levels parse as before (the error is about the value, not the nesting); brackets in strings and comments
  // do not count.
  const std::string msg =
      ExpectRejected("{\"optimizer\": " + std::string(127, '[') + std::string(127, ']') + "}", {"optimizer"});
  EXPECT_THAT(msg, Not(HasSubstr("nested deeper")));
  Config c = MustParse("// " + std::string(200, '[') +
                       "\n{\"optimizer\": {\"type\": \"AdamW\"}, \"tensorboard\": "
                       "{\"job_name\": \"" +
                       std::string(200, '{') + "\"}}");
  EXPECT_TRUE(c.optimizer.has_value());
  Config r = Config::Default();
  EXPECT_THAT(r.ResolveJson("optimizer.params.betas", deep),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("deeper than 128 levels")));
}

TEST_F(ConfigTest, MissingFileIsNotFound) {
  StatusOr<Config> c = Config::FromJsonFile(Fixture("no_such_config.json"));
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kNotFound, HasSubstr("no_such_config.json")));
}

// ---------------------------------------------------------------------------------------------------------
// "auto" and Resolve

TEST_F(ConfigTest, AutoIsAcceptedOnlyWhereHuggingFaceUsesIt) {
  ExpectRejected(R"({"zero_optimization": {"sub_group_size": "auto"}})",
                 {"zero_optimization.sub_group_size", "\"auto\" is not accepted here"});
  ExpectRejected(R"({"fp16": {"loss_scale": "auto"}})", {"fp16.loss_scale", "\"auto\""});
  Config c = MustParse(R"({"zero_optimization": {"stage": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto", "offload_optimizer": {"device": "auto"},
      "stage3_gather_16bit_weights_on_model_save": "auto"}, "scheduler": {"type": "WarmupDecayLR",
      "params": {"total_num_steps": "auto"}}})");
  EXPECT_EQ(c.unresolved().size(), 6u);
}

TEST_F(ConfigTest, ResolveFillsAutoAndChecksTheRule) {
  Config c = MustParse(R"({"train_micro_batch_size_per_gpu": "auto",
                           "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"}})");
  ASSERT_EQ(c.unresolved().size(), 2u);
  Config before = c;
  Status bad = c.Resolve("train_micro_batch_size_per_gpu", 2.5);
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr("train_micro_batch_size_per_gpu"), HasSubstr("2.5"))));
  EXPECT_TRUE(c == before);  // unchanged
  EXPECT_THAT(c.Resolve("train_micro_batch_size_per_gpu", 0), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(c.Resolve("train_micro_batch_size_per_gpu", 8.0));  // integral double is fine
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  // The pydantic spelling resolves the same key.
  ASSERT_OK(c.Resolve("zero_optimization.prefetch_bucket_size", static_cast<int64_t>(0.9 * 1024 * 1024)));
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 943718);
  EXPECT_TRUE(c.unresolved().empty());
  // Keys that are not "auto" cannot be resolved.
  EXPECT_THAT(c.Resolve("zero_optimization.stage", 2), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(c.Resolve("train_micro_batch_size_per_gpu", 4), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(c.Resolve("no.such.key", 4), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ConfigTest, ResolveChecksCrossKeyRules) {
  Config c = MustParse(R"({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})");
  ASSERT_OK(c.Resolve("bf16.enabled", true));
  Status s = c.Resolve("fp16.enabled", true);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("fp16.enabled"), HasSubstr("bf16.enabled")));
  EXPECT_FALSE(c.fp16.enabled);
  ASSERT_OK(c.Resolve("fp16.enabled", false));

  // Resolving the stage settles overlap_comm's dynamic default and the stage rules.
  Config z = MustParse(R"({"zero_optimization": {"stage": "auto", "offload_param": {"device": "cpu"}}})");
  nlohmann::json j = nlohmann::json::parse(z.ToJson());
  EXPECT_TRUE(j["zero_optimization"]["overlap_comm"].is_null());
  EXPECT_FALSE(z.Resolve("zero_optimization.stage", 2).ok());  // offload_param needs stage 3
  ASSERT_OK(z.Resolve("zero_optimization.stage", 3));
  EXPECT_TRUE(z.zero.overlap_comm);
}

TEST_F(ConfigTest, ResolveTakesEveryValueKind) {
  Config c = MustParse(R"({"optimizer": {"type": "AdamW", "params": {"betas": "auto", "lr": "auto"}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "auto", "nvme_path": "auto"}}})");
  ASSERT_OK(c.Resolve("optimizer.params.betas", std::vector<double>{0.8, 0.9}));
  EXPECT_FALSE(c.Resolve("optimizer.params.lr", "fast").ok());
  ASSERT_OK(c.ResolveJson("optimizer.params.lr", "1e-4"));
  ASSERT_OK(c.Resolve("scheduler.params.warmup_max_lr", 1e-4));
  ASSERT_OK(c.Resolve("zero_optimization.offload_optimizer.device", "cpu"));
  // null (DeepSpeed's None) is accepted: the folder matters only with device "nvme".
  ASSERT_OK(c.ResolveJson("zero_optimization.offload_optimizer.nvme_path", "null"));
  EXPECT_DOUBLE_EQ(c.optimizer->beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer->lr, 1e-4);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "");
  EXPECT_TRUE(c.unresolved().empty());
}

TEST_F(ConfigTest, ValidateNamesEveryUnresolvedKey) {
  Config c = MustParse(R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": "auto",
                           "zero_optimization": {"reduce_bucket_size": "auto"}})");
  Status s = c.Validate(2);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("gradient_clipping: still \"auto\""),
                    HasSubstr("zero_optimization.reduce_bucket_size: still \"auto\""), HasSubstr("Config::Resolve")));
  ASSERT_OK(c.Resolve("gradient_clipping", 1.0));
  ASSERT_OK(c.Resolve("zero_optimization.reduce_bucket_size", 1 << 20));
  EXPECT_OK(c.Validate(2));
}

// ---------------------------------------------------------------------------------------------------------
// ToJson

TEST_F(ConfigTest, ToJsonShowsEveryKeyWithDefaultsAndAuto) {
  Config c = MustParse(R"({"train_batch_size": "auto", "zero_optimization": {"stage": 2}})");
  nlohmann::json j = nlohmann::json::parse(c.ToJson());
  EXPECT_EQ(j["train_batch_size"], "auto");
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"], 500000000);
  EXPECT_EQ(j["zero_optimization"]["overlap_comm"], false);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["device"], "none");
  EXPECT_EQ(j["zero_optimization"]["zero_hpz_partition_size"], 1);
  EXPECT_TRUE(j["optimizer"].is_null());
  EXPECT_TRUE(j["scheduler"].is_null());
  EXPECT_EQ(j["aio"]["block_size"], 1048576);
  EXPECT_FALSE(j.contains("tensorboard"));
}

TEST_F(ConfigTest, ToJsonRoundTripsToTheSameEffectiveConfig) {
  std::vector<Config> configs = {Config(), Config::Default()};
  for (const char* f : {"hf_zero2_auto.json", "zero3_cpu_offload.json", "batch_32_4_2.json"}) {
    StatusOr<Config> c = Config::FromJsonFile(Fixture(f));
    ASSERT_OK(c) << f;
    configs.push_back(*c);
  }
  configs.push_back(MustParse(R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9, "nesterov": true}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 50, "warmup_type": "linear"}},
      "zero_optimization": {"stage": "auto", "use_multi_rank_bucket_allreduce": false, "mics_shard_size": 0},
      "data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp16", "seed": 7})"));
  configs.push_back(MustParse(R"({"log_level": "info", "gradient_allreduce_op": "mean",
      "checkpoint": {"tag_validation": "Fail", "writer": {"type": "fast"}, "parallel_write": {"pipeline_stage": true}},
      "bf16": {"check_grad_overflow": false},
      "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": false}}})"));
  Config validated = Config::Default();
  ASSERT_OK(validated.Validate(3));
  configs.push_back(validated);
  for (const Config& c : configs) {
    const std::string text = c.ToJson();
    StatusOr<Config> back = Config::FromJsonString(text);
    ASSERT_OK(back) << text;
    EXPECT_TRUE(*back == c) << text;
    EXPECT_EQ(back->ToJson(), text);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The reference

TEST_F(ConfigTest, DocsConfigMdIsTheGeneratedReference) {
  const std::string docs = ReadFile(ZERO_CONFIG_DOCS);
  ASSERT_FALSE(docs.empty()) << ZERO_CONFIG_DOCS << " is missing";
  EXPECT_TRUE(docs == ConfigReferenceMarkdown())
      << "docs/guide/config.md is stale: regenerate it with `build/bin/zero-config --reference > docs/guide/config.md`";
}

TEST_F(ConfigTest, ReferenceListsEveryKeyAliasAndIgnoredSection) {
  const std::string md = ConfigReferenceMarkdown();
  nlohmann::json j = nlohmann::json::parse(Config::Default().ToJson());
  // Every key ToJson prints appears in the reference (as a section heading or a `leaf` in a table).
  std::vector<std::pair<std::string, nlohmann::json>> stack = {{"", j}};
  size_t keys = 0;
  while (!stack.empty()) {
    auto [prefix, node] = stack.back();
    stack.pop_back();
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
      // A leaf is `key` in its section's table; a nested section is the heading `parent.key`.
      const bool listed =
          md.find("`" + it.key() + "`") != std::string::npos || md.find("`" + path + "`") != std::string::npos;
      EXPECT_TRUE(listed) << path << " is missing from the reference";
      ++keys;
      if (it.value().is_object() && !it.value().empty()) stack.push_back({path, it.value()});
    }
  }
  EXPECT_GT(keys, 100u);
  for (const char* s : {"`prefetch_bucket_size`", "`bfloat16`", "`zero_optimization.cpu_offload`", "`tensorboard`",
                        "`flops_profiler`", "not implemented", "## Cross-key rules", "## Config"}) {
    EXPECT_NE(md.find(s), std::string::npos) << s;
  }
}

// ---------------------------------------------------------------------------------------------------------
// The zero-config tool

struct RunResult {
  int code = -1;
  std::string out, err;
};

RunResult RunZeroConfig(const std::string& args) {
#ifdef ZERO_CONFIG_BIN
  const std::string base = ::testing::TempDir() + "/zero_config_" + std::to_string(::getpid());
  const std::string cmd = std::string(ZERO_CONFIG_BIN) + " " + args + " >" + base + ".out 2>" + base + ".err";
  int rc = std::system(cmd.c_str());
  RunResult r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = ReadFile(base + ".out");
  r.err = ReadFile(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
#else
  return RunResult{};
#endif
}

TEST_F(ConfigTest, ZeroConfigToolExitCodes) {
#ifndef ZERO_CONFIG_BIN
  GTEST_SKIP() << "zero-config is not built (ZERO_BUILD_TOOLS=OFF)";
#endif
  RunResult ok = RunZeroConfig(Fixture("hf_zero2_auto.json"));
  EXPECT_EQ(ok.code, 0) << ok.err;
  nlohmann::json j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["train_batch_size"], "auto");
  EXPECT_EQ(j["zero_optimization"]["allgather_bucket_size"], 200000000);

  RunResult unresolved = RunZeroConfig(Fixture("hf_zero2_auto.json") + " --world 2");
  EXPECT_EQ(unresolved.code, 1);
  EXPECT_THAT(unresolved.err, HasSubstr("train_micro_batch_size_per_gpu: still \"auto\""));

  RunResult world4 = RunZeroConfig(Fixture("batch_32_4_2.json") + " --world 4");
  EXPECT_EQ(world4.code, 0) << world4.err;
  EXPECT_EQ(nlohmann::json::parse(world4.out)["train_batch_size"], 32);
  RunResult world2 = RunZeroConfig(Fixture("batch_32_4_2.json") + " --world 2");
  EXPECT_EQ(world2.code, 1);
  EXPECT_THAT(world2.err, HasSubstr("train_batch_size"));
  EXPECT_TRUE(world2.out.empty());

  RunResult derived = RunZeroConfig(Fixture("zero3_cpu_offload.json") + " --world 8");
  EXPECT_EQ(derived.code, 0) << derived.err;
  EXPECT_EQ(nlohmann::json::parse(derived.out)["train_batch_size"], 64);

  RunResult malformed = RunZeroConfig(Fixture("invalid_malformed.json"));
  EXPECT_EQ(malformed.code, 1);
  EXPECT_THAT(malformed.err, HasSubstr("line 5, column 24"));
  RunResult stage2 = RunZeroConfig(Fixture("invalid_offload_param_stage2.json"));
  EXPECT_EQ(stage2.code, 1);
  EXPECT_THAT(stage2.err, HasSubstr("zero_optimization.offload_param.device"));
  RunResult dup = RunZeroConfig(Fixture("invalid_duplicate.json"));
  EXPECT_EQ(dup.code, 1);
  EXPECT_THAT(dup.err, HasSubstr("zero_optimization.reduce_bucket_size"));

  // DeepSpeed's current spellings pass; a key that changes the math is refused as not implemented (not as an
  // invalid config); aio under zero_optimization names the top level.
  RunResult current = RunZeroConfig(Fixture("deepspeed_current_keys.json"));
  EXPECT_EQ(current.code, 0) << current.err;
  nlohmann::json cj = nlohmann::json::parse(current.out);
  EXPECT_EQ(cj["log_level"], "info");
  EXPECT_EQ(cj["zero_optimization"]["offload_optimizer"]["pin_memory"], true);
  EXPECT_EQ(cj["bf16"]["check_grad_overflow"], true);
  EXPECT_THAT(current.err, HasSubstr("seq_parallel_communication_data_type"));  // the ignored-section warning
  RunResult predivide = RunZeroConfig(Fixture("unimplemented_predivide.json"));
  EXPECT_EQ(predivide.code, 1);
  EXPECT_THAT(predivide.err,
              AllOf(HasSubstr("zero-config: not implemented in zero:"),
                    HasSubstr("gradient_predivide_factor: not implemented in zero"), Not(HasSubstr("invalid config"))));
  EXPECT_TRUE(predivide.out.empty());
  RunResult aio = RunZeroConfig(Fixture("invalid_aio_under_zero.json"));
  EXPECT_EQ(aio.code, 1);
  EXPECT_THAT(aio.err, AllOf(HasSubstr("zero-config: invalid config:"),
                             HasSubstr("zero_optimization.aio: \"aio\" is a top-level key, not part of "
                                       "zero_optimization")));

  RunResult ref = RunZeroConfig("--reference");
  EXPECT_EQ(ref.code, 0);
  EXPECT_EQ(ref.out, ConfigReferenceMarkdown());
  RunResult def = RunZeroConfig("--default");
  EXPECT_EQ(def.code, 0);
  EXPECT_EQ(def.out, Config::Default().ToJson(2) + "\n");
  EXPECT_EQ(RunZeroConfig("").code, 2);
  EXPECT_EQ(RunZeroConfig("--world x " + Fixture("batch_32_4_2.json")).code, 2);
  EXPECT_EQ(RunZeroConfig(Fixture("no_such_config.json")).code, 1);
}

// ---------------------------------------------------------------------------------------------------------
// Numbers the code cannot represent (issue 32.4): rejected at parse with the range, not failing later.

TEST_F(ConfigTest, CommTimeoutOutsideWhatTheTimersHoldIsRejectedWithTheRange) {
  // 9.3e9 s overflowed Gloo's nanosecond deadlines (every rendezvous timed out at once); 1e300 s became an
  // infinite absl::Duration; 1e-300 s passed "> 0" and became 0.
  for (const char* v : {"9.3e9", "1e300", "1e-300", "0.0001", "-1"}) {
    ExpectRejected(std::string(R"({"comm_timeout_s": )") + v + "}",
                   {"comm_timeout_s: must be a number in [0.001, 1000000000]"});
  }
  EXPECT_DOUBLE_EQ(MustParse(R"({"comm_timeout_s": 0.001})").comm_timeout_s, 0.001);
  EXPECT_DOUBLE_EQ(MustParse(R"({"comm_timeout_s": 1e9})").comm_timeout_s, 1e9);
}

TEST_F(ConfigTest, NumbersFp32CannotHoldAreRejected) {
  // The kernels compute in fp32: an eps of 1e-300 would be 0 there, a loss scale of 1e300 infinity.
  ExpectRejected(R"({"optimizer": {"type": "AdamW", "params": {"eps": 1e-300}}})",
                 {"optimizer.params.eps", "out of range", "fp32"});
  ExpectRejected(R"({"fp16": {"enabled": true, "loss_scale": 1e300}})", {"fp16.loss_scale", "out of range"});
  ExpectRejected(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9, 1e-320]}}})",
                 {"optimizer.params.betas", "out of range"});
  EXPECT_EQ(MustParse(R"({"gradient_clipping": 0})").gradient_clipping, 0.0);  // 0 stays a valid value
}

// ---------------------------------------------------------------------------------------------------------
// One source of truth: fields set in code are validated like JSON (issue 31.1).

TEST_F(ConfigTest, ValidateRejectsAFieldSetInCodeWithTheJsonMessage) {
  const std::string from_json(
      Config::FromJsonString(R"({"train_batch_size": 8, "zero_optimization": {"stage": 7}})").status().message());
  ASSERT_THAT(from_json, HasSubstr("zero_optimization.stage: must be an integer in [0, 3]; got 7"));
  Config c = MustParse(R"({"train_batch_size": 8})");
  c.zero.stage = 7;
  EXPECT_THAT(c.Validate(1), StatusIs(absl::StatusCode::kInvalidArgument, from_json));
  EXPECT_EQ(c.zero.stage, 7);  // unchanged on error

  Config t = MustParse(R"({"train_batch_size": 8})");
  t.comm_timeout_s = 9.3e9;
  EXPECT_THAT(t.Validate(1), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("comm_timeout_s: must be a number in [0.001, 1000000000]; got")));
  Config o = MustParse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}})");
  o.optimizer->type = "Adamax";
  EXPECT_THAT(o.Validate(1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer.type: must be")));
  Config d = MustParse(R"({"train_batch_size": 8})");
  d.zero.offload_optimizer.ratio = std::nan("");
  EXPECT_THAT(d.Validate(1), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("zero_optimization.offload_optimizer.ratio: must be")));
  Config e = MustParse(R"({"train_batch_size": 8})");
  e.gradient_accumulation_mode = static_cast<GradAccumulationMode>(9);
  EXPECT_THAT(e.Validate(1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gradient_accumulation_mode: must be one of")));
  // A field DeepSpeed has but zero implements only when off: kUnimplemented, as in JSON.
  Config f = MustParse(R"({"train_batch_size": 8})");
  f.zero.elastic_checkpoint = true;
  EXPECT_THAT(f.Validate(1), StatusIs(absl::StatusCode::kUnimplemented,
                                      HasSubstr("zero_optimization.elastic_checkpoint: not implemented in zero")));
  EXPECT_OK(MustParse(R"({"train_batch_size": 8})").Validate(1));
  EXPECT_OK(Config::Default().Validate(4));
}

TEST_F(ConfigTest, SetValidatesAnyKeyLikeTheJson) {
  Config c = MustParse(R"({"train_batch_size": 8})");
  EXPECT_OK(c.Set("zero_optimization.stage", "3"));
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_TRUE(c.zero.overlap_comm);  // the dynamic default follows, as it does in a file
  EXPECT_OK(c.Set("zero_optimization.overlap_comm", "false"));
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_OK(c.Set("zero_optimization.stage", "2"));
  EXPECT_FALSE(c.zero.overlap_comm);
  // The same messages as the JSON; nothing changes on error.
  EXPECT_THAT(
      c.Set("zero_optimization.stage", "7"),
      StatusIs(absl::StatusCode::kInvalidArgument, "zero_optimization.stage: must be an integer in [0, 3]; got 7"));
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_THAT(c.Set("comm_timeout_s", "1e-300"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0.001, 1000000000]")));
  EXPECT_THAT(c.Set("zero_optimization.stag", "1"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("did you mean \"zero_optimization.stage\"")));
  EXPECT_THAT(c.Set("zero_optimization", "{}"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("section")));
  EXPECT_THAT(c.Set("zero_optimization.stage", "three"), StatusIs(absl::StatusCode::kInvalidArgument));
  // Cross-key rules apply: offloading parameters needs stage 3.
  EXPECT_THAT(c.Set("zero_optimization.offload_param.device", "\"cpu\""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("offload_param.device")));
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  // Aliases, an optimizer created on first use, "auto" where a key takes it.
  EXPECT_OK(c.Set("zero_optimization.prefetch_bucket_size", "1000"));
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 1000);
  Config n = MustParse("{}");
  EXPECT_OK(n.Set("optimizer.type", "\"SGD\""));
  ASSERT_TRUE(n.optimizer.has_value());
  EXPECT_EQ(n.optimizer->type, "SGD");
  EXPECT_THAT(n.Set("optimizer.params.betas", "[0.9, 0.95]"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a parameter of SGD")));
  EXPECT_OK(n.Set("train_micro_batch_size_per_gpu", "\"auto\""));
  EXPECT_THAT(n.unresolved(), ::testing::ElementsAre("train_micro_batch_size_per_gpu"));
  EXPECT_OK(n.Set("train_micro_batch_size_per_gpu", "4"));
  EXPECT_TRUE(n.unresolved().empty());
  EXPECT_EQ(n.train_micro_batch_size_per_gpu, 4);
  // A set config equals the same config read from JSON.
  Config from_json = MustParse(R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD"}})");
  EXPECT_TRUE(n == from_json) << n.ToJson() << "\nvs\n" << from_json.ToJson();
}

// Several keys in one Set: each key's own rule, then the rules between keys once on the result, as in a file. One
// key at a time, hpZ is refused before the stage is 3; together, in either order, it is not.
TEST_F(ConfigTest, SetSeveralKeysChecksTheRulesBetweenThemOnTheResult) {
  const std::pair<std::string, std::string> hpz{"zero_optimization.zero_hpz_partition_size", "2"},
      stage3{"zero_optimization.stage", "3"};
  Config one = Config::Default();
  EXPECT_THAT(one.Set(hpz.first, hpz.second),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("zero_hpz_partition_size: 2 with")));
  for (const auto& sets : {std::vector{hpz, stage3}, std::vector{stage3, hpz}}) {
    Config c = Config::Default();
    EXPECT_OK(c.Set(sets));
    EXPECT_EQ(c.zero.stage, 3);
    EXPECT_EQ(c.zero.zero_hpz_partition_size, 2);
  }
  // The result breaks a rule: refused, nothing changed. A later value of a key wins.
  Config c = Config::Default();
  EXPECT_THAT(c.Set({stage3, hpz, {"zero_optimization.stage", "2"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("zero_hpz_partition_size: 2 with")));
  EXPECT_EQ(c.zero.stage, Config::Default().zero.stage);
  EXPECT_EQ(c.zero.zero_hpz_partition_size, Config::Default().zero.zero_hpz_partition_size);
  // A key's own rule and an unknown key still fail, naming the key.
  EXPECT_THAT(c.Set({stage3, {"zero_optimization.stage", "7"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 7")));
  EXPECT_THAT(c.Set({stage3, {"zero_optimization.stag", "1"}}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(c.zero.stage, Config::Default().zero.stage);
}

// zero-config --set: a Hugging Face config with "auto" is checked as it is, with the values the trainer would fill.
TEST_F(ConfigTest, ZeroConfigSetFillsAndValidates) {
#ifndef ZERO_CONFIG_BIN
  GTEST_SKIP() << "zero-config is not built (ZERO_BUILD_TOOLS=OFF)";
#endif
  const std::string hf = Fixture("hf_zero2_auto.json");
  std::string sets;
  for (const char* kv :
       {"fp16.enabled=false", "bf16.enabled=true", "optimizer.params.lr=3e-4", "optimizer.params.betas=[0.9,0.95]",
        "optimizer.params.eps=1e-8", "optimizer.params.weight_decay=0.1", "scheduler.params.warmup_min_lr=0",
        "scheduler.params.warmup_max_lr=3e-4", "scheduler.params.warmup_num_steps=100",
        "zero_optimization.reduce_bucket_size=1000000", "gradient_accumulation_steps=2", "gradient_clipping=1.0",
        "train_micro_batch_size_per_gpu=4", "train_batch_size=16"}) {
    sets += std::string(" --set ") + kv;
  }
  RunResult ok = RunZeroConfig(hf + sets + " --world 2");
  ASSERT_EQ(ok.code, 0) << ok.err;
  nlohmann::json j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["train_batch_size"], 16);
  EXPECT_EQ(j["optimizer"]["params"]["betas"][1], 0.95);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  // Without the --set values, --world names the keys still "auto".
  RunResult left = RunZeroConfig(hf + " --world 2");
  EXPECT_EQ(left.code, 1);
  EXPECT_THAT(left.err, HasSubstr("optimizer.params.lr: still \"auto\""));
  // A bad value gets the JSON's message; a key that does not exist, a "did you mean".
  RunResult bad = RunZeroConfig(hf + " --set zero_optimization.stage=7");
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr("zero_optimization.stage: must be an integer in [0, 3]; got 7"));
  RunResult typo = RunZeroConfig(hf + " --set zero_optimization.stag=1");
  EXPECT_EQ(typo.code, 1);
  EXPECT_THAT(typo.err, HasSubstr("did you mean \"zero_optimization.stage\""));
  EXPECT_EQ(RunZeroConfig(hf + " --set nokeyvalue").code, 2);
  // The --set values are checked together: hpZ before the stage 3 it needs is accepted, in either order.
  for (const char* order : {" --set zero_optimization.zero_hpz_partition_size=2 --set zero_optimization.stage=3",
                            " --set zero_optimization.stage=3 --set zero_optimization.zero_hpz_partition_size=2"}) {
    RunResult hpz = RunZeroConfig(hf + order);
    ASSERT_EQ(hpz.code, 0) << order << ": " << hpz.err;
    EXPECT_EQ(nlohmann::json::parse(hpz.out)["zero_optimization"]["zero_hpz_partition_size"], 2);
  }
  // A bare word is a string: --set zero_optimization.offload_optimizer.device=none.
  RunResult word = RunZeroConfig(hf + " --set zero_optimization.offload_optimizer.device=none");
  EXPECT_EQ(word.code, 0) << word.err;
}

}  // namespace
}  // namespace zero
