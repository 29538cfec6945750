// bench/thread_ranks.h — N ranks as N threads of one process over Gloo on loopback, for the benchmarks.
// defines: RunGlooThreadRanks.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "zero/communicator.h"
#include "zero/store.h"

namespace zero::bench {

// Runs fn(comm, rank) on `world` threads, each with its own Gloo communicator over one in-process store, and
// returns each rank's status (a failed rendezvous included).
inline std::vector<absl::Status> RunGlooThreadRanks(
    int world, const std::function<absl::Status(std::shared_ptr<Communicator>, int)>& fn) {
  auto store = Store::Hash();
  std::vector<absl::Status> status(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      CommOptions opts;
      opts.hostname = "127.0.0.1";
      auto comm = Communicator::CreateGloo(store, r, world, opts);
      status[r] = comm.ok() ? fn(std::move(*comm), r) : comm.status();
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

}  // namespace zero::bench
