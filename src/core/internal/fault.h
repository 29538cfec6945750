// core/internal/fault.h — a test hook that turns a named phase of one rank into a real signal to its own
// process, so the fault-injection suite (tests/faults) can kill or stop a rank at exactly that point.
// defines: MaybeInjectFault.
//
//   ZERO_TEST_FAULT=<phase>:<rank>:<KILL|STOP>[:<step>]
//
// fires at the first time `rank` reaches `phase` once it has applied at least `step` optimizer steps (default
// 0), after printing "zero: injecting SIG<sig> at <phase> on rank <rank> (step <k>)" to stderr. Phases:
// rendezvous, finalize, gather, reduce, step.norm, step.optimizer, step.refresh, save, load. Without the
// variable (every production run) the hook is one load of a cached flag.
#pragma once

#include <cstdint>

namespace zero::internal {

void MaybeInjectFault(const char* phase, int rank, int64_t step);

}  // namespace zero::internal
