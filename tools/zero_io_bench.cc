// zero-io-bench: how fast the I/O engine (src/io) writes and reads a file sequentially with O_DIRECT, beside a plain
// loop of O_DIRECT pwrite/pread of the same block size in the same run (what `dd oflag=direct bs=1M` does).
//
//   zero-io-bench /mnt/nvme                       # 256 MiB, 1 MiB blocks, queue depth 8, the default backend
//   zero-io-bench /mnt/nvme --size 1G --block 1M --queue-depth 32 --backend threads --iters 5 --json
//   zero-io-bench /mnt/nvme --jobs 4              # 4 streams at once, as 4 ranks' NVMe tiers share one disk
//
// The file is PATH/zero-io-bench.<pid>.<job>.dat, removed at the end. Each iteration writes the file with the
// baseline and with the engine (fdatasync included in both), then reads it with both, alternating which goes first;
// the engine's read is checked against what was written (#wrong). With --jobs N, N threads do each of those at once,
// each with its own file, buffers and engine (what N ranks' I/O engines on one machine do), and a figure is the
// bytes of all N files over the time from the start to the last one's end. Printed: the median GB/s (1e9 bytes per
// second) of each over the iterations and engine / baseline. Exit 0 on success, 1 on an I/O error or a wrong byte, 2 on
// bad usage.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "io/internal/io_engine.h"
#include "zero/logging.h"

namespace {

constexpr const char* kUsage =
    "usage: zero-io-bench PATH [--size BYTES] [--block BYTES] [--queue-depth N] [--backend io_uring|threads]\n"
    "                          [--iters N] [--jobs N] [--json]\n"
    "  PATH           a folder; the file PATH/zero-io-bench.<pid>.dat is written, read and removed\n"
    "  --size         bytes of the file (K, M, G suffixes: 2^10...), a multiple of --block; default 256M\n"
    "  --block        bytes per request, engine and baseline alike (aio.block_size); default 1M\n"
    "  --queue-depth  requests in flight in the engine (aio.queue_depth); default 8\n"
    "  --backend      the engine's backend; default io_uring where the kernel allows it, else threads\n"
    "  --iters        repetitions; the median is printed; default 3\n"
    "  --jobs         streams at once, each its own file and engine (--size each); figures are all of them; default 1\n"
    "  --json         one JSON object on stdout instead of the table\n";

int Usage(const std::string& why) {
  std::cerr << "zero-io-bench: " << why << "\n" << kUsage;
  return 2;
}

bool ParseBytes(const std::string& s, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || v <= 0) return false;
  int64_t mult = 1;
  const std::string suffix = end;
  if (suffix == "K" || suffix == "k") {
    mult = int64_t{1} << 10;
  } else if (suffix == "M" || suffix == "m") {
    mult = int64_t{1} << 20;
  } else if (suffix == "G" || suffix == "g") {
    mult = int64_t{1} << 30;
  } else if (!suffix.empty()) {
    return false;
  }
  *out = v * mult;
  return true;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string Err(const char* what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
}

// The baseline: one O_DIRECT descriptor, one block per syscall, in order (dd oflag=direct / iflag=direct).
zero::Status BaselineWrite(const std::string& path, const char* src, int64_t size, int64_t block) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(Err("open (O_DIRECT)", path));
  for (int64_t off = 0; off < size;) {
    const ssize_t r = ::pwrite(fd, src + off, static_cast<size_t>(std::min(block, size - off)), off);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      const std::string e = Err("pwrite", path);
      ::close(fd);
      return absl::InternalError(e);
    }
    off += r;
  }
  const int rc = ::fdatasync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(Err("fdatasync", path));
  return absl::OkStatus();
}

