#include "worker/checkpoint/tensor_file.h"

#include <fcntl.h>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"

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
  std::vector<SafetensorsStreamWriter::RawDecl> decls;
  std::vector<at::Tensor> data;
  for (const auto& [tensor, t] : tensors) {
    const char* dtype = SafetensorsDType(t.scalar_type());
    if (!dtype) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/", name, ": tensor ", tensor, " has an unsupported dtype"));
    }
    at::Tensor c = t.contiguous().cpu();
    decls.push_back({tensor, dtype, c.sizes().vec(), static_cast<int64_t>(c.nbytes())});
    data.push_back(std::move(c));
  }
  SL_ASSIGN_OR_RETURN(auto out, SafetensorsStreamWriter::CreateAt(dir_fd, dir, name, decls, metadata));
  for (size_t i = 0; i < data.size(); ++i) {
    SL_RETURN_IF_ERROR(out->AppendBytes(data[i].data_ptr(), static_cast<int64_t>(data[i].nbytes())));
    if (after_tensor) after_tensor(i + 1);
  }
  return out->Finish();
}

}  // namespace shardline
