// CoordinatorCore's log calls: a rank's line, taken only from the session
// holding that rank, and a job's kept lines, both through JobLogs
// (server/job_logs.h).
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"

namespace shardline {

void CoordinatorCore::OnLog(const std::string& worker_id, const v1::LogLine& in) {
  absl::MutexLock lock(&mu_);
  if (!RankOfSession(worker_id, in.job_id(), in.rank(), "log")) return;
  // Over the total, the logs of the job that ended first go: when a job
  // ended is its record's last update.
  logs_.Append(in, [this](const std::string& id) ABSL_NO_THREAD_SAFETY_ANALYSIS -> std::optional<int64_t> {
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !IsFinalJobState(it->second.stored.job.state())) return std::nullopt;
    return it->second.stored.job.updated_unix_ms();
  });
}

absl::StatusOr<v1::GetLogsResponse> CoordinatorCore::GetLogs(const std::string& id, int rank, int64_t after) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  v1::GetLogsResponse out;
  logs_.Read(id, rank, after, &out);
  out.set_ended(IsFinalJobState(it->second.stored.job.state()));
  return out;
}

}  // namespace shardline
