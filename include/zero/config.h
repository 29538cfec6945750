// zero/config.h — the DeepSpeed-style JSON config, parsed and validated into plain structs.
//
//   ZERO_ASSIGN_OR_RETURN(zero::Config cfg, zero::Config::FromJsonFile("ds_config.json"));
//   ZERO_RETURN_IF_ERROR(cfg.Resolve("train_micro_batch_size_per_gpu", 8));   // fill an HF-style "auto"
//   ZERO_RETURN_IF_ERROR(cfg.Validate(/*world_size=*/4));                       // cross-key rules, "auto" left?
//   int stage = cfg.zero.stage;
//
// The accepted keys, their types, defaults (DeepSpeed's, from its source) and rules live in ONE table in
// src/core/config_schema.cc; the parser, the validator, `zero-config --reference` and the README's config
// reference all come from it. Unknown keys are errors with the JSON path and a "did you mean"; keys DeepSpeed
// knows that zero does not implement are accepted only at their "off"/default value; sections of other
// DeepSpeed subsystems (tensorboard, wandb, flops_profiler, ...) are accepted with a warning that zero
// ignores them. Deprecated aliases map to current keys with a warning. Nothing is silently ignored.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zero/status.h"

namespace zero {

enum class OffloadDevice : uint8_t { kNone, kCpu, kNvme };

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  bool pin_memory = false;
  int64_t buffer_count = 4;
  bool fast_init = false;
  double ratio = 1.0;  // fraction of each shard updated on the host (Twin-Flow, stage 3 only when < 1)
  bool pipeline_read = false;
  bool pipeline_write = false;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  bool pin_memory = false;
  int64_t buffer_count = 5;
  int64_t buffer_size = 100'000'000;
  int64_t max_in_cpu = 1'000'000'000;
};

struct ZeroOptimizationConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool overlap_comm = false;  // DeepSpeed's default: true for stage 3, false otherwise (resolved at parse)
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500'000'000;     // elements
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500'000'000;  // elements
  bool round_robin_gradients = false;
  int64_t sub_group_size = 1'000'000'000;       // optimizer-step tile, elements
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_model_persistence_threshold = std::numeric_limits<int64_t>::max();
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;
  bool zero_quantized_gradients = false;
  bool ignore_unused_parameters = true;
  bool elastic_checkpoint = false;
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
};

enum class NonFinitePolicy : uint8_t { kSkip, kError };

struct Bf16Config {
  bool enabled = false;
  // Ours: what a bf16 step does with a non-finite gradient (never applied to the master weights).
  NonFinitePolicy nonfinite_grads = NonFinitePolicy::kSkip;
  // Ours: stochastic rounding of the bf16 parameter write-back (seeded by `seed`, reproducible).
  bool stochastic_rounding = false;
};

struct OptimizerConfig {
  std::string type = "AdamW";  // "Adam" (AdamW unless adam_w_mode is false, as in DeepSpeed), "AdamW", "SGD"
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
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
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
  uint64_t seed = 1234;                    // ours
  double comm_timeout_s = 1800.0;          // ours
  GradAccumulationMode gradient_accumulation_mode = GradAccumulationMode::kLowMemory;  // ours
  std::optional<std::string> communication_data_type;  // "fp32", "fp16", "bf16"; nullopt = fp32
  Fp16Config fp16;
  Bf16Config bf16;
  std::optional<OptimizerConfig> optimizer;  // nullopt: the trainer supplies its own optimizer
  SchedulerConfig scheduler;
  ActivationCheckpointingConfig activation_checkpointing;
  ZeroOptimizationConfig zero;

  // Parses and validates everything that needs no world size. Errors: kInvalidArgument with the JSON path,
  // the value and the rule (malformed JSON: line and column).
  static StatusOr<Config> FromJsonString(const std::string& json);
  static StatusOr<Config> FromJsonFile(const std::string& path);
  // The built-in default config (stage 0, fp32, AdamW) used by demos.
  static Config Default();

  // Fills a key that was "auto" (dotted path, e.g. "zero_optimization.reduce_bucket_size"). kNotFound if the
  // key was not "auto"; kInvalidArgument if the value breaks the key's rule.
  Status Resolve(const std::string& path, double value);
  Status Resolve(const std::string& path, const std::string& value);
  Status Resolve(const std::string& path, bool value);
  // Dotted paths still "auto".
  const std::vector<std::string>& unresolved() const { return unresolved_; }

  // Cross-key rules that need the world size: batch sizes multiply out (train = micro * accumulation *
  // world; missing ones derived), no "auto" left. Called by the Engine; may be called earlier.
  Status Validate(int world_size);

  // Warnings produced at parse time (deprecated aliases, ignored sections); also logged.
  const std::vector<std::string>& warnings() const { return warnings_; }

  // The effective config as JSON: every key with its value or default; unresolved keys print as "auto".
  std::string ToJson(int indent = 2) const;

  // Effective values after Validate.
  int64_t micro_batch() const { return train_micro_batch_size_per_gpu.value_or(1); }
  int64_t accumulation_steps() const { return gradient_accumulation_steps.value_or(1); }

 private:
  std::vector<std::string> unresolved_;
  std::vector<std::string> warnings_;
};

// Markdown table of every key (path, type, default, rule, status), generated from the schema table.
std::string ConfigReferenceMarkdown();

}  // namespace zero
