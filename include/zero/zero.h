// zero/zero.h — umbrella header: everything a trainer needs to link zero in.
//
//   #include "zero/zero.h"
//
// See README.md for the quick start and include/zero/engine.h for the trainer's view.
#pragma once

#include "zero/dtype.h"
#include "zero/features.h"
#include "zero/logging.h"
#include "zero/status.h"
