// checkpoint/internal/safetensors.h — a streaming safetensors writer. defines: SafetensorsWriter.
//
// The format (huggingface/safetensors): 8 bytes little-endian N, N bytes of JSON header {"name": {"dtype":
// "F32"|"F16"|"BF16", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {string: string}} padded
// with spaces to a multiple of 8, then the tensors' bytes back to back with no holes, offsets relative to the
// end of the header. The header is known before any data (every tensor's size is), so tensors stream out one
// after another.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/internal/file.h"
#include "zero/dtype.h"
#include "zero/status.h"

namespace zero::ckpt {

const char* SafetensorsDType(DType t);  // "F32", "F16", "BF16"

class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  // Writes the header for `entries` (their data follows in this order).
  Status Open(const std::string& path, const std::vector<Entry>& entries,
              const std::map<std::string, std::string>& metadata);
  Status Append(const void* data, size_t bytes);
  // Checks every tensor's bytes arrived, then fsync and rename.
  Status Commit();

 private:
  AtomicFile file_;
  int64_t expected_ = 0;
};

}  // namespace zero::ckpt
