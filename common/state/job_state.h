// Job and worker states (docs/design.md, "Control plane"): the proto enums'
// names as people read them, and the one table of legal job transitions.
//
// Transitions: PENDING -> RUNNING | CANCELLED; RUNNING -> SUCCEEDED | FAILED
// | CANCELLED | RESTARTING; RESTARTING -> RUNNING | FAILED | CANCELLED; the
// final states go nowhere. Repeating a transition (to the
// state a job is already in) is a no-op; anything else is an error. Pure
// functions, safe from any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shardline/v1/shardline.pb.h"

namespace shardline {

// "PENDING", "RUNNING", ...; "UNSPECIFIED" for 0.
std::string JobStateName(v1::JobState state);
// The state a name (JobStateName's, as legacy records hold it) stands for.
absl::StatusOr<v1::JobState> ParseJobState(absl::string_view name);
std::string WorkerStateName(v1::WorkerState state);

// SUCCEEDED, FAILED or CANCELLED.
bool IsFinalJobState(v1::JobState state);

// True if `from` -> `to` changes the state, false if it repeats it;
// FailedPrecondition naming both if the table has no such transition.
absl::StatusOr<bool> CheckJobTransition(v1::JobState from, v1::JobState to);

// The share of a job's wall time, from its first attempt's start to `now_ms`
// (or its last attempt's end), that its attempts spent on work a later
// attempt did not compute again (Attempt.lost_seconds); the time between
// attempts counts as lost. 1 for a job that never restarted; 0 before it
// started.
double JobGoodput(const v1::Job& j, int64_t now_ms);

}  // namespace shardline
