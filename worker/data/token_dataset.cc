#include "worker/data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/job/job_file.h"

namespace shardline {
namespace {

// Synthetic tokens with learnable structure (mostly an arithmetic pattern,
// sometimes noise) so that a training run visibly lowers the loss.
uint64_t Mix(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return x;
}
constexpr int64_t kSyntheticTokens = int64_t{1} << 22;

// A read-only memory map of a whole file; unmapped when destroyed.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    std::unique_ptr<MappedFile> f(new MappedFile());
    f->path_ = path;
    // O_NONBLOCK: a FIFO put where a checked file was must be refused below,
    // not block the open until a writer appears (no effect on a regular file).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open data file: ", std::strerror(errno)));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file (a directory or device)"));
    }
    f->bytes_ = static_cast<size_t>(st.st_size);
    if (f->bytes_ > 0) {
      void* m = mmap(nullptr, f->bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED) {
        ::close(fd);
        return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
      }
      f->data_ = m;
    }
    ::close(fd);
    return f;
  }
  ~MappedFile() {
    if (data_) munmap(data_, bytes_);
  }
  const std::string& path() const { return path_; }
  const char* data() const { return static_cast<const char*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  MappedFile() = default;
  std::string path_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

constexpr size_t kHeaderBytes = kTokenFileHeaderBytes;

// The first bytes of `f` that hold its header (all of a shorter file).
absl::string_view HeadOf(const MappedFile& f) {
  return f.bytes() == 0 ? absl::string_view() : absl::string_view(f.data(), std::min(f.bytes(), kHeaderBytes));
}

// Opens a file of one 0/1 byte per token of `token_path` (`count` tokens):
// a loss mask or document starts. Returns its bytes, mapped in *file.
using HeaderParser = absl::StatusOr<TokenFileHeader> (*)(absl::string_view, int64_t, const std::string&);
absl::StatusOr<const uint8_t*> OpenFlags(const std::string& path, const std::string& token_path, int64_t count,
                                         HeaderParser parse, const char* what, std::unique_ptr<MappedFile>* file) {
  SL_ASSIGN_OR_RETURN(*file, MappedFile::Open(path));
  SL_ASSIGN_OR_RETURN(TokenFileHeader header, parse(HeadOf(**file), (*file)->bytes(), path));
  if (header.count != count) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " of ", header.count, " entries for ",
                                                   token_path, " of ", count, " tokens"));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>((*file)->data() + kHeaderBytes);
  for (int64_t k = 0; k < count; ++k) {
    if (bytes[k] > 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " byte ", int{bytes[k]}, " at position ", k,
                                                     " (expected 0 or 1)"));
    }
  }
  return bytes;
}

}  // namespace

struct TokenDataset::File {
  std::unique_ptr<MappedFile> tokens, mask, docs;
  const uint16_t* u16 = nullptr;  // llmc GPT-2 tokens
  const uint32_t* u32 = nullptr;  // llmc Llama 3 tokens
  const uint8_t* u8 = nullptr;    // text bytes
  const uint8_t* mask_bytes = nullptr;
  const uint8_t* doc_bytes = nullptr;  // 1 where a document starts
  int64_t count = 0;
  int64_t At(int64_t i) const { return u16 ? int64_t{u16[i]} : u32 ? int64_t{u32[i]} : int64_t{u8[i]}; }
};

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(DataFormat format, const TokenSource& source,
                                                                 int vocab_size, int block_size, uint64_t seed) {
  std::unique_ptr<TokenDataset> ds(new TokenDataset());
  ds->format_ = format;
  ds->block_size_ = block_size;
  ds->vocab_size_ = vocab_size;
  ds->seed_ = seed;
  std::string name = "synthetic data";
  if (format == DataFormat::kSynthetic) {
    ds->num_tokens_ = kSyntheticTokens;
  } else {
    SL_ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandDataPaths(source.paths, "", "[data] path"));
    auto one_each = [&](const std::vector<std::string>& patterns,
                        const char* key) -> absl::StatusOr<std::vector<std::string>> {
      if (patterns.empty()) return std::vector<std::string>();
      SL_ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandDataPaths(patterns, "", key));
      if (files.size() != paths.size()) {
        return absl::InvalidArgumentError(absl::StrCat(key, " names ", files.size(), " files for ", paths.size(),
                                                       " token files (one each)"));
      }
      return files;
    };
    SL_ASSIGN_OR_RETURN(const std::vector<std::string> masks, one_each(source.mask_paths, "[data] mask_path"));
    SL_ASSIGN_OR_RETURN(const std::vector<std::string> docs, one_each(source.doc_paths, "[data] doc_path"));
    ds->masked_ = !masks.empty();
    ds->documents_ = !docs.empty();
    name = paths.size() == 1 ? paths[0] : absl::StrCat(paths.size(), " files from ", paths[0]);
    if (format == DataFormat::kText && vocab_size < 256) {
      return absl::InvalidArgumentError(absl::StrCat(paths[0], ": text data needs vocab_size >= 256, got ", vocab_size));
    }
    for (size_t i = 0; i < paths.size(); ++i) {
      auto file = std::make_unique<File>();
      if (format == DataFormat::kText) {
        SL_ASSIGN_OR_RETURN(file->tokens, MappedFile::Open(paths[i]));
        file->u8 = reinterpret_cast<const uint8_t*>(file->tokens->data());
        file->count = static_cast<int64_t>(file->tokens->bytes());
      } else {
        SL_RETURN_IF_ERROR(OpenLlmc(paths[i], vocab_size, file.get()));
      }
      if (ds->masked_) {
        SL_ASSIGN_OR_RETURN(file->mask_bytes,
                            OpenFlags(masks[i], paths[i], file->count, ParseLossMaskHeader, "mask", &file->mask));
      }
      if (ds->documents_) {
        SL_ASSIGN_OR_RETURN(file->doc_bytes, OpenFlags(docs[i], paths[i], file->count, ParseDocStartsHeader,
                                                       "document starts", &file->docs));
      }
      ds->starts_.push_back(ds->num_tokens_);
      ds->num_tokens_ += file->count;
      ds->files_.push_back(std::move(file));
    }
  }
  if (ds->num_tokens_ < int64_t{block_size} + 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", ds->num_tokens_,
                                                   " tokens is shorter than one sequence (block_size + 1 = ",
                                                   block_size + 1, ")"));
  }
  return ds;
}

