// Fuzz target: a checkpoint's meta.json (ckpt::MetaFromJson) and a rank's file description
// (ckpt::RankFileMetaFromJson).
//
// meta.json carries a CRC-32C of its own canonical text, which a mutated input almost never matches; so each input
// is parsed twice: as it is (the checksum path), and with its checksum recomputed by MetaToJson's rule (parse,
// erase "checksum", compact dump, "crc32c:%08x"), which lets the validation behind the checksum see every input.
// An input object's "rank_file" member, if any, is taken out first and parsed as a rank's description against the
// meta (or, when the meta is rejected, against a fixed one), as is the whole input.
//
// Properties: no crash, hang, exception or huge allocation; every rejection is kDataLoss naming the file; an
// accepted meta writes (MetaToJson) as text that reads back to the same JSON, and each of its ranks' descriptions
// (RankFileMetaToJson) reads back too.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "checkpoint/internal/crc32c.h"
#include "checkpoint/internal/format.h"
#include "fuzz_check.h"
#include "nlohmann/json.hpp"

namespace {

using json = nlohmann::json;
namespace ckpt = zero::ckpt;

// A world-1 meta with one unit of 1000 elements (f32 master, bf16 parameters), for rank descriptions whose meta
// the input did not provide.
const ckpt::Meta& FixedMeta() {
  static const ckpt::Meta m = [] {
    ckpt::Meta m;
    m.tag = "t";
    ckpt::UnitMeta u;
    u.name = "u";
    u.numel = 1000;
    u.params.push_back({"w", {10, 100}, 0, 1000, -1});
    u.streams = {{"master", zero::DType::kF32}, {"param", zero::DType::kBF16}};
    m.units.push_back(u);
    m.ranks.resize(1);
    return m;
  }();
  return m;
}

void CheckRejection(const zero::Status& s, const std::string& what) {
  FUZZ_CHECK(s.code() == absl::StatusCode::kDataLoss, s.ToString());
  FUZZ_CHECK(s.message().find(what) != std::string_view::npos, "the error does not name " + what + ": " + s.ToString());
}

void CheckRankFile(const std::string& text, const ckpt::Meta& meta, int rank) {
  zero::StatusOr<ckpt::RankFileMeta> r = ckpt::RankFileMetaFromJson(text, meta, rank);
  if (!r.ok()) {
    CheckRejection(r.status(), "rank " + std::to_string(rank));
    return;
  }
  const std::string again = ckpt::RankFileMetaToJson(*r);
  zero::StatusOr<ckpt::RankFileMeta> r2 = ckpt::RankFileMetaFromJson(again, meta, rank);
  FUZZ_CHECK(r2.ok(), "an accepted rank description does not read back: " + r2.status().ToString());
  FUZZ_CHECK(ckpt::RankFileMetaToJson(*r2) == again, "a rank description changes on the way back: " + again);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zero::fuzz::QuietLogs();
  const std::string text(reinterpret_cast<const char*>(data), size);
  // As it is: almost always a checksum mismatch, but every path up to it runs.
  zero::StatusOr<ckpt::Meta> raw = ckpt::MetaFromJson(text, "meta.json");
  if (!raw.ok()) CheckRejection(raw.status(), "meta.json");
  CheckRankFile(text, FixedMeta(), 0);

  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return 0;
  std::string rank_file;
  if (auto it = j.find("rank_file"); it != j.end()) {
    rank_file = it->dump();
    j.erase(it);
  }
  // The checksum MetaToJson would write.
  j.erase("checksum");
  const std::string canonical = j.dump();
  j["checksum"] = absl::StrFormat("crc32c:%08x", ckpt::Crc32c(0, canonical.data(), canonical.size()));
  zero::StatusOr<ckpt::Meta> meta = ckpt::MetaFromJson(j.dump(), "meta.json");
  if (!meta.ok()) {
    CheckRejection(meta.status(), "meta.json");
    FUZZ_CHECK(meta.status().message().find("checksum mismatch") == std::string_view::npos,
               "the recomputed checksum was refused: " + meta.status().ToString());
    if (!rank_file.empty()) CheckRankFile(rank_file, FixedMeta(), 0);
    return 0;
  }
  // Written back, it reads back to the same text.
  const std::string written = ckpt::MetaToJson(*meta);
  zero::StatusOr<ckpt::Meta> back = ckpt::MetaFromJson(written, "written meta.json");
  FUZZ_CHECK(back.ok(), "MetaToJson's text is refused: " + back.status().ToString() + "\n" + written);
  FUZZ_CHECK(ckpt::MetaToJson(*back) == written, "a meta changes on the way back:\n" + written);
  for (size_t r = 0; r < meta->ranks.size() && r < 64; ++r) {
    CheckRankFile(ckpt::RankFileMetaToJson(meta->ranks[r]), *meta, static_cast<int>(r));
  }
  if (!rank_file.empty()) CheckRankFile(rank_file, *meta, 0);
  return 0;
}
