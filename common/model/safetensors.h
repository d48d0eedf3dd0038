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
#include "absl/strings/string_view.h"
#include "common/base/file_util.h"

namespace shardline {

// One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t numel() const;
};

// A safetensors header, parsed and checked.
struct SafetensorsHeader {
  int64_t data_start = 0;  // 8 + the JSON's length: where the data section begins
  std::map<std::string, SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;  // "__metadata__": strings only
};

// The length of the JSON header that a safetensors file of `file_bytes`
// bytes declares in its first 8 bytes (`head` holds the file's first bytes).
// DataLoss naming `path` when there are fewer than 8, or the length is past
// the end of the file or over 100 MiB.
absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view head, int64_t file_bytes, const std::string& path);

// Parses and checks the header of a safetensors file of `file_bytes` bytes
// from its first bytes `head` (8 + SafetensorsHeaderLength of them, or all of
// a shorter file): every tensor lies inside the data section, holds exactly
// shape x element size bytes (for the dtypes it knows), and the tensors,
// sorted by offset, tile the data section: no two overlap, and no byte of it
// (up to the end of the file) is left between or after them (the header
// itself may end in spaces). Errors are DataLoss naming `path` and the
// tensor or byte range; no input makes it throw or abort, and memory is in
// proportion to `head`. No I/O; safe to call
// from any thread.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view head, int64_t file_bytes,
                                                         const std::string& path);

// Reads ranges of tensors from a safetensors file without loading it whole
// (pread at the tensor's offset). Errors name the file and the tensor.
class SafetensorsReader {
 public:
  using Entry = SafetensorsEntry;
  // Opens `path` and reads and checks the header (ParseSafetensorsHeader).
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  // The same on a file already open (`path` names it in errors); the reader
  // owns `fd` from then on. For a file that was verified through this very
  // descriptor (a checkpoint's rank file after its checksum), so that what is
  // read is what was verified.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> FromOpenFile(UniqueFd fd, const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return header_.entries; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // Elements [first, first + count) of the F32, BF16 or F16 tensor `name`
  // into dst as fp32.
  absl::Status ReadFloats(const std::string& name, int64_t first, int64_t count, float* dst) const;
  // Every element of tensor `name`, whose dtype must be `dtype`, as its raw
  // bytes (NotFound without the tensor, InvalidArgument for another dtype).
  absl::Status ReadRaw(const std::string& name, const std::string& dtype, std::string* out) const;
  // What identifies the file's contents without reading them whole: the hex
  // SHA-256 of its size, its header bytes and `blocks` blocks of 4 KiB spread
  // evenly over its data section (the first and the last among them). Two files that
  // agree here hold the same tensors and, at every sampled place, the same
  // values: another model or revision of the same shapes differs in nearly
  // every block; an edit of a few weights between the samples is not seen.
  absl::StatusOr<std::string> Fingerprint(int blocks = 64) const;

 private:
  SafetensorsReader() = default;
  std::string path_;
  UniqueFd fd_;
  int64_t file_bytes_ = 0;
  SafetensorsHeader header_;
};

// The one safetensors writer. Tensors are declared up front and their bytes
// appended in declaration order to "<name>.tmp"; Finish() fsyncs and renames
// it to the name. Until then no file exists under the name; a writer
// destroyed unfinished removes its temp file. Neither the folder (its last
// component) nor either name is followed if it is a symlink (file_util.h
// AtomicFileAt): a link planted there is refused or replaced, never written
// through. The header is written by nlohmann::json, every name escaped.
//   Create: tensors of one dtype (F32 or BF16) from fp32 values (Append), with
//           the metadata {"format": "pt"} transformers requires;
//   CreateAt: tensors of any dtype as raw bytes (AppendBytes) inside an open
//           folder, with the caller's metadata (the engine's checkpoints).
enum class StoredDType { kF32, kBF16 };
class SafetensorsStreamWriter {
 public:
  struct Decl {
    std::string name;
    std::vector<int64_t> shape;
  };
  struct RawDecl {
    std::string name;
    std::string dtype;  // "F32", "BF16", "I64", ...
    std::vector<int64_t> shape;
    int64_t bytes = 0;
  };
  static absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> Create(const std::string& path,
                                                                         const std::vector<Decl>& tensors,
                                                                         StoredDType dtype = StoredDType::kF32);
  // `dir_fd` (the open folder `dir` names in errors) must outlive the writer.
  static absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> CreateAt(
      int dir_fd, const std::string& dir, const std::string& name, const std::vector<RawDecl>& tensors,
      const std::map<std::string, std::string>& metadata);
  ~SafetensorsStreamWriter();
  // Appends (part of) the next tensor's data, converted to the file's dtype;
  // a tensor may come in pieces. Only for a writer made by Create.
  absl::Status Append(const float* data, int64_t count);
  // Appends raw bytes of the next tensor(s); never more than declared.
  absl::Status AppendBytes(const void* data, int64_t bytes);
  absl::Status Finish();

 private:
  SafetensorsStreamWriter() = default;
  absl::Status Start(int dir_fd, const std::string& dir, const std::string& name, const std::vector<RawDecl>& tensors,
                     const std::map<std::string, std::string>& metadata);
  std::string path_;
  UniqueFd dir_fd_;  // Create's own folder; outlives file_
  std::unique_ptr<AtomicFileAt> file_;
  StoredDType dtype_ = StoredDType::kF32;
  int64_t expected_bytes_ = 0, written_bytes_ = 0;
};

// The size in bytes of one element of a safetensors dtype ("F32" -> 4), or 0
// for a name this reader does not know.
int SafetensorsElementBytes(const std::string& dtype);

// fp32 -> bf16 bits, rounding to nearest even (NaN stays NaN), as torch casts.
uint16_t FloatToBf16Bits(float f);
// bf16 and IEEE half bits -> fp32, exactly.
float Bf16BitsToFloat(uint16_t b);
float F16BitsToFloat(uint16_t h);

}  // namespace shardline
