// zero/config.h — the DeepSpeed-style JSON config, parsed and validated into plain structs.
//
//   ZERO_ASSIGN_OR_RETURN(zero::Config cfg, zero::Config::FromJsonFile("ds_config.json"));
//   ZERO_RETURN_IF_ERROR(cfg.Resolve("train_micro_batch_size_per_gpu", 8));   // fill an HF-style "auto"
//   ZERO_RETURN_IF_ERROR(cfg.Validate(/*world_size=*/4));                       // cross-key rules, "auto" left?
//   int stage = cfg.zero.stage;
//
// The accepted keys, their types, defaults (DeepSpeed's, from its source) and rules live in ONE table in
// src/core/config_schema.cc; the parser, the validator, ToJson, `zero-config --reference` and docs/guide/config.md
// (the reference, checked by a test) all come from it. Unknown keys are errors with the JSON path and a "did
// you mean"; keys DeepSpeed knows that zero does not implement are accepted only at their "off"/default value
// (and are otherwise kUnimplemented "not implemented in zero" errors); sections of other
// DeepSpeed subsystems (tensorboard, wandb, flops_profiler, ...) are accepted with a warning that zero
// ignores them. Deprecated aliases map to current keys with a warning. Nothing is silently ignored.
//
// A Config is a plain value: copy it, change its fields, and Validate again; its const members may be called from
// any thread. Every parse or validation failure is a Status (kInvalidArgument naming the key's JSON path), never an
// abort.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zero/status.h"

namespace zero {

namespace internal {
class ConfigParser;  // src/core/config.cc: the schema-driven parser, the only writer of Config's private state
}  // namespace internal

enum class OffloadDevice : uint8_t { kNone, kCpu, kNvme };

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;     // device kNvme: the folder of the rank files (shard's NVMe tier, offload/nvme_store.h)
  bool pin_memory = true;    // page-locked host buffers where the build and the machine allow it
  int64_t buffer_count = 4;  // device kNvme: staging buffers of sub_group_size elements each
  bool fast_init = false;
  double ratio = 1.0;  // fraction of each shard updated on the host (Twin-Flow, stage 3 only when < 1)
  bool pipeline_read = false;
  bool pipeline_write = false;

  bool operator==(const OffloadOptimizerConfig&) const = default;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;              // device kNvme: the folder of the rank files (offload/nvme_param_tier.h)
  bool pin_memory = true;             // page-locked host buffers where the build and the machine allow it
  int64_t buffer_count = 5;           // device kNvme: staging buffers, each holding one whole parameter shard
  int64_t buffer_size = 100'000'000;  // device kNvme: elements per staging buffer (the largest shard allowed)
  int64_t max_in_cpu = 1'000'000'000;

  bool operator==(const OffloadParamConfig&) const = default;
};

// ZeRO++ qgZ's LoCo residuals (zero_quantized_gradients_error_feedback_dtype): in the compute dtype, as DeepSpeed
// keeps them (in the gradient's), or int8 with one f32 scale per block of zero_quantized_gradients_block_size, as
// the LoCo paper stores its compensation error (8 bits).
enum class QgzResidualDType : uint8_t { kCompute, kInt8 };

