#include "common/checkpoint/torch_saved_tensor.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include <zlib.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/little_endian.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/pickle_reader.h"
#include "common/checkpoint/pickle_writer.h"
#include "common/model/safetensors.h"

namespace shardline {
namespace {

// What data.pkl and the directory may be: a tensor's pickle is ~200 bytes,
// torch.save's archive has 7 entries.
constexpr int64_t kMaxPickleBytes = int64_t{1} << 20;
constexpr int64_t kMaxDirectoryBytes = int64_t{1} << 20;
constexpr uint32_t kUnset32 = 0xffffffffu;

uint64_t Le(const char* p, int n) {
  uint64_t v = 0;
  for (int k = 0; k < n; ++k) v |= uint64_t{static_cast<uint8_t>(p[k])} << (8 * k);
  return v;
}

struct ZipEntry {
  int64_t local_offset = 0, size = 0;  // within the archive
};

// The archive at [base, base + length) of a file: its entries by name.
class StoredZip {
 public:
  StoredZip(int fd, std::string path, int64_t base, int64_t length)
      : fd_(fd), path_(std::move(path)), base_(base), length_(length) {}

  absl::Status ReadDirectory() {
    // The end record: 22 bytes and a comment of at most 64 KiB.
    const int64_t tail_n = std::min<int64_t>(length_, 22 + 65535);
    std::string tail(static_cast<size_t>(tail_n), '\0');
    SL_RETURN_IF_ERROR(Pread(length_ - tail_n, tail_n, tail.data()));
    int64_t eocd = -1;
    for (int64_t i = tail_n - 22; i >= 0; --i) {
      if (Le(tail.data() + i, 4) == 0x06054b50) {
        eocd = i;
        break;
      }
    }
    if (eocd < 0) return Bad("no zip end record (not an archive torch.save wrote)");
    const char* e = tail.data() + eocd;
    uint64_t entries = Le(e + 10, 2), dir_size = Le(e + 12, 4), dir_offset = Le(e + 16, 4);
    if (entries == 0xffff || dir_size == kUnset32 || dir_offset == kUnset32) {
      // Zip64: the locator just before the end record names the zip64 end record.
      if (eocd < 20 || Le(e - 20, 4) != 0x07064b50) return Bad("zip64 end record without its locator");
      const int64_t at = static_cast<int64_t>(Le(e - 20 + 8, 8));
      char r[56];
      if (at < 0 || at > length_ - 56) return Bad("zip64 end record outside the archive");
      SL_RETURN_IF_ERROR(Pread(at, 56, r));
      if (Le(r, 4) != 0x06064b50) return Bad("bad zip64 end record");
      entries = Le(r + 32, 8);
      dir_size = Le(r + 40, 8);
      dir_offset = Le(r + 48, 8);
    }
    if (dir_size > static_cast<uint64_t>(std::min(kMaxDirectoryBytes, length_)) ||
        dir_offset > static_cast<uint64_t>(length_) - dir_size || entries > dir_size / 46) {
      return Bad("zip directory outside the archive or too large");
    }
    std::string dir(static_cast<size_t>(dir_size), '\0');
    SL_RETURN_IF_ERROR(Pread(static_cast<int64_t>(dir_offset), static_cast<int64_t>(dir_size), dir.data()));
    size_t p = 0;
    for (uint64_t k = 0; k < entries; ++k) SL_RETURN_IF_ERROR(ReadEntry(dir, &p));
    return absl::OkStatus();
  }

  // The data of entry `name`: its offset in the file and its size.
  absl::StatusOr<ZipEntry> Data(const std::string& name) {
    auto it = entries_.find(name);
    if (it == entries_.end()) return Bad(absl::StrCat("no entry ", Shown(name, 128)));
    char h[30];
    // (Names come from the file: shown escaped.)
    if (it->second.local_offset > length_ - 30) {
      return Bad(absl::StrCat("entry ", Shown(name, 128), " outside the archive"));
    }
    SL_RETURN_IF_ERROR(Pread(it->second.local_offset, 30, h));
    if (Le(h, 4) != 0x04034b50) return Bad(absl::StrCat("entry ", Shown(name, 128), ": bad local header"));
    const int64_t start = it->second.local_offset + 30 + static_cast<int64_t>(Le(h + 26, 2) + Le(h + 28, 2));
    if (start > length_ || it->second.size > length_ - start) {
      return Bad(absl::StrCat("entry ", Shown(name, 128), " runs past the archive"));
    }
    return ZipEntry{base_ + start, it->second.size};
  }

  const std::map<std::string, ZipEntry>& entries() const { return entries_; }

