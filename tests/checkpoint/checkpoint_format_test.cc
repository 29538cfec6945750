// The checkpoint format against damage and crashes: CRC-32C against its reference values; byte flips and cuts at
// every section boundary of every file never crash the loader and never load wrong values; a missing rank file,
// another format version and another model are errors that name the file; an export reads back, through an
// independent Python reader, as exactly GatherParam's values; and SIGKILL at random moments while saving always
// leaves the previous checkpoint loadable, with `verify` naming the incomplete one.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/internal/crc32c.h"
#include "checkpoint/internal/format.h"
#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::Borrow;
using ::testing::HasSubstr;
using testing::StatusIs;
using testing::TrainConfig;

std::string MakeTempDir() { return testing::MakeTempDir("zero_ckptf"); }
using testing::ReadWholeFile;
using testing::WriteWholeFile;

TEST(Crc32cTest, ReferenceValuesAndHardwareEqualsTable) {
  EXPECT_EQ(ckpt::Crc32c(0, "123456789", 9), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(ckpt::Crc32c(0, "", 0), 0u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(ckpt::Crc32c(0, zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(60000);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  // The hardware version runs three chains over lanes of 8 KiB, then of 256 bytes, then one chain (crc32c.cc):
  // lengths at and around each of those edges, and ones that take every kind of chunk at once.
  for (size_t off : {0, 1, 3, 7}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 767, 768, 769, 1000, 4093, 24575, 24576, 24577, 24576 + 768 + 13,
                     2 * 24576 + 5 * 256 + 7, 59993}) {
      EXPECT_EQ(ckpt::Crc32c(0, buf.data() + off, n), ckpt::internal::Crc32cPortable(0, buf.data() + off, n))
          << off << " " << n;
      // Continuation: the checksum of a then b is the checksum of ab.
      const uint32_t part = ckpt::Crc32c(0, buf.data() + off, n / 3);
      EXPECT_EQ(ckpt::Crc32c(part, buf.data() + off + n / 3, n - n / 3), ckpt::Crc32c(0, buf.data() + off, n));
    }
  }
}

// A bf16 checkpoint at world 2 after two steps (master, 16-bit parameters, two Adam states per unit).
struct Saved {
  std::string dir, folder;
  std::map<std::string, std::vector<float>> params;
};
Saved SaveOne() {
  Saved s;
  s.dir = MakeTempDir();
  Config cfg = TrainConfig(2, 1);
  cfg.bf16.enabled = true;
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
    testing::SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 2, 1, testing::HostViewIo(), &t));
    ASSERT_OK(e->Save(s.dir).status());
    if (rank == 0) s.params = t.params;
  });
  s.folder = s.dir + "/step-00000002";
  return s;
}

// Loads `dir` into a fresh world-1 engine: an error, or exactly the saved parameters.
Status LoadAndCompare(const Saved& s) {
  Status out;
  Config cfg = TrainConfig(1, 1);
  cfg.bf16.enabled = true;
  testing::RunRanks(1, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
    auto r = e->Load(s.dir);
    out = r.status();
    if (!r.ok()) return;
    for (const auto& [name, want] : s.params) {
      const size_t dot = name.find('.');
      ASSERT_OK_AND_ASSIGN(auto v, e->GatherParam(e->FindUnit(name.substr(0, dot)), name.substr(dot + 1)));
      ASSERT_EQ(0, std::memcmp(v.data(), want.data(), v.size() * 4)) << "silently wrong values in " << name;
    }
  });
  return out;
}

