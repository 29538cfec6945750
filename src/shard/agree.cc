// Engine::Create's agreement checks (shard/internal/agree.h).
#include "shard/internal/agree.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/internal/env.h"
#include "core/internal/config_diff.h"
#include "zero/logging.h"

namespace zero::internal {

Status CheckTimeoutAgrees(const Config& cfg, const Communicator& comm) {
  const absl::Duration have = comm.timeout();
  const absl::Duration want = absl::Seconds(cfg.comm_timeout_s);
  const absl::Duration def = CommOptions{}.timeout;
  if (have == absl::ZeroDuration() || have == want) return absl::OkStatus();
  if (ProcessEnv()("ZERO_COMM_TIMEOUT_S")) {
    ZERO_LOG_ONCE(INFO) << "ZERO_COMM_TIMEOUT_S sets the communicator's timeout to " << absl::FormatDuration(have)
                        << " over the config's comm_timeout_s " << cfg.comm_timeout_s;
    return absl::OkStatus();
  }
  if (want == def) return absl::OkStatus();  // the config leaves the timeout to the communicator
  return absl::InvalidArgumentError(absl::StrCat(
      "comm_timeout_s: the config sets ", cfg.comm_timeout_s, " s but the communicator was created with a timeout of ",
      absl::FormatDuration(have), have == def ? " (CommOptions' default)" : "",
      "; the config is the one source of truth for it: create the communicator with "
      "Communicator::FromEnv(backend, config), or set CommOptions::timeout = absl::Seconds(config.comm_timeout_s) "
      "(docs/internals/comm.md, \"Timeouts\")"));
}

Status CheckConfigAgrees(HostCollectives& host, const Config& cfg) {
  Communicator* comm = host.comm();
  const int world = comm->world_size();
  if (world == 1) return absl::OkStatus();
  CommLabel label(comm, "Create: config check");
  const std::string mine = cfg.ToJson(-1);
  const uint64_t h = Fnv1a64(mine);
  float send[2];
  std::memcpy(send, &h, sizeof(h));
  std::vector<float> recv(2 * static_cast<size_t>(world));
  ZERO_RETURN_IF_ERROR(host.AllGather(send, recv.data(), 2));
  bool agree = true;
  for (int r = 1; r < world; ++r) agree = agree && std::memcmp(&recv[0], &recv[2 * r], sizeof(h)) == 0;
  if (agree) return absl::OkStatus();
  // Every rank saw the same hashes, so every rank takes this path and the exchange below lines up.
  ZERO_ASSIGN_OR_RETURN(std::vector<std::string> all, host.AllGatherStrings(mine));
  std::string msg =
      "the ranks were created with different configs (every rank must run the same config; the values after "
      "validation, defaults filled, are compared):";
  for (int r = 1; r < world; ++r) {
    const std::string diff = FirstConfigDifference(all[0], all[r]);
    if (!diff.empty()) absl::StrAppend(&msg, "\n  rank 0 vs rank ", r, ": ", diff);
  }
  return absl::FailedPreconditionError(msg);
}

}  // namespace zero::internal