  absl::Status Bad(const std::string& what) const {
    return absl::DataLossError(absl::StrCat(path_, " bytes [", base_, ", ", base_ + length_, "): ", what));
  }

 private:
  absl::Status Pread(int64_t at, int64_t n, char* dst) const { return ReadExactlyAt(fd_, path_, base_ + at, n, dst); }

  absl::Status ReadEntry(const std::string& dir, size_t* p) {
    if (dir.size() - *p < 46 || Le(dir.data() + *p, 4) != 0x02014b50) return Bad("bad zip directory entry");
    const char* c = dir.data() + *p;
    const uint64_t method = Le(c + 10, 2), name_n = Le(c + 28, 2), extra_n = Le(c + 30, 2), comment_n = Le(c + 32, 2);
    uint64_t csize = Le(c + 20, 4), usize = Le(c + 24, 4), local = Le(c + 42, 4);
    if (dir.size() - *p - 46 < name_n + extra_n + comment_n) return Bad("bad zip directory entry");
    const std::string name(c + 46, name_n);
    // Zip64's extra field holds, in this order, each of the three that is unset above.
    // (Offsets within the field, never pointers past it.)
    const char* extra = c + 46 + name_n;
    for (uint64_t x = 0; x + 4 <= extra_n;) {
      const uint64_t id = Le(extra + x, 2), n = Le(extra + x + 2, 2);
      const uint64_t end = std::min<uint64_t>(x + 4 + n, extra_n);
      uint64_t v = x + 4;
      if (id == 1) {
        for (uint64_t* f : {&usize, &csize, &local}) {
          if (*f != kUnset32) continue;
          if (v + 8 > end) return Bad(absl::StrCat("entry ", Shown(name, 128), ": short zip64 field"));
          *f = Le(extra + v, 8);
          v += 8;
        }
      }
      x += 4 + n;
    }
    if (method != 0 || csize != usize) return Bad(absl::StrCat("entry ", Shown(name, 128), " is compressed"));
    if (local > static_cast<uint64_t>(length_) || usize > static_cast<uint64_t>(length_)) {
      return Bad(absl::StrCat("entry ", Shown(name, 128), " outside the archive"));
    }
    entries_[name] = ZipEntry{static_cast<int64_t>(local), static_cast<int64_t>(usize)};
    *p += 46 + name_n + extra_n + comment_n;
    return absl::OkStatus();
  }

