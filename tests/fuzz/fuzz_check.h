// FUZZ_CHECK: an invariant of a fuzz target. A failure prints what broke and
// aborts, which libFuzzer reports as a crash (and saves the input).
#pragma once

#include <cstdio>
#include <cstdlib>
#include "absl/strings/string_view.h"

#define FUZZ_CHECK(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                       \
      std::fprintf(stderr, "\n");                                              \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

namespace shardline::fuzz {

// The project's error contract: one line that starts by naming the file, in
// printable ASCII (text echoed from the input is escaped by common/base/quoted.h;
// a raw byte could break the line, a terminal, or a proto string field,
// which must be valid UTF-8).
inline bool NamesFileInOneLine(absl::string_view message, absl::string_view file) {
  for (const char ch : message) {
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) return false;
  }
  return message.substr(0, file.size()) == file;
}

}  // namespace shardline::fuzz
