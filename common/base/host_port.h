// SplitHostPort: "HOST:PORT" or "[IPV6]:PORT" as its two parts, the one
// spelling every address flag and published address in the project uses.
// False (and the outputs untouched) where either part is missing. Neither
// part is checked further: callers resolve or parse them.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace shardline {

inline bool SplitHostPort(absl::string_view address, std::string* host, std::string* port) {
  absl::string_view h, p;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find("]:");
    if (close == absl::string_view::npos) return false;
    h = address.substr(1, close - 1);
    p = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return false;
    h = address.substr(0, colon);
    p = address.substr(colon + 1);
  }
  if (h.empty() || p.empty()) return false;
  host->assign(h.data(), h.size());
  port->assign(p.data(), p.size());
  return true;
}

}  // namespace shardline
