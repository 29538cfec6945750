#include "zero/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

namespace zero {

namespace {
thread_local int t_rank = -1;

LogLevel LevelFromEnv() {
  const char* v = std::getenv("ZERO_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kInfo;
  std::string s(v);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "error" || s == "0") return LogLevel::kError;
  if (s == "warning" || s == "warn" || s == "1") return LogLevel::kWarning;
  if (s == "debug" || s == "3") return LogLevel::kDebug;
  return LogLevel::kInfo;
}

std::atomic<int>& LevelStorage() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}
LogSink& Sink() {
  static LogSink sink;
  return sink;
}

const char* BaseName(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}
}  // namespace

void SetLogRank(int rank) { t_rank = rank; }
int LogRank() { return t_rank; }
void SetLogLevel(LogLevel level) { LevelStorage().store(static_cast<int>(level)); }
LogLevel CurrentLogLevel() { return static_cast<LogLevel>(LevelStorage().load(std::memory_order_relaxed)); }

void SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(sink);
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static const char kLetters[] = {'E', 'W', 'I', 'D'};
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  int ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%02d:%02d:%02d.%03d", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  if (t_rank >= 0) {
    stream_ << "[zero r" << t_rank << "] ";
  } else {
    stream_ << "[zero] ";
  }
  stream_ << kLetters[static_cast<int>(level)] << ' ' << buf << ' ' << BaseName(file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  std::string line = stream_.str();
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (Sink()) {
    Sink()(level_, line);
    return;
  }
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace internal
}  // namespace zero
