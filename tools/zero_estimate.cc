// zero-estimate: the bytes each rank will hold, by tag and tier, and what it sends per step, before a run
// (zero::Estimate, zero/estimate.h), with the model names and flags of zero-gpt so an estimate and a run can be set
// side by side:
//
//   zero-estimate --model small --world 4 --stage 3 --bf16 --recompute
//   zero-gpt      --model small --world 4 --stage 3 --bf16 --recompute --json    # the measured report
//   zero-estimate --layers 80 --hidden 8192 --heads 64 --vocab 32000 --seq 4096 --micro-batch 1
//                 --world 1024 --stage 3 --bf16 --recompute --device cuda --fit-gib 80 --json
//   zero-estimate --units units.json --config ds.json --world 64
//   zero-estimate --model small --config hf_ds.json --set train_micro_batch_size_per_gpu=8 --world 8
//
// --set KEY=VALUE (repeatable) sets a config key through Config::Set, validated as in the JSON. A Hugging Face
// config's "auto" is left alone where it changes no byte (learning rates, betas, eps, weight decay, clipping,
// scheduler params: estimated at a valid placeholder, said on stderr), derived where the rest determines it (the
// batch keys, the other precision when one is on, the bucket sizes as Hugging Face fills them from the hidden
// size of a GPT shape), and otherwise an error that names the key and asks for --set.
//
// A GPT shape is the reference GPT of examples/gpt (its units, and its activations as it allocates them:
// examples/gpt/estimate.h). A units file is a JSON list of {"name", "params", "shapes"?, "frozen"?, "scopes"?}
// (or an object {"units": [...], "activation_bytes": N, "open_params": N}); its activations are what it says, none
// otherwise.
// --json prints one object: {"memory": {TAG: {"tier", "bytes"}, "peak_total": {..}}, ...} with zero-gpt's tag names.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpt/estimate.h"
#include "gpt/model.h"
#include "nlohmann/json.hpp"
#include "zero/config.h"
#include "zero/estimate.h"

