// Jobs from clients: submit (parse, validate, a fresh id and checkpoint
// directory), read, list a page at a time, cancel, delete and forget.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/plural.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/job/job_file.h"
#include "common/model/weight_source.h"
#include "common/spec/job_spec.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"

namespace shardline {

// ---- jobs ----------------------------------------------------------------------

absl::StatusOr<JobConfig> CoordinatorCore::ParseAndValidate(const v1::SubmitJobRequest& req, int* workers,
                                                             std::optional<CheckpointManifest>* resume) const {
  const std::string source = req.source().empty() ? "job" : req.source();
  auto cfg = ResolveJobSpec(req.spec_toml(), source, req.base_dir());
  if (!cfg.ok()) return cfg.status();
  *workers = req.workers() > 0 ? req.workers() : cfg->workers;
  absl::Status s = ValidateJobConfig(*cfg, *workers, source);
  if (!s.ok()) return s;
  if (!req.resume_from().empty()) {
    // The service resolved it: it must still be its own real path, before
    // and after the manifest is read (a link swapped in between is refused).
    if (absl::Status real = CheckIsRealPath(req.resume_from(), "resume_from"); !real.ok()) return real;
    auto m = ReadManifest(req.resume_from());
    if (!m.ok()) return m.status();
    if (absl::Status real = CheckIsRealPath(req.resume_from(), "resume_from"); !real.ok()) return real;
    absl::Status same = CheckSameTraining(*m, *cfg, req.resume_from());
    if (!same.ok()) return same;
    *resume = *std::move(m);
  }
  s = CheckJobFiles(*cfg, source);
  if (!s.ok()) return s;
  if (cfg->lora.enabled) {
    absl::StatusOr<std::string> digest = BaseWeightsDigest(cfg->model);
    if (!digest.ok()) return absl::Status(digest.status().code(), absl::StrCat(source, ": ", digest.status().message()));
    cfg->lora.base_digest = *digest;
  }
  return cfg;
}

absl::StatusOr<std::string> CoordinatorCore::Submit(const v1::SubmitJobRequest& req, const std::string& owner) {
  // Bounded before anything is parsed or stored: a job's record stays small
  // enough that listing many of them never exceeds a message.
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"source", &req.source()},
                                     {"base_dir", &req.base_dir()}, {"resume_from", &req.resume_from()}}) {
    if (value->size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, " is longer than ", kMaxPathBytes, " bytes"));
    }
    // Shown to every user by `jobs`, `status` and `ckpt list`.
    if (!IsPrintable(*value)) {
      return absl::InvalidArgumentError(absl::StrCat(field, " ", Quoted(*value),
                                                     ": control characters are not allowed in a path"));
    }
  }
  if (req.spec_toml().size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(req.source().empty() ? "job" : req.source(), ": the job file is ",
                                                   req.spec_toml().size(), " bytes, more than the limit of ",
                                                   kMaxSpecBytes));
  }
  int workers = 0;
  std::optional<CheckpointManifest> resume;
  auto cfg = ParseAndValidate(req, &workers, &resume);
  if (!cfg.ok()) return cfg.status();
  // The lineage of a resume, from the manifest ParseAndValidate read.
  std::string parent;
  int64_t parent_step = 0;
  if (resume) {
    parent_step = resume->step;
    parent = JobOfCheckpoint(req.resume_from(), *resume);
  }
  absl::MutexLock lock(&mu_);
  if (options_.max_queued_jobs_per_user < options_.max_queued_jobs) {
    size_t mine = 0;
    for (const auto& [id, r] : jobs_) {
      const v1::JobState s = r.stored.job.state();
      mine += r.stored.job.owner() == owner && (s == v1::JOB_STATE_PENDING || s == v1::JOB_STATE_RESTARTING);
    }
    if (mine >= options_.max_queued_jobs_per_user) {
      return absl::ResourceExhaustedError(absl::StrCat("you already have ", mine, " jobs waiting to start, the limit "
                                                       "for one user; cancel some or try again later"));
    }
  }
  if (scheduler_.size() >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat("the queue already holds ", scheduler_.size(),
                                                     " jobs waiting to start, the limit; try again later"));
  }
  std::string root = ResolveJobPath(req.base_dir(), cfg->checkpoint.dir.empty() ? "ckpt" : cfg->checkpoint.dir);
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  // Never an id whose checkpoint directory exists: it holds the files of a
  // job this state does not know (a state database lost, emptied or
  // restored from an older backup, another coordinator's jobs under the
  // same root), which the new job's ranks would write into and its
  // keep_latest would prune. Such an id is passed over rather than the job
  // refused: the user gets a job, and the old files stay untouched for
  // whoever owns them. Bounded, so that a root filled with job-N
  // directories cannot hold the lock for long.
  std::string id;
  for (int tries = 0; id.empty(); ++tries) {
    if (tries == 1000) {
      return absl::ResourceExhaustedError(absl::StrCat(root, ": job-", next_job_ - 1000, " to job-", next_job_ - 1,
                                                       " all exist there already; no id for a new job"));
    }
    const std::string candidate = absl::StrFormat("job-%d", next_job_++);
    const std::string dir = root + "/" + candidate;
    struct stat st;
    if (::lstat(dir.c_str(), &st) == 0) continue;  // taken
    if (errno != ENOENT && errno != ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, ": cannot tell whether the checkpoint directory exists: ", std::strerror(errno)));
    }
    id = candidate;
  }
  JobRecord r;
  r.config = *cfg;
  r.stored.spec_toml = req.spec_toml();
  r.stored.base_dir = req.base_dir();
  v1::Job& j = r.stored.job;
  j.set_id(id);
  j.set_name(cfg->name);
  j.set_state(v1::JOB_STATE_PENDING);
  j.set_workers(workers);
  j.set_requested_workers(workers);
  j.set_steps(cfg->train.steps);
  j.set_sequences_per_epoch(cfg->train.sequences_per_epoch);
  j.set_batch_size(cfg->train.batch_size);
  j.set_strategy(StrategyName(cfg->parallelism.strategy));
  j.set_created_unix_ms(NowMs());
  j.set_message(absl::StrCat("waiting for ", Plural(workers, "idle worker")));
  j.set_base_dir(req.base_dir());
  j.set_resume_from(req.resume_from());
  j.set_resumed_from_job(parent);
  j.set_resumed_from_step(parent_step);
  j.set_owner(owner);
  j.set_base_digest(cfg->lora.base_digest);
  j.set_checkpoint_root(root + "/" + id);
  // A job the coordinator cannot record is not taken: it would be gone at
  // the next start, and its checkpoints could never be committed.
  if (absl::Status saved = PersistOrError(r); !saved.ok()) {
    return absl::Status(saved.code(), absl::StrCat("job not accepted: the coordinator could not save its state: ",
                                                   saved.message()));
  }
  Log("job_submitted", {{"job", id}, {"name", cfg->name}, {"owner", owner}, {"workers", workers},
                        {"strategy", j.strategy()}, {"steps", j.steps()}, {"resume_from", req.resume_from()},
                        {"resumed_from_job", parent}});
  jobs_.emplace(id, std::move(r));
  scheduler_.Enqueue(id);
  Schedule();
  return id;
}