  int fd_;
  std::string path_;
  int64_t base_, length_;
  std::map<std::string, ZipEntry> entries_;
};

// The storage classes torch.save names, by the dtype they hold.
struct StorageType {
  const char* global;
  const char* dtype;
  int bytes;
};
constexpr StorageType kStorageTypes[] = {{"torch.FloatStorage", "float32", 4},
                                         {"torch.BFloat16Storage", "bfloat16", 2},
                                         {"torch.HalfStorage", "float16", 2},
                                         {"torch.DoubleStorage", "float64", 8},
                                         {"torch.IntStorage", "int32", 4},
                                         {"torch.LongStorage", "int64", 8}};

// A tuple of non-negative ints (a size or a stride).
bool IntTuple(const PickleValue* v, std::vector<int64_t>* out) {
  if (!v || !v->Is(PickleValue::Kind::kTuple)) return false;
  out->clear();
  for (const PickleValue* x : v->items) {
    if (!x->Is(PickleValue::Kind::kInt) || x->i < 0) return false;
    out->push_back(x->i);
  }
  return true;
}

}  // namespace

namespace {

// An archive's directory and its data.pkl, read as data.
struct OpenedArchive {
  std::unique_ptr<StoredZip> zip;
  std::string top;  // the folder its entries share ("archive")
  std::unique_ptr<PickleReader> reader;
  const PickleValue* root = nullptr;
};

absl::StatusOr<OpenedArchive> OpenArchive(int fd, const std::string& path, int64_t offset, int64_t length) {
  if (offset < 0 || length < 22) {
    return absl::DataLossError(absl::StrCat(path, ": chunk at byte ", offset, " of ", length, " bytes: not an archive"));
  }
  // The range lies in the file: every offset below stays inside it (and
  // inside int64).
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::DataLossError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  if (offset > st.st_size || length > st.st_size - offset) {
    return absl::DataLossError(absl::StrCat(path, ": bytes [", offset, ", +", length, ") run past its end (",
                                            st.st_size, " bytes): a short file"));
  }
  OpenedArchive a;
  a.zip = std::make_unique<StoredZip>(fd, path, offset, length);
  StoredZip& zip = *a.zip;
  SL_RETURN_IF_ERROR(zip.ReadDirectory());
  for (const auto& [name, e] : zip.entries()) {
    if (absl::EndsWith(name, "/data.pkl")) a.top = name.substr(0, name.size() - 9);
  }
  if (a.top.empty()) return zip.Bad("no data.pkl");
  SL_ASSIGN_OR_RETURN(ZipEntry pkl, zip.Data(a.top + "/data.pkl"));
  if (pkl.size > kMaxPickleBytes) return zip.Bad("data.pkl too large for a tensor");
  std::string pickle(static_cast<size_t>(pkl.size), '\0');
  SL_RETURN_IF_ERROR(ReadExactlyAt(fd, path, pkl.local_offset, pkl.size, pickle.data()));
  if (zip.entries().count(a.top + "/byteorder")) {
    SL_ASSIGN_OR_RETURN(ZipEntry order, zip.Data(a.top + "/byteorder"));
    char text[8] = {};
    if (order.size > 6) return zip.Bad("byteorder is neither little nor big");
    SL_RETURN_IF_ERROR(ReadExactlyAt(fd, path, order.local_offset, order.size, text));
    if (std::string(text) != "little") return zip.Bad(absl::StrCat("byte order ", Shown(text, 8), " (only little)"));
  }
  std::set<std::string> allowed = {"torch._utils._rebuild_tensor_v2", "collections.OrderedDict"};
  for (const StorageType& s : kStorageTypes) allowed.insert(s.global);
  a.reader = std::make_unique<PickleReader>(std::move(allowed), /*persistent_ids=*/true);
  SL_ASSIGN_OR_RETURN(a.root, a.reader->Read(pickle, absl::StrCat(path, " bytes [", offset, ", ", offset + length,
                                                                   ") data.pkl")));
  return a;
}

absl::StatusOr<TorchSavedTensor> TensorOf(int fd, const std::string& path, const OpenedArchive& a) {
  const StoredZip& zip = *a.zip;
  const PickleValue* v = a.root;
  const std::string& top = a.top;
  using Kind = PickleValue::Kind;
  if (!v->IsObject("torch._utils._rebuild_tensor_v2") || v->items.size() < 4) {
    return zip.Bad("data.pkl is not one tensor (torch._utils._rebuild_tensor_v2)");
  }
  const PickleValue* pid = v->items[0];
  const PickleValue* id = pid->Is(Kind::kPersistentId) ? pid->items[0] : nullptr;
  // ('storage', <StorageType>, key, location, numel)
  if (!id || !id->Is(Kind::kTuple) || id->items.size() != 5 || !id->items[0]->Is(Kind::kString) ||
      id->items[0]->s != "storage" || !id->items[1]->Is(Kind::kGlobal) || !id->items[2]->Is(Kind::kString) ||
      !id->items[4]->Is(Kind::kInt) || id->items[4]->i < 0) {
    return zip.Bad("data.pkl: the storage is not ('storage', type, key, location, numel)");
  }
  TorchSavedTensor t;
  for (const StorageType& s : kStorageTypes) {
    if (id->items[1]->s == s.global) {
      t.dtype = s.dtype;
      t.element_bytes = s.bytes;
    }
  }
  if (t.dtype.empty()) return zip.Bad(absl::StrCat("storage type ", Shown(id->items[1]->s, 64), " is not a tensor's"));
  std::vector<int64_t> stride;
  if (!v->items[1]->Is(Kind::kInt) || v->items[1]->i < 0 || !IntTuple(v->items[2], &t.shape) ||
      !IntTuple(v->items[3], &stride) || stride.size() != t.shape.size()) {
    return zip.Bad("data.pkl: storage offset, size or stride malformed");
  }
  // Row-major contiguous: each stride is the product of the sizes after it,
  // a size 0 counting as 1 there as torch counts it (a dimension of size 1
  // may have any stride).
  int64_t expect = 1, numel = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] > 1 && stride[d] != expect) return zip.Bad("a tensor that is not row-major contiguous");
    if (t.shape[d] > 1 && expect > (int64_t{1} << 50) / t.shape[d]) return zip.Bad("a tensor too large");
    expect *= std::max<int64_t>(t.shape[d], 1);
    numel *= t.shape[d];
  }
  t.numel = numel;
  const int64_t storage_offset = v->items[1]->i, storage_numel = id->items[4]->i;
  SL_ASSIGN_OR_RETURN(ZipEntry data, a.zip->Data(absl::StrCat(top, "/data/", id->items[2]->s)));
  if (storage_numel > data.size / t.element_bytes || storage_offset > storage_numel ||
      t.numel > storage_numel - storage_offset) {
    return zip.Bad(absl::StrCat("storage of ", data.size, " bytes too short for ", t.numel, " elements at ",
                                storage_offset));
  }
  t.data_offset = data.local_offset + storage_offset * t.element_bytes;
  return t;
}

}  // namespace