namespace {

constexpr const char* kUsage =
    "usage: zero-estimate (--model tiny|small | --layers L --hidden H --heads A --vocab V --seq T\n"
    "                      --micro-batch B | --units FILE) [--config FILE] [--stage S] [--world N]\n"
    "                     [--shard-group G] [--recompute] [--bf16] [--fit-gib X] [--device cpu|cuda] [--json]\n"
    "                     [--ranks-per-host L] [--rank R]\n"
    "  --shard-group G  hybrid sharding: shard within groups of G ranks (mics_shard_size), replicate across them\n"
    "  --ranks-per-host L  ranks per host, laid out host by host (LOCAL_WORLD_SIZE; default 1): the bytes rank R\n"
    "                   (--rank, default 0) sends per step inside its host and across hosts\n"
    "  --model       the reference GPT's presets (as zero-gpt); --seq / --micro-batch override theirs\n"
    "  --units FILE  a JSON list of units {\"name\", \"params\", \"shapes\"?, \"frozen\"?, \"scopes\"?}\n"
    "                in registration order (shapes: the parameters', [[C], [C, 3C], ...], for ZeRO++)\n"
    "  --config      a DeepSpeed JSON config (default: zero-gpt's embedded one); --stage, --bf16 override it\n"
    "  --set K=V     set config key K to V (JSON; a bare word is a string), validated; repeatable\n"
    "  --recompute   recompute every block (the config's activation_checkpointing decides how), as zero-gpt\n"
    "  --device cuda the CUDA engine over NCCL (its staging is not tracked); default cpu: the host engine, Gloo\n"
    "  --fit-gib X   also the most blocks a GPT of this shape may have for a rank's device tier to fit X GiB\n"
    "                (X in (0, 2^32]; the search stops at 65536 blocks and says so)\n"
    "Ranges: --layers 1-65536, --hidden and --heads 1-2^20, --vocab 1-2^24, --seq, --micro-batch, --world and\n"
    "--shard-group 1-2^20; a shape whose bytes would pass 2^62 is refused (exit 1) rather than wrapped.\n";

int Usage(const std::string& why) {
  if (!why.empty()) std::fprintf(stderr, "zero-estimate: %s\n", why.c_str());
  std::fputs(kUsage, stderr);
  return 2;
}

struct Flags {
  std::string model, units_file, config_path, device = "cpu";
  int layers = 0, hidden = 0, heads = 0, vocab = 0, seq = 0, micro_batch = 0, stage = -1, world = 1, shard_group = 0,
      ranks_per_host = 0, rank = 0;
  bool recompute = false, bf16 = false, json = false;
  double fit_gib = 0;
  std::vector<std::pair<std::string, std::string>> sets;  // --set KEY=VALUE, in order
};

// Keys Hugging Face leaves "auto" that change no byte of the estimate, with the placeholder estimated at.
constexpr std::pair<const char*, const char*> kNoByteAuto[] = {
    {"gradient_clipping", "0"},
    {"optimizer.params.lr", "0.001"},
    {"optimizer.params.betas", "[0.9, 0.999]"},
    {"optimizer.params.eps", "1e-8"},
    {"optimizer.params.weight_decay", "0"},
    {"scheduler.params.warmup_min_lr", "0"},
    {"scheduler.params.warmup_max_lr", "0.001"},
    {"scheduler.params.warmup_num_steps", "1000"},
    {"scheduler.params.total_num_steps", "1000"},
};

// Fills the config's remaining "auto" keys for an estimate (see the file comment); `hidden` is the model's
// hidden size, 0 when unknown. Errors name every key still "auto" whose value changes bytes.
zero::Status ResolveAutoForEstimate(zero::Config* cfg, int64_t hidden) {
  auto is_auto = [&](const std::string& key) {
    const auto& u = cfg->unresolved();
    return std::find(u.begin(), u.end(), key) != u.end();
  };
  auto fill = [&](const std::string& key, const std::string& value, const std::string& why) -> zero::Status {
    zero::Status s = cfg->Set(key, value);
    if (s.ok() && !why.empty()) std::fprintf(stderr, "zero-estimate: %s: \"auto\" %s\n", key.c_str(), why.c_str());
    return s;
  };
  const std::vector<std::string> autos = cfg->unresolved();
  std::string missing;
  for (const std::string& key : autos) {
    if (!is_auto(key)) continue;  // filled on the way
    zero::Status s;
    bool filled = true;
    const auto* no_byte =
        std::find_if(std::begin(kNoByteAuto), std::end(kNoByteAuto), [&](const auto& kv) { return key == kv.first; });
    if (no_byte != std::end(kNoByteAuto)) {
      s = fill(key, no_byte->second, absl::StrCat("changes no byte; estimated at ", no_byte->second));
    } else if (key == "fp16.enabled" && !is_auto("bf16.enabled") && cfg->bf16.enabled) {
      s = fill(key, "false", "is false: bf16 is on");
    } else if (key == "bf16.enabled" && !is_auto("fp16.enabled") && cfg->fp16.enabled) {
      s = fill(key, "false", "is false: fp16 is on");
    } else if (key == "train_batch_size" && !is_auto("train_micro_batch_size_per_gpu")) {
      s = fill(key, "null", "is derived from the micro batch and the accumulation steps");
    } else if (key == "gradient_accumulation_steps" && cfg->train_batch_size.has_value() &&
               !is_auto("train_batch_size") && !is_auto("train_micro_batch_size_per_gpu")) {
      s = fill(key, "null", "is derived from train_batch_size");
    } else if (hidden > 0 && key == "zero_optimization.reduce_bucket_size") {
      s = fill(key, std::to_string(hidden * hidden), "is hidden_size^2, as Hugging Face fills it");
    } else if (hidden > 0 && key == "zero_optimization.stage3_prefetch_bucket_size") {
      s = fill(key, std::to_string(hidden * hidden * 9 / 10), "is 0.9 hidden_size^2, as Hugging Face fills it");
    } else if (hidden > 0 && key == "zero_optimization.stage3_param_persistence_threshold") {
      s = fill(key, std::to_string(hidden * 10), "is 10 hidden_size, as Hugging Face fills it");
    } else {
      filled = false;
    }
    if (!s.ok()) return s;
    if (!filled) {
      absl::StrAppend(&missing, missing.empty() ? "" : "\n", key,
                      ": \"auto\" changes the estimate; give its value with --set ", key, "=VALUE");
    }
  }
  if (!missing.empty()) return absl::InvalidArgumentError(missing);
  return absl::OkStatus();
}

// A units file: the units, and optionally the trainer's activation bytes and the elements it keeps open at once.
struct UnitsFile {
  std::vector<zero::EstimateUnit> units;
  int64_t activation_bytes = 0;
  int64_t open_params = 0;
};

zero::StatusOr<UnitsFile> ReadUnits(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--units ", path, ": cannot read"));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--units ", path, ": not JSON: ", e.what()));
  }
  UnitsFile f;
  const nlohmann::json* list = &j;
  if (j.is_object()) {
    if (!j.contains("units")) return absl::InvalidArgumentError(absl::StrCat("--units ", path, ": no \"units\" list"));
    list = &j["units"];
    auto get = [&](const char* key, int64_t* out) -> zero::Status {
      if (!j.contains(key)) return absl::OkStatus();
      if (!j[key].is_number_integer() || j[key].get<int64_t>() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("--units ", path, ": \"", key, "\" must be an integer >= 0"));
      }
      *out = j[key].get<int64_t>();
      return absl::OkStatus();
    };
    ZERO_RETURN_IF_ERROR(get("activation_bytes", &f.activation_bytes));
    ZERO_RETURN_IF_ERROR(get("open_params", &f.open_params));
  }
  if (!list->is_array() || list->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--units ", path, ": the units must be a non-empty JSON list"));
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& u = (*list)[i];
    const std::string where = absl::StrCat("--units ", path, ": unit ", i);
    if (!u.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " is not an object"));
    zero::EstimateUnit e;
    e.name = u.contains("name") && u["name"].is_string() ? u["name"].get<std::string>() : absl::StrCat("unit", i);
    const char* count_key = u.contains("params") ? "params" : "numel";
    if (!u.contains(count_key) || !u[count_key].is_number() || u[count_key].get<double>() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " (\"", e.name, "\"): \"params\" must be a positive number of parameters"));
    }
    // Bounded before the conversion (llround of 1e30 is undefined), and so that the units' sum stays far from
    // int64's end.
    constexpr double kMaxUnitParams = 1125899906842624.0;  // 2^50
    if (u[count_key].get<double>() > kMaxUnitParams) {
      return absl::InvalidArgumentError(absl::StrFormat("%s (\"%s\"): \"params\" %g is out of range [1, 2^50]", where,
                                                        e.name, u[count_key].get<double>()));
    }
    e.numel = static_cast<int64_t>(std::llround(u[count_key].get<double>()));
    if (u.contains("frozen")) {
      if (!u["frozen"].is_boolean()) {
        return absl::InvalidArgumentError(absl::StrCat(where, " (\"", e.name, "\"): \"frozen\" must be true or false"));
      }
      e.frozen = u["frozen"].get<bool>();
    }
    if (u.contains("shapes")) {  // the parameters' shapes, in order: ZeRO++ sends the 1-D ones exact
      const nlohmann::json& shapes = u["shapes"];
      bool ok = shapes.is_array() && !shapes.empty();
      for (size_t k = 0; ok && k < shapes.size(); ++k) {
        zero::ParamSpec spec{absl::StrCat("p", k), {}};
        ok = shapes[k].is_array();
        for (size_t d = 0; ok && d < shapes[k].size(); ++d) {
          ok = shapes[k][d].is_number_integer() && shapes[k][d].get<int64_t>() >= 1 &&
               shapes[k][d].get<int64_t>() <= (int64_t{1} << 50);
          if (ok) spec.shape.push_back(shapes[k][d].get<int64_t>());
        }
        e.params.push_back(std::move(spec));
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " (\"", e.name, "\"): \"shapes\" must be a non-empty list of shapes, each a list of integers >= 1"));
      }
    }
    if (u.contains("scopes")) {
      if (!u["scopes"].is_number_integer() || u["scopes"].get<int>() < 1) {
        return absl::InvalidArgumentError(absl::StrCat(where, " (\"", e.name, "\"): \"scopes\" must be 1 or more"));
      }
      e.scopes_per_pass = u["scopes"].get<int>();
    }
    f.units.push_back(std::move(e));
  }
  // At most 32 bytes a parameter in any tier: the sum stays below 2^62 bytes, where the estimate's int64 sums
  // could overflow.
  double total = 0;
  for (const zero::EstimateUnit& e : f.units) total += static_cast<double>(e.numel);
  if (total > 144115188075855872.0 || f.activation_bytes > (int64_t{1} << 62) || f.open_params > (int64_t{1} << 56)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--units %s: %g parameters in all (or activation_bytes, open_params) past what 64-bit byte counts hold: "
        "at most 2^56 parameters, 2^62 activation bytes",
        path, total));
  }
  return f;
}

