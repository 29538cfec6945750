// shard/internal/async_save.h — the state of the engine's asynchronous checkpoint saves (SaveOptions::async):
// the write plan, the reused staging, the I/O engine and the background writer. defines: internal::AsyncSave.
//
// One save at a time. Save (shard/checkpoint.cc) copies this rank's part of every unit into `staging`, laid out
// exactly as the rank file (header, then every section back to back), starts `worker`, and returns. The worker
// computes the block checksums, writes the image through `io` to a temporary name, fsyncs and renames it; it
// never touches a communicator (zero's communicators are not for two threads at once). The ranks learn that
// every file is durable in Engine::Impl::FinishSave, a small collective the engine's thread runs at the next
// Save, WaitForSave, Load or Step; only then does rank 0 write meta.json and `latest`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/internal/format.h"
#include "io/internal/io_engine.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero::internal {

// For tests: called on the background thread before it opens the file, with the rank (world) whose file it is: a
// test holds a write in flight by blocking here. Empty: nothing is called. Set only while no save is in flight.
std::function<void(int world_rank)>& AsyncSaveTestHook();
// For tests: called on the background thread before each chunk of a paced write (SaveOptions::
// max_write_bytes_per_s), with the rank (world) whose file it is, the chunk's offset and size in the file and the
// earliest time it may start, in seconds after the write's first chunk started. Empty: nothing is called.
std::function<void(int world_rank, int64_t offset, int64_t bytes, double not_before_s)>& AsyncSavePaceHook();

// The chunk a paced write moves at once: about 20 ms of writing at `bytes_per_s` (so the work of a write is spread
// evenly, and the write ends within 20 ms of its time), a multiple of `align` (every chunk but the last starts and
// ends aligned for O_DIRECT) and at least `align`, at most 8 MiB.
int64_t PacedChunkBytes(int64_t bytes_per_s, int64_t align);

struct AsyncSave {
  // The write plan: where each (unit, saved stream) section lies in the rank file. Made at the first
  // asynchronous save for this rank and world, and reused: it depends only on the registered units.
  struct PlannedSection {
    int unit = 0, stream = 0;    // the unit, and the stream's index among its saved streams
    int64_t begin = 0, end = 0;  // unit elements
    int64_t offset = 0;          // bytes, in the file
    DType dtype = DType::kF32;
    bool rank_state = false;  // a qgZ residual (stream: ckpt::kRankStateStreams), after every unit's sections
  };
  int plan_rank = -1, plan_world = 0;
  bool plan_qgz = false;  // the plan holds the qgZ residuals (SaveOptions::save_qgz_residuals)
  std::vector<PlannedSection> plan;
  int64_t file_bytes = 0;

  // The file's image, kept between saves. `image` is `staging`'s first 4096-aligned byte, so the I/O engine moves
  // it with O_DIRECT straight from this memory (no copy through its own staging buffers).
  Buffer staging;
  char* image = nullptr;
  std::unique_ptr<io::IoEngine> io;

  // The save in flight. `in_flight` is the same on every rank (set by Save's and cleared by FinishSave's
  // collective); `done` and `result` are this rank's worker's.
  bool in_flight = false;
  std::string dir, tag;
  ckpt::Meta meta;  // the run's description when Save was called (rank 0 writes it)
  TrainerState trainer_state;
  std::thread worker;
  std::atomic<bool> done{false};
  Status result;               // the worker's, read after `done`
  ckpt::RankFileMeta written;  // the worker's, read after `done`
  // A failure a Step's look found (every rank alike): returned by the next Save, WaitForSave or Load.
  Status failed;

  // A paced write (SaveOptions::max_write_bytes_per_s) sleeps before each chunk until the chunk's time, or until
  // `pace` leaves kPaced: kHurry once anything waits for the write (WaitForSave, Load, a Save that waits, the
  // destructor): pacing only spares the steps that run beside it, so a trainer that waits gets the rest at the
  // disk's speed; kCancel when the ranks did not agree to the save (another rank's Save failed): the write stops
  // and its temporary file is removed.
  enum class Pace : uint8_t { kPaced, kHurry, kCancel };
  std::mutex pace_mu;
  std::condition_variable pace_cv;
  Pace pace = Pace::kPaced;  // under pace_mu
  void SetPace(Pace p) {
    {
      std::lock_guard<std::mutex> lock(pace_mu);
      pace = p;
    }
    pace_cv.notify_all();
  }

  AsyncSave() = default;
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;
  // Joins a worker still writing: its file is finished and renamed, but no meta.json is written for it (that
  // needs the other ranks), so the checkpoint stays incomplete and `latest` names the one before.
  ~AsyncSave() {
    SetPace(Pace::kHurry);
    if (worker.joinable()) worker.join();
  }
};

}  // namespace zero::internal
