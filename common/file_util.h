// Small file helpers shared by the programs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline {

// Writes all n bytes to fd (retrying short writes and EINTR); errors name `path`.
absl::Status WriteFully(int fd, const void* data, size_t n, const std::string& path);

// Writes `text` to "<path>.tmp", fsyncs it, renames it over `path` and fsyncs
// the folder: readers see the old file or the whole new one, never a part.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

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

// The whole file; NotFound naming the file and `what` it was meant to be.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, const std::string& what);

}  // namespace shardline
