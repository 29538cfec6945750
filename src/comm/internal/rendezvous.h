// Internal: what every rank of one communicator must agree on before any transport is built (the job and the
// world size), checked through the rendezvous store by CreateGloo and CreateNccl.
#pragma once

#include <string>

#include "absl/time/time.h"
#include "zero/communicator.h"
#include "zero/status.h"
#include "zero/store.h"

namespace zero::internal {

// The store namespace of a job's communicators: `prefix`, or `prefix/job-<hash of job_id>` when the job has an
// id, so that ranks of another job that reach the same store (two jobs on one MASTER_PORT) never take this
// job's rendezvous keys, even when they arrive first.
std::string JobScope(const std::string& prefix, const std::string& job_id);

// Before the k-th communicator's transport is built (`key_prefix`: its fresh keys under JobScope): every rank
// compares its job id with the one of the rank 0 that serves the store (`prefix/job`, written once by the
// first rank 0), and its world size with rank 0's; rank 0 compares every rank's and publishes a verdict the
// others wait for. So a disagreement fails every rank that reached the rendezvous, with an error naming both
// sides (kFailedPrecondition), instead of Gloo's "sizeof(impl_) == bytes.size()" or a pairing with another
// job's ranks. Each wait is bounded by `timeout` (kDeadlineExceeded naming the rank that never arrived).
Status AgreeAtRendezvous(Store& store, const std::string& prefix, const std::string& key_prefix, int rank, int world,
                         const std::string& job_id, absl::Duration timeout);

}  // namespace zero::internal
