#include "common/state/job_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/quoted.h"

namespace shardline {
namespace {

using v1::JobState;

struct Transition {
  JobState from, to;
};
// The whole state machine.
constexpr Transition kJobTransitions[] = {
    {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING},   {v1::JOB_STATE_PENDING, v1::JOB_STATE_CANCELLED},
    {v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED}, {v1::JOB_STATE_RUNNING, v1::JOB_STATE_FAILED},
    {v1::JOB_STATE_RUNNING, v1::JOB_STATE_CANCELLED},   {v1::JOB_STATE_RUNNING, v1::JOB_STATE_RESTARTING},
    {v1::JOB_STATE_RESTARTING, v1::JOB_STATE_RUNNING}, {v1::JOB_STATE_RESTARTING, v1::JOB_STATE_FAILED},
    {v1::JOB_STATE_RESTARTING, v1::JOB_STATE_CANCELLED},
};

// An enum value's name without its prefix.
std::string ShortName(const std::string& full, absl::string_view prefix) {
  return full.empty() ? "UNKNOWN" : std::string(absl::StripPrefix(full, prefix));
}

}  // namespace

std::string JobStateName(JobState state) {
  return ShortName(v1::JobState_Name(state), "JOB_STATE_");
}

std::string WorkerStateName(v1::WorkerState state) {
  return ShortName(v1::WorkerState_Name(state), "WORKER_STATE_");
}

absl::StatusOr<JobState> ParseJobState(absl::string_view name) {
  JobState state;
  if (!name.empty() && v1::JobState_Parse(absl::StrCat("JOB_STATE_", name), &state) &&
      state != v1::JOB_STATE_UNSPECIFIED) {
    return state;
  }
  return absl::InvalidArgumentError(absl::StrCat(Quoted(name, 32), " is not a job state"));
}

bool IsFinalJobState(JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED || state == v1::JOB_STATE_CANCELLED;
}

absl::StatusOr<bool> CheckJobTransition(JobState from, JobState to) {
  if (from == to) return false;
  for (const Transition& t : kJobTransitions) {
    if (t.from == from && t.to == to) return true;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("a job cannot go from ", JobStateName(from), " to ", JobStateName(to)));
}

double JobGoodput(const v1::Job& j, int64_t now_ms) {
  if (j.attempts_size() == 0) return 0;
  const v1::Attempt& last = j.attempts(j.attempts_size() - 1);
  const int64_t end_ms = last.ended_unix_ms() != 0 ? last.ended_unix_ms() : now_ms;
  const double wall = (end_ms - j.attempts(0).started_unix_ms()) / 1e3;
  if (wall <= 0) return 1;
  double kept = 0;
  for (const v1::Attempt& a : j.attempts()) {
    const int64_t ended = a.ended_unix_ms() != 0 ? a.ended_unix_ms() : now_ms;
    kept += (ended - a.started_unix_ms()) / 1e3 - a.lost_seconds();
  }
  return std::clamp(kept / wall, 0.0, 1.0);
}

}  // namespace shardline
