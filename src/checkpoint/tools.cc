// checkpoint/tools.cc — what zero-ckpt runs: describe, verify, export to safetensors, reshard. Offline: no engine,
// no communicator, one process.
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
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

using ckpt::Printable;

bool IsDir(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// kInvalidArgument when `out` (resolved: symlinks followed, `..` applied) is what reading checkpoint `tag` of
// `dir` needs: DIR/latest, or a path inside a checkpoint folder of DIR (one with a meta.json, or `tag`'s own),
// or, existing, one of `inputs` under another name (a hard link). Writing there would overwrite the checkpoint
// while it is read (zero-ckpt export CKPT CKPT/step-40/meta.json reported success and left it unloadable).
Status RefuseOutputInside(const std::string& dir, const std::string& tag, const std::string& out, const char* what,
                          const std::vector<std::string>& inputs) {
  ZERO_ASSIGN_OR_RETURN(const std::string rdir, ckpt::ResolvePath(dir));
  ZERO_ASSIGN_OR_RETURN(const std::string rout, ckpt::ResolvePath(out));
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Printable(out), " is ", why, " of the checkpoint ",
                                                   Printable(dir), " being read; write it elsewhere"));
  };
  if (rout == absl::StrCat(rdir, "/", ckpt::kLatestFile))
    return refuse(absl::StrCat("the `", ckpt::kLatestFile, "` file"));
  if (ckpt::PathWithin(rout, rdir) && rout != rdir) {
    const std::string rest = rout.substr(rdir == "/" ? 1 : rdir.size() + 1);
    const std::string first = rest.substr(0, rest.find('/'));
    const std::string folder = absl::StrCat(rdir, "/", first);
    if (IsDir(folder) && (first == tag || ckpt::Exists(absl::StrCat(folder, "/", ckpt::kMetaFile)))) {
      return refuse(absl::StrCat("inside checkpoint folder ", Printable(first)));
    }
  }
  struct stat so;
  if (::stat(out.c_str(), &so) == 0) {
    for (const std::string& in : inputs) {
      struct stat si;
      if (::stat(in.c_str(), &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        return refuse(absl::StrCat("the file ", Printable(in), " under another name"));
      }
    }
  }
  return absl::OkStatus();
}

// The files reading `reader`'s checkpoint touches: DIR/latest, meta.json, the rank files.
std::vector<std::string> InputFiles(const std::string& dir, const CheckpointReader& reader) {
  std::vector<std::string> in = {absl::StrCat(dir, "/", ckpt::kLatestFile),
                                 absl::StrCat(reader.folder(), "/", ckpt::kMetaFile)};
  for (const auto& r : reader.meta().ranks) in.push_back(absl::StrCat(reader.folder(), "/", r.file));
  return in;
}

// Puts folder `from` at `to` with one rename. Where `to` exists (a reshard in place), the two are exchanged
// atomically (renameat2 RENAME_EXCHANGE) and the old one, now at `from`, removed: no moment shows a mix of the
// two worlds' files, and a crash before the exchange leaves the old folder whole.
Status PutFolder(const std::string& from, const std::string& to) {
  if (!ckpt::Exists(to)) {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot rename ", Printable(from), " to ", Printable(to), ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS) {
      return absl::InternalError(
          absl::StrCat("cannot exchange ", Printable(from), " and ", Printable(to), ": ", std::strerror(errno)));
    }
    // A file system without the exchange: the old folder aside, the new one in, two renames.
    const std::string old = absl::StrCat(to, ".old.tmp.", ::getpid());
    if (::rename(to.c_str(), old.c_str()) != 0 || ::rename(from.c_str(), to.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot put ", Printable(from), " at ", Printable(to), ": ", std::strerror(errno)));
    }
    return ckpt::RemoveTree(old);
  }
  return ckpt::RemoveTree(from);
}

}  // namespace

std::string PrintableName(const std::string& name) { return Printable(name); }

StatusOr<int64_t> TrainerStateInt(const TrainerState& state, const std::string& key, int64_t lo, int64_t hi) {
  auto it = state.find(key);
  if (it == state.end()) return absl::NotFoundError(absl::StrCat("the trainer state has no \"", Printable(key), "\""));
  int64_t v = 0;
  const std::string& text = it->second;
  const bool digits =
      !text.empty() && text.size() <= 20 &&
      std::all_of(text.begin() + (text[0] == '-' ? 1 : 0), text.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      text != "-";
  if (!digits || !absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("the trainer state's \"", Printable(key), "\" is \"",
                                                   Printable(text.substr(0, 64)), text.size() > 64 ? "...\"" : "\"",
                                                   ", not an integer in [", lo, ", ", hi, "]"));
  }
  return v;
}

