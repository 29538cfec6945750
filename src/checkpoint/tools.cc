// checkpoint/tools.cc — what zero-ckpt runs: describe, verify, export to safetensors, reshard. Offline: no engine,
// no communicator, one process.
#include <dirent.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/internal/file.h"
#include "checkpoint/internal/format.h"
#include "checkpoint/internal/safetensors.h"
#include "zero/checkpoint.h"

namespace zero {

using ckpt::CheckpointReader;
using ckpt::Meta;

namespace {

// Elements per piece when streaming a unit's values: 16 MiB of fp32, the bound on what a tool holds.
constexpr int64_t kPieceElems = int64_t{4} << 20;

std::string Bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / double(int64_t{1} << 30));
  if (b >= (int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", b / double(int64_t{1} << 20));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

}  // namespace

StatusOr<std::string> DescribeCheckpoint(const std::string& dir, const std::string& tag) {
  ZERO_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, tag));
  const Meta& m = reader->meta();
  std::string out = absl::StrCat("checkpoint ", reader->folder(), "\n");
  absl::StrAppend(&out, "  format version ", m.format_version, ", saved by ", m.kind, " at world size ", m.world_size,
                  ", stage ", m.stage, ", compute dtype ", std::string(DTypeName(m.compute_dtype)), "\n");
  absl::StrAppend(&out, "  step ", m.step, " (", m.skipped_steps, " skipped), optimizer ", m.optimizer, " [",
                  absl::StrJoin(m.state_names, ", "), "], loss scale ", m.loss_scaler.scale, "\n");
  int64_t params = 0;
  for (const auto& u : m.units) params += u.numel;
  absl::StrAppend(&out, "  ", m.units.size(), " units, ", params, " parameters\n");
  for (const auto& g : m.param_groups) {
    absl::StrAppend(&out, "  group \"", g.match, "\": lr_scale ", g.lr_scale, g.frozen ? ", frozen" : "");
    for (const auto& [k, v] : g.overrides) absl::StrAppend(&out, ", ", k, " ", v);
    absl::StrAppend(&out, "\n");
  }
  for (const auto& u : m.units) {
    std::vector<std::string> streams;
    for (const auto& s : u.streams) streams.push_back(absl::StrCat(s.name, ":", std::string(DTypeName(s.dtype))));
    absl::StrAppend(&out, "  unit ", u.name, ": ", u.numel, " elements", u.frozen ? ", frozen" : "", " [",
                    absl::StrJoin(streams, " "), "]\n");
    for (const auto& p : u.params) {
      absl::StrAppend(&out, "    ", p.name, " [", absl::StrJoin(p.shape, ", "), "] at ", p.offset,
                      p.group >= 0 ? absl::StrCat(" group ", p.group) : "", "\n");
    }
  }
  int64_t total = 0;
  for (const auto& r : m.ranks) {
    absl::StrAppend(&out, "  ", r.file, ": ", Bytes(r.bytes), ", ", r.sections.size(), " sections",
                    r.trainer_state.empty() ? "" : absl::StrCat(", trainer state: ", r.trainer_state.size(), " keys"),
                    "\n");
    total += r.bytes;
  }
  absl::StrAppend(&out, "  total ", Bytes(total), "\n");
  return out;
}

Status VerifyCheckpoint(const std::string& dir, const std::string& tag) {
  ZERO_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, tag));
  return reader->VerifyAll();
}

StatusOr<std::vector<std::pair<std::string, Status>>> VerifyAllCheckpoints(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", dir));
  std::vector<std::string> tags;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == ".." || n == ckpt::kLatestFile || n.find(".tmp.") != std::string::npos) continue;
    if (ckpt::Exists(absl::StrCat(dir, "/", n, "/."))) tags.push_back(n);
  }
  ::closedir(d);
  std::sort(tags.begin(), tags.end());
  std::vector<std::pair<std::string, Status>> out;
  for (const std::string& t : tags) out.push_back({t, VerifyCheckpoint(dir, t)});
  return out;
}

