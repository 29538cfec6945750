// The replay driver: runs a fuzz target's LLVMFuzzerTestOneInput over every file of the directories (or the
// files) it is given, with the normal toolchain and no libFuzzer. CTest runs it over each target's corpus
// (fuzz/CMakeLists.txt), so every input the fuzzers kept is checked on every CI run; a target reports a failed
// check by aborting, which fails the test naming the input.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg = argv[i];
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(arg)) {
        if (e.is_regular_file()) inputs.push_back(e.path());
      }
    } else if (std::filesystem::is_regular_file(arg)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s is neither a file nor a directory\n", argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    // An empty corpus would make the test pass while checking nothing.
    std::fprintf(stderr, "replay: no inputs (usage: %s CORPUS_DIR_OR_FILE...)\n", argv[0]);
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());
  size_t bytes = 0;
  for (const auto& p : inputs) {
    std::ifstream f(p, std::ios::binary);
    const std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) {
      std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
      return 2;
    }
    // Named before running, so an abort inside the target is attributed to its input.
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", p.c_str(), data.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    bytes += data.size();
  }
  std::printf("replay: %zu inputs, %zu bytes, all passed\n", inputs.size(), bytes);
  return 0;
}
