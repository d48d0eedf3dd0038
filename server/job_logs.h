// JobLogs: the coordinator's tail of each job's logs (`shardctl logs`): the
// lines a job's ranks send over their sessions, in memory only (a restarted
// coordinator starts without them).
//
// Owns: every kept line, by job and then rank, and each job's next sequence
// number. A line's text is made one printable line cut to max_line_bytes
// (an escape sequence or a bidi override is escaped, never passed on). Each
// rank keeps its last lines_per_rank lines; over max_bytes in all (the
// lines' encoded size), the logs of the job that ended first go, whole;
// only running jobs' tails, each within its own bound, may stay over it.
// Sequence numbers rise per job from 1 and are never given twice, even
// after the job's lines were dropped.
//
// Who may send a line (the session holding that rank) is the caller's
// check. No errors: a line is always taken, possibly at an older line's
// expense.
//
// Not thread-safe: CoordinatorCore calls it under its mutex. The EndedAt
// function is called synchronously and must not call back into JobLogs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "shardline/v1/shardline.pb.h"

namespace shardline {

class JobLogs {
 public:
  struct Limits {
    size_t max_line_bytes = 1024;
    size_t lines_per_rank = 500;
    size_t max_bytes = 64 << 20;
  };
  // When job `job_id` ended (Job.updated_unix_ms of an ended job), or
  // nullopt while it has not: the job that ended first loses its lines first.
  using EndedAt = std::function<std::optional<int64_t>(const std::string& job_id)>;

  explicit JobLogs(Limits limits) : limits_(limits) {}
  JobLogs() : JobLogs(Limits{}) {}

  // Keeps a copy of `in` (its job, rank, time and text) under the job's next
  // sequence number, then applies the bounds.
  void Append(const v1::LogLine& in, const EndedAt& ended_at);
  // The job's kept lines after `after_seq` (of rank `rank`, or all for -1),
  // in arrival order, added to `out`.
  void Read(const std::string& job_id, int rank, int64_t after_seq, v1::GetLogsResponse* out) const;
  // Drops a job's lines and its sequence (the job is forgotten).
  void Forget(const std::string& job_id);

  size_t bytes() const { return bytes_; }
  size_t bytes_of(const std::string& job_id) const;

 private:
  struct JobTail {
    std::map<int, std::deque<v1::LogLine>> by_rank;  // oldest first
    int64_t next_seq = 1;
    size_t bytes = 0;
  };
  // While over max_bytes, the lines of the ended job that ended first go.
  void DropOverBudget(const EndedAt& ended_at);

  const Limits limits_;
  std::map<std::string, JobTail> jobs_;  // by job id
  size_t bytes_ = 0;                     // every job's kept lines
};

}  // namespace shardline