StatusOr<std::string> DescribeCheckpoint(const std::string& dir, const std::string& tag) {
  ZERO_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, tag));
  const Meta& m = reader->meta();
  std::string out = absl::StrCat("checkpoint ", reader->folder(), "\n");
  absl::StrAppend(&out, "  format version ", m.format_version, ", saved by ", Printable(m.kind), " at world size ",
                  m.world_size, ", stage ", m.stage, ", compute dtype ", std::string(DTypeName(m.compute_dtype)), "\n");
  std::vector<std::string> state_names;
  for (const auto& n : m.state_names) state_names.push_back(Printable(n));
  absl::StrAppend(&out, "  step ", m.step, " (", m.skipped_steps, " skipped), optimizer ", Printable(m.optimizer), " [",
                  absl::StrJoin(state_names, ", "), "], loss scale ", m.loss_scaler.scale, "\n");
  int64_t params = 0;
  for (const auto& u : m.units) params += u.numel;
  absl::StrAppend(&out, "  ", m.units.size(), " units, ", params, " parameters\n");
  if (m.qgz) {
    absl::StrAppend(&out, "  qgZ residuals of every rank (int", m.qgz->bits, " blocks of ", m.qgz->block, ", ",
                    m.qgz->int8 ? "residuals in int8 blocks" : std::string(DTypeName(m.qgz->dtype)), ", ", m.qgz->local,
                    " ranks per host): restored by a resume at this world and layout\n");
  }
  for (const auto& g : m.param_groups) {
    absl::StrAppend(&out, "  group \"", Printable(g.match), "\": lr_scale ", g.lr_scale, g.frozen ? ", frozen" : "");
    for (const auto& [k, v] : g.overrides) absl::StrAppend(&out, ", ", k, " ", v);
    absl::StrAppend(&out, "\n");
  }
  for (const auto& u : m.units) {
    std::vector<std::string> streams;
    for (const auto& s : u.streams) {
      streams.push_back(absl::StrCat(Printable(s.name), ":", std::string(DTypeName(s.dtype))));
    }
    absl::StrAppend(&out, "  unit ", Printable(u.name), ": ", u.numel, " elements", u.frozen ? ", frozen" : "", " [",
                    absl::StrJoin(streams, " "), "]\n");
    for (const auto& p : u.params) {
      absl::StrAppend(&out, "    ", Printable(p.name), " [", absl::StrJoin(p.shape, ", "), "] at ", p.offset,
                      p.group >= 0 ? absl::StrCat(" group ", p.group) : "", "\n");
    }
  }
  int64_t total = 0;
  for (const auto& r : m.ranks) {
    absl::StrAppend(&out, "  ", r.file, ": ", Bytes(r.bytes), ", ", r.sections.size(), " sections",
                    r.rank_state.empty() ? "" : absl::StrCat(", ", r.rank_state.size(), " qgZ residuals"),
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
    if (!ckpt::SafeTag(n) || n.find(".tmp.") != std::string::npos) continue;
    if (ckpt::Exists(absl::StrCat(dir, "/", n, "/."))) tags.push_back(n);
  }
  ::closedir(d);
  std::sort(tags.begin(), tags.end());
  std::vector<std::pair<std::string, Status>> out;
  for (const std::string& t : tags) out.push_back({t, VerifyCheckpoint(dir, t)});
  return out;
}

StatusOr<std::vector<std::string>> UnlistedCheckpointFiles(const std::string& dir, const std::string& tag) {
  ZERO_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, tag));
  std::vector<std::string> out;
  for (const std::string& n : ListDir(reader->folder())) {
    bool listed = n == ckpt::kMetaFile;
    for (const auto& r : reader->meta().ranks) listed = listed || r.file == n;
    if (!listed) out.push_back(n);
  }
  return out;
}