// Byte offsets worth damaging in each file: every section's first and last byte and the bytes either side of
// each boundary, the header, and the end.
std::map<std::string, std::vector<int64_t>> Boundaries(const Saved& s) {
  std::map<std::string, std::vector<int64_t>> at;
  auto meta = ckpt::MetaFromJson(ReadWholeFile(s.folder + "/meta.json"), "meta.json");
  ZERO_CHECK(meta.ok()) << meta.status();
  for (const auto& r : meta->ranks) {
    auto& v = at[r.file];
    v = {0, 7, 8, 12, 16, ckpt::kRankHeaderBytes - 1, r.bytes - 1};
    for (const auto& sec : r.sections) {
      const int64_t bytes =
          (sec.end - sec.begin) * static_cast<int64_t>(DTypeSize(meta->units[sec.unit].streams[sec.stream].dtype));
      for (int64_t b : {sec.offset - 1, sec.offset, sec.offset + 1, sec.offset + bytes / 2, sec.offset + bytes - 1}) {
        if (b >= 0 && b < r.bytes) v.push_back(b);
      }
    }
  }
  const int64_t m = static_cast<int64_t>(ReadWholeFile(s.folder + "/meta.json").size());
  auto& v = at["meta.json"];
  for (int64_t b = 0; b < m; b += std::max<int64_t>(1, m / 40)) v.push_back(b);
  v.push_back(m - 2);
  v.push_back(m - 1);
  at["../latest"] = {0, 5};
  return at;
}

TEST(CheckpointDamageTest, FlipsAndCutsAtEveryBoundaryNeverCrashOrLoadWrongValues) {
  const Saved s = SaveOne();
  ASSERT_FALSE(HasFailure());
  ASSERT_OK(LoadAndCompare(s));
  int flips = 0, flips_caught = 0, cuts = 0;
  for (const auto& [file, offsets] : Boundaries(s)) {
    const std::string path = s.folder + "/" + file;
    const std::string good = ReadWholeFile(path);
    for (int64_t b : offsets) {
      std::string bad = good;
      bad[b] = static_cast<char>(bad[b] ^ 0x40);
      WriteWholeFile(path, bad);
      ++flips;
      const Status st = LoadAndCompare(s);
      ASSERT_FALSE(HasFailure()) << file << " flipped at " << b;  // no wrong values
      if (!st.ok()) {
        ++flips_caught;
        // The error names the damaged file (or, for `latest`, that it names no checkpoint).
        const std::string msg(st.message());
        const std::string base = file.substr(file.find_last_of('/') + 1);
        EXPECT_TRUE(msg.find(base) != std::string::npos || msg.find("no checkpoint") != std::string::npos)
            << file << "@" << b << ": " << msg;
        EXPECT_FALSE(VerifyCheckpoint(s.dir).ok()) << file << "@" << b;
      }
      // Cuts: the file ends just before this byte.
      WriteWholeFile(path, good.substr(0, static_cast<size_t>(b)));
      ++cuts;
      const Status cut = LoadAndCompare(s);
      ASSERT_FALSE(HasFailure()) << file << " cut at " << b;  // no wrong values
      // (Only meta.json's trailing newline may go: the JSON is whole without it.)
      if (!(file == "meta.json" && b + 1 == static_cast<int64_t>(good.size()))) {
        EXPECT_FALSE(cut.ok()) << file << " cut at " << b << " loaded";
      }
      WriteWholeFile(path, good);
    }
  }
  // Every flip is caught: no byte of a checkpoint goes unchecked (the rank header's reserved bytes must be zero).
  EXPECT_EQ(flips_caught, flips);
  ASSERT_OK(LoadAndCompare(s));
  std::printf("%d flips (%d caught), %d cuts\n", flips, flips_caught, cuts);
}