zero::Status BaselineRead(const std::string& path, char* dst, int64_t size, int64_t block) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(Err("open (O_DIRECT)", path));
  for (int64_t off = 0; off < size;) {
    const ssize_t r = ::pread(fd, dst + off, static_cast<size_t>(std::min(block, size - off)), off);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      const std::string e = r == 0 ? absl::StrCat("pread ", path, ": end of file at ", off) : Err("pread", path);
      ::close(fd);
      return absl::InternalError(e);
    }
    off += r;
  }
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int64_t size = int64_t{256} << 20, block = int64_t{1} << 20;
  int64_t queue_depth = 8, iters = 3, jobs = 1;
  bool json = false;
  zero::io::IoOptions::BackendChoice backend = zero::io::IoOptions::BackendChoice::kAuto;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* v) {
      if (i + 1 >= argc) return false;
      *v = argv[++i];
      return true;
    };
    std::string v;
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--size" || a == "--block" || a == "--queue-depth" || a == "--iters" || a == "--backend" ||
               a == "--jobs") {
      if (!value(&v)) return Usage(a + " needs a value");
      if (a == "--backend") {
        if (v == "io_uring") {
          backend = zero::io::IoOptions::BackendChoice::kIoUring;
        } else if (v == "threads") {
          backend = zero::io::IoOptions::BackendChoice::kThreads;
        } else {
          return Usage("--backend: io_uring or threads, not " + v);
        }
        continue;
      }
      int64_t n = 0;
      if (!ParseBytes(v, &n)) return Usage(a + ": not a positive number: " + v);
      if (a == "--size") size = n;
      if (a == "--block") block = n;
      if (a == "--queue-depth") queue_depth = n;
      if (a == "--iters") iters = n;
      if (a == "--jobs") jobs = n;
    } else if (a.size() > 1 && a[0] == '-') {
      return Usage("unknown flag " + a);
    } else if (dir.empty()) {
      dir = a;
    } else {
      return Usage("more than one PATH");
    }
  }
  if (dir.empty()) return Usage("PATH is missing");
  if (size % block != 0) return Usage("--size must be a multiple of --block (the baseline moves whole blocks, as dd)");
  if (queue_depth > 4096 || iters > 1000 || jobs > 256) {
    return Usage("--queue-depth at most 4096, --iters at most 1000, --jobs at most 256");
  }

  // The engine's choice is printed below; its log line would only repeat it.
  zero::SetLogLevel(zero::LogLevel::kWarning);
  zero::io::IoOptions o;
  o.block_size = block;
  o.queue_depth = static_cast<int>(queue_depth);
  o.backend = backend;
  // One stream per job: its engine, file and buffers, as each rank has its own.
  struct Job {
    std::unique_ptr<zero::io::IoEngine> engine;
    std::string path;
    char* src = nullptr;
    char* dst = nullptr;
    bool direct = true;
    int64_t wrong = 0;
    zero::Status st;
  };
  std::vector<Job> job(static_cast<size_t>(jobs));
  for (size_t j = 0; j < job.size(); ++j) {
    auto engine = zero::io::IoEngine::Create(o);
    if (!engine.ok()) {
      std::cerr << "zero-io-bench: " << engine.status().message() << "\n";
      return 1;
    }
    job[j].engine = std::move(*engine);
    job[j].path = absl::StrCat(dir, "/zero-io-bench.", ::getpid(), ".", j, ".dat");
    void* sp = nullptr;
    void* dp = nullptr;
    if (posix_memalign(&sp, 4096, static_cast<size_t>(size)) != 0 ||
        posix_memalign(&dp, 4096, static_cast<size_t>(size)) != 0) {
      std::cerr << "zero-io-bench: cannot allocate 2 x " << size << " bytes for job " << j << "\n";
      return 1;
    }
    job[j].src = static_cast<char*>(sp);
    job[j].dst = static_cast<char*>(dp);
    uint32_t x = 12345 + static_cast<uint32_t>(j);
    for (int64_t i = 0; i < size; ++i) {
      x = x * 1664525u + 1013904223u;
      job[j].src[i] = static_cast<char>(x >> 24);
    }
  }

  std::vector<double> ew, bw, er, br;  // GB/s of all jobs: engine/baseline write/read
  const double total = static_cast<double>(size) * static_cast<double>(jobs);
  // Runs `one` on every job at once and returns all jobs' GB/s, from the start to the last job's end.
  auto all = [&](const std::function<zero::Status(Job&)>& one, std::vector<double>* gbps) -> zero::Status {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (Job& jb : job) threads.emplace_back([&one, &jb] { jb.st = one(jb); });
    for (std::thread& t : threads) t.join();
    const double seconds = Seconds(t0);
    for (Job& jb : job) ZERO_RETURN_IF_ERROR(jb.st);
    gbps->push_back(total / seconds / 1e9);
    return absl::OkStatus();
  };
  auto engine_write = [&](Job& jb) -> zero::Status {
    ZERO_ASSIGN_OR_RETURN(zero::io::IoFile f, zero::io::IoFile::Open(jb.path, zero::io::IoFile::Mode::kTruncate));
    jb.direct = jb.direct && f.direct();
    ZERO_RETURN_IF_ERROR(jb.engine->Write(f, 0, jb.src, size));
    ZERO_RETURN_IF_ERROR(f.Sync());
    f.Close();
    return absl::OkStatus();
  };
  auto engine_read = [&](Job& jb) -> zero::Status {
    ZERO_ASSIGN_OR_RETURN(zero::io::IoFile f, zero::io::IoFile::Open(jb.path, zero::io::IoFile::Mode::kRead));
    ZERO_RETURN_IF_ERROR(jb.engine->Read(f, 0, jb.dst, size));
    f.Close();
    return absl::OkStatus();
  };
  auto base_write = [&](Job& jb) { return BaselineWrite(jb.path, jb.src, size, block); };
  auto base_read = [&](Job& jb) { return BaselineRead(jb.path, jb.dst, size, block); };
  zero::Status st;
  for (int64_t it = 0; it < iters && st.ok(); ++it) {
    for (Job& jb : job) std::memset(jb.dst, 0, static_cast<size_t>(size));
    auto engine_pair = [&]() -> zero::Status {
      ZERO_RETURN_IF_ERROR(all(engine_write, &ew));
      ZERO_RETURN_IF_ERROR(all(engine_read, &er));
      for (Job& jb : job) jb.wrong += std::memcmp(jb.dst, jb.src, static_cast<size_t>(size)) != 0 ? 1 : 0;
      return absl::OkStatus();
    };
    auto base_pair = [&]() -> zero::Status {
      ZERO_RETURN_IF_ERROR(all(base_write, &bw));
      return all(base_read, &br);
    };
    // Each read reads what the write just before it wrote; the order of the pairs alternates.
    if (it % 2 == 1) {
      st = engine_pair();
      if (st.ok()) st = base_pair();
    } else {
      st = base_pair();
      if (st.ok()) st = engine_pair();
    }
  }
  int64_t wrong = 0;
  bool direct = true;
  for (Job& jb : job) {
    ::unlink(jb.path.c_str());
    std::free(jb.src);
    std::free(jb.dst);
    wrong += jb.wrong;
    direct = direct && jb.direct;
  }
  if (!st.ok()) {
    std::cerr << "zero-io-bench: " << st.message() << "\n";
    return 1;
  }
  const zero::io::IoBackendInfo& info = job[0].engine->backend();
  const std::string path = jobs == 1 ? job[0].path : absl::StrCat(dir, "/zero-io-bench.", ::getpid(), ".*.dat");
  const double mw = Median(ew), mbw = Median(bw), mr = Median(er), mbr = Median(br);
  auto list = [](const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&s, i ? "," : "", absl::StrFormat("%.3f", v[i]));
    return s + "]";
  };
  if (json) {
    std::string reason;
    for (char c : info.reason) reason += c == '"' || c == '\\' ? '\'' : c;
    std::cout << "{\"path\":\"" << path << "\",\"size\":" << size << ",\"block\":" << block
              << ",\"queue_depth\":" << queue_depth << ",\"jobs\":" << jobs << ",\"backend\":\""
              << zero::io::IoBackendName(info.backend) << "\",\"backend_reason\":\"" << reason
              << "\",\"direct\":" << (direct ? "true" : "false") << ",\"iters\":" << iters
              << ",\"write\":{\"engine_gbps\":" << list(ew) << ",\"baseline_gbps\":" << list(bw)
              << ",\"ratio\":" << absl::StrFormat("%.3f", mw / mbw) << "},\"read\":{\"engine_gbps\":" << list(er)
              << ",\"baseline_gbps\":" << list(br) << ",\"ratio\":" << absl::StrFormat("%.3f", mr / mbr)
              << "},\"wrong\":" << wrong << "}\n";
  } else {
    std::printf("# zero-io-bench %s: %lld bytes, blocks of %lld, queue depth %lld, %lld iterations, %lld jobs\n",
                path.c_str(), static_cast<long long>(size), static_cast<long long>(block),
                static_cast<long long>(queue_depth), static_cast<long long>(iters), static_cast<long long>(jobs));
    std::printf("# engine backend %s (%s), %s\n", zero::io::IoBackendName(info.backend), info.reason.c_str(),
                direct ? "O_DIRECT" : "buffered: the file system refused O_DIRECT");
    std::printf("# GB/s, median over the iterations; writes include fdatasync\n");
    std::printf("%-6s %12s %14s %8s\n", "op", "engine_GBps", "baseline_GBps", "ratio");
    std::printf("%-6s %12.3f %14.3f %8.3f\n", "write", mw, mbw, mw / mbw);
    std::printf("%-6s %12.3f %14.3f %8.3f\n", "read", mr, mbr, mr / mbr);
    std::printf("#wrong %lld\n", static_cast<long long>(wrong));
  }
  return wrong == 0 ? 0 : 1;
}
