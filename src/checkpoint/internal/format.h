// checkpoint/internal/format.h — the checkpoint's metadata, its rank files, and the reader and writer both the
// engine and the offline tools use. defines: Meta (+ UnitMeta, ParamMeta, StreamMeta, Section, RankFileMeta),
// MetaToJson, MetaFromJson, RankFileName, RankFileWriter, CheckpointReader, CommitCheckpoint.
//
// A unit's values are addressed by unit element (the registration order's packing, world-independent; the
// padding past the last parameter is never stored). Each rank file holds sections: one (unit, stream, element
// range) each, back to back after a 64-byte header, with a CRC-32C for every kBlockBytes of the section.
// Streams: "master" (f32, every trainable unit), "param" (the compute dtype: 16-bit parameters under mixed
// precision, and a frozen unit's parameters, which have no master) and "state.<name>" (f32, each optimizer
// state). meta.json carries a CRC-32C of its own canonical text ("checksum"), so a flipped byte that still
// parses is caught too.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/internal/io_file.h"
#include "zero/checkpoint.h"
#include "zero/dtype.h"
#include "zero/status.h"

namespace zero::io {
class IoEngine;
}  // namespace zero::io

namespace zero::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr int64_t kBlockBytes = int64_t{1} << 20;
inline constexpr int64_t kRankHeaderBytes = 64;
inline constexpr char kRankMagic[8] = {'Z', 'E', 'R', 'O', 'C', 'K', 'P', 'T'};
inline constexpr const char* kMetaFile = "meta.json";
inline constexpr const char* kLatestFile = "latest";

struct ParamMeta {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;  // elements, in the unit
  int group = -1;                 // index into Meta::param_groups, -1: none
};
struct StreamMeta {
  std::string name;  // "master", "param", "state.<name>"
  DType dtype = DType::kF32;
};
// A parameter's full name, the one checkpoints, parameter groups and errors use: "unit.param", or the parameter's
// own name for a unit registered with bare names (FlatBuffers with an empty name: the libtorch adapter's buckets,
// whose tensors keep their torch names).
std::string FullParamName(const std::string& unit, bool bare_names, const std::string& param);

struct UnitMeta {
  std::string name;
  int64_t numel = 0;
  bool frozen = false;
  bool bare_names = false;  // saved only when true ("bare_names"): older checkpoints read as false
  std::vector<ParamMeta> params;
  std::vector<StreamMeta> streams;
  int Stream(const std::string& name) const;  // -1 if absent
};
struct Section {
  int unit = 0, stream = 0;
  int64_t begin = 0, end = 0;  // unit elements [begin, end)
  int64_t offset = 0;          // bytes, in the rank file
  std::vector<uint32_t> crc;   // one per kBlockBytes of the section's bytes
  // A section of the rank's own state (RankFileMeta::rank_state): `stream` indexes kRankStateStreams, [begin, end)
  // are elements of that rank's buffer, in QgzStateMeta::dtype (int8 residuals: their codes and scales, counted in
  // that dtype's elements). Not in the JSON: where the section is listed says it.
  bool rank_state = false;
};
// The rank-state streams: ZeRO++ qgZ's LoCo residuals, each rank's own (not a shard of anything: every rank keeps
// a residual for the whole gradient it sends, and with two hops one for the host partials it forwards).
inline constexpr const char* kRankStateStreams[] = {"qgz_residual", "qgz_host_residual"};
inline constexpr int kRankStateStreamCount = 2;
struct RankFileMeta {
  std::string file;
  int64_t bytes = 0;
  std::vector<Section> sections;
  std::vector<Section> rank_state;  // after the sections, in the file and in the JSON ("rank_state", optional)
  TrainerState trainer_state;
};
// What the rank-state sections were saved under (meta.json's "qgz_residuals", optional): they are valid only for a
// run with the same world (Meta::world_size), ranks per host, bits, block and dtype, whose units reduced alike.
struct QgzStateMeta {
  int local = 1;  // ranks per host of the first hop
  int bits = 8;
  int64_t block = 0;
  DType dtype = DType::kF32;
  // zero_quantized_gradients_error_feedback_dtype "int8": int8 codes and f32 scales per block (the engine's
  // QgzResidualLayout), in "residuals": "int8"; else the compute dtype's values ("compute", or absent).
  bool int8 = false;
  std::vector<int64_t> rounds;  // per unit: its reductions counted toward zeropp_loco_param's reset_T
};
struct LossScalerMeta {
  double scale = 1.0;
  int hysteresis = 0;
  int64_t iteration = 0, last_overflow_iteration = -1;
};
struct GroupMeta {
  std::string match;
  double lr_scale = 1.0;
  bool frozen = false;
  std::map<std::string, double> overrides;  // "weight_decay", "beta1", ... where set
};

