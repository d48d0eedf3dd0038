#include "common/safetensors.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"

namespace shardline {

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

absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::Create(
    const std::string& path, const std::vector<Decl>& tensors) {
  std::unique_ptr<SafetensorsStreamWriter> w(new SafetensorsStreamWriter());
  w->path_ = path;
  w->tmp_ = path + ".tmp";
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  int64_t offset = 0;
  for (const Decl& d : tensors) {
    int64_t n = 1;
    for (int64_t x : d.shape) n *= x;
    header[d.name] = {{"dtype", "F32"}, {"shape", d.shape}, {"data_offsets", {offset, offset + 4 * n}}};
    offset += 4 * n;
  }
  w->expected_bytes_ = offset;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  w->fd_ = ::open(w->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  const uint64_t len = text.size();
  absl::Status s = WriteFully(w->fd_, &len, 8, path);
  if (s.ok()) s = WriteFully(w->fd_, text.data(), text.size(), path);
  if (!s.ok()) return s;
  return w;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(tmp_.c_str());
}

absl::Status SafetensorsStreamWriter::Append(const float* data, int64_t count) {
  const int64_t bytes = count * 4;
  if (written_bytes_ + bytes > expected_bytes_) {
    return absl::InternalError(absl::StrCat(path_, ": more data than the header declares"));
  }
  absl::Status s = WriteFully(fd_, data, static_cast<size_t>(bytes), path_);
  if (s.ok()) written_bytes_ += bytes;
  return s;
}

absl::Status SafetensorsStreamWriter::Finish() {
  if (written_bytes_ != expected_bytes_) {
    return absl::InternalError(absl::StrCat(path_, ": wrote ", written_bytes_, " of ", expected_bytes_, " bytes"));
  }
  if (::fsync(fd_) != 0) return absl::DataLossError(absl::StrCat(path_, ": fsync failed"));
  ::close(fd_);
  fd_ = -1;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat(path_, ": rename failed: ", std::strerror(errno)));
  }
  finished_ = true;
  return absl::OkStatus();
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
