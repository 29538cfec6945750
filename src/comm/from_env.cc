// Communicator::FromEnv and the environment variables of the comm layer (listed in docs/comm.md).
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/internal/env.h"
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
    const std::string s = absl::AsciiStrToLower(*v);
    if (s == "1" || s == "true" || s == "on" || s == "yes") {
      options.check_order = true;
    } else if (s == "0" || s == "false" || s == "off" || s == "no" || s.empty()) {
      options.check_order = false;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("ZERO_COMM_CHECK='", *v, "' is not one of 1/0/true/false"));
    }
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
};
constexpr Source kSources[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

}  // namespace

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
    auto size = env(src.size);
    if (!rank && !size) continue;
    if (!rank || !size) {
      return absl::InvalidArgumentError(absl::StrCat("launcher variables incomplete: ", rank ? src.rank : src.size,
                                                     " is set but ", rank ? src.size : src.rank, " is not"));
    }
    ZERO_ASSIGN_OR_RETURN(out.rank, ParseInt(src.rank, *rank));
    ZERO_ASSIGN_OR_RETURN(out.world_size, ParseInt(src.size, *size));
    if (out.world_size < 1 || out.rank < 0 || out.rank >= out.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(src.rank, "=", out.rank, " is not in [0, ", src.size, "=", out.world_size, ")"));
    }
    out.local_rank = out.rank;
    if (auto local = env(src.local_rank)) {
      ZERO_ASSIGN_OR_RETURN(out.local_rank, ParseInt(src.local_rank, *local));
      if (out.local_rank < 0) {
        return absl::InvalidArgumentError(absl::StrCat(src.local_rank, "=", out.local_rank, " is negative"));
      }
    }
    out.source = src.name;
    break;
  }
  if (auto dir = env("ZERO_STORE_DIR")) out.store_dir = *dir;
  if (auto addr = env("MASTER_ADDR")) out.master_addr = *addr;
  if (auto port = env("MASTER_PORT")) {
    ZERO_ASSIGN_OR_RETURN(out.master_port, ParseInt("MASTER_PORT", *port));
    if (out.master_port < 1 || out.master_port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT=", out.master_port, " is not a TCP port"));
    }
  }
  return out;
}

}  // namespace internal

bool Communicator::Launched() { return internal::HasLauncherRank(internal::ProcessEnv()); }

StatusOr<std::unique_ptr<Communicator>> Communicator::FromEnv(Backend backend, const CommOptions& options) {
  const internal::EnvLookup env = internal::ProcessEnv();
  ZERO_ASSIGN_OR_RETURN(internal::LaunchEnv launch, internal::ReadLaunchEnv(env));
  ZERO_ASSIGN_OR_RETURN(CommOptions opts, internal::ApplyCommEnvOverrides(options, env));
  ZERO_RETURN_IF_ERROR(internal::CheckCommTimeout(opts.timeout));
  if (opts.job_id.empty()) opts.job_id = internal::JobIdFromEnv(env);
  std::shared_ptr<Store> store;
  if (!launch.store_dir.empty()) {
    store = Store::File(launch.store_dir);
  } else if (!launch.master_addr.empty() && launch.master_port > 0) {
    ZERO_ASSIGN_OR_RETURN(store, Store::Tcp(launch.master_addr, launch.master_port, launch.rank == 0, opts.timeout));
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
  if (backend == Backend::kNccl) {
    opts.device = launch.local_rank;
    return CreateNccl(std::move(store), launch.rank, launch.world_size, opts);
  }
  return CreateGloo(std::move(store), launch.rank, launch.world_size, opts);
}

StatusOr<std::unique_ptr<Communicator>> Communicator::FromEnv(Backend backend, const Config& config,
                                                              const CommOptions& options) {
  CommOptions opts = options;
  opts.timeout = absl::Seconds(config.comm_timeout_s);
  return FromEnv(backend, opts);
}

}  // namespace zero