struct Meta {
  int format_version = kFormatVersion;
  std::string tag;
  std::string kind = "engine";  // or "sharded_optimizer"
  int world_size = 1;
  int stage = 0;
  DType compute_dtype = DType::kF32;
  std::string optimizer;
  std::vector<std::string> state_names;
  int64_t step = 0, skipped_steps = 0;
  LossScalerMeta loss_scaler;
  std::vector<GroupMeta> param_groups;
  std::vector<UnitMeta> units;
  std::vector<RankFileMeta> ranks;
  std::optional<QgzStateMeta> qgz;  // set where the rank files hold qgZ's residuals (SaveOptions::save_qgz_residuals)

  int64_t Shard(int unit) const;                 // the unit's shard at this world size (the engine's padding rule)
  int64_t SectionBytes(const Section& s) const;  // its bytes in the rank file (a rank-state one's in qgz->dtype)
  int Unit(const std::string& name) const;       // -1 if absent
};

// The canonical JSON text, with "checksum" = the CRC-32C of the text without it.
std::string MetaToJson(const Meta& meta);
// One rank file's description, on its way to rank 0 (Engine::Save); checked against `meta`'s units.
std::string RankFileMetaToJson(const RankFileMeta& r);
StatusOr<RankFileMeta> RankFileMetaFromJson(const std::string& text, const Meta& meta, int rank);
// Parses and checks meta.json's text; errors name `what` (the file) and the field.
StatusOr<Meta> MetaFromJson(const std::string& text, const std::string& what);
// A name that stays inside its folder: no '/', not "." or "..", no NUL or newline, under 256 bytes.
bool SafeFileName(const std::string& name);
// A checkpoint's tag: a SafeFileName other than "latest" (DIR/latest is the file naming the newest).
bool SafeTag(const std::string& tag);
std::string RankFileName(int rank, int world);  // "rank-00003-of-00004.bin"
std::string DefaultTag(int64_t step);           // "step-00000100"

// The 64-byte header of a rank file: magic, format version, rank, world, zeros.
void RankFileHeader(int rank, int world, char out[kRankHeaderBytes]);
// The block checksums of one section's bytes (one CRC-32C per kBlockBytes, the last block possibly shorter):
// what RankFileWriter computes while appending, for a section staged whole (asynchronous saves). between_blocks,
// when set, is called after each block (the background writer yields its core there).
std::vector<uint32_t> SectionCrcs(const void* data, int64_t bytes, void (*between_blocks)() = nullptr);

// Writes one rank's file: sections appended in order, each with its block checksums.
class RankFileWriter {
 public:
  RankFileWriter();
  ~RankFileWriter();
  Status Open(const std::string& path, int rank, int world);
  Status BeginSection(int unit, int stream, int64_t begin, int64_t end, DType dtype);
  // A rank-state section (RankFileMeta::rank_state): begun after the last section, appended and ended alike.
  Status BeginRankStateSection(int unit, int stream, int64_t elems);
  Status Append(const void* data, size_t bytes);
  Status EndSection();
  // fsync + rename; the file's description for meta.json.
  StatusOr<RankFileMeta> Commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads a checkpoint's values by unit element, checking every block it touches.
class CheckpointReader {
 public:
  // Reads DIR/<tag>/meta.json (tag empty: DIR/latest's) and checks it: format, version, and that each unit's
  // sections cover its elements exactly once per stream.
  static StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& dir, const std::string& tag);
  ~CheckpointReader();
  const Meta& meta() const { return meta_; }
  const std::string& folder() const { return folder_; }
  // Reads the rank files through `io` (the caller's, outliving this reader; O_DIRECT where the file system takes
  // it) instead of pread. Call before the first Read.
  void UseIoEngine(io::IoEngine* io) { io_ = io; }
  // Elements [begin, end) of stream `stream` of unit `unit`, converted to `dtype` (fp32 to 16-bit rounds to
  // nearest even), into dst.
  Status Read(int unit, int stream, int64_t begin, int64_t end, DType dtype, void* dst);
  // Every rank file at its size and every block's checksum.
  Status VerifyAll();
  // All of rank `rank`'s rank-state section `s` (one of meta().ranks[rank].rank_state), as stored, into dst.
  Status ReadRankState(int rank, const Section& s, void* dst);

 private:
  CheckpointReader() = default;
  Status OpenRank(int rank);
  Status ReadBlock(int rank, const Section& s, int64_t block, const std::string& where);
  std::string SectionName(int rank, const Section& s) const;
  // n bytes of rank `rank`'s file at `offset` (opened), through the I/O engine when one is set.
  Status ReadBytes(int rank, const std::string& where, int64_t offset, void* dst, size_t n);
  Meta meta_;
  std::string folder_;
  std::vector<int> fds_;
  io::IoEngine* io_ = nullptr;
  std::vector<io::IoFile> files_;  // with io_: each rank file opened for the engine
  // By (unit, stream): the sections that hold it, sorted by begin, as (rank, section index).
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> index_;
  // One block kept: sequential reads of small pieces do not re-read and re-check it.
  int cache_rank_ = -1;
  const Section* cache_section_ = nullptr;
  int64_t cache_block_ = -1;
  std::vector<char> cache_;
};

// Writes meta.json (rank files already committed), then makes `tag` the folder's latest.
Status CommitCheckpoint(const std::string& dir, const Meta& meta);

}  // namespace zero::ckpt
