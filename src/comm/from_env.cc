// Communicator::FromEnv and the environment variables of the comm layer (listed in docs/guide/launching.md).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "comm/internal/env.h"
#include "core/internal/status_util.h"
#include "zero/communicator.h"
#include "zero/logging.h"

namespace zero {
namespace internal {
namespace {

StatusOr<int> ParseInt(const std::string& name, const std::string& value) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "='", value, "' is not an integer"));
  }
  return v;
}

// 1/true/on/yes or 0/false/off/no/"" in any case (torchrun writes Python's "True"); nullopt for anything else.
std::optional<bool> ParseBool(const std::string& value) {
  const std::string s = absl::AsciiStrToLower(value);
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no" || s.empty()) return false;
  return std::nullopt;
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

StatusOr<CommOptions> ApplyCommEnvOverrides(CommOptions options, const EnvLookup& env) {
  if (auto v = env("ZERO_COMM_CHECK")) {
    const std::optional<bool> on = ParseBool(*v);
    if (!on) return absl::InvalidArgumentError(absl::StrCat("ZERO_COMM_CHECK='", *v, "' is not one of 1/0/true/false"));
    options.check_order = *on;
  }
  if (auto v = env("ZERO_COMM_TIMEOUT_S")) {
    double seconds = 0;
    if (!absl::SimpleAtod(*v, &seconds) || !(seconds >= kMinCommTimeoutS && seconds <= kMaxCommTimeoutS)) {
      return absl::InvalidArgumentError(absl::StrCat("ZERO_COMM_TIMEOUT_S='", *v, "' is not a number of seconds in [",
                                                     kMinCommTimeoutS, ", ", kMaxCommTimeoutS, "]"));
    }
    options.timeout = absl::Seconds(seconds);
  }
  return options;
}

Status CheckCommTimeout(absl::Duration timeout) {
  if (timeout >= absl::Seconds(kMinCommTimeoutS) && timeout <= absl::Seconds(kMaxCommTimeoutS)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("comm_timeout_s (CommOptions::timeout) must be in [", kMinCommTimeoutS,
                                                 ", ", kMaxCommTimeoutS, "] seconds, got ",
                                                 absl::FormatDuration(timeout)));
}

std::string JobIdFromEnv(const EnvLookup& env) {
  for (const char* name : {"ZERO_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
    if (auto v = env(name); v && !v->empty()) return *v;
  }
  return "";
}

namespace {

// The launchers FromEnv understands, in order of precedence.
struct Source {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: Slurm, whose tasks per node come as a list (SlurmTasksOnNode)
  // Read before `size` where set: srun's SLURM_STEP_NUM_TASKS, the tasks of this step. SLURM_NTASKS is the
  // allocation's count, which srun overwrites with the step's unless told to keep it (srun --preserve-env), and
  // which an sbatch batch script sees too.
  const char* step_size = nullptr;
};
constexpr Source kSources[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_STEP_NUM_TASKS"},
};

// This node's tasks under Slurm: srun's SLURM_STEP_TASKS_PER_NODE (the step's layout), else the allocation's
// SLURM_TASKS_PER_NODE, at SLURM_NODEID. Slurm writes these, not the user, so a value that does not parse leaves
// the count unknown (0) rather than failing the rendezvous.
int SlurmLocalTasks(const EnvLookup& env) {
  int node = 0;
  auto id = env("SLURM_NODEID");
  if (!id || !absl::SimpleAtoi(*id, &node)) return 0;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (auto list = env(name)) return SlurmTasksOnNode(*list, node);
  }
  return 0;
}

}  // namespace

int SlurmTasksOnNode(const std::string& list, int node) {
  if (node < 0) return 0;
  int64_t first = 0;  // the first node of the current entry
  int found = 0;      // the whole list is read, so that a list malformed anywhere counts as unknown
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    int tasks = 0;
    int64_t repeat = 1;
    const size_t paren = entry.find("(x");
    if (paren != absl::string_view::npos) {
      if (!absl::EndsWith(entry, ")") ||
          !absl::SimpleAtoi(entry.substr(paren + 2, entry.size() - paren - 3), &repeat) || repeat < 1) {
        return 0;
      }
      entry = entry.substr(0, paren);
    }
    if (!absl::SimpleAtoi(entry, &tasks) || tasks < 1) return 0;
    if (found == 0 && node < first + repeat) found = tasks;
    first += repeat;
  }
  return found;
}

std::string LaunchHint(const LaunchEnv& launch) {
  for (const Source& src : kSources) {
    if (launch.source != src.name) continue;
    return absl::StrCat(" [this process is rank ", launch.rank, " of ", launch.world_size, " by ", src.rank, " and ",
                        launch.size_from, "]");
  }
  return "";
}

bool HasLauncherRank(const EnvLookup& env) {
  for (const Source& src : kSources) {
    if (env(src.rank)) return true;
  }
  return false;
}

