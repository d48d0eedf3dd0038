#include "worker/data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace shardline {
namespace {

// Synthetic tokens with learnable structure (mostly an arithmetic pattern,
// sometimes noise) so that a training run visibly lowers the loss.
uint64_t Mix(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return x;
}
constexpr int64_t kSyntheticTokens = int64_t{1} << 22;

}  // namespace

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(const DataConfig& data, int vocab_size,
                                                                 int block_size, uint64_t seed) {
  std::unique_ptr<TokenDataset> ds(new TokenDataset());
  ds->format_ = data.format;
  ds->block_size_ = block_size;
  ds->vocab_size_ = vocab_size;
  ds->seed_ = seed;
  const std::string& path = data.path;
  if (data.format == DataFormat::kSynthetic) {
    ds->num_tokens_ = kSyntheticTokens;
  } else {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open data file: ", std::strerror(errno)));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
    }
    ds->map_bytes_ = static_cast<size_t>(st.st_size);
    if (ds->map_bytes_ > 0) {
      ds->map_ = mmap(nullptr, ds->map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (ds->map_ == MAP_FAILED) {
        ds->map_ = nullptr;
        ::close(fd);
        return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
      }
    }
    ::close(fd);
    if (data.format == DataFormat::kText) {
      ds->u8_ = static_cast<const uint8_t*>(ds->map_);
      ds->num_tokens_ = static_cast<int64_t>(ds->map_bytes_);
      if (vocab_size < 256) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": text data needs vocab_size >= 256, got ", vocab_size));
      }
    } else {
      absl::Status parsed = ds->ParseLlmc(path);
      if (!parsed.ok()) return parsed;
    }
  }
  if (ds->num_tokens_ < int64_t{block_size} + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        data.format == DataFormat::kSynthetic ? "synthetic data" : path, ": ", ds->num_tokens_,
        " tokens is shorter than one sequence (block_size + 1 = ", block_size + 1, ")"));
  }
  return ds;
}

absl::Status TokenDataset::ParseLlmc(const std::string& path) {
  constexpr size_t kHeader = 256 * sizeof(int32_t);
  if (map_bytes_ < kHeader) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated llm.c header (", map_bytes_, " bytes, need ", kHeader, ")"));
  }
  const int32_t* h = static_cast<const int32_t*>(map_);
  if (h[0] != kLlmcMagic && h[0] != kLlmcLlama3Magic) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad magic ", h[0], " (expected ", kLlmcMagic, " or ",
                                                   kLlmcLlama3Magic, "; not an llm.c token file)"));
  }
  const bool wide = h[0] == kLlmcLlama3Magic;
  const int32_t version = wide ? kLlmcLlama3Version : kLlmcVersion;
  if (h[1] != version) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": unsupported llm.c version ", h[1], " (expected ", version, " for magic ", h[0], ")"));
  }
  const int64_t count = h[2];
  const size_t width = wide ? sizeof(uint32_t) : sizeof(uint16_t);
  const size_t need = kHeader + static_cast<size_t>(count) * width;
  if (count < 0 || map_bytes_ < need) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: header promises ", count, " tokens (", need,
                                                   " bytes), file has ", map_bytes_));
  }
  const char* tokens = static_cast<const char*>(map_) + kHeader;
  if (wide) {
    u32_ = reinterpret_cast<const uint32_t*>(tokens);
  } else {
    u16_ = reinterpret_cast<const uint16_t*>(tokens);
  }
  num_tokens_ = count;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = TokenAt(i);
    if (t >= vocab_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": token ", t, " at position ", i, " is >= vocab_size ", vocab_size_));
    }
  }
  return absl::OkStatus();
}

TokenDataset::~TokenDataset() {
  if (map_) munmap(map_, map_bytes_);
}

int64_t TokenDataset::TokenAt(int64_t pos) const {
  switch (format_) {
    case DataFormat::kLlmc: return u16_ ? int64_t{u16_[pos]} : int64_t{u32_[pos]};
    case DataFormat::kText: return u8_[pos];
    case DataFormat::kSynthetic: {
      const uint64_t r = Mix(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(pos));
      if (r % 8 == 0) return static_cast<int64_t>((r >> 8) % vocab_size_);
      return (pos * 7 + (pos / block_size_) * 3) % vocab_size_;
    }
  }
  return 0;
}

void TokenDataset::Batch(int64_t step, int batch_size, int j0, int count, at::Tensor* inputs,
                         at::Tensor* targets) const {
  const int64_t T = block_size_;
  const int64_t n = num_sequences();
  *inputs = at::empty({count, T}, at::kLong);
  *targets = at::empty({count, T}, at::kLong);
  int64_t* x = inputs->data_ptr<int64_t>();
  int64_t* y = targets->data_ptr<int64_t>();
  for (int k = 0; k < count; ++k) {
    const int64_t i = (step * batch_size + j0 + k) % n;
    for (int64_t t = 0; t < T; ++t) {
      x[k * T + t] = TokenAt(i * T + t);
      y[k * T + t] = TokenAt(i * T + t + 1);
    }
  }
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

absl::Status WriteLlmcFile(const std::string& path, const std::vector<uint16_t>& tokens) {
  return WriteLlmc(path, tokens, kLlmcMagic, kLlmcVersion);
}

absl::Status WriteLlmcFile(const std::string& path, const std::vector<uint32_t>& tokens) {
  return WriteLlmc(path, tokens, kLlmcLlama3Magic, kLlmcLlama3Version);
}

}  // namespace shardline
