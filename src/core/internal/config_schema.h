// core/internal/config_schema.h — the one table of config keys that the parser, the validator, ToJson and
// the markdown reference (docs/guide/config.md) are all generated from.
//
//   for (const KeySpec& k : Schema()) ...            // table order = document order
//   const KeySpec* k = FindKey("zero_optimization.stage");
//   const AliasSpec* a = FindAlias("zero_optimization.prefetch_bucket_size");
//
// A row holds a key's dotted path, its type, DeepSpeed's default (from DeepSpeed's source, not its docs, which
// disagree in places), the rule the value must satisfy, whether zero implements it, whether "auto" is accepted,
// where the value is stored in zero::Config, and a one-line description. Cross-key rules cannot live in one row;
// they are listed in CrossRules() with the text that both the error messages and the reference use.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "zero/config.h"

namespace zero::internal {

// What a JSON value must be.
enum class KeyType : uint8_t {
  kSection,     // a JSON object whose keys are rows of their own
  kBool,        // true / false
  kInt,         // an integer; a float is accepted when integral (5e8), as pydantic does for DeepSpeed's int fields
  kNumber,      // any number
  kString,      // any string
  kEnum,        // one of `choices` (comma-separated); see kCaseInsensitive
  kNumberPair,  // [number, number] (optimizer betas)
  kAny,         // any JSON value (DeepSpeed sections zero ignores, and opaque DeepSpeed dicts)
};

// Whether zero does what the key asks.
enum class Support : uint8_t {
  kYes,       // implemented (enum values listed in `unimplemented` excepted)
  kOffOnly,   // DeepSpeed feature zero lacks: accepted only at its off/default value, else kUnimplemented
  kNoEffect,  // accepted at any valid value but changes nothing in zero (a warning names it when not default)
  kIgnored,   // a top-level section of another DeepSpeed subsystem: accepted with a one-line warning
  kRejected,  // known to DeepSpeed and always an error here, with the message in `note` (max_grad_norm)
};

// Row flags.
enum KeyFlag : uint32_t {
  kAutoOk = 1u << 0,           // "auto" accepted (Hugging Face / Accelerate fill it); Config::Resolve fills it
  kPowerOfTwo = 1u << 1,       // value must be a power of 2
  kEven = 1u << 2,             // value must be a multiple of 2
  kOurs = 1u << 3,             // zero's own key (DeepSpeed has no such key)
  kMinExclusive = 1u << 4,     // value must be > min rather than >= min
  kCaseInsensitive = 1u << 5,  // enum matched case-insensitively (stored in the spelling of `choices`)
  kMaxExclusive = 1u << 6,     // value must be < max rather than <= max
};

// Which optimizer / scheduler type a params row belongs to (0 = not type-specific).
enum TypeMask : uint8_t {
  kForAdam = 1u << 0,
  kForAdamW = 1u << 1,
  kForSgd = 1u << 2,
  kForWarmupLR = 1u << 3,
  kForWarmupDecayLR = 1u << 4,
  kForWarmupCosineLR = 1u << 5,
};
inline constexpr uint8_t kForAdamFamily = kForAdam | kForAdamW;
inline constexpr uint8_t kForAllOptimizers = kForAdam | kForAdamW | kForSgd;
inline constexpr uint8_t kForAllSchedulers = kForWarmupLR | kForWarmupDecayLR | kForWarmupCosineLR;

// A typed pointer into a Config, so rows can name their storage without knowing its C++ type: the Ref()
// overload picks the kind, which the compiler checks against the field.
struct FieldRef {
  enum class Kind : uint8_t { kBool, kInt, kInt64, kUInt64, kDouble, kString, kOptInt64, kOptString, kEnum8, kPair };
  Kind kind;
  void* p;
  void* p2 = nullptr;  // kPair: the second double
};
inline FieldRef Ref(bool& v) { return {FieldRef::Kind::kBool, &v}; }
inline FieldRef Ref(int& v) { return {FieldRef::Kind::kInt, &v}; }
inline FieldRef Ref(int64_t& v) { return {FieldRef::Kind::kInt64, &v}; }
inline FieldRef Ref(uint64_t& v) { return {FieldRef::Kind::kUInt64, &v}; }
inline FieldRef Ref(double& v) { return {FieldRef::Kind::kDouble, &v}; }
inline FieldRef Ref(std::string& v) { return {FieldRef::Kind::kString, &v}; }
inline FieldRef Ref(std::optional<int64_t>& v) { return {FieldRef::Kind::kOptInt64, &v}; }
inline FieldRef Ref(std::optional<std::string>& v) { return {FieldRef::Kind::kOptString, &v}; }
// uint8_t enums whose enumerators are in the order of the row's `choices`.
template <typename E>
requires std::is_enum_v<E> FieldRef Ref(E& v) {
  static_assert(sizeof(E) == 1, "enum fields must be uint8_t-based");
  return {FieldRef::Kind::kEnum8, &v};
}
inline FieldRef RefPair(double& a, double& b) { return {FieldRef::Kind::kPair, &a, &b}; }

inline constexpr double kNoBound = std::numeric_limits<double>::quiet_NaN();

struct KeySpec {
  const char* path;  // canonical dotted path
  KeyType type;
  const char* default_json;  // DeepSpeed's default as JSON text ("null": none / dynamic); ours for kOurs rows
  double min = kNoBound;     // inclusive unless kMinExclusive
  double max = kNoBound;     // inclusive
  uint32_t flags = 0;
  const char* choices = nullptr;        // kEnum: values zero accepts, comma-separated
  const char* unimplemented = nullptr;  // kEnum: values DeepSpeed accepts that zero does not implement
  Support support = Support::kYes;
  double off_max = kNoBound;           // kOffOnly integers: values <= off_max mean "off" (else only the default)
  uint8_t applies = 0;                 // TypeMask for optimizer/scheduler params
  FieldRef (*ref)(Config&) = nullptr;  // storage; nullptr: kept as JSON text in Config::extras_
  const char* doc = "";                // description
  const char* note = nullptr;          // extra rule text (docs and errors); kNoEffect: why; kRejected: the message
  const char* default_doc = nullptr;   // docs: default in words when default_json is not the whole story

