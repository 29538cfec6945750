// zero/logging.h — a small leveled logger with a rank prefix.
//
//   ZERO_LOG(INFO) << "unit " << name << " gathered in " << ms << " ms";
//   ZERO_LOG_ONCE(WARNING) << "gather order changed at step " << step;   // once per call site
//
// Lines look like `[zero r2] W 18:40:01.123 engine.cc:88] message` and go to stderr. The level comes from
// ZERO_LOG_LEVEL (error, warning, info, debug; default info) read once at first use, or SetLogLevel().
// The rank prefix is per thread (SetLogRank), because tests run N ranks as N threads in one process.
//
// Thread-safe: every line is written whole under one lock, so lines from several threads never interleave.
// Logging never fails the caller (a line that cannot be written is dropped).
#pragma once

#include <atomic>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace zero {

enum class LogLevel : int { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// Sets the rank shown in this thread's log prefix; -1 (the default) shows none.
void SetLogRank(int rank);
int LogRank();

void SetLogLevel(LogLevel level);
LogLevel CurrentLogLevel();
inline bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= static_cast<int>(CurrentLogLevel()); }

// Replaces the destination of log lines (tests capture warnings with it); nullptr restores stderr.
// The sink receives the level and the formatted line without the trailing newline.
using LogSink = std::function<void(LogLevel, std::string_view)>;
void SetLogSink(LogSink sink);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal
}  // namespace zero

#define ZERO_INTERNAL_LOG_LEVEL_ERROR ::zero::LogLevel::kError
#define ZERO_INTERNAL_LOG_LEVEL_WARNING ::zero::LogLevel::kWarning
#define ZERO_INTERNAL_LOG_LEVEL_INFO ::zero::LogLevel::kInfo
#define ZERO_INTERNAL_LOG_LEVEL_DEBUG ::zero::LogLevel::kDebug

#define ZERO_LOG(level)                                       \
  if (!::zero::LogEnabled(ZERO_INTERNAL_LOG_LEVEL_##level)) { \
  } else ::zero::internal::LogMessage(ZERO_INTERNAL_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

// Logs at most once per call site per process.
#define ZERO_LOG_ONCE(level)                                                                      \
  if (static std::atomic<bool> _zero_logged_once{false};                                          \
      !::zero::LogEnabled(ZERO_INTERNAL_LOG_LEVEL_##level) || _zero_logged_once.exchange(true)) { \
  } else ::zero::internal::LogMessage(ZERO_INTERNAL_LOG_LEVEL_##level, __FILE__, __LINE__).stream()
