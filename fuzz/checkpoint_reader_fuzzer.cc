// Fuzz target: the checkpoint shard reader (ckpt::CheckpointReader: Open, VerifyAll, Read) over a checkpoint
// folder written from the input.
//
// Input: u8 flags | u16 n (little-endian) | n bytes of meta.json | the rank files back to back. The rank files
// are cut before each "ZEROCKPT" (the magic every rank file starts with; bytes before the first one make a file
// of their own) and written under the names meta.json gives its ranks, in order. The seeds are checkpoints the
// engine wrote. The flags repair what a mutation almost never gets right, so the checks behind them are reached:
//   bit 0  recompute meta.json's checksum (as MetaToJson does)
//   bit 1  pad each rank file with zeros to the size meta.json records (up to 4 MiB: multi-block sections)
//   bit 2  set each rank's recorded size to its file's actual size
//   bit 3  recompute every section's block checksums from the file's bytes
//   bits 4-7  where the partial reads below start and end
// Properties: no crash, hang or huge allocation; Open, VerifyAll and Read return errors, never wrong values: a
// second VerifyAll agrees with the first; when VerifyAll passes, every Read succeeds, a part read equals the same
// part of the whole, and a read converted to f32 equals the stored values converted; and the tools agree
// (DescribeCheckpoint; ExportSafetensors reads back as the values; ReshardCheckpoint's copy verifies and holds
// the same values).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/internal/crc32c.h"
#include "checkpoint/internal/format.h"
#include "fuzz_check.h"
#include "nlohmann/json.hpp"
#include "zero/checkpoint.h"

namespace {

using json = nlohmann::json;
namespace ckpt = zero::ckpt;

constexpr int64_t kMaxPad = int64_t{4} << 20;        // bytes a rank file is padded to at most
constexpr int64_t kMaxReadElems = int64_t{4} << 20;  // elements of one stream read at most

// A json integer field as int64, or -1.
int64_t IntField(const json& obj, const char* key) {
  if (!obj.is_object()) return -1;
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) return -1;
  return it->get<int64_t>();
}

// The dtype size of unit `u`'s stream `s` in the input meta, or 0.
int64_t StreamBytes(const json& meta, int64_t u, int64_t s) {
  const json* units = meta.contains("units") ? &meta["units"] : nullptr;
  if (units == nullptr || !units->is_array() || u < 0 || u >= static_cast<int64_t>(units->size())) return 0;
  const json& ju = (*units)[u];
  if (!ju.is_object() || !ju.contains("streams") || !ju["streams"].is_array()) return 0;
  const json& streams = ju["streams"];
  if (s < 0 || s >= static_cast<int64_t>(streams.size()) || !streams[s].is_object()) return 0;
  auto d = streams[s].find("dtype");
  if (d == streams[s].end() || !d->is_string()) return 0;
  zero::StatusOr<zero::DType> t = zero::ParseDType(d->get<std::string>());
  return t.ok() ? static_cast<int64_t>(zero::DTypeSize(*t)) : 0;
}

