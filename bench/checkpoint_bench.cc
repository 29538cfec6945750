// zero-bench-ckpt (checkpoint layer): Engine::Save and Engine::Load against a same-run sequential write and read
// of the same bytes to the same directory, by the same number of threads.
//
//   zero-bench-ckpt --dir /tmp/ckb --world 2 --params 16777216 --reps 3
//
// The model: 8 units of params/8 fp32 parameters each, bf16 mixed precision, AdamW, stage 1, so each rank writes
// its 1/world of the fp32 master (4 B), the bf16 parameters (2 B) and two states (8 B): 14 bytes per parameter
// in all. The baseline writes the same per-rank byte counts, one thread per rank, each to its own file through
// 16 MiB write() calls, then fsync, rename and a directory fsync — what a save must do at the least. Save and
// baseline alternate, `reps` times each; the medians are reported with their ratio (the goal is >= 0.8). Load
// is timed the same way against a sequential read of the files (both may come from the page cache: the ratio
// then compares CPU paths, not the disk). The training stall of a synchronous save is the save's own time.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "thread_ranks.h"
#include "zero/zero.h"

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One thread per rank writes `bytes` to its own file: write, fsync, rename, directory fsync.
double SequentialWrite(const std::string& dir, int world, int64_t bytes, int rep) {
  std::vector<std::thread> t;
  const auto t0 = Clock::now();
  for (int r = 0; r < world; ++r) {
    t.emplace_back([&, r] {
      const std::string path = absl::StrCat(dir, "/seq-", rep, "-", r), tmp = path + ".tmp";
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      std::vector<char> buf(16 << 20, static_cast<char>(r + 1));
      for (int64_t left = bytes; left > 0;) {
        const ssize_t w = ::write(fd, buf.data(), static_cast<size_t>(std::min<int64_t>(left, buf.size())));
        if (w <= 0) std::abort();
        left -= w;
      }
      ::fsync(fd);
      ::close(fd);
      ::rename(tmp.c_str(), path.c_str());
      const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
      ::fsync(d);
      ::close(d);
    });
  }
  for (auto& x : t) x.join();
  return Seconds(t0);
}

double SequentialRead(const std::string& dir, int world, int rep) {
  std::vector<std::thread> t;
  const auto t0 = Clock::now();
  for (int r = 0; r < world; ++r) {
    t.emplace_back([&, r] {
      const int fd = ::open(absl::StrCat(dir, "/seq-", rep, "-", r).c_str(), O_RDONLY);
      std::vector<char> buf(16 << 20);
      while (::read(fd, buf.data(), buf.size()) > 0) {
      }
      ::close(fd);
    });
  }
  for (auto& x : t) x.join();
  return Seconds(t0);
}

