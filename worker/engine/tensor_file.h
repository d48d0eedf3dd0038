// Writes tensors as a safetensors file (8-byte little-endian header length, a
// JSON header of name -> {dtype, shape, data_offsets}, then the raw bytes), so
// that Python's safetensors/torch can load what the engine produced. The file
// is written to "<path>.tmp", fsynced and renamed: a reader never sees half.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"

namespace shardline {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// `after_tensor(n)` (if given) runs after the n-th tensor's bytes are written.
absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {},
                              const std::function<void(size_t)>& after_tensor = nullptr);

}  // namespace shardline