struct ZeroOptimizationConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool overlap_comm = false;  // DeepSpeed's default: true for stage 3, false otherwise (resolved at parse)
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500'000'000;  // elements
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500'000'000;  // elements
  bool round_robin_gradients = false;
  int64_t sub_group_size = 1'000'000'000;  // optimizer-step tile, elements
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_model_persistence_threshold = std::numeric_limits<int64_t>::max();
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  int64_t zero_hpz_partition_size = 1;
  // MiCS / FSDP HYBRID_SHARD: shard within groups of this many consecutive ranks and replicate across the
  // groups (stages 1-3). <= 0 or the world size: shard across all ranks (docs/internals/design.md, "Hybrid sharding").
  int64_t mics_shard_size = -1;
  bool zero_quantized_weights = false;
  int64_t zero_quantized_weights_block_size = 4096;  // ours: elements per int8 block (one fp32 scale each)
  bool zero_quantized_gradients = false;
  // ZeRO++ qgZ (ours beside DeepSpeed's key): the wire's bits per element (8 or 4), the elements per block (one f32
  // scale each), and LoCo's error feedback (on by default; zeropp_loco_param's err_beta and reset_T).
  int64_t zero_quantized_gradients_bits = 8;
  int64_t zero_quantized_gradients_block_size = 1024;
  bool zero_quantized_gradients_error_feedback = true;
  QgzResidualDType zero_quantized_gradients_error_feedback_dtype = QgzResidualDType::kCompute;
  double zeropp_loco_err_beta = 0.8;
  int64_t zeropp_loco_reset_t = 1024;
  bool ignore_unused_parameters = true;
  bool elastic_checkpoint = false;

  bool operator==(const ZeroOptimizationConfig&) const = default;
};

struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0;  // 0 = dynamic; > 0 = static scale
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;

  bool operator==(const Fp16Config&) const = default;
};

enum class NonFinitePolicy : uint8_t { kSkip, kError };

struct Bf16Config {
  bool enabled = false;
  // Ours: what a bf16 step does with a non-finite gradient (never applied to the master weights).
  NonFinitePolicy nonfinite_grads = NonFinitePolicy::kSkip;
  // Ours: stochastic rounding of the bf16 parameter write-back (seeded by `seed`, reproducible).
  bool stochastic_rounding = false;

  bool operator==(const Bf16Config&) const = default;
};

struct OptimizerConfig {
  // "Adam", "AdamW" or "SGD", spelled this way whatever the JSON's case (DeepSpeed matches case-insensitively).
  // As in DeepSpeed, "Adam" runs AdamW (decoupled weight decay) unless params.adam_w_mode is false; the parser
  // sets adam_w_mode accordingly (true for AdamW; false with AdamW is an error), so read adam_w_mode, not type.
  std::string type = "AdamW";
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adam_w_mode = true;
  bool bias_correction = true;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;

  bool operator==(const OptimizerConfig&) const = default;
};

struct SchedulerConfig {
  std::string type;  // "" = constant lr; "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" or "linear"
  int64_t total_num_steps = 0;      // WarmupDecayLR / WarmupCosineLR
  double warmup_min_ratio = 0.0;    // WarmupCosineLR
  double cos_min_ratio = 0.0001;    // WarmupCosineLR
  int64_t last_batch_iteration = -1;

  bool operator==(const SchedulerConfig&) const = default;
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;

  bool operator==(const ActivationCheckpointingConfig&) const = default;
};

// Top-level "aio": DeepSpeed's async-I/O settings for NVMe offload (swap_tensor/aio_config.py), read by the I/O
// engine of the NVMe tier (io/internal/io_engine.h IoOptionsFromConfig); use_gds is accepted only off.
struct AioConfig {
  int64_t block_size = 1'048'576;  // bytes, a power of 2
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;  // DeepSpeed's older name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;

  bool operator==(const AioConfig&) const = default;
};

// How the batch follows the world size when a job restarts with fewer or more ranks (zero's "elastic_batch").
enum class ElasticBatchPolicy : uint8_t {
  kKeepGlobal,  // DeepSpeed's derivation at every world size: the global batch stays (an error when it cannot)
  kKeepMicro,   // micro-batch and accumulation stay as at reference_world_size; the global batch follows the world
};
// The learning rate's rule under kKeepMicro, by r = global batch now / global batch at the reference world
// (= world size / reference_world_size, since micro-batch and accumulation stay).
enum class LrScaling : uint8_t {
  kNone,    // unchanged
  kLinear,  // x r (Goyal et al.'s linear scaling rule, for SGD)
  kSqrt,    // x sqrt(r) (the square-root rule for Adam-type optimizers, Malladi et al. 2022)
};