absl::StatusOr<TorchSavedTensor> ReadTorchSavedTensor(int fd, const std::string& path, int64_t offset,
                                                      int64_t length) {
  SL_ASSIGN_OR_RETURN(OpenedArchive a, OpenArchive(fd, path, offset, length));
  return TensorOf(fd, path, a);
}

absl::StatusOr<int64_t> ReadTorchSavedInt(int fd, const std::string& path, int64_t offset, int64_t length) {
  SL_ASSIGN_OR_RETURN(OpenedArchive a, OpenArchive(fd, path, offset, length));
  if (a.root->Is(PickleValue::Kind::kInt)) return a.root->i;
  SL_ASSIGN_OR_RETURN(TorchSavedTensor t, TensorOf(fd, path, a));
  if (t.numel != 1) return a.zip->Bad(absl::StrCat("a tensor of ", t.numel, " elements, not one int"));
  char raw[8] = {};
  SL_RETURN_IF_ERROR(ReadExactlyAt(fd, path, t.data_offset, t.element_bytes, raw));
  if (t.dtype == "int32" || t.dtype == "int64") {
    const int64_t v = static_cast<int64_t>(Le(raw, t.element_bytes));
    return t.dtype == "int32" ? static_cast<int64_t>(static_cast<int32_t>(v)) : v;
  }
  // A float step, read at its own width (a float64 is never narrowed first).
  double f = 0;
  if (t.dtype == "float64") {
    std::memcpy(&f, raw, 8);
  } else if (t.dtype == "float32") {
    float g;
    std::memcpy(&g, raw, 4);
    f = g;
  } else {
    const auto bits = static_cast<uint16_t>(Le(raw, 2));
    f = t.dtype == "bfloat16" ? Bf16BitsToFloat(bits) : F16BitsToFloat(bits);
  }
  if (!(f >= 0 && f <= 1099511627776.0) || f != std::floor(f)) {  // [0, 2^40], whole
    return a.zip->Bad(absl::StrCat("holds ", f, ", not a step"));
  }
  return static_cast<int64_t>(f);
}

absl::Status ReadTorchSavedFloats(int fd, const std::string& path, const TorchSavedTensor& t, int64_t first,
                                  int64_t count, float* dst) {
  if (t.dtype == "int32" || t.dtype == "int64") {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a tensor of ", t.dtype, ", not floats"));
  }
  if (first < 0 || count < 0 || first > t.numel - count) {
    return absl::OutOfRangeError(absl::StrCat(path, ": elements [", first, ", ", first + count, ") of a tensor of ",
                                              t.numel));
  }
  constexpr int64_t kPiece = int64_t{1} << 20;  // elements per read
  std::vector<char> raw(static_cast<size_t>(std::min(count, kPiece) * t.element_bytes));
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(kPiece, count - done);
    SL_RETURN_IF_ERROR(
        ReadExactlyAt(fd, path, t.data_offset + (first + done) * t.element_bytes, n * t.element_bytes, raw.data()));
    for (int64_t i = 0; i < n; ++i) {
      const char* p = raw.data() + i * t.element_bytes;
      if (t.element_bytes == 4) {
        std::memcpy(&dst[done + i], p, 4);
      } else if (t.element_bytes == 8) {
        double d;
        std::memcpy(&d, p, 8);
        dst[done + i] = static_cast<float>(d);
      } else {
        const auto bits = static_cast<uint16_t>(Le(p, 2));
        dst[done + i] = t.dtype == "bfloat16" ? Bf16BitsToFloat(bits) : F16BitsToFloat(bits);
      }
    }
    done += n;
  }
  return absl::OkStatus();
}

