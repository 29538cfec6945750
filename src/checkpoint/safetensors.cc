// checkpoint/safetensors.cc — safetensors: the streaming writer and the reader (zero/checkpoint.h).
#include "checkpoint/internal/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/internal/json_depth.h"
#include "nlohmann/json.hpp"
#include "zero/checkpoint.h"

namespace zero::ckpt {

using json = nlohmann::json;

const char* SafetensorsDType(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

Status SafetensorsWriter::Open(const std::string& path, const std::vector<Entry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  int64_t at = 0;
  for (const Entry& e : entries) {
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    const int64_t bytes = n * static_cast<int64_t>(DTypeSize(e.dtype));
    h[e.name] = {{"dtype", SafetensorsDType(e.dtype)}, {"shape", e.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned
  expected_ = at;
  ZERO_RETURN_IF_ERROR(file_.Open(path));
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  ZERO_RETURN_IF_ERROR(file_.Write(len, 8));
  ZERO_RETURN_IF_ERROR(file_.Write(text.data(), text.size()));
  expected_ += file_.written();
  return absl::OkStatus();
}

Status SafetensorsWriter::Append(const void* data, size_t bytes) { return file_.Write(data, bytes); }

Status SafetensorsWriter::Commit() {
  if (file_.written() != expected_) {
    return absl::InternalError(absl::StrCat(file_.path(), ": wrote ", file_.written(), " bytes, expected ", expected_));
  }
  return file_.Commit();
}

}  // namespace zero::ckpt

namespace zero {

using json = nlohmann::json;

int64_t SafetensorsFile::Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  ZERO_ASSIGN_OR_RETURN(int64_t size, ckpt::FileSize(path));
  auto bad = [&](const std::string& why) { return absl::DataLossError(absl::StrCat(path, ": ", why)); };
  if (size < 8) return bad("shorter than the 8-byte header length");
  unsigned char len[8];
  ZERO_RETURN_IF_ERROR(ckpt::ReadAt(f->fd_, path, 0, len, 8));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > static_cast<uint64_t>(size - 8) || n > (uint64_t{100} << 20)) {
    return bad(absl::StrCat("header length ", n, " does not fit the file's ", size, " bytes"));
  }
  std::string text(n, '\0');
  ZERO_RETURN_IF_ERROR(ckpt::ReadAt(f->fd_, path, 8, text.data(), n));
  f->data_start_ = 8 + static_cast<int64_t>(n);
  const int64_t data_bytes = size - f->data_start_;
  if (zero::internal::JsonTooDeepAt(text) != std::string::npos) {
    return bad(absl::StrCat("the header nests deeper than ", zero::internal::kMaxJsonDepth, " levels"));
  }
  json h = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return bad("the header is not a JSON object");
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& t = it.value();
    const std::string where = absl::StrCat("tensor \"", it.key(), "\"");
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets") ||
        !t["dtype"].is_string() || !t["shape"].is_array() || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return bad(absl::StrCat(where, " lacks dtype, shape or data_offsets"));
    }
    Tensor x;
    x.name = it.key();
    const std::string dt = t["dtype"].get<std::string>();
    if (dt == "F32") {
      x.dtype = DType::kF32;
    } else if (dt == "F16") {
      x.dtype = DType::kF16;
    } else if (dt == "BF16") {
      x.dtype = DType::kBF16;
    } else {
      return bad(absl::StrCat(where, " has dtype ", dt, "; F32, F16 and BF16 are read"));
    }
    int64_t numel = 1;
    for (const json& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 40)) {
        return bad(absl::StrCat(where, " has shape entry ", d.dump()));
      }
      x.shape.push_back(d.get<int64_t>());
      numel *= std::max<int64_t>(1, x.shape.back());
      if (numel > (int64_t{1} << 40)) return bad(absl::StrCat(where, " is too large"));
    }
    const json& o = t["data_offsets"];
    if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned()) return bad(absl::StrCat(where, "'s data_offsets"));
    x.begin = o[0].get<int64_t>();
    x.end = o[1].get<int64_t>();
    if (x.begin < 0 || x.end < x.begin || x.end > data_bytes ||
        x.end - x.begin != x.numel() * static_cast<int64_t>(DTypeSize(x.dtype))) {
      return bad(absl::StrCat(where, ": data_offsets [", x.begin, ", ", x.end, ") do not hold its ", x.numel(), " ", dt,
                              " values within the ", data_bytes, " data bytes"));
    }
    f->tensors_.push_back(std::move(x));
  }
  std::sort(f->tensors_.begin(), f->tensors_.end(), [](const Tensor& a, const Tensor& b) { return a.begin < b.begin; });
  return f;
}

const SafetensorsFile::Tensor* SafetensorsFile::Find(const std::string& name) const {
  for (const Tensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status SafetensorsFile::ReadF32(const std::string& name, float* dst, int64_t n) const {
  const Tensor* t = Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(path_, " has no tensor \"", name, "\""));
  if (t->numel() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor \"", name, "\" has ", t->numel(), " elements, the parameter ", n));
  }
  constexpr int64_t kChunk = int64_t{1} << 20;  // elements per read: bounded memory for any tensor
  const int64_t es = static_cast<int64_t>(DTypeSize(t->dtype));
  std::vector<char> buf(static_cast<size_t>(std::min(n, kChunk) * es));
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    ZERO_RETURN_IF_ERROR(ckpt::ReadAt(fd_, path_, data_start_ + t->begin + i * es, buf.data(), m * es));
    ConvertBuffer(buf.data(), t->dtype, dst + i, DType::kF32, static_cast<size_t>(m));
  }
  return absl::OkStatus();
}

}  // namespace zero
