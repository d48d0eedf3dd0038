#include "worker/engine/tensor_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shardline {
namespace {

const char* SafetensorsDType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kDouble: return "F64";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kByte: return "U8";
    default: return nullptr;
  }
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  SL_ASSIGN_OR_RETURN(UniqueFd dir_fd, OpenDirectoryNoFollow(AT_FDCWD, dir, dir));
  return WriteSafetensorsAt(dir_fd.get(), dir, path.substr(slash + 1), tensors, metadata);
}

absl::Status WriteSafetensorsAt(int dir_fd, const std::string& dir, const std::string& name,
                                const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                                const std::function<void(size_t)>& after_tensor) {
  const std::string path = dir + "/" + name;
  std::vector<std::string> entries;
  std::vector<at::Tensor> data;
  int64_t offset = 0;
  if (!metadata.empty()) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : metadata) kv.push_back(JsonString(k) + ":" + JsonString(v));
    entries.push_back("\"__metadata__\":{" + absl::StrJoin(kv, ",") + "}");
  }
  for (const auto& [name, t] : tensors) {
    const char* dtype = SafetensorsDType(t.scalar_type());
    if (!dtype) return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, " has an unsupported dtype"));
    at::Tensor c = t.contiguous().cpu();
    const int64_t n = static_cast<int64_t>(c.nbytes());
    entries.push_back(absl::StrCat(JsonString(name), ":{\"dtype\":\"", dtype, "\",\"shape\":[",
                                   absl::StrJoin(c.sizes(), ","), "],\"data_offsets\":[", offset, ",",
                                   offset + n, "]}"));
    offset += n;
    data.push_back(std::move(c));
  }
  std::string header = "{" + absl::StrJoin(entries, ",") + "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  SL_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileAt> f, AtomicFileAt::Create(dir_fd, dir, name));
  uint64_t len = header.size();  // little-endian on every platform we build for
  SL_RETURN_IF_ERROR(WriteFully(f->fd(), &len, sizeof(len), path));
  SL_RETURN_IF_ERROR(WriteFully(f->fd(), header.data(), header.size(), path));
  for (size_t i = 0; i < data.size(); ++i) {
    SL_RETURN_IF_ERROR(WriteFully(f->fd(), data[i].data_ptr(), data[i].nbytes(), path));
    if (after_tensor) after_tensor(i + 1);
  }
  return f->Commit();
}

}  // namespace shardline