std::string Mib(int64_t bytes) { return absl::StrFormat("%.2f", static_cast<double>(bytes) / (1 << 20)); }

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return absl::StrFormat("%.2f %s", bytes, units[u]);
}

std::string TermsJson(const zero::PeakBound& t) {
  return absl::StrCat("{\"model_state\": ", t.model_state, ", \"gathers\": ", t.gathers,
                      ", \"reductions\": ", t.reductions, ", \"staging\": ", t.staging, ", \"trainer\": ", t.trainer,
                      "}");
}

const char* OffloadName(const zero::Config& cfg) {
  const bool opt = cfg.zero.offload_optimizer.device != zero::OffloadDevice::kNone && cfg.zero.stage >= 1;
  const bool nvme = opt && cfg.zero.offload_optimizer.device == zero::OffloadDevice::kNvme;
  const bool par = cfg.zero.offload_param.device != zero::OffloadDevice::kNone && cfg.zero.stage == 3;
  const bool par_nvme = par && cfg.zero.offload_param.device == zero::OffloadDevice::kNvme;
  if (par_nvme) {
    return nvme ? "optimizer (nvme)+parameters (nvme)" : opt ? "optimizer+parameters (nvme)" : "parameters (nvme)";
  }
  if (nvme) return par ? "optimizer (nvme)+parameters" : "optimizer (nvme)";
  return opt && par ? "optimizer+parameters" : opt ? "optimizer" : par ? "parameters" : "none";
}