absl::StatusOr<std::string> CoordinatorCore::OwnerOfJob(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  return it->second.stored.job.owner();
}

absl::StatusOr<std::string> CoordinatorCore::JobOfCheckpoint(const std::string& step_dir) const {
  SL_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(step_dir));  // outside the lock: file I/O
  return JobOfCheckpoint(step_dir, m);
}

std::string CoordinatorCore::JobOfCheckpoint(const std::string& step_dir, const CheckpointManifest& m) const {
  std::string root;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(m.job);
    if (it == jobs_.end()) return std::string();
    root = it->second.stored.job.checkpoint_root();
  }
  std::error_code e1, e2;
  const std::filesystem::path dir = std::filesystem::canonical(step_dir, e1);
  const std::filesystem::path job_root = std::filesystem::canonical(root, e2);
  if (e1 || e2) return std::string();
  auto [r, d] = std::mismatch(job_root.begin(), job_root.end(), dir.begin(), dir.end());
  return r == job_root.end() ? m.job : std::string();
}

absl::StatusOr<v1::Job> CoordinatorCore::GetJob(const std::string& id, bool history) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  v1::Job j = it->second.stored.job;
  j.set_spec_toml(it->second.stored.spec_toml);
  if (history) *j.mutable_history() = it->second.history;
  FillRanks(it->second, Now(), &j);
  return j;
}

std::vector<v1::Job> CoordinatorCore::ListJobs() const {
  size_t total = 0;
  return ListJobs(0, SIZE_MAX, &total);
}

