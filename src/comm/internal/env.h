// Internal: launcher variables and environment overrides for communicators.
//
// Options are plain structs; environment variables only override them (STYLE point 13). The variables read
// here are listed in docs/guide/launching.md.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/time/time.h"

#include "zero/communicator.h"
#include "zero/status.h"

namespace zero::internal {

// Returns the value of an environment variable or nullopt; injectable for tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup ProcessEnv();

// Applies ZERO_COMM_CHECK (1/true/on -> check_order) and ZERO_COMM_TIMEOUT_S (seconds, > 0) to `options`.
// kInvalidArgument naming the variable when a value does not parse.
StatusOr<CommOptions> ApplyCommEnvOverrides(CommOptions options, const EnvLookup& env);

// The range of a communicator's timeout, the range of the config key comm_timeout_s (src/core/config_schema.cc):
// 1 ms is the resolution of the stores' and Gloo's timeouts, and above 1e9 s Gloo's deadlines (steady_clock
// nanoseconds) overflow.
inline constexpr double kMinCommTimeoutS = 0.001;
inline constexpr double kMaxCommTimeoutS = 1e9;
// kInvalidArgument with the range unless `timeout` lies in it.
Status CheckCommTimeout(absl::Duration timeout);

// This process's job id: ZERO_JOB_ID (zero-run sets it), else TORCHELASTIC_RUN_ID (torchrun), else SLURM_JOB_ID;
// "" when none is set.
std::string JobIdFromEnv(const EnvLookup& env);

// Where and how this process was launched, from torchrun, OpenMPI, Slurm or zero-run variables.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Ranks on this host, as the launcher says: LOCAL_WORLD_SIZE (torchrun, zero-run), OMPI_COMM_WORLD_LOCAL_SIZE
  // (OpenMPI), this node's entry of SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE, at SLURM_NODEID
  // (Slurm); 0 where the launcher does not say.
  int local_world_size = 0;
  std::string source = "default";  // "torchrun", "openmpi", "slurm" or "default" (no launcher found)
  std::string size_from;           // the variable world_size came from ("WORLD_SIZE", ...); "" without a launcher
  std::string store_dir;           // ZERO_STORE_DIR (zero-run), "" if unset
  std::string master_addr;         // ZERO_MASTER_ADDR, else MASTER_ADDR; "" if unset
  int master_port = 0;             // the port rank 0's store listens on (below); 0 if unset
  std::string port_from;           // how master_port was chosen, for messages ("MASTER_PORT", ...)
};

// Reads, in this order of precedence: RANK/WORLD_SIZE/LOCAL_RANK (torchrun, zero-run),
// OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK (OpenMPI), SLURM_PROCID/SLURM_STEP_NUM_TASKS (else
// SLURM_NTASKS)/SLURM_LOCALID (Slurm); plus ZERO_STORE_DIR, MASTER_ADDR, MASTER_PORT; and the ranks on this host
// (LaunchEnv::local_world_size). kInvalidArgument naming the variable for unparsable or inconsistent values (e.g.
// RANK >= WORLD_SIZE, or RANK without WORLD_SIZE), and for Slurm's variables of a world above 1 without
// SLURM_STEP_NUM_TASKS: an sbatch script run without srun, one process.
// The store's port: ZERO_MASTER_PORT if set; else MASTER_PORT + 1 when TORCHELASTIC_USE_AGENT_STORE is true
// (torchrun of torch >= 2.4: its agent already serves torch's own store on MASTER_PORT, so zero's rank 0
// cannot listen there); else MASTER_PORT. ZERO_MASTER_ADDR likewise overrides MASTER_ADDR.
StatusOr<LaunchEnv> ReadLaunchEnv(const EnvLookup& env);
// Whether a launcher's rank variable is set (Communicator::Launched).
bool HasLauncherRank(const EnvLookup& env);
// What FromEnv appends to a rendezvous that timed out: the variables that gave this process its rank and world
// size; "" without a launcher.
std::string LaunchHint(const LaunchEnv& launch);
// Slurm's tasks on node `node` from a SLURM_TASKS_PER_NODE-style list ("2(x3),1": 2 on nodes 0-2, 1 on node 3);
// 0 when the list does not parse or has no such node.
int SlurmTasksOnNode(const std::string& list, int node);
// LaunchEnv::local_world_size of a launch whose variables read without error; 0 otherwise
// (Communicator::LaunchedLocalWorldSize).
int LaunchedLocalWorldSize(const EnvLookup& env);
// LaunchEnv::world_size of a launch whose rank variable is set and whose variables read without error; 0 otherwise
// (Communicator::LaunchedWorldSize).
int LaunchedWorldSize(const EnvLookup& env);

// "localhost", "::1" or 127.x.y.z.
bool IsLoopbackHost(const std::string& host);

// The machine this process runs on: `id` tells machines apart, `name` is what a message calls it. ZERO_HOSTID
// where set (an operator's word: one value per machine); else the kernel's boot id (`boot_id_path`, one per booted
// kernel, so containers on one machine share it and machines that share a host name do not) named by the host name;
// else the host name alone; id "" where none can be read. NCCL's own host identity (NCCL_HOSTID, else host name and
// boot id together) tells containers with host names of their own apart; this does not: they share the machine.
struct MachineId {
  std::string id, name;
};
MachineId ThisHost(const EnvLookup& env, const std::string& boot_id_path = "/proc/sys/kernel/random/boot_id");

}  // namespace zero::internal
