// core/internal/json_depth.h — a bound on how deeply JSON input may nest, checked before it is parsed.
// defines: kMaxJsonDepth, JsonTooDeepAt.
//
// nlohmann's parser is iterative, but dump(), comparison and copy recurse once per level: a config, meta.json or
// safetensors header of a few hundred thousand '[' overflowed the stack (found by fuzz/; docs/internals/fuzzing.md).
// Every JSON zero reads from a user or a file is checked here first; the deepest legitimate input nests 5 levels.
#pragma once

#include <cstddef>
#include <string_view>

namespace zero::internal {

inline constexpr int kMaxJsonDepth = 128;

// The byte offset of the first '[' or '{' that opens a level deeper than max_depth, or npos when there is none.
// Brackets inside strings and inside // and /* */ comments (which the config parser allows) do not count.
size_t JsonTooDeepAt(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace zero::internal
