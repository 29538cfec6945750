#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fuzz_check.h"

namespace zero::fuzz {

const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::error_code ec;
    const char* env = std::getenv("ZERO_FUZZ_SCRATCH");  // scripts/fuzz.sh: one it removes after the run
    std::string base = env != nullptr && *env != '\0' ? std::string(env)
                       : std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                           ? std::string("/dev/shm")
                           : std::filesystem::temp_directory_path().string();
    std::string t = base + "/zero-fuzz-XXXXXX";
    FUZZ_CHECK(::mkdtemp(t.data()) != nullptr, "mkdtemp " + t);
    static std::string removed_at_exit;
    removed_at_exit = t;
    std::atexit([] {
      std::error_code e;
      std::filesystem::remove_all(removed_at_exit, e);
    });
    return t;
  }();
  return dir;
}

void ClearDir(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) std::filesystem::remove_all(e.path(), ec);
}

void WriteFile(const std::string& path, std::string_view data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  FUZZ_CHECK(f.good(), "cannot write " + path);
}

}  // namespace zero::fuzz
