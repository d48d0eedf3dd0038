// CheckpointCommitter: the coordinator's part of sharded checkpoints
// (docs/design.md, "Checkpoints"): it checks and collects the ranks' reports,
// commits a step by writing its manifest last, applies [checkpoint]
// keep_latest, and removes saves that were interrupted.
//
// Owns: the reports of steps not yet committed, by job, then step, then
// rank. The job's list of committed checkpoints (Job.checkpoints) is the
// job record's: Commit and Prune change it and have the caller's Recorder
// save the record at the points the crash-safety order below needs.
//
// Order on disk (a crash anywhere leaves something Recover understands):
// the record names a step before its manifest appears; a manifest is
// written (temp file, fsync, rename) only into the job's own step
// directory, never through a symlink; older checkpoints are pruned only
// after the new manifest is in place, and only after the record stops
// naming them. A step directory is removed manifest first, and only the
// files the project writes there.
//
// Errors: CheckReport says why a report is refused (FailedPrecondition: the
// job is not RUNNING; InvalidArgument: no such rank, a step out of range, a
// malformed checksum; PermissionDenied: the report names a file other than
// the rank's own). Commit returns the Recorder's error or the manifest's.
// Removing files never fails: what is left is retried by a later call.
//
// Not thread-safe: CoordinatorCore calls it under its mutex. It does file
// I/O (the coordinator holds its lock across a commit, as it did before).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "common/job/job_config.h"
#include "shardline/v1/shardline.pb.h"

namespace shardline {

// Removes a step directory: the manifest first, so that a crash half-way
// leaves something that is no longer a checkpoint rather than a broken one.
// Removes only the files the project writes there (the manifest, the ranks'
// files and their temp files) and never follows a symlink.
void RemoveStepDir(const std::string& dir);

class CheckpointCommitter {
 public:
  // The job record's writes, as a commit needs them.
  struct Recorder {
    // Saves the record; an error if it was not saved (nothing is written
    // after a failed save).
    std::function<absl::Status()> save_or_error;
    // Saves the record; a failure is the recorder's to note.
    std::function<void()> save;
  };

  // Whether job `j` (as it is now) takes `report`; see the header for errors.
  static absl::Status CheckReport(const v1::Job& j, const v1::CheckpointReport& report);

  // Keeps a checked report (a rank's repeat replaces its earlier one);
  // returns how many ranks have reported its step.
  int Add(const v1::CheckpointReport& report);
  // Commits `step` of job `j` from its reports: adds it to Job.checkpoints,
  // saves the record (save_or_error), writes the manifest, then Prune. On an
  // error Job.checkpoints is as it was (and saved again if the manifest
  // failed). The step's reports stay until EndStep.
  absl::Status Commit(v1::Job& j, const JobConfig& config, int64_t step, const Recorder& record);
  // Forgets the reports of one step (committed or failed).
  void EndStep(const std::string& job_id, int64_t step);
  // Forgets every report of a job (its attempt ended or it is forgotten).
  void DropReports(const std::string& job_id);

  // keep_latest: drops the oldest of Job.checkpoints past `keep_latest`
  // (0: keeps all; never the newest, nor one that in_use says a job waiting
  // to start will resume from: it is dropped at a later commit), saves the
  // record, then removes their directories and the interrupted saves older
  // than the newest commit.
  void Prune(v1::Job& j, int keep_latest, const Recorder& record);
  // What Prune asks of a step directory's path (called with the caller's
  // lock held, as Commit and Prune are).
  void set_in_use(std::function<bool(const std::string& step_dir)> in_use) { in_use_ = std::move(in_use); }
  // Removes j's step directories below step `below` that have no manifest
  // and whose step is not being reported (saves that were interrupted).
  // Only real directories under the job's root, itself no symlink.
  void RemoveInterruptedSaves(const v1::Job& j, int64_t below) const;

  // Steps of `job_id` with reports pending, for tests.
  size_t pending_steps(const std::string& job_id) const;

 private:
  bool Reporting(const std::string& job_id, int64_t step) const;

  std::function<bool(const std::string&)> in_use_;
  // By job id, then step, then rank.
  std::map<std::string, std::map<int64_t, std::map<int, v1::CheckpointReport>>> reports_;
};

}  // namespace shardline
