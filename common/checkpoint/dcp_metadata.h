// The `.metadata` file of a PyTorch Distributed Checkpoint (DCP) directory
// (torch.distributed.checkpoint's FileSystemWriter: `.metadata` plus
// `__R_N.distcp` files), read without running Python: PickleReader with an
// allow-list of DCP's own classes, torch.Size, torch's dtypes and the two
// helpers DCP pickles (torch.serialization._get_layout, _MEM_FORMAT_ENCODING);
// any other global is refused, naming it.
//
// What is kept: every tensor entry of the state dict (its dtype, global size
// and the chunks written for it), the names of the non-tensor entries
// (pickled values, BytesStorageMetadata), and where each chunk or value lies
// (file, byte offset, length) from storage_data.
//
// WriteDcpMetadata is the inverse: the pickle of a Metadata as torch 2.11
// writes it (every tensor float32 or bfloat16, strided, contiguous; a value a
// BytesStorageMetadata), which Python's pickle loads into DCP's own classes.
//
// Errors: a malformed pickle, a foreign global, an entry of an unexpected
// shape, a chunk outside its tensor, a storage file name that is not a plain
// file name in the directory, or a negative offset or length is an
// InvalidArgument naming `source`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline {

struct DcpChunk {
  std::vector<int64_t> offsets, sizes;  // per dimension, within the whole tensor
};

struct DcpTensorMeta {
  std::string dtype;  // torch's name: "float32", "bfloat16", ...
  std::vector<int64_t> size;
  std::vector<DcpChunk> chunks;
};

// Where one chunk (a tensor's, by its offsets) or one pickled value lies.
struct DcpStorage {
  std::string fqn;
  std::vector<int64_t> chunk_offsets;  // empty for a non-tensor value
  std::string relative_path;           // a file of the checkpoint directory
  int64_t offset = 0, length = 0;      // its bytes in that file
};

// One step of the path DCP's flatten_state_dict took to an entry (its
// planner_data): a dict key, or a list index where index >= 0.
struct DcpPathPart {
  std::string key;
  int64_t index = -1;
};

struct DcpMetadata {
  std::map<std::string, DcpTensorMeta> tensors;
  std::vector<std::string> values;  // the non-tensor entries (BytesStorageMetadata)
  std::vector<DcpStorage> storage;
  std::string version;  // Metadata.version, where written
  // Written only (the reader leaves it empty): each entry's path.
  std::map<std::string, std::vector<DcpPathPart>> planner_data;
};

absl::StatusOr<DcpMetadata> ParseDcpMetadata(absl::string_view data, const std::string& source);

// The `.metadata` pickle of `m` (its tensors must be float32 or bfloat16).
std::string WriteDcpMetadata(const DcpMetadata& m);

}  // namespace shardline