StatusOr<LaunchEnv> ReadLaunchEnv(const EnvLookup& env) {
  LaunchEnv out;
  for (const Source& src : kSources) {
    auto rank = env(src.rank);
    std::optional<std::string> size = src.step_size != nullptr ? env(src.step_size) : std::nullopt;
    const char* size_name = size ? src.step_size : src.size;
    if (!size) size = env(src.size);
    if (!rank && !size) continue;
    // An sbatch script submitted without a task count (no --ntasks, no --ntasks-per-node) gets no SLURM_NTASKS
    // (Slurm's env_array_for_batch_job writes it only for a count it was given), only SLURM_PROCID=0 for its one
    // process: a world of one.
    if (src.step_size != nullptr && rank && !size && *rank == "0") size = "1";
    if (!rank || !size) {
      return absl::InvalidArgumentError(absl::StrCat("launcher variables incomplete: ", rank ? src.rank : size_name,
                                                     " is set but ", rank ? size_name : src.rank, " is not"));
    }
    ZERO_ASSIGN_OR_RETURN(out.rank, ParseInt(src.rank, *rank));
    ZERO_ASSIGN_OR_RETURN(out.world_size, ParseInt(size_name, *size));
    if (out.world_size < 1 || out.rank < 0 || out.rank >= out.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(src.rank, "=", out.rank, " is not in [0, ", size_name, "=", out.world_size, ")"));
    }
    // Slurm runs an sbatch script as one process whose variables say task 0 of the allocation's SLURM_NTASKS
    // (slurmstepd sets SLURM_PROCID for it as for any task, always 0), but only srun's tasks get
    // SLURM_STEP_NUM_TASKS. A trainer started in the script itself would wait comm_timeout_s (30 minutes by
    // default) for ranks that never come; it is told at once instead. Another rank without the step's count was not
    // set by Slurm for this process, and is said so.
    if (src.step_size != nullptr && size_name != src.step_size && out.world_size > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          src.rank, "=", out.rank, " and ", src.size, "=", out.world_size, " are set but ", src.step_size, " is not: ",
          out.rank == 0 ? "these are an sbatch batch script's variables, and Slurm runs the script as one process"
                        : "srun did not start this process",
          "; start the ", out.world_size, " ranks with srun (it sets ", src.step_size,
          " for every task it starts), or launch them otherwise (torchrun, zero-run, mpirun)"));
    }
    out.size_from = size_name;
    out.local_rank = out.rank;
    if (auto local = env(src.local_rank)) {
      ZERO_ASSIGN_OR_RETURN(out.local_rank, ParseInt(src.local_rank, *local));
      if (out.local_rank < 0) {
        return absl::InvalidArgumentError(absl::StrCat(src.local_rank, "=", out.local_rank, " is negative"));
      }
    }
    if (src.local_size == nullptr) {
      out.local_world_size = SlurmLocalTasks(env);
    } else if (auto local = env(src.local_size)) {
      ZERO_ASSIGN_OR_RETURN(out.local_world_size, ParseInt(src.local_size, *local));
      if (out.local_world_size < 1 || out.local_world_size > out.world_size) {
        return absl::InvalidArgumentError(absl::StrCat(src.local_size, "=", out.local_world_size, " is not in [1, ",
                                                       src.size, "=", out.world_size, "]"));
      }
    }
    out.source = src.name;
    break;
  }
  if (auto dir = env("ZERO_STORE_DIR")) out.store_dir = *dir;
  out.master_addr = env("ZERO_MASTER_ADDR").value_or(env("MASTER_ADDR").value_or(""));
  auto port_of = [&](const char* name) -> Status {
    auto port = env(name);
    if (!port) return absl::OkStatus();
    ZERO_ASSIGN_OR_RETURN(out.master_port, ParseInt(name, *port));
    if (out.master_port < 1 || out.master_port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(name, "=", out.master_port, " is not a TCP port"));
    }
    out.port_from = name;
    return absl::OkStatus();
  };
  ZERO_RETURN_IF_ERROR(port_of("MASTER_PORT"));
  if (env("ZERO_MASTER_PORT")) {
    ZERO_RETURN_IF_ERROR(port_of("ZERO_MASTER_PORT"));
  } else if (out.master_port > 0 && ParseBool(env("TORCHELASTIC_USE_AGENT_STORE").value_or("")).value_or(false)) {
    // torchrun's agent serves torch's store on MASTER_PORT; zero's rank 0 serves its own beside it.
    if (out.master_port == 65535) {
      return absl::InvalidArgumentError(
          "MASTER_PORT=65535 under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE): zero's store takes "
          "MASTER_PORT + 1, which is not a TCP port; set ZERO_MASTER_PORT");
    }
    out.master_port += 1;
    out.port_from = "MASTER_PORT + 1 (torchrun's agent serves its own store on MASTER_PORT)";
  }
  return out;
}