const char* DtypeName(const zero::Config& cfg) {
  return cfg.fp16.enabled ? "fp16" : cfg.bf16.enabled ? "bf16" : "fp32";
}

// Upper bounds of the numeric flags (the lower ones, >= 1, are checked as they are read): what the estimate's
// int arithmetic and its one unit per block can take. Empty when all are in range, else what is wrong, with the
// range.
std::string OutOfRange(const Flags& f) {
  struct Bound {
    const char* flag;
    int64_t value, hi;
  };
  const Bound bounds[] = {{"--layers", f.layers, zero::gpt::kMaxFitLayers},
                          {"--hidden", f.hidden, int64_t{1} << 20},
                          {"--heads", f.heads, int64_t{1} << 20},
                          {"--vocab", f.vocab, int64_t{1} << 24},
                          {"--seq", f.seq, int64_t{1} << 20},
                          {"--micro-batch", f.micro_batch, int64_t{1} << 20},
                          {"--world", f.world, int64_t{1} << 20},
                          {"--shard-group", f.shard_group, int64_t{1} << 20},
                          {"--ranks-per-host", f.ranks_per_host, int64_t{1} << 20},
                          {"--rank", f.rank, int64_t{1} << 20}};
  for (const Bound& b : bounds) {
    if (b.value > b.hi) return absl::StrCat(b.flag, " ", b.value, ": out of range [1, ", b.hi, "]");
  }
  // In bytes the budget must stay an int64: 2^32 GiB is 2^62 bytes (9e9 GiB wrapped and fit nothing).
  constexpr double kMaxFitGib = 4294967296.0;
  if (f.fit_gib > kMaxFitGib) {
    return absl::StrFormat("--fit-gib %g: out of range (0, %.0f] GiB (2^62 bytes)", f.fit_gib, kMaxFitGib);
  }
  return "";
}

