// "1 worker", "3 workers": a count and its noun, for messages people read.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace shardline {

inline std::string Plural(int64_t n, const char* singular) {
  return absl::StrCat(n, " ", singular, n == 1 ? "" : "s");
}

}  // namespace shardline