absl::Status TokenDataset::OpenLlmc(const std::string& path, int vocab_size, File* file) {
  SL_ASSIGN_OR_RETURN(file->tokens, MappedFile::Open(path));
  SL_ASSIGN_OR_RETURN(TokenFileHeader header,
                      ParseLlmcHeader(HeadOf(*file->tokens), file->tokens->bytes(), path));
  const char* tokens = file->tokens->data() + kHeaderBytes;
  if (header.width == sizeof(uint32_t)) {
    file->u32 = reinterpret_cast<const uint32_t*>(tokens);
  } else {
    file->u16 = reinterpret_cast<const uint16_t*>(tokens);
  }
  file->count = header.count;
  for (int64_t i = 0; i < file->count; ++i) {
    const int64_t t = file->At(i);
    if (t >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": token ", t, " at position ", i, " is >= vocab_size ", vocab_size));
    }
  }
  return absl::OkStatus();
}

TokenDataset::~TokenDataset() = default;

const TokenDataset::File& TokenDataset::FileAt(int64_t pos, int64_t* offset) const {
  const size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin()) - 1;
  *offset = pos - starts_[i];
  return *files_[i];
}

int64_t TokenDataset::TokenAt(int64_t pos) const {
  if (format_ == DataFormat::kSynthetic) {
    const uint64_t r = Mix(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(pos));
    if (r % 8 == 0) return static_cast<int64_t>((r >> 8) % vocab_size_);
    return (pos * 7 + (pos / block_size_) * 3) % vocab_size_;
  }
  int64_t offset;
  const File& f = FileAt(pos, &offset);
  return f.At(offset);
}

bool TokenDataset::Counts(int64_t pos) const {
  if (!masked_ && !documents_) return true;
  int64_t offset;
  const File& f = FileAt(pos, &offset);
  // A document's first token is no target of the one before it, which
  // ended another document.
  return (!masked_ || f.mask_bytes[offset] != 0) && (!documents_ || f.doc_bytes[offset] == 0);
}

bool TokenDataset::DocumentStarts(int64_t pos) const {
  if (!documents_) return false;
  int64_t offset;
  const File& f = FileAt(pos, &offset);
  return f.doc_bytes[offset] != 0;
}

int64_t TokenDataset::SequenceOf(int64_t step, int batch_size, int64_t j) const {
  return (step * batch_size + j) % num_sequences();
}

void TokenDataset::Batch(int64_t step, int batch_size, int j0, int count, at::Tensor* inputs, at::Tensor* targets,
                         at::Tensor* positions) const {
  const int64_t T = block_size_;
  *inputs = at::empty({count, T}, at::kLong);
  *targets = at::empty({count, T}, at::kLong);
  int64_t* x = inputs->data_ptr<int64_t>();
  int64_t* y = targets->data_ptr<int64_t>();
  int64_t* p = nullptr;
  if (positions) {
    *positions = documents_ ? at::empty({count, T}, at::kLong) : at::Tensor();
    if (documents_) p = positions->data_ptr<int64_t>();
  }
  for (int k = 0; k < count; ++k) {
    const int64_t i = SequenceOf(step, batch_size, j0 + k);
    for (int64_t t = 0; t < T; ++t) {
      x[k * T + t] = TokenAt(i * T + t);
      y[k * T + t] = Counts(i * T + t + 1) ? TokenAt(i * T + t + 1) : kIgnoreTarget;
      // A sequence starts a document's positions afresh, like each document.
      if (p) p[k * T + t] = (t == 0 || DocumentStarts(i * T + t)) ? 0 : p[k * T + t - 1] + 1;
    }
  }
}

int64_t TokenDataset::CountedTargets(int64_t step, int batch_size) const {
  const int64_t T = block_size_;
  if (!masked_ && !documents_) return batch_size * T;
  int64_t n = 0;
  for (int64_t j = 0; j < batch_size; ++j) {
    const int64_t i = SequenceOf(step, batch_size, j);
    for (int64_t t = 0; t < T; ++t) n += Counts(i * T + t + 1);
  }
  return n;
}

namespace {
template <typename Token>
absl::Status WriteLlmc(const std::string& path, const std::vector<Token>& tokens, int32_t magic, int32_t version) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  int32_t header[256] = {0};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * sizeof(Token)));
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}
}  // namespace

absl::Status WriteLossMaskFile(const std::string& path, const std::vector<uint8_t>& mask) {
  return WriteLlmc(path, mask, kLossMaskMagic, kLossMaskVersion);
}

absl::Status WriteLlmcFile(const std::string& path, const std::vector<uint16_t>& tokens) {
  return WriteLlmc(path, tokens, kLlmcMagic, kLlmcVersion);
}

absl::Status WriteLlmcFile(const std::string& path, const std::vector<uint32_t>& tokens) {
  return WriteLlmc(path, tokens, kLlmcLlama3Magic, kLlmcLlama3Version);
}

}  // namespace shardline
