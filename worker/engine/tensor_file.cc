#include "worker/engine/tensor_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <openssl/evp.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
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

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata) {
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
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  uint64_t len = header.size();  // little-endian on every platform we build for
  absl::Status s = WriteAll(fd, &len, sizeof(len), path);
  if (s.ok()) s = WriteAll(fd, header.data(), header.size(), path);
  for (const auto& c : data) {
    if (s.ok()) s = WriteAll(fd, c.data_ptr(), c.nbytes(), path);
  }
  if (s.ok() && ::fsync(fd) != 0) s = absl::DataLossError(absl::StrCat(path, ": fsync failed"));
  ::close(fd);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::DataLossError(absl::StrCat(path, ": rename failed: ", std::strerror(errno)));
  }
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path) {
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  r->path_ = path;
  r->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r->fd_ < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st;
  fstat(r->fd_, &st);
  uint64_t len = 0;
  if (st.st_size < 8 || ::pread(r->fd_, &len, 8, 0) != 8 || len > static_cast<uint64_t>(st.st_size) - 8) {
    return absl::DataLossError(absl::StrCat(path, ": not a safetensors file (bad header length)"));
  }
  std::string header(len, '\0');
  if (::pread(r->fd_, header.data(), len, 8) != static_cast<ssize_t>(len)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  }
  r->data_start_ = 8 + static_cast<int64_t>(len);
  const int64_t data_bytes = st.st_size - r->data_start_;
  try {
    const nlohmann::json j = nlohmann::json::parse(header);
    for (const auto& [name, v] : j.items()) {
      if (name == "__metadata__") {
        for (const auto& [k, mv] : v.items()) r->metadata_[k] = mv.get<std::string>();
        continue;
      }
      Entry e;
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      e.begin = v.at("data_offsets").at(0).get<int64_t>();
      e.end = v.at("data_offsets").at(1).get<int64_t>();
      if (e.begin < 0 || e.end < e.begin || e.end > data_bytes) {
        return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " lies outside the file"));
      }
      r->entries_[name] = std::move(e);
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": malformed safetensors header: ", e.what()));
  }
  return r;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status SafetensorsReader::ReadFloats(const std::string& name, int64_t first, int64_t count, float* dst) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", name));
  const Entry& e = it->second;
  if (e.dtype != "F32") return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor ", name, " is ", e.dtype));
  if (first < 0 || count < 0 || (first + count) * 4 > e.end - e.begin) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": tensor ", name, " has no elements [", first, ", ",
                                              first + count, ")"));
  }
  char* out = reinterpret_cast<char*>(dst);
  int64_t left = count * 4, at = data_start_ + e.begin + first * 4;
  while (left > 0) {
    const ssize_t n = ::pread(fd_, out, left, at);
    if (n <= 0) return absl::DataLossError(absl::StrCat(path_, ": short read of ", name));
    out += n;
    at += n;
    left -= n;
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> SafetensorsReader::ReadTensor(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", name));
  at::Tensor t = at::empty(it->second.shape, at::kFloat);
  absl::Status s = ReadFloats(name, 0, t.numel(), t.data_ptr<float>());
  if (!s.ok()) return s;
  return t;
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(4 << 20);
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) EVP_DigestUpdate(ctx, buf.data(), n);
  ::close(fd);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  if (n < 0) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", md[i]);
  return hex;
}

}  // namespace shardline
