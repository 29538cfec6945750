// Launcher variables (torchrun, OpenMPI, Slurm, zero-run) and environment overrides, read through an injected
// environment; plus FromEnv itself in a process without launcher variables (world size 1).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/internal/env.h"
#include "support/files.h"
#include "support/status_matchers.h"
#include "zero/communicator.h"
#include "zero/config.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::zero::testing::StatusIs;

internal::EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Unsets every variable FromEnv reads (the launchers', the store's, the timeout override), so that a test that
// calls FromEnv sees only what it sets.
void ClearLaunchEnv() {
  for (const char* v : {"RANK",
                        "WORLD_SIZE",
                        "LOCAL_RANK",
                        "LOCAL_WORLD_SIZE",
                        "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "SLURM_PROCID",
                        "SLURM_NTASKS",
                        "SLURM_STEP_NUM_TASKS",
                        "SLURM_LOCALID",
                        "SLURM_NODEID",
                        "SLURM_TASKS_PER_NODE",
                        "SLURM_STEP_TASKS_PER_NODE",
                        "ZERO_STORE_DIR",
                        "MASTER_ADDR",
                        "MASTER_PORT",
                        "ZERO_MASTER_ADDR",
                        "ZERO_MASTER_PORT",
                        "TORCHELASTIC_USE_AGENT_STORE",
                        "ZERO_COMM_TIMEOUT_S"}) {
    ::unsetenv(v);
  }
}

TEST(LaunchEnv, NoLauncherMeansWorldOfOne) {
  auto e = internal::ReadLaunchEnv(FakeEnv({}));
  ASSERT_OK(e);
  EXPECT_EQ(e->rank, 0);
  EXPECT_EQ(e->world_size, 1);
  EXPECT_EQ(e->source, "default");
}

// Communicator::Launched: any launcher's rank variable (what ReadLaunchEnv reads), and nothing else.
TEST(LaunchEnv, LaunchedMeansALauncherRankVariable) {
  EXPECT_FALSE(internal::HasLauncherRank(FakeEnv({})));
  EXPECT_FALSE(internal::HasLauncherRank(FakeEnv({{"WORLD_SIZE", "4"}, {"MASTER_PORT", "29500"}})));
  EXPECT_TRUE(internal::HasLauncherRank(FakeEnv({{"RANK", "0"}})));
  EXPECT_TRUE(internal::HasLauncherRank(FakeEnv({{"OMPI_COMM_WORLD_RANK", "3"}})));
  EXPECT_TRUE(internal::HasLauncherRank(FakeEnv({{"SLURM_PROCID", "1"}})));
}

TEST(LaunchEnv, Torchrun) {
  auto e = internal::ReadLaunchEnv(FakeEnv({{"RANK", "5"},
                                            {"WORLD_SIZE", "8"},
                                            {"LOCAL_RANK", "1"},
                                            {"MASTER_ADDR", "10.0.0.1"},
                                            {"MASTER_PORT", "29500"}}));
  ASSERT_OK(e);
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->source, "torchrun");
  EXPECT_EQ(e->master_addr, "10.0.0.1");
  EXPECT_EQ(e->master_port, 29500);
}

