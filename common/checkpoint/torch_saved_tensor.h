// One tensor as torch.save writes it, found at a byte range of a file: how
// DCP's FileSystemWriter stores each chunk of a `.distcp` file (and each
// checkpoint_id's `storage_data` entry says where). The range is a zip
// archive (stored, never compressed) of `<top>/data.pkl`, the pickled call
// torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
// requires_grad, hooks), and `<top>/data/<key>`, the storage's raw bytes
// (float32, bfloat16, float16, float64; int32 and int64 for ReadTorchSavedInt).
//
// ReadTorchSavedTensor reads only the archive's directory and its data.pkl
// (PickleReader, allowed: _rebuild_tensor_v2, the float and int storages,
// OrderedDict); ReadTorchSavedFloats then reads any element range of the
// tensor's data by pread, never the whole chunk. Zip64 records are followed.
//
// Errors: anything that is not such an archive lying wholly inside the range
// (a bad signature, an entry outside the range, compression, a pickle of
// another shape, a storage too short for the tensor, strides that are not
// row-major contiguous, big-endian data, a storage type outside those above)
// is DataLoss naming `path` and the range (InvalidArgument where data.pkl is
// no pickle PickleReader runs); a range past the file's end is DataLoss
// naming `path`.
//
// Writing: TorchSaveFloatTensor and TorchSaveValue build, in memory, the
// archive torch.save writes for an fp32 tensor or for a plain value, which
// torch.load(weights_only=True) reads (DCP's FileSystemReader does, per
// chunk). Each entry is stored with its CRC-32, the tensor's data aligned to
// 64 bytes as torch aligns it; archives stay under 4 GiB (no zip64 written).
//
// Threads: the readers only pread `fd`; they may run on several threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline {

struct TorchSavedTensor {
  std::string dtype;  // torch's name: "float32", "bfloat16", "float16", "float64"
  int element_bytes = 4;
  std::vector<int64_t> shape;  // empty for a scalar
  int64_t numel = 1;
  int64_t data_offset = 0;  // in the file: the bytes of element 0
};

// The tensor torch.save wrote at [offset, offset + length) of the open file
// `fd` (`path` names it in errors).
absl::StatusOr<TorchSavedTensor> ReadTorchSavedTensor(int fd, const std::string& path, int64_t offset,
                                                      int64_t length);

// The int torch.save wrote at the range: a plain Python int (a DCP value such
// as dcp.save({..., "step": 5})) or a one-element tensor holding one
// (torchtitan's train_state.step, int32; a float such as AdamW's step).
absl::StatusOr<int64_t> ReadTorchSavedInt(int fd, const std::string& path, int64_t offset, int64_t length);

// Elements [first, first + count) of the float tensor `t` (row-major) into
// dst, as fp32; an integer tensor is InvalidArgument.
absl::Status ReadTorchSavedFloats(int fd, const std::string& path, const TorchSavedTensor& t, int64_t first,
                                  int64_t count, float* dst);

// The largest tensor data TorchSaveFloatTensor takes: callers split larger
// tensors into chunks (DCP allows any number per tensor).
inline constexpr int64_t kMaxTorchSaveBytes = int64_t{1} << 30;

// torch.save(t) of the fp32 tensor of `shape` whose row-major elements are
// `values` (numel of them), or with `bf16` of the bf16 tensor of their values
// rounded to nearest even (exact for values that are bf16 already);
// InvalidArgument past kMaxTorchSaveBytes.
absl::StatusOr<std::string> TorchSaveFloatTensor(const std::vector<int64_t>& shape, const float* values,
                                                 bool bf16 = false);
// torch.save(v) of a value without tensors, whose pickle (PickleWriter) is `data_pkl`.
std::string TorchSaveValue(const std::string& data_pkl);

}  // namespace shardline
