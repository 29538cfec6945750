// The config schema: every key zero accepts, in one table (see internal/config_schema.h), and the markdown
// reference generated from it (docs/guide/config.md, `zero-config --reference`).
//
// Defaults are DeepSpeed's, read from its source (deepspeed/runtime/zero/config.py, offload_config.py,
// precision_config.py, runtime/constants.py, runtime/lr_schedules.py, swap_tensor/aio_config.py,
// activation_checkpointing/config.py), not from its docs, which disagree in places.
#include "core/internal/config_schema.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "zero/status.h"

namespace zero::internal {
namespace {

#define FIELD(expr) +[](Config& c) -> FieldRef { return Ref(c.expr); }

using T = KeyType;
using S = Support;

// Optimizer names DeepSpeed knows (runtime/config.py DEEPSPEED_OPTIMIZERS) that zero has no kernel for.
constexpr const char* kUnimplementedOptimizers =
    "Lamb,OneBitAdam,ZeroOneAdam,OneBitLamb,Adagrad,Lion,MuAdam,MuAdamW,MuSGD,Muon";

// Document order: top-level keys, then each section with its keys, then the sections zero ignores.
// One key per row with its fields packed, as a table (clang-format 14 would put every designated initializer of a
// row on a line of its own).
// clang-format off
const KeySpec kSchema[] = {
    // ---- top level ----
    {.path = "train_batch_size", .type = T::kInt, .default_json = "null", .min = 1, .flags = kAutoOk,
     .ref = FIELD(train_batch_size),
     .doc = "Samples per optimizer step over all ranks: micro batch x accumulation steps x world size."},
    {.path = "train_micro_batch_size_per_gpu", .type = T::kInt, .default_json = "null", .min = 1, .flags = kAutoOk,
     .ref = FIELD(train_micro_batch_size_per_gpu), .doc = "Samples per rank in one forward/backward."},
    {.path = "gradient_accumulation_steps", .type = T::kInt, .default_json = "null", .min = 1, .flags = kAutoOk,
     .ref = FIELD(gradient_accumulation_steps), .doc = "Forward/backward passes per optimizer step."},
    {.path = "gradient_clipping", .type = T::kNumber, .default_json = "0.0", .min = 0, .flags = kAutoOk,
     .ref = FIELD(gradient_clipping), .doc = "Clip the global gradient L2 norm to this value; 0 turns clipping off."},
    {.path = "steps_per_print", .type = T::kInt, .default_json = "null", .min = 1, .ref = FIELD(steps_per_print),
     .doc = "Log a progress line every this many optimizer steps; null: never."},
    {.path = "wall_clock_breakdown", .type = T::kBool, .default_json = "false", .ref = FIELD(wall_clock_breakdown),
     .doc = "Log the time spent in forward, backward, reduction and step."},
    {.path = "log_level", .type = T::kAny, .default_json = "null", .support = S::kNoEffect,
     .doc = "DeepSpeed: the level of its logger.",
     .note = "zero's log level comes from ZERO_LOG_LEVEL or zero::SetLogLevel, since reading a config changes no "
             "process-wide state"},
    {.path = "seed", .type = T::kInt, .default_json = "1234", .min = 0, .flags = kOurs, .ref = FIELD(seed),
     .doc = "Seed of everything zero randomizes (e.g. bf16 stochastic rounding): same seed, same bits."},
    // 1 ms is the resolution of the stores' and Gloo's timeouts (a smaller value would become 0); above 1e9 s
    // (31 years) Gloo's deadlines, steady_clock nanoseconds since boot, would overflow int64 (at 9.2e9 s).
    {.path = "comm_timeout_s", .type = T::kNumber, .default_json = "1800", .min = 0.001, .max = 1e9,
     .flags = kOurs, .ref = FIELD(comm_timeout_s),
     .doc = "Seconds a collective (and the rendezvous of a communicator made from this config) may wait for its "
            "peers before failing with kDeadlineExceeded."},
    {.path = "gradient_accumulation_mode", .type = T::kEnum, .default_json = "\"low_memory\"", .flags = kOurs,
     .choices = "low_memory,low_communication", .ref = FIELD(gradient_accumulation_mode),
     .doc = "low_memory: reduce-scatter every micro-step into a sharded fp32 accumulator; low_communication: "
            "accumulate unsharded and reduce once, on the last micro-step (FSDP's no_sync)."},
    {.path = "communication_data_type", .type = T::kEnum, .default_json = "null", .flags = kCaseInsensitive,
     .choices = "fp32,fp16,bf16", .ref = FIELD(communication_data_type),
     .doc = "Data type gradients are reduced in; null: fp32."},
    {.path = "gradient_allreduce_op", .type = T::kEnum, .default_json = "\"mean\"", .flags = kCaseInsensitive,
     .choices = "mean", .unimplemented = "sum",
     .doc = "How the gradient reduction combines the ranks' gradients: mean (zero's reduction) or sum (DeepSpeed's "
            "alternative, which scales the update by the world size)."},
    {.path = "prescale_gradients", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .doc = "DeepSpeed: divide gradients by the world size before the reduction rather than after it."},
    {.path = "gradient_predivide_factor", .type = T::kNumber, .default_json = "1.0", .support = S::kOffOnly,
     .doc = "DeepSpeed: divide gradients by this factor before the reduction and by world size / factor after it."},

    // ---- fp16 ----
    {.path = "fp16", .type = T::kSection, .default_json = "{}",
     .doc = "fp16 compute copies of the parameters with fp32 master weights and loss scaling."},
    {.path = "fp16.enabled", .type = T::kBool, .default_json = "false", .flags = kAutoOk, .ref = FIELD(fp16.enabled),
     .doc = "Turn fp16 mixed precision on."},
    {.path = "fp16.auto_cast", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .ref = FIELD(fp16.auto_cast),
     .doc = "DeepSpeed casts module inputs to fp16; zero never touches the trainer's inputs."},
    {.path = "fp16.loss_scale", .type = T::kNumber, .default_json = "0", .min = 0, .ref = FIELD(fp16.loss_scale),
     .doc = "0: dynamic loss scaling; any other value: this static scale."},
    {.path = "fp16.initial_scale_power", .type = T::kInt, .default_json = "16", .min = 0, .max = 127,
     .ref = FIELD(fp16.initial_scale_power), .doc = "Dynamic scaling starts at 2^initial_scale_power.",
     .note = "2^power must be a finite fp32"},
    {.path = "fp16.loss_scale_window", .type = T::kInt, .default_json = "1000", .min = 1,
     .ref = FIELD(fp16.loss_scale_window), .doc = "Steps without overflow before the scale doubles."},
    {.path = "fp16.hysteresis", .type = T::kInt, .default_json = "2", .min = 1, .ref = FIELD(fp16.hysteresis),
     .doc = "Overflows tolerated before the scale halves (DeepSpeed's delayed shift)."},
    {.path = "fp16.consecutive_hysteresis", .type = T::kBool, .default_json = "false",
     .ref = FIELD(fp16.consecutive_hysteresis), .doc = "Refill the hysteresis after every step without overflow."},
    {.path = "fp16.min_loss_scale", .type = T::kNumber, .default_json = "1", .min = 0, .flags = kMinExclusive,
     .ref = FIELD(fp16.min_loss_scale), .doc = "The dynamic scale never drops below this."},
    {.path = "fp16.fp16_master_weights_and_grads", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .doc = "Keep master weights and gradients in fp16 (DeepSpeed: with CPU Adam only)."},

    // ---- bf16 ----
    {.path = "bf16", .type = T::kSection, .default_json = "{}",
     .doc = "bf16 compute copies of the parameters with fp32 master weights (no loss scaling)."},
    {.path = "bf16.enabled", .type = T::kBool, .default_json = "false", .flags = kAutoOk, .ref = FIELD(bf16.enabled),
     .doc = "Turn bf16 mixed precision on."},
    {.path = "bf16.immediate_grad_update", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .doc = "DeepSpeed's BF16_Optimizer option to fold each gradient into the fp32 copy as it is produced."},
    {.path = "bf16.check_grad_overflow", .type = T::kBool, .default_json = "true", .support = S::kNoEffect,
     .doc = "DeepSpeed: check bf16 gradients for inf/NaN.",
     .note = "zero always checks; bf16.nonfinite_grads decides what happens"},
    {.path = "bf16.bf16_master_weights_and_grads", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .doc = "Keep master weights and gradients in bf16; zero keeps fp32 masters."},
    {.path = "bf16.bf16_optimizer_states", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .doc = "Keep optimizer states in bf16; zero keeps them in fp32."},
    {.path = "bf16.nonfinite_grads", .type = T::kEnum, .default_json = "\"skip\"", .flags = kOurs,
     .choices = "skip,error", .ref = FIELD(bf16.nonfinite_grads),
     .doc = "A bf16 step that sees an inf/NaN gradient: skip the step (as fp16 does on overflow) or fail with an "
            "error. The master weights never take the non-finite update."},
    {.path = "bf16.stochastic_rounding", .type = T::kBool, .default_json = "false", .flags = kOurs,
     .ref = FIELD(bf16.stochastic_rounding),
     .doc = "Round the fp32 -> bf16 parameter write-back stochastically (seeded by `seed`, reproducible)."},

    // ---- elastic_batch (ours) ----
    {.path = "elastic_batch", .type = T::kSection, .default_json = "{}", .flags = kOurs,
     .doc = "How the batch follows the world size when a job restarts with fewer or more ranks "
            "(docs/guide/elastic.md)."},
    {.path = "elastic_batch.policy", .type = T::kEnum, .default_json = "\"keep_global\"", .flags = kOurs,
     .choices = "keep_global,keep_micro", .ref = FIELD(elastic_batch.policy),
     .doc = "keep_global: DeepSpeed's derivation at every world size, so the global batch stays (a world it does "
            "not divide is an error naming the numbers); keep_micro: the micro-batch and accumulation steps stay as "
            "the batch keys give them at reference_world_size, and the global batch follows the world."},
    {.path = "elastic_batch.lr_scaling", .type = T::kEnum, .default_json = "\"none\"", .flags = kOurs,
     .choices = "none,linear,sqrt", .ref = FIELD(elastic_batch.lr_scaling),
     .doc = "keep_micro: every step's learning rate (the schedule's, or the trainer's own) times r (linear), "
            "sqrt(r) (sqrt, for Adam) or 1 (none), where r = world size / reference_world_size, the ratio of the "
            "global batches."},
    {.path = "elastic_batch.reference_world_size", .type = T::kInt, .default_json = "null", .min = 1,
     .flags = kOurs, .ref = FIELD(elastic_batch.reference_world_size),
     .doc = "keep_micro: the world size the batch keys and the learning rate were written for (the first "
            "launch's)."},

    // ---- optimizer ----
    {.path = "optimizer", .type = T::kSection, .default_json = "null",
     .doc = "The optimizer zero runs on each rank's shard. Absent: the trainer passes its own "
            "(EngineOptions::optimizer)."},
    {.path = "optimizer.type", .type = T::kEnum, .default_json = "null", .flags = kCaseInsensitive,
     .choices = "Adam,AdamW,SGD", .unimplemented = kUnimplementedOptimizers, .ref = FIELD(optimizer->type),
     .doc = "Adam and AdamW are the same kernel: \"Adam\" decouples weight decay too unless params.adam_w_mode "
            "is false (DeepSpeed's rule).",
     .note = "required"},
    {.path = "optimizer.legacy_fusion", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .doc = "DeepSpeed's legacy fused fp16 optimizer path."},
    {.path = "optimizer.params", .type = T::kSection, .default_json = "{}",
     .doc = "Constructor arguments of optimizer.type; keys of another type are errors."},
    {.path = "optimizer.params.lr", .type = T::kNumber, .default_json = "0.001", .min = 0, .flags = kAutoOk,
     .applies = kForAllOptimizers, .ref = FIELD(optimizer->lr), .doc = "Learning rate (the schedule's base)."},
    {.path = "optimizer.params.betas", .type = T::kNumberPair, .default_json = "[0.9, 0.999]", .min = 0, .max = 1,
     .flags = kAutoOk | kMaxExclusive, .applies = kForAdamFamily,
     .ref = +[](Config& c) -> FieldRef { return RefPair(c.optimizer->beta1, c.optimizer->beta2); },
     .doc = "Adam's moment decay rates [beta1, beta2]."},
    {.path = "optimizer.params.eps", .type = T::kNumber, .default_json = "1e-08", .min = 0, .flags = kAutoOk,
     .applies = kForAdamFamily, .ref = FIELD(optimizer->eps), .doc = "Added to the denominator."},
    {.path = "optimizer.params.weight_decay", .type = T::kNumber, .default_json = "0.0", .min = 0, .flags = kAutoOk,
     .applies = kForAllOptimizers, .ref = FIELD(optimizer->weight_decay),
     .doc = "Decoupled (AdamW) or L2 (Adam with adam_w_mode false, SGD) weight decay."},
    {.path = "optimizer.params.adam_w_mode", .type = T::kBool, .default_json = "true", .applies = kForAdamFamily,
     .ref = FIELD(optimizer->adam_w_mode),
     .doc = "true: decoupled weight decay (AdamW); false: L2 decay added to the gradient (classic Adam).",
     .note = "false only with type Adam"},
    {.path = "optimizer.params.bias_correction", .type = T::kBool, .default_json = "true", .applies = kForAdamFamily,
     .ref = FIELD(optimizer->bias_correction), .doc = "Divide the moments by (1 - beta^t)."},
    {.path = "optimizer.params.amsgrad", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .applies = kForAdamFamily, .doc = "The AMSGrad variant (DeepSpeed's FusedAdam rejects it too)."},
    {.path = "optimizer.params.torch_adam", .type = T::kBool, .default_json = "false", .support = S::kNoEffect,
     .applies = kForAdamFamily, .doc = "DeepSpeed: run torch.optim.Adam instead of its fused kernel.",
     .note = "zero always runs its own Adam kernel"},
    {.path = "optimizer.params.momentum", .type = T::kNumber, .default_json = "0.0", .min = 0, .applies = kForSgd,
     .ref = FIELD(optimizer->momentum), .doc = "SGD momentum factor."},
    {.path = "optimizer.params.dampening", .type = T::kNumber, .default_json = "0.0", .applies = kForSgd,
     .ref = FIELD(optimizer->dampening), .doc = "SGD dampening of the momentum."},
    {.path = "optimizer.params.nesterov", .type = T::kBool, .default_json = "false", .applies = kForSgd,
     .ref = FIELD(optimizer->nesterov), .doc = "Nesterov momentum (needs momentum > 0 and dampening 0)."},
    {.path = "optimizer.params.max_grad_norm", .type = T::kAny, .default_json = "null", .support = S::kRejected,
     .doc = "Clipping belongs to the top-level gradient_clipping.",
     .note = "'max_grad_norm' is not supported as an optimizer parameter, please switch to using the deepspeed "
             "parameter 'gradient_clipping' (DeepSpeed's message)"},

    // ---- scheduler ----
    {.path = "scheduler", .type = T::kSection, .default_json = "null",
     .doc = "Learning-rate schedule, stepped once per applied optimizer step. Absent: constant optimizer.params.lr."},
    {.path = "scheduler.type", .type = T::kEnum, .default_json = "null",
     .choices = "WarmupLR,WarmupDecayLR,WarmupCosineLR",
     .unimplemented = "LRRangeTest,OneCycle", .ref = FIELD(scheduler.type),
     .doc = "DeepSpeed's schedules (deepspeed/runtime/lr_schedules.py), same formulas.", .note = "required"},
    {.path = "scheduler.params", .type = T::kSection, .default_json = "{}",
     .doc = "Constructor arguments of scheduler.type; keys of another type are errors."},
    {.path = "scheduler.params.warmup_min_lr", .type = T::kNumber, .default_json = "0.0", .min = 0,
     .flags = kAutoOk, .applies = kForWarmupLR | kForWarmupDecayLR, .ref = FIELD(scheduler.warmup_min_lr),
     .doc = "Learning rate at step 0."},
    {.path = "scheduler.params.warmup_max_lr", .type = T::kNumber, .default_json = "0.001", .min = 0,
     .flags = kAutoOk, .applies = kForWarmupLR | kForWarmupDecayLR, .ref = FIELD(scheduler.warmup_max_lr),
     .doc = "Learning rate at the end of warmup.",
     .default_doc = "`0.001`; WarmupLR without it: optimizer.params.lr (DeepSpeed takes the optimizer's lr)"},
    {.path = "scheduler.params.warmup_num_steps", .type = T::kInt, .default_json = "1000", .min = 1,
     .flags = kAutoOk, .applies = kForAllSchedulers, .ref = FIELD(scheduler.warmup_num_steps),
     .doc = "Warmup length in steps (DeepSpeed uses at least 2)."},
    {.path = "scheduler.params.warmup_type", .type = T::kEnum, .default_json = "\"log\"", .choices = "log,linear",
     .applies = kForAllSchedulers, .ref = FIELD(scheduler.warmup_type),
     .doc = "Warmup curve. DeepSpeed falls back to log on an unknown name; zero rejects it."},
    {.path = "scheduler.params.total_num_steps", .type = T::kInt, .default_json = "null", .min = 1, .flags = kAutoOk,
     .applies = kForWarmupDecayLR | kForWarmupCosineLR, .ref = FIELD(scheduler.total_num_steps),
     .doc = "Steps until the decay reaches its end.", .note = "required by WarmupDecayLR and WarmupCosineLR"},
    {.path = "scheduler.params.warmup_min_ratio", .type = T::kNumber, .default_json = "0.0", .min = 0, .max = 1,
     .applies = kForWarmupCosineLR, .ref = FIELD(scheduler.warmup_min_ratio),
     .doc = "Start of warmup as a fraction of optimizer.params.lr."},
    {.path = "scheduler.params.cos_min_ratio", .type = T::kNumber, .default_json = "0.0001", .min = 0, .max = 1,
     .applies = kForWarmupCosineLR, .ref = FIELD(scheduler.cos_min_ratio),
     .doc = "End of the cosine decay as a fraction of optimizer.params.lr."},
    {.path = "scheduler.params.last_batch_iteration", .type = T::kInt, .default_json = "-1", .min = -1,
     .applies = kForAllSchedulers, .ref = FIELD(scheduler.last_batch_iteration),
     .doc = "Index of the last step taken, to resume a schedule; -1: start."},

    // ---- activation_checkpointing ----
    {.path = "activation_checkpointing", .type = T::kSection, .default_json = "{}",
     .doc = "Settings of zero::recompute (DeepSpeed's deepspeed.checkpointing)."},
    {.path = "activation_checkpointing.partition_activations", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .ref = FIELD(activation_checkpointing.partition_activations),
     .doc = "Shard saved activations across model-parallel ranks; zero has no model parallelism."},
    {.path = "activation_checkpointing.cpu_checkpointing", .type = T::kBool, .default_json = "false",
     .ref = FIELD(activation_checkpointing.cpu_checkpointing),
     .doc = "Keep each segment's saved inputs in host memory (DeepSpeed needs partition_activations for it; "
            "zero does not)."},
    {.path = "activation_checkpointing.contiguous_memory_optimization", .type = T::kBool, .default_json = "false",
     .ref = FIELD(activation_checkpointing.contiguous_memory_optimization),
     .doc = "Copy saved inputs into one preallocated buffer (sized by number_checkpoints)."},
    {.path = "activation_checkpointing.number_checkpoints", .type = T::kInt, .default_json = "null", .min = 1,
     .ref = FIELD(activation_checkpointing.number_checkpoints),
     .doc = "Number of checkpointed segments, to size the contiguous buffer."},
    {.path = "activation_checkpointing.synchronize_checkpoint_boundary", .type = T::kBool, .default_json = "false",
     .support = S::kNoEffect, .ref = FIELD(activation_checkpointing.synchronize_checkpoint_boundary),
     .doc = "Synchronize the device at every segment boundary.",
     .note = "the host engine has no device to synchronize"},
    {.path = "activation_checkpointing.profile", .type = T::kBool, .default_json = "false",
     .ref = FIELD(activation_checkpointing.profile), .doc = "Time the forward and recompute of each segment."},

    // ---- data_types ----
    {.path = "data_types", .type = T::kSection, .default_json = "{}", .doc = "DeepSpeed's per-role data types."},
    {.path = "data_types.grad_accum_dtype", .type = T::kEnum, .default_json = "null", .flags = kCaseInsensitive,
     .choices = "fp32", .unimplemented = "fp16,bf16",
     .doc = "Data type gradients are accumulated in across micro-steps; zero accumulates in fp32."},
    {.path = "data_types.param_dtype", .type = T::kString, .default_json = "null", .support = S::kOffOnly,
     .doc = "DeepSpeed: override the parameters' data type."},
    {.path = "data_types.buffer_dtype", .type = T::kString, .default_json = "null", .support = S::kOffOnly,
     .doc = "DeepSpeed: override the module buffers' data type."},

    // ---- zero_optimization ----
    {.path = "zero_optimization", .type = T::kSection, .default_json = "{}",
     .doc = "What is sharded across the data-parallel ranks, and how it moves."},
    {.path = "zero_optimization.stage", .type = T::kInt, .default_json = "0", .min = 0, .max = 3, .flags = kAutoOk,
     .ref = FIELD(zero.stage),
     .doc = "0: replicate everything (DDP); 1: shard optimizer state and fp32 master; 2: also gradients; 3: also "
            "parameters."},
    {.path = "zero_optimization.contiguous_gradients", .type = T::kBool, .default_json = "true",
     .support = S::kNoEffect, .ref = FIELD(zero.contiguous_gradients),
     .doc = "Copy gradients into a contiguous buffer as they are produced.",
     .note = "gradients are always produced in one contiguous buffer per unit"},
    {.path = "zero_optimization.overlap_comm", .type = T::kBool, .default_json = "null",
     .ref = FIELD(zero.overlap_comm), .doc = "Overlap gradient reduction with the backward pass.",
     .default_doc = "null: true for stage 3, false otherwise (DeepSpeed's validator; its docs say false)"},
    {.path = "zero_optimization.reduce_scatter", .type = T::kBool, .default_json = "true",
     .support = S::kOffOnly, .ref = FIELD(zero.reduce_scatter),
     .doc = "Reduce-scatter gradients (false: all-reduce); zero always reduce-scatters at stages 1-3."},
    {.path = "zero_optimization.reduce_bucket_size", .type = T::kInt, .default_json = "500000000", .min = 0,
     .flags = kAutoOk, .ref = FIELD(zero.reduce_bucket_size),
     .doc = "Gradient elements in reduction at once; a larger unit is reduce-scattered in chunks of at most this."},
    {.path = "zero_optimization.use_multi_rank_bucket_allreduce", .type = T::kBool, .default_json = "true",
     .support = S::kNoEffect, .doc = "DeepSpeed stage 1/2: merge per-rank reduces into one all-reduce.",
     .note = "zero reduces with a true reduce-scatter"},
    {.path = "zero_optimization.allgather_partitions", .type = T::kBool, .default_json = "true",
     .support = S::kOffOnly, .ref = FIELD(zero.allgather_partitions),
     .doc = "All-gather updated parameters after the step (false: a series of broadcasts)."},
    {.path = "zero_optimization.allgather_bucket_size", .type = T::kInt, .default_json = "500000000", .min = 0,
     .flags = kEven, .ref = FIELD(zero.allgather_bucket_size),
     .doc = "Elements per parameter all-gather; a larger unit is gathered in chunks of at most this (DeepSpeed "
            "asserts it is even)."},
    {.path = "zero_optimization.load_from_fp32_weights", .type = T::kBool, .default_json = "true",
     .support = S::kOffOnly,
     .doc = "DeepSpeed: initialize the fp32 master from a checkpoint's fp32 copy rather than its 16-bit weights. "
            "zero's checkpoints (zero/checkpoint.h) always hold the fp32 master and Load restores it; starting it "
            "from the 16-bit weights instead is not implemented."},
    {.path = "zero_optimization.elastic_checkpoint", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .ref = FIELD(zero.elastic_checkpoint),
     .doc = "DeepSpeed's legacy elastic checkpoints (\"no longer supported\" there too)."},
    {.path = "zero_optimization.offload_param", .type = T::kSection, .default_json = "null",
     .doc = "Keep the parameter shards in host memory (cpu) or in files (nvme) between uses (stage 3)."},
    {.path = "zero_optimization.offload_param.device", .type = T::kEnum, .default_json = "\"none\"",
     .flags = kAutoOk, .choices = "none,cpu,nvme", .ref = FIELD(zero.offload_param.device),
     .doc = "Where parameter shards live: none (accelerator), cpu, nvme (files under nvme_path, ZeRO-Infinity).",
     .note = "nvme: the host engine only; each shard is read into one of buffer_count host buffers for its gather "
             "and its update, and written back after the step; persistent units stay gathered in the compute tier"},
    {.path = "zero_optimization.offload_param.nvme_path", .type = T::kString, .default_json = "null",
     .flags = kAutoOk, .ref = FIELD(zero.offload_param.nvme_path),
     .doc = "Directory for NVMe offload (device nvme only): each rank's file is created there and unlinked."},
    {.path = "zero_optimization.offload_param.pin_memory", .type = T::kBool, .default_json = "true",
     .ref = FIELD(zero.offload_param.pin_memory), .doc = "Page-locked host buffers (faster copies).",
     .note = "page-locked (cudaHostAlloc) when built with CUDA and a GPU is present, plain host memory otherwise"},
    {.path = "zero_optimization.offload_param.buffer_count", .type = T::kInt, .default_json = "5", .min = 0,
     .ref = FIELD(zero.offload_param.buffer_count),
     .doc = "Buffers in the NVMe swap pool (NVMe offload only).",
     .note = "at least 1 with device nvme; a gather holds one from its issue (prefetch included) until it is waited "
             "for, so it bounds the gathers in flight"},
    {.path = "zero_optimization.offload_param.buffer_size", .type = T::kInt, .default_json = "100000000", .min = 0,
     .ref = FIELD(zero.offload_param.buffer_size),
     .doc = "Elements per NVMe swap buffer (NVMe offload only).",
     .note = "each buffer holds a whole shard: a unit whose shard is larger is refused at Finalize, naming it; the "
             "buffers allocated hold min(buffer_size, the largest shard) elements"},
    {.path = "zero_optimization.offload_param.max_in_cpu", .type = T::kInt, .default_json = "1000000000", .min = 0,
     .support = S::kOffOnly, .ref = FIELD(zero.offload_param.max_in_cpu),
     .doc = "Elements kept in host memory with NVMe offload (NVMe offload only)."},
    {.path = "zero_optimization.offload_optimizer", .type = T::kSection, .default_json = "null",
     .doc = "Keep optimizer state and fp32 master in host memory and run the optimizer step on the CPU."},
    {.path = "zero_optimization.offload_optimizer.device", .type = T::kEnum, .default_json = "\"none\"",
     .flags = kAutoOk, .choices = "none,cpu,nvme", .ref = FIELD(zero.offload_optimizer.device),
     .doc = "Where optimizer state lives: none (accelerator), cpu, nvme (files under nvme_path, ZeRO-Infinity).",
     .note = "nvme: the host engine only; the fp32 master and optimizer state stream through buffer_count host "
             "buffers of sub_group_size elements"},
    {.path = "zero_optimization.offload_optimizer.nvme_path", .type = T::kString, .default_json = "null",
     .flags = kAutoOk, .ref = FIELD(zero.offload_optimizer.nvme_path),
     .doc = "Directory for NVMe offload (device nvme only): each rank's file is created there and unlinked."},
    {.path = "zero_optimization.offload_optimizer.pin_memory", .type = T::kBool, .default_json = "true",
     .ref = FIELD(zero.offload_optimizer.pin_memory), .doc = "Page-locked host buffers (faster copies).",
     .note = "page-locked (cudaHostAlloc) when built with CUDA and a GPU is present, plain host memory otherwise"},
    {.path = "zero_optimization.offload_optimizer.buffer_count", .type = T::kInt, .default_json = "4", .min = 0,
     .ref = FIELD(zero.offload_optimizer.buffer_count),
     .doc = "Buffers in the NVMe swap pool (NVMe offload only).",
     .note = "at least 1 with device nvme; each holds one chunk (sub_group_size elements) of master and state"},
    {.path = "zero_optimization.offload_optimizer.pipeline_read", .type = T::kBool, .default_json = "false",
     .ref = FIELD(zero.offload_optimizer.pipeline_read),
     .doc = "Overlap reading the next NVMe tile with the step (NVMe offload only)."},
    {.path = "zero_optimization.offload_optimizer.pipeline_write", .type = T::kBool, .default_json = "false",
     .ref = FIELD(zero.offload_optimizer.pipeline_write),
     .doc = "Overlap writing the previous NVMe tile with the step (NVMe offload only)."},
    {.path = "zero_optimization.offload_optimizer.fast_init", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .ref = FIELD(zero.offload_optimizer.fast_init),
     .doc = "Fast optimizer-state initialization on NVMe (NVMe offload only)."},
    {.path = "zero_optimization.offload_optimizer.ratio", .type = T::kNumber, .default_json = "1.0", .min = 0,
     .max = 1, .ref = FIELD(zero.offload_optimizer.ratio),
     .doc = "Fraction of each shard updated on the host (DeepSpeed's Twin-Flow); below 1 needs stage 3.",
     .note = "rounded down to 32-element blocks; below 1 not with offload_param; the host engine's device part "
             "runs on the CPU too (compute tier)"},
    {.path = "zero_optimization.offload_optimizer.super_offload", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .doc = "DeepSpeed's SuperOffload for superchips (stage 3)."},
    {.path = "zero_optimization.offload_optimizer.cpuadam_cores_perc", .type = T::kNumber, .default_json = "0.8",
     .min = 0, .max = 1, .support = S::kNoEffect, .doc = "DeepSpeed: share of CPU cores for CPU Adam (super_offload).",
     .note = "used only by super_offload, which zero lacks"},
    {.path = "zero_optimization.zenflow", .type = T::kAny, .default_json = "null", .support = S::kOffOnly,
     .doc = "DeepSpeed's ZenFlow (stall-free offload) settings."},
    {.path = "zero_optimization.sub_group_size", .type = T::kInt, .default_json = "1000000000", .min = 0,
     .ref = FIELD(zero.sub_group_size),
     .doc = "Elements per optimizer-step tile; also caps the offload copy-back tile (at most 1 M elements)."},
    {.path = "zero_optimization.stage3_prefetch_bucket_size", .type = T::kInt, .default_json = "50000000", .min = 0,
     .flags = kAutoOk, .ref = FIELD(zero.stage3_prefetch_bucket_size),
     .doc = "Stage 3: elements of parameters all-gathered ahead of use (DeepSpeed's docs say 5e8; its code 5e7)."},
    {.path = "zero_optimization.stage3_param_persistence_threshold", .type = T::kInt, .default_json = "100000",
     .min = 0, .flags = kAutoOk, .ref = FIELD(zero.stage3_param_persistence_threshold),
     .doc = "Stage 3: parameters with fewer elements stay whole on every rank."},
    {.path = "zero_optimization.stage3_model_persistence_threshold", .type = T::kInt,
     .default_json = "9223372036854775807", .min = 0, .ref = FIELD(zero.stage3_model_persistence_threshold),
     .doc = "Stage 3: cap on the total elements kept whole by the persistence threshold.",
     .default_doc = "`sys.maxsize` (9223372036854775807)"},
    {.path = "zero_optimization.stage3_max_live_parameters", .type = T::kInt, .default_json = "1000000000", .min = 0,
     .ref = FIELD(zero.stage3_max_live_parameters), .doc = "Stage 3: gathered elements resident at once, at most."},
    {.path = "zero_optimization.stage3_max_reuse_distance", .type = T::kInt, .default_json = "1000000000", .min = 0,
     .support = S::kNoEffect, .ref = FIELD(zero.stage3_max_reuse_distance),
     .doc = "Stage 3: keep a gathered parameter if it is used again within this many elements.",
     .note = "zero releases a unit when its scope closes (reshard after forward)"},
    {.path = "zero_optimization.stage3_gather_16bit_weights_on_model_save", .type = T::kBool,
     .default_json = "false", .flags = kAutoOk, .support = S::kNoEffect,
     .ref = FIELD(zero.stage3_gather_16bit_weights_on_model_save),
     .doc = "Stage 3: gather the full 16-bit weights when the model is saved.",
     .note = "zero has no model save yet; Engine::GatherParam returns full fp32 weights"},
    {.path = "zero_optimization.stage3_module_granularity_threshold", .type = T::kInt, .default_json = "0",
     .support = S::kOffOnly, .off_max = 0,
     .doc = "DeepSpeed stage 3: fetch fine-grained modules as one unit (zero's units are the trainer's choice)."},
    {.path = "zero_optimization.stage3_use_all_reduce_for_fetch_params", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .doc = "DeepSpeed stage 3: gather parameters with an all-reduce."},
    {.path = "zero_optimization.stage3_allgather_sequential", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .doc = "DeepSpeed stage 3: all-gather parameters one by one, unbucketed."},
    {.path = "zero_optimization.ignore_unused_parameters", .type = T::kBool, .default_json = "true",
     .ref = FIELD(zero.ignore_unused_parameters),
     .doc = "false: a unit that got no backward before the step is an error."},
    {.path = "zero_optimization.legacy_stage1", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .doc = "DeepSpeed's old stage 1 implementation."},
    {.path = "zero_optimization.round_robin_gradients", .type = T::kBool, .default_json = "false",
     .support = S::kNoEffect, .ref = FIELD(zero.round_robin_gradients),
     .doc = "Stage 1/2 with CPU offload: spread gradient copies to the host across ranks.",
     .note = "each rank copies only its own reduced shard to the host; there is nothing to spread"},
    {.path = "zero_optimization.zero_hpz_partition_size", .type = T::kInt, .default_json = "1", .min = 0,
     .ref = FIELD(zero.zero_hpz_partition_size),
     .doc = "ZeRO++ hpZ: H > 1 keeps, after each stage-3 forward gather, a secondary copy of the unit's parameters "
            "(compute dtype) sharded over the H consecutive ranks of the host group, and backward gathers it inside "
            "that group; Ψ/H more parameter memory per rank. H must divide the world size and the ranks per host "
            "(EngineOptions::local_world_size, else the launcher's: LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, Slurm's tasks per node). Stage 3; on the CUDA engine (NCCL) built and proven on an emulated device tier, not yet run on GPUs; not with "
            "mics_shard_size or offload_param. 0 and 1: off."},
    {.path = "zero_optimization.zero_quantized_weights", .type = T::kBool, .default_json = "false",
     .ref = FIELD(zero.zero_quantized_weights),
     .doc = "ZeRO++ qwZ: stage 3's parameter gathers, forward and backward as in DeepSpeed, move int8 blocks with "
            "one fp32 scale each (about a quarter of fp32's bytes, half of bf16's), dequantized into the gathered "
            "parameters, so both scopes see the same quantized weights; the shards and the master stay exact. A "
            "unit's 1-D parameters (biases, norm gains) go exact beside the blocks, where a norm gain of about 1 "
            "would set the scale of the weights next to it (with zero_hpz_partition_size, backward gathers the forward's dequantized values inside the host). Stage 3, "
            "host (Gloo) engine; on the CUDA engine (NCCL) built and proven on an emulated device tier, not yet run "
            "on a GPU. A unit larger than allgather_bucket_size is gathered in quantized chunks of whole blocks, "
            "bit for bit its whole gather."},
    {.path = "zero_optimization.zero_quantized_weights_block_size", .type = T::kInt, .default_json = "4096",
     .min = 32, .max = 1 << 20, .flags = kOurs, .ref = FIELD(zero.zero_quantized_weights_block_size),
     .doc = "zero_quantized_weights: elements per quantization block (one fp32 scale each: 4 bytes per block on "
            "the wire beside the block's int8 codes). 4096 is near DeepSpeed's groups (at most 8000); the host "
            "coders' rate did not change beyond the noise from 256 to 8192 (bench QuantizeBlock), and smaller blocks "
            "did not follow the exact run's loss more closely on the small GPT (bench/results/zeropp.md)."},
    {.path = "zero_optimization.zero_quantized_nontrainable_weights", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .doc = "Store frozen weights quantized."},
    {.path = "zero_optimization.zero_quantized_gradients", .type = T::kBool, .default_json = "false",
     .ref = FIELD(zero.zero_quantized_gradients),
     .doc = "ZeRO++ qgZ: stages 1-3 reduce-scatter each unit's gradient as int8 (or int4) blocks with one fp32 scale "
            "each, by all-to-all: inside the host first (EngineOptions::local_world_size, else the launcher's ranks per host), each "
            "rank summing the dequantized parts of the shards it forwards, then across hosts, requantized; one hop "
            "when the ranks are one host, or the hosts are uneven, or under mics_shard_size (over the shard group). "
            "Sums are f32. A unit's 1-D parameters (biases, norm gains) go exact, in f32 beside the blocks, as "
            "DeepSpeed reduces 1-D tensors exact. With LoCo error feedback (on by default) each rank carries what "
            "quantization lost into its next reduction; a checkpoint keeps it only with SaveOptions::save_qgz_residuals "
            "(zero-gpt --save-qgz-residuals: a resume at the same layout is then bit for bit), else a Load restarts it "
            "at zero. Engine and ShardedOptimizer, on the host (Gloo) engine; on the CUDA engine (NCCL) built and proven "
            "on an emulated device tier, not yet run on a GPU. A unit larger than reduce_bucket_size is reduced in "
            "quantized chunks of whole blocks, bit for bit its whole reduction."},
    {.path = "zero_optimization.zero_quantized_gradients_bits", .type = T::kInt, .default_json = "8", .min = 4,
     .max = 8, .flags = kOurs, .ref = FIELD(zero.zero_quantized_gradients_bits),
     .doc = "zero_quantized_gradients: 8 (int8) or 4 (int4, two per byte, as DeepSpeed's qgZ): bits per element "
            "on the wire."},
    {.path = "zero_optimization.zero_quantized_gradients_block_size", .type = T::kInt, .default_json = "1024",
     .min = 32, .max = 1 << 20, .flags = kOurs, .ref = FIELD(zero.zero_quantized_gradients_block_size),
     .doc = "zero_quantized_gradients: elements per quantization block (one fp32 scale each)."},
    {.path = "zero_optimization.zero_quantized_gradients_error_feedback", .type = T::kBool, .default_json = "true",
     .flags = kOurs, .ref = FIELD(zero.zero_quantized_gradients_error_feedback),
     .doc = "zero_quantized_gradients: LoCo error feedback (zeropp_loco_param), on unless false. DeepSpeed runs "
            "LoCo only when zeropp_loco_param is given; zero runs it by default, as its loss-parity runs do. Costs "
            "per rank one compute-dtype copy of each reduced unit's gradient, and with two hops 1/ranks-per-host "
            "of it again (about 1 byte per element with zero_quantized_gradients_error_feedback_dtype \"int8\")."},
    {.path = "zero_optimization.zero_quantized_gradients_error_feedback_dtype", .type = T::kEnum,
     .default_json = "\"compute\"", .flags = kOurs, .choices = "compute,int8",
     .ref = FIELD(zero.zero_quantized_gradients_error_feedback_dtype),
     .doc = "zero_quantized_gradients with LoCo: how the residuals are kept. \"compute\": in the compute dtype (as "
            "DeepSpeed keeps them, in the gradient's). \"int8\": one byte per element and one fp32 scale per block of "
            "zero_quantized_gradients_block_size, as the LoCo paper stores its compensation error (8 bits): about a "
            "quarter of fp32's bytes and half of bf16's, at the cost of rounding the residual itself."},
    {.path = "zero_optimization.zeropp_loco_param", .type = T::kSection, .default_json = "null",
     .doc = "ZeRO++ LoCo error feedback for zero_quantized_gradients (DeepSpeed's {err_beta, reset_T})."},
    {.path = "zero_optimization.zeropp_loco_param.err_beta", .type = T::kNumber, .default_json = "0.8", .min = 0,
     .max = 1, .ref = FIELD(zero.zeropp_loco_err_beta),
     .doc = "LoCo: the residual kept is err_beta · residual + (1 - err_beta) · (what this quantization lost)."},
    {.path = "zero_optimization.zeropp_loco_param.reset_T", .type = T::kInt, .default_json = "1024", .min = 0,
     .ref = FIELD(zero.zeropp_loco_reset_t),
     .doc = "LoCo: the residuals are zeroed every reset_T reductions of a unit (0: never)."},
    {.path = "zero_optimization.mics_shard_size", .type = T::kInt, .default_json = "-1",
     .ref = FIELD(zero.mics_shard_size),
     .doc = "MiCS / FSDP HYBRID_SHARD: shard parameters, gradients and optimizer state within groups of this many "
            "consecutive ranks, replicate across the groups (gradient shards all-reduced across them at each step); "
            "stages 1-3; must divide the world size; <= 0: shard across all ranks."},
    {.path = "zero_optimization.mics_hierarchical_params_gather", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .doc = "MiCS hierarchical all-gather."},
    {.path = "zero_optimization.memory_efficient_linear", .type = T::kBool, .default_json = "true",
     .support = S::kNoEffect, .doc = "DeepSpeed stage 3: its own autograd function for torch.nn.Linear.",
     .note = "the trainer owns its layers; zero patches nothing"},
    {.path = "zero_optimization.pipeline_loading_checkpoint", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .doc = "DeepSpeed stage 3: load checkpoints in pipeline mode."},
    {.path = "zero_optimization.override_module_apply", .type = T::kBool, .default_json = "true",
     .support = S::kNoEffect, .doc = "DeepSpeed stage 3: patch torch.nn.Module.apply.",
     .note = "zero has no module hooks"},
    {.path = "zero_optimization.log_trace_cache_warnings", .type = T::kBool, .default_json = "false",
     .support = S::kNoEffect, .doc = "DeepSpeed stage 3: log when the recorded fetch order is invalidated.",
     .note = "zero's prefetch always warns (once) when the gather order changes"},
    {.path = "zero_optimization.enable_sanity_checks", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .doc = "DeepSpeed's internal consistency checks."},
    {.path = "zero_optimization.save_muon_momentum_buffer_in_memory", .type = T::kBool, .default_json = "false",
     .support = S::kOffOnly, .doc = "DeepSpeed: keep Muon momentum in memory under NVMe offload."},
    {.path = "zero_optimization.leaf_module", .type = T::kAny, .default_json = "{}", .support = S::kOffOnly,
     .doc = "DeepSpeed stage 3: modules fetched as leaves (classes, names)."},

    // ---- aio ----
    {.path = "aio", .type = T::kSection, .default_json = "{}",
     .doc = "Async I/O for NVMe offload (DeepSpeed's libaio settings): zero's I/O engine (io_uring or a thread "
            "pool) under offload_optimizer.device nvme."},
    {.path = "aio.block_size", .type = T::kInt, .default_json = "1048576", .min = 1, .flags = kPowerOfTwo,
     .ref = FIELD(aio.block_size), .doc = "Bytes per I/O request.",
     .note = "at least 4096 (the O_DIRECT granule) with device nvme"},
    {.path = "aio.queue_depth", .type = T::kInt, .default_json = "8", .min = 1,
     .ref = FIELD(aio.queue_depth), .doc = "Requests in flight."},
    {.path = "aio.intra_op_parallelism", .type = T::kInt, .default_json = "1", .min = 1, .support = S::kNoEffect,
     .ref = FIELD(aio.intra_op_parallelism), .doc = "I/O threads per request.",
     .note = "a request's pieces already run queue_depth wide"},
    {.path = "aio.single_submit", .type = T::kBool, .default_json = "false",
     .ref = FIELD(aio.single_submit), .doc = "Submit requests one at a time."},
    {.path = "aio.overlap_events", .type = T::kBool, .default_json = "true",
     .ref = FIELD(aio.overlap_events), .doc = "Overlap submission and completion."},
    {.path = "aio.use_gds", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .ref = FIELD(aio.use_gds), .doc = "GPUDirect Storage."},

    // ---- checkpoint ----
    // A section rather than an ignored one: load_universal changes what a load means, so it must be refused.
    {.path = "checkpoint", .type = T::kSection, .default_json = "{}",
     .doc = "DeepSpeed's checkpoint options. zero saves and loads with Engine::Save and Load (zero/checkpoint.h: "
            "one file per rank, resharded at load to any world and stage): options that only tune how DeepSpeed "
            "writes or checks its checkpoints are accepted without effect; those that change what is loaded are "
            "not implemented."},
    {.path = "checkpoint.tag_validation", .type = T::kEnum, .default_json = "\"Warn\"", .flags = kCaseInsensitive,
     .choices = "Warn,Ignore,Fail", .support = S::kNoEffect,
     .doc = "DeepSpeed: check that all ranks save under the same checkpoint tag.",
     .note = "zero always checks, as \"Fail\": ranks asking Save for different tags fail on every rank before "
             "anything is written"},
    {.path = "checkpoint.load_universal", .type = T::kBool, .default_json = "false", .support = S::kOffOnly,
     .doc = "DeepSpeed: load a universal checkpoint, resharded for another parallel layout."},
    {.path = "checkpoint.use_node_local_storage", .type = T::kBool, .default_json = "false", .support = S::kNoEffect,
     .doc = "DeepSpeed: each node saves to its own local storage.",
     .note = "zero's ranks write their files into the one folder Save is given"},
    {.path = "checkpoint.parallel_write", .type = T::kSection, .default_json = "{}",
     .doc = "DeepSpeed: parallel checkpoint writing."},
    {.path = "checkpoint.parallel_write.pipeline_stage", .type = T::kBool, .default_json = "false",
     .support = S::kNoEffect, .doc = "DeepSpeed: pipeline stages write their checkpoint parts in parallel.",
     .note = "zero has no pipeline stages; every rank writes its own file in parallel anyway"},
    {.path = "checkpoint.writer", .type = T::kAny, .default_json = "null", .support = S::kNoEffect,
     .doc = "DeepSpeed: the checkpoint writer (its type and buffers).",
     .note = "zero writes through its I/O engine (the aio section); asynchronous saves: SaveOptions::async"},

    // ---- DeepSpeed subsystems zero ignores (accepted with a one-line warning) ----
    {.path = "tensorboard", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's TensorBoard monitor"},
    {.path = "wandb", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's Weights & Biases monitor"},
    {.path = "csv_monitor", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's CSV monitor"},
    {.path = "comet", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's Comet monitor"},
    {.path = "monitor_config", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's monitor settings"},
    {.path = "comms_logger", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's communication logger"},
    {.path = "flops_profiler", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's FLOPs profiler"},
    {.path = "autotuning", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's autotuner"},
    {.path = "compression_training", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed Compression"},
    {.path = "quantize_training", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's MoQ quantized training"},
    {.path = "weight_quantization", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's inference weight quantization"},
    {.path = "elasticity", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's elastic training"},
    {.path = "pipeline", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's pipeline parallelism"},
    {.path = "amp", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "Apex AMP (use fp16 or bf16)"},
    {.path = "torch_autocast", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's torch.autocast integration"},
    {.path = "curriculum_learning", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's curriculum learning"},
    {.path = "data_efficiency", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's data efficiency library"},
    {.path = "progressive_layer_drop", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's progressive layer drop"},
    {.path = "eigenvalue", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's eigenvalue computation"},
    {.path = "nebula", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's Nebula checkpoint service"},
    {.path = "datastates", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's DataStates checkpointing"},
    {.path = "sparse_attention", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's sparse attention kernels"},
    {.path = "compile", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's torch.compile integration"},
    {.path = "timers", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's timers"},
    {.path = "tensor_parallel", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's tensor parallelism"},
    {.path = "expert_parallel", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's expert parallelism"},
    {.path = "hybrid_engine", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed-Chat's hybrid engine"},
    {.path = "sequence_parallel_size", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed-Ulysses sequence parallelism"},
    {.path = "seq_parallel_communication_data_type", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed-Ulysses communication type"},
    {.path = "zero_allow_untested_optimizer", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's guard for client optimizers"},
    {.path = "zero_force_ds_cpu_optimizer", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's guard for CPU optimizers under offload"},
    {.path = "sparse_gradients", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's CSR gradients for embeddings"},
    {.path = "disable_allgather", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed engine option"},
    {.path = "dump_state", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's state dump"},
    {.path = "memory_breakdown", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's memory logging (zero tags every byte anyway)"},
    {.path = "vocabulary_size", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's tensor-core alignment hint"},
    {.path = "dataloader_drop_last", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's data loader option"},
    {.path = "graph_harvesting", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's CUDA graph capture"},
    {.path = "use_data_before_expert_parallelism", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed's MoE topology option"},
    {.path = "managed_gradient_accumulation", .type = T::kAny, .default_json = "null", .support = S::kIgnored,
     .doc = "DeepSpeed engine option"},
};
// clang-format on

const AliasSpec kAliases[] = {
    {"zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size", AliasKind::kSynonym,
     "DeepSpeed's pydantic field name"},
    {"zero_optimization.param_persistence_threshold", "zero_optimization.stage3_param_persistence_threshold",
     AliasKind::kSynonym, "DeepSpeed's pydantic field name"},
    {"zero_optimization.model_persistence_threshold", "zero_optimization.stage3_model_persistence_threshold",
     AliasKind::kSynonym, "DeepSpeed's pydantic field name"},
    {"zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters", AliasKind::kSynonym,
     "DeepSpeed's pydantic field name"},
    {"zero_optimization.max_reuse_distance", "zero_optimization.stage3_max_reuse_distance", AliasKind::kSynonym,
     "DeepSpeed's pydantic field name"},
    {"zero_optimization.gather_16bit_weights_on_model_save",
     "zero_optimization.stage3_gather_16bit_weights_on_model_save", AliasKind::kSynonym,
     "DeepSpeed's pydantic field name"},
    {"zero_optimization.module_granularity_threshold", "zero_optimization.stage3_module_granularity_threshold",
     AliasKind::kSynonym, "DeepSpeed's pydantic field name"},
    {"zero_optimization.use_all_reduce_for_fetch_params", "zero_optimization.stage3_use_all_reduce_for_fetch_params",
     AliasKind::kSynonym, "DeepSpeed's pydantic field name"},
    {"zero_optimization.allgather_sequential", "zero_optimization.stage3_allgather_sequential", AliasKind::kSynonym,
     "DeepSpeed's pydantic field name"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
     "zero_optimization.stage3_gather_16bit_weights_on_model_save", AliasKind::kDeprecated,
     "deprecated in DeepSpeed; mapped with a warning"},
    {"zero_optimization.cpu_offload", "zero_optimization.offload_optimizer.device", AliasKind::kDeprecatedOffload,
     "deprecated in DeepSpeed: true means offload_optimizer.device \"cpu\"; mapped with a warning"},
    {"zero_optimization.cpu_offload_param", "zero_optimization.offload_param.device", AliasKind::kDeprecatedOffload,
     "deprecated in DeepSpeed: true means offload_param.device \"cpu\"; mapped with a warning"},
    {"zero_optimization.cpu_offload_use_pin_memory", "zero_optimization.offload_optimizer.pin_memory",
     AliasKind::kDeprecatedPin,
     "deprecated in DeepSpeed (which only warns); zero sets pin_memory of offload_optimizer and offload_param "
     "where not given, with a warning"},
    {"zero_optimization", "zero_optimization.stage", AliasKind::kDeprecatedBoolStage,
     "a bool instead of a section (DeepSpeed's oldest format): true means stage 1, false stage 0; with a warning"},
    {"bfloat16", "bf16", AliasKind::kDeprecatedSection, "DeepSpeed's old name of the bf16 section; with a warning"},
    {"aio.thread_count", "aio.intra_op_parallelism", AliasKind::kDeprecated,
     "DeepSpeed's legacy name (still in its docs); mapped with a warning"},
};

const CrossRule kCrossRules[] = {
    {"precision", "fp16.enabled, bf16.enabled",
     "fp16.enabled and bf16.enabled cannot both be true (DeepSpeed: bfloat16 and fp16 modes cannot be "
     "simultaneously enabled)",
     false, false},
    {"mics_stage", "zero_optimization.mics_shard_size, zero_optimization.stage",
     "mics_shard_size > 0 shards within groups: it needs stage 1, 2 or 3 (stage 0 shards nothing)", false, false},
    {"mics_divides", "zero_optimization.mics_shard_size, world size",
     "mics_shard_size must divide the world size (the groups are equal: world / mics_shard_size replicas)", true,
     false},
    {"hpz_stage", "zero_optimization.zero_hpz_partition_size, zero_optimization.stage",
     "zero_hpz_partition_size > 1 keeps a secondary copy of stage 3's gathered parameters: it needs stage 3", false,
     false},
    {"hpz_divides", "zero_optimization.zero_hpz_partition_size, world size",
     "zero_hpz_partition_size must divide the world size (the host groups are equal: world / H of them)", true, false},
    {"hpz_mics", "zero_optimization.zero_hpz_partition_size, zero_optimization.mics_shard_size",
     "zero_hpz_partition_size > 1 with mics_shard_size > 0 is not built (hybrid sharding over a host's ranks "
     "already keeps every gather inside the host)",
     false, false},
    {"hpz_offload_param", "zero_optimization.zero_hpz_partition_size, zero_optimization.offload_param.device",
     "zero_hpz_partition_size > 1 with offload_param is not built (the secondary copy's tier is not planned)", false,
     false},
    {"qgz_stage", "zero_optimization.zero_quantized_gradients, zero_optimization.stage",
     "zero_quantized_gradients quantizes the gradient reduce-scatter: it needs stage 1, 2 or 3 (stage 0 all-reduces "
     "full gradients)",
     false, false},
    {"qgz_bits", "zero_optimization.zero_quantized_gradients_bits", "zero_quantized_gradients_bits must be 8 or 4",
     false, false},
    {"qwz_stage", "zero_optimization.zero_quantized_weights, zero_optimization.stage",
     "zero_quantized_weights quantizes stage 3's parameter gathers: it needs stage 3 (stages 0-2 gather nothing)",
     false, false},
    {"offload_param_stage", "zero_optimization.offload_param.device, zero_optimization.stage",
     "zero_optimization.offload_param.device other than \"none\" requires zero_optimization.stage 3 (only stage 3 "
     "partitions parameters)",
     false, false},
    {"nvme_path", "zero_optimization.offload_optimizer.device, zero_optimization.offload_optimizer.nvme_path",
     "zero_optimization.offload_optimizer.device \"nvme\" needs nvme_path, an existing folder for the files", false,
     false},
    {"param_nvme_path", "zero_optimization.offload_param.device, zero_optimization.offload_param.nvme_path",
     "zero_optimization.offload_param.device \"nvme\" needs nvme_path, an existing folder for the files", false, false},
    {"offload_optimizer_stage", "zero_optimization.offload_optimizer.device, zero_optimization.stage",
     "zero_optimization.offload_optimizer.device other than \"none\" requires zero_optimization.stage 1, 2 or 3 "
     "(DeepSpeed: valid for ZeRO stage 1, 2, and 3)",
     false, false},
    {"ratio_stage", "zero_optimization.offload_optimizer.ratio, zero_optimization.stage",
     "zero_optimization.offload_optimizer.ratio below 1 requires zero_optimization.stage 3 (DeepSpeed: Partial "
     "offloading only supported for ZeRO Stage 3)",
     false, false},
    {"type_required", "optimizer.type, scheduler.type",
     "optimizer.type and scheduler.type are required when their section is present", false, false},
    {"params_belong", "optimizer.params.*, scheduler.params.*",
     "each key of optimizer.params and scheduler.params must be a parameter of the chosen type (DeepSpeed passes "
     "them to the type's constructor, which rejects others)",
     false, false},
    {"adam_w_mode", "optimizer.type, optimizer.params.adam_w_mode",
     "optimizer.params.adam_w_mode false requires optimizer.type Adam (AdamW always decouples weight decay; "
     "DeepSpeed would silently keep AdamW)",
     false, false},
    {"nesterov", "optimizer.params.nesterov, momentum, dampening",
     "optimizer.params.nesterov true requires momentum > 0 and dampening 0 (torch.optim.SGD's rule)", false, false},
    {"total_num_steps", "scheduler.type, scheduler.params.total_num_steps",
     "scheduler.params.total_num_steps is required by WarmupDecayLR and WarmupCosineLR", false, false},
    {"alias_twice", "a key and its aliases",
     "a key may be given once, under its name or one alias (DeepSpeed: Cannot provide deprecated parameter and "
     "replacing parameter together)",
     false, false},
    {"batch_divisible", "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps",
     "with all three batch keys given, train_batch_size must be a multiple of train_micro_batch_size_per_gpu x "
     "gradient_accumulation_steps (the quotient is the world size)",
     false, false},
    {"batch_multiply", "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps, world size",
     "train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size, each >= 1", true,
     false},
    {"batch_derive", "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps, world size",
     "a missing batch key is derived as DeepSpeed derives it: train and micro given -> accumulation = train / micro "
     "/ world; train and accumulation -> micro = train / world / accumulation; micro and accumulation -> train = "
     "micro x accumulation x world; train alone -> accumulation 1, micro = train / world; micro alone -> "
     "accumulation 1, train = micro x world; neither train nor micro -> error",
     true, false},
    {"no_auto", "every key that accepts \"auto\"",
     "no key may still be \"auto\" when the engine starts: fill each with Config::Resolve", true, false},
    {"warmup_longer", "scheduler.params.total_num_steps, warmup_num_steps",
     "total_num_steps below warmup_num_steps (a warning, as in DeepSpeed)", false, true},
    {"stochastic_rounding", "bf16.stochastic_rounding, bf16.enabled",
     "bf16.stochastic_rounding true without bf16.enabled has no effect (a warning)", false, true},
    {"loco_dtype", "zero_optimization.zero_quantized_gradients_error_feedback_dtype, ..._error_feedback",
     "zero_quantized_gradients_error_feedback_dtype \"int8\" with zero_quantized_gradients or its error feedback off "
     "has no effect (a warning)",
     false, true},
};

std::string FormatBound(double v) {
  char buf[64];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%g", v);
  }
  return buf;
}

std::vector<std::string> SplitCommas(const char* list) {
  std::vector<std::string> out;
  if (list == nullptr) return out;
  std::string cur;
  for (const char* p = list; *p != '\0'; ++p) {
    if (*p == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(*p);
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// `text` (built by appending: GCC 12 warns falsely on "literal" + std::string, -Wrestrict).
std::string Code(const std::string& text) {
  std::string s(1, '`');
  s += text;
  s += '`';
  return s;
}

std::string Backticked(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) s += ", ";
    s += Code(items[i]);
  }
  return s;
}

std::string Parent(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

std::string Leaf(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string TypeText(const KeySpec& k) {
  switch (k.type) {
    case KeyType::kSection: return "object";
    case KeyType::kBool: return "bool";
    case KeyType::kInt: return "int";
    case KeyType::kNumber: return "number";
    case KeyType::kString: return "string";
    case KeyType::kEnum: return "string";
    case KeyType::kNumberPair: return "[number, number]";
    case KeyType::kAny: return "any";
  }
  return "?";
}

}  // namespace

std::span<const KeySpec> Schema() { return kSchema; }
std::span<const AliasSpec> Aliases() { return kAliases; }
std::span<const CrossRule> CrossRules() { return kCrossRules; }

const KeySpec* FindKey(std::string_view path) {
  for (const KeySpec& k : kSchema) {
    if (path == k.path) return &k;
  }
  return nullptr;
}

const AliasSpec* FindAlias(std::string_view path) {
  for (const AliasSpec& a : kAliases) {
    if (path == a.path) return &a;
  }
  return nullptr;
}

const CrossRule& FindRule(std::string_view id) {
  for (const CrossRule& r : kCrossRules) {
    if (id == r.id) return r;
  }
  ZERO_CHECK(false) << "unknown cross rule " << std::string(id);
  return kCrossRules[0];  // unreachable
}

std::string RuleText(const KeySpec& k) {
  std::string s;
  switch (k.type) {
    case KeyType::kSection: s = "an object"; break;
    case KeyType::kBool: s = "true or false"; break;
    case KeyType::kInt: s = "an integer"; break;
    case KeyType::kNumber: s = "a number"; break;
    case KeyType::kString: s = "a string"; break;
    case KeyType::kEnum:
      s = "one of " + Backticked(SplitCommas(k.choices));
      if (k.has(kCaseInsensitive)) s += " (any case)";
      break;
    case KeyType::kNumberPair: s = "[x, y] with each x, y"; break;
    case KeyType::kAny: s = "any JSON value"; break;
  }
  const bool has_min = !std::isnan(k.min), has_max = !std::isnan(k.max);
  if (has_min && has_max) {
    s += std::string(" in ") + (k.has(kMinExclusive) ? "(" : "[") + FormatBound(k.min) + ", " + FormatBound(k.max) +
         (k.has(kMaxExclusive) ? ")" : "]");
  } else if (has_min) {
    s += std::string(k.has(kMinExclusive) ? " > " : " >= ") + FormatBound(k.min);
  } else if (has_max) {
    s += std::string(k.has(kMaxExclusive) ? " < " : " <= ") + FormatBound(k.max);
  }
  if (k.has(kPowerOfTwo)) s += ", a power of 2";
  if (k.has(kEven)) s += ", a multiple of 2";
  if (k.nullable() && k.type != KeyType::kAny) s += ", or null";
  if (k.note != nullptr && (k.support == Support::kYes || k.support == Support::kOffOnly)) {
    s += "; " + std::string(k.note);
  }
  return s;
}

std::string DefaultText(const KeySpec& k) {
  if (k.default_doc != nullptr) return k.default_doc;
  std::string s = Code(k.default_json);
  if (k.type == KeyType::kInt) {
    // Big round defaults also in DeepSpeed's notation (5e8), which is how configs usually write them.
    int64_t m = std::strtoll(k.default_json, nullptr, 10);
    int e = 0;
    if (m >= 100000) {
      while (m % 10 == 0) {
        m /= 10;
        ++e;
      }
      if (m < 10 && e >= 5) s += " (" + std::to_string(m) + "e" + std::to_string(e) + ")";
    }
  }
  return s;
}

std::string SupportText(const KeySpec& k) {
  switch (k.support) {
    case Support::kYes: {
      std::string s = k.has(kOurs) ? "yes (zero's own key)" : "yes";
      if (k.unimplemented != nullptr) s += "; not implemented: " + Backticked(SplitCommas(k.unimplemented));
      return s;
    }
    case Support::kOffOnly:
      if (!std::isnan(k.off_max)) return "not implemented: only values <= " + FormatBound(k.off_max) + " accepted";
      return "not implemented: only `" + std::string(k.default_json) + "` accepted";
    case Support::kNoEffect: return "accepted, no effect: " + std::string(k.note != nullptr ? k.note : "");
    case Support::kIgnored: return "ignored, with a warning";
    case Support::kRejected: return "rejected: " + std::string(k.note != nullptr ? k.note : "");
  }
  return "?";
}

const char* DefaultConfigJson() {
  return R"({
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 1,
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": 0.0}
  },
  "zero_optimization": {"stage": 0}
}
)";
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace zero::internal

namespace zero {

std::string ConfigReferenceMarkdown() {
  using namespace internal;
  std::ostringstream md;
  md << "# zero configuration reference\n\n"
     << "<!-- Generated from the schema table in src/core/config_schema.cc by `build/bin/zero-config --reference "
        "> docs/guide/config.md`. Do not edit by hand: a test fails when this file and the table differ. -->\n\n"
     << "## Config\n\n"
     << "zero reads the DeepSpeed JSON config that DeepSpeed and Hugging Face users already have "
        "(`zero::Config::FromJsonFile`, or `build/bin/zero-config FILE [--world N]` to check one and print the "
        "effective config). Defaults are DeepSpeed's, taken from its source rather than its docs. Numbers may be "
        "written as integers, decimals or in scientific notation (`5e8`); an integer key takes `5e8` but not "
        "`3.5`. `\"auto\"` is accepted exactly where Hugging Face Transformers or Accelerate fill it in (column "
        "auto below); the trainer fills each one with `Config::Resolve(path, value)`, and `Config::Validate` "
        "fails naming every key still `\"auto\"`. An unknown key is an error giving its full JSON path and the "
        "closest known key; a top-level key placed inside a section says that it is a top-level key. A key "
        "DeepSpeed knows but zero does not implement is accepted only at its off or default value and is "
        "otherwise an error `<path>: not implemented in zero` with the value (status `kUnimplemented` when every "
        "problem of the config is of this kind, `kInvalidArgument` as for any other error otherwise); keys that "
        "change nothing in zero are accepted with a warning when set to anything but their default, and "
        "top-level sections of other DeepSpeed subsystems (tensorboard, wandb, flops_profiler, ...) are accepted "
        "with a one-line warning that zero ignores them. Deprecated DeepSpeed spellings map to the current key "
        "with a warning; giving a key twice, under two spellings or as a duplicate JSON key, is an error. "
        "Malformed JSON is reported with its line and column; `//` and `/* */` comments are allowed, as "
        "DeepSpeed's hjson reader allows them. Nothing is silently ignored: every warning is logged and kept in "
        "`Config::warnings()`.\n\n"
     << "Every number must also be what the code can represent: integers fit int64 (int for the few int "
        "fields), and any other number is 0 or has a magnitude in [1.17549e-38, 3.40282e+38], what fp32 holds as "
        "a normal number (the kernels compute in fp32: an `eps` of 1e-300 would be 0 there); durations have their "
        "own range (`comm_timeout_s`). A value outside is an error that gives the range.\n\n"
     << "The same rules hold for values set in code: `Config::Set(path, json_value)` sets any key with the "
        "key's rule, the cross-key rules and the JSON's messages (`zero-config FILE --set key=value`, repeatable; "
        "`zero-estimate --set` too), and `Config::Validate`, which `Engine::Create` and "
        "`ShardedOptimizer::Create` run, checks every field against its row again, so `cfg.zero.stage = 7` "
        "assigned in code fails there as `\"stage\": 7` fails in the file.\n\n"
     << "Columns: **type** of the JSON value; **default** when the key is absent; **rule** the value must "
        "satisfy; **auto** whether `\"auto\"` is accepted; **zero** whether zero implements it.\n\n";

  // Group leaf rows under their parent section, in table order.
  std::vector<std::string> sections = {""};
  for (const KeySpec& k : Schema()) {
    if (k.type == KeyType::kSection) sections.push_back(k.path);
  }
  auto aliases_of = [](const std::string& path) {
    std::vector<std::string> out;
    for (const AliasSpec& a : Aliases()) {
      if (path == a.target && a.kind != AliasKind::kDeprecatedBoolStage) out.push_back(Leaf(a.path));
    }
    return out;
  };
  md << "## Keys\n\n";
  for (const std::string& section : sections) {
    if (section.empty()) {
      md << "### Top level\n\n";
    } else {
      const KeySpec* s = FindKey(section);
      md << "### `" << section << "`\n\n" << s->doc;
      if (section.find('.') == std::string::npos && std::string(s->default_json) == "null") {
        md << " Optional; absent by default.";
      } else if (std::string(s->default_json) == "null") {
        md << " Optional; absent means device `none`.";
      }
      if (s->support == Support::kNoEffect && s->note != nullptr) md << " (" << s->note << ".)";
      std::vector<std::string> al = aliases_of(section);
      if (!al.empty()) md << " Also accepted as " << Backticked(al) << ".";
      md << "\n\n";
    }
    md << "| key | type | default | rule | auto | zero | description |\n"
       << "|---|---|---|---|---|---|---|\n";
    for (const KeySpec& k : Schema()) {
      if (k.type == KeyType::kSection || k.support == Support::kIgnored) continue;
      if (Parent(k.path) != section) continue;
      std::string key = Code(Leaf(k.path));
      std::vector<std::string> al = aliases_of(k.path);
      if (!al.empty()) key += " (alias " + Backticked(al) + ")";
      std::string desc = k.doc;
      if (k.applies != 0) {
        std::vector<std::string> types;
        if (k.applies & kForAdam) types.push_back("Adam");
        if (k.applies & kForAdamW) types.push_back("AdamW");
        if (k.applies & kForSgd) types.push_back("SGD");
        if (k.applies & kForWarmupLR) types.push_back("WarmupLR");
        if (k.applies & kForWarmupDecayLR) types.push_back("WarmupDecayLR");
        if (k.applies & kForWarmupCosineLR) types.push_back("WarmupCosineLR");
        desc += " Types: " + Backticked(types) + ".";
      }
      md << "| " << key << " | " << TypeText(k) << " | " << DefaultText(k) << " | " << RuleText(k) << " | "
         << (k.has(kAutoOk) ? "yes" : "") << " | " << SupportText(k) << " | " << desc << " |\n";
    }
    md << "\n";
  }

  md << "## Aliases\n\n| spelling | maps to | note |\n|---|---|---|\n";
  for (const AliasSpec& a : Aliases()) {
    md << "| `" << a.path << "` | `" << a.target << "` | " << a.note << " |\n";
  }
  md << "\n## DeepSpeed settings zero ignores\n\n"
     << "Accepted with a one-line warning `<key>: ... zero ignores it`; their contents are not checked.\n\n"
     << "| key | what it is in DeepSpeed |\n|---|---|\n";
  for (const KeySpec& k : Schema()) {
    if (k.support == Support::kIgnored) md << "| `" << k.path << "` | " << k.doc << " |\n";
  }
  md << "\n## Cross-key rules\n\n"
     << "Checked when the config is parsed and after every `Config::Resolve` (skipping rules whose keys are still "
        "`\"auto\"`), and again by `Config::Validate(world_size)`; rules that need the world size are checked "
        "only there.\n\n";
  for (const CrossRule& r : CrossRules()) {
    md << "- **" << r.id << "** (" << r.keys << "): " << r.text << "."
       << (r.at_validate ? " Checked by `Validate`." : "") << "\n";
  }
  md << "\n## `Config::Default()`\n\n"
     << "The built-in config the demos use (`zero-config --default` prints it with every default filled in):\n\n"
     << "```json\n"
     << DefaultConfigJson() << "```\n";
  return md.str();
}

}  // namespace zero
