// StateStore: the coordinator's durable state, one SQLite database under
// --state-dir (WAL mode, synchronous=FULL, so a row written before a crash is
// there after it). Jobs are kept as their serialized shardline.v1.Job plus
// the spec they were submitted with.
//
// One owner: Open takes an exclusive lock (flock) on <state-dir>/coordinator.lock
// and holds it until the StateStore is destroyed (or its process dies, even
// by kill -9). A second Open of the same directory, from this process or
// another, fails at once (FailedPrecondition) naming the lock file and the
// pid written in it: two coordinators on one state would hand out the same
// job ids and lose each other's rows.
//
// A new state is one without a database file: Open creates it whole (schema
// and a `meta` row, under a temp name renamed into place), so that a
// coordinator.db that exists always holds the schema. A database file that
// exists but holds no Shardline schema (emptied to 0 bytes, or another
// SQLite file) is refused at Open naming it, never taken for a new state: an
// empty state would give job ids out again. A database written before the
// `meta` table existed (it has the `jobs` table) is taken and given one.
//
// Errors name the database file and SQLite's cause ("<path>: write job
// job-3: database or disk is full"); a full disk is ResourceExhausted,
// another process holding the database past the busy timeout Unavailable,
// any other failure Internal.
//
// Thread-safe (one connection behind a mutex).
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

// A row of the jobs table as LoadJobs read it. A row that does not read
// whole is still returned (never skipped, never changed in the database), so
// that the caller can name it and keep its job id from being given again.
struct JobRow {
  int64_t seq = 0;            // the row's place in creation order
  std::string id;             // its id column ("" if NULL)
  StoredJob stored;           // as far as it read
  bool job_read = false;      // the job column parsed as a Job whose id is the id column
  bool spec_read = false;     // the spec column is not NULL
  std::string problem;        // why not, naming the row; empty if both read
};

class StateStore {
 public:
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& state_dir);
  ~StateStore();

  const std::string& path() const { return path_; }        // <state-dir>/coordinator.db
  const std::string& lock_path() const { return lock_path_; }  // <state-dir>/coordinator.lock

  absl::Status PutJob(const StoredJob& job);
  // Every job row in creation order, each as far as it reads (JobRow). An
  // error only if the table cannot be read at all (naming the database).
  absl::StatusOr<std::vector<JobRow>> LoadJobs();
  absl::Status PutCheckpointReport(const v1::CheckpointReport& report);
  // Removes a job's row and its checkpoint reports, and records that job
  // numbers below `next_job_number` were given (in one transaction): a job id
  // is never given twice, so a new job never writes into a deleted one's
  // checkpoint directory.
  absl::Status DeleteJob(const std::string& id, int64_t next_job_number);
  // The largest next_job_number recorded by DeleteJob; 0 if none.
  absl::StatusOr<int64_t> NextJobNumber();

  // Tests only: with `full`, every write after the next `after_writes`
  // fails as SQLite fails it on a full disk (SQLITE_FULL, "database or disk
  // is full"), without touching the file; false writes again. Reads are
  // unaffected.
  void SimulateFullDiskForTesting(bool full, int after_writes = 0);

 private:
  StateStore(sqlite3* db, std::string path, std::string lock_path, int lock_fd)
      : db_(db), path_(std::move(path)), lock_path_(std::move(lock_path)), lock_fd_(lock_fd) {}
  absl::Status Exec(const std::string& sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `what` failed with SQLite result `rc`: the error naming the file and the cause.
  absl::Status Error(const std::string& what, int rc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Non-OK if writes are simulated to fail (SimulateFullDiskForTesting).
  absl::Status SimulatedFailure(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  const std::string path_, lock_path_;
  const int lock_fd_;  // holds the flock; closed (released) last
  bool simulate_full_ ABSL_GUARDED_BY(mu_) = false;
  int writes_before_full_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline
