#include "common/data/token_count.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/data/token_file_header.h"

namespace shardline {
namespace {

// The file's size and its first kTokenFileHeaderBytes (fewer if shorter).
absl::Status ReadHead(const std::string& path, int64_t* size, std::string* head) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st;
  absl::Status s;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    s = absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  } else {
    *size = st.st_size;
    head->resize(static_cast<size_t>(std::min<int64_t>(st.st_size, kTokenFileHeaderBytes)));
    size_t got = 0;
    while (got < head->size()) {
      const ssize_t n = pread(fd, head->data() + got, head->size() - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        s = absl::DataLossError(absl::StrCat(path, ": cannot read its header: ", n < 0 ? std::strerror(errno) : "EOF"));
        break;
      }
      got += static_cast<size_t>(n);
    }
  }
  close(fd);
  return s;
}

}  // namespace

absl::StatusOr<int64_t> CountTokens(DataFormat format, const std::vector<std::string>& files) {
  if (format == DataFormat::kSynthetic) {
    return absl::InvalidArgumentError("synthetic data is an endless stream: it has no size");
  }
  int64_t total = 0;
  for (const std::string& path : files) {
    int64_t size = 0;
    std::string head;
    if (absl::Status s = ReadHead(path, &size, &head); !s.ok()) return s;
    if (format == DataFormat::kText) {
      total += size;
      continue;
    }
    absl::StatusOr<TokenFileHeader> h = ParseLlmcHeader(head, size, path);
    if (!h.ok()) return h.status();
    total += h->count;
  }
  return total;
}

}  // namespace shardline
