// Writes ATen tensors of any dtype as a safetensors file, so that Python's
// safetensors/torch can load what the engine produced: an adapter over the
// one safetensors writer (common/model/safetensors.h SafetensorsStreamWriter), which
// writes "<name>.tmp", fsyncs and renames it: a reader never sees half.
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

// Writes `name` inside the open directory `dir_fd` (`dir` names it in
// errors) through a temp file (common/base/file_util.h AtomicFileAt: a symlink
// planted under either name is never written through). `after_tensor(n)`
// (if given) runs after the n-th tensor's bytes are written.
absl::Status WriteSafetensorsAt(int dir_fd, const std::string& dir, const std::string& name,
                                const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {},
                                const std::function<void(size_t)>& after_tensor = nullptr);
// The same at `path`, whose folder must exist and not be a symlink.
absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace shardline