int LaunchedLocalWorldSize(const EnvLookup& env) {
  StatusOr<LaunchEnv> launch = ReadLaunchEnv(env);
  return launch.ok() ? launch->local_world_size : 0;
}

int LaunchedWorldSize(const EnvLookup& env) {
  if (!HasLauncherRank(env)) return 0;
  StatusOr<LaunchEnv> launch = ReadLaunchEnv(env);
  return launch.ok() ? launch->world_size : 0;
}

MachineId ThisHost(const EnvLookup& env, const std::string& boot_id_path) {
  if (std::optional<std::string> id = env("ZERO_HOSTID"); id && !id->empty()) {
    return {*id, absl::StrCat("ZERO_HOSTID=", *id)};
  }
  char buf[256] = {};  // zeroed: a name gethostname truncates stays terminated
  const std::string host = ::gethostname(buf, sizeof(buf) - 1) == 0 ? std::string(buf) : std::string();
  std::string boot;
  std::ifstream f(boot_id_path);
  if (f && std::getline(f, boot) && !boot.empty()) {
    return {boot, host.empty() ? absl::StrCat("boot id ", boot) : host};
  }
  return {host, host};
}

}  // namespace internal

bool Communicator::Launched() { return internal::HasLauncherRank(internal::ProcessEnv()); }

int Communicator::LaunchedLocalWorldSize() { return internal::LaunchedLocalWorldSize(internal::ProcessEnv()); }

int Communicator::LaunchedWorldSize() { return internal::LaunchedWorldSize(internal::ProcessEnv()); }

StatusOr<std::shared_ptr<Communicator>> Communicator::FromEnv(Backend backend, const CommOptions& options) {
  const internal::EnvLookup env = internal::ProcessEnv();
  ZERO_ASSIGN_OR_RETURN(internal::LaunchEnv launch, internal::ReadLaunchEnv(env));
  ZERO_ASSIGN_OR_RETURN(CommOptions opts, internal::ApplyCommEnvOverrides(options, env));
  ZERO_RETURN_IF_ERROR(internal::CheckCommTimeout(opts.timeout));
  if (opts.job_id.empty()) opts.job_id = internal::JobIdFromEnv(env);
  std::shared_ptr<Store> store;
  if (!launch.store_dir.empty()) {
    store = Store::File(launch.store_dir);
  } else if (!launch.master_addr.empty() && launch.master_port > 0) {
    StatusOr<std::shared_ptr<Store>> tcp =
        Store::Tcp(launch.master_addr, launch.master_port, launch.rank == 0, opts.timeout);
    if (!tcp.ok()) {
      return internal::Reworded(tcp.status(),
                                absl::StrCat("FromEnv on rank ", launch.rank, ": the store at ", launch.master_addr,
                                             ":", launch.master_port, " (port from ", launch.port_from,
                                             "; rank 0 serves it", launch.rank == 0 ? "" : ", the others connect",
                                             ", ZERO_MASTER_PORT chooses another): ", tcp.status().message()));
    }
    store = *std::move(tcp);
  } else if (launch.world_size == 1) {
    store = Store::Hash();
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "FromEnv: world size ", launch.world_size, " (from ", launch.source,
        " variables) needs a rendezvous: set ZERO_STORE_DIR (a directory all ranks share) or MASTER_ADDR and "
        "MASTER_PORT (rank 0 serves a TCP store there)"));
  }
  // Ranks launched on one machine (MASTER_ADDR is a loopback address, as zero-run sets it) keep Gloo's
  // traffic on loopback; otherwise Gloo binds to the address of this host's name (or GLOO_SOCKET_IFNAME).
  if (opts.hostname.empty() && internal::IsLoopbackHost(launch.master_addr)) opts.hostname = "127.0.0.1";
  ZERO_LOG(DEBUG) << "FromEnv: rank " << launch.rank << " of " << launch.world_size << " (" << launch.source
                  << "), local rank " << launch.local_rank;
  if (backend == Backend::kNccl) opts.device = launch.local_rank;
  StatusOr<std::shared_ptr<Communicator>> comm =
      backend == Backend::kNccl ? CreateNccl(std::move(store), launch.rank, launch.world_size, opts)
                                : CreateGloo(std::move(store), launch.rank, launch.world_size, opts);
  // A rank that never came: say which variables made this process expect it.
  if (comm.ok() || !absl::IsDeadlineExceeded(comm.status())) return comm;
  return internal::Reworded(comm.status(), absl::StrCat(comm.status().message(), internal::LaunchHint(launch)));
}

StatusOr<std::shared_ptr<Communicator>> Communicator::FromEnv(Backend backend, const Config& config,
                                                              const CommOptions& options) {
  CommOptions opts = options;
  opts.timeout = absl::Seconds(config.comm_timeout_s);
  return FromEnv(backend, opts);
}

}  // namespace zero
