// zero/zero.h — umbrella header: everything a trainer needs to link zero in.
//
//   #include "zero/zero.h"
//
// See README.md for the quick start and include/zero/engine.h for the trainer's view.
//
// The headers included here are the trainer's API, stable within a major version; each opens with its contract.
// zero/advanced/ holds building blocks a trainer does not need (the CUDA kernels, the device pool, the engine's
// communicator extensions and counters), which may change between minor versions and are not included here
// (docs/design.md, "Which headers are stable"). tests/install/public_api_test.cmake keeps the two apart.
#pragma once

#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/elastic.h"
#include "zero/engine.h"
#include "zero/estimate.h"
#include "zero/features.h"
#include "zero/logging.h"
#include "zero/memory.h"
#include "zero/mixed_precision.h"
#include "zero/optimizer.h"
#include "zero/recompute.h"
#include "zero/sharded_optimizer.h"
#include "zero/status.h"
#include "zero/store.h"
#include "zero/work.h"