struct ElasticBatchConfig {
  ElasticBatchPolicy policy = ElasticBatchPolicy::kKeepGlobal;
  LrScaling lr_scaling = LrScaling::kNone;
  // kKeepMicro: the world size the batch keys and the learning rate were written for (the first launch's).
  std::optional<int64_t> reference_world_size;
  // Set by Validate(world): what each Step multiplies its learning rate by (1 unless kKeepMicro scales it).
  double lr_multiplier = 1.0;

  bool operator==(const ElasticBatchConfig&) const = default;
};

enum class GradAccumulationMode : uint8_t {
  kLowMemory,         // reduce-scatter every micro-step into a sharded fp32 accumulator (default)
  kLowCommunication,  // accumulate unsharded, reduce on the last micro-step (FSDP no_sync)
};

class Config {
 public:
  // Batch: any two determine the third (DeepSpeed's rule); all absent at parse is allowed until Validate.
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  double gradient_clipping = 0.0;  // 0 = off
  std::optional<int64_t> steps_per_print;
  bool wall_clock_breakdown = false;
  uint64_t seed = 1234;                                                                // ours
  double comm_timeout_s = 1800.0;                                                      // ours
  GradAccumulationMode gradient_accumulation_mode = GradAccumulationMode::kLowMemory;  // ours
  std::optional<std::string> communication_data_type;  // "fp32", "fp16", "bf16"; nullopt = fp32
  Fp16Config fp16;
  Bf16Config bf16;
  std::optional<OptimizerConfig> optimizer;  // nullopt: the trainer supplies its own optimizer
  SchedulerConfig scheduler;
  ActivationCheckpointingConfig activation_checkpointing;
  ZeroOptimizationConfig zero;
  AioConfig aio;
  ElasticBatchConfig elastic_batch;  // ours

  // Parses and validates everything that needs no world size. Errors: kInvalidArgument with the JSON path,
  // the value and the rule (malformed JSON: line and column); kUnimplemented when every problem is a DeepSpeed
  // feature zero does not implement ("<path>: not implemented in zero; got <value>").
  static StatusOr<Config> FromJsonString(const std::string& json);
  static StatusOr<Config> FromJsonFile(const std::string& path);
  // The built-in default config (stage 0, fp32, AdamW) used by demos.
  static Config Default();

  // Fills a key that was "auto" (dotted path, e.g. "zero_optimization.reduce_bucket_size"; DeepSpeed's alias
  // spellings such as "zero_optimization.prefetch_bucket_size" are accepted too). kNotFound if the key was not
  // "auto"; kInvalidArgument if the value breaks the key's rule or a cross-key rule, kUnimplemented if zero lacks
  // the feature the value asks for (then nothing changes).
  // An integer key accepts a double only when it is integral (8.0 yes, 3.5 no), as in the JSON.
  [[nodiscard]] Status Resolve(const std::string& path, double value);
  [[nodiscard]] Status Resolve(const std::string& path, const std::string& value);
  [[nodiscard]] Status Resolve(const std::string& path, bool value);
  // Overloads so that Resolve(path, 8) and Resolve(path, "WarmupLR") pick the obvious meaning (without them an
  // int literal is ambiguous between double and bool, and a string literal would convert to bool).
  [[nodiscard]] Status Resolve(const std::string& path, int value);
  [[nodiscard]] Status Resolve(const std::string& path, int64_t value);
  [[nodiscard]] Status Resolve(const std::string& path, const char* value);
  // For list-valued keys: optimizer.params.betas.
  [[nodiscard]] Status Resolve(const std::string& path, const std::vector<double>& values);
  // Any value as JSON text ("8", "[0.9, 0.95]", "\"cpu\"", "true"); the other overloads funnel into this one.
  [[nodiscard]] Status ResolveJson(const std::string& path, const std::string& json_value);
  // Sets any key (dotted path, aliases accepted) to a value given as JSON text ("3", "\"cpu\"", "[0.9, 0.95]",
  // "\"auto\"" where the key takes it), with exactly the rules and messages the key gets in a JSON file: its own
  // rule, the cross-key rules, and what follows from it (dynamic defaults such as overlap_comm). Errors:
  // kNotFound for an unknown key (with a "did you mean"), kInvalidArgument / kUnimplemented as FromJsonString;
  // then nothing changes. The validated way to override a value in code; `zero-config --set` and
  // `zero-estimate --set` use it.
  [[nodiscard]] Status Set(const std::string& path, const std::string& json_value);
  // Several keys, set in order (a later value of the same key wins), then the rules between keys checked once on
  // the result, as for a file that has them all: {{"zero_optimization.zero_hpz_partition_size", "2"},
  // {"zero_optimization.stage", "3"}} is accepted in either order from stage 0, where one Set at a time refuses
  // hpZ before the stage is 3. On error nothing changes.
  [[nodiscard]] Status Set(const std::vector<std::pair<std::string, std::string>>& values);
  // Dotted paths still "auto".
  const std::vector<std::string>& unresolved() const { return unresolved_; }