  bool has(uint32_t f) const { return (flags & f) != 0; }
  bool nullable() const { return std::string_view(default_json) == "null"; }
};

enum class AliasKind : uint8_t {
  kSynonym,              // another accepted spelling (DeepSpeed's pydantic field name vs its stage3_ alias)
  kDeprecated,           // old spelling; mapped with a warning
  kDeprecatedSection,    // old section name (bfloat16 -> bf16); mapped with a warning
  kDeprecatedOffload,    // cpu_offload / cpu_offload_param: true -> <target> = "cpu", false -> "none"
  kDeprecatedPin,        // cpu_offload_use_pin_memory: sets pin_memory of both offload sections
  kDeprecatedBoolStage,  // "zero_optimization": true/false (DeepSpeed's oldest format) -> stage 1 / 0
};

struct AliasSpec {
  const char* path;    // the alias's dotted path
  const char* target;  // the canonical path it maps to
  AliasKind kind;
  const char* note;  // docs
};

struct CrossRule {
  const char* id;    // stable name used by the validator to fetch `text`
  const char* keys;  // the keys involved (docs)
  const char* text;  // the rule, as errors and the reference state it
  bool at_validate;  // checked only by Config::Validate (needs the world size)
  bool warning;      // a warning, not an error
};

// The tables, in document order.
std::span<const KeySpec> Schema();
std::span<const AliasSpec> Aliases();
std::span<const CrossRule> CrossRules();

// nullptr when absent.
const KeySpec* FindKey(std::string_view path);
const AliasSpec* FindAlias(std::string_view path);
const CrossRule& FindRule(std::string_view id);  // ZERO_CHECKs that `id` exists

// The rule of a row in words ("integer >= 0, a multiple of 2"), shared by errors and the reference.
std::string RuleText(const KeySpec& k);
// The default as the reference shows it.
std::string DefaultText(const KeySpec& k);
// The "zero" column: "yes", "not implemented: only false accepted", ...
std::string SupportText(const KeySpec& k);

// The embedded default config (Config::Default()), also printed in the reference.
const char* DefaultConfigJson();

// A config validated at some world size, for a trainer that accumulates its own micro-steps (ShardedOptimizer):
// its micro-batch as the batch keys gave it there, one accumulation step, train_batch_size left to derive (micro x
// world), all three as given keys, so that the next Validate derives from these and not from the user's keys.
Config WithTrainerAccumulation(const Config& validated);

// Levenshtein distance, for "did you mean".
size_t EditDistance(std::string_view a, std::string_view b);

}  // namespace zero::internal
