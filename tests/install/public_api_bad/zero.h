// A stable API that breaks every rule tests/install/public_api_test.cmake enforces: the check must name each.
#pragma once

#include "zero/engine.h"
