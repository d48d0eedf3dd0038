#include "common/model/safetensors.h"

#include "common/base/status_macros.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/quoted.h"

namespace shardline {

int SafetensorsElementBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

// A shape or offset of tensor `name`: a JSON integer within int64 (a
// fraction, or a float such as 1e30, is an error, not a rounded or undefined
// conversion).
int64_t Int64Of(const nlohmann::json& v, const std::string& name) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})) {
    throw std::runtime_error(absl::StrCat("tensor ", name, ": shape and data_offsets must hold integers of 64 bits (found ",
                                          v.is_number_unsigned() ? "one past int64" : v.type_name(), ")"));
  }
  return v.get<int64_t>();
}

// Checks one header entry against the data section; errors name the tensor.
absl::Status CheckEntry(const std::string& path, const std::string& name, const SafetensorsEntry& e,
                        int64_t data_bytes) {
  if (e.begin < 0 || e.end < e.begin || e.end > data_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", Shown(name), " lies outside the file"));
  }
  // The element count is checked as it grows, so that it cannot overflow.
  int64_t numel = 1;
  for (int64_t d : e.shape) {
    if (d < 0 || (d > 0 && numel > (int64_t{1} << 56) / d)) {
      return absl::DataLossError(absl::StrCat(path, ": tensor ", Shown(name), " has a bad shape"));
    }
    numel *= d;
  }
  const int bytes = SafetensorsElementBytes(e.dtype);
  if (bytes != 0 && numel * bytes != e.end - e.begin) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", Shown(name), " holds ", e.end - e.begin,
                                            " bytes, its shape and dtype need ", numel * bytes));
  }
  return absl::OkStatus();
}

}  // namespace

