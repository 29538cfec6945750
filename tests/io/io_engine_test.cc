// The I/O engine (io/internal/io_engine.h) on real files: every byte of every request lands where it should and
// reads back bitwise equal, on both backends, whatever the alignment of sizes, offsets and memory.
#include "io/internal/io_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/files.h"
#include "support/status_matchers.h"
#include "zero/config.h"

namespace zero::io {
namespace {

using ::testing::HasSubstr;
using zero::testing::IsOk;
using zero::testing::StatusIs;
using Choice = IoOptions::BackendChoice;

// Bytes that differ at every position of a few KiB and between seeds, so a piece landing at the wrong offset shows.
std::vector<char> Pattern(int64_t n, uint32_t seed) {
  std::vector<char> v(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : v) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return v;
}

// Memory at a chosen distance from a 4096-byte boundary (the engine stages what is not aligned).
class Memory {
 public:
  Memory(int64_t bytes, int64_t misalign) {
    void* p = nullptr;
    ZERO_CHECK(posix_memalign(&p, 4096, static_cast<size_t>(bytes + misalign + 1)) == 0);
    base_.reset(static_cast<char*>(p));
    data_ = base_.get() + misalign;
  }
  char* data() const { return data_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> base_;
  char* data_;
};

int64_t FileSize(const std::string& path) {
  struct stat st;
  ZERO_CHECK(::stat(path.c_str(), &st) == 0) << path;
  return st.st_size;
}

// A test's engine and folder; parameterized by the backend asked for.
class IoEngineTest : public ::testing::TestWithParam<Choice> {
 protected:
  void SetUp() override {
    if (GetParam() == Choice::kIoUring) {
      if (!IoEngine::IoUringBuilt()) GTEST_SKIP() << "built without liburing";
      if (const char* env = std::getenv("ZERO_IO_BACKEND"); env != nullptr && std::string(env) == "threads") {
        GTEST_SKIP() << "ZERO_IO_BACKEND=threads";
      }
    }
    dir_ = zero::testing::MakeTempDir("io");
  }

  // An engine of small blocks and queue, so modest requests make many pieces and queue more than fit in flight.
  std::unique_ptr<IoEngine> Make(IoOptions o = Small()) {
    o.backend = GetParam();
    StatusOr<std::unique_ptr<IoEngine>> e = IoEngine::Create(o);
    if (!e.ok() && GetParam() == Choice::kIoUring) {
      ADD_FAILURE() << "io_uring refused on this machine: " << e.status();  // the kernel here has it
      return nullptr;
    }
    ZERO_CHECK(e.ok()) << e.status();
    EXPECT_EQ((*e)->backend().backend, GetParam() == Choice::kIoUring ? IoBackend::kIoUring : IoBackend::kThreads)
        << (*e)->backend().reason;
    return *std::move(e);
  }
  static IoOptions Small() {
    IoOptions o;
    o.block_size = 64 << 10;
    o.queue_depth = 4;
    return o;
  }
  IoFile Open(const std::string& name, IoFile::Mode mode = IoFile::Mode::kTruncate) {
    StatusOr<IoFile> f = IoFile::Open(dir_ + "/" + name, mode);
    ZERO_CHECK(f.ok()) << f.status();
    return *std::move(f);
  }

