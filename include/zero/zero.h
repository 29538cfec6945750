// zero/zero.h — umbrella header: everything a trainer needs to link zero in.
//
//   #include "zero/zero.h"
//
// See README.md for the quick start and include/zero/engine.h for the trainer's view.
#pragma once

#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/dtype.h"
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