TEST(CheckpointDamageTest, MissingFileAndAnotherVersionAreNamed) {
  const Saved s = SaveOne();
  ASSERT_FALSE(HasFailure());
  const std::string rank1 = s.folder + "/rank-00001-of-00002.bin";
  const std::string kept = ReadWholeFile(rank1);
  ASSERT_EQ(0, ::unlink(rank1.c_str()));
  Status st = LoadAndCompare(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(std::string(st.message()).find("rank-00001-of-00002.bin is missing"), std::string::npos) << st;
  st = VerifyCheckpoint(s.dir);
  EXPECT_NE(std::string(st.message()).find("rank-00001-of-00002.bin"), std::string::npos) << st;
  WriteWholeFile(rank1, kept);
  // Another format version, with a valid checksum: named as such.
  auto meta = ckpt::MetaFromJson(ReadWholeFile(s.folder + "/meta.json"), "meta.json");
  ASSERT_OK(meta.status());
  meta->format_version = 2;
  WriteWholeFile(s.folder + "/meta.json", ckpt::MetaToJson(*meta));
  st = LoadAndCompare(s);
  EXPECT_NE(std::string(st.message()).find("format_version is 2; this build reads version 1"), std::string::npos) << st;
}

// What fuzz/ found in the readers (docs/internals/fuzzing.md): a tag that is a path (zero-ckpt reshard then wrote
// outside its output folder; "latest" collides with DIR/latest), and JSON nested a million deep (a stack overflow in
// nlohmann's recursive dump) are errors, in meta.json, a rank's description and a safetensors header alike.
TEST(CheckpointDamageTest, PathTagsAndDeepNestingAreRefused) {
  ckpt::Meta m;
  m.ranks.push_back({.file = "r.bin", .bytes = ckpt::kRankHeaderBytes});
  for (const std::string tag : {"../escape", "/abs", "latest", ""}) {
    m.tag = tag;
    EXPECT_THAT(ckpt::MetaFromJson(ckpt::MetaToJson(m), "meta.json"),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is not a plain folder name")))
        << tag;
  }
  m.tag = "step-1";
  EXPECT_OK(ckpt::MetaFromJson(ckpt::MetaToJson(m), "meta.json").status());

  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  EXPECT_THAT(ckpt::MetaFromJson("{\"checksum\": \"x\", \"a\": " + deep + "}", "meta.json"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("nested deeper than 128 levels")));
  EXPECT_THAT(ckpt::RankFileMetaFromJson("{\"file\": " + deep + "}", m, 0),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("nested deeper than 128 levels")));
  const std::string dir = MakeTempDir();
  std::string header = "{\"t\": {\"dtype\": \"F32\", \"shape\": [" + deep + "], \"data_offsets\": [0, 4]}}";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(header.size() >> (8 * i));
  WriteWholeFile(dir + "/deep.safetensors", file + header + "abcd");
  EXPECT_THAT(SafetensorsFile::Open(dir + "/deep.safetensors"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("nests deeper than 128 levels")));
  std::filesystem::remove_all(dir);
}

// Initial weights from a safetensors file by name: an Engine whose units are named otherwise takes an export
// through a name map; a missing tensor, another shape and (strict) an unused tensor are errors naming them.
TEST(SafetensorsImportTest, LoadSafetensorsByNameWithAMap) {
  const Saved s = SaveOne();
  ASSERT_FALSE(HasFailure());
  const std::string file = s.dir + "/init.safetensors";
  ASSERT_OK(ExportSafetensors(s.dir, file));
  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(TrainConfig(3, 1), Borrow(comm)));
    LoadOptions lo;
    std::vector<std::pair<UnitId, std::string>> names;
    for (const auto& [unit, specs] : testing::SyntheticUnits()) {
      ASSERT_OK_AND_ASSIGN(UnitId id, e->AddUnit("renamed_" + unit, specs));
      for (const ParamSpec& p : specs) {
        lo.name_map["renamed_" + unit + "." + p.name] = unit + "." + p.name;
        names.push_back({id, unit + "." + p.name});
      }
    }
    ASSERT_OK(e->Finalize(nullptr));
    ASSERT_OK(e->LoadSafetensors(file, lo));
    for (const auto& [id, name] : names) {
      ASSERT_OK_AND_ASSIGN(auto v, e->GatherParam(id, name.substr(name.find('.') + 1)));
      EXPECT_EQ(v, s.params.at(name)) << name;
    }
    // Without the map the names are not there.
    const Status missing = e->LoadSafetensors(file);
    EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
    EXPECT_NE(std::string(missing.message()).find("renamed_a.w"), std::string::npos) << missing;
  });
  testing::RunRanks(1, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(TrainConfig(1, 1), Borrow(comm)));
    ASSERT_OK(e->AddUnit("a", {{"w", {19, 37}}}).status());
    ASSERT_OK(e->Finalize(nullptr));
    const Status shape = e->LoadSafetensors(file, {.strict = false});
    EXPECT_NE(std::string(shape.message()).find("a.w has shape [19,37]"), std::string::npos) << shape;
    ASSERT_OK_AND_ASSIGN(auto c, Engine::Create(TrainConfig(1, 1), Borrow(comm)));
    ASSERT_OK(c->AddUnit("c", {{"v", {101}}}).status());
    ASSERT_OK(c->Finalize(nullptr));
    EXPECT_EQ(c->LoadSafetensors(file).code(), absl::StatusCode::kInvalidArgument);  // strict: unused tensors
    ASSERT_OK(c->LoadSafetensors(file, {.strict = false}));
  });
}

