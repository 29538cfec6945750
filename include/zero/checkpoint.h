// zero/checkpoint.h — saving and resuming a run: sharded, atomic checkpoints that load at any world size and
// stage, and safetensors export and import.
//
//   // every rank, between two Step()s (never inside a gradient-accumulation cycle):
//   ZERO_ASSIGN_OR_RETURN(std::string tag, engine->Save("ckpt", {.trainer_state = {{"data_pos", pos}}}));
//   // a later run, at any world size and stage, after Finalize (whose initial values Load replaces):
//   ZERO_ASSIGN_OR_RETURN(zero::LoadResult r, engine->Load("ckpt"));      // the latest complete checkpoint
//   pos = r.trainer_state["data_pos"];
//
// On disk (docs/internals/design.md, "Checkpoints"):
//   DIR/latest                          the tag of the newest complete checkpoint, written last
//   DIR/<tag>/meta.json                 rank 0: format version, world size, stage, dtypes, step, loss scaler,
//                                       parameter groups, every unit and parameter (name, shape, offset), and for
//                                       every rank file its sections with a CRC-32C per MiB
//   DIR/<tag>/rank-RRRRR-of-WWWWW.bin   each rank's part of every unit: the fp32 master, the 16-bit
//                                       parameters (mixed precision) and each optimizer state
// Each rank writes the elements [r·S, r·S + owned) of every unit (S = the unit's shard at the saving world
// size), at every stage: stage 0's replicated state is written once, split like stage 1's. Values are stored
// by unit element, not by buffer, so a checkpoint loads at any world size, stage and offload setting; each
// rank reads only the byte ranges (whole 1 MiB checksum blocks) it needs. Every file is written to a
// temporary name, fsynced and renamed (then the directory is fsynced); meta.json is written only once every
// rank's file is, and `latest` after it, so a crash at any moment leaves the previous checkpoint current.
//
// Engine::Save / Load (zero/engine.h) and ShardedOptimizer's are collective; the free functions below only read
// or tidy a checkpoint directory, issue no collective and may run in any process (zero-ckpt uses them). Every
// function returns a Status naming the directory, the tag and the file for what it cannot read or write, or for
// a checkpoint that fails its checksums; none aborts on what it finds on disk.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zero/dtype.h"
#include "zero/status.h"

