// Fuzz target: what a resumed run reads besides the values: DIR/latest (LatestCheckpointTag, ResumeCheckpointTag)
// and a trainer-state value (TrainerStateInt, as zero-gpt and zero-flat-trainer read next_step), both from the
// file, and the trainer state of a rank's description in meta.json (ckpt::RankFileMetaFromJson).
//
// The input is used three ways: as the bytes of a `latest` file in a folder of its own (in /dev/shm); as the
// value of "next_step"; and, base64-encoded, as that value inside a rank's description, and raw, as the
// description's whole "trainer_state" member.
//
// Properties: no crash, hang or exception; every error message is printable (no control byte, DEL: names from
// files are escaped; a `latest` holding an escape sequence ran it in the terminal); an accepted `latest` names a
// SafeTag, and ResumeCheckpointTag agrees with it; with no `latest`-worthy text and no checkpoint folder, a
// resume is "no checkpoint yet" (kNotFound) only where `latest` is absent, never for a `latest` that is there but
// unusable; an accepted next_step is a decimal integer in range that prints back as itself (leading zeros and a
// "-0" aside); the trainer state read from a description equals the bytes written into it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/internal/format.h"
#include "fuzz_check.h"
#include "zero/checkpoint.h"

namespace {

namespace ckpt = zero::ckpt;

void CheckPrintable(const zero::Status& s) {
  for (const char c : s.message()) {
    const auto u = static_cast<unsigned char>(c);
    FUZZ_CHECK(u >= 0x20 && u != 0x7f, "a control byte in an error message: " + absl::CHexEscape(s.message()));
  }
}

void CheckLatest(const std::string& text) {
  const std::string& dir = zero::fuzz::ScratchDir();
  zero::fuzz::ClearDir(dir);
  zero::fuzz::WriteFile(dir + "/" + ckpt::kLatestFile, text);
  zero::StatusOr<std::string> tag = zero::LatestCheckpointTag(dir);
  zero::StatusOr<std::string> resume = zero::ResumeCheckpointTag(dir);
  if (tag.ok()) {
    FUZZ_CHECK(ckpt::SafeTag(*tag), "an accepted latest names no plain folder: " + absl::CHexEscape(*tag));
    FUZZ_CHECK(resume.ok() && *resume == *tag, "ResumeCheckpointTag disagrees with latest");
    return;
  }
  CheckPrintable(tag.status());
  CheckPrintable(resume.status());
  // `latest` is there: whatever it holds, a resume must not read it as an empty folder.
  FUZZ_CHECK(!absl::IsNotFound(resume.status()),
             "a present but unusable latest read as no checkpoint: " + resume.status().ToString());
}

void CheckNextStep(const std::string& text) {
  constexpr int64_t kHi = int64_t{1} << 40;
  zero::StatusOr<int64_t> v = zero::TrainerStateInt({{"next_step", text}}, "next_step", 0, kHi);
  if (!v.ok()) {
    FUZZ_CHECK(v.status().code() == absl::StatusCode::kInvalidArgument, v.status().ToString());
    FUZZ_CHECK(v.status().message().find("next_step") != std::string_view::npos, "the error does not name the key");
    CheckPrintable(v.status());
    return;
  }
  FUZZ_CHECK(*v >= 0 && *v <= kHi, absl::StrCat("out of range: ", *v));
  std::string digits = text;
  if (!digits.empty() && digits[0] == '-') digits = digits.substr(1);
  while (digits.size() > 1 && digits[0] == '0') digits = digits.substr(1);
  FUZZ_CHECK(digits == absl::StrCat(*v), "accepted \"" + absl::CHexEscape(text) + "\" as " + absl::StrCat(*v));
  FUZZ_CHECK(zero::TrainerStateInt({}, "next_step", 0, kHi).status().code() == absl::StatusCode::kNotFound,
             "an absent key is not kNotFound");
}

// A world-1 meta with one unit of 64 elements, for the rank descriptions.
const ckpt::Meta& FixedMeta() {
  static const ckpt::Meta m = [] {
    // (Built through initializers: GCC 12's -Wrestrict misfires on assigning a literal to a default string here.)
    ckpt::Meta m{.tag = std::string("t")};
    ckpt::UnitMeta u{.name = std::string("u"), .numel = 64};
    u.params.push_back({"w", {64}, 0, 64, -1});
    u.streams = {{"master", zero::DType::kF32}};
    m.units.push_back(u);
    m.ranks.resize(1);
    return m;
  }();
  return m;
}

void CheckDescription(const std::string& text) {
  const std::string head = R"({"file": "rank-00000-of-00001.bin", "bytes": 64, "sections": [], "trainer_state": )";
  // The value, base64 as Save writes it: read back byte for byte.
  zero::StatusOr<ckpt::RankFileMeta> r =
      ckpt::RankFileMetaFromJson(head + "{\"next_step\": \"" + absl::Base64Escape(text) + "\"}}", FixedMeta(), 0);
  FUZZ_CHECK(r.ok(), "a base64 trainer state is refused: " + r.status().ToString());
  FUZZ_CHECK(r->trainer_state.at("next_step") == text, "the trainer state changed on the way");
  // The input as the whole member: refused as kDataLoss (printable), or read back through the writer.
  r = ckpt::RankFileMetaFromJson(head + text + "}", FixedMeta(), 0);
  if (!r.ok()) {
    FUZZ_CHECK(r.status().code() == absl::StatusCode::kDataLoss, r.status().ToString());
    return;
  }
  zero::StatusOr<ckpt::RankFileMeta> back = ckpt::RankFileMetaFromJson(ckpt::RankFileMetaToJson(*r), FixedMeta(), 0);
  FUZZ_CHECK(back.ok() && back->trainer_state == r->trainer_state, "a trainer state does not read back");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zero::fuzz::QuietLogs();
  const std::string text(reinterpret_cast<const char*>(data), size);
  CheckLatest(text);
  CheckNextStep(text);
  CheckDescription(text);
  return 0;
}