#ifdef ZERO_CKPT_PY_READER
// The export read back by tests/checkpoint/read_safetensors.py (stdlib + numpy): the same names, shapes and
// values as GatherParam, f32 exactly and bf16 as the values rounded to nearest even.
TEST(SafetensorsExportTest, AnIndependentReaderSeesGatherParamsValues) {
  const Saved s = SaveOne();
  ASSERT_FALSE(HasFailure());
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string out = s.dir + "/export.safetensors", txt = s.dir + "/export.txt";
    ExportOptions o;
    o.dtype = dt;
    ASSERT_OK(ExportSafetensors(s.dir, out, o));
    const std::string cmd = std::string(ZERO_PYTHON) + " " + ZERO_CKPT_PY_READER + " " + out + " " + txt;
    ASSERT_EQ(0, std::system(cmd.c_str())) << cmd;
    std::ifstream f(txt);
    std::string line;
    size_t seen = 0;
    while (std::getline(f, line)) {
      std::istringstream ls(line);
      std::string name, dims, hex;
      ASSERT_TRUE(std::getline(ls, name, '\t') && std::getline(ls, dims, '\t') && std::getline(ls, hex)) << line;
      const auto& want = s.params.at(name);
      ASSERT_EQ(hex.size(), want.size() * 8) << name;
      std::vector<float> expect(want);
      if (dt != DType::kF32) {
        std::vector<uint16_t> h(want.size());
        ConvertBuffer(want.data(), DType::kF32, h.data(), dt, want.size());
        ConvertBuffer(h.data(), dt, expect.data(), DType::kF32, want.size());
      }
      for (size_t i = 0; i < want.size(); ++i) {
        uint32_t bits = 0;
        for (int k = 0; k < 4; ++k) bits |= std::stoul(hex.substr(i * 8 + k * 2, 2), nullptr, 16) << (8 * k);
        uint32_t e;
        std::memcpy(&e, &expect[i], 4);
        ASSERT_EQ(bits, e) << name << "[" << i << "] " << DTypeName(dt);
      }
      ++seen;
    }
    EXPECT_EQ(seen, s.params.size());
  }
}
#endif

#ifdef ZERO_CKPT_TOOL
// Runs a command; its exit code and its stdout and stderr together.
std::pair<int, std::string> RunTool(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(ZeroCkptToolTest, InspectVerifyExportReshard) {
  const Saved s = SaveOne();
  ASSERT_FALSE(HasFailure());
  const std::string tool = ZERO_CKPT_TOOL;
  auto [rc, out] = RunTool(tool + " inspect " + s.dir);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("world size 2, stage 2, compute dtype bf16"), std::string::npos) << out;
  EXPECT_NE(out.find("step 2"), std::string::npos) << out;
  std::tie(rc, out) = RunTool(tool + " verify " + s.dir);
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = RunTool(tool + " export " + s.dir + " " + s.dir + "/w.safetensors --dtype bf16");
  EXPECT_EQ(rc, 0) << out;
  auto f = SafetensorsFile::Open(s.dir + "/w.safetensors");
  ASSERT_OK(f.status());
  EXPECT_EQ((*f)->tensors().size(), s.params.size());
  std::tie(rc, out) = RunTool(tool + " reshard " + s.dir + " " + s.dir + "/w3 --world 3 --stage 3");
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = RunTool(tool + " inspect " + s.dir + "/w3");
  EXPECT_NE(out.find("world size 3, stage 3"), std::string::npos) << out;
  // Damage: verify fails and names the file; a bad option is a usage error.
  const std::string rank0 = s.folder + "/rank-00000-of-00002.bin";
  std::string bytes = ReadWholeFile(rank0);
  bytes[bytes.size() / 2] ^= 1;
  WriteWholeFile(rank0, bytes);
  std::tie(rc, out) = RunTool(tool + " verify " + s.dir);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("rank-00000-of-00002.bin"), std::string::npos) << out;
  EXPECT_NE(out.find("checksum mismatch"), std::string::npos) << out;
  std::tie(rc, out) = RunTool(tool + " verify " + s.dir + " --all");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("step-00000002 (latest): "), std::string::npos) << out;
  std::tie(rc, out) = RunTool(tool + " reshard " + s.dir + " x");
  EXPECT_EQ(rc, 2) << out;
}
#endif

