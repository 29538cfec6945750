// Fuzz target: the JSON config parser (zero::Config::FromJsonString), with what a trainer does next: ToJson,
// Resolve of every "auto" key, Validate at several world sizes.
//
// Properties, for every input: no crash, hang or exception escapes; a rejected config is kInvalidArgument or
// kUnimplemented with a message; an accepted one prints (ToJson) as JSON that parses back to an equal config;
// Validate and Resolve either succeed or leave the config as it was.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "zero/config.h"

namespace {

using zero::Config;
using zero::Status;

bool Rejection(const Status& s) {
  return (s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kUnimplemented) &&
         !s.message().empty();
}

void CheckRoundTrip(const Config& c, const char* after) {
  const std::string printed = c.ToJson();
  zero::StatusOr<Config> again = Config::FromJsonString(printed);
  FUZZ_CHECK(again.ok(),
             std::string(after) + ": ToJson does not parse back: " + again.status().ToString() + "\n" + printed);
  FUZZ_CHECK(*again == c, std::string(after) + ": ToJson parses back to another config:\n" + printed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zero::fuzz::QuietLogs();
  const std::string text(reinterpret_cast<const char*>(data), size);
  zero::StatusOr<Config> parsed = Config::FromJsonString(text);
  if (!parsed.ok()) {
    FUZZ_CHECK(Rejection(parsed.status()), parsed.status().ToString());
    return 0;
  }
  Config c = *std::move(parsed);
  CheckRoundTrip(c, "parse");

  // Fill every "auto" key with a value picked by the input (valid or not for that key).
  static const char* const kValues[] = {"1",       "0",     "-1",           "8",  "3.5", "1e300",   "true", "null",
                                        "\"cpu\"", "\"x\"", "[0.9, 0.999]", "{}", "2e9", "\"auto\""};
  constexpr size_t kNumValues = sizeof(kValues) / sizeof(kValues[0]);
  size_t pick = size;
  for (size_t i = 0; i < size; i += 7) pick = pick * 31 + data[i];
  const std::vector<std::string> unresolved = c.unresolved();
  for (const std::string& path : unresolved) {
    const Config before = c;
    const Status s = c.ResolveJson(path, kValues[pick++ % kNumValues]);
    if (!s.ok()) FUZZ_CHECK(c == before, "a failed Resolve of " + path + " changed the config: " + s.ToString());
  }
  for (int world : {1, 3, 64}) {
    const Config before = c;
    const Status s = c.Validate(world);
    if (!s.ok()) {
      FUZZ_CHECK(Rejection(s), s.ToString());
      FUZZ_CHECK(c == before, "a failed Validate changed the config: " + s.ToString());
    } else {
      CheckRoundTrip(c, "Validate");
    }
  }
  return 0;
}
