// core/internal/status_util.h — rewording a Status for the caller's vocabulary without losing its payloads.
#pragma once

#include <string>

#include "zero/status.h"

namespace zero::internal {

// `status` with `message` in place of its message: the same code and every payload (the breadcrumbs among
// them). A wrapper uses it to say in its own words what the layer below it said in its ones.
Status Reworded(const Status& status, std::string message);

}  // namespace zero::internal