#ifdef ZERO_CKPT_KILL_WORKER
// A trainer saving after every step is killed with SIGKILL at a random moment, many times: the latest
// checkpoint always verifies and loads, and a save that was cut short is named incomplete by verify --all.
class CheckpointCrashTest : public ::testing::TestWithParam<bool> {};

// GetParam(): asynchronous saves (the kill lands mostly inside a background write, while the next step runs).
TEST_P(CheckpointCrashTest, SigkillWhileSavingLeavesThePreviousCheckpointLoadable) {
  const bool async = GetParam();
  constexpr int kTrials = 16;
  std::mt19937 rng(20261201);
  int incomplete_seen = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const std::string dir = MakeTempDir();
    int out[2];
    ASSERT_EQ(0, ::pipe(out));
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::execl(ZERO_CKPT_KILL_WORKER, ZERO_CKPT_KILL_WORKER, dir.c_str(), async ? "async" : static_cast<char*>(nullptr),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    // Wait for the first complete save, then kill at a random moment of the following ones. An asynchronous save
    // is complete (`latest`) once the next Save has returned: that one waited for it.
    char buf[256];
    std::string got;
    auto saves = [&got] {
      int n = 0;
      for (size_t at = got.find("saved"); at != std::string::npos; at = got.find("saved", at + 1)) ++n;
      return n;
    };
    while (saves() < (async ? 2 : 1)) {
      const ssize_t n = ::read(out[0], buf, sizeof(buf));
      ASSERT_GT(n, 0) << "the worker exited before its first save";
      got.append(buf, static_cast<size_t>(n));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 400000)(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(out[0]);
    ASSERT_TRUE(WIFSIGNALED(status)) << "trial " << trial;
    ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
    ASSERT_OK(VerifyCheckpoint(dir)) << "trial " << trial << ", latest " << latest;
    ASSERT_OK_AND_ASSIGN(auto all, VerifyAllCheckpoints(dir));
    for (const auto& [tag, st] : all) {
      if (tag <= latest) {
        EXPECT_OK(st) << tag;
      } else if (!st.ok()) {
        EXPECT_NE(std::string(st.message()).find("incomplete"), std::string::npos) << tag << ": " << st;
        ++incomplete_seen;
      }
      // (A newer tag that verifies was killed between its meta.json and `latest`: complete, not yet current.)
    }
    // The latest loads into a fresh engine.
    testing::RunRanks(1, [&](Communicator& comm, int) {
      Config cfg = TrainConfig(0, 1);
      ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(cfg, Borrow(comm)));
      ASSERT_OK(e->AddUnit("w", {{"v", {int64_t{1} << 21}}}).status());
      ASSERT_OK(e->Finalize(nullptr));
      ASSERT_OK_AND_ASSIGN(LoadResult r, e->Load(dir));
      EXPECT_EQ(r.tag, latest);
    });
    // A trial leaves hundreds of MB (a 24 MiB checkpoint per step saved): removed, or 32 trials fill a small disk.
    std::filesystem::remove_all(dir);
  }
  // Saves dominate the worker's loop, so some kills land inside one (the test would otherwise prove nothing).
  EXPECT_GT(incomplete_seen, 0);
  std::printf("%d trials, %d killed inside a%s save\n", kTrials, incomplete_seen, async ? "n asynchronous" : "");
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, CheckpointCrashTest, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "async" : "sync"); });
#endif

}  // namespace
}  // namespace zero
