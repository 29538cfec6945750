// Byte-level corpus loading and the (seed, step, global index) -> sequence mapping behind rank-sliced batches.
#include "gpt/data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"

#ifndef ZERO_GPT_FALLBACK_CORPUS
#error "ZERO_GPT_FALLBACK_CORPUS must name the shipped fallback text (set by examples/gpt/CMakeLists.txt)"
#endif

namespace zero::gpt {
namespace {

namespace fs = std::filesystem;

// splitmix64's finalizer, a stateless 64-bit hash (the same mixer model.cc uses for the init).
uint64_t Mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("GPT corpus: cannot open '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat("GPT corpus: error reading '", path, "'"));
  return ss.str();
}

// Regular files of `dir` (symlinks followed), each distinct target once, in name order. Empty when the
// folder is missing or unreadable: the caller then falls back to the shipped text.
std::vector<std::string> ListDistinctFiles(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) names.push_back(it->path().string());
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& name : names) {
    const fs::path real = fs::canonical(name, ec);
    if (ec) continue;
    if (seen.insert(real.string()).second) out.push_back(name);
  }
  return out;
}

}  // namespace

std::string ByteDataset::DefaultFallbackCorpus() { return ZERO_GPT_FALLBACK_CORPUS; }

absl::StatusOr<ByteDataset> ByteDataset::Load(const ByteDatasetOptions& options) {
  std::vector<std::string> files = options.files;
  if (files.empty()) files = ListDistinctFiles(options.system_dir);
  if (files.empty()) {
    files.push_back(options.fallback_file.empty() ? DefaultFallbackCorpus() : options.fallback_file);
  }
  ByteDataset d;
  d.seed_ = options.seed;
  for (const auto& f : files) {
    ZERO_ASSIGN_OR_RETURN(std::string text, ReadFile(f));
    if (!d.bytes_.empty()) d.bytes_.push_back('\n');  // a boundary between documents
    d.bytes_ += text;
    d.sources_.push_back(f);
  }
  if (d.bytes_.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("GPT corpus has ", d.bytes_.size(),
                                                   " bytes; at least 2 are needed (read from ", d.sources_.size(),
                                                   " file(s))"));
  }
  return d;
}

int64_t ByteDataset::SampleStart(int64_t sample, int T) const {
  ZERO_CHECK(T >= 1 && T <= size() - 1) << "sequence length " << T << " needs a corpus of more than " << T
                                        << " bytes; it has " << size();
  const uint64_t span = static_cast<uint64_t>(size() - T);  // starts in [0, size - T - 1]
  const uint64_t key = static_cast<uint64_t>(sample / stride_), index = static_cast<uint64_t>(sample % stride_);
  const uint64_t h = Mix64(Mix64(Mix64(seed_) ^ key) ^ index);
  return static_cast<int64_t>(h % span);  // modulo bias < span / 2^64: negligible
}

void ByteDataset::Batch(int64_t first_sample, int B, int T, int32_t* tokens, int32_t* targets) const {
  ZERO_CHECK_GE(first_sample, 0);
  ZERO_CHECK_GE(B, 1);
  for (int i = 0; i < B; ++i) {
    const int64_t start = SampleStart(first_sample + i, T);
    const auto* src = reinterpret_cast<const unsigned char*>(bytes_.data()) + start;
    for (int t = 0; t < T; ++t) {
      tokens[static_cast<int64_t>(i) * T + t] = src[t];
      targets[static_cast<int64_t>(i) * T + t] = src[t + 1];
    }
  }
}

}  // namespace zero::gpt
