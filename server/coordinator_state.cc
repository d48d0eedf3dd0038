// The coordinator's state database as the core uses it: the jobs read back
// at start (Recover, with the rows that do not read named and kept), and
// every job record written (Persist, PersistOrError).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/model/weight_source.h"
#include "common/spec/job_spec.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"

namespace shardline {

absl::Status CoordinatorCore::Recover(std::vector<std::string>* problems) {
  auto rows = store_->LoadJobs();
  if (!rows.ok()) return rows.status();
  absl::StatusOr<int64_t> next = store_->NextJobNumber();
  if (!next.ok()) return next.status();
  absl::MutexLock lock(&mu_);
  next_job_ = static_cast<int>(std::max<int64_t>(next_job_, *next));
  auto tell = [&](std::string line) {
    if (problems != nullptr) problems->push_back(std::move(line));
  };
  for (JobRow& row : *rows) {
    // Whatever else the row holds, its job number is never given again.
    int n = 0;
    if (sscanf(row.id.c_str(), "job-%d", &n) == 1) next_job_ = std::max(next_job_, n + 1);
    JobRecord r;
    r.stored = std::move(row.stored);
    std::string problem = row.problem;
    // A record without a state (written before JobState, or damaged) is no
    // job this coordinator can run or end: kept, like any unreadable row.
    if (row.job_read && (!v1::JobState_IsValid(r.stored.job.state()) ||
                         r.stored.job.state() == v1::JOB_STATE_UNSPECIFIED)) {
      problem = absl::StrCat(store_->path(), ": the row of ", Quoted(row.id), " (seq ", row.seq, "): its state ",
                             static_cast<int>(r.stored.job.state()), " is not a job state");
    }
    if (problem.empty()) {
      auto cfg = ResolveJobSpec(r.stored.spec_toml, r.stored.job.name(), r.stored.base_dir);
      if (cfg.ok()) {
        r.config = *cfg;
        r.config.lora.base_digest = r.stored.job.base_digest();  // what it was submitted on
      } else {
        problem = absl::StrCat(store_->path(), ": the row of ", Quoted(row.id), " (seq ", row.seq,
                               "): its spec does not parse: ", cfg.status().message());
      }
    }
    // An ended job needs its spec no more (it never runs again): with a
    // record that reads, it loads as it ended, said in the start log.
    const bool ended = row.job_read && IsFinalJobState(r.stored.job.state());
    if (!problem.empty() && ended) {
      tell(absl::StrCat(problem, "; loaded as it ended (", JobStateName(r.stored.job.state()), ")"));
    } else if (!problem.empty()) {
      // Kept for the operator: shown FAILED, never written (Persist), retired
      // or deleted, so the row stays as it is; the other jobs serve.
      const std::string id = !row.id.empty() && jobs_.count(row.id) == 0 && row.id.size() <= kMaxPathBytes
                                 ? row.id
                                 : absl::StrCat("unreadable-row-", row.seq);
      if (!row.job_read) r.stored.job.Clear();
      v1::Job& j = r.stored.job;
      j.set_id(id);
      j.set_state(v1::JOB_STATE_FAILED);
      j.clear_stalled();
      j.clear_straggler();
      j.set_message(absl::StrCat("the coordinator cannot read this job's record: ", problem,
                                 "; the row is kept unchanged for the operator"));
      r.unreadable = true;
      r.history.Swap(j.mutable_history());
      tell(absl::StrCat(problem, "; kept unchanged, listed as ", id, " (FAILED)"));
      jobs_.emplace(id, std::move(r));
      continue;
    }
    r.history.Swap(r.stored.job.mutable_history());
    const std::string id = r.stored.job.id();
    auto [it, _] = jobs_.emplace(id, std::move(r));
    v1::Job& j = JobOf(it->second);
    // A record written by an older coordinator that crashed while pruning
    // may list a checkpoint whose manifest is gone: it is no checkpoint.
    auto* ckpts = j.mutable_checkpoints();
    const int listed = ckpts->size();
    // Nor is one whose directory or manifest became a symlink (lstat: the
    // coordinator resumes from it and later deletes it).
    for (int i = ckpts->size() - 1; i >= 0; --i) {
      struct stat dir, manifest;
      const std::string& path = ckpts->Get(i).path();
      if (lstat(path.c_str(), &dir) != 0 || !S_ISDIR(dir.st_mode) ||
          lstat((path + "/manifest.json").c_str(), &manifest) != 0 || !S_ISREG(manifest.st_mode)) {
        ckpts->DeleteSubrange(i, 1);
      }
    }
    if (ckpts->size() != listed && j.state() != v1::JOB_STATE_RUNNING) Persist(it->second);
    if (j.state() == v1::JOB_STATE_RUNNING || j.state() == v1::JOB_STATE_RESTARTING) active_.insert(id);
    if (j.state() == v1::JOB_STATE_RUNNING) {
      // Its ranks are told to stop as they reconnect; it starts again once they are back.
      FailJob(it->second, "the coordinator restarted while the job was running", "", /*retryable=*/true);
    } else if (j.state() == v1::JOB_STATE_RESTARTING) {
      Restart(it->second, j.message());  // a repeat: restarts its clocks and queues it
    } else if (j.state() == v1::JOB_STATE_PENDING) {
      scheduler_.Enqueue(id);
    }
    if (j.state() == v1::JOB_STATE_RESTARTING) {
      // Its workers reconnect within their backoff: until then only all of
      // them will do, rather than a smaller world that must grow back.
      it->second.settle_until = std::max(it->second.settle_until, Now() + kWorkersReconnectWithin);
    }
  }
  return absl::OkStatus();
}

// ---- persistence and notification ------------------------------------------

namespace {

constexpr char kUnsavedNote[] = " [state not saved: ";
constexpr size_t kUnsavedNoteSize = sizeof(kUnsavedNote) - 1;

// Removes every note of a failed write (Persist) from a job's message; a
// message built from an earlier one (a restart's, a failure's) may carry
// one inside it. A note's cause holds no ']' (Persist), so the first one
// after its start ends it.
void DropUnsavedNotes(std::string* message) {
  for (size_t at; (at = message->find(kUnsavedNote)) != std::string::npos;) {
    const size_t end = message->find(']', at + kUnsavedNoteSize);
    message->erase(at, end == std::string::npos ? std::string::npos : end + 1 - at);
  }
}

}  // namespace

void CoordinatorCore::Persist(JobRecord& r) {
  if (r.unreadable) return;  // its row stays as the operator will find it
  // A failed write is said in the job's message rather than lost silently:
  // one note, of the latest failure, however many writes fail (each would
  // otherwise add its own, every second while a job runs on a full disk);
  // a write that succeeds drops it. The in-memory state stays authoritative
  // for this process.
  absl::Status s = PersistOrError(r);  // drops an earlier note
  if (s.ok()) return;
  unsaved_.insert(JobOf(r).id());
  std::string cause(s.message().substr(0, kMaxUnsavedNoteBytes - kUnsavedNoteSize - 1));
  std::replace(cause.begin(), cause.end(), ']', ')');
  absl::StrAppend(JobOf(r).mutable_message(), kUnsavedNote, cause, "]");
}

void CoordinatorCore::RetryUnsaved(absl::Time now) {
  if (unsaved_.empty() || now - last_unsaved_retry_ < absl::Seconds(1)) return;
  last_unsaved_retry_ = now;
  for (const std::string& id : std::vector<std::string>(unsaved_.begin(), unsaved_.end())) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      unsaved_.erase(id);  // forgotten or deleted since
      continue;
    }
    Persist(it->second);
    // The first that fails again says the disk is still full: the rest wait
    // for the next round rather than each hold the lock through a failure.
    if (unsaved_.count(id)) return;
  }
}

absl::Status CoordinatorCore::PersistOrError(JobRecord& r) {
  if (r.unreadable) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", JobOf(r).id(), ": its row in ", store_->path(), " is unreadable and is not written"));
  }
  DropUnsavedNotes(JobOf(r).mutable_message());  // it says what this write is about to change
  JobOf(r).set_updated_unix_ms(NowMs());
  r.last_persist = Now();
  // The history is stored in the job's row: swapped in for the write, not copied.
  r.stored.job.mutable_history()->Swap(&r.history);
  absl::Status put = store_->PutJob(r.stored);
  r.stored.job.mutable_history()->Swap(&r.history);
  if (put.ok()) unsaved_.erase(JobOf(r).id());
  return put;
}

}  // namespace shardline
