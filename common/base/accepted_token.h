// TokenAccepted: whether a bearer token is one of a server's accepted tokens
// (common/base/file_util.h, ReadAcceptedTokens), for the coordinator's RPCs and
// the /metrics endpoints. Compares in time independent of where a guess
// differs, so that response times do not reveal a token's prefix.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace shardline {

inline bool TokenAccepted(absl::string_view token, const std::vector<std::string>& accepted) {
  bool found = false;
  for (const std::string& t : accepted) {
    unsigned char diff = t.size() != token.size();
    for (size_t i = 0; i < t.size() && i < token.size(); ++i) diff |= static_cast<unsigned char>(t[i] ^ token[i]);
    found |= diff == 0;
  }
  return found;
}

}  // namespace shardline