  std::string dir_;
};

// Writes `n` bytes from memory `src_misalign` bytes off a boundary at `offset` of a fresh file, reads them back
// into memory `dst_misalign` off, and checks the bytes and that the file holds exactly offset + n bytes.
void RoundTrip(IoEngine& engine, const std::string& path, int64_t offset, int64_t n, int64_t src_misalign,
               int64_t dst_misalign, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "offset " << offset << " bytes " << n << " src+" << src_misalign << " dst+"
                                    << dst_misalign);
  StatusOr<IoFile> f = IoFile::Open(path, IoFile::Mode::kTruncate);
  ASSERT_THAT(f.status(), IsOk());
  const std::vector<char> want = Pattern(n, seed);
  Memory src(n, src_misalign), dst(n, dst_misalign);
  std::memcpy(src.data(), want.data(), want.size());
  ASSERT_THAT(engine.Write(*f, offset, src.data(), n), IsOk());
  EXPECT_EQ(FileSize(path), offset + n);  // DeepSpeed's libaio path left 28,311,552 of 28,824,000 bytes
  std::memset(dst.data(), 0x5a, static_cast<size_t>(n));
  ASSERT_THAT(engine.Read(*f, offset, dst.data(), n), IsOk());
  EXPECT_EQ(std::memcmp(dst.data(), want.data(), want.size()), 0);
  // And through a plain reader, so the engine's read is not checking its own write's mistakes.
  const std::string disk = zero::testing::ReadWholeFile(path);
  ASSERT_EQ(static_cast<int64_t>(disk.size()), offset + n);
  EXPECT_EQ(std::memcmp(disk.data() + offset, want.data(), want.size()), 0);
}

TEST_P(IoEngineTest, UnalignedSizesWriteEveryByte) {
  auto engine = Make();
  ASSERT_NE(engine, nullptr);
  const int64_t a = 4096, b = 64 << 10;
  for (int64_t n : {int64_t{1}, a - 1, a, a + 1, b - 1, b, b + 1, 3 * b + 7}) {
    for (int64_t misalign : {0, 3}) RoundTrip(*engine, dir_ + "/f", 0, n, misalign, misalign ? 5 : 0, n);
  }
  const IoEngine::Counters c = engine->counters();
  EXPECT_GT(c.staged_pieces, 0);                             // misaligned memory went through the staging buffers
  EXPECT_GT(c.buffered_pieces, 0);                           // tails went through the buffered twin
  EXPECT_GT(c.pieces, c.staged_pieces + c.buffered_pieces);  // and aligned memory went straight
}

// DeepSpeed issue 1070's tensor, at DeepSpeed's default block size and queue depth.
TEST_P(IoEngineTest, DeepSpeedTensorKeepsItsTail) {
  IoOptions o;  // 1 MiB blocks, 8 in flight
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  RoundTrip(*engine, dir_ + "/tensor", 0, 28'824'000, 0, 0, 1070);
  RoundTrip(*engine, dir_ + "/tensor", 0, 28'824'000, 1, 7, 1071);
}

// Requests that start and end inside granules of a file that has bytes around them: the neighbours stay.
TEST_P(IoEngineTest, UnalignedOffsetsKeepTheNeighbours) {
  auto engine = Make();
  ASSERT_NE(engine, nullptr);
  const int64_t file_bytes = 5 * (64 << 10) + 999;
  for (int64_t offset : {int64_t{1}, int64_t{511}, int64_t{4095}, int64_t{4097}, int64_t{(64 << 10) + 3}}) {
    for (int64_t n : {int64_t{1}, int64_t{4097}, int64_t{2 * (64 << 10) + 5}}) {
      SCOPED_TRACE(::testing::Message() << "offset " << offset << " bytes " << n);
      IoFile f = Open("n");
      std::vector<char> model = Pattern(file_bytes, 7);
      ASSERT_THAT(engine->Write(f, 0, model.data(), file_bytes), IsOk());
      const std::vector<char> put = Pattern(n, static_cast<uint32_t>(offset + n));
      Memory src(n, 1);
      std::memcpy(src.data(), put.data(), put.size());
      ASSERT_THAT(engine->Write(f, offset, src.data(), n), IsOk());
      std::memcpy(model.data() + offset, put.data(), put.size());
      std::vector<char> back(static_cast<size_t>(file_bytes));
      ASSERT_THAT(engine->Read(f, 0, back.data(), file_bytes), IsOk());
      EXPECT_EQ(back, model);
      EXPECT_EQ(zero::testing::ReadWholeFile(dir_ + "/n"), std::string(model.begin(), model.end()));
    }
  }
}

// Many more requests than the queue holds, over several files, each of several pieces, in one batch.
TEST_P(IoEngineTest, ManyRequestsInFlight) {
  auto engine = Make();
  ASSERT_NE(engine, nullptr);
  constexpr int kFiles = 3, kPerFile = 20;
  const int64_t n = 3 * (64 << 10) + 100, stride = n + 4096 + 17;
  std::vector<IoFile> files;
  for (int i = 0; i < kFiles; ++i) files.push_back(Open(absl::StrCat("m", i)));
  std::vector<std::vector<char>> src, dst;
  std::vector<IoOp> writes, reads;
  for (int i = 0; i < kFiles * kPerFile; ++i) {
    src.push_back(Pattern(n, static_cast<uint32_t>(i)));
    dst.emplace_back(static_cast<size_t>(n));
  }
  for (int i = 0; i < kFiles * kPerFile; ++i) {
    const IoFile* f = &files[static_cast<size_t>(i % kFiles)];
    const int64_t off = (i / kFiles) * stride;
    writes.push_back({.file = f, .offset = off, .data = src[static_cast<size_t>(i)].data(), .bytes = n});
    reads.push_back({.file = f, .offset = off, .data = dst[static_cast<size_t>(i)].data(), .bytes = n});
  }
  ASSERT_THAT(engine->WriteBatch(writes), IsOk());
  ASSERT_THAT(engine->ReadBatch(reads), IsOk());
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(src[i], dst[i]) << "request " << i;
  EXPECT_GE(engine->counters().pieces, 2 * kFiles * kPerFile * 4);
}

// Short transfers and EAGAIN/EINTR, made to happen by the test hooks (a real disk rarely does either on demand):
// the loops that continue a transfer where it stopped and retry a refused one run for real, and the bytes are exact.
TEST_P(IoEngineTest, ShortTransfersAndRetriesStillMoveEveryByte) {
  for (int64_t cap : {int64_t{1000}, int64_t{4096 + 1}, int64_t{3 * 4096}}) {
    SCOPED_TRACE(::testing::Message() << "cap " << cap);
    IoOptions o = Small();
    o.hooks.cap_bytes_per_call = cap;
    o.hooks.eagain_every = 3;
    o.hooks.eintr_every = 7;
    auto engine = Make(o);
    ASSERT_NE(engine, nullptr);
    RoundTrip(*engine, dir_ + "/s", 77, (1 << 20) + 123, 0, 0, 5);
    RoundTrip(*engine, dir_ + "/s", 0, 3 * 4096, 3, 1, 6);
    // At least one continuation per piece that the cap cut, and the refused calls on top.
    EXPECT_GT(engine->counters().resubmits, engine->counters().pieces);
  }
}

TEST_P(IoEngineTest, BothBackendsWriteTheSameBytes) {
  auto engine = Make();
  ASSERT_NE(engine, nullptr);
  IoOptions other_opts = Small();
  other_opts.backend = GetParam() == Choice::kIoUring ? Choice::kThreads : Choice::kAuto;
  auto other = IoEngine::Create(other_opts);
  ASSERT_THAT(other.status(), IsOk());
  const int64_t n = 5 * (64 << 10) + 321;
  const std::vector<char> want = Pattern(n, 99);
  IoFile a = Open("a"), b = Open("b");
  ASSERT_THAT(engine->Write(a, 13, want.data(), n), IsOk());
  ASSERT_THAT((*other)->Write(b, 13, want.data(), n), IsOk());
  EXPECT_EQ(zero::testing::ReadWholeFile(dir_ + "/a"), zero::testing::ReadWholeFile(dir_ + "/b"));
  // Each reads what the other wrote.
  std::vector<char> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  ASSERT_THAT(engine->Read(b, 13, x.data(), n), IsOk());
  ASSERT_THAT((*other)->Read(a, 13, y.data(), n), IsOk());
  EXPECT_EQ(x, want);
  EXPECT_EQ(y, want);
}

// A file system that refuses O_DIRECT gets a buffered file, said so, with every byte moved. tmpfs did until Linux
// 6.6 (EINVAL at open), so /dev/shm is tried as it is; ramfs and procfs still refuse it.
TEST_P(IoEngineTest, DirectRefusedMeansBuffered) {
  auto engine = Make();
  ASSERT_NE(engine, nullptr);
  if (::access("/dev/shm", W_OK) == 0) {
    const std::string path = "/dev/shm/zero_io_test_" + std::to_string(::getpid());
    RoundTrip(*engine, path, 3, 28'824'000 / 16, 1, 0, 11);
    StatusOr<IoFile> f = IoFile::Open(path, IoFile::Mode::kRead);
    ASSERT_THAT(f.status(), IsOk());
    if (!f->direct()) {
      EXPECT_THAT(f->why_buffered(), HasSubstr("refused O_DIRECT"));
    }
    std::printf("/dev/shm: %s\n", f->direct() ? "takes O_DIRECT (tmpfs does since Linux 6.6)" : "buffered");
    ::unlink(path.c_str());
  }
  // procfs, on every Linux: a read-only file that refuses O_DIRECT.
  StatusOr<IoFile> comm = IoFile::Open("/proc/self/comm", IoFile::Mode::kRead);
  ASSERT_THAT(comm.status(), IsOk());
  EXPECT_FALSE(comm->direct());
  EXPECT_THAT(comm->why_buffered(), HasSubstr("EINVAL"));
  char c = 0;
  ASSERT_THAT(engine->Read(*comm, 0, &c, 1), IsOk());
  EXPECT_NE(c, 0);
}

// ramfs refuses O_DIRECT for files one can write. Mounting it needs root: in a child process with its own mount
// namespace, so nothing is left mounted whatever happens; skipped where the mount is not permitted.
TEST_P(IoEngineTest, RamfsRefusesDirectAndGetsEveryByte) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(77);
    std::string mnt = dir_ + "/ramfs";
    if (::mkdir(mnt.c_str(), 0700) != 0 || ::mount("ramfs", mnt.c_str(), "ramfs", 0, nullptr) != 0) _exit(77);
    IoOptions o = Small();
    o.backend = GetParam();
    auto engine = IoEngine::Create(o);
    if (!engine.ok()) _exit(2);
    auto f = IoFile::Open(mnt + "/x", IoFile::Mode::kTruncate);
    if (!f.ok() || f->direct() || f->why_buffered().find("refused O_DIRECT") == std::string::npos) _exit(3);
    const int64_t n = 3 * (64 << 10) + 17;
    const std::vector<char> want = Pattern(n, 3);
    std::vector<char> back(static_cast<size_t>(n));
    if (!(*engine)->Write(*f, 5, want.data(), n).ok() || !(*engine)->Read(*f, 5, back.data(), n).ok()) _exit(4);
    if (back != want) _exit(5);
    if ((*engine)->counters().buffered_pieces != (*engine)->counters().pieces) _exit(6);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "mounting ramfs is not permitted here";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed at step " << WEXITSTATUS(status);
}

TEST_P(IoEngineTest, ReadingPastTheEndNamesThePathAndOffset) {
  auto engine = Make();
  ASSERT_NE(engine, nullptr);
  IoFile f = Open("short");
  const std::vector<char> data = Pattern(10'000, 1);
  ASSERT_THAT(engine->Write(f, 0, data.data(), 10'000), IsOk());
  std::vector<char> out(8192);
  // Past the end inside the aligned middle (direct) and inside the buffered tail.
  for (int64_t offset : {int64_t{4096}, int64_t{9000}}) {
    EXPECT_THAT(engine->Read(f, offset, out.data(), 8192),
                StatusIs(absl::StatusCode::kOutOfRange,
                         ::testing::AllOf(HasSubstr(dir_ + "/short"), HasSubstr(absl::StrCat("offset ", offset)),
                                          HasSubstr("8192 bytes"), HasSubstr("the file has 10000 bytes"))));
  }
  // The engine still works after an error.
  ASSERT_THAT(engine->Read(f, 0, out.data(), 8192), IsOk());
  EXPECT_EQ(std::memcmp(out.data(), data.data(), 8192), 0);
}

TEST_P(IoEngineTest, WritingToAReadOnlyFileNamesThePathAndOffset) {
  auto engine = Make();
  ASSERT_NE(engine, nullptr);
  { IoFile created = Open("ro"); }
  IoFile f = Open("ro", IoFile::Mode::kRead);
  const std::vector<char> data = Pattern(3 * 4096, 1);
  EXPECT_THAT(engine->Write(f, 4096, data.data(), 3 * 4096),
              StatusIs(absl::StatusCode::kFailedPrecondition,  // EBADF, as absl maps it
                       ::testing::AllOf(HasSubstr(dir_ + "/ro"), HasSubstr("offset 4096"), HasSubstr("errno 9"))));
}

// A path that is not a file: a FIFO would block the open (or the first read) for ever waiting for a writer; a
// directory cannot take blocks at offsets. Both are refused at Open, at once, naming the path and what it is, with
// and without O_DIRECT.
TEST(IoFileTest, AFifoOrADirectoryIsRefusedAtOpen) {
  const std::string dir = zero::testing::MakeTempDir("zero_io_kind");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  for (bool direct : {true, false}) {
    for (IoFile::Mode mode : {IoFile::Mode::kRead, IoFile::Mode::kReadWrite}) {
      EXPECT_THAT(IoFile::Open(fifo, mode, direct).status(),
                  StatusIs(absl::StatusCode::kFailedPrecondition,
                           ::testing::AllOf(HasSubstr(fifo), HasSubstr("is a FIFO"), HasSubstr("regular files"))));
    }
    EXPECT_THAT(
        IoFile::Open(dir, IoFile::Mode::kRead, direct).status(),
        StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::AllOf(HasSubstr(dir), HasSubstr("is a directory"))));
  }
  // A regular file still opens, and blocks (the flag the check opened it with is cleared).
  ASSERT_OK_AND_ASSIGN(IoFile f, IoFile::Open(dir + "/file", IoFile::Mode::kTruncate));
  EXPECT_EQ(::fcntl(f.fd(), F_GETFL) & O_NONBLOCK, 0);
}

TEST_P(IoEngineTest, AdoptedDirectDescriptor) {
  auto engine = Make();
  ASSERT_NE(engine, nullptr);
  const std::string path = dir_ + "/adopted";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  {
    StatusOr<IoFile> f = IoFile::Adopt(fd, path);
    ASSERT_THAT(f.status(), IsOk());
    EXPECT_TRUE(f->direct());
    const std::vector<char> want = Pattern(70'001, 4);
    std::vector<char> back(want.size());
    ASSERT_THAT(engine->Write(*f, 1, want.data(), 70'001), IsOk());
    ASSERT_THAT(engine->Read(*f, 1, back.data(), 70'001), IsOk());
    EXPECT_EQ(back, want);
  }
  EXPECT_EQ(::fcntl(fd, F_GETFD), FD_CLOEXEC);  // still open: the caller's
  ::close(fd);
}

TEST_P(IoEngineTest, StagingIsCountedAsStaging) {
  MemoryTracker tracker;
  {
    IoOptions o = Small();
    o.tracker = &tracker;
    auto engine = Make(o);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(tracker.Report().Get(MemTier::kHost, MemTag::kStaging).current, 4 * (64 << 10));
    EXPECT_EQ(engine->staging_bytes(), 4 * (64 << 10));
  }
  EXPECT_EQ(tracker.Report().Get(MemTier::kHost, MemTag::kStaging).current, 0);
  tracker.SetLimit(MemTier::kHost, 100 << 10);
  IoOptions o = Small();
  o.tracker = &tracker;
  o.backend = GetParam();
  EXPECT_THAT(IoEngine::Create(o).status(), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("staging")));
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineTest, ::testing::Values(Choice::kIoUring, Choice::kThreads),
                         [](const ::testing::TestParamInfo<Choice>& i) {
                           return std::string(i.param == Choice::kIoUring ? "io_uring" : "threads");
                         });

TEST(IoOptionsTest, FromTheConfigsAioSection) {
  const IoOptions o = IoOptionsFromConfig(Config::Default());
  EXPECT_EQ(o.block_size, 1 << 20);  // DeepSpeed's defaults
  EXPECT_EQ(o.queue_depth, 8);
  EXPECT_FALSE(o.single_submit);
  EXPECT_TRUE(o.overlap_events);
}

TEST(IoOptionsTest, BadOptionsNameTheField) {
  IoOptions o;
  o.block_size = 1000;
  EXPECT_THAT(IoEngine::Create(o).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
  o.block_size = int64_t{2} << 30;
  EXPECT_THAT(IoEngine::Create(o).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 GiB")));
  o = IoOptions();
  o.queue_depth = 0;
  EXPECT_THAT(IoEngine::Create(o).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("queue_depth")));
  o = IoOptions();
  o.alignment = 512;
  EXPECT_THAT(IoEngine::Create(o).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("alignment")));
}

TEST(IoOptionsTest, TheEnvironmentChoosesTheBackend) {
  // Put back as it was: the run may have been given ZERO_IO_BACKEND for the other tests.
  const char* was = std::getenv("ZERO_IO_BACKEND");
  const std::string saved = was != nullptr ? was : "";
  struct Restore {
    const char* was;
    std::string saved;
    ~Restore() { was != nullptr ? ::setenv("ZERO_IO_BACKEND", saved.c_str(), 1) : ::unsetenv("ZERO_IO_BACKEND"); }
  } restore{was, saved};
  ASSERT_EQ(::setenv("ZERO_IO_BACKEND", "threads", 1), 0);
  auto e = IoEngine::Create(IoOptions{.backend = Choice::kIoUring});
  ASSERT_THAT(e.status(), IsOk());
  EXPECT_EQ((*e)->backend().backend, IoBackend::kThreads);
  EXPECT_THAT((*e)->backend().reason, HasSubstr("ZERO_IO_BACKEND=threads"));
  ASSERT_EQ(::setenv("ZERO_IO_BACKEND", "libaio", 1), 0);
  EXPECT_THAT(IoEngine::Create(IoOptions()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ZERO_IO_BACKEND=libaio")));
}

TEST(IoOptionsTest, TheDefaultIsIoUringWhereTheKernelHasIt) {
  if (std::getenv("ZERO_IO_BACKEND") != nullptr) GTEST_SKIP() << "ZERO_IO_BACKEND is set";
  auto e = IoEngine::Create(IoOptions());
  ASSERT_THAT(e.status(), IsOk());
  std::printf("backend %s: %s\n", IoBackendName((*e)->backend().backend), (*e)->backend().reason.c_str());
  if (!IoEngine::IoUringBuilt()) {
    EXPECT_EQ((*e)->backend().backend, IoBackend::kThreads);
    EXPECT_THAT((*e)->backend().reason, HasSubstr("liburing"));
  } else if ((*e)->backend().backend == IoBackend::kThreads) {
    EXPECT_THAT((*e)->backend().reason, HasSubstr("io_uring_queue_init"));  // refused, and said why
  }
}

}  // namespace
}  // namespace zero::io