void Repair(uint8_t flags, json& meta, std::vector<std::string>& files) {
  if (!meta.is_object() || !meta.contains("ranks") || !meta["ranks"].is_array()) return;
  json& ranks = meta["ranks"];
  for (size_t r = 0; r < ranks.size() && r < files.size(); ++r) {
    json& jr = ranks[r];
    if (!jr.is_object()) continue;
    std::string& f = files[r];
    const int64_t recorded = IntField(jr, "bytes");
    if ((flags & 2) && recorded > static_cast<int64_t>(f.size()) && recorded <= kMaxPad) f.resize(recorded, '\0');
    if (flags & 4) jr["bytes"] = f.size();
    if (!(flags & 8)) continue;
    // The rank-state sections' element size: meta.json's qgz_residuals.dtype.
    int64_t rank_state_es = 0;
    if (meta.contains("qgz_residuals") && meta["qgz_residuals"].is_object() &&
        meta["qgz_residuals"].contains("dtype") && meta["qgz_residuals"]["dtype"].is_string()) {
      zero::StatusOr<zero::DType> t = zero::ParseDType(meta["qgz_residuals"]["dtype"].get<std::string>());
      rank_state_es = t.ok() ? static_cast<int64_t>(zero::DTypeSize(*t)) : 0;
    }
    for (const char* list : {"sections", "rank_state"}) {
      if (!jr.contains(list) || !jr[list].is_array()) continue;
      for (json& js : jr[list]) {
        const int64_t begin = IntField(js, "begin"), end = IntField(js, "end"), offset = IntField(js, "offset");
        const int64_t es = std::string(list) == "rank_state"
                               ? rank_state_es
                               : StreamBytes(meta, IntField(js, "unit"), IntField(js, "stream"));
        if (es == 0 || begin < 0 || end < begin || offset < 0 || end - begin > kMaxPad) continue;
        const int64_t bytes = (end - begin) * es;
        if (offset > static_cast<int64_t>(f.size()) || bytes > static_cast<int64_t>(f.size()) - offset) continue;
        json crcs = json::array();
        for (int64_t b = 0; b < bytes; b += ckpt::kBlockBytes) {
          crcs.push_back(ckpt::Crc32c(0, f.data() + offset + b, std::min(ckpt::kBlockBytes, bytes - b)));
        }
        js["crc32c"] = crcs;
      }
    }
  }
}

// Every stream of every unit not too large to hold, as stored, by (unit, stream); with `verified`, each must
// read, and parts of it must read as the same values.
std::map<std::pair<size_t, size_t>, std::vector<char>> CheckReads(ckpt::CheckpointReader& reader, bool verified,
                                                                  uint8_t flags) {
  std::map<std::pair<size_t, size_t>, std::vector<char>> values;
  const ckpt::Meta& m = reader.meta();
  for (size_t u = 0; u < m.units.size(); ++u) {
    const int64_t numel = m.units[u].numel;
    if (numel > kMaxReadElems) continue;
    for (size_t s = 0; s < m.units[u].streams.size(); ++s) {
      const zero::DType dt = m.units[u].streams[s].dtype;
      const size_t es = zero::DTypeSize(dt);
      const std::string what = absl::StrCat("unit ", u, " stream ", s);
      std::vector<char> whole(static_cast<size_t>(numel) * es);
      zero::Status st = reader.Read(static_cast<int>(u), static_cast<int>(s), 0, numel, dt, whole.data());
      if (!verified) continue;  // an error or not, but no crash
      FUZZ_CHECK(st.ok(), what + ": VerifyAll passed but Read fails: " + st.ToString());
      // A part, read as stored and as f32, is the same part of the whole.
      const int64_t a = numel * (flags >> 4 & 3) / 4, b = numel - numel * (flags >> 6) / 8;
      if (a < b) {
        std::vector<char> part(static_cast<size_t>(b - a) * es);
        st = reader.Read(static_cast<int>(u), static_cast<int>(s), a, b, dt, part.data());
        FUZZ_CHECK(st.ok(), what + ": a part read fails: " + st.ToString());
        FUZZ_CHECK(std::memcmp(part.data(), whole.data() + a * es, part.size()) == 0, what + ": a part read differs");
        std::vector<float> f32(static_cast<size_t>(b - a)), want(f32.size());
        st = reader.Read(static_cast<int>(u), static_cast<int>(s), a, b, zero::DType::kF32, f32.data());
        FUZZ_CHECK(st.ok(), what + ": an f32 read fails: " + st.ToString());
        zero::ConvertBuffer(whole.data() + a * es, dt, want.data(), zero::DType::kF32, want.size());
        FUZZ_CHECK(std::memcmp(f32.data(), want.data(), want.size() * 4) == 0, what + ": an f32 read differs");
      }
      values[{u, s}] = std::move(whole);
    }
  }
  // Each rank's own state (qgZ's residuals): read whole, and once verified, without an error.
  for (size_t r = 0; r < m.ranks.size(); ++r) {
    for (const ckpt::Section& s : m.ranks[r].rank_state) {
      if (s.end - s.begin > kMaxReadElems) continue;
      std::vector<char> state(static_cast<size_t>(s.end - s.begin) * zero::DTypeSize(m.qgz->dtype));
      const zero::Status st = reader.ReadRankState(static_cast<int>(r), s, state.data());
      if (verified)
        FUZZ_CHECK(st.ok(),
                   absl::StrCat("rank ", r, ": VerifyAll passed but a rank-state read fails: ", st.ToString()));
    }
  }
  return values;
}

