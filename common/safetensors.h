// safetensors files without LibTorch: a reader of tensor ranges, a streaming
// writer that emits one tensor after another (so a model can be written one
// unit at a time), and the SHA-256 of a file.
//
// Format: 8-byte little-endian header length, a JSON header of name ->
// {dtype, shape, data_offsets} (and optional "__metadata__"), then the bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline {

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
  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Elements [first, first + count) of the F32 tensor `name` into dst.
  absl::Status ReadFloats(const std::string& name, int64_t first, int64_t count, float* dst) const;

 private:
  SafetensorsReader() = default;
  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes F32 tensors declared up front, then appended in declaration order,
// to "<path>.tmp"; Finish() fsyncs and renames it to `path`. Until then no
// file exists at `path`; a writer destroyed unfinished removes its temp file.
class SafetensorsStreamWriter {
 public:
  struct Decl {
    std::string name;
    std::vector<int64_t> shape;
  };
  static absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> Create(const std::string& path,
                                                                         const std::vector<Decl>& tensors);
  ~SafetensorsStreamWriter();
  // Appends (part of) the next tensor's data; a tensor may come in pieces.
  absl::Status Append(const float* data, int64_t count);
  absl::Status Finish();

 private:
  SafetensorsStreamWriter() = default;
  std::string path_, tmp_;
  int fd_ = -1;
  int64_t expected_bytes_ = 0, written_bytes_ = 0;
  bool finished_ = false;
};

// Hex SHA-256 of a whole file, read in 4 MiB pieces.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace shardline
