#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "absl/strings/string_view.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace shardline {

absl::Status WriteFully(int fd, const void* data, size_t n, const std::string& path) {
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

namespace {
absl::Status SyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return absl::DataLossError(absl::StrCat(path, ": cannot open to sync: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::DataLossError(absl::StrCat(path, ": fsync failed: ", std::strerror(errno)));
  return absl::OkStatus();
}
}  // namespace

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);  // not world-readable
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot write: ", std::strerror(errno)));
  absl::Status s = WriteFully(fd, text.data(), text.size(), tmp);
  if (s.ok() && ::fsync(fd) != 0) s = absl::DataLossError(absl::StrCat(tmp, ": fsync failed: ", std::strerror(errno)));
  ::close(fd);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::DataLossError(absl::StrCat(path, ": rename failed: ", std::strerror(errno)));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  return SyncPath(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
}

namespace {

// A token file's text, once its permissions and size pass.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read token file: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": token file is not a regular file"));
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s: permissions %04o are too open; a token file must be readable by its owner only (chmod 600)", path,
        st.st_mode & 07777));
  }
  if (st.st_size > 4096) return absl::InvalidArgumentError(absl::StrCat(path, ": token file is larger than 4 KiB"));
  return ReadFileToString(path, "token file");
}

// One line of a token file as a token: trimmed, visible ASCII.
absl::StatusOr<std::string> TokenOfLine(const std::string& path, absl::string_view line, int number) {
  const std::string token(absl::StripAsciiWhitespace(line));
  for (char ch : token) {
    if (ch < 0x21 || ch > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", number, ": the token holds a character that is not visible ASCII (not shown)"));
    }
  }
  return token;
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSecretFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::string> token = TokenOfLine(path, absl::string_view(*text).substr(0, text->find('\n')), 1);
  if (token.ok() && token->empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": token file is empty"));
  return token;
}

absl::StatusOr<std::vector<std::string>> ReadAcceptedTokens(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSecretFile(path);
  if (!text.ok()) return text.status();
  std::vector<std::string> tokens;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++number;
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "#")) continue;
    absl::StatusOr<std::string> token = TokenOfLine(path, line, number);
    if (!token.ok()) return token.status();
    if (token->empty()) continue;
    if (tokens.size() == kMaxAcceptedTokens) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": more than ", kMaxAcceptedTokens, " tokens"));
    }
    tokens.push_back(*std::move(token));
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": token file holds no token"));
  return tokens;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read ", what));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace shardline
