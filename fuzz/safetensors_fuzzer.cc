// Fuzz target: the safetensors reader (zero::SafetensorsFile::Open, ReadF32) over a file holding the input (what
// zero-gpt --init-from and Engine::LoadSafetensors read; the seeds are exports zero-ckpt wrote).
//
// Properties: no crash, hang, exception or huge allocation; a refused file is kDataLoss naming it; every tensor
// an accepted file lists lies inside the file, so it reads (ReadF32), and a wrong element count is refused.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "zero/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zero::fuzz::QuietLogs();
  const std::string path = zero::fuzz::ScratchDir() + "/in.safetensors";
  zero::fuzz::WriteFile(path, std::string_view(reinterpret_cast<const char*>(data), size));
  zero::StatusOr<std::unique_ptr<zero::SafetensorsFile>> f = zero::SafetensorsFile::Open(path);
  if (!f.ok()) {
    FUZZ_CHECK(f.status().code() == absl::StatusCode::kDataLoss, f.status().ToString());
    FUZZ_CHECK(f.status().message().find(path) != std::string_view::npos, f.status().ToString());
    return 0;
  }
  for (const zero::SafetensorsFile::Tensor& t : (*f)->tensors()) {
    FUZZ_CHECK((*f)->Find(t.name) != nullptr, "listed tensor " + t.name + " is not found");
    const int64_t n = t.numel();
    FUZZ_CHECK(n >= 0 && t.end - t.begin == n * static_cast<int64_t>(zero::DTypeSize(t.dtype)),
               "tensor " + t.name + "'s offsets do not match its shape");
    FUZZ_CHECK(t.end <= static_cast<int64_t>(size), "tensor " + t.name + " ends past the file");
    std::vector<float> v(static_cast<size_t>(n) + 1);
    const zero::Status r = (*f)->ReadF32(t.name, v.data(), n);
    FUZZ_CHECK(r.ok(), "listed tensor " + t.name + " does not read: " + r.ToString());
    const zero::Status wrong = (*f)->ReadF32(t.name, v.data(), n + 1);
    FUZZ_CHECK(wrong.code() == absl::StatusCode::kInvalidArgument, "a wrong count is not refused: " + wrong.ToString());
  }
  return 0;
}