// torch >= 2.4's torchrun serves torch's own store on MASTER_PORT from its agent and says so with
// TORCHELASTIC_USE_AGENT_STORE=True: zero's store takes the next port. ZERO_MASTER_ADDR/PORT override both.
TEST(LaunchEnv, TorchrunAgentStoreMovesZerosStoreToTheNextPort) {
  std::map<std::string, std::string> vars = {
      {"RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto plain = internal::ReadLaunchEnv(FakeEnv(vars));
  ASSERT_OK(plain);
  EXPECT_EQ(plain->master_port, 29500);
  EXPECT_EQ(plain->port_from, "MASTER_PORT");
  for (const char* off : {"False", "0", ""}) {
    vars["TORCHELASTIC_USE_AGENT_STORE"] = off;
    auto e = internal::ReadLaunchEnv(FakeEnv(vars));
    ASSERT_OK(e);
    EXPECT_EQ(e->master_port, 29500) << off;
  }
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  auto agent = internal::ReadLaunchEnv(FakeEnv(vars));
  ASSERT_OK(agent);
  EXPECT_EQ(agent->master_port, 29501);
  EXPECT_THAT(agent->port_from, HasSubstr("MASTER_PORT + 1"));
  vars["ZERO_MASTER_PORT"] = "31000";
  vars["ZERO_MASTER_ADDR"] = "10.0.0.9";
  auto own = internal::ReadLaunchEnv(FakeEnv(vars));
  ASSERT_OK(own);
  EXPECT_EQ(own->master_port, 31000);
  EXPECT_EQ(own->master_addr, "10.0.0.9");
  EXPECT_EQ(own->port_from, "ZERO_MASTER_PORT");
  vars["ZERO_MASTER_PORT"] = "0";
  EXPECT_THAT(internal::ReadLaunchEnv(FakeEnv(vars)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ZERO_MASTER_PORT=0 is not a TCP port")));
  vars.erase("ZERO_MASTER_PORT");
  vars["MASTER_PORT"] = "65535";
  EXPECT_THAT(internal::ReadLaunchEnv(FakeEnv(vars)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("set ZERO_MASTER_PORT")));
}

TEST(LaunchEnv, OpenMpi) {
  auto e = internal::ReadLaunchEnv(
      FakeEnv({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}));
  ASSERT_OK(e);
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 3);
  EXPECT_EQ(e->source, "openmpi");
}

// A task srun started: the world is srun's SLURM_STEP_NUM_TASKS, which srun sets for every task of the step. Under
// `srun --preserve-env` SLURM_NTASKS keeps the allocation's count, larger than the step's.
TEST(LaunchEnv, Slurm) {
  auto e = internal::ReadLaunchEnv(
      FakeEnv({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "16"}, {"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_LOCALID", "3"}}));
  ASSERT_OK(e);
  EXPECT_EQ(e->rank, 7);
  EXPECT_EQ(e->world_size, 16);
  EXPECT_EQ(e->local_rank, 3);
  EXPECT_EQ(e->source, "slurm");
  EXPECT_EQ(e->size_from, "SLURM_STEP_NUM_TASKS");
  auto preserved = internal::ReadLaunchEnv(
      FakeEnv({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "32"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_LOCALID", "1"}}));
  ASSERT_OK(preserved);
  EXPECT_EQ(preserved->world_size, 2);
  auto beyond =
      internal::ReadLaunchEnv(FakeEnv({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "32"}, {"SLURM_STEP_NUM_TASKS", "2"}}));
  ASSERT_FALSE(beyond.ok());
  EXPECT_THAT(std::string(beyond.status().message()),
              HasSubstr("SLURM_PROCID=2 is not in [0, SLURM_STEP_NUM_TASKS=2)"));
}

// An sbatch script is one process; Slurm gives it SLURM_PROCID=0 and the allocation's SLURM_NTASKS, but no
// SLURM_STEP_NUM_TASKS (only srun's tasks have it). A trainer started there is told at once, not after
// comm_timeout_s of waiting for ranks that never come; a batch script of one task is a world of one.
TEST(LaunchEnv, SlurmBatchScriptIsOneProcess) {
  auto batch = internal::ReadLaunchEnv(FakeEnv({{"SLURM_PROCID", "0"},
                                                {"SLURM_NTASKS", "4"},
                                                {"SLURM_LOCALID", "0"},
                                                {"SLURM_JOB_ID", "77"},
                                                {"MASTER_ADDR", "127.0.0.1"},
                                                {"MASTER_PORT", "29500"}}));
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(batch.status().message()),
              AllOf(HasSubstr("SLURM_PROCID=0 and SLURM_NTASKS=4 are set but SLURM_STEP_NUM_TASKS is not"),
                    HasSubstr("sbatch"), HasSubstr("start the 4 ranks with srun")));
  EXPECT_EQ(internal::LaunchedWorldSize(FakeEnv({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}})), 0);
  auto one = internal::ReadLaunchEnv(FakeEnv({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  ASSERT_OK(one);
  EXPECT_EQ(one->world_size, 1);
  // Submitted without a task count, Slurm writes no SLURM_NTASKS: the script's SLURM_PROCID=0 alone, one process.
  auto uncounted = internal::ReadLaunchEnv(FakeEnv({{"SLURM_PROCID", "0"}, {"SLURM_JOB_ID", "77"}}));
  ASSERT_OK(uncounted);
  EXPECT_EQ(uncounted->world_size, 1);
  EXPECT_EQ(uncounted->source, "slurm");
  // Slurm gives a batch script rank 0 only: another rank without the step's count is not the script's.
  auto forwarded = internal::ReadLaunchEnv(FakeEnv({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}}));
  ASSERT_FALSE(forwarded.ok());
  EXPECT_THAT(std::string(forwarded.status().message()),
              AllOf(HasSubstr("SLURM_PROCID=2 and SLURM_NTASKS=4 are set but SLURM_STEP_NUM_TASKS is not"),
                    HasSubstr("srun did not start this process"), Not(HasSubstr("sbatch"))));
  // Another launcher in the script (torchrun, zero-run, mpirun) is read first: Slurm's variables are not looked at.
  auto torchrun = internal::ReadLaunchEnv(
      FakeEnv({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}));
  ASSERT_OK(torchrun);
  EXPECT_EQ(torchrun->source, "torchrun");
  // Through FromEnv: refused before any rendezvous, whatever the timeout.
  ClearLaunchEnv();
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "4", 1);
  ::setenv("ZERO_STORE_DIR", testing::MakeTempDir("from_env_batch").c_str(), 1);
  ::setenv("ZERO_COMM_TIMEOUT_S", "0.3", 1);  // were it not refused: a rendezvous that fails fast, not in 30 minutes
  auto comm = Communicator::FromEnv(Backend::kGloo);
  ClearLaunchEnv();
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("srun")) << comm.status();
}

// The ranks on this host, from each launcher's own variable; 0 where the launcher does not say.
TEST(LaunchEnv, LocalWorldSizeFromEachLauncher) {
  auto torchrun = internal::ReadLaunchEnv(FakeEnv({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}}));
  ASSERT_OK(torchrun);
  EXPECT_EQ(torchrun->local_world_size, 4);
  auto bare = internal::ReadLaunchEnv(FakeEnv({{"RANK", "5"}, {"WORLD_SIZE", "8"}}));
  ASSERT_OK(bare);
  EXPECT_EQ(bare->local_world_size, 0);
  auto mpi = internal::ReadLaunchEnv(
      FakeEnv({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  ASSERT_OK(mpi);
  EXPECT_EQ(mpi->local_world_size, 2);
  // A Slurm launch: srun's step layout wins over the allocation's, indexed by this node.
  std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "5"},
                                              {"SLURM_NTASKS", "9"},
                                              {"SLURM_STEP_NUM_TASKS", "9"},
                                              {"SLURM_NODEID", "2"},
                                              {"SLURM_TASKS_PER_NODE", "4(x2),1"},
                                              {"SLURM_STEP_TASKS_PER_NODE", "3,2(x2),1,1"}};
  auto step = internal::ReadLaunchEnv(FakeEnv(slurm));
  ASSERT_OK(step);
  EXPECT_EQ(step->local_world_size, 2);
  slurm.erase("SLURM_STEP_TASKS_PER_NODE");
  auto alloc = internal::ReadLaunchEnv(FakeEnv(slurm));
  ASSERT_OK(alloc);
  EXPECT_EQ(alloc->local_world_size, 1);
  slurm.erase("SLURM_NODEID");
  auto no_node = internal::ReadLaunchEnv(FakeEnv(slurm));
  ASSERT_OK(no_node);
  EXPECT_EQ(no_node->local_world_size, 0);
  // Another launcher's variable is not read: OpenMPI's local size under torchrun variables.
  auto other =
      internal::ReadLaunchEnv(FakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  ASSERT_OK(other);
  EXPECT_EQ(other->local_world_size, 0);
}

// The launched world, whichever launcher: what a trainer that would otherwise run alone checks
// (Communicator::LaunchedWorldSize); 0 without a launcher's rank or where its variables do not read.
TEST(LaunchEnv, WorldSizeFromEachLauncher) {
  EXPECT_EQ(internal::LaunchedWorldSize(FakeEnv({{"RANK", "1"}, {"WORLD_SIZE", "8"}})), 8);
  EXPECT_EQ(internal::LaunchedWorldSize(FakeEnv({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}})), 4);
  EXPECT_EQ(internal::LaunchedWorldSize(FakeEnv({{"SLURM_PROCID", "2"}, {"SLURM_STEP_NUM_TASKS", "3"}})), 3);
  EXPECT_EQ(internal::LaunchedWorldSize(FakeEnv({{"WORLD_SIZE", "8"}})), 0);  // no rank: not launched
  EXPECT_EQ(internal::LaunchedWorldSize(FakeEnv({})), 0);
  EXPECT_EQ(internal::LaunchedWorldSize(FakeEnv({{"RANK", "8"}, {"WORLD_SIZE", "8"}})), 0);  // does not read
}

TEST(LaunchEnv, SlurmTasksPerNodeLists) {
  EXPECT_EQ(internal::SlurmTasksOnNode("2(x3),1", 0), 2);
  EXPECT_EQ(internal::SlurmTasksOnNode("2(x3),1", 2), 2);
  EXPECT_EQ(internal::SlurmTasksOnNode("2(x3),1", 3), 1);
  EXPECT_EQ(internal::SlurmTasksOnNode("2(x3),1", 4), 0);  // no such node
  EXPECT_EQ(internal::SlurmTasksOnNode("8", 0), 8);
  EXPECT_EQ(internal::SlurmTasksOnNode("1,3,2", 1), 3);
  EXPECT_EQ(internal::SlurmTasksOnNode("2(x2)", -1), 0);
  for (const char* bad : {"", "x", "2(x", "2(x0)", "2(xa)", "0", "-1", "2(x2)1", "2,,1"}) {
    EXPECT_EQ(internal::SlurmTasksOnNode(bad, 0), 0) << "'" << bad << "'";
  }
}

// A local size torchrun or OpenMPI sets is the user's to get right: one that cannot be is refused by name, and
// Communicator::LaunchedLocalWorldSize reads it as unknown (FromEnv says why).
TEST(LaunchEnv, LocalWorldSizeErrorsNameTheVariable) {
  for (const char* v : {"0", "9", "two"}) {
    SCOPED_TRACE(v);
    internal::EnvLookup env = FakeEnv({{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", v}});
    EXPECT_THAT(internal::ReadLaunchEnv(env),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LOCAL_WORLD_SIZE")));
    EXPECT_EQ(internal::LaunchedLocalWorldSize(env), 0);
  }
  EXPECT_THAT(internal::ReadLaunchEnv(FakeEnv(
                  {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE=3 is not in [1, OMPI_COMM_WORLD_SIZE=2]")));
}

TEST(LaunchEnv, TorchrunWinsOverSlurm) {
  // torchrun inside a Slurm allocation: the torchrun variables describe this process.
  auto e = internal::ReadLaunchEnv(
      FakeEnv({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  ASSERT_OK(e);
  EXPECT_EQ(e->source, "torchrun");
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->local_rank, 1);  // LOCAL_RANK missing: defaults to the rank
}

TEST(LaunchEnv, ZeroRunStoreDir) {
  auto e = internal::ReadLaunchEnv(FakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"ZERO_STORE_DIR", "/tmp/x"}}));
  ASSERT_OK(e);
  EXPECT_EQ(e->store_dir, "/tmp/x");
}

TEST(LaunchEnv, ErrorsNameTheVariable) {
  auto bad = [](std::map<std::string, std::string> vars, const std::string& needle) {
    auto e = internal::ReadLaunchEnv(FakeEnv(vars));
    EXPECT_THAT(e, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(needle)));
  };
  bad({{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK='x'");
  bad({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 is not in [0, WORLD_SIZE=2)");
  bad({{"RANK", "0"}}, "WORLD_SIZE is not");
  bad({{"SLURM_NTASKS", "4"}}, "SLURM_PROCID is not");
  bad({{"SLURM_STEP_NUM_TASKS", "4"}}, "SLURM_STEP_NUM_TASKS is set but SLURM_PROCID is not");
  bad({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=70000");
  bad({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}},
      "OMPI_COMM_WORLD_LOCAL_RANK=-1");
}

TEST(CommEnv, Overrides) {
  CommOptions base;
  auto o = internal::ApplyCommEnvOverrides(base, FakeEnv({{"ZERO_COMM_CHECK", "1"}, {"ZERO_COMM_TIMEOUT_S", "2.5"}}));
  ASSERT_OK(o);
  EXPECT_TRUE(o->check_order);
  EXPECT_EQ(o->timeout, absl::Milliseconds(2500));
  base.check_order = true;
  o = internal::ApplyCommEnvOverrides(base, FakeEnv({{"ZERO_COMM_CHECK", "off"}}));
  ASSERT_OK(o);
  EXPECT_FALSE(o->check_order);
  EXPECT_THAT(internal::ApplyCommEnvOverrides(base, FakeEnv({{"ZERO_COMM_CHECK", "maybe"}})),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto t = internal::ApplyCommEnvOverrides(base, FakeEnv({{"ZERO_COMM_TIMEOUT_S", "-1"}}));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("ZERO_COMM_TIMEOUT_S")) << t.status();
}

TEST(FromEnv, WithoutLauncherBuildsAWorldOfOne) {
  ClearLaunchEnv();
  auto comm = Communicator::FromEnv(Backend::kGloo);
  ASSERT_OK(comm);
  EXPECT_EQ((*comm)->world_size(), 1);
  EXPECT_EQ((*comm)->backend(), Backend::kGloo);
  float x[3] = {1, 2, 3};
  ASSERT_OK((*comm)->AllReduce(x, 3, DType::kF32, ReduceOp::kAvg).Wait());
  EXPECT_EQ(x[2], 3.0f);
}

TEST(FromEnv, MultiRankWithoutRendezvousIsAnError) {
  ClearLaunchEnv();
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  auto comm = Communicator::FromEnv(Backend::kGloo);
  ClearLaunchEnv();
  EXPECT_THAT(comm, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ZERO_STORE_DIR")));
}

// A listener on 127.0.0.1 at a free port whose next port is free too (what torchrun's agent store looks like to
// zero's rank 0); returns its fd and port, or -1.
std::pair<int, int> ListenWithTheNextPortFree() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 4) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(fd);
      continue;
    }
    const int port = ntohs(a.sin_port);
    int probe = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in b = a;
    b.sin_port = htons(static_cast<uint16_t>(port + 1));
    const bool next_free = port < 65535 && ::bind(probe, reinterpret_cast<sockaddr*>(&b), sizeof(b)) == 0;
    ::close(probe);
    if (next_free) return {fd, port};
    ::close(fd);
  }
  return {-1, -1};
}

// The same through FromEnv and a real listener: with torchrun's agent holding MASTER_PORT, rank 0 serves zero's
// store beside it; without the variable, the failure names where the port came from and the way out.
TEST(FromEnv, TorchrunAgentStoreHoldingMasterPort) {
  ClearLaunchEnv();
  auto [agent, port] = ListenWithTheNextPortFree();
  ASSERT_GE(agent, 0) << "no free pair of ports on 127.0.0.1";
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  CommOptions options;
  options.timeout = absl::Seconds(5);
  auto refused = Communicator::FromEnv(Backend::kGloo, options);
  ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  auto beside = Communicator::FromEnv(Backend::kGloo, options);
  ClearLaunchEnv();
  ::close(agent);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              AllOf(HasSubstr(absl::StrCat("127.0.0.1:", port, " (port from MASTER_PORT")),
                    HasSubstr("ZERO_MASTER_PORT chooses another")));
  ASSERT_OK(beside);
  float x[2] = {1, 2};
  ASSERT_OK((*beside)->AllReduce(x, 2, DType::kF32, ReduceOp::kSum).Wait());
  EXPECT_EQ(x[1], 2.0f);
}

// The timeout's range (issue 32.4): what Gloo's deadlines and the stores' millisecond timeouts hold.
TEST(CommEnv, TimeoutOutsideTheRangeIsRefusedWithIt) {
  for (const char* v : {"9.3e9", "1e300", "1e-300", "0.0001", "inf", "nan"}) {
    auto t = internal::ApplyCommEnvOverrides(CommOptions{}, FakeEnv({{"ZERO_COMM_TIMEOUT_S", v}}));
    EXPECT_THAT(t, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("in [0.001, 1e+09]"))) << v;
  }
  auto ok = internal::ApplyCommEnvOverrides(CommOptions{}, FakeEnv({{"ZERO_COMM_TIMEOUT_S", "1e9"}}));
  ASSERT_OK(ok);
  EXPECT_EQ(ok->timeout, absl::Seconds(1e9));
}

// The job id, in order: ZERO_JOB_ID (zero-run), TORCHELASTIC_RUN_ID (torchrun), SLURM_JOB_ID; empty values skip.
TEST(CommEnv, JobIdSources) {
  EXPECT_EQ(internal::JobIdFromEnv(FakeEnv({})), "");
  EXPECT_EQ(internal::JobIdFromEnv(FakeEnv({{"SLURM_JOB_ID", "77"}})), "77");
  EXPECT_EQ(internal::JobIdFromEnv(FakeEnv({{"SLURM_JOB_ID", "77"}, {"TORCHELASTIC_RUN_ID", "t"}})), "t");
  EXPECT_EQ(internal::JobIdFromEnv(FakeEnv({{"ZERO_JOB_ID", "z"}, {"TORCHELASTIC_RUN_ID", "t"}})), "z");
  EXPECT_EQ(internal::JobIdFromEnv(FakeEnv({{"ZERO_JOB_ID", ""}, {"TORCHELASTIC_RUN_ID", "t"}})), "t");
}

// A rendezvous whose other ranks never come names the variables that made this process expect them. (Slurm's
// batch script, one process, is refused before any rendezvous: LaunchEnv.SlurmBatchScriptIsOneProcess.)
TEST(FromEnv, ARankThatNeverCameNamesTheLauncherVariables) {
  const struct {
    std::map<std::string, std::string> vars;
    const char* named;
  } cases[] = {
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NUM_TASKS", "2"}},
       "rank 0 of 2 by SLURM_PROCID and SLURM_STEP_NUM_TASKS"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "rank 0 of 2 by RANK and WORLD_SIZE"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
       "rank 0 of 2 by OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.named);
    ClearLaunchEnv();
    for (const auto& [k, v] : c.vars) ::setenv(k.c_str(), v.c_str(), 1);
    ::setenv("ZERO_STORE_DIR", testing::MakeTempDir("from_env_alone").c_str(), 1);
    ::setenv("ZERO_COMM_TIMEOUT_S", "0.3", 1);
    auto comm = Communicator::FromEnv(Backend::kGloo);
    ClearLaunchEnv();
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
    EXPECT_THAT(std::string(comm.status().message()), HasSubstr(c.named));
  }
  EXPECT_EQ(internal::LaunchHint(internal::LaunchEnv{}), "");
}

// FromEnv(backend, config): the config's comm_timeout_s is the communicator's timeout.
TEST(FromEnv, TakesTheTimeoutFromTheConfig) {
  ClearLaunchEnv();
  auto cfg = Config::FromJsonString(R"({"comm_timeout_s": 20})");
  ASSERT_OK(cfg);
  auto comm = Communicator::FromEnv(Backend::kGloo, *cfg);
  ASSERT_OK(comm);
  EXPECT_EQ((*comm)->timeout(), absl::Seconds(20));
}

// The thread form of the rendezvous checks (the process tests replay the launches): ranks given different
// world sizes or job ids all fail, naming both.
TEST(Rendezvous, WorldSizeAndJobMustAgree) {
  auto store = Store::Hash();
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      CommOptions o;
      o.hostname = "127.0.0.1";
      o.timeout = absl::Seconds(10);
      results[r] = Communicator::CreateGloo(store, r, r == 0 ? 2 : 3, o).status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(results[0], StatusIs(absl::StatusCode::kFailedPrecondition,
                                   HasSubstr("rank 0 was started with world size 2, rank 1 with 3")));
  EXPECT_THAT(results[1], StatusIs(absl::StatusCode::kFailedPrecondition,
                                   HasSubstr("rank 1 was started with world size 3, rank 0 with 2")));

  auto store2 = Store::Hash();
  threads.clear();
  CommOptions a;
  a.hostname = "127.0.0.1";
  a.timeout = absl::Seconds(10);
  a.job_id = "job-a";
  ASSERT_OK(Communicator::CreateGloo(store2, 0, 1, a));  // job A's rank 0 claims the store
  CommOptions b = a;
  b.job_id = "job\nb";
  EXPECT_THAT(Communicator::CreateGloo(store2, 1, 2, b),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("this rank belongs to job 'job\\x0ab' but the store (MASTER_ADDR:MASTER_PORT or "
                                 "ZERO_STORE_DIR) is served by job 'job-a'")));
}

}  // namespace
}  // namespace zero
