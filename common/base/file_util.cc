#include "common/base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include <openssl/evp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"

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

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) (void)::close(fd_);  // see the class comment
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) (void)::close(fd_);  // see the class comment
}

int UniqueFd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::filesystem::path p(path);
  const std::string name = p.filename().string();
  std::string dir = p.parent_path().string();
  if (dir.empty()) dir = ".";
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a file name to write"));
  }
  SL_ASSIGN_OR_RETURN(UniqueFd dir_fd, OpenDirectoryNoFollow(AT_FDCWD, dir, dir));
  return WriteFileAtomicallyAt(dir_fd.get(), dir, name, text);
}

absl::StatusOr<std::unique_ptr<AtomicFileAt>> AtomicFileAt::Create(int dir_fd, const std::string& dir,
                                                                    const std::string& name) {
  std::unique_ptr<AtomicFileAt> f(new AtomicFileAt(dir_fd, dir, name));
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(f->path_, ": not a plain file name"));
  }
  const std::string tmp_name = name + ".tmp", tmp = f->path_ + ".tmp";
  // unlinkat removes a symlink itself, never its target.
  if (::unlinkat(dir_fd, tmp_name.c_str(), 0) != 0 && errno != ENOENT) {
    return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot remove the old temp file: ", std::strerror(errno)));
  }
  f->fd_ = UniqueFd(::openat(dir_fd, tmp_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                             0640));  // not world-readable
  if (f->fd_.get() < 0) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot write: ", std::strerror(errno)));
  return f;
}

AtomicFileAt::~AtomicFileAt() {
  if (committed_) return;
  fd_ = UniqueFd();
  // Best effort: a leftover temp file is removed by the next write of the name.
  (void)::unlinkat(dir_fd_, (name_ + ".tmp").c_str(), 0);
}

absl::Status AtomicFileAt::Commit() {
  const std::string tmp_name = name_ + ".tmp", tmp = path_ + ".tmp";
  if (::fsync(fd_.get()) != 0) return absl::DataLossError(absl::StrCat(tmp, ": fsync failed: ", std::strerror(errno)));
  if (::close(fd_.release()) != 0) {
    return absl::DataLossError(absl::StrCat(tmp, ": close failed: ", std::strerror(errno)));
  }
  if (::renameat(dir_fd_, tmp_name.c_str(), dir_fd_, name_.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat(path_, ": rename failed: ", std::strerror(errno)));
  }
  committed_ = true;
  if (::fsync(dir_fd_) != 0) return absl::DataLossError(absl::StrCat(dir_, ": fsync failed: ", std::strerror(errno)));
  return absl::OkStatus();
}

absl::Status WriteFileAtomicallyAt(int dir_fd, const std::string& dir, const std::string& name,
                                   const std::string& text) {
  SL_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileAt> f, AtomicFileAt::Create(dir_fd, dir, name));
  SL_RETURN_IF_ERROR(WriteFully(f->fd(), text.data(), text.size(), f->path() + ".tmp"));
  return f->Commit();
}

absl::StatusOr<std::string> RealPath(const std::string& path, const char* what) {
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(what, " ", Shown(path, 256), ": ", ec.message()));
  return real.string();
}

absl::Status CheckIsRealPath(const std::string& path, const char* what) {
  SL_ASSIGN_OR_RETURN(const std::string real, RealPath(path, what));
  if (real == path) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " ", Shown(path, 256), " now leads to ", Shown(real, 256),
                                                    ": a link in it changed since it was checked; refused"));
}

absl::StatusOr<UniqueFd> OpenDirectoryNoFollow(int at, const std::string& name, const std::string& path) {
  UniqueFd fd(::openat(at, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() >= 0) return fd;
  const int err = errno;
  struct stat st;
  if (::fstatat(at, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": is a symlink: refused (not followed)"));
  }
  return absl::NotFoundError(absl::StrCat(path, ": cannot open directory: ", std::strerror(err)));
}

absl::StatusOr<UniqueFd> OpenRegularFileNoFollow(const std::string& path) {
  // O_NONBLOCK: a FIFO planted under the name must not block the reader.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    struct stat st;
    if (err == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return absl::PermissionDeniedError(
          absl::StrCat(path, ": is a symlink: refused (a checkpoint's files lie in its own directory)"));
    }
    const std::string why = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(why);
    if (err == EACCES || err == EPERM || err == ELOOP) return absl::PermissionDeniedError(why);
    return absl::InternalError(why);  // out of descriptors, EIO: perhaps not for good
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  return fd;
}

absl::Status ReadExactlyAt(int fd, const std::string& path, int64_t at, int64_t n, char* dst) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 26)), at);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return absl::DataLossError(absl::StrCat(path, ": read at byte ", at, ": ", std::strerror(errno)));
    if (got == 0) return absl::DataLossError(absl::StrCat(path, ": short file: no byte ", at));
    dst += got;
    at += got;
    n -= got;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadOpenFileToString(int fd, const std::string& path, int64_t max_bytes) {
  const auto too_large = [&] {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than ", max_bytes, " bytes: refused"));
  };
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > max_bytes) return too_large();  // sparse or not: never read
  std::string out;
  char buf[64 << 10];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > max_bytes) return too_large();
    at += n;
  }
}

absl::StatusOr<std::string> Sha256OfOpenFile(int fd, const std::string& path) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError(absl::StrCat(path, ": cannot start SHA-256"));
  }
  std::vector<char> buf(4 << 20);
  off_t at = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
    if (n == 0) break;
    if (EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n)) != 1) {
      return absl::InternalError(absl::StrCat(path, ": SHA-256 failed"));
    }
    at += n;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) return absl::InternalError(absl::StrCat(path, ": SHA-256 failed"));
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", md[i]);
  return hex;
}

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1) return "";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", md[i]);
  return hex;
}

absl::StatusOr<std::string> Sha256OfFileNoFollow(const std::string& path) {
  absl::StatusOr<UniqueFd> fd = OpenRegularFileNoFollow(path);
  if (!fd.ok()) return fd.status();
  return Sha256OfOpenFile(fd->get(), path);
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

absl::StatusOr<std::string> ReadFileToString(const std::string& path, const std::string& what,
                                             int64_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read ", what, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " is not a regular file"));
  }
  if (st.st_size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", what, " holds ", st.st_size, " bytes, more than the ", max_bytes, " allowed"));
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot read ", what, ": ", std::strerror(errno)));
    if (n == 0) return text;
    if (static_cast<int64_t>(text.size()) + n > max_bytes) {  // it grew while read
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " grew past the ", max_bytes, " bytes allowed"));
    }
    text.append(buf, static_cast<size_t>(n));
  }
}

absl::Status MakeDirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!partial.empty() && mkdir(partial.c_str(), 0750) != 0) {  // not world-readable
        int err = errno;
        struct stat st;
        // What exists must be a directory (a parent may be reached through a link).
        if (err == EEXIST && (stat(partial.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) err = ENOTDIR;
        if (err != EEXIST) {
          return absl::PermissionDeniedError(absl::StrCat(partial, ": cannot create directory: ", std::strerror(err)));
        }
      }
    }
    if (i < dir.size()) partial += dir[i];
  }
  return absl::OkStatus();
}

}  // namespace shardline
