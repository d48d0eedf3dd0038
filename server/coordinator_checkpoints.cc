// CoordinatorCore's checkpoint calls: a rank's report (its credential, the
// state database, then the CheckpointCommitter), what a commit does to the
// job (failure, growth), save-now requests and listings.
#include "absl/strings/str_cat.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"

namespace shardline {

absl::Status CoordinatorCore::ReportCheckpoint(const v1::CheckpointReport& report, const std::string& credential) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(report.job_id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", report.job_id()));
  JobRecord& r = it->second;
  auto held = r.credentials.find(report.rank());
  if (held == r.credentials.end() || credential.empty() || held->second != credential) {
    if (options_.events.refused) options_.events.refused("checkpoint_report");
    return absl::PermissionDeniedError(absl::StrCat("job ", report.job_id(), " rank ", report.rank(),
                                                    ": the report lacks that rank's credential"));
  }
  absl::Status s = CheckpointCommitter::CheckReport(JobOf(r), report);
  if (absl::IsPermissionDenied(s) && options_.events.refused) options_.events.refused("checkpoint_report");
  if (!s.ok()) return s;
  s = store_->PutCheckpointReport(report);
  if (!s.ok()) {
    // The coordinator's own failure (a full disk under --state-dir), not the
    // rank's: had it gone back to the rank as an error, the rank would fail
    // with it and the job restart from its last commit, blaming that rank,
    // until restarts ran out. It would recur: the job fails at once.
    const std::string cause = absl::StrCat("checkpoint of step ", report.step(),
                                           " not committed: the coordinator could not save its state: ", s.message());
    FailJob(r, cause, "", /*retryable=*/false);
    return absl::Status(s.code(), cause);
  }
  if (committer_.Add(report) < JobOf(r).workers()) return absl::OkStatus();
  const absl::Time t0 = Now();
  s = committer_.Commit(JobOf(r), r.config, report.step(), RecorderOf(r));
  if (s.ok()) Notify(r);
  if (options_.events.checkpoint_committed) options_.events.checkpoint_committed(Now() - t0, s.ok());
  Log(s.ok() ? "checkpoint_committed" : "checkpoint_failed",
      {{"job", report.job_id()}, {"step", report.step()}, {"seconds", absl::ToDoubleSeconds(Now() - t0)},
       {"error", s.ok() ? "" : std::string(s.message())}});
  committer_.EndStep(report.job_id(), report.step());
  if (!s.ok()) {
    // The coordinator's own failure (a full disk, a read-only directory) is
    // the job's root cause, not what its ranks see once the reporter stops.
    // It would recur: no restart.
    FailJob(r, absl::StrCat("checkpoint of step ", report.step(), " not committed: ", s.message()), "",
            /*retryable=*/false);
    return s;
  }
  GrowAtCheckpoint(r, report.step());
  return s;
}

void CoordinatorCore::RemoveSavesOfEndedJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !IsFinalJobState(JobOf(it->second).state())) return;
  // Not while one of its ranks may still be writing.
  if (registry_.AnyOnJob(job_id)) return;
  committer_.DropReports(job_id);
  committer_.RemoveInterruptedSaves(JobOf(it->second), INT64_MAX);
}

absl::Status CoordinatorCore::CheckpointNow(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  if (JobOf(it->second).state() != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", JobStateName(JobOf(it->second).state()),
                                                      ", not RUNNING"));
  }
  // One rank is told. A save is a vote summed over the world in a step
  // (Engine::Step), so one rank's vote makes every rank save at that step;
  // telling every rank made two saves whenever the messages reached the ranks
  // on either side of a step's vote.
  for (const std::string& wid : JobOf(it->second).worker_ids()) {
    WorkerRecord* w = registry_.Find(wid);
    if (!w) continue;
    v1::CoordinatorMessage m;
    m.mutable_checkpoint()->set_job_id(id);
    w->channel->Send(m);
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat("job ", id, " has no worker connected to tell"));
}

CheckpointCommitter::Recorder CoordinatorCore::RecorderOf(JobRecord& r) {
  return {[this, &r]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return PersistOrError(r); },
          [this, &r]() ABSL_NO_THREAD_SAFETY_ANALYSIS { Persist(r); }};
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> CoordinatorCore::ListCheckpoints(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  const auto& c = it->second.stored.job.checkpoints();
  return std::vector<v1::CheckpointInfo>(c.begin(), c.end());
}

}  // namespace shardline
