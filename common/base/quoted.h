// How a caller's text appears inside an error message.
//
// Every error is one line that names the file, key or rank at fault
// (docs/design.md). A value, key or path echoed verbatim from a job file, a
// manifest or a config.json can hold newlines (a TOML multi-line string, a
// quoted key), terminal escapes or megabytes, and would break that line or
// flood a log. These helpers make any text safe to embed:
//   Shown(text)  - control bytes, double quotes, backslashes and non-ASCII
//                  bytes escaped C-style (\n, \", \\, \xNN; non-ASCII too,
//                  since a proto string field must be valid UTF-8), cut to
//                  `max_bytes` of the input with "..." after it when cut.
//   Quoted(text) - Shown(text) in double quotes.
//   Printable(text) - for text shown as itself on a terminal (a path, a host,
//                  a log line, a job's message): printable UTF-8 is kept, so
//                  a folder named in any script reads as itself; every byte a
//                  terminal would act on is escaped \xNN instead (C0 and C1
//                  controls, DEL, invalid UTF-8) and so are the Unicode format
//                  characters that reorder or hide text (bidi overrides and
//                  isolates, zero-width marks), so no text can move the cursor,
//                  set a title, forge a row or reverse a line. Cut to
//                  `max_bytes` of the input on a character boundary.
//   IsPrintable(text) - Printable(text) would keep `text` unchanged: what a
//                  server accepts where a string enters (host names, paths).
// All are pure functions of their arguments; any thread.
#ifndef SHARDLINE_COMMON_QUOTED_H_
#define SHARDLINE_COMMON_QUOTED_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

namespace quoted_internal {

// The code point of the well-formed UTF-8 character at the front of `s` (not
// empty) in *cp, and its length in bytes; 0 for a byte that starts none
// (a stray continuation, an overlong form, a surrogate, past U+10FFFF).
inline size_t DecodeUtf8(absl::string_view s, uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  size_t n;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  } else if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2, *cp = b0 & 0x1f;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3, *cp = b0 & 0x0f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4, *cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[k]);
    if ((b & 0xc0) != 0x80) return 0;
    *cp = *cp << 6 | (b & 0x3f);
  }
  const bool overlong = (n == 3 && *cp < 0x800) || (n == 4 && *cp < 0x10000);
  const bool invalid = *cp > 0x10ffff || (*cp >= 0xd800 && *cp <= 0xdfff);
  return overlong || invalid ? 0 : n;
}

// Whether a terminal shows code point `cp` as a glyph and does nothing else:
// not a C0 or C1 control or DEL, nor a character that reorders or hides text
// (zero-width marks, line and paragraph separators, bidi embeddings,
// overrides and isolates, the byte order mark).
inline bool ShownAsItself(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) return false;
  return !((cp >= 0x200b && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202e) ||
           (cp >= 0x2060 && cp <= 0x2069) || cp == 0xfeff);
}

// The length of the character at the front of `s` that Printable keeps as
// itself, or 0 when its first byte must be escaped.
inline size_t PrintableCharBytes(absl::string_view s) {
  uint32_t cp = 0;
  const size_t n = DecodeUtf8(s, &cp);
  return n > 0 && ShownAsItself(cp) ? n : 0;
}

}  // namespace quoted_internal

inline std::string Printable(absl::string_view text, size_t max_bytes = 4096) {
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t n = quoted_internal::PrintableCharBytes(text.substr(at));
    if (at + std::max<size_t>(n, 1) > max_bytes) break;
    if (n == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(text[at]));
      ++at;
    } else {
      out.append(text.data() + at, n);
      at += n;
    }
  }
  if (at < text.size()) out += "...";
  return out;
}

inline bool IsPrintable(absl::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const size_t n = quoted_internal::PrintableCharBytes(text.substr(at));
    if (n == 0) return false;
    at += n;
  }
  return true;
}

}  // namespace shardline

#endif  // SHARDLINE_COMMON_QUOTED_H_