// A checkpoint that verifies is described, exported (the export reads back as its values) and resharded (the
// resharded checkpoint verifies and holds the same values).
void CheckTools(const std::string& dir, const ckpt::Meta& m,
                const std::map<std::pair<size_t, size_t>, std::vector<char>>& values, uint8_t flags) {
  zero::StatusOr<std::string> described = zero::DescribeCheckpoint(dir, "t");
  FUZZ_CHECK(described.ok(), "a verified checkpoint is not described: " + described.status().ToString());
  for (const auto& [key, v] : values) {
    if (v.size() > (size_t{1} << 20)) return;  // the tools below stay quick
  }
  if (values.size() != [&] {
        size_t n = 0;
        for (const auto& u : m.units) n += u.streams.size();
        return n;
      }()) {
    return;  // a stream too large to hold
  }

  const std::string out = dir + "/export.safetensors";
  const zero::Status exported = zero::ExportSafetensors(dir, out, {.tag = "t"});
  FUZZ_CHECK(exported.ok() || exported.code() == absl::StatusCode::kDataLoss, exported.ToString());
  if (exported.ok()) {
    zero::StatusOr<std::unique_ptr<zero::SafetensorsFile>> st = zero::SafetensorsFile::Open(out);
    FUZZ_CHECK(st.ok(), "an export does not read back: " + st.status().ToString());
    size_t params = 0;
    for (size_t u = 0; u < m.units.size(); ++u) {
      int stream = m.units[u].Stream("master");
      if (stream < 0) stream = m.units[u].Stream("param");
      const zero::DType dt = m.units[u].streams[stream].dtype;
      const std::vector<char>& v = values.at({u, static_cast<size_t>(stream)});
      for (const ckpt::ParamMeta& p : m.units[u].params) {
        ++params;
        const std::string name = m.units[u].name + "." + p.name;
        std::vector<float> got(static_cast<size_t>(p.numel)), want(got.size());
        const zero::Status r = (*st)->ReadF32(name, got.data(), p.numel);
        FUZZ_CHECK(r.ok(), "exported tensor " + name + " does not read: " + r.ToString());
        zero::ConvertBuffer(v.data() + p.offset * zero::DTypeSize(dt), dt, want.data(), zero::DType::kF32, want.size());
        FUZZ_CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0, "exported tensor " + name + " differs");
      }
    }
    FUZZ_CHECK((*st)->tensors().size() == params,
               absl::StrCat("the export holds ", (*st)->tensors().size(), " tensors for ", params, " parameters"));
  }

  // The resharded copy goes to re/<tag>: the tag must not be a path.
  FUZZ_CHECK(ckpt::SafeFileName(m.tag), "meta.json's tag \"" + m.tag + "\" was accepted");
  const std::string re = dir + "/re";
  int world = (flags >> 4) % 3 + 1;
  // A world past the largest unit's 32-element blocks is refused (its extra ranks would hold nothing), with
  // nothing written; the largest world allowed is then taken instead.
  int64_t blocks = 1;
  for (const auto& u : m.units) blocks = std::max(blocks, (u.numel + 31) / 32);
  if (world > blocks) {
    const zero::Status refused = zero::ReshardCheckpoint(dir, "t", re, world);
    FUZZ_CHECK(refused.code() == absl::StatusCode::kInvalidArgument &&
                   refused.message().find("would hold nothing") != std::string_view::npos,
               "a world past the blocks was not refused: " + refused.ToString());
    FUZZ_CHECK(!std::filesystem::exists(re), "a refused reshard wrote " + re);
    world = static_cast<int>(blocks);
  }
  const zero::Status resharded = zero::ReshardCheckpoint(dir, "t", re, world);
  FUZZ_CHECK(resharded.ok(), "a verified checkpoint does not reshard: " + resharded.ToString());
  zero::StatusOr<std::unique_ptr<ckpt::CheckpointReader>> r2 = ckpt::CheckpointReader::Open(re, "");
  FUZZ_CHECK(r2.ok(), "a resharded checkpoint does not open: " + r2.status().ToString());
  const zero::Status verified = (*r2)->VerifyAll();
  FUZZ_CHECK(verified.ok(), "a resharded checkpoint does not verify: " + verified.ToString());
  FUZZ_CHECK((*r2)->meta().world_size == world, "resharded to the wrong world size");
  for (const auto& [key, v] : values) {
    std::vector<char> got(v.size());
    const zero::Status st =
        (*r2)->Read(static_cast<int>(key.first), static_cast<int>(key.second), 0, m.units[key.first].numel,
                    m.units[key.first].streams[key.second].dtype, got.data());
    FUZZ_CHECK(st.ok() && got == v,
               absl::StrCat("resharded unit ", key.first, " stream ", key.second, " differs: ", st.ToString()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zero::fuzz::QuietLogs();
  if (size < 3) return 0;
  const uint8_t flags = data[0];
  const size_t n = std::min<size_t>(data[1] | (size_t{data[2]} << 8), size - 3);
  std::string meta_text(reinterpret_cast<const char*>(data) + 3, n);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 3 + n, size - 3 - n);
  std::vector<std::string> files;
  const std::string_view magic(ckpt::kRankMagic, sizeof(ckpt::kRankMagic));
  for (size_t at = 0; at < rest.size();) {
    const size_t next = rest.find(magic, at + 1);
    const size_t end = next == std::string_view::npos ? rest.size() : next;
    files.emplace_back(rest.substr(at, end - at));
    at = end;
  }

  json meta = json::parse(meta_text, nullptr, /*allow_exceptions=*/false);
  if (flags & 0xF) Repair(flags, meta, files);
  if ((flags & 0xF) && meta.is_object()) {
    meta.erase("checksum");
    if (flags & 1) {
      const std::string canonical = meta.dump();
      meta["checksum"] = absl::StrFormat("crc32c:%08x", ckpt::Crc32c(0, canonical.data(), canonical.size()));
    }
    meta_text = meta.dump(1);
  }

  const std::string& dir = zero::fuzz::ScratchDir();
  const std::string folder = dir + "/t";
  zero::fuzz::ClearDir(dir);
  zero::fuzz::WriteFile(dir + "/latest", "t\n");
  std::filesystem::create_directory(folder);
  zero::fuzz::WriteFile(folder + "/" + ckpt::kMetaFile, meta_text);
  if (meta.is_object() && meta.contains("ranks") && meta["ranks"].is_array()) {
    for (size_t r = 0; r < meta["ranks"].size() && r < files.size(); ++r) {
      const json& jr = meta["ranks"][r];
      if (!jr.is_object() || !jr.contains("file") || !jr["file"].is_string()) continue;
      const std::string name = jr["file"].get<std::string>();
      // Only names the reader accepts, so nothing is written outside the folder.
      if (!ckpt::SafeFileName(name) || name == ckpt::kMetaFile) continue;
      zero::fuzz::WriteFile(folder + "/" + name, files[r]);
    }
  }

  zero::StatusOr<std::unique_ptr<ckpt::CheckpointReader>> reader = ckpt::CheckpointReader::Open(dir, "");
  if (!reader.ok()) {
    FUZZ_CHECK(reader.status().code() == absl::StatusCode::kDataLoss, reader.status().ToString());
    return 0;
  }
  const zero::Status verified = (*reader)->VerifyAll();
  FUZZ_CHECK(verified.ok() || verified.code() == absl::StatusCode::kDataLoss ||
                 verified.code() == absl::StatusCode::kNotFound,
             verified.ToString());
  // An error is not forgotten: checking again (a caller retrying) gives the same answer.
  const zero::Status again = (*reader)->VerifyAll();
  FUZZ_CHECK(again.ok() == verified.ok(), "VerifyAll said " + verified.ToString() + ", then " + again.ToString());
  const auto values = CheckReads(**reader, verified.ok(), flags);
  if (verified.ok()) CheckTools(dir, (*reader)->meta(), values, flags);
  return 0;
}
