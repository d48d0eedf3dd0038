// Fault injection for the coordinator's tests, as worker/fault_injection.h
// is for the worker's: SHARDLINE_FAULT=<point>@<step> in the coordinator's
// environment makes it kill itself with SIGKILL (as `kill -9` would: no
// destructor, no flush) when it reaches `point` for checkpoint step `step`.
// Points: mid-prune (coordinator_checkpoints.cc: a commit of `step` dropped
// older checkpoints from the job's record and persisted it, and has not yet
// removed their directories). Never set outside tests.
#pragma once

#include <signal.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"

namespace shardline {

inline void DieIfFaultRequested(const char* point, int64_t step) {
  const char* spec = std::getenv("SHARDLINE_FAULT");
  if (spec == nullptr || std::string(spec) != absl::StrCat(point, "@", step)) return;
  std::cerr << "shardline-coordinator: SHARDLINE_FAULT=" << spec << ": killing myself (SIGKILL)" << std::endl;
  ::raise(SIGKILL);
}

}  // namespace shardline