namespace zero {

// A trainer's own state (its RNG, its data position): opaque bytes by key, saved and restored per rank.
using TrainerState = std::map<std::string, std::string>;

struct SaveOptions {
  // The checkpoint's folder name under DIR; empty: "step-%08d" of the applied steps.
  std::string tag;
  // This rank's state; Load returns it to the rank of the same number.
  TrainerState trainer_state;
  // Asynchronous: Save returns once this rank's state is copied into host staging (allocated at the first
  // asynchronous save and reused: pinned on a CUDA engine, counted under MemTag::kStaging), and a background
  // thread writes the rank file through the I/O engine (temporary name, fsync, rename). The ranks agree that
  // every file is durable at the next Save, WaitForSave, Load or Step (a small collective; Step only looks,
  // never waits), and then rank 0 writes meta.json and moves `latest`: a background write that failed, on any
  // rank, never becomes `latest`, and its error is returned by the next Save, WaitForSave or Load on every rank.
  // The checkpoint on disk is byte for byte the one a synchronous save of the same state writes.
  bool async = false;
  // What a Save does while an earlier asynchronous save is still being written: wait for it (and make it
  // `latest`) first, or fail with kFailedPrecondition on every rank (the earlier one goes on).
  enum class InFlight : uint8_t { kWait, kRefuse };
  InFlight if_in_flight = InFlight::kWait;
  // The CPU priority of an asynchronous save's background thread (its checksums, and the kernel work of its
  // writes that io_uring runs on threads it clones from it). kIdle (SCHED_IDLE): it runs on what training leaves
  // idle, so a trainer that keeps every core busy (a CPU trainer whose BLAS uses them all) is barely slowed, and
  // the write takes longer. kNormal: the thread competes with training as any other, and finishes sooner. A
  // save still waits for (or refuses, by if_in_flight) the one before it, whatever the priority.
  enum class WriterPriority : uint8_t { kIdle, kNormal };
  WriterPriority writer_priority = WriterPriority::kIdle;
  // An asynchronous save's write rate, in bytes per second; 0: as fast as the disk takes it. The background thread
  // writes in chunks of about 20 ms each and starts none before the rate allows, so the work a write costs (the
  // kernel's, and on a VM the host's emulation of the disk, which the guest sees only as stolen time) is spread
  // over rank_file_bytes / rate seconds instead of falling on the one or two steps beside a fast write. The total
  // is the same; the checkpoint becomes `latest` later. Pick a rate that ends the write before the next save, or
  // that save waits for it (if_in_flight).
  int64_t max_write_bytes_per_s = 0;
  // ZeRO++ qgZ's LoCo residuals too (each rank's own: the error its quantized gradients still owe), so a run that
  // loads the checkpoint at the same world, ranks per host, bits, block and dtype rounds its next gradients as the
  // uninterrupted run would: a resume bit for bit. They cost compute-dtype bytes of the whole model per rank, plus
  // 1/L of that with two hops (L ranks per host): more than the rank's shard of the model state at 4 ranks and
  // above, hence off by default. Off, or loaded under another layout, the residuals restart at zero (logged).
  // kInvalidArgument where there is nothing to save (qgZ's error feedback off) or it cannot be (hybrid sharding:
  // every group keeps its own residuals, and only the first group writes).
  bool save_qgz_residuals = false;
};

struct LoadOptions {
  // Which checkpoint under DIR; empty: the one DIR/latest names (ResumeCheckpointTag: a folder with complete
  // checkpoints but no usable `latest` is an error naming the newest, never "nothing there").
  std::string tag;
  // This model's full parameter names ("unit.param") to the checkpoint's; a name not in the map is looked up as
  // it is. Lets a model whose units are cut differently (the Engine's blocks, the wrapper's one flat buffer)
  // load the same parameters.
  std::map<std::string, std::string> name_map;
  // false: parameters and master weights only, optimizer state starts at zero and the step count at 0 (a new
  // fine-tuning run from saved weights).
  bool load_optimizer_state = true;
  // A checkpoint parameter this model does not have is an error (else ignored).
  bool strict = true;
  // Called with the trainer state this rank would get, before any value is read: an error (say a data position
  // that does not parse, or is negative: TrainerStateInt) fails the Load on every rank at once, as any other
  // rank's failure does, instead of one rank stopping while the others go on into a collective.
  std::function<Status(const TrainerState&)> check_trainer_state;
};

// The integer trainer_state[key] holds, in decimal, within [lo, hi]; kInvalidArgument naming the key, the value
// (escaped: the bytes come from a file) and the range otherwise, kNotFound when the key is absent.
StatusOr<int64_t> TrainerStateInt(const TrainerState& state, const std::string& key, int64_t lo, int64_t hi);

struct LoadResult {
  std::string tag;
  int64_t step = 0;  // applied steps when saved (now the engine's steps())
  int saved_world_size = 0;
  int saved_stage = 0;
  // The state the rank of this number saved; when the world size changed and the saving world had no such rank,
  // rank 0's.
  TrainerState trainer_state;
};

// ---- Offline: no engine, no communicator (what build/bin/zero-ckpt runs) ----

// A name or path read from a file or a folder, as messages print it: control bytes and DEL as \xNN, the
// backslash as \\ (a `latest` holding an escape sequence or a carriage return ran it, or hid the name).
std::string PrintableName(const std::string& name);

// The tag DIR/latest names; kNotFound when there is none. `latest` is read only if it is a regular file (a FIFO
// would block), and what it holds is printed escaped in the errors.
StatusOr<std::string> LatestCheckpointTag(const std::string& dir);
// The newest complete checkpoint under DIR: a folder whose meta.json is there and valid (its rank files are not
// read: VerifyCheckpoint does), the highest step, then the last tag by name; kNotFound when there is none.
StatusOr<std::string> NewestCompleteCheckpoint(const std::string& dir);
// The checkpoint a resumed run (and Load with no tag) loads: the one DIR/latest names. kNotFound only when DIR
// holds no checkpoint at all: no usable `latest` and no complete checkpoint folder. Where `latest` is missing or
// unusable (a symlink loop, a FIFO, bytes that are no tag) beside complete checkpoints, kFailedPrecondition
// naming the newest complete one and how to resume from it: a run that took that for "nothing yet" would start
// over, then fail at its first save onto an existing tag.
StatusOr<std::string> ResumeCheckpointTag(const std::string& dir);
// A readable summary: format, world size, stage, dtypes, step, every unit with its parameters, the files and
// their sizes. `tag` empty: the latest.
StatusOr<std::string> DescribeCheckpoint(const std::string& dir, const std::string& tag = "");
// Reads every byte of checkpoint `tag` (empty: the latest) and checks the metadata's checksum, that every rank
// file is there at its recorded size, that the sections cover every unit's elements, and every block's
// checksum. The error names the file and what is wrong (kDataLoss for damage, kNotFound for a missing file,
// "incomplete" for a checkpoint whose meta.json was never written).
Status VerifyCheckpoint(const std::string& dir, const std::string& tag = "");
// Every tag folder under DIR with its verification result ("ok" or the error), oldest first.
StatusOr<std::vector<std::pair<std::string, Status>>> VerifyAllCheckpoints(const std::string& dir);
// The entries of checkpoint folder DIR/<tag> (empty: the latest) its meta.json does not list: a rank file of
// another world (an old reshard), a `*.tmp.*` file of a save that was killed, anything else put there. Sorted.
StatusOr<std::vector<std::string>> UnlistedCheckpointFiles(const std::string& dir, const std::string& tag = "");

struct CleanOptions {
  bool dry_run = false;  // report what would be removed, remove nothing
};
// Removes from DIR what no complete checkpoint needs: folders of saves that never finished (no meta.json), the
// `*.tmp.*` files and folders a killed save or reshard left, and in every complete checkpoint the files its
// meta.json does not list. Returns the paths removed (or, dry_run, to remove). Run it only while nothing saves
// into DIR: a save in progress looks exactly like one that was killed.
StatusOr<std::vector<std::string>> CleanCheckpoints(const std::string& dir, const CleanOptions& options = {});

struct ExportOptions {
  std::string tag;               // empty: the latest
  DType dtype = DType::kF32;     // of the exported parameters (from the fp32 master, rounded to nearest even)
  bool optimizer_state = false;  // also "<unit>.<param>:<state>" tensors (f32) for every optimizer state
};
// Writes the parameters as one safetensors file ("<unit>.<param>", shapes as registered, in registration
// order), streaming: no more than one 16 MiB buffer is held whatever the model's size. An out_file that is
// (symlinks followed) DIR/latest, inside a checkpoint folder of DIR, or one of its files under another name (a
// hard link) is kInvalidArgument: the export would overwrite what it reads.
Status ExportSafetensors(const std::string& dir, const std::string& out_file, const ExportOptions& options = {});

// Writes, under out_dir, the checkpoint a run of `world_size` ranks at `stage` (-1: the saved stage) would have
// saved from the same state, without running one, and makes it out_dir's latest. The new folder is written
// under a temporary name and then put in place with one rename (an exchange where out_dir/<tag> exists, as in
// a reshard in place, out_dir = dir): no rank file of the old world stays beside the new ones, and a crash
// leaves the old folder whole. out_dir inside a checkpoint folder of `dir` is kInvalidArgument. A world with
// more ranks than the checkpoint's largest unit has blocks of 32 elements (ranks that would hold nothing of
// any unit) is kInvalidArgument naming the bound.
Status ReshardCheckpoint(const std::string& dir, const std::string& tag, const std::string& out_dir, int world_size,
                         int stage = -1);

// A safetensors file, read a tensor at a time (F32, F16 and BF16 tensors; any other dtype is an error naming it).
class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;  // byte offsets in the data section
    int64_t numel() const;
  };
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* Find(const std::string& name) const;  // nullptr if absent
  // The tensor's values widened to fp32 (n must equal its numel).
  Status ReadF32(const std::string& name, float* dst, int64_t n) const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace zero
