// examples/gpt/progress.cc — the progress line (progress.h).
#include "progress.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"

namespace zero::gpt {

namespace {

std::string Clock(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

}  // namespace

Progress::Mode Progress::ModeFor(FILE* out, bool json) {
  if (json) return Mode::kOff;
  return ::isatty(::fileno(out)) ? Mode::kTerminal : Mode::kLines;
}

Progress::Progress(FILE* out, Mode mode, int64_t lines_every)
    : out_(out), mode_(mode), every_(std::max<int64_t>(lines_every, 1)) {}

void Progress::Step(const std::string& label, int64_t step, int64_t steps, const StepLog& log, int64_t steps_after) {
  ++done_;
  if (mode_ == Mode::kOff) return;
  if (mode_ == Mode::kLines && step % every_ != 0 && step != steps) return;
  // The time left from the mean wall time per step so far (the first step, which also warms the pools, included).
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t remaining = std::max<int64_t>(steps - step, 0) + steps_after;
  const double left = elapsed / static_cast<double>(done_) * static_cast<double>(remaining);
  std::string line = absl::StrFormat("%s%sstep %d/%d  loss %.4f  grad_norm %.4f  %.0f tok/s  %.1f ms/step  %s left%s",
                                     label, label.empty() ? "" : "  ", step, steps, log.loss, log.grad_norm,
                                     log.tokens_per_s, log.step_ms, Clock(left), log.skipped ? "  (skipped)" : "");
  if (mode_ == Mode::kLines) {
    std::fprintf(out_, "%s\n", line.c_str());
  } else {
    const size_t n = line.size();
    if (n < drawn_) line.append(drawn_ - n, ' ');  // cover what is left of a longer line
    std::fprintf(out_, "\r%s", line.c_str());
    drawn_ = n;
  }
  std::fflush(out_);
}

void Progress::Clear() {
  if (mode_ != Mode::kTerminal || drawn_ == 0) return;
  std::fprintf(out_, "\r%s\r", std::string(drawn_, ' ').c_str());
  std::fflush(out_);
  drawn_ = 0;
}

void Progress::Finish() {
  if (mode_ != Mode::kTerminal || drawn_ == 0) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  drawn_ = 0;
}

}  // namespace zero::gpt