Status ExportSafetensors(const std::string& dir, const std::string& out_file, const ExportOptions& options) {
  ZERO_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, options.tag));
  const Meta& m = reader->meta();
  struct Item {
    int unit, stream;
    int64_t begin, numel;
    DType dtype;
  };
  std::vector<ckpt::SafetensorsWriter::Entry> entries;
  std::vector<Item> items;
  for (size_t ui = 0; ui < m.units.size(); ++ui) {
    const auto& u = m.units[ui];
    // The fp32 master where the unit has one; a frozen unit's parameters otherwise.
    int values = u.Stream("master");
    if (values < 0) values = u.Stream("param");
    if (values < 0) return absl::DataLossError(absl::StrCat(reader->folder(), ": unit ", u.name, " holds no values"));
    for (const auto& p : u.params) {
      entries.push_back({absl::StrCat(u.name, ".", p.name), options.dtype, p.shape});
      items.push_back({static_cast<int>(ui), values, p.offset, p.numel, options.dtype});
    }
    if (!options.optimizer_state) continue;
    for (const std::string& s : m.state_names) {
      const int si = u.Stream("state." + s);
      if (si < 0) continue;  // frozen: no state
      for (const auto& p : u.params) {
        entries.push_back({absl::StrCat(u.name, ".", p.name, ":", s), DType::kF32, p.shape});
        items.push_back({static_cast<int>(ui), si, p.offset, p.numel, DType::kF32});
      }
    }
  }
  ckpt::SafetensorsWriter w;
  ZERO_RETURN_IF_ERROR(w.Open(out_file, entries, {{"format", "pt"}, {"zero_step", absl::StrCat(m.step)}}));
  std::vector<char> buf;
  for (const Item& it : items) {
    const size_t es = DTypeSize(it.dtype);
    for (int64_t i = 0; i < it.numel; i += kPieceElems) {
      const int64_t n = std::min(kPieceElems, it.numel - i);
      buf.resize(static_cast<size_t>(n) * es);
      ZERO_RETURN_IF_ERROR(reader->Read(it.unit, it.stream, it.begin + i, it.begin + i + n, it.dtype, buf.data()));
      ZERO_RETURN_IF_ERROR(w.Append(buf.data(), buf.size()));
    }
  }
  return w.Commit();
}

Status ReshardCheckpoint(const std::string& dir, const std::string& tag, const std::string& out_dir, int world_size,
                         int stage) {
  if (world_size < 1) return absl::InvalidArgumentError(absl::StrCat("reshard: --world ", world_size, " is not >= 1"));
  if (stage < -1 || stage > 3) return absl::InvalidArgumentError(absl::StrCat("reshard: --stage ", stage));
  ZERO_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, tag));
  const Meta& src = reader->meta();
  Meta m = src;
  m.world_size = world_size;
  if (stage >= 0) m.stage = stage;
  m.ranks.clear();
  const std::string folder = absl::StrCat(out_dir, "/", m.tag);
  ZERO_RETURN_IF_ERROR(ckpt::MakeDirs(folder));
  std::vector<char> buf;
  for (int r = 0; r < world_size; ++r) {
    ckpt::RankFileWriter w;
    ZERO_RETURN_IF_ERROR(w.Open(absl::StrCat(folder, "/", ckpt::RankFileName(r, world_size)), r, world_size));
    for (size_t ui = 0; ui < m.units.size(); ++ui) {
      const auto& u = m.units[ui];
      const int64_t S = m.Shard(static_cast<int>(ui));
      const int64_t b = std::min(u.numel, r * S), e = std::min(u.numel, (r + 1) * S);
      for (size_t si = 0; si < u.streams.size(); ++si) {
        const DType dt = u.streams[si].dtype;
        ZERO_RETURN_IF_ERROR(w.BeginSection(static_cast<int>(ui), static_cast<int>(si), b, e, dt));
        for (int64_t x = b; x < e; x += kPieceElems) {
          const int64_t n = std::min(kPieceElems, e - x);
          buf.resize(static_cast<size_t>(n) * DTypeSize(dt));
          ZERO_RETURN_IF_ERROR(reader->Read(static_cast<int>(ui), static_cast<int>(si), x, x + n, dt, buf.data()));
          ZERO_RETURN_IF_ERROR(w.Append(buf.data(), buf.size()));
        }
        ZERO_RETURN_IF_ERROR(w.EndSection());
      }
    }
    ZERO_ASSIGN_OR_RETURN(ckpt::RankFileMeta rf, w.Commit());
    const int from = r < src.world_size ? r : 0;
    rf.trainer_state = src.ranks[from].trainer_state;
    m.ranks.push_back(std::move(rf));
  }
  return ckpt::CommitCheckpoint(out_dir, m);
}

}  // namespace zero
