// shard/internal/agree.h — what Engine::Create makes sure of before training: the communicator's timeout is the
// config's, and every rank runs the same validated config. defines: CheckTimeoutAgrees, CheckConfigAgrees.
#pragma once

#include "shard/internal/registration.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/status.h"

namespace zero::internal {

// One source of truth for comm_timeout_s (docs/internals/comm.md, "Timeouts"): a communicator whose timeout is not the
// config's is refused (kInvalidArgument naming both), except where one side was left at the 1800 s default: a
// communicator left at the default while the config sets comm_timeout_s is refused too (the README's old
// pattern, FromEnv(kGloo) + Create(cfg, comm), silently waited 30 min); a config left at the default keeps the
// communicator's explicit timeout; ZERO_COMM_TIMEOUT_S, an operator's override, wins over both. Local, no
// collective.
Status CheckTimeoutAgrees(const Config& cfg, const Communicator& comm);

// The ranks' validated configs are equal: a hash of the canonical JSON (Config::ToJson) is all-gathered; where it
// differs, the texts are, and every rank fails with kFailedPrecondition naming the first differing key and its
// values ("rank 0 has zero_optimization.stage 2 where rank 1 has 3"). Collective (every rank, at Create).
Status CheckConfigAgrees(HostCollectives& host, const Config& cfg);

}  // namespace zero::internal
