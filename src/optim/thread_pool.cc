// optim/thread_pool.cc — see internal/thread_pool.h.

#include "optim/internal/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace zero::optim_internal {
namespace {

// One ParallelFor call. Shared between the caller and the helpers that joined it, so a helper that is still
// unlocking `mu` after the caller saw `helpers_inside == 0` and returned touches live memory. `body` itself is
// only called for claimed items, all of which are finished before the caller returns.
struct Job {
  const std::function<void(size_t)>* body = nullptr;
  size_t n_items = 0;
  std::atomic<size_t> next{0};
  int open_slots = 0;      // helpers that may still join (guarded by the pool mutex)
  int helpers_inside = 0;  // guarded by `mu`
  std::mutex mu;
  std::condition_variable cv;

  void Drain() {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < n_items;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      (*body)(i);
    }
  }
};

class Pool {
 public:
  // Leaked on purpose: workers block in a condition wait forever, and a static destructor joining them would
  // race with other static destructors that might still run parallel loops.
  static Pool& Get() {
    static Pool* pool = new Pool();
    return *pool;
  }

  void Run(size_t n_items, int threads, const std::function<void(size_t)>& body) {
    auto job_ptr = std::make_shared<Job>();
    Job& job = *job_ptr;
    job.body = &body;
    job.n_items = n_items;
    const int helpers = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads) - 1, n_items - 1));
    if (helpers > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      while (static_cast<int>(workers_.size()) < std::min(helpers, kMaxWorkers)) {
        workers_.emplace_back([this] { WorkerLoop(); });
      }
      job.open_slots = helpers;
      queue_.push_back(job_ptr);
    }
    if (helpers > 0) cv_.notify_all();
    job.Drain();
    if (helpers > 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = std::find(queue_.begin(), queue_.end(), job_ptr);
        if (it != queue_.end()) queue_.erase(it);
      }
      // Every item is claimed by now; wait for the helpers still finishing theirs.
      std::unique_lock<std::mutex> lock(job.mu);
      job.cv.wait(lock, [&] { return job.helpers_inside == 0; });
    }
  }

 private:
  static constexpr int kMaxWorkers = 256;

  void WorkerLoop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        job = queue_.front();
        if (--job->open_slots == 0) queue_.pop_front();
        // Registered while holding mu_, so the owner (who removes the job under mu_) waits for us.
        std::lock_guard<std::mutex> job_lock(job->mu);
        ++job->helpers_inside;
      }
      job->Drain();
      std::lock_guard<std::mutex> job_lock(job->mu);
      if (--job->helpers_inside == 0) job->cv.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::thread> workers_;
};

}  // namespace

void ParallelFor(size_t n_items, int threads, const std::function<void(size_t)>& body) {
  if (n_items == 0) return;
  if (threads <= 1 || n_items == 1) {
    for (size_t i = 0; i < n_items; ++i) body(i);
    return;
  }
  Pool::Get().Run(n_items, threads, body);
}

}  // namespace zero::optim_internal
