// Internal: where two configs' canonical JSON (Config::ToJson) differ, for the ranks' config agreement check.
#pragma once

#include <string>

namespace zero::internal {

// "<dotted path>: <value in a> vs <value in b>" for the first key (in a's order) whose value differs, or "" when
// the two texts hold the same values. Texts that do not parse are compared as a whole.
std::string FirstConfigDifference(const std::string& json_a, const std::string& json_b);

}  // namespace zero::internal