float Bf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float F16BitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float f;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    f = std::ldexp(static_cast<float>(mant), -24);
    if (sign) f = -f;
    return f;
  }
  const uint32_t u = sign | (exp == 31 ? (0xffu << 23) | (mant << 13) : ((exp + 112) << 23) | (mant << 13));
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view head, int64_t file_bytes, const std::string& path) {
  uint64_t len = 0;
  if (head.size() < 8 || file_bytes < 8) {
    return absl::DataLossError(absl::StrCat(path, ": not a safetensors file (", file_bytes, " bytes, no header length)"));
  }
  std::memcpy(&len, head.data(), 8);  // little-endian, as every platform we run on
  if (len > static_cast<uint64_t>(file_bytes) - 8 || len > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": not a safetensors file (bad header length)"));
  }
  return len;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view head, int64_t file_bytes,
                                                         const std::string& path) {
  absl::StatusOr<uint64_t> len = SafetensorsHeaderLength(head, file_bytes, path);
  if (!len.ok()) return len.status();
  if (head.size() - 8 < *len) return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  SafetensorsHeader h;
  h.data_start = 8 + static_cast<int64_t>(*len);
  const int64_t data_bytes = file_bytes - h.data_start;
  try {
    const nlohmann::json j = nlohmann::json::parse(head.substr(8, *len));
    if (!j.is_object()) throw std::runtime_error("not a JSON object");
    for (const auto& [name, v] : j.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) throw std::runtime_error("__metadata__ is not an object");
        for (const auto& [k, mv] : v.items()) h.metadata[k] = mv.get<std::string>();
        continue;
      }
      SafetensorsEntry e;
      e.dtype = v.at("dtype").get<std::string>();
      const nlohmann::json& shape = v.at("shape");
      const nlohmann::json& offsets = v.at("data_offsets");
      if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2) {
        throw std::runtime_error(absl::StrCat("tensor ", name, ": shape and data_offsets must be arrays"));
      }
      for (const nlohmann::json& d : shape) e.shape.push_back(Int64Of(d, name));
      e.begin = Int64Of(offsets[0], name);
      e.end = Int64Of(offsets[1], name);
      absl::Status s = CheckEntry(path, name, e, data_bytes);
      if (!s.ok()) return s;
      h.entries[name] = std::move(e);
    }
  } catch (const std::exception& e) {
    // What was thrown may quote the header's bytes: shown escaped, on one line.
    return absl::DataLossError(absl::StrCat(path, ": malformed safetensors header: ", Shown(e.what(), 256)));
  }
  // The tensors tile the data section, in offset order, as the format
  // requires (safetensors' own reader refuses holes too): two tensors sharing
  // bytes would alias each other's values, and bytes no tensor owns are a
  // misplaced offset or another file's data appended. Empty tensors sit
  // between others, at the offset where they fall.
  std::vector<std::tuple<int64_t, int64_t, const std::string*>> ranges;
  for (const auto& [name, e] : h.entries) ranges.emplace_back(e.begin, e.end, &name);
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = 0;
  const std::string* last = nullptr;
  for (const auto& [begin, end, name] : ranges) {
    if (begin < covered) {
      return absl::DataLossError(absl::StrCat(path, ": tensors ", Shown(*last), " and ", Shown(*name), " overlap"));
    }
    if (begin > covered) {
      return absl::DataLossError(absl::StrCat(path, ": bytes [", covered, ", ", begin,
                                              ") of the data section belong to no tensor (a gap before tensor ",
                                              Shown(*name), ")"));
    }
    covered = end;
    last = name;
  }
  if (covered != data_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": bytes [", covered, ", ", data_bytes,
                                            ") of the data section belong to no tensor (past the last one)"));
  }
  return h;
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO named as a weight file must be refused below, not
  // block the open until a writer appears (no effect on a regular file).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  return FromOpenFile(std::move(fd), path);
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::FromOpenFile(UniqueFd fd,
                                                                                  const std::string& path) {
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  r->path_ = path;
  r->fd_ = std::move(fd);
  struct stat st;
  if (fstat(r->fd_.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::string head(8, '\0');
  const ssize_t n = ::pread(r->fd_.get(), head.data(), 8, 0);
  head.resize(n > 0 ? static_cast<size_t>(n) : 0);
  absl::StatusOr<uint64_t> len = SafetensorsHeaderLength(head, st.st_size, path);
  if (!len.ok()) return len.status();
  head.resize(8 + *len);
  SL_RETURN_IF_ERROR(ReadExactlyAt(r->fd_.get(), path, 8, static_cast<int64_t>(*len), head.data() + 8));
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(head, st.st_size, path);
  if (!h.ok()) return h.status();
  r->header_ = *std::move(h);
  r->file_bytes_ = st.st_size;
  return r;
}

absl::StatusOr<std::string> SafetensorsReader::Fingerprint(int blocks) const {
  constexpr int64_t kBlock = 4096;
  std::string out = absl::StrCat(file_bytes_, "\n");
  auto read = [&](int64_t at, int64_t n) -> absl::Status {
    const size_t old = out.size();
    out.resize(old + n);
    return ReadExactlyAt(fd_.get(), path_, at, n, out.data() + old);
  };
  SL_RETURN_IF_ERROR(read(0, header_.data_start));
  const int64_t data = file_bytes_ - header_.data_start;
  const int64_t block = std::min(kBlock, data);
  for (int k = 0; k < blocks && block > 0; ++k) {
    const int64_t at = blocks > 1 ? (data - block) * k / (blocks - 1) : 0;
    SL_RETURN_IF_ERROR(read(header_.data_start + at, block));
  }
  return Sha256Hex(out);
}

absl::Status SafetensorsReader::ReadRaw(const std::string& name, const std::string& dtype, std::string* out) const {
  auto it = header_.entries.find(name);
  if (it == header_.entries.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", Shown(name)));
  const Entry& e = it->second;
  if (e.dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor ", Shown(name), " is ", Shown(e.dtype, 16), " (expected ", dtype, ")"));
  }
  out->resize(static_cast<size_t>(e.end - e.begin));  // (the header was checked against the file's size)
  if (absl::Status s = ReadExactlyAt(fd_.get(), path_, header_.data_start + e.begin, e.end - e.begin, out->data());
      !s.ok()) {
    return absl::DataLossError(absl::StrCat(s.message(), " (tensor ", Shown(name), ")"));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsReader::ReadFloats(const std::string& name, int64_t first, int64_t count, float* dst) const {
  auto it = header_.entries.find(name);
  if (it == header_.entries.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", Shown(name)));
  const Entry& e = it->second;
  if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16") {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor ", Shown(name), " is ", Shown(e.dtype, 16), " (expected F32, BF16 or F16)"));
  }
  const int size = SafetensorsElementBytes(e.dtype);
  if (first < 0 || count < 0 || first + count > e.numel()) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": tensor ", Shown(name), " has no elements [", first, ", ",
                                              first + count, ")"));
  }
  // 16-bit values are read into the upper half of dst and widened in place,
  // front to back (element i's source bytes lie at or after its result's).
  char* out = reinterpret_cast<char*>(dst) + (size == 2 ? count * 2 : 0);
  const int64_t at = header_.data_start + e.begin + first * size;
  if (absl::Status s = ReadExactlyAt(fd_.get(), path_, at, count * size, out); !s.ok()) {
    return absl::DataLossError(absl::StrCat(s.message(), " (tensor ", Shown(name), ")"));
  }
  if (size == 2) {
    const char* src = reinterpret_cast<const char*>(dst) + count * 2;
    const bool bf16 = e.dtype == "BF16";
    for (int64_t i = 0; i < count; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      dst[i] = bf16 ? Bf16BitsToFloat(b) : F16BitsToFloat(b);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::Create(
    const std::string& path, const std::vector<Decl>& tensors, StoredDType dtype) {
  std::unique_ptr<SafetensorsStreamWriter> w(new SafetensorsStreamWriter());
  w->dtype_ = dtype;
  const int size = dtype == StoredDType::kF32 ? 4 : 2;
  std::vector<RawDecl> raw;
  for (const Decl& d : tensors) {
    int64_t n = 1;
    for (int64_t x : d.shape) n *= x;
    raw.push_back({d.name, dtype == StoredDType::kF32 ? "F32" : "BF16", d.shape, size * n});
  }
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  absl::StatusOr<UniqueFd> dir_fd = OpenDirectoryNoFollow(AT_FDCWD, dir, dir);
  if (!dir_fd.ok()) {
    return absl::Status(dir_fd.status().code(), absl::StrCat(path, ": cannot create: ", dir_fd.status().message()));
  }
  w->dir_fd_ = std::move(*dir_fd);
  SL_RETURN_IF_ERROR(w->Start(w->dir_fd_.get(), dir, path.substr(slash + 1), raw, {{"format", "pt"}}));
  return w;
}

absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::CreateAt(
    int dir_fd, const std::string& dir, const std::string& name, const std::vector<RawDecl>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsStreamWriter> w(new SafetensorsStreamWriter());
  SL_RETURN_IF_ERROR(w->Start(dir_fd, dir, name, tensors, metadata));
  return w;
}

absl::Status SafetensorsStreamWriter::Start(int dir_fd, const std::string& dir, const std::string& name,
                                            const std::vector<RawDecl>& tensors,
                                            const std::map<std::string, std::string>& metadata) {
  path_ = dir + "/" + name;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const RawDecl& d : tensors) {
    if (header.contains(d.name)) return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor ", Shown(d.name), " twice"));
    header[d.name] = {{"dtype", d.dtype}, {"shape", d.shape}, {"data_offsets", {offset, offset + d.bytes}}};
    offset += d.bytes;
  }
  expected_bytes_ = offset;
  // A name that is not UTF-8 is written with U+FFFD rather than thrown on.
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  SL_ASSIGN_OR_RETURN(file_, AtomicFileAt::Create(dir_fd, dir, name));
  const uint64_t len = text.size();  // little-endian on every platform we build for
  SL_RETURN_IF_ERROR(WriteFully(file_->fd(), &len, 8, path_));
  return WriteFully(file_->fd(), text.data(), text.size(), path_);
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() = default;  // file_ removes an unfinished temp file

absl::Status SafetensorsStreamWriter::AppendBytes(const void* data, int64_t bytes) {
  if (bytes < 0 || written_bytes_ + bytes > expected_bytes_) {
    return absl::InternalError(absl::StrCat(path_, ": more data than the header declares"));
  }
  SL_RETURN_IF_ERROR(WriteFully(file_->fd(), data, static_cast<size_t>(bytes), path_));
  written_bytes_ += bytes;
  return absl::OkStatus();
}

absl::Status SafetensorsStreamWriter::Append(const float* data, int64_t count) {
  if (dtype_ == StoredDType::kF32) return AppendBytes(data, count * 4);
  std::vector<uint16_t> half(static_cast<size_t>(std::min<int64_t>(count, 1 << 20)));
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min<int64_t>(count - done, static_cast<int64_t>(half.size()));
    for (int64_t i = 0; i < n; ++i) half[i] = FloatToBf16Bits(data[done + i]);
    SL_RETURN_IF_ERROR(AppendBytes(half.data(), n * 2));
    done += n;
  }
  return absl::OkStatus();
}

absl::Status SafetensorsStreamWriter::Finish() {
  if (written_bytes_ != expected_bytes_) {
    return absl::InternalError(absl::StrCat(path_, ": wrote ", written_bytes_, " of ", expected_bytes_, " bytes"));
  }
  return file_->Commit();
}

}  // namespace shardline
