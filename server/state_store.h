// StateStore: the coordinator's durable state, one SQLite database under
// --state-dir (WAL mode, synchronous=FULL, so a row written before a crash is
// there after it). Jobs are kept as their serialized shardline.v1.Job plus
// the spec they were submitted with.
//
// Thread-safe (one connection behind a mutex). Errors name the database file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "shardline/v1/shardline.pb.h"

struct sqlite3;

namespace shardline {

// A job's row. The spec is kept once, here, not in `job` (whose
// Job.spec_toml stays empty: the job is rewritten at every change of state,
// the spec never).
struct StoredJob {
  v1::Job job;
  std::string spec_toml;
  std::string base_dir;
};

class StateStore {
 public:
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& state_dir);
  ~StateStore();

  absl::Status PutJob(const StoredJob& job);
  absl::StatusOr<std::vector<StoredJob>> LoadJobs();  // in creation order
  absl::Status PutCheckpointReport(const v1::CheckpointReport& report);
  // Removes a job's row and its checkpoint reports, and records that job
  // numbers below `next_job_number` were given (in one transaction): a job id
  // is never given twice, so a new job never writes into a deleted one's
  // checkpoint directory.
  absl::Status DeleteJob(const std::string& id, int64_t next_job_number);
  // The largest next_job_number recorded by DeleteJob; 0 if none.
  absl::StatusOr<int64_t> NextJobNumber();

 private:
  StateStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const std::string& sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  const std::string path_;
};

}  // namespace shardline
