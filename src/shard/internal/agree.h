// shard/internal/agree.h — what Engine::Create makes sure of before training: the communicator's timeout is the
// config's, every rank runs the same validated config, and the hosts ZeRO++ and hybrid sharding group ranks by are
// the launcher's (and, said rather than refused, the machines').
// defines: CheckTimeoutAgrees, CheckConfigAgrees, HostPlace, LaunchedHostPlace, HostLayoutStatus,
// CheckHostLayoutAgrees, HybridStraddleWarning, FirstRunAcrossMachines, FirstHostAcrossMachines, MachinesWarning.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/internal/env.h"
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

// Where one rank stands on its host, as hpZ, qgZ's two hops and hybrid sharding group ranks: `ranks_per_host`
// consecutive ranks per host (EngineOptions::local_world_size, else the launcher's, else 1), and, where the
// launcher numbered this rank itself, the place it gave it. Only OpenMPI and Slurm can number ranks other than host
// by host (mpirun --map-by node, srun --distribution=cyclic); torchrun and zero-run always number them in blocks.
// `machine`: a hash of the machine the rank runs on (ThisHost's id; 0 where unknown), whatever the launcher says.
struct HostPlace {
  int ranks_per_host = 1;
  int local_rank = -1;  // OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID; -1 where not checked
  int launcher = 0;     // 1: OpenMPI, 2: Slurm, 0: none checked
  uint64_t machine = 0;
};

// This rank's place: the launcher's local rank only where the engine's communicator is the launched world (its
// rank and size are the launcher's) and the ranks per host are the launcher's too (the launcher gave a count, and
// EngineOptions::local_world_size is 0 or that count); else local_rank -1.
HostPlace LaunchedHostPlace(const Communicator& comm, int option_local_world_size, int ranks_per_host,
                            const MachineId& machine);
// Decides from every rank's place (`all`, in rank order) whether the hosts that hpZ (`hpz`), qgZ's two hops
// (`qgz`, not under hybrid sharding) and hybrid sharding (`hybrid`: its shard groups of mics_shard_size > 1
// consecutive ranks are meant to lie inside hosts or be made of whole ones, its replicas' all-reduce to cross them)
// assume are the hosts the ranks run on: kFailedPrecondition naming the key (hpZ's, else qgZ's, else mics_shard_size)
// when the ranks take different hop layouts for qgZ (their ranks per host differ) or differ in ranks per host under
// hpZ, or when a rank that the launcher placed at local rank l sits at another place of its consecutive group (the
// groups would span hosts and their traffic cross them). Hybrid sharding alone checks places only where every rank
// has the same count. The same on every rank for the same `all`.
Status HostLayoutStatus(const std::vector<HostPlace>& all, bool hpz, bool qgz, bool hybrid = false);
// Gathers every rank's place and applies HostLayoutStatus; `all`, where given, receives the places. Collective
// (every rank, at Create), and only where the config asks for hpZ, qgZ or hybrid sharding, so every rank calls it
// or none does.
Status CheckHostLayoutAgrees(HostCollectives& host, const HostPlace& mine, bool hpz, bool qgz, bool hybrid,
                             std::vector<HostPlace>* all = nullptr);
// What is said (not refused) of hybrid sharding's shard groups of `shard_size` consecutive ranks over hosts of the
// ranks' common count: where neither size divides the other, some group straddles two hosts, and this names the key,
// both sizes and the first such group; "" where none straddles, or where it cannot be told (one host, no count, or
// ranks whose counts differ, as HostLayoutStatus leaves unequal hosts unchecked for hybrid sharding).
std::string HybridStraddleWarning(const std::vector<HostPlace>& all, int64_t shard_size);

// The first two ranks, in rank order, that one run of `size` consecutive ranks (ranks k·size to k·size + size - 1)
// holds on different machines; {-1, -1} where there are none, where size <= 1, or where a machine is unknown (0).
std::pair<int, int> FirstRunAcrossMachines(const std::vector<HostPlace>& all, int size);
// The same for the hosts the engine assumes: runs of the ranks' common ranks-per-host count (the launcher's word or
// EngineOptions::local_world_size); {-1, -1} where the counts differ or are 1. The same on every rank for the same
// `all`.
std::pair<int, int> FirstHostAcrossMachines(const std::vector<HostPlace>& all);
// What rank 0 says (not refused: the run is correct) where FirstHostAcrossMachines finds two ranks of one assumed
// host on different machines: the key of what groups ranks by host (hpZ's, else qgZ's, else mics_shard_size), the
// count, both ranks and their machines' names (gathered here, `mine` this rank's), and which of the engine's
// groups, if any, does span machines: hpZ's groups of `hpz` ranks (> 1: on), qgZ's first hop (`qgz`: on, not under
// hybrid sharding), hybrid sharding's shard groups of `shard_size` ranks (> 1: on). Collective where `all` holds
// such a pair (every rank decides alike from `all`); "" and no collective where it holds none.
StatusOr<std::string> MachinesWarning(HostCollectives& host, const std::vector<HostPlace>& all, int hpz, bool qgz,
                                      int64_t shard_size, const MachineId& mine);

}  // namespace zero::internal
