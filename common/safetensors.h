// safetensors files without LibTorch: a reader of tensor ranges, a streaming
// writer that emits one tensor after another (so a model can be written one
// unit at a time), and the SHA-256 of a file.
//
// Format: 8-byte little-endian header length, a JSON header of name ->
// {dtype, shape, data_offsets} (and optional "__metadata__"), then the bytes.
// Floating-point data crosses this API as fp32: F32, BF16 and F16 tensors are
// read (converted exactly), F32 or BF16 written (rounded to nearest even, as
// torch casts).
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
    int64_t numel() const;
  };
  // Reads and checks the header: every tensor lies inside the file, holds
  // exactly shape x element size bytes (for the dtypes it knows), and no two
  // tensors overlap. Errors name the file and the tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  ~SafetensorsReader();
  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Elements [first, first + count) of the F32, BF16 or F16 tensor `name`
  // into dst as fp32.
  absl::Status ReadFloats(const std::string& name, int64_t first, int64_t count, float* dst) const;

 private:
  SafetensorsReader() = default;
  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors of one dtype (F32 or BF16), declared up front and then
// appended in declaration order, to "<path>.tmp"; Finish() fsyncs and renames
// it to `path`. Until then no file exists at `path`; a writer destroyed
// unfinished removes its temp file. The header's metadata says
// {"format": "pt"}, which transformers requires.
enum class StoredDType { kF32, kBF16 };
class SafetensorsStreamWriter {
 public:
  struct Decl {
    std::string name;
    std::vector<int64_t> shape;
  };
  static absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> Create(const std::string& path,
                                                                         const std::vector<Decl>& tensors,
                                                                         StoredDType dtype = StoredDType::kF32);
  ~SafetensorsStreamWriter();
  // Appends (part of) the next tensor's data, converted to the file's dtype;
  // a tensor may come in pieces.
  absl::Status Append(const float* data, int64_t count);
  absl::Status Finish();

 private:
  SafetensorsStreamWriter() = default;
  std::string path_, tmp_;
  int fd_ = -1;
  StoredDType dtype_ = StoredDType::kF32;
  int64_t expected_bytes_ = 0, written_bytes_ = 0;
  bool finished_ = false;
};

// The size in bytes of one element of a safetensors dtype ("F32" -> 4), or 0
// for a name this reader does not know.
int SafetensorsElementBytes(const std::string& dtype);

// fp32 -> bf16 bits, rounding to nearest even (NaN stays NaN), as torch casts.
uint16_t FloatToBf16Bits(float f);

// Hex SHA-256 of a whole file, read in 4 MiB pieces.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace shardline