namespace {

// A zip archive of stored entries, built in memory in the layout torch.save
// uses: local headers padded (extra field "FB") so each entry's data starts
// at a multiple of 64 bytes, then the central directory and the end record.
class StoredZipWriter {
 public:
  void Add(const std::string& name, absl::string_view data) {
    const uint32_t crc = static_cast<uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
    const size_t header_end = out_.size() + 30 + name.size();
    size_t pad = (64 - (header_end + 4) % 64) % 64;  // the extra field's own 4 bytes, then padding
    const size_t local = out_.size();
    AppendLittleEndian(&out_, 0x04034b50, 4);
    AppendLittleEndian(&out_, 20, 2);  // version needed: 2.0
    AppendLittleEndian(&out_, 0, 2);   // flags
    AppendLittleEndian(&out_, 0, 2);   // stored
    AppendLittleEndian(&out_, 0, 4);   // time, date
    AppendLittleEndian(&out_, crc, 4);
    AppendLittleEndian(&out_, data.size(), 4);
    AppendLittleEndian(&out_, data.size(), 4);
    AppendLittleEndian(&out_, name.size(), 2);
    AppendLittleEndian(&out_, 4 + pad, 2);
    out_ += name;
    AppendLittleEndian(&out_, 0x4246, 2);  // "FB": torch's padding field
    AppendLittleEndian(&out_, pad, 2);
    out_.append(pad, '\0');
    out_.append(data.data(), data.size());
    AppendLittleEndian(&directory_, 0x02014b50, 4);
    AppendLittleEndian(&directory_, 20, 2);  // made by
    AppendLittleEndian(&directory_, 20, 2);  // needed
    AppendLittleEndian(&directory_, 0, 2);
    AppendLittleEndian(&directory_, 0, 2);
    AppendLittleEndian(&directory_, 0, 4);
    AppendLittleEndian(&directory_, crc, 4);
    AppendLittleEndian(&directory_, data.size(), 4);
    AppendLittleEndian(&directory_, data.size(), 4);
    AppendLittleEndian(&directory_, name.size(), 2);
    AppendLittleEndian(&directory_, 0, 2);   // extra
    AppendLittleEndian(&directory_, 0, 2);   // comment
    AppendLittleEndian(&directory_, 0, 2);   // disk
    AppendLittleEndian(&directory_, 0, 2);   // internal attributes
    AppendLittleEndian(&directory_, 0, 4);   // external attributes
    AppendLittleEndian(&directory_, local, 4);
    directory_ += name;
    ++entries_;
  }

  std::string Finish() {
    const size_t at = out_.size();
    out_ += directory_;
    AppendLittleEndian(&out_, 0x06054b50, 4);
    AppendLittleEndian(&out_, 0, 4);  // disk numbers
    AppendLittleEndian(&out_, entries_, 2);
    AppendLittleEndian(&out_, entries_, 2);
    AppendLittleEndian(&out_, directory_.size(), 4);
    AppendLittleEndian(&out_, at, 4);
    AppendLittleEndian(&out_, 0, 2);  // comment
    return std::move(out_);
  }

 private:
  std::string out_, directory_;
  int entries_ = 0;
};

// The archive around `data_pkl` (and the tensor data, where given), with the
// records torch.save writes beside them.
std::string TorchSaveArchive(const std::string& data_pkl, bool has_data, absl::string_view data) {
  StoredZipWriter zip;
  zip.Add("archive/data.pkl", data_pkl);
  zip.Add("archive/.format_version", "1");
  zip.Add("archive/.storage_alignment", "64");
  zip.Add("archive/byteorder", "little");
  if (has_data) zip.Add("archive/data/0", data);
  zip.Add("archive/version", "3\n");
  return zip.Finish();
}

}  // namespace

absl::StatusOr<std::string> TorchSaveFloatTensor(const std::vector<int64_t>& shape, const float* values, bool bf16) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && numel > kMaxTorchSaveBytes / (bf16 ? 2 : 4) / d)) {
      return absl::InvalidArgumentError(absl::StrCat("a tensor chunk over ", kMaxTorchSaveBytes, " bytes"));
    }
    numel *= d;
  }
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) stride[d - 1] = stride[d] * std::max<int64_t>(shape[d], 1);
  PickleWriter p;
  p.Global("torch._utils", "_rebuild_tensor_v2").Mark();
  p.Mark().String("storage").Global("torch", bf16 ? "BFloat16Storage" : "FloatStorage").String("0").String("cpu");
  p.Int(numel).Tuple();
  p.PersistentId().Int(0).IntTuple(shape.data(), shape.size()).IntTuple(stride.data(), stride.size()).Bool(false);
  p.Global("collections", "OrderedDict").EmptyTuple().Reduce();
  p.Tuple().Reduce();
  if (!bf16) {
    return TorchSaveArchive(p.Finish(), true, absl::string_view(reinterpret_cast<const char*>(values), numel * 4));
  }
  std::string halves;  // little-endian, as the archive's byteorder says
  halves.reserve(static_cast<size_t>(numel) * 2);
  for (int64_t i = 0; i < numel; ++i) AppendLittleEndian(&halves, FloatToBf16Bits(values[i]), 2);
  return TorchSaveArchive(p.Finish(), true, halves);
}

std::string TorchSaveValue(const std::string& data_pkl) { return TorchSaveArchive(data_pkl, false, {}); }

}  // namespace shardline