  // Checks every field against its key's rule again (so a field assigned in code, `cfg.zero.stage = 7`, fails
  // with the message the same value gets in JSON), then the cross-key rules that need the world size: batch
  // sizes multiply out (train = micro * accumulation * world; missing ones derived), no "auto" left. Called by
  // Engine::Create and ShardedOptimizer::Create; may be called earlier, and again with another world size (keys
  // it derived are derived afresh). On error the config is unchanged.
  [[nodiscard]] Status Validate(int world_size);

  // Warnings produced at parse time (deprecated aliases, ignored sections); also logged.
  const std::vector<std::string>& warnings() const { return warnings_; }

  // The effective config as JSON: every key with its value or default; unresolved keys print as "auto".
  std::string ToJson(int indent = 2) const;

  // Effective values after Validate.
  int64_t micro_batch() const { return train_micro_batch_size_per_gpu.value_or(1); }
  int64_t accumulation_steps() const { return gradient_accumulation_steps.value_or(1); }

  // Equal effective configs: every public field, the unresolved "auto" keys and the values of accepted
  // DeepSpeed keys that have no field here. Warnings and which keys were spelled out are not compared.
  bool operator==(const Config& other) const;

 private:
  friend class internal::ConfigParser;

  std::vector<std::string> unresolved_;
  std::vector<std::string> warnings_;
  // Canonical dotted path -> JSON text, for accepted keys without a field above (DeepSpeed keys that zero
  // accepts only at their "off" value or that have no effect in zero), so ToJson prints what was given.
  std::map<std::string, std::string> extras_;
  // Canonical dotted path -> the spelling the user gave (alias or canonical) for every key and section set in
  // the JSON or through Resolve: dynamic defaults (overlap_comm) and alias conflicts need to know.
  std::map<std::string, std::string> given_;
  // Batch keys Validate derived (bit 0 train_batch_size, 1 micro, 2 accumulation; bit 3: a given
  // train_batch_size, the reference world's, replaced under elastic_batch keep_micro), cleared on the next call.
  uint8_t batch_derived_ = 0;
  std::optional<int64_t> batch_given_train_;  // the given train_batch_size that bit 3 replaced
};

// The JSON text of a command-line value for Config::Set (`--set key=value` of zero-config and zero-estimate):
// the value itself when it is JSON (3, 1e-4, true, "cpu", [0.9, 0.95], "auto" in quotes), else the value as a
// JSON string (cpu, auto, WarmupLR), so that shells need no nested quotes.
std::string SetValueJson(const std::string& value);

// Markdown table of every key (path, type, default, rule, status), generated from the schema table.
std::string ConfigReferenceMarkdown();

}  // namespace zero
