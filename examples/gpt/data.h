// examples/gpt/data.h — a byte-level text corpus and deterministic, rank-sliced training batches.
//
//   ZERO_ASSIGN_OR_RETURN(zero::gpt::ByteDataset data, zero::gpt::ByteDataset::Load({.seed = 7}));
//   std::vector<int32_t> tokens(B * T), targets(B * T);
//   data.Batch(first_sample, B, T, tokens.data(), targets.data());  // global samples [first_sample, +B)
//
// Tokens are the bytes of the text (vocab 256), so no tokenizer and no download is needed. By default the
// corpus is the license texts every Debian system ships in /usr/share/common-licenses (package base-files,
// which is essential; symlinks such as GPL -> GPL-3 are read once), about 240 KB; where that folder is absent
// or empty, a small text shipped in examples/gpt/data/ is used instead.
//
// Batches: training reads one stream of samples. Global sample s — counted from the first step of the run, over
// every rank and micro-step, whatever the world size — is the sequence starting at a position hashed from
// (seed, s / stride, s % stride), the stride being the run's first global batch (set_stride; kept in checkpoints):
// so a run whose global batch never changes reads, at step k, the samples keyed (seed, k, index in the step). A trainer
// keeps a cursor (the samples consumed so far, saved with its checkpoints) and step k takes the next global batch from
// it: rank r's micro-step m reads samples cursor + (m*N + r)*B + [0, B). So N ranks see exactly the samples a world-1
// run with batch B*N sees, in the same order (the mean over ranks of the per-rank mean losses is the world-1 mean
// loss), and a run that resumes at another world size or batch goes on from the first sample not yet trained, as
// Megatron's consumed-samples counter does: no sample is skipped or read twice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/status.h"

namespace zero::gpt {

// Where the corpus comes from. Designated initializers keep call sites short: Load({.seed = 3}).
struct ByteDatasetOptions {
  // Read exactly these files, concatenated in this order; any unreadable file is an error. When empty, the
  // system folder below (then the fallback file) is used.
  std::vector<std::string> files;
  // Every regular file in this folder (after following symlinks, each distinct file once, by name order).
  std::string system_dir = "/usr/share/common-licenses";
  // Used when system_dir yields no file; empty means the text shipped with the example (DefaultFallbackCorpus).
  std::string fallback_file;
  // Seeds the choice of sequence positions.
  uint64_t seed = 0;
};

// An in-memory byte corpus. Immutable after Load; Batch is const and thread-safe.
class ByteDataset {
 public:
  // Reads the corpus described by `options`. kNotFound names a file that cannot be read (or, without explicit
  // files, the system folder and the fallback file when neither yields text); kInvalidArgument when the
  // corpus has fewer than 2 bytes.
  static absl::StatusOr<ByteDataset> Load(const ByteDatasetOptions& options = {});

  // Path of the small text shipped in examples/gpt/data/ (fixed at build time).
  static std::string DefaultFallbackCorpus();

  // Fills tokens[B, T] and targets[B, T] (row-major) with the global samples [first_sample, first_sample + B):
  // row i is sample s = first_sample + i, tokens = corpus[p, p+T), targets = corpus[p+1, p+T+1) with
  // p = SampleStart(s, T). Preconditions (ZERO_CHECK): first_sample >= 0, B >= 1, 1 <= T <= size() - 1.
  void Batch(int64_t first_sample, int B, int T, int32_t* tokens, int32_t* targets) const;

  // Start offset in [0, size() - T - 1] of global sample `sample`: a hash of (seed, sample / stride,
  // sample % stride), independent of the step, the world size and the per-rank batch size.
  int64_t SampleStart(int64_t sample, int T) const;
  // The samples per hash key's first part (>= 1; default 1). Not thread-safe against Batch: set it before.
  void set_stride(int64_t stride) { stride_ = stride < 1 ? 1 : stride; }
  int64_t stride() const { return stride_; }

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& bytes() const { return bytes_; }
  // The files the corpus was read from, in order.
  const std::vector<std::string>& sources() const { return sources_; }
  uint64_t seed() const { return seed_; }

 private:
  std::string bytes_;
  std::vector<std::string> sources_;
  uint64_t seed_ = 0;
  int64_t stride_ = 1;
};

}  // namespace zero::gpt
