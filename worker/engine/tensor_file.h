// Writes tensors as a safetensors file (8-byte little-endian header length, a
// JSON header of name -> {dtype, shape, data_offsets}, then the raw bytes), so
// that Python's safetensors/torch can load what the engine produced. The file
// is written to "<path>.tmp", fsynced and renamed: a reader never sees half.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Reads ranges of tensors from a safetensors file without loading it whole
// (pread at the tensor's offset). Errors name the file and the tensor.
class SafetensorsReader {
 public:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;  // byte offsets into the data section
  };
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  ~SafetensorsReader();
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Elements [first, first + count) of the F32 tensor `name` into dst.
  absl::Status ReadFloats(const std::string& name, int64_t first, int64_t count, float* dst) const;
  // Reads the whole of an F32 tensor.
  absl::StatusOr<at::Tensor> ReadTensor(const std::string& name) const;

 private:
  SafetensorsReader() = default;
  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Hex SHA-256 of a whole file, read in 4 MiB pieces.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace shardline
