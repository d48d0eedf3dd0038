// Small file helpers shared by the programs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline {

// Writes all n bytes to fd (retrying short writes and EINTR); errors name `path`.
absl::Status WriteFully(int fd, const void* data, size_t n, const std::string& path);

// An open file descriptor, closed when destroyed (a close error is ignored:
// only read-only or already fsynced descriptors are held this way).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release();

 private:
  int fd_ = -1;
};

// Writes `text` to "<path>.tmp", fsyncs it, renames it over `path` and fsyncs
// the folder: readers see the old file or the whole new one, never a part.
// The folder's parents may be symlinks, the folder itself may not (refused,
// not followed: a link planted where a program writes must not lead it into
// someone else's folder); the temp file is created afresh inside it as
// WriteFileAtomicallyAt does.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

// WriteFileAtomically of `name` (a plain file name) inside the open directory
// `dir_fd` (whose path `dir` names it in errors). "<name>.tmp" is created with
// O_EXCL | O_NOFOLLOW after a stale one is unlinked, so that neither a crash's
// leftover nor a symlink planted under either name is ever written through;
// the rename replaces whatever entry `name` was, never what it points to.
absl::Status WriteFileAtomicallyAt(int dir_fd, const std::string& dir, const std::string& name,
                                   const std::string& text);

// A file written through "<name>.tmp" inside an open directory and renamed
// over `name` once whole, for writers that stream (WriteFileAtomicallyAt
// writes a string this way). Create unlinks a stale temp file (a symlink
// itself, never its target) and creates it O_EXCL | O_NOFOLLOW, 0640; Commit
// fsyncs it, renames it over `name` (replacing whatever entry was there, a
// symlink included, never writing through it) and fsyncs the directory. An
// uncommitted one removes its temp file when destroyed. `dir_fd` must stay
// open while it lives; errors name dir/name.
class AtomicFileAt {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFileAt>> Create(int dir_fd, const std::string& dir,
                                                              const std::string& name);
  ~AtomicFileAt();
  AtomicFileAt(const AtomicFileAt&) = delete;
  AtomicFileAt& operator=(const AtomicFileAt&) = delete;
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  absl::Status Commit();

 private:
  AtomicFileAt(int dir_fd, std::string dir, std::string name)
      : dir_fd_(dir_fd), dir_(std::move(dir)), name_(std::move(name)), path_(dir_ + "/" + name_) {}
  const int dir_fd_;
  const std::string dir_, name_, path_;
  UniqueFd fd_;
  bool committed_ = false;
};

// Creates `dir` and its missing parents, 0750 (checkpoints and exports are
// not world-readable); PermissionDenied naming the part that cannot be made
// or that exists and is not a directory.
absl::Status MakeDirs(const std::string& dir);

// `path` with every symlink in it resolved (std::filesystem::canonical);
// NotFound naming `what` and `path` where it does not resolve.
absl::StatusOr<std::string> RealPath(const std::string& path, const char* what);
// OK where `path` is its own real path (no symlink anywhere in it, absolute,
// no "." or ".." or doubled "/"); else FailedPrecondition naming `what`,
// `path` and where it leads now.
absl::Status CheckIsRealPath(const std::string& path, const char* what);

// Opens the directory `name` (one path component) inside the open directory
// `at` (AT_FDCWD: `name` is a path, and only its last component is checked)
// without following a symlink there: a symlink is PermissionDenied naming
// `path`, anything else that fails NotFound naming it.
absl::StatusOr<UniqueFd> OpenDirectoryNoFollow(int at, const std::string& name, const std::string& path);

// Opens `path` for reading without following a symlink in its last component
// (O_NOFOLLOW): a symlink is PermissionDenied, anything but a regular file
// InvalidArgument, a missing file (ENOENT) NotFound, an unreadable one
// PermissionDenied, any other failure Internal; each one line naming `path`.
// For files a reader takes by name from a manifest: such a name must not
// lead out of the checkpoint's directory.
absl::StatusOr<UniqueFd> OpenRegularFileNoFollow(const std::string& path);

// Reads exactly `n` bytes at offset `at` of the open file `fd` into `dst`
// (retrying short reads and EINTR); a file that ends first is DataLoss
// naming `path` and the first byte missing.
absl::Status ReadExactlyAt(int fd, const std::string& path, int64_t at, int64_t n, char* dst);

// The whole of the open file `fd` (read from offset 0), which may hold at
// most `max_bytes`: a larger one (as fstat says, or as it turns out while it
// is read: it may grow) is InvalidArgument naming `path` and the limit,
// after at most max_bytes + 64 KiB were read. Errors name `path`.
absl::StatusOr<std::string> ReadOpenFileToString(int fd, const std::string& path, int64_t max_bytes);

// Hex SHA-256 of the whole of the open file `fd` (read from offset 0 with
// pread, in 4 MiB pieces); errors name `path`.
absl::StatusOr<std::string> Sha256OfOpenFile(int fd, const std::string& path);

// Hex SHA-256 of `bytes`.
std::string Sha256Hex(absl::string_view bytes);

// Sha256OfOpenFile of OpenRegularFileNoFollow(path).
absl::StatusOr<std::string> Sha256OfFileNoFollow(const std::string& path);

// A bearer token from `path`, as every program reads it: the file's first
// line, trimmed; visible ASCII only (gRPC metadata refuses anything else);
// at most 4 KiB. Like ssh with a private key, a file that its group or others
// can read is refused. Errors name the file and never echo the token.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The tokens a server accepts from a token file with ReadTokenFile's rules:
// every line that is neither blank nor a "#" comment is one token (at most
// kMaxAcceptedTokens), so that an operator can add a new token beside the old
// one, move the clients over, then remove the old one (rotation).
constexpr int kMaxAcceptedTokens = 16;
absl::StatusOr<std::vector<std::string>> ReadAcceptedTokens(const std::string& path);

// The whole file, which must be a regular file of at most `max_bytes`: a
// FIFO, a device (/dev/zero) or a directory is refused at once, never read
// or waited on (it is opened O_NONBLOCK), so that no caller (the
// coordinator reading a user's config.json, say) blocks or runs out of
// memory on what a user named. NotFound for a missing file, InvalidArgument
// for the others; each one line naming the file and `what` it was meant to be.
constexpr int64_t kMaxReadFileBytes = 16 << 20;
absl::StatusOr<std::string> ReadFileToString(const std::string& path, const std::string& what,
                                             int64_t max_bytes = kMaxReadFileBytes);

}  // namespace shardline