std::vector<v1::Job> CoordinatorCore::ListJobs(uint64_t first, size_t max, size_t* total) const {
  absl::MutexLock lock(&mu_);
  // Ordered by reference; only the page is copied.
  std::vector<const JobRecord*> order;
  order.reserve(jobs_.size());
  for (const auto& [id, r] : jobs_) order.push_back(&r);
  std::sort(order.begin(), order.end(), [](const JobRecord* a, const JobRecord* b) {
    const v1::Job &x = a->stored.job, &y = b->stored.job;
    return x.created_unix_ms() != y.created_unix_ms() ? x.created_unix_ms() < y.created_unix_ms() : x.id() < y.id();
  });
  *total = order.size();
  std::vector<v1::Job> out;
  const absl::Time now = Now();
  for (uint64_t k = first; k < order.size() && out.size() < max; ++k) {
    out.push_back(order[k]->stored.job);
    FillRanks(*order[k], now, &out.back());
  }
  return out;
}

absl::StatusOr<v1::Job> CoordinatorCore::Cancel(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  JobRecord& r = it->second;
  const v1::JobState state = JobOf(r).state();
  if (IsFinalJobState(state)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is already ", JobStateName(state)));
  }
  if (absl::Status s = Transition(r, v1::JOB_STATE_CANCELLED, "cancelled by the user"); !s.ok()) return s;
  if (state == v1::JOB_STATE_PENDING || state == v1::JOB_STATE_RESTARTING) {
    scheduler_.Remove(id);
  }
  if (state != v1::JOB_STATE_PENDING) EndAttempt(r, "cancelled by the user");
  if (state == v1::JOB_STATE_RUNNING) StopRanks(r, "cancelled", "");
  Schedule();  // the head of the queue may have changed
  return JobOf(r);
}

absl::StatusOr<int> CoordinatorCore::Delete(const std::string& id, bool checkpoints) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  const v1::JobState state = JobOf(it->second).state();
  if (!IsFinalJobState(state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", JobStateName(state), "; cancel it before deleting it"));
  }
  if (const WorkerRecord* w = registry_.AnyOnJob(id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, ": rank ", w->info.rank(), " on ", w->info.host(), " is still stopping; try again"));
  }
  return Forget(it->second, checkpoints);
}

absl::StatusOr<int> CoordinatorCore::Forget(JobRecord& r, bool checkpoints) {
  const std::string id = JobOf(r).id();
  if (r.unreadable) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, ": its row in ", store_->path(),
        " is unreadable and is kept for the operator; stop the coordinator to mend or remove it with sqlite3"));
  }
  // The record goes first: a crash after it leaves files without a record,
  // never a record of files that are gone.
  if (absl::Status s = store_->DeleteJob(id, next_job_); !s.ok()) return s;
  int removed = 0;
  if (checkpoints) {
    for (const v1::CheckpointInfo& c : JobOf(r).checkpoints()) {
      RemoveStepDir(c.path());
      ++removed;
    }
    committer_.DropReports(id);
    committer_.RemoveInterruptedSaves(JobOf(r), INT64_MAX);
    ::unlink((JobOf(r).checkpoint_root() + "/history.jsonl").c_str());  // rank 0's per-step record
    ::rmdir(JobOf(r).checkpoint_root().c_str());  // only if nothing else is left in it
  }
  for (auto w = watchers_.begin(); w != watchers_.end();) {
    w = w->second.first == id ? watchers_.erase(w) : std::next(w);
  }
  committer_.DropReports(id);
  logs_.Forget(id);
  active_.erase(id);
  jobs_.erase(id);
  return removed;
}

void CoordinatorCore::RetireEndedJobs(absl::Time now) {
  std::vector<std::pair<int64_t, std::string>> ended;  // (updated ms, id)
  for (const auto& [id, r] : jobs_) {
    // An unreadable row is the operator's to mend (Forget refuses it).
    if (IsFinalJobState(r.stored.job.state()) && !r.unreadable) ended.emplace_back(r.stored.job.updated_unix_ms(), id);
  }
  std::sort(ended.begin(), ended.end());
  const int64_t oldest_kept_ms = options_.keep_finished_for > absl::ZeroDuration()
                                     ? absl::ToUnixMillis(now - options_.keep_finished_for)
                                     : INT64_MIN;
  const size_t over = ended.size() > static_cast<size_t>(options_.keep_finished_jobs)
                          ? ended.size() - options_.keep_finished_jobs
                          : 0;
  for (size_t i = 0; i < ended.size(); ++i) {
    if (i >= over && ended[i].first >= oldest_kept_ms) break;
    (void)Forget(jobs_.at(ended[i].second), /*checkpoints=*/false);  // a failed delete is retried next Tick
  }
}

}  // namespace shardline
