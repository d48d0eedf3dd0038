// How a caller's text appears inside an error message.
//
// Every error is one line that names the file, key or rank at fault
// (DESIGN.md). A value, key or path echoed verbatim from a job file, a
// manifest or a config.json can hold newlines (a TOML multi-line string, a
// quoted key), terminal escapes or megabytes, and would break that line or
// flood a log. These helpers make any text safe to embed:
//   Shown(text)  - control bytes, double quotes, backslashes and non-ASCII
//                  bytes escaped C-style (\n, \", \\, \xNN; non-ASCII too,
//                  since a proto string field must be valid UTF-8), cut to
//                  `max_bytes` of the input with "..." after it when cut.
//   Quoted(text) - Shown(text) in double quotes.
// Both are pure functions of their arguments; any thread.
#ifndef SHARDLINE_COMMON_QUOTED_H_
#define SHARDLINE_COMMON_QUOTED_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace shardline {

inline constexpr size_t kShownBytes = 64;

inline std::string Shown(absl::string_view text, size_t max_bytes = kShownBytes) {
  std::string out;
  for (const char ch : text.substr(0, max_bytes)) {
    const auto byte = static_cast<unsigned char>(ch);
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '"' || ch == '\\') {
      out += {'\\', ch};
    } else if (byte < 0x20 || byte >= 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", byte);
    } else {
      out.push_back(ch);
    }
  }
  if (text.size() > max_bytes) out += "...";
  return out;
}

inline std::string Quoted(absl::string_view text, size_t max_bytes = kShownBytes) {
  return absl::StrCat("\"", Shown(text, max_bytes), "\"");
}

}  // namespace shardline

#endif  // SHARDLINE_COMMON_QUOTED_H_
