// Engine::Create's agreement checks (shard/internal/agree.h).
#include "shard/internal/agree.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/internal/env.h"
#include "core/internal/config_diff.h"
#include "shard/internal/plan.h"
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

// The key of what groups ranks by host, as the messages name it: hpZ's, else qgZ's two hops, else hybrid sharding.
static const char* HostGroupingKey(bool hpz, bool qgz) {
  return hpz   ? "zero_optimization.zero_hpz_partition_size"
         : qgz ? "zero_optimization.zero_quantized_gradients"
               : "zero_optimization.mics_shard_size";
}

// The ranks-per-host count every rank gave, or 0 where they differ (or there are no ranks).
static int CommonRanksPerHost(const std::vector<HostPlace>& all) {
  if (all.empty()) return 0;
  for (const HostPlace& p : all) {
    if (p.ranks_per_host != all[0].ranks_per_host) return 0;
  }
  return all[0].ranks_per_host;
}

HostPlace LaunchedHostPlace(const Communicator& comm, int option_local_world_size, int ranks_per_host,
                            const MachineId& machine) {
  HostPlace p;
  p.ranks_per_host = ranks_per_host;
  if (!machine.id.empty()) p.machine = Fnv1a64(machine.id);
  const EnvLookup env = ProcessEnv();
  StatusOr<LaunchEnv> launch = ReadLaunchEnv(env);
  if (!launch.ok() || launch->local_world_size <= 0 || launch->rank != comm.rank() ||
      launch->world_size != comm.world_size()) {
    return p;
  }
  // A count of the trainer's own is its own numbering; the launcher's count passed on (as zero-gpt does) is not.
  if (option_local_world_size > 0 && option_local_world_size != launch->local_world_size) return p;
  // Only a local rank the launcher set (ReadLaunchEnv defaults a missing one to the rank).
  if (launch->source == "openmpi" && env("OMPI_COMM_WORLD_LOCAL_RANK")) p.launcher = 1;
  if (launch->source == "slurm" && env("SLURM_LOCALID")) p.launcher = 2;
  if (p.launcher != 0) p.local_rank = launch->local_rank;
  return p;
}

Status HostLayoutStatus(const std::vector<HostPlace>& all, bool hpz, bool qgz, bool hybrid) {
  const int world = static_cast<int>(all.size());
  if (!hpz && !qgz && !hybrid) return absl::OkStatus();  // nothing groups ranks by host
  // hpZ's groups and qgZ's hops follow the ranks-per-host count; hybrid's shard groups are mics_shard_size ranks.
  const bool by_count = hpz || qgz;
  const char* key = HostGroupingKey(hpz, qgz);
  // The size of the consecutive groups that stand for hosts: hpZ's host (its H divides it), qgZ's first hop, or
  // the hosts hybrid sharding's shard groups are meant to lie in (or be made of).
  auto group_of = [&](int r) {
    return hpz || !qgz ? all[r].ranks_per_host : QgzLocalRanks(world, all[r].ranks_per_host, /*hybrid=*/false);
  };
  for (int r = 1; r < world; ++r) {
    if (group_of(r) == group_of(0)) continue;
    // Hybrid sharding's groups are mics_shard_size consecutive ranks whatever the hosts hold: hosts of unequal
    // counts cannot be told from the counts alone, and nothing is checked.
    if (!by_count) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        key, ": the ranks disagree on the ranks per host (rank 0 has ", all[0].ranks_per_host, ", rank ", r, " has ",
        all[r].ranks_per_host, hpz ? "" : ", so they would take different hops",
        "): the hosts must hold equal numbers of ranks (EngineOptions::local_world_size, else the launcher's "
        "count, the same on every rank)"));
  }
  const int L = group_of(0);
  if (L <= 1 || L >= world) return absl::OkStatus();  // one host, or every rank its own: no group to misplace
  for (int r = 0; r < world; ++r) {
    const HostPlace& p = all[r];
    if (p.local_rank < 0 || p.local_rank == r % L) continue;
    const char* var = p.launcher == 1 ? "OMPI_COMM_WORLD_LOCAL_RANK" : "SLURM_LOCALID";
    const std::string where =
        by_count
            ? absl::StrCat(hpz ? "hpZ's host groups" : "qgZ's first hop", " of ", L, " consecutive ranks")
            : absl::StrCat("hosts of ", L, " consecutive ranks, which hybrid sharding's shard groups are laid over,");
    return absl::FailedPreconditionError(absl::StrCat(
        key, ": the launcher did not number the ranks host by host: rank ", r, " is local rank ", p.local_rank,
        " of its host (", var, ") where ", where, " put it at ", r % L, ", so a ", by_count ? "group" : "shard group",
        " would span hosts and its traffic cross them. Launch the ranks in blocks (",
        p.launcher == 1 ? "mpirun --map-by slot" : "srun --distribution=block", ")",
        by_count ? ", or give EngineOptions::local_world_size for a numbering of your own" : ""));
  }
  return absl::OkStatus();
}