// A last guard: no byte count of the estimate is negative (a sum that wrapped despite the bounds above).
bool AllNonNegative(const zero::RankEstimate& e) {
  for (const auto& tier : e.memory.usage) {
    for (const auto& u : tier) {
      if (u.peak < 0) return false;
    }
  }
  for (const zero::CollectiveEstimate& c : e.comm) {
    if (c.bytes_sent < 0 || c.elements < 0) return false;
  }
  return e.params >= 0 && e.padded >= 0 && e.BytesSentPerStep() >= 0 && e.planned.ModelStateBytes() >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--recompute") {
      f.recompute = true;
      continue;
    }
    if (a == "--bf16") {
      f.bf16 = true;
      continue;
    }
    if (a == "--json") {
      f.json = true;
      continue;
    }
    // The value is read once the flag is known, so an unknown last flag is named as unknown.
    const bool has_value = i + 1 < argc;
    const std::string v = has_value ? argv[i + 1] : "";
    auto integer = [&](int* out, int min) { return absl::SimpleAtoi(v, out) && *out >= min; };
    bool ok = true;
    if (a == "--set") {
      const size_t eq = v.find('=');
      ok = eq != std::string::npos && eq > 0;
      if (ok) f.sets.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (a == "--model") {
      f.model = v;
    } else if (a == "--units") {
      f.units_file = v;
    } else if (a == "--config") {
      f.config_path = v;
    } else if (a == "--device") {
      f.device = v;
      ok = v == "cpu" || v == "cuda";
    } else if (a == "--layers") {
      ok = integer(&f.layers, 1);
    } else if (a == "--hidden") {
      ok = integer(&f.hidden, 1);
    } else if (a == "--heads") {
      ok = integer(&f.heads, 1);
    } else if (a == "--vocab") {
      ok = integer(&f.vocab, 1);
    } else if (a == "--seq") {
      ok = integer(&f.seq, 1);
    } else if (a == "--micro-batch") {
      ok = integer(&f.micro_batch, 1);
    } else if (a == "--stage") {
      ok = integer(&f.stage, 0) && f.stage <= 3;
    } else if (a == "--world") {
      ok = integer(&f.world, 1);
    } else if (a == "--shard-group") {
      ok = integer(&f.shard_group, 1);
    } else if (a == "--ranks-per-host") {
      ok = integer(&f.ranks_per_host, 1);
    } else if (a == "--rank") {
      ok = integer(&f.rank, 0);
    } else if (a == "--fit-gib") {
      ok = absl::SimpleAtod(v, &f.fit_gib) && f.fit_gib > 0;
    } else {
      return Usage("unknown flag " + a);
    }
    if (!has_value) return Usage(a + " needs a value");
    ++i;
    if (!ok) return Usage(absl::StrCat(a, ": bad value \"", v, "\""));
  }
  if (const std::string why = OutOfRange(f); !why.empty()) return Usage(why);
  const bool shape = f.layers || f.hidden || f.heads || f.vocab;
  if (!f.model.empty() + shape + !f.units_file.empty() != 1) {
    return Usage("give exactly one model: --model, a GPT shape (--layers --hidden --heads --vocab --seq), or --units");
  }
  if (shape && !(f.layers && f.hidden && f.heads && f.vocab && f.seq)) {
    return Usage("a GPT shape needs --layers, --hidden, --heads, --vocab and --seq");
  }
  if (!f.units_file.empty() && f.fit_gib > 0) return Usage("--fit-gib needs a GPT shape (it varies the block count)");

  zero::Config cfg = zero::Config::Default();
  if (!f.config_path.empty()) {
    auto c = zero::Config::FromJsonFile(f.config_path);
    if (!c.ok()) {
      std::fprintf(stderr, "zero-estimate: %s\n", zero::ErrorText(c.status()).c_str());
      return 1;
    }
    cfg = *c;
  }
  // --set first, then the flags that override the config, all through one Config::Set: validated like the JSON,
  // once on the result, so a --set key that needs a flag's value (zero_hpz_partition_size needs --stage 3) is
  // accepted whatever the order on the command line.
  std::vector<std::pair<std::string, std::string>> sets;
  for (const auto& [key, value] : f.sets) sets.emplace_back(key, zero::SetValueJson(value));
  if (f.stage >= 0) sets.emplace_back("zero_optimization.stage", std::to_string(f.stage));
  if (f.bf16) sets.emplace_back("bf16.enabled", "true");
  if (f.shard_group > 0) sets.emplace_back("zero_optimization.mics_shard_size", std::to_string(f.shard_group));
  if (f.micro_batch > 0) {
    sets.emplace_back("train_micro_batch_size_per_gpu", std::to_string(f.micro_batch));
    sets.emplace_back("train_batch_size", "null");  // derived at the world size
  }
  if (zero::Status s = cfg.Set(sets); !s.ok()) {
    std::fprintf(stderr, "zero-estimate: %s\n", zero::ErrorText(s).c_str());
    return 1;
  }
  const zero::Backend backend = f.device == "cuda" ? zero::Backend::kNccl : zero::Backend::kGloo;

  zero::gpt::GptConfig mc;
  zero::StatusOr<zero::RankEstimate> est = absl::UnknownError("not run");
  std::string model_json, model_line;
  int fit_layers = -1;
  if (!f.units_file.empty()) {
    auto units = ReadUnits(f.units_file);
    if (!units.ok()) {
      std::fprintf(stderr, "zero-estimate: %s\n", zero::ErrorText(units.status()).c_str());
      return 1;
    }
    if (zero::Status s = ResolveAutoForEstimate(&cfg, 0); !s.ok()) {
      std::fprintf(stderr, "zero-estimate: %s\n", zero::ErrorText(s).c_str());
      return 1;
    }
    zero::EstimateOptions o;
    o.world = f.world;
    o.rank = f.rank;
    o.ranks_per_host = f.ranks_per_host;
    o.backend = backend;
    o.open_elements = units->open_params;
    if (units->activation_bytes > 0)
      o.trainer.push_back({zero::MemTag::kActivations, zero::MemTier::kDevice, units->activation_bytes});
    est = zero::Estimate(cfg, units->units, o);
    model_json = absl::StrCat("{\"units_file\": \"", f.units_file, "\", \"units\": ", units->units.size(), "}");
    model_line = absl::StrCat(units->units.size(), " units from ", f.units_file);
  } else {
    if (!f.model.empty()) {
      auto m = zero::gpt::GptConfig::FromName(f.model);
      if (!m.ok()) return Usage(std::string(m.status().message()));
      mc = *m;
    } else {
      mc = zero::gpt::GptConfig{
          .vocab = f.vocab, .max_seq = f.seq, .layers = f.layers, .heads = f.heads, .channels = f.hidden};
    }
    if (zero::Status s = ResolveAutoForEstimate(&cfg, mc.channels); !s.ok()) {
      std::fprintf(stderr, "zero-estimate: %s\n", zero::ErrorText(s).c_str());
      return 1;
    }
    zero::StatusOr<zero::EstimateOptions> o =
        zero::gpt::GptEstimateOptions(cfg, mc, f.seq, f.world, f.recompute, backend);
    if (o.ok()) {
      o->rank = f.rank;
      o->ranks_per_host = f.ranks_per_host;
      est = zero::Estimate(cfg, zero::gpt::EstimateUnits(mc), *o);
    } else {
      est = o.status();
    }
    if (est.ok() && f.fit_gib > 0) {
      auto fit = zero::gpt::LargestLayersThatFit(cfg, mc, f.seq, f.world, f.recompute, backend,
                                                 static_cast<int64_t>(f.fit_gib * (1 << 30)));
      if (!fit.ok()) est = fit.status();
      else fit_layers = *fit;
    }
    const int T = f.seq > 0 ? f.seq : mc.max_seq;
    model_json = absl::StrCat("{\"layers\": ", mc.layers, ", \"hidden\": ", mc.channels, ", \"heads\": ", mc.heads,
                              ", \"vocab\": ", mc.vocab, ", \"seq\": ", T,
                              ", \"micro_batch\": ", cfg.train_micro_batch_size_per_gpu.value_or(1), "}");
    model_line = absl::StrCat("GPT ", f.model.empty() ? "" : "'" + f.model + "' ", "layers ", mc.layers, ", hidden ",
                              mc.channels, ", heads ", mc.heads, ", vocab ", mc.vocab, ", seq ", T);
  }
  if (!est.ok()) {
    std::fprintf(stderr, "zero-estimate: %s\n", zero::ErrorText(est.status()).c_str());
    return 1;
  }
  const zero::RankEstimate& e = *est;
  if (!AllNonNegative(e)) {
    std::fprintf(stderr, "zero-estimate: the estimate overflowed 64-bit byte counts; refusing to print it\n");
    return 1;
  }
  const zero::PeakBound& dev = e.peak_bound[static_cast<size_t>(zero::MemTier::kDevice)];
  const zero::PeakBound& host = e.peak_bound[static_cast<size_t>(zero::MemTier::kHost)];
  int64_t fit_params = 0;
  if (fit_layers > 0) {
    zero::gpt::GptConfig m = mc;
    m.layers = fit_layers;
    fit_params = zero::gpt::NumParams(m);
  }
  if (f.json) {
    std::string fit;
    if (f.fit_gib > 0) {
      fit = absl::StrCat(", \"fit\": {\"gib\": ", f.fit_gib, ", \"layers\": ", fit_layers, ", \"params\": ", fit_params,
                         ", \"capped\": ", fit_layers >= zero::gpt::kMaxFitLayers ? "true" : "false", "}");
    }
    std::printf(
        "{\"model\": %s, \"params\": %lld, \"padded\": %lld, \"world\": %d, \"shard_group\": %d, \"stage\": %d, "
        "\"dtype\": \"%s\", "
        "\"offload\": \"%s\", \"recompute\": %s, \"device\": \"%s\", \"micro_steps\": %d, \"memory\": %s, "
        "\"model_state\": %lld, \"peak_bound_terms\": {\"host\": %s, \"device\": %s}, \"communication\": %s, "
        "\"bytes_sent_per_step\": %lld, \"host_bytes_per_step\": {\"rank\": %d, \"ranks_per_host\": %d, "
        "\"intra\": %lld, \"inter\": %lld}%s}\n",
        model_json.c_str(), static_cast<long long>(e.params), static_cast<long long>(e.padded), f.world, e.shard_group,
        cfg.zero.stage, DtypeName(cfg), OffloadName(cfg), f.recompute ? "true" : "false", f.device.c_str(),
        e.micro_steps, e.MemoryJson().c_str(), static_cast<long long>(e.planned.ModelStateBytes()),
        TermsJson(host).c_str(), TermsJson(dev).c_str(), e.CommJson().c_str(),
        static_cast<long long>(e.BytesSentPerStep()), f.rank, std::max(1, f.ranks_per_host),
        static_cast<long long>(e.intra_host_bytes), static_cast<long long>(e.inter_host_bytes), fit.c_str());
    return 0;
  }
  std::printf("%s: %lld parameters\n", model_line.c_str(), static_cast<long long>(e.params));
  std::printf(
      "world %d (sharded in groups of %d), stage %d, %s, offload %s, recompute %s, %s engine; per rank, "
      "predicted by zero::Estimate:\n\n",
      f.world, e.shard_group, cfg.zero.stage, DtypeName(cfg), OffloadName(cfg), f.recompute ? "on" : "off",
      backend == zero::Backend::kNccl ? "CUDA (NCCL)" : "host (Gloo)");
  std::printf("%-12s %-7s %16s %12s\n", "tag", "tier", "bytes", "MiB");
  for (size_t g = 0; g < static_cast<size_t>(zero::MemTag::kCount); ++g) {
    for (zero::MemTier t : {zero::MemTier::kDevice, zero::MemTier::kHost, zero::MemTier::kNvme}) {
      const int64_t b = e.memory.usage[static_cast<size_t>(t)][g].peak;
      if (b == 0) continue;
      std::printf("%-12s %-7s %16lld %12s\n", zero::MemTagName(static_cast<zero::MemTag>(g)), zero::MemTierName(t),
                  static_cast<long long>(b), Mib(b).c_str());
    }
  }
  std::printf("\nmodel state (params, grads, optimizer, master in both tiers, held from Finalize on): %s\n",
              HumanBytes(static_cast<double>(e.planned.ModelStateBytes())).c_str());
  std::printf("true peak, all tags alive at once (the plan's bound): device %s, host %s\n",
              HumanBytes(static_cast<double>(dev.total())).c_str(),
              HumanBytes(static_cast<double>(host.total())).c_str());
  if (const int64_t nvme = e.planned.Current(zero::MemTier::kNvme); nvme > 0) {
    std::printf("nvme tier (offload_optimizer/offload_param.nvme_path, files): %s\n",
                HumanBytes(static_cast<double>(nvme)).c_str());
  }
  std::printf(
      "  device = model state %s + gathers %s + reductions %s + staging %s + trainer %s\n",
      HumanBytes(static_cast<double>(dev.model_state)).c_str(), HumanBytes(static_cast<double>(dev.gathers)).c_str(),
      HumanBytes(static_cast<double>(dev.reductions)).c_str(), HumanBytes(static_cast<double>(dev.staging)).c_str(),
      HumanBytes(static_cast<double>(dev.trainer)).c_str());
  std::printf("\ncommunication per step (%d micro-step%s), per rank:\n", e.micro_steps, e.micro_steps == 1 ? "" : "s");
  std::printf("%-24s %-15s %-5s %8s %16s %12s\n", "collective", "kind", "dtype", "calls", "elements", "sent");
  for (const zero::CollectiveEstimate& c : e.comm) {
    std::printf("%-24s %-15s %-5s %8lld %16lld %12s\n", c.what.c_str(), zero::CollectiveKindName(c.kind),
                std::string(zero::DTypeName(c.dtype)).c_str(), static_cast<long long>(c.calls),
                static_cast<long long>(c.elements), HumanBytes(static_cast<double>(c.bytes_sent)).c_str());
  }
  std::printf("%-24s %-15s %-5s %8s %16s %12s\n", "total", "", "", "", "",
              HumanBytes(static_cast<double>(e.BytesSentPerStep())).c_str());
  std::printf(
      "(sent: bytes one rank sends on a bandwidth-optimal algorithm: (N-1) shards per all-gather and\n"
      " reduce-scatter, 2(N-1)/N of the buffer per all-reduce)\n");
  std::printf(
      "rank %d with %d rank%s per host, as Gloo's algorithms send them (the norm and desync check included): "
      "%s inside its host, %s across hosts per step\n",
      f.rank, std::max(1, f.ranks_per_host), std::max(1, f.ranks_per_host) == 1 ? "" : "s",
      HumanBytes(static_cast<double>(e.intra_host_bytes)).c_str(),
      HumanBytes(static_cast<double>(e.inter_host_bytes)).c_str());
  if (f.fit_gib > 0) {
    if (fit_layers > 0) {
      if (fit_layers >= zero::gpt::kMaxFitLayers) {
        std::printf(
            "\nat least %d blocks (%lld parameters) fit %g GiB of device memory per rank: the search stops at %d "
            "blocks (one unit each)\n",
            fit_layers, static_cast<long long>(fit_params), f.fit_gib, zero::gpt::kMaxFitLayers);
      } else {
        std::printf("\nlargest that fits %g GiB of device memory per rank: %d blocks, %lld parameters\n", f.fit_gib,
                    fit_layers, static_cast<long long>(fit_params));
      }
    } else {
      std::printf("\nnot even one block of this shape fits %g GiB of device memory per rank\n", f.fit_gib);
    }
  }
  return 0;
}
