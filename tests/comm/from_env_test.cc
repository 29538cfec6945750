// Launcher variables (torchrun, OpenMPI, Slurm, zero-run) and environment overrides, read through an injected
// environment; plus FromEnv itself in a process without launcher variables (world size 1).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "absl/strings/match.h"
#include "comm/internal/env.h"
#include "zero/communicator.h"

namespace zero {
namespace {

internal::EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LaunchEnv, NoLauncherMeansWorldOfOne) {
  auto e = internal::ReadLaunchEnv(FakeEnv({}));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->rank, 0);
  EXPECT_EQ(e->world_size, 1);
  EXPECT_EQ(e->source, "default");
}

TEST(LaunchEnv, Torchrun) {
  auto e = internal::ReadLaunchEnv(FakeEnv({{"RANK", "5"},
                                            {"WORLD_SIZE", "8"},
                                            {"LOCAL_RANK", "1"},
                                            {"MASTER_ADDR", "10.0.0.1"},
                                            {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->source, "torchrun");
  EXPECT_EQ(e->master_addr, "10.0.0.1");
  EXPECT_EQ(e->master_port, 29500);
}

TEST(LaunchEnv, OpenMpi) {
  auto e = internal::ReadLaunchEnv(FakeEnv(
      {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 3);
  EXPECT_EQ(e->source, "openmpi");
}

TEST(LaunchEnv, Slurm) {
  auto e = internal::ReadLaunchEnv(FakeEnv({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 7);
  EXPECT_EQ(e->world_size, 16);
  EXPECT_EQ(e->local_rank, 3);
  EXPECT_EQ(e->source, "slurm");
}

TEST(LaunchEnv, TorchrunWinsOverSlurm) {
  // torchrun inside a Slurm allocation: the torchrun variables describe this process.
  auto e = internal::ReadLaunchEnv(
      FakeEnv({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->source, "torchrun");
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->local_rank, 1);  // LOCAL_RANK missing: defaults to the rank
}

TEST(LaunchEnv, ZeroRunStoreDir) {
  auto e = internal::ReadLaunchEnv(FakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"ZERO_STORE_DIR", "/tmp/x"}}));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->store_dir, "/tmp/x");
}

TEST(LaunchEnv, ErrorsNameTheVariable) {
  auto bad = [](std::map<std::string, std::string> vars, const std::string& needle) {
    auto e = internal::ReadLaunchEnv(FakeEnv(vars));
    EXPECT_TRUE(absl::IsInvalidArgument(e.status())) << e.status();
    EXPECT_TRUE(absl::StrContains(e.status().message(), needle)) << e.status();
  };
  bad({{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK='x'");
  bad({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 is not in [0, WORLD_SIZE=2)");
  bad({{"RANK", "0"}}, "WORLD_SIZE is not");
  bad({{"SLURM_NTASKS", "4"}}, "SLURM_PROCID is not");
  bad({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=70000");
  bad({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}},
      "OMPI_COMM_WORLD_LOCAL_RANK=-1");
}

TEST(CommEnv, Overrides) {
  CommOptions base;
  auto o = internal::ApplyCommEnvOverrides(base, FakeEnv({{"ZERO_COMM_CHECK", "1"}, {"ZERO_COMM_TIMEOUT_S", "2.5"}}));
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->check_order);
  EXPECT_EQ(o->timeout, absl::Milliseconds(2500));
  base.check_order = true;
  o = internal::ApplyCommEnvOverrides(base, FakeEnv({{"ZERO_COMM_CHECK", "off"}}));
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->check_order);
  EXPECT_TRUE(absl::IsInvalidArgument(
      internal::ApplyCommEnvOverrides(base, FakeEnv({{"ZERO_COMM_CHECK", "maybe"}})).status()));
  auto t = internal::ApplyCommEnvOverrides(base, FakeEnv({{"ZERO_COMM_TIMEOUT_S", "-1"}}));
  EXPECT_TRUE(absl::StrContains(t.status().message(), "ZERO_COMM_TIMEOUT_S")) << t.status();
}

TEST(FromEnv, WithoutLauncherBuildsAWorldOfOne) {
  for (const char* v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
                        "SLURM_NTASKS", "ZERO_STORE_DIR", "MASTER_ADDR", "MASTER_PORT"}) {
    ::unsetenv(v);
  }
  auto comm = Communicator::FromEnv(Backend::kGloo);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->world_size(), 1);
  EXPECT_EQ((*comm)->backend(), Backend::kGloo);
  float x[3] = {1, 2, 3};
  ASSERT_TRUE((*comm)->AllReduce(x, 3, DType::kF32, ReduceOp::kAvg).Wait().ok());
  EXPECT_EQ(x[2], 3.0f);
}

TEST(FromEnv, MultiRankWithoutRendezvousIsAnError) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::unsetenv("ZERO_STORE_DIR");
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  auto comm = Communicator::FromEnv(Backend::kGloo);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  EXPECT_TRUE(absl::IsInvalidArgument(comm.status())) << comm.status();
  EXPECT_TRUE(absl::StrContains(comm.status().message(), "ZERO_STORE_DIR")) << comm.status();
}

}  // namespace
}  // namespace zero
