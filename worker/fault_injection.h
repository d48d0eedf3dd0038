// Fault injection for tests: SHARDLINE_FAULT=<point>@<step> in a process's
// environment asks for the fault named `point` at global step `step` (1-based,
// the step just completed). Points: before-write, mid-write, before-report
// (worker/checkpoint: the process kills itself during that step's save),
// stop-before-write and stop-mid-write (it stops itself there, SIGSTOP, until
// a test continues it) and
// nan-grad (worker/engine: that step's gradient norm is NaN, as after an
// overflow). Never set outside tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace shardline {

inline bool FaultRequested(const char* point, int64_t step) {
  const char* spec = std::getenv("SHARDLINE_FAULT");
  return spec != nullptr && std::string(spec) == absl::StrCat(point, "@", step);
}

}  // namespace shardline