Status CheckHostLayoutAgrees(HostCollectives& host, const HostPlace& mine, bool hpz, bool qgz, bool hybrid,
                             std::vector<HostPlace>* all_out) {
  Communicator* comm = host.comm();
  const int world = comm->world_size();
  if (world == 1) return absl::OkStatus();
  CommLabel label(comm, "Create: host layout check");
  // Small integers, exact in f32, and the machine's 64-bit hash as the bits of two floats (moved, never computed on).
  constexpr int kFields = 5;
  float send[kFields] = {static_cast<float>(mine.ranks_per_host), static_cast<float>(mine.local_rank),
                         static_cast<float>(mine.launcher)};
  std::memcpy(&send[3], &mine.machine, sizeof(mine.machine));
  std::vector<float> recv(kFields * static_cast<size_t>(world));
  ZERO_RETURN_IF_ERROR(host.AllGather(send, recv.data(), kFields));
  std::vector<HostPlace> all(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const float* f = &recv[kFields * static_cast<size_t>(r)];
    all[r] = {static_cast<int>(f[0]), static_cast<int>(f[1]), static_cast<int>(f[2])};
    std::memcpy(&all[r].machine, &f[3], sizeof(all[r].machine));
  }
  ZERO_RETURN_IF_ERROR(HostLayoutStatus(all, hpz, qgz, hybrid));
  if (all_out != nullptr) *all_out = std::move(all);
  return absl::OkStatus();
}

std::string HybridStraddleWarning(const std::vector<HostPlace>& all, int64_t shard_size) {
  const int64_t world = static_cast<int64_t>(all.size());
  if (shard_size <= 1) return "";
  const int64_t L = CommonRanksPerHost(all), G = shard_size;  // 0 where the counts differ: not told
  if (L <= 1 || L >= world || G % L == 0 || L % G == 0) return "";
  // The group holding ranks L - 1 and L (the first host's last and the second's first) is the first to straddle.
  const int64_t first = (L / G) * G;
  return absl::StrCat("zero_optimization.mics_shard_size: shard groups of ", G, " consecutive ranks over hosts of ", L,
                      " ranks: neither size divides the other, so shard groups straddle hosts (the first: ranks ",
                      first, "-", first + G - 1,
                      ") and their parameter gathers and gradient reductions cross them; a mics_shard_size that "
                      "divides ",
                      L, " keeps each group inside a host, a multiple of ", L, " makes it whole hosts");
}

std::pair<int, int> FirstRunAcrossMachines(const std::vector<HostPlace>& all, int size) {
  const int world = static_cast<int>(all.size());
  if (size <= 1) return {-1, -1};
  for (const HostPlace& p : all) {
    if (p.machine == 0) return {-1, -1};
  }
  for (int r = 1; r < world; ++r) {
    if (r % size != 0 && all[r].machine != all[r - 1].machine) return {r - 1, r};
  }
  return {-1, -1};
}

std::pair<int, int> FirstHostAcrossMachines(const std::vector<HostPlace>& all) {
  return FirstRunAcrossMachines(all, CommonRanksPerHost(all));  // a count of 0 (they differ) finds none
}

StatusOr<std::string> MachinesWarning(HostCollectives& host, const std::vector<HostPlace>& all, int hpz, bool qgz,
                                      int64_t shard_size, const MachineId& mine) {
  const auto [a, b] = FirstHostAcrossMachines(all);
  if (a < 0) return std::string();
  CommLabel label(host.comm(), "Create: machine names");
  ZERO_ASSIGN_OR_RETURN(std::vector<std::string> names, host.AllGatherStrings(mine.name));
  const int world = static_cast<int>(all.size());
  const int L = all[0].ranks_per_host;
  // Which of the engine's groups holds two machines: its traffic crosses between them. Groups that lie on one
  // machine each cross nothing, but the count still misplaces StepResult's bytes inside and across hosts.
  auto spans = [&](int size, const char* what, const char* traffic) -> std::string {
    const int p = FirstRunAcrossMachines(all, size).first;
    if (p < 0) {
      return absl::StrCat(what, " of ", size, " ranks each lie on one machine, so none of their traffic crosses; ",
                          "StepResult's bytes inside and across hosts are counted by hosts of ", L);
    }
    const int first = p / size * size;
    return absl::StrCat("one of ", what, " (ranks ", first, "-", first + size - 1, ") spans two machines, so its ",
                        traffic, " cross between them");
  };
  const char* key = HostGroupingKey(hpz > 1, qgz);
  std::string effect;
  if (hpz > 1) {
    effect = spans(hpz, "hpZ's groups", "backward gathers");
  } else if (qgz) {
    const int hop = QgzLocalRanks(world, L, /*hybrid=*/false);
    effect = hop < world ? spans(hop, "qgZ's first hops", "gradient exchanges meant for inside a host")
                         : std::string("qgZ takes one hop over every rank, which these machines do not change");
  } else {
    effect = shard_size <= L
                 ? spans(static_cast<int>(shard_size), "the shard groups", "parameter gathers and gradient reductions")
                 : absl::StrCat("the shard groups of ", shard_size, " ranks were meant to be made of whole hosts of ",
                                L, ", and those hosts are not the machines");
  }
  const std::string& na = names[static_cast<size_t>(a)];
  const std::string& nb = names[static_cast<size_t>(b)];
  const std::string same_name = na == nb ? ": machines of one name with different boot ids" : "";
  return absl::StrCat(key, ": the engine takes each ", L, " consecutive ranks for one host ",
                      "(EngineOptions::local_world_size, else the launcher's count), but ranks ", a, " and ", b,
                      " run on different machines (rank ", a, " on \"", na, "\", rank ", b, " on \"", nb, "\"",
                      same_name, "): ", effect, ". Launch the ranks machine by machine, ", L, " to a machine, ",
                      "or give the count each machine runs; where these identities mislead, set ZERO_HOSTID to one ",
                      "value per machine");
}

}  // namespace zero::internal
