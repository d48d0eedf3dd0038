// Fault injection for tests, one mechanism for every program:
// SHARDLINE_FAULT=<point>@<step> in a process's environment asks for the
// fault named `point` at step `step` (1-based: the step just completed, or
// the checkpoint step being saved or committed). Never set outside tests.
//
// Points, and where they are taken:
//   before-write, mid-write, before-report   worker/checkpoint: the rank kills
//       itself (SIGKILL) during that step's save;
//   stop-before-write, stop-mid-write   the same places, but the rank stops
//       itself (SIGSTOP) until a test continues it, as a host that stalled;
//   nan-grad   worker/engine: that step's gradient norm is NaN, as after an
//       overflow (FaultRequested, no signal);
//   mid-prune   server/coordinator_checkpoints: the coordinator kills itself
//       after a commit of that step dropped older checkpoints from the job's
//       record and persisted it, before it removed their directories.
//
// A kill is SIGKILL, as `kill -9` would: no destructor, no flush.
#pragma once

#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardline {

inline bool FaultRequested(const char* point, int64_t step) {
  const char* spec = std::getenv("SHARDLINE_FAULT");
  return spec != nullptr && std::string(spec) == absl::StrCat(point, "@", step);
}

// When asked for: says so on stderr (`who` names the program), then stops the
// process for a "stop-..." point and kills it for any other.
inline void InjectProcessFault(const char* who, const char* point, int64_t step) {
  if (!FaultRequested(point, step)) return;
  std::fprintf(stderr, "%s: injected fault %s at step %lld\n", who, point, static_cast<long long>(step));
  ::raise(absl::StartsWith(point, "stop-") ? SIGSTOP : SIGKILL);
}

}  // namespace shardline
