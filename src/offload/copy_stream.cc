#include "offload/copy_stream.h"

#include <chrono>

namespace zero::internal {

namespace {
using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
}  // namespace

CopyStream::~CopyStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

CopyStream::Ticket CopyStream::Enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ++last_;
  }
  if (!worker_.joinable()) worker_ = std::thread([this] { Run(); });
  work_cv_.notify_one();
  return last_;
}

void CopyStream::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    const auto t0 = Clock::now();
    task();
    const double ms = Ms(t0, Clock::now());
    lock.lock();
    busy_ms_ += ms;
    ++done_;
    done_cv_.notify_all();
  }
}

void CopyStream::Wait(Ticket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_ >= ticket) return;
  const auto t0 = Clock::now();
  done_cv_.wait(lock, [&] { return done_ >= ticket; });
  wait_ms_ += Ms(t0, Clock::now());
}

bool CopyStream::Done(Ticket ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ >= ticket;
}

double CopyStream::busy_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_ms_;
}

double CopyStream::wait_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wait_ms_;
}

}  // namespace zero::internal
