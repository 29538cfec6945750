// Fixture for public_api_headers_fail: a header zero.h does not include, with a second GradStatsResult.
#pragma once

namespace zero {

struct GradStatsResult {};

}  // namespace zero
