// The coordinator's tail of each job's logs (`shardctl logs`): the lines its
// ranks send over their sessions, bounded per rank and over all jobs.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"

namespace shardline {

void CoordinatorCore::OnLog(const std::string& worker_id, const v1::LogLine& in) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = RankOfSession(worker_id, in.job_id(), in.rank(), "log");
  if (!r) return;
  v1::LogLine line;
  line.set_job_id(in.job_id());
  line.set_rank(in.rank());
  line.set_unix_ms(in.unix_ms());
  // Shown to users as it is: one printable line (a newline, an escape
  // sequence or a bidi override is escaped, never passed on).
  line.set_text(Printable(in.text(), kMaxLogLineBytes));
  line.set_seq(r->next_log_seq++);
  const size_t bytes = line.ByteSizeLong();
  std::deque<v1::LogLine>& tail = r->logs[line.rank()];
  tail.push_back(std::move(line));
  r->log_bytes += bytes;
  log_bytes_ += bytes;
  if (tail.size() > kLogLinesPerRank) {
    const size_t dropped = tail.front().ByteSizeLong();
    tail.pop_front();
    r->log_bytes -= dropped;
    log_bytes_ -= dropped;
  }
  // Over the total: the logs of the job that ended first go, whole.
  while (log_bytes_ > kMaxLogBytes) {
    JobRecord* oldest = nullptr;
    for (auto& [id, other] : jobs_) {
      if (other.log_bytes == 0 || !IsFinalJobState(other.stored.job.state())) continue;
      if (!oldest || other.stored.job.updated_unix_ms() < oldest->stored.job.updated_unix_ms()) oldest = &other;
    }
    if (!oldest) break;  // only running jobs' tails, each within its own bound
    log_bytes_ -= oldest->log_bytes;
    oldest->log_bytes = 0;
    oldest->logs.clear();
  }
}

absl::StatusOr<v1::GetLogsResponse> CoordinatorCore::GetLogs(const std::string& id, int rank, int64_t after) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  const JobRecord& r = it->second;
  v1::GetLogsResponse out;
  for (const auto& [r_rank, tail] : r.logs) {
    if (rank >= 0 && r_rank != rank) continue;
    for (const v1::LogLine& l : tail) {
      if (l.seq() > after) *out.add_lines() = l;
    }
  }
  std::sort(out.mutable_lines()->begin(), out.mutable_lines()->end(),
            [](const v1::LogLine& a, const v1::LogLine& b) { return a.seq() < b.seq(); });
  out.set_ended(IsFinalJobState(r.stored.job.state()));
  return out;
}

}  // namespace shardline
