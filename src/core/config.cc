// zero::Config: the schema-driven parser, validator, Resolve and ToJson. Every key, default and rule comes
// from the table in config_schema.cc; this file holds only the walk over it and the cross-key rules.
#include "zero/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/internal/config_diff.h"
#include "core/internal/config_schema.h"
#include "core/internal/json_depth.h"
#include "zero/logging.h"

namespace zero {
namespace internal {

using Json = nlohmann::ordered_json;

namespace {

std::string Join(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string ParentOf(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

std::string LeafOf(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// A value as it appears in messages: compact JSON, cut when long.
std::string Show(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string Lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::vector<std::string> SplitList(const char* list) {
  std::vector<std::string> out;
  if (list == nullptr) return out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

// Every number of the config reaches fp32 arithmetic somewhere (the kernels compute in it) or a duration: one
// that fp32 cannot hold as a normal number would silently become 0, a denormal or infinity there.
bool Fp32Normal(double d) {
  const double a = std::fabs(d);
  return a == 0 ||
         (a >= std::numeric_limits<float>::min() && a <= static_cast<double>(std::numeric_limits<float>::max()));
}
constexpr const char* kFp32Range =
    " (out of range: a number other than 0 needs a magnitude in [1.17549e-38, 3.40282e+38], what fp32 holds as a "
    "normal number)";

uint8_t TypeBit(const std::string& type) {
  if (type == "Adam") return kForAdam;
  if (type == "AdamW") return kForAdamW;
  if (type == "SGD") return kForSgd;
  if (type == "WarmupLR") return kForWarmupLR;
  if (type == "WarmupDecayLR") return kForWarmupDecayLR;
  if (type == "WarmupCosineLR") return kForWarmupCosineLR;
  return 0;
}

// 1-based line and column of 0-based byte `index` in `text`.
std::pair<size_t, size_t> LineColumn(const std::string& text, size_t index) {
  index = std::min(index, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < index; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return {line, index - line_start + 1};
}

// Parses JSON (comments allowed, as DeepSpeed's hjson reader allows them), rejecting duplicate keys by path.
// nlohmann's parser callback sees every key; a stack of frames (one per open object/array) gives the path.
StatusOr<Json> ParseJsonText(const std::string& text) {
  struct Frame {
    bool is_array;
    std::set<std::string> keys;
    std::string key;
    size_t index = 0;
  };
  std::vector<Frame> stack;
  std::vector<std::string> duplicates;
  auto path_to = [&stack](const std::string& last) {
    std::string path;
    for (size_t i = 0; i + 1 < stack.size(); ++i) {
      if (stack[i].is_array) {
        path += "[" + std::to_string(stack[i].index) + "]";
      } else {
        path = Join(path, stack[i].key);
      }
    }
    return Join(path, last);
  };
  Json::parser_callback_t cb = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start: stack.push_back({false, {}, {}, 0}); break;
      case Json::parse_event_t::array_start: stack.push_back({true, {}, {}, 0}); break;
      case Json::parse_event_t::key: {
        Frame& f = stack.back();
        std::string key = parsed.get<std::string>();
        if (!f.keys.insert(key).second) duplicates.push_back(path_to(key));
        f.key = key;
        break;
      }
      case Json::parse_event_t::value:
        if (!stack.empty() && stack.back().is_array) ++stack.back().index;
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        stack.pop_back();
        if (!stack.empty() && stack.back().is_array) ++stack.back().index;
        break;
    }
    return true;
  };
  if (const size_t deep = JsonTooDeepAt(text); deep != std::string::npos) {
    auto [line, column] = LineColumn(text, deep);
    return absl::InvalidArgumentError("arrays and objects nested deeper than " + std::to_string(kMaxJsonDepth) +
                                      " levels at line " + std::to_string(line) + ", column " + std::to_string(column));
  }
  Json root;
  try {
    root = Json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const Json::parse_error& e) {
    // e.byte is the 1-based index of the last character read, where the parser gave up.
    auto [line, column] = LineColumn(text, e.byte > 0 ? e.byte - 1 : 0);
    std::string detail = e.what();
    size_t col = detail.find("column ");
    size_t colon = col == std::string::npos ? std::string::npos : detail.find(": ", col);
    if (colon != std::string::npos) detail = detail.substr(colon + 2);
    return absl::InvalidArgumentError("malformed JSON at line " + std::to_string(line) + ", column " +
                                      std::to_string(column) + ": " + detail);
  } catch (const Json::out_of_range& e) {
    // A number too large for a double (1e400): nlohmann gives no position, but quotes the literal.
    std::string what = e.what();
    size_t q1 = what.find('\''), q2 = q1 == std::string::npos ? q1 : what.find('\'', q1 + 1);
    std::string where;
    if (q2 != std::string::npos) {
      size_t at = text.find(what.substr(q1 + 1, q2 - q1 - 1));
      if (at != std::string::npos) {
        auto [line, column] = LineColumn(text, at);
        where = " at line " + std::to_string(line) + ", column " + std::to_string(column);
      }
    }
    return absl::InvalidArgumentError("number out of range" + where + ": " + what);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(std::string("malformed JSON: ") + e.what());
  }
  if (!duplicates.empty()) {
    std::string msg;
    for (const std::string& d : duplicates) {
      if (!msg.empty()) msg += "\n";
      msg += d + ": duplicate key (each key may appear once; DeepSpeed rejects duplicates too)";
    }
    return absl::InvalidArgumentError(msg);
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError("the config must be a JSON object ({...}); got " + Show(root));
  }
  return root;
}

}  // namespace

// The only writer of Config's private state. One instance per parse or Resolve; errors and warnings collect
// here so that one run reports every problem at once.
class ConfigParser {
 public:
  explicit ConfigParser(Config* c) : c_(c) {}

  static Config WithTrainerAccumulation(const Config& validated) {
    Config c = validated;
    c.gradient_accumulation_steps = 1;
    c.train_batch_size.reset();
    c.batch_derived_ = 0;  // micro and accumulation are given now, whichever keys the user wrote
    c.batch_given_train_.reset();
    return c;
  }

  static StatusOr<Config> Parse(const std::string& text) {
    // No ZERO_ASSIGN_OR_RETURN: a file:line breadcrumb means nothing to someone fixing their JSON.
    StatusOr<Json> parsed = ParseJsonText(text);
    if (!parsed.ok()) return parsed.status();
    const Json& root = *parsed;
    Config c;
    ConfigParser p(&c);
    p.ApplyDefaults("");
    p.Walk(root, "", "");
    p.AfterWalk();
    if (!p.errors_.empty()) return p.ErrorStatus();
    c.warnings_ = p.warnings_;
    for (const std::string& w : p.warnings_) ZERO_LOG(WARNING) << "config: " << w;
    return c;
  }

  static Status Resolve(Config* config, const std::string& path, const Json& value) {
    std::string canon = Canonical(path);
    const KeySpec* k = FindKey(canon);
    if (k == nullptr || k->type == KeyType::kSection) {
      return absl::NotFoundError(path + ": not a config key that takes a value");
    }
    const auto& u = config->unresolved_;
    if (std::find(u.begin(), u.end(), canon) == u.end()) {
      return absl::NotFoundError(path + ": is not \"auto\" (only keys still \"auto\" can be resolved)");
    }
    if (value.is_string() && value.get<std::string>() == "auto") {
      return absl::InvalidArgumentError(path + ": cannot be resolved to \"auto\"");
    }
    Config copy = *config;
    ConfigParser p(&copy);
    p.ApplyLeaf(*k, value, canon);
    if (p.errors_.empty()) {
      p.ApplyDerived();
      p.CrossCheck(/*world_size=*/0);
    }
    if (!p.errors_.empty()) return p.ErrorStatus();
    for (const std::string& w : p.warnings_) {
      ZERO_LOG(WARNING) << "config: " << w;
      copy.warnings_.push_back(w);
    }
    *config = std::move(copy);
    return absl::OkStatus();
  }

  static Status Validate(Config* config, int world_size) {
    if (world_size < 1) {
      return absl::InvalidArgumentError("world_size: must be >= 1; got " + std::to_string(world_size));
    }
    Config copy = *config;
    ConfigParser p(&copy);
    // Fields set in code get the same rules (and messages) as values read from JSON.
    p.CheckFields();
    for (const std::string& path : copy.unresolved_) {
      p.Error(path + ": still \"auto\"; fill it with Config::Resolve(\"" + path +
              "\", value) before the engine "
              "starts");
    }
    p.CrossCheck(world_size);
    if (copy.unresolved_.empty()) p.DeriveBatch(world_size);
    if (!p.errors_.empty()) return p.ErrorStatus();
    *config = std::move(copy);
    return absl::OkStatus();
  }

  // Config::Set: keys in order, each with its own rule, then the rules a JSON file gets after its walk (the
  // cross-key ones, what follows from the keys) once, on all of them: a key whose rule names another (hpZ needs
  // stage 3) may come before it, as in a file. On error nothing changes.
  static Status Set(Config* config, const std::vector<std::pair<std::string, Json>>& values) {
    Config copy = *config;
    ConfigParser p(&copy);
    for (const auto& [path, value] : values) {
      const std::string canon = Canonical(path);
      const KeySpec* k = FindKey(canon);
      if (k == nullptr) {
        ConfigParser q(config);
        return absl::NotFoundError(path + ": " + q.UnknownKeyText(ParentOf(canon), LeafOf(canon), ParentOf(path)));
      }
      if (k->type == KeyType::kSection) {
        return absl::InvalidArgumentError(path + ": a section; set its keys one by one (" + path + ".<key>)");
      }
      if (k->support == Support::kIgnored) {
        p.Warn(path + ": " + k->doc + "; zero ignores it");
        continue;
      }
      if (canon.rfind("optimizer.", 0) == 0 && !copy.optimizer) {
        copy.optimizer.emplace();
        p.ApplyDefaults("optimizer.");
      }
      // Types assigned in code count as given, as they would be in a file that has them.
      if (copy.optimizer) copy.given_.emplace("optimizer.type", "optimizer.type");
      if (!copy.scheduler.type.empty()) copy.given_.emplace("scheduler.type", "scheduler.type");
      // The key counts as given, with every section above it (a scheduler key without scheduler.type is then the
      // error it is in a file).
      for (std::string parent = ParentOf(canon); !parent.empty(); parent = ParentOf(parent)) {
        copy.given_.emplace(parent, parent);
      }
      copy.given_[canon] = path;
      p.ApplyLeaf(*k, value, path);
    }
    if (p.errors_.empty()) p.AfterWalk();
    if (!p.errors_.empty()) return p.ErrorStatus();
    for (const std::string& w : p.warnings_) {
      if (std::find(copy.warnings_.begin(), copy.warnings_.end(), w) != copy.warnings_.end()) continue;
      ZERO_LOG(WARNING) << "config: " << w;
      copy.warnings_.push_back(w);
    }
    *config = std::move(copy);
    return absl::OkStatus();
  }

  static std::string ToJson(const Config& config, int indent) {
    Config& c = const_cast<Config&>(config);  // refs are typed pointers; nothing below writes through them
    Json root = Json::object();
    const uint8_t opt_bit = c.optimizer ? TypeBit(c.optimizer->type) : 0;
    const uint8_t sched_bit = TypeBit(c.scheduler.type);
    for (const KeySpec& k : Schema()) {
      std::string path = k.path;
      if (k.support == Support::kIgnored || k.support == Support::kRejected) continue;
      const bool in_opt = path.rfind("optimizer", 0) == 0, in_sched = path.rfind("scheduler", 0) == 0;
      if (in_opt && !c.optimizer) {
        if (path == "optimizer") root["optimizer"] = nullptr;
        continue;
      }
      if (in_sched && c.scheduler.type.empty()) {
        if (path == "scheduler") root["scheduler"] = nullptr;
        continue;
      }
      if (k.applies != 0 && (k.applies & (in_opt ? opt_bit : sched_bit)) == 0) continue;
      Json* node = &root;
      std::string parent = ParentOf(path);
      if (!parent.empty()) {
        std::stringstream ss(parent);
        std::string part;
        while (std::getline(ss, part, '.')) node = &(*node)[part];
      }
      (*node)[LeafOf(path)] = k.type == KeyType::kSection ? Json::object() : Value(c, k);
    }
    return root.dump(indent);
  }

  static bool Equal(const Config& a, const Config& b) {
    auto sorted = [](std::vector<std::string> v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    return a.train_batch_size == b.train_batch_size &&
           a.train_micro_batch_size_per_gpu == b.train_micro_batch_size_per_gpu &&
           a.gradient_accumulation_steps == b.gradient_accumulation_steps &&
           a.gradient_clipping == b.gradient_clipping && a.steps_per_print == b.steps_per_print &&
           a.wall_clock_breakdown == b.wall_clock_breakdown && a.seed == b.seed &&
           a.comm_timeout_s == b.comm_timeout_s && a.gradient_accumulation_mode == b.gradient_accumulation_mode &&
           a.communication_data_type == b.communication_data_type && a.fp16 == b.fp16 && a.bf16 == b.bf16 &&
           a.optimizer == b.optimizer && a.scheduler == b.scheduler &&
           a.activation_checkpointing == b.activation_checkpointing && a.zero == b.zero && a.aio == b.aio &&
           a.elastic_batch == b.elastic_batch && sorted(a.unresolved_) == sorted(b.unresolved_) &&
           a.extras_ == b.extras_;
  }

 private:
  static std::string JoinLines(const std::vector<std::string>& lines) {
    std::string s;
    for (const std::string& l : lines) {
      if (!s.empty()) s += "\n";
      s += l;
    }
    return s;
  }

  // The canonical path of a key spelled through an alias (leaf or section alias).
  static std::string Canonical(const std::string& path) {
    std::string out;
    std::stringstream ss(path);
    std::string part;
    while (std::getline(ss, part, '.')) {
      out = Join(out, part);
      if (const AliasSpec* a = FindAlias(out)) {
        if (a->kind == AliasKind::kSynonym || a->kind == AliasKind::kDeprecated ||
            a->kind == AliasKind::kDeprecatedSection) {
          out = a->target;
        }
      }
    }
    return out;
  }

  void Error(std::string msg) { errors_.push_back(std::move(msg)); }
  // A value DeepSpeed accepts that asks for a feature zero lacks: the config is valid, zero cannot run it.
  void NotImplemented(std::string msg) {
    errors_.push_back(std::move(msg));
    ++not_implemented_;
  }
  // kUnimplemented only when every problem is a missing feature, so that callers can tell "fix your config"
  // from "zero cannot do this yet"; any invalid value makes the whole config invalid.
  Status ErrorStatus() const {
    const std::string msg = JoinLines(errors_);
    return not_implemented_ == errors_.size() ? absl::UnimplementedError(msg) : absl::InvalidArgumentError(msg);
  }
  void Warn(std::string msg) { warnings_.push_back(std::move(msg)); }

  bool Given(const std::string& canon) const { return c_->given_.count(canon) != 0; }
  bool Unresolved(const std::string& canon) const {
    return std::find(c_->unresolved_.begin(), c_->unresolved_.end(), canon) != c_->unresolved_.end();
  }
  // Records that `canon` was set, spelled `spelled`; false (and an error) if it already was.
  bool MarkGiven(const std::string& canon, const std::string& spelled) {
    auto [it, inserted] = c_->given_.emplace(canon, spelled);
    if (!inserted) {
      Error(spelled + ": given twice (also as " + it->second + "); " + FindRule("alias_twice").text);
      return false;
    }
    return true;
  }

  // Sets every field under `prefix` to the table's default (the table, not the C++ initializers, is the
  // source of truth; a test checks that the two agree).
  void ApplyDefaults(const std::string& prefix) {
    for (const KeySpec& k : Schema()) {
      if (k.ref == nullptr || k.type == KeyType::kSection) continue;
      std::string path = k.path;
      if (!prefix.empty() && path.rfind(prefix, 0) != 0) continue;
      if (path.rfind("optimizer", 0) == 0 && !c_->optimizer) continue;
      Json def = Json::parse(k.default_json);
      if (def.is_null()) {
        SetNull(k);
      } else {
        Store(k, Normalized(k, def));
      }
    }
  }

  // The walk: one JSON object whose keys are rows under `canon_prefix` (as spelled under `spelled_prefix`).
  void Walk(const Json& obj, const std::string& canon_prefix, const std::string& spelled_prefix) {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const std::string& key = it.key();
      const Json& val = it.value();
      const std::string spelled = Join(spelled_prefix, key);
      std::string canon = Join(canon_prefix, key);
      if (const AliasSpec* a = FindAlias(canon)) {
        bool handled = true;
        switch (a->kind) {
          case AliasKind::kSynonym:
            canon = a->target;
            handled = false;
            break;
          case AliasKind::kDeprecated:
          case AliasKind::kDeprecatedSection:
            Warn(spelled + ": deprecated DeepSpeed name, read as " + a->target);
            canon = a->target;
            handled = false;
            break;
          case AliasKind::kDeprecatedOffload: DeprecatedOffload(*a, val, spelled); break;
          case AliasKind::kDeprecatedPin:
            if (!val.is_boolean()) {
              Error(spelled + ": must be true or false; got " + Show(val));
            } else {
              pin_alias_ = spelled;
              pin_value_ = val.get<bool>();
            }
            break;
          case AliasKind::kDeprecatedBoolStage:
            if (val.is_boolean()) {
              Warn(spelled + ": a bool here is DeepSpeed's deprecated format, read as zero_optimization.stage " +
                   (val.get<bool>() ? "1" : "0"));
              if (MarkGiven(canon, spelled) && MarkGiven(a->target, spelled)) c_->zero.stage = val.get<bool>() ? 1 : 0;
            } else {
              handled = false;
            }
            break;
        }
        if (handled) continue;
      }
      const KeySpec* k = FindKey(canon);
      if (k == nullptr) {
        Error(spelled + ": " + UnknownKeyText(canon_prefix, key, spelled_prefix));
        continue;
      }
      if (k->support == Support::kIgnored) {
        Warn(spelled + ": " + k->doc + "; zero ignores it");
        continue;
      }
      if (!MarkGiven(canon, spelled)) continue;
      if (k->type == KeyType::kSection) {
        if (val.is_null()) {  // DeepSpeed's None: the section is absent
          c_->given_.erase(canon);
          continue;
        }
        if (!val.is_object()) {
          Error(spelled + ": must be an object ({...}); got " + Show(val));
          continue;
        }
        if (canon == "optimizer" && !c_->optimizer) {
          c_->optimizer.emplace();
          ApplyDefaults("optimizer.");
        }
        Walk(val, canon, spelled);
        continue;
      }
      ApplyLeaf(*k, val, spelled);
    }
  }

  // Why `key` under `canon_prefix` is not accepted. A top-level key nested in a section (aio under
  // zero_optimization) is named as such: a "did you mean" would suggest whatever sibling happens to be closest.
  std::string UnknownKeyText(const std::string& canon_prefix, const std::string& key,
                             const std::string& spelled_prefix) {
    if (!canon_prefix.empty()) {
      // Top-level rows and aliases have no dot, so the bare key finds exactly them.
      if (FindKey(key) != nullptr || FindAlias(key) != nullptr) {
        return "\"" + key + "\" is a top-level key, not part of " + spelled_prefix;
      }
    }
    return "unknown key" + Suggest(canon_prefix, key, spelled_prefix);
  }

  // " (did you mean \"x\"?)" for an unknown key: the closest sibling by edit distance, else a known key of the
  // same name elsewhere (a key put in the wrong section).
  std::string Suggest(const std::string& canon_prefix, const std::string& key, const std::string& spelled_prefix) {
    std::string best;
    size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
    auto consider = [&](const std::string& path) {
      if (ParentOf(path) != canon_prefix) return;
      size_t d = EditDistance(Lower(key), Lower(LeafOf(path)));
      if (d < best_d) {
        best_d = d;
        best = LeafOf(path);
      }
    };
    for (const KeySpec& k : Schema()) consider(k.path);
    for (const AliasSpec& a : Aliases()) consider(a.path);
    if (!best.empty()) return " (did you mean \"" + Join(spelled_prefix, best) + "\"?)";
    for (const KeySpec& k : Schema()) {
      if (LeafOf(k.path) == key) return " (did you mean \"" + std::string(k.path) + "\"?)";
    }
    return "";
  }

  // "zero_optimization.cpu_offload": true -> offload_optimizer.device "cpu" (false -> "none"), as DeepSpeed's
  // new_param_fn does; giving the replacing section too is an error there and here.
  void DeprecatedOffload(const AliasSpec& a, const Json& val, const std::string& spelled) {
    if (!val.is_boolean()) {
      Error(spelled + ": must be true or false; got " + Show(val));
      return;
    }
    const std::string section = ParentOf(a.target);
    Warn(spelled + ": deprecated DeepSpeed key, read as " + std::string(a.target) + " = \"" +
         (val.get<bool>() ? "cpu" : "none") + "\"");
    if (!MarkGiven(section, spelled)) return;
    c_->given_.emplace(a.target, spelled);
    ApplyLeaf(*FindKey(a.target), Json(val.get<bool>() ? "cpu" : "none"), spelled);
  }

  // One value against its row's type, rule and support, reported under `name` (the key as the user spelled it):
  // the one check a value gets whether it came from JSON, from Set or from a field assigned in code (Validate).
  // False, with the error or "not implemented" recorded, when the value is refused; else its normal form.
  bool NormalizeOrReport(const KeySpec& k, const Json& val, const std::string& name, Json* norm) {
    std::string why;
    bool not_implemented = false;
    if (!Normalize(k, val, norm, &why, &not_implemented)) {
      if (not_implemented) {
        NotImplemented(name + ": " + why);
      } else {
        Error(name + ": " + why);
      }
      return false;
    }
    if (k.support == Support::kOffOnly && !IsOff(k, *norm)) {
      NotImplemented(name + ": not implemented in zero; got " + Show(val) + " (accepted: " + OffText(k) + ")");
      return false;
    }
    return true;
  }

  // Applies one value to one row: "auto", null, type, rule, support; then stores it.
  void ApplyLeaf(const KeySpec& k, const Json& val, const std::string& spelled) {
    if (val.is_string() && val.get<std::string>() == "auto") {
      if (!k.has(kAutoOk)) {
        Error(spelled +
              ": \"auto\" is not accepted here (only keys that Hugging Face or Accelerate fill take it; "
              "see docs/guide/config.md)");
        return;
      }
      c_->given_.emplace(k.path, spelled);
      if (!Unresolved(k.path)) c_->unresolved_.push_back(k.path);
      return;
    }
    if (k.support == Support::kRejected) {
      Error(spelled + ": " + k.note + "; got " + Show(val));
      return;
    }
    if (val.is_null()) {
      if (!k.nullable()) {
        Error(spelled + ": must be " + RuleText(k) + "; got null");
        return;
      }
      c_->given_.erase(k.path);  // DeepSpeed's None: as if absent (dynamic defaults apply)
      SetNull(k);
      RemoveUnresolved(k.path);
      return;
    }
    Json norm;
    if (!NormalizeOrReport(k, val, spelled, &norm)) return;
    if (k.support == Support::kNoEffect && norm != Json::parse(k.default_json)) {
      Warn(spelled + ": accepted but has no effect in zero (" + std::string(k.note) + "); got " + Show(val));
    }
    Store(k, norm);
    RemoveUnresolved(k.path);
  }

  void RemoveUnresolved(const std::string& canon) {
    auto& u = c_->unresolved_;
    u.erase(std::remove(u.begin(), u.end(), canon), u.end());
  }

  static std::string OffText(const KeySpec& k) {
    if (!std::isnan(k.off_max)) {
      std::ostringstream os;
      os << "values <= " << k.off_max << ", which mean off";
      return os.str();
    }
    return std::string("only ") + k.default_json + ", DeepSpeed's default";
  }

  static bool IsOff(const KeySpec& k, const Json& v) {
    if (!std::isnan(k.off_max)) return v.is_number() && v.get<double>() <= k.off_max;
    if (k.type == KeyType::kAny && (v.is_null() || (v.is_object() && v.empty()))) return true;
    return v == Json::parse(k.default_json);
  }

  // Normalize for defaults, which are valid by construction.
  Json Normalized(const KeySpec& k, const Json& v) {
    Json out;
    std::string why;
    ZERO_CHECK(Normalize(k, v, &out, &why)) << k.path << " default: " << why;
    return out;
  }

  // Checks `v` against the row's type and rule and converts it to the stored form (int64 for integers, the
  // canonical spelling for enums). On failure `why` says "must be <rule>; got <value>", or, for an enum value
  // DeepSpeed has and zero does not implement, "not implemented in zero; ..." with *not_implemented set.
  bool Normalize(const KeySpec& k, const Json& v, Json* out, std::string* why, bool* not_implemented = nullptr) {
    auto fail = [&](const std::string& extra = "") {
      *why = "must be " + RuleText(k) + "; got " + Show(v) + extra;
      return false;
    };
    auto in_bounds = [&](double x) {
      if (!std::isnan(k.min) && (k.has(kMinExclusive) ? x <= k.min : x < k.min)) return false;
      if (!std::isnan(k.max) && (k.has(kMaxExclusive) ? x >= k.max : x > k.max)) return false;
      return true;
    };
    switch (k.type) {
      case KeyType::kSection: return fail();
      case KeyType::kAny: *out = v; return true;
      case KeyType::kBool:
        if (!v.is_boolean()) return fail();
        *out = v;
        return true;
      case KeyType::kString:
        if (!v.is_string()) return fail();
        *out = v;
        return true;
      case KeyType::kInt: {
        int64_t i = 0;
        if (v.is_number_unsigned()) {
          if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            return fail(" (out of range)");
          }
          i = static_cast<int64_t>(v.get<uint64_t>());
        } else if (v.is_number_integer()) {
          i = v.get<int64_t>();
        } else if (v.is_number_float()) {
          // pydantic accepts an integral float for an int field (5e8); a fraction is an error.
          double d = v.get<double>();
          if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fail(" (out of range)");
          if (d != std::floor(d)) return fail(" (not an integer)");
          i = static_cast<int64_t>(d);
        } else {
          return fail();
        }
        if (!in_bounds(static_cast<double>(i))) return fail();
        if (k.has(kPowerOfTwo) && (i <= 0 || (i & (i - 1)) != 0)) return fail();
        if (k.has(kEven) && i % 2 != 0) return fail();
        if (k.ref != nullptr && k.ref(*c_).kind == FieldRef::Kind::kInt &&
            (i < std::numeric_limits<int>::min() || i > std::numeric_limits<int>::max())) {
          return fail(" (out of range)");
        }
        *out = i;
        return true;
      }
      case KeyType::kNumber: {
        if (!v.is_number()) return fail();
        double d = v.get<double>();
        if (!std::isfinite(d) || !in_bounds(d)) return fail();
        if (!Fp32Normal(d)) return fail(kFp32Range);
        *out = d;
        return true;
      }
      case KeyType::kNumberPair: {
        if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) return fail();
        double a = v[0].get<double>(), b = v[1].get<double>();
        if (!std::isfinite(a) || !std::isfinite(b) || !in_bounds(a) || !in_bounds(b)) return fail();
        if (!Fp32Normal(a) || !Fp32Normal(b)) return fail(kFp32Range);
        *out = Json::array({a, b});
        return true;
      }
      case KeyType::kEnum: {
        if (!v.is_string()) return fail();
        const std::string s = v.get<std::string>();
        auto same = [&](const std::string& a) { return k.has(kCaseInsensitive) ? Lower(a) == Lower(s) : a == s; };
        for (const std::string& c : SplitList(k.choices)) {
          if (same(c)) {
            *out = c;
            return true;
          }
        }
        for (const std::string& c : SplitList(k.unimplemented)) {
          if (same(c) || Lower(c) == Lower(s)) {
            *why = "not implemented in zero; got " + Show(v) + " (accepted: " + RuleText(k) + ")";
            if (not_implemented != nullptr) *not_implemented = true;
            return false;
          }
        }
        std::string best;
        size_t best_d = std::max<size_t>(3, s.size() / 2) + 1;
        for (const std::string& c : SplitList(k.choices)) {
          size_t d = EditDistance(Lower(c), Lower(s));
          if (d < best_d) {
            best_d = d;
            best = c;
          }
        }
        return fail(best.empty() ? "" : " (did you mean \"" + best + "\"?)");
      }
    }
    return fail();
  }

  void Store(const KeySpec& k, const Json& v) {
    if (k.ref == nullptr) {
      // Only values that differ from the default are kept, so equal effective configs compare equal.
      if (v == Json::parse(k.default_json)) {
        c_->extras_.erase(k.path);
      } else {
        c_->extras_[k.path] = v.dump();
      }
      return;
    }
    FieldRef r = k.ref(*c_);
    switch (r.kind) {
      case FieldRef::Kind::kBool: *static_cast<bool*>(r.p) = v.get<bool>(); break;
      case FieldRef::Kind::kInt: *static_cast<int*>(r.p) = static_cast<int>(v.get<int64_t>()); break;
      case FieldRef::Kind::kInt64: *static_cast<int64_t*>(r.p) = v.get<int64_t>(); break;
      case FieldRef::Kind::kUInt64: *static_cast<uint64_t*>(r.p) = static_cast<uint64_t>(v.get<int64_t>()); break;
      case FieldRef::Kind::kDouble: *static_cast<double*>(r.p) = v.get<double>(); break;
      case FieldRef::Kind::kString: *static_cast<std::string*>(r.p) = v.get<std::string>(); break;
      case FieldRef::Kind::kOptInt64: *static_cast<std::optional<int64_t>*>(r.p) = v.get<int64_t>(); break;
      case FieldRef::Kind::kOptString: *static_cast<std::optional<std::string>*>(r.p) = v.get<std::string>(); break;
      case FieldRef::Kind::kEnum8: {
        std::vector<std::string> choices = SplitList(k.choices);
        auto it = std::find(choices.begin(), choices.end(), v.get<std::string>());
        ZERO_CHECK(it != choices.end()) << k.path;
        *static_cast<uint8_t*>(r.p) = static_cast<uint8_t>(it - choices.begin());
        break;
      }
      case FieldRef::Kind::kPair:
        *static_cast<double*>(r.p) = v[0].get<double>();
        *static_cast<double*>(r.p2) = v[1].get<double>();
        break;
    }
  }

  // null for a nullable row: optionals become empty; other fields keep their (dynamic) default.
  void SetNull(const KeySpec& k) {
    if (k.ref == nullptr) {
      c_->extras_.erase(k.path);
      return;
    }
    FieldRef r = k.ref(*c_);
    if (r.kind == FieldRef::Kind::kOptInt64) static_cast<std::optional<int64_t>*>(r.p)->reset();
    if (r.kind == FieldRef::Kind::kOptString) static_cast<std::optional<std::string>*>(r.p)->reset();
  }

  // The value ToJson prints for a leaf row.
  static Json Value(Config& c, const KeySpec& k) {
    if (std::find(c.unresolved_.begin(), c.unresolved_.end(), k.path) != c.unresolved_.end()) return "auto";
    if (std::string(k.path) == "zero_optimization.overlap_comm" && !c.given_.count(k.path)) {
      // DeepSpeed's dynamic default: unknown until the stage is.
      const auto& u = c.unresolved_;
      if (std::find(u.begin(), u.end(), "zero_optimization.stage") != u.end()) return nullptr;
    }
    if (k.ref == nullptr) {
      auto it = c.extras_.find(k.path);
      return Json::parse(it != c.extras_.end() ? it->second : std::string(k.default_json));
    }
    FieldRef r = k.ref(c);
    switch (r.kind) {
      case FieldRef::Kind::kBool: return *static_cast<bool*>(r.p);
      case FieldRef::Kind::kInt: return *static_cast<int*>(r.p);
      case FieldRef::Kind::kInt64: return *static_cast<int64_t*>(r.p);
      case FieldRef::Kind::kUInt64: return *static_cast<uint64_t*>(r.p);
      case FieldRef::Kind::kDouble: return *static_cast<double*>(r.p);
      case FieldRef::Kind::kString: {
        const std::string& s = *static_cast<std::string*>(r.p);
        // A nullable string left empty (nvme_path) prints as DeepSpeed's None.
        if (s.empty() && k.nullable()) return nullptr;
        return s;
      }
      case FieldRef::Kind::kOptInt64: {
        const auto& o = *static_cast<std::optional<int64_t>*>(r.p);
        return o ? Json(*o) : Json(nullptr);
      }
      case FieldRef::Kind::kOptString: {
        const auto& o = *static_cast<std::optional<std::string>*>(r.p);
        return o ? Json(*o) : Json(nullptr);
      }
      case FieldRef::Kind::kEnum8: {
        std::vector<std::string> choices = SplitList(k.choices);
        return choices.at(*static_cast<uint8_t*>(r.p));
      }
      case FieldRef::Kind::kPair: return Json::array({*static_cast<double*>(r.p), *static_cast<double*>(r.p2)});
    }
    return nullptr;
  }

  // Every field that holds a value, against its row: type range, rule, support. Config::Validate runs it, so
  // a field assigned in code fails as the same value in the JSON would (same path, rule and message).
  void CheckFields() {
    const Config& c = *c_;
    for (const KeySpec& k : Schema()) {
      if (k.ref == nullptr || k.type == KeyType::kSection || k.support == Support::kIgnored) continue;
      const std::string path = k.path;
      if (Unresolved(path)) continue;
      if (path.rfind("optimizer.", 0) == 0 && !c.optimizer) continue;
      if (path.rfind("scheduler.", 0) == 0 && c.scheduler.type.empty()) continue;
      if (k.applies != 0) {  // a parameter of another optimizer or scheduler type is not in effect
        const uint8_t bit = path.rfind("optimizer.", 0) == 0 ? TypeBit(c.optimizer->type) : TypeBit(c.scheduler.type);
        if ((k.applies & bit) == 0) continue;
      }
      FieldRef r = k.ref(*c_);
      if (r.kind == FieldRef::Kind::kEnum8) {
        const size_t index = *static_cast<uint8_t*>(r.p);
        const std::vector<std::string> choices = SplitList(k.choices), unimplemented = SplitList(k.unimplemented);
        if (index >= choices.size() && index < choices.size() + unimplemented.size()) {
          // An enumerator the JSON spells as one of the row's unimplemented values (offload "nvme"): the same
          // message the JSON gets.
          NotImplemented(path + ": not implemented in zero; got \"" + unimplemented[index - choices.size()] +
                         "\" (accepted: " + RuleText(k) + ")");
          continue;
        }
        if (index >= choices.size()) {
          Error(path + ": must be " + RuleText(k) + "; got enumerator " + std::to_string(index));
          continue;
        }
      }
      if (r.kind == FieldRef::Kind::kDouble && !std::isfinite(*static_cast<double*>(r.p))) {
        std::ostringstream os;
        os << path << ": must be " << RuleText(k) << "; got " << *static_cast<double*>(r.p);
        Error(os.str());
        continue;
      }
      if (r.kind == FieldRef::Kind::kUInt64 &&
          *static_cast<uint64_t*>(r.p) > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        Error(path + ": must be " + RuleText(k) + "; got " + std::to_string(*static_cast<uint64_t*>(r.p)) +
              " (out of range)");
        continue;
      }
      const Json v = Value(*c_, k);
      if (v.is_null()) continue;  // an empty optional: DeepSpeed's None, allowed exactly where the row is nullable
      Json norm;
      NormalizeOrReport(k, v, path, &norm);
    }
  }

  // Everything after the walk: deprecated pin memory, required types, params that belong to another type,
  // the Adam rule, derived defaults, cross-key rules.
  void AfterWalk() {
    // false matters too: pin_memory defaults to true, so the old key may be what turns pinning off.
    if (!pin_alias_.empty()) {
      Warn(pin_alias_ + ": deprecated DeepSpeed key, read as pin_memory " + (pin_value_ ? "true" : "false") +
           " for offload_optimizer and offload_param where not given");
      for (const char* p :
           {"zero_optimization.offload_optimizer.pin_memory", "zero_optimization.offload_param.pin_memory"}) {
        if (!Given(p)) ApplyLeaf(*FindKey(p), Json(pin_value_), pin_alias_);
      }
    }
    const std::string& type_rule = FindRule("type_required").text;
    if (c_->optimizer && !Given("optimizer.type")) Error("optimizer.type: required; " + type_rule);
    if (Given("scheduler") && !Given("scheduler.type")) Error("scheduler.type: required; " + type_rule);
    const uint8_t opt_bit = c_->optimizer && Given("optimizer.type") ? TypeBit(c_->optimizer->type) : 0;
    const uint8_t sched_bit = TypeBit(c_->scheduler.type);
    for (const auto& [canon, spelled] : c_->given_) {
      const KeySpec* k = FindKey(canon);
      if (k == nullptr || k->applies == 0) continue;
      const bool is_opt = canon.rfind("optimizer.", 0) == 0;
      const uint8_t bit = is_opt ? opt_bit : sched_bit;
      if (bit == 0) continue;  // the type itself is missing or wrong: reported already
      if ((k->applies & bit) == 0) {
        Error(spelled + ": not a parameter of " + (is_opt ? c_->optimizer->type : c_->scheduler.type) + "; " +
              FindRule("params_belong").text);
      }
    }
    if (c_->optimizer && c_->optimizer->type == "AdamW") {
      if (Given("optimizer.params.adam_w_mode") && !c_->optimizer->adam_w_mode) {
        Error("optimizer.params.adam_w_mode: false with optimizer.type \"AdamW\"; " +
              std::string(FindRule("adam_w_mode").text));
      }
      c_->optimizer->adam_w_mode = true;
    }
    if (sched_bit & (kForWarmupDecayLR | kForWarmupCosineLR)) {
      if (!Given("scheduler.params.total_num_steps")) {
        Error("scheduler.params.total_num_steps: missing; " + std::string(FindRule("total_num_steps").text));
      }
    }
    ApplyDerived();
    CrossCheck(/*world_size=*/0);
  }

  // Defaults that depend on other keys.
  void ApplyDerived() {
    if (!Given("zero_optimization.overlap_comm")) {
      c_->zero.overlap_comm = !Unresolved("zero_optimization.stage") && c_->zero.stage == 3;
    }
    if (c_->scheduler.type == "WarmupLR" && !Given("scheduler.params.warmup_max_lr") && c_->optimizer &&
        !Unresolved("optimizer.params.lr")) {
      c_->scheduler.warmup_max_lr = c_->optimizer->lr;
    }
  }

  // Cross-key rules (table CrossRules()), skipping rules whose keys are still "auto". world_size 0: parse
  // time, the rules that need it are skipped.
  void CrossCheck(int world_size) {
    const Config& c = *c_;
    auto known = [this](std::initializer_list<const char*> paths) {
      for (const char* p : paths) {
        if (Unresolved(p)) return false;
      }
      return true;
    };
    if (known({"fp16.enabled", "bf16.enabled"}) && c.fp16.enabled && c.bf16.enabled) {
      Error("fp16.enabled, bf16.enabled: both true; " + std::string(FindRule("precision").text));
    }
    const int stage = c.zero.stage;
    auto device_name = [](OffloadDevice d) { return d == OffloadDevice::kCpu ? "\"cpu\"" : "\"nvme\""; };
    if (known({"zero_optimization.stage", "zero_optimization.offload_param.device"}) &&
        c.zero.offload_param.device != OffloadDevice::kNone && stage < 3) {
      Error("zero_optimization.offload_param.device: " + std::string(device_name(c.zero.offload_param.device)) +
            " with zero_optimization.stage " + std::to_string(stage) + "; " + FindRule("offload_param_stage").text);
    }
    if (known({"zero_optimization.stage", "zero_optimization.offload_optimizer.device"}) &&
        c.zero.offload_optimizer.device != OffloadDevice::kNone && stage == 0) {
      Error("zero_optimization.offload_optimizer.device: " + std::string(device_name(c.zero.offload_optimizer.device)) +
            " with zero_optimization.stage 0; " + FindRule("offload_optimizer_stage").text);
    }
    if (known({"zero_optimization.stage", "zero_optimization.zero_quantized_gradients"}) &&
        c.zero.zero_quantized_gradients && stage == 0) {
      Error("zero_optimization.zero_quantized_gradients: true with zero_optimization.stage 0; " +
            std::string(FindRule("qgz_stage").text));
    }
    if (c.zero.zero_quantized_gradients_bits != 8 && c.zero.zero_quantized_gradients_bits != 4) {
      Error("zero_optimization.zero_quantized_gradients_bits: " + std::to_string(c.zero.zero_quantized_gradients_bits) +
            "; " + FindRule("qgz_bits").text);
    }
    if (known({"zero_optimization.stage", "zero_optimization.zero_quantized_weights"}) &&
        c.zero.zero_quantized_weights && stage != 3) {
      Error("zero_optimization.zero_quantized_weights: true with zero_optimization.stage " + std::to_string(stage) +
            "; " + FindRule("qwz_stage").text);
    }
    if (known({"zero_optimization.offload_optimizer.device", "zero_optimization.offload_optimizer.nvme_path"}) &&
        c.zero.offload_optimizer.device == OffloadDevice::kNvme && c.zero.offload_optimizer.nvme_path.empty()) {
      Error("zero_optimization.offload_optimizer.nvme_path: empty with device \"nvme\"; " +
            std::string(FindRule("nvme_path").text));
    }
    if (known({"zero_optimization.offload_param.device", "zero_optimization.offload_param.nvme_path"}) &&
        c.zero.offload_param.device == OffloadDevice::kNvme && c.zero.offload_param.nvme_path.empty()) {
      Error("zero_optimization.offload_param.nvme_path: empty with device \"nvme\"; " +
            std::string(FindRule("param_nvme_path").text));
    }
    const int64_t hpz = c.zero.zero_hpz_partition_size;
    if (known({"zero_optimization.stage", "zero_optimization.zero_hpz_partition_size"}) && hpz > 1 && stage != 3) {
      Error("zero_optimization.zero_hpz_partition_size: " + std::to_string(hpz) + " with zero_optimization.stage " +
            std::to_string(stage) + "; " + FindRule("hpz_stage").text);
    }
    if (world_size > 0 && hpz > 1 && world_size % hpz != 0) {
      Error("zero_optimization.zero_hpz_partition_size: " + std::to_string(hpz) + " does not divide the world size " +
            std::to_string(world_size) + "; " + FindRule("hpz_divides").text);
    }
    if (hpz > 1 && c.zero.mics_shard_size > 0) {
      Error("zero_optimization.zero_hpz_partition_size: " + std::to_string(hpz) +
            " with zero_optimization.mics_shard_size " + std::to_string(c.zero.mics_shard_size) + "; " +
            FindRule("hpz_mics").text);
    }
    if (hpz > 1 && c.zero.offload_param.device != OffloadDevice::kNone) {
      Error("zero_optimization.zero_hpz_partition_size: " + std::to_string(hpz) +
            " with zero_optimization.offload_param.device other than \"none\"; " + FindRule("hpz_offload_param").text);
    }
    if (known({"zero_optimization.stage"}) && c.zero.mics_shard_size > 0 && stage == 0) {
      Error("zero_optimization.mics_shard_size: " + std::to_string(c.zero.mics_shard_size) +
            " with zero_optimization.stage 0; " + FindRule("mics_stage").text);
    }
    if (world_size > 0 && c.zero.mics_shard_size > 0 && world_size % c.zero.mics_shard_size != 0) {
      Error("zero_optimization.mics_shard_size: " + std::to_string(c.zero.mics_shard_size) +
            " does not divide the world size " + std::to_string(world_size) + "; " + FindRule("mics_divides").text);
    }
    if (known({"zero_optimization.stage"}) && c.zero.offload_optimizer.ratio < 1.0 && stage != 3) {
      std::ostringstream os;
      os << "zero_optimization.offload_optimizer.ratio: " << c.zero.offload_optimizer.ratio
         << " with zero_optimization.stage " << stage << "; " << FindRule("ratio_stage").text;
      Error(os.str());
    }
    if (c.optimizer && c.optimizer->type == "SGD" && c.optimizer->nesterov &&
        (c.optimizer->momentum <= 0 || c.optimizer->dampening != 0)) {
      std::ostringstream os;
      os << "optimizer.params.nesterov: true with momentum " << c.optimizer->momentum << " and dampening "
         << c.optimizer->dampening << "; " << FindRule("nesterov").text;
      Error(os.str());
    }
    if ((c.scheduler.type == "WarmupDecayLR" || c.scheduler.type == "WarmupCosineLR") &&
        Given("scheduler.params.total_num_steps") &&
        known({"scheduler.params.total_num_steps", "scheduler.params.warmup_num_steps"}) &&
        c.scheduler.total_num_steps < c.scheduler.warmup_num_steps && world_size == 0) {
      Warn("scheduler.params.total_num_steps: " + std::to_string(c.scheduler.total_num_steps) +
           " is below warmup_num_steps " + std::to_string(c.scheduler.warmup_num_steps) + "; " +
           FindRule("warmup_longer").text);
    }
    if (known({"bf16.enabled"}) && c.bf16.stochastic_rounding && !c.bf16.enabled && world_size == 0) {
      Warn("bf16.stochastic_rounding: true has no effect; " + std::string(FindRule("stochastic_rounding").text));
    }
    if (known({"zero_optimization.zero_quantized_gradients",
               "zero_optimization.zero_quantized_gradients_error_feedback"}) &&
        c.zero.zero_quantized_gradients_error_feedback_dtype == QgzResidualDType::kInt8 &&
        !(c.zero.zero_quantized_gradients && c.zero.zero_quantized_gradients_error_feedback) && world_size == 0) {
      Warn("zero_optimization.zero_quantized_gradients_error_feedback_dtype: \"int8\" has no effect; " +
           std::string(FindRule("loco_dtype").text));
    }
    const char* kBatch[] = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"};
    if (known({kBatch[0], kBatch[1], kBatch[2]}) && c.train_batch_size && c.train_micro_batch_size_per_gpu &&
        c.gradient_accumulation_steps && (c_->batch_derived_ == 0)) {
      const int64_t t = *c.train_batch_size, m = *c.train_micro_batch_size_per_gpu, g = *c.gradient_accumulation_steps;
      int64_t mg = 0;
      if (__builtin_mul_overflow(m, g, &mg) || t % mg != 0) {
        Error("train_batch_size: " + std::to_string(t) + " is not a multiple of train_micro_batch_size_per_gpu " +
              std::to_string(m) + " x gradient_accumulation_steps " + std::to_string(g) + "; " +
              FindRule("batch_divisible").text);
      }
    }
  }

  // DeepSpeed's _set_batch_related_parameters + _batch_assertion, on the keys the user gave (keys an earlier
  // Validate derived are derived afresh for this world size).
  // elastic_batch: keep_global derives at this world (DeepSpeed's rule); keep_micro derives at the reference world
  // and keeps its micro-batch and accumulation here, the global batch and the learning rate following the world.
  void DeriveBatch(int world_size) {
    Config& c = *c_;
    if (c.batch_derived_ & 8) c.train_batch_size = c.batch_given_train_;
    if (c.batch_derived_ & 1) c.train_batch_size.reset();
    if (c.batch_derived_ & 2) c.train_micro_batch_size_per_gpu.reset();
    if (c.batch_derived_ & 4) c.gradient_accumulation_steps.reset();
    c.batch_derived_ = 0;
    c.batch_given_train_.reset();
    ElasticBatchConfig& e = c.elastic_batch;
    e.lr_multiplier = 1.0;
    if (e.policy == ElasticBatchPolicy::kKeepGlobal) {
      if (e.lr_scaling != LrScaling::kNone) {
        Error(
            "elastic_batch.lr_scaling: scales the learning rate with the global batch, which keep_global keeps; "
            "set elastic_batch.policy to keep_micro, or lr_scaling to none");
        return;
      }
      DeriveBatchAt(world_size);
      return;
    }
    if (!e.reference_world_size) {
      Error("elastic_batch.reference_world_size: keep_micro needs the world size the batch keys were written for");
      return;
    }
    const size_t errors = errors_.size();
    DeriveBatchAt(*e.reference_world_size);
    if (errors_.size() != errors) return;
    int64_t t = 0;
    if (__builtin_mul_overflow(*c.train_micro_batch_size_per_gpu, *c.gradient_accumulation_steps, &t) ||
        __builtin_mul_overflow(t, static_cast<int64_t>(world_size), &t)) {
      Error("train_batch_size: micro x accumulation x world overflows int64 (elastic_batch keep_micro)");
      return;
    }
    if (t != *c.train_batch_size) {
      if (!(c.batch_derived_ & 1)) {  // given for the reference world: kept aside for the next derivation
        c.batch_given_train_ = c.train_batch_size;
        c.batch_derived_ |= 8;
      }
      c.train_batch_size = t;
    }
    const double r = static_cast<double>(world_size) / static_cast<double>(*e.reference_world_size);
    e.lr_multiplier = e.lr_scaling == LrScaling::kLinear ? r : e.lr_scaling == LrScaling::kSqrt ? std::sqrt(r) : 1.0;
  }

  // DeepSpeed's derivation of the missing batch keys at `world_size`, and its check that they multiply out.
  void DeriveBatchAt(int64_t world_size) {
    Config& c = *c_;
    auto& t = c.train_batch_size;
    auto& m = c.train_micro_batch_size_per_gpu;
    auto& g = c.gradient_accumulation_steps;
    const int64_t w = world_size;
    const std::string rule = FindRule("batch_multiply").text;
    if (t && m && g) {
      // all given
    } else if (t && m) {
      g = *t / *m / w;
      c.batch_derived_ |= 4;
    } else if (t && g) {
      m = *t / w / *g;
      c.batch_derived_ |= 2;
    } else if (m && g) {
      int64_t prod = 0;
      if (__builtin_mul_overflow(*m, *g, &prod) || __builtin_mul_overflow(prod, w, &prod)) {
        Error("train_batch_size: micro x accumulation x world overflows int64; " + rule);
        return;
      }
      t = prod;
      c.batch_derived_ |= 1;
    } else if (t) {
      g = 1;
      m = *t / w;
      c.batch_derived_ |= 6;
    } else if (m) {
      int64_t prod = 0;
      if (__builtin_mul_overflow(*m, w, &prod)) {
        Error("train_batch_size: micro x world overflows int64; " + rule);
        return;
      }
      t = prod;
      g = 1;
      c.batch_derived_ |= 5;
    } else {
      Error(
          "train_batch_size, train_micro_batch_size_per_gpu: neither is given (DeepSpeed: Either "
          "train_batch_size or train_micro_batch_size_per_gpu needs to be provided); " +
          std::string(FindRule("batch_derive").text));
      return;
    }
    auto derived = [&](int bit) { return (c.batch_derived_ & bit) ? " (derived)" : ""; };
    std::string values = "train_batch_size " + std::to_string(*t) + derived(1) + ", train_micro_batch_size_per_gpu " +
                         std::to_string(*m) + derived(2) + ", gradient_accumulation_steps " + std::to_string(*g) +
                         derived(4) + ", world_size " + std::to_string(w);
    int64_t prod = 0;
    const bool overflow = __builtin_mul_overflow(*m, *g, &prod) || __builtin_mul_overflow(prod, w, &prod);
    if (*m < 1 || *g < 1 || overflow || prod != *t) {
      const char* key = *m < 1   ? "train_micro_batch_size_per_gpu"
                        : *g < 1 ? "gradient_accumulation_steps"
                                 : "train_batch_size";
      Error(std::string(key) + ": batch sizes do not multiply out: " + values + "; " + rule);
    }
  }

  Config* c_;
  std::vector<std::string> errors_;
  size_t not_implemented_ = 0;  // how many of errors_ are NotImplemented
  std::vector<std::string> warnings_;
  std::string pin_alias_;
  bool pin_value_ = false;
};

namespace {

void Flatten(const Json& v, const std::string& path, std::vector<std::pair<std::string, Json>>* out) {
  if (v.is_object() && !v.empty()) {
    for (auto it = v.begin(); it != v.end(); ++it) Flatten(it.value(), Join(path, it.key()), out);
  } else {
    out->emplace_back(path, v);
  }
}

}  // namespace

std::string FirstConfigDifference(const std::string& json_a, const std::string& json_b) {
  Json a, b;
  try {
    a = Json::parse(json_a);
    b = Json::parse(json_b);
  } catch (const Json::exception&) {
    return json_a == json_b ? "" : "the configs' texts differ (not JSON)";
  }
  std::vector<std::pair<std::string, Json>> fa, fb;
  Flatten(a, "", &fa);
  Flatten(b, "", &fb);
  std::map<std::string, Json> mb(fb.begin(), fb.end());
  for (const auto& [path, va] : fa) {
    auto it = mb.find(path);
    if (it == mb.end()) return path + ": " + Show(va) + " vs absent";
    if (it->second != va) return path + ": " + Show(va) + " vs " + Show(it->second);
  }
  std::map<std::string, Json> ma(fa.begin(), fa.end());
  for (const auto& [path, vb] : fb) {
    if (!ma.count(path)) return path + ": absent vs " + Show(vb);
  }
  return "";
}

Config WithTrainerAccumulation(const Config& validated) { return ConfigParser::WithTrainerAccumulation(validated); }

}  // namespace internal

StatusOr<Config> Config::FromJsonString(const std::string& json) { return internal::ConfigParser::Parse(json); }

StatusOr<Config> Config::FromJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path + ": cannot open the config file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(path + ": cannot read the config file");
  StatusOr<Config> c = internal::ConfigParser::Parse(ss.str());
  if (!c.ok()) {
    // Prefix every line with the file so multi-error messages stay attributable.
    std::string msg, line;
    std::stringstream lines(std::string(c.status().message()));
    while (std::getline(lines, line)) {
      if (!msg.empty()) msg += "\n";
      msg += path + ": " + line;
    }
    return absl::Status(c.status().code(), msg);
  }
  return c;
}

Config Config::Default() {
  StatusOr<Config> c = FromJsonString(internal::DefaultConfigJson());
  ZERO_CHECK(c.ok()) << c.status().ToString();
  return *std::move(c);
}

namespace {
// A value given as JSON text for `path` (ResolveJson, Set): bounded in depth, then parsed.
StatusOr<internal::Json> ParseValueJson(const std::string& path, const std::string& json_value) {
  if (internal::JsonTooDeepAt(json_value) != std::string::npos) {
    return absl::InvalidArgumentError(path + ": the value nests deeper than " +
                                      std::to_string(internal::kMaxJsonDepth) + " levels");
  }
  internal::Json v;
  try {
    v = internal::Json::parse(json_value);
  } catch (const internal::Json::exception& e) {
    return absl::InvalidArgumentError(path + ": the value is not JSON: " + json_value);
  }
  return v;
}
}  // namespace

Status Config::ResolveJson(const std::string& path, const std::string& json_value) {
  StatusOr<internal::Json> v = ParseValueJson(path, json_value);  // its message as it is, no breadcrumb
  if (!v.ok()) return v.status();
  return internal::ConfigParser::Resolve(this, path, *v);
}
Status Config::Resolve(const std::string& path, double value) {
  return internal::ConfigParser::Resolve(this, path, internal::Json(value));
}
Status Config::Resolve(const std::string& path, const std::string& value) {
  return internal::ConfigParser::Resolve(this, path, internal::Json(value));
}
Status Config::Resolve(const std::string& path, const char* value) { return Resolve(path, std::string(value)); }
Status Config::Resolve(const std::string& path, bool value) {
  return internal::ConfigParser::Resolve(this, path, internal::Json(value));
}
Status Config::Resolve(const std::string& path, int value) {
  return internal::ConfigParser::Resolve(this, path, internal::Json(static_cast<int64_t>(value)));
}
Status Config::Resolve(const std::string& path, int64_t value) {
  return internal::ConfigParser::Resolve(this, path, internal::Json(value));
}
Status Config::Resolve(const std::string& path, const std::vector<double>& values) {
  return internal::ConfigParser::Resolve(this, path, internal::Json(values));
}

Status Config::Set(const std::string& path, const std::string& json_value) { return Set({{path, json_value}}); }

Status Config::Set(const std::vector<std::pair<std::string, std::string>>& values) {
  std::vector<std::pair<std::string, internal::Json>> parsed;
  parsed.reserve(values.size());
  for (const auto& [path, json_value] : values) {
    StatusOr<internal::Json> v = ParseValueJson(path, json_value);  // its message as it is, no breadcrumb
    if (!v.ok()) return v.status();
    parsed.emplace_back(path, *std::move(v));
  }
  return internal::ConfigParser::Set(this, parsed);
}

std::string SetValueJson(const std::string& value) {
  if (internal::JsonTooDeepAt(value) == std::string::npos && internal::Json::accept(value)) return value;
  return internal::Json(value).dump();
}

Status Config::Validate(int world_size) { return internal::ConfigParser::Validate(this, world_size); }

std::string Config::ToJson(int indent) const { return internal::ConfigParser::ToJson(*this, indent); }

bool Config::operator==(const Config& other) const { return internal::ConfigParser::Equal(*this, other); }

}  // namespace zero