// --cold: write back and drop the page cache (root only), so the next read comes from the disk.
bool DropCaches() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "1", 1) == 1;
  ::close(fd);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/zero-bench-ckpt";
  int world = 2, reps = 3;
  bool cold = false;
  int64_t params = int64_t{1} << 24;
  constexpr const char* kUsage = "usage: zero-bench-ckpt [--dir D] [--world N] [--params P] [--reps R] [--cold]\n";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--cold") {
      cold = true;
      continue;
    }
    // The value is read once the flag is known, so an unknown last flag is named as unknown.
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--dir") {
      dir = v;
    } else if (a == "--world") {
      world = std::atoi(v);
    } else if (a == "--params") {
      params = std::atoll(v);
    } else if (a == "--reps") {
      reps = std::atoi(v);
    } else {
      std::fprintf(stderr, "zero-bench-ckpt: unknown flag %s\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "zero-bench-ckpt: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    ++i;
  }
  std::system(absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'").c_str());
  zero::Config cfg = zero::Config::Default();
  cfg.zero.stage = 1;
  cfg.bf16.enabled = true;
  cfg.train_micro_batch_size_per_gpu = 1;
  cfg.train_batch_size.reset();
  zero::OptimizerConfig o;
  o.type = "AdamW";
  cfg.optimizer = o;
  constexpr int kUnits = 8;
  std::vector<double> save_s(reps), load_s(reps), step_s(world), seq_w(reps), seq_r(reps);
  int64_t rank_bytes = 0;
  auto status = zero::bench::RunGlooThreadRanks(world, [&](std::shared_ptr<zero::Communicator> comm, int rank) {
    ZERO_ASSIGN_OR_RETURN(auto e, zero::Engine::Create(cfg, comm));
    std::vector<zero::UnitId> ids;
    for (int u = 0; u < kUnits; ++u) {
      ZERO_ASSIGN_OR_RETURN(zero::UnitId id, e->AddUnit(absl::StrCat("u", u), {{"w", {params / kUnits}}}));
      ids.push_back(id);
    }
    ZERO_RETURN_IF_ERROR(e->Finalize([](const std::string&, const zero::ParamSpec& p, float* v) {
      for (int64_t i = 0; i < p.numel(); ++i) v[i] = 0.001f * static_cast<float>(i % 1000);
    }));
    // One step, so the state is not all zeros, and its time: the scale of the stall a synchronous save adds.
    const auto t0 = Clock::now();
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      ZERO_ASSIGN_OR_RETURN(zero::UnitScope s, e->Backward(*it));
      (void)s;
    }
    ZERO_RETURN_IF_ERROR(e->Step().status());
    step_s[rank] = Seconds(t0);
    for (int rep = 0; rep < reps; ++rep) {
      ZERO_RETURN_IF_ERROR(comm->Barrier().Wait());
      const auto s0 = Clock::now();
      ZERO_RETURN_IF_ERROR(e->Save(dir, {.tag = absl::StrCat("rep-", rep)}).status());
      ZERO_RETURN_IF_ERROR(comm->Barrier().Wait());
      if (rank == 0) save_s[rep] = Seconds(s0);
      if (rank == 0 && cold && !DropCaches()) return absl::PermissionDeniedError("--cold: cannot drop caches");
      ZERO_RETURN_IF_ERROR(comm->Barrier().Wait());
      const auto l0 = Clock::now();
      ZERO_RETURN_IF_ERROR(e->Load(dir, {.tag = absl::StrCat("rep-", rep)}).status());
      ZERO_RETURN_IF_ERROR(comm->Barrier().Wait());
      if (rank == 0) {
        load_s[rep] = Seconds(l0);
        // The baseline, alone (the other ranks wait at the barrier): the largest rank file's size per thread.
        rank_bytes = 0;
        for (int r = 0; r < world; ++r) {
          std::ifstream f(absl::StrFormat("%s/rep-%d/rank-%05d-of-%05d.bin", dir, rep, r, world),
                          std::ios::ate | std::ios::binary);
          rank_bytes = std::max<int64_t>(rank_bytes, static_cast<int64_t>(f.tellg()));
        }
        seq_w[rep] = SequentialWrite(dir, world, rank_bytes, rep);
        if (cold) DropCaches();
        seq_r[rep] = SequentialRead(dir, world, rep);
      }
      ZERO_RETURN_IF_ERROR(comm->Barrier().Wait());
    }
    return absl::OkStatus();
  });
  for (const auto& s : status) {
    if (!s.ok()) {
      std::fprintf(stderr, "zero-bench-ckpt: %s\n", zero::ErrorText(s).c_str());
      return 1;
    }
  }
  const double total = static_cast<double>(rank_bytes) * world, gib = double(int64_t{1} << 30);
  const double save = Median(save_s), load = Median(load_s), w = Median(seq_w), r = Median(seq_r);
  std::printf("checkpoint: %lld parameters, world %d, %.3f GiB written per save (%.1f MiB per rank)\n",
              static_cast<long long>(params), world, total / gib, rank_bytes / double(1 << 20));
  std::printf("save  %.3f s  %.2f GiB/s | sequential write %.3f s  %.2f GiB/s | ratio %.2f\n", save, total / gib / save,
              w, total / gib / w, w / save);
  std::printf("reads: %s\n", cold ? "cold (page cache dropped before each)" : "warm (from the page cache)");
  std::printf("load  %.3f s  %.2f GiB/s | sequential read  %.3f s  %.2f GiB/s | ratio %.2f\n", load, total / gib / load,
              r, total / gib / r, r / load);
  std::printf("one training step %.3f s; a synchronous save stalls training %.3f s (%.1f steps)\n", step_s[0], save,
              save / step_s[0]);
  return 0;
}
