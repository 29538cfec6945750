// examples/gpt/progress.h — the progress zero-gpt and zero-demo show while they train.
//
//   gpt::Progress p(stdout, gpt::Progress::ModeFor(stdout, flags.json));
//   on_step = [&](const gpt::StepLog& s) { p.Step("", s.step + 1, steps, s); };
//   ...
//   p.Finish();
//
// On a terminal one line is rewritten in place ('\r'): step/steps, loss, tokens per second, time per step, time
// left. When the output is not a terminal (a pipe, a file, CI logs) carriage returns would pile up into one long
// line, so it prints plain lines instead, every `lines_every` steps and at the last. With --json it prints
// nothing: stdout then carries only the JSON objects.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "train.h"

namespace zero::gpt {

class Progress {
 public:
  enum class Mode { kTerminal, kLines, kOff };
  // kOff with --json; kTerminal when `out` is a terminal; kLines otherwise.
  static Mode ModeFor(FILE* out, bool json);

  Progress(FILE* out, Mode mode, int64_t lines_every = 1);

  // After a step: `label` names the run (empty for one run), `step` of `steps` is this run's step (1-based, a
  // resumed run's numbering), `steps_after` the steps of the runs still to come (zero-demo), for the time left.
  void Step(const std::string& label, int64_t step, int64_t steps, const StepLog& log, int64_t steps_after = 0);
  // Terminal: erases the line, so that other output can follow (the next Step draws it again).
  void Clear();
  // Terminal: ends the line with a newline, so that it stays on screen.
  void Finish();

  Mode mode() const { return mode_; }

 private:
  FILE* out_;
  Mode mode_;
  int64_t every_;
  int64_t done_ = 0;
  size_t drawn_ = 0;  // characters of the line on screen (terminal)
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace zero::gpt