StatusOr<std::vector<std::string>> CleanCheckpoints(const std::string& dir, const CleanOptions& options) {
  if (!IsDir(dir)) return absl::NotFoundError(absl::StrCat("no checkpoint folder ", Printable(dir)));
  std::vector<std::string> gone;
  auto remove = [&](const std::string& path) -> Status {
    gone.push_back(path);
    return options.dry_run ? absl::OkStatus() : ckpt::RemoveTree(path);
  };
  for (const std::string& n : ListDir(dir)) {
    const std::string path = absl::StrCat(dir, "/", n);
    if (n.find(".tmp.") != std::string::npos) {  // latest.tmp.<pid>, <tag>.reshard.tmp.<pid>: never committed
      ZERO_RETURN_IF_ERROR(remove(path));
      continue;
    }
    if (!ckpt::SafeTag(n) || !IsDir(path)) continue;
    if (!ckpt::Exists(absl::StrCat(path, "/", ckpt::kMetaFile))) {
      // A save that never finished, if everything in it is what a save writes (rank files and their temporaries);
      // a folder of anything else is not ours to remove.
      bool ours = true;
      for (const std::string& f : ListDir(path)) ours = ours && f.rfind("rank-", 0) == 0;
      if (ours) ZERO_RETURN_IF_ERROR(remove(path));
      continue;
    }
    StatusOr<std::vector<std::string>> stray = UnlistedCheckpointFiles(dir, n);
    if (!stray.ok()) continue;  // damaged: verify names it; nothing in it is removed
    for (const std::string& f : *stray) ZERO_RETURN_IF_ERROR(remove(absl::StrCat(path, "/", f)));
  }
  return gone;
}

Status ExportSafetensors(const std::string& dir, const std::string& out_file, const ExportOptions& options) {
  ZERO_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, options.tag));
  const Meta& m = reader->meta();
  ZERO_RETURN_IF_ERROR(RefuseOutputInside(dir, m.tag, out_file, "export: output", InputFiles(dir, *reader)));
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
      entries.push_back({ckpt::FullParamName(u.name, u.bare_names, p.name), options.dtype, p.shape});
      items.push_back({static_cast<int>(ui), values, p.offset, p.numel, options.dtype});
    }
    if (!options.optimizer_state) continue;
    for (const std::string& s : m.state_names) {
      const int si = u.Stream("state." + s);
      if (si < 0) continue;  // frozen: no state
      for (const auto& p : u.params) {
        entries.push_back(
            {absl::StrCat(ckpt::FullParamName(u.name, u.bare_names, p.name), ":", s), DType::kF32, p.shape});
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
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("reshard: --world ", world_size, " is not a world size (>= 1)"));
  }
  if (stage < -1 || stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("reshard: --stage ", stage, " is not 0, 1, 2 or 3"));
  }
  ZERO_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, tag));
  const Meta& src = reader->meta();
  // Ranks past the largest unit's blocks of 32 elements would hold nothing of any unit (the padding rule splits
  // units in multiples of 32): such a world writes files of nothing but headers, one per rank (--world 100000 of
  // a 118,528-parameter model wrote 25,638 of them before it was stopped).
  int64_t blocks = 1;
  std::string largest;
  for (const auto& u : src.units) {
    const int64_t b = (u.numel + 31) / 32;
    if (largest.empty() || b > blocks) largest = u.name;
    blocks = std::max(blocks, b);
  }
  if (world_size > blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard: --world ", world_size, " is more ranks than the checkpoint's largest unit (",
                     Printable(largest), ") has blocks of 32 elements (", blocks, "): ranks past ", blocks,
                     " would hold nothing; the world must be in [1, ", blocks, "]"));
  }
  // out_dir = dir is a reshard in place (the folder is exchanged whole below); inside a checkpoint folder it is not.
  ZERO_RETURN_IF_ERROR(RefuseOutputInside(dir, src.tag, out_dir, "reshard: output folder", {}));
  Meta m = src;
  m.world_size = world_size;
  if (stage >= 0) m.stage = stage;
  m.ranks.clear();
  m.qgz.reset();  // qgZ's residuals are each rank's own at its world: not resharded (a Load restarts them)
  // Written under a temporary name (skipped by every reader and by verify --all), then put in place whole.
  ZERO_RETURN_IF_ERROR(ckpt::MakeDirs(out_dir));
  const std::string final_folder = absl::StrCat(out_dir, "/", m.tag);
  const std::string folder = absl::StrCat(final_folder, ".reshard.tmp.", ::getpid());
  ZERO_RETURN_IF_ERROR(ckpt::RemoveTree(folder));
  ZERO_RETURN_IF_ERROR(ckpt::MakeDirs(folder));
  struct Cleanup {  // the temporary folder goes on any error
    std::string path;
    ~Cleanup() {
      if (!path.empty()) (void)ckpt::RemoveTree(path);
    }
  } cleanup{folder};
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
  ZERO_RETURN_IF_ERROR(ckpt::WriteFileAtomic(absl::StrCat(folder, "/", ckpt::kMetaFile), ckpt::MetaToJson(m)));
  ZERO_RETURN_IF_ERROR(PutFolder(folder, final_folder));
  cleanup.path.clear();
  ZERO_RETURN_IF_ERROR(ckpt::FsyncDir(out_dir));
  return ckpt::WriteFileAtomic(absl::StrCat(out_dir, "/", ckpt::kLatestFile), m.tag + "\n");
}

}  // namespace zero
