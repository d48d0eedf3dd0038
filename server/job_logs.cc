// JobLogs: bounded per-rank tails of each job's log lines (see the header).
#include "server/job_logs.h"

#include <algorithm>
#include <utility>

#include "common/base/quoted.h"

namespace shardline {

void JobLogs::Append(const v1::LogLine& in, const EndedAt& ended_at) {
  JobTail& job = jobs_[in.job_id()];
  v1::LogLine line;
  line.set_job_id(in.job_id());
  line.set_rank(in.rank());
  line.set_unix_ms(in.unix_ms());
  // Shown to users as it is: one printable line.
  line.set_text(Printable(in.text(), limits_.max_line_bytes));
  line.set_seq(job.next_seq++);
  const size_t bytes = line.ByteSizeLong();
  std::deque<v1::LogLine>& tail = job.by_rank[line.rank()];
  tail.push_back(std::move(line));
  job.bytes += bytes;
  bytes_ += bytes;
  if (tail.size() > limits_.lines_per_rank) {
    const size_t dropped = tail.front().ByteSizeLong();
    tail.pop_front();
    job.bytes -= dropped;
    bytes_ -= dropped;
  }
  DropOverBudget(ended_at);
}

void JobLogs::DropOverBudget(const EndedAt& ended_at) {
  while (bytes_ > limits_.max_bytes) {
    JobTail* oldest = nullptr;
    int64_t oldest_ms = 0;
    for (auto& [id, job] : jobs_) {
      if (job.bytes == 0) continue;
      const std::optional<int64_t> ended = ended_at(id);
      if (!ended) continue;
      if (!oldest || *ended < oldest_ms) {
        oldest = &job;
        oldest_ms = *ended;
      }
    }
    if (!oldest) break;  // only running jobs' tails, each within its own bound
    bytes_ -= oldest->bytes;
    oldest->bytes = 0;
    oldest->by_rank.clear();  // next_seq stays: a sequence number is never given twice
  }
}

void JobLogs::Read(const std::string& job_id, int rank, int64_t after, v1::GetLogsResponse* out) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  const int first = out->lines_size();
  for (const auto& [r_rank, tail] : it->second.by_rank) {
    if (rank >= 0 && r_rank != rank) continue;
    for (const v1::LogLine& l : tail) {
      if (l.seq() > after) *out->add_lines() = l;
    }
  }
  std::sort(out->mutable_lines()->begin() + first, out->mutable_lines()->end(),
            [](const v1::LogLine& a, const v1::LogLine& b) { return a.seq() < b.seq(); });
}

void JobLogs::Forget(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  bytes_ -= it->second.bytes;
  jobs_.erase(it);
}

size_t JobLogs::bytes_of(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.bytes;
}

}  // namespace shardline
