// The coordinator core: worker sessions (over the WorkerRegistry), progress
// and rank failures, the clock (Tick), transitions and watchers. Jobs from
// clients are in coordinator_jobs.cc, the state database in
// coordinator_state.cc.
#include "server/coordinator_core.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/quoted.h"
#include "common/model/model_shapes.h"
#include "common/state/job_state.h"

namespace shardline {

namespace {

// What a rank sees when a peer fails (RankFinished.code): a closed
// connection, a collective or rendezvous that timed out, a stop. Any other
// error is the rank's own, and the root cause of its job's failure.
bool IsPeerError(int code) {
  switch (static_cast<absl::StatusCode>(code)) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kOk:  // a worker that did not say
      return true;
    default:
      return false;
  }
}

// A rank's own error that may not recur in a new attempt (a fault of the
// device or the library, reported as Internal or Unknown). Bad input, a
// checksum mismatch, a non-finite loss, a refused credential, a full disk or
// memory would recur: those fail the job at once.
bool IsRetryableOwnError(int code) {
  const auto c = static_cast<absl::StatusCode>(code);
  return c == absl::StatusCode::kInternal || c == absl::StatusCode::kUnknown;
}

}  // namespace

CoordinatorCore::CoordinatorCore(StateStore* store, CoordinatorOptions options)
    : store_(store), options_(options) {
  // keep_latest spares a step directory that a job waiting to start will
  // resume from (called from Commit, under mu_).
  // A queued job records the real path (Submit), the committed step its
  // job's own path: they are compared as real paths.
  // The real path is asked of the file system (under mu_) only where a
  // queued resume exists to compare it with.
  committer_.set_in_use([this](const std::string& step_dir) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::optional<absl::StatusOr<std::string>> real;
    for (const auto& [id, r] : jobs_) {
      const v1::Job& j = r.stored.job;
      if (j.state() != v1::JOB_STATE_PENDING || j.checkpoints_size() > 0 || j.resume_from().empty()) continue;
      if (j.resume_from() == step_dir) return true;
      if (!real) real = RealPath(step_dir, "checkpoint");
      if (real->ok() && j.resume_from() == **real) return true;
    }
    return false;
  });
}

// ---- notification and transitions ------------------------------------------

void CoordinatorCore::Notify(const JobRecord& r) {
  bool watched = false;
  for (auto& [h, w] : watchers_) watched |= w.first == r.stored.job.id();
  if (!watched) return;
  const v1::Job& j = r.stored.job;  // without its history: watchers follow progress, not the whole curve
  for (auto& [h, w] : watchers_) {
    if (w.first == j.id()) w.second(j);
  }
}

absl::Status CoordinatorCore::Transition(JobRecord& r, v1::JobState state, const std::string& message) {
  v1::Job& j = JobOf(r);
  absl::StatusOr<bool> changes = CheckJobTransition(j.state(), state);
  if (!changes.ok()) return absl::Status(changes.status().code(), absl::StrCat("job ", j.id(), ": ", changes.status().message()));
  if (!*changes) return absl::OkStatus();  // a repeat changes nothing
  Log("job_state", {{"job", j.id()}, {"from", JobStateName(j.state())}, {"to", JobStateName(state)},
                    {"attempt", j.attempts_size()}, {"message", message}});
  j.set_state(state);
  if (state == v1::JOB_STATE_RUNNING || state == v1::JOB_STATE_RESTARTING) {
    active_.insert(j.id());
  } else {
    active_.erase(j.id());
  }
  if (!message.empty()) j.set_message(message);
  if (IsFinalJobState(state)) j.clear_stalled();
  if (state != v1::JOB_STATE_RUNNING) j.clear_straggler();
  Persist(r);
  Notify(r);
  if (IsFinalJobState(state) || state == v1::JOB_STATE_RESTARTING) DropStore(r);
  if (IsFinalJobState(state)) RemoveSavesOfEndedJob(j.id());
  return absl::OkStatus();
}

// ---- workers ---------------------------------------------------------------

absl::StatusOr<v1::Registered> CoordinatorCore::RegisterWorker(v1::WorkerInfo info, WorkerChannel* channel) {
  if (absl::Status s = WorkerRegistry::Check(info); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const std::string running = info.job_id();
  const bool proven = !running.empty() && ClaimHolds(running, info.rank(), info.claim_credential());
  WorkerRecord& w = registry_.Add(std::move(info), channel, Now());
  const std::string id = w.info.worker_id();
  Log("worker_joined", {{"worker", id}, {"host", w.info.host()}, {"device", w.info.device()},
                        {"running", running}});
  if (!running.empty()) {
    // It still runs a job this coordinator no longer has running (its
    // session dropped, or the coordinator restarted): stop it; the worker
    // turns idle when it reports back. Only a claim proven with that rank's
    // credential makes the job wait for it (a restart, a delete): anyone
    // with a worker token could claim anyone's job.
    w.info.set_state(v1::WORKER_STATE_BUSY);
    if (proven) {
      w.info.set_job_id(running);
    } else {
      w.unproven_claim = running;
      if (options_.events.refused) options_.events.refused("claim");
    }
    w.info.set_rank(-1);  // of an attempt this coordinator does not run
    v1::CoordinatorMessage m;
    m.mutable_cancel()->set_job_id(running);
    m.mutable_cancel()->set_reason("the coordinator no longer runs this job");
    channel->Send(m);
  }
  v1::Registered reg;
  reg.set_worker_id(id);
  reg.set_heartbeat_interval_ms(static_cast<int>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  v1::CoordinatorMessage m;
  *m.mutable_registered() = reg;
  channel->Send(m);
  Schedule();
  return reg;
}

std::string CoordinatorCore::BlameLink(JobRecord& r) {
  if (r.link_faults.empty()) return r.reported_failure;
  // In a ring that stalls, every rank times out waiting for its left
  // neighbour; the ones downstream of the broken link waited on ranks that
  // were themselves waiting, at a later step or op.
  const v1::RankFinished::Link link =
      *std::min_element(r.link_faults.begin(), r.link_faults.end(), [](const auto& a, const auto& b) {
        return std::make_pair(a.seq(), a.step()) < std::make_pair(b.seq(), b.step());
      });
  const v1::Job& j = JobOf(r);
  // Each end as "host (address)": two workers may give one --host name.
  auto end = [&](int rank) {
    const WorkerRecord* w = registry_.Find(j.worker_ids(rank));
    if (w == nullptr) return std::make_pair(std::string("?"), std::string());
    const std::string& addr = w->info.collective_address();
    return std::make_pair(addr.empty() ? w->info.host() : absl::StrCat(w->info.host(), " (", addr, ")"),
                          WorkerRegistry::Key(w->info));
  };
  const auto [from_host, from_key] = end(link.from_rank());
  const auto [to_host, to_key] = end(link.to_rank());
  // The receiving end sits the next attempts out (either end would do).
  if (!to_key.empty()) r.excluded_workers.insert(to_key);
  return absl::StrFormat("rank %d on host %s cannot reach rank %d on host %s (%s); %s sits out the next attempts",
                         link.from_rank(), from_host, link.to_rank(), to_host, r.reported_failure,
                         to_key.empty() ? "rank " + std::to_string(link.to_rank()) : to_key);
}

bool CoordinatorCore::ClaimHolds(const std::string& job_id, int rank, const std::string& credential) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || credential.empty()) return false;
  for (const auto* held : {&it->second.credentials, &it->second.previous_credentials}) {
    auto c = held->find(rank);
    if (c != held->end() && c->second == credential) return true;
  }
  return false;
}

void CoordinatorCore::WorkerGone(const std::string& id, const std::string& why) {
  absl::MutexLock lock(&mu_);
  LoseWorker(id, why);
}

void CoordinatorCore::LoseWorker(const std::string& id, const std::string& why) {
  const std::optional<v1::WorkerInfo> gone = registry_.Remove(id);
  if (!gone) return;
  const v1::WorkerInfo& info = *gone;
  if (options_.events.worker_lost) options_.events.worker_lost();
  const bool busy = info.state() == v1::WORKER_STATE_BUSY;
  Log("worker_lost", {{"worker", id}, {"host", info.host()}, {"why", why}, {"job", busy ? info.job_id() : ""},
                      {"rank", busy ? info.rank() : -1}});
  if (info.state() != v1::WORKER_STATE_BUSY) return;
  RemoveSavesOfEndedJob(info.job_id());
  auto j = jobs_.find(info.job_id());
  if (j == jobs_.end() || JobOf(j->second).state() != v1::JOB_STATE_RUNNING) return;
  std::string msg = absl::StrFormat("worker lost: rank %d on host %s (%s, %s)", info.rank(), info.host(), id, why);
  if (!j->second.reported_failure.empty()) absl::StrAppend(&msg, "; before that ", j->second.reported_failure);
  FailJob(j->second, msg, id, /*retryable=*/true);
  Schedule();
}

void CoordinatorCore::OnHeartbeat(const std::string& id, const v1::Heartbeat& hb) {
  absl::MutexLock lock(&mu_);
  if (!registry_.Heard(id, Now())) return;
  const v1::WorkerInfo& w = registry_.Find(id)->info;
  if (w.state() != v1::WORKER_STATE_BUSY) return;
  auto j = jobs_.find(w.job_id());
  if (j != jobs_.end() && JobOf(j->second).state() == v1::JOB_STATE_RUNNING) {
    RecordProgress(j->second, w.rank(), hb.step(), hb.last_collective_seq());
  }
}

void CoordinatorCore::RevokeStoreAccess(const JobRecord& r) {
  for (const auto& [rank, credential] : r.credentials) rendezvous_.Revoke(credential);
}

void CoordinatorCore::DropStore(const JobRecord& r) {
  // An attempt's rendezvous keys are of no use to the next one (whose keys
  // would collide with them), nor are its ranks' credentials.
  RevokeStoreAccess(r);
  // Its ranks still in rendezvous stop now, not at their wait's deadline
  // (a restart waits for them).
  rendezvous_.DropJob(r.stored.job.id());
}

CoordinatorCore::JobRecord* CoordinatorCore::RankOfSession(const std::string& worker_id, const std::string& job_id,
                                                           int rank, const char* what) {
  const WorkerRecord* w = registry_.Find(worker_id);
  auto it = jobs_.find(job_id);
  // The session must hold that rank of the running attempt: a worker that
  // reconnects still running an earlier attempt holds none.
  if (w != nullptr && it != jobs_.end() && JobOf(it->second).state() == v1::JOB_STATE_RUNNING &&
      w->info.state() == v1::WORKER_STATE_BUSY && w->info.job_id() == job_id && w->info.rank() == rank &&
      rank >= 0 && rank < JobOf(it->second).worker_ids_size() && JobOf(it->second).worker_ids(rank) == worker_id) {
    return &it->second;
  }
  // A late message about a job that already ended is no attack; a session
  // naming a running (or unknown) job's rank it does not hold is counted.
  const bool ended = it != jobs_.end() && JobOf(it->second).state() != v1::JOB_STATE_RUNNING;
  if (!ended && options_.events.refused) options_.events.refused(what);
  return nullptr;
}

void CoordinatorCore::OnProgress(const std::string& id, const v1::Progress& p) {
  absl::MutexLock lock(&mu_);
  registry_.Heard(id, Now());
  JobRecord* r = RankOfSession(id, p.job_id(), p.rank(), "progress");
  if (!r) return;
  // Progress carries the step only; the collective seq stays what heartbeats said.
  RecordProgress(*r, p.rank(), p.step(), r->progress[p.rank()].seq);
  if (p.rank() != 0) return;
  v1::Job& j = JobOf(*r);
  j.set_step(p.step());
  j.set_loss(p.loss());
  j.set_tokens_per_second(p.tokens_per_second());
  j.set_lr(p.lr());
  j.set_grad_norm(p.grad_norm());
  if (p.has_val_loss()) {
    j.set_val_loss(p.val_loss());
    j.set_val_step(p.step());
  }
  AppendHistory(r->history, p);
  // Progress is persisted at most once a second (by default); states always at once.
  if (Now() - r->last_persist > options_.persist_progress_every) Persist(*r);
  Notify(*r);
}

void CoordinatorCore::AppendHistory(google::protobuf::RepeatedPtrField<v1::StepRecord>& history,
                                    const v1::Progress& p) const {
  auto* h = &history;
  if (!h->empty() && h->Get(h->size() - 1).step() >= p.step()) return;  // said already
  v1::StepRecord* s = h->Add();
  s->set_step(p.step());
  s->set_loss(p.loss());
  s->set_lr(p.lr());
  s->set_grad_norm(p.grad_norm());
  s->set_tokens_per_second(p.tokens_per_second());
  if (p.has_val_loss()) s->set_val_loss(p.val_loss());
  s->set_unix_ms(NowMs());
  if (h->size() <= kMaxHistory) return;
  // Bounded: the older half at half the resolution, the newer half whole.
  google::protobuf::RepeatedPtrField<v1::StepRecord> kept;
  const int half = h->size() / 2;
  for (int i = 0; i < h->size(); ++i) {
    if (i >= half || i % 2 == 0) kept.Add()->Swap(h->Mutable(i));
  }
  h->Swap(&kept);
}

void CoordinatorCore::OnFinished(const std::string& id, const v1::RankFinished& f) {
  absl::MutexLock lock(&mu_);
  JobRecord* held = RankOfSession(id, f.job_id(), f.rank(), "finished");
  WorkerRecord* w = registry_.Find(id);
  auto job = jobs_.find(f.job_id());
  const bool job_ended = job == jobs_.end() || JobOf(job->second).state() != v1::JOB_STATE_RUNNING;
  // The session is free again once its own rank ended, or its job did, or
  // the earlier attempt it was stopping (rank -1: it reconnected still
  // running it), or the job it claimed without proof.
  const bool stopped_old = w != nullptr && w->info.job_id() == f.job_id() && (job_ended || w->info.rank() < 0);
  const bool unproven = w != nullptr && !w->unproven_claim.empty() && w->unproven_claim == f.job_id();
  if (w != nullptr && (held || unproven || stopped_old)) {
    WorkerRegistry::Release(*w);
    if (job_ended) RemoveSavesOfEndedJob(f.job_id());
  }
  if (held) {
    JobRecord& r = *held;
    const std::string host = w != nullptr ? w->info.host() : "?";
    if (f.ok()) {
      r.finished_ranks.insert(f.rank());
      if (static_cast<int>(r.finished_ranks.size()) == JobOf(r).workers()) {
        EndAttempt(r, "finished");
        Transition(r, v1::JOB_STATE_SUCCEEDED, absl::StrFormat("finished %d steps", JobOf(r).step()))
            .IgnoreError();  // held: RUNNING
      }
    } else {
      // The rank's own words: bounded and made printable, since they become
      // the job's message, shown to every user.
      const std::string failure =
          absl::StrFormat("rank %d on host %s failed: %s", f.rank(), host, Printable(f.message(), kMaxRankMessageBytes));
      if (f.has_link() && f.link().from_rank() >= 0 && f.link().from_rank() < JobOf(r).worker_ids_size() &&
          f.link().to_rank() >= 0 && f.link().to_rank() < JobOf(r).worker_ids_size() &&
          f.link().from_rank() != f.link().to_rank() && r.link_faults.size() < 1024) {
        r.link_faults.push_back(f.link());
      }
      if (!IsPeerError(f.code())) {
        // The rank's own error is the root cause, whatever its peers said
        // first; most would recur, and fail the job without a restart.
        FailJob(r, failure, "", IsRetryableOwnError(f.code()));
      } else if (r.reported_failure.empty()) {
        // Held for failure_grace (see CoordinatorOptions): the rank or
        // worker at fault may still speak up. Tick fails the job.
        r.reported_failure = failure;
        const bool connecting = static_cast<int>(r.connected_ranks.size()) < JobOf(r).workers();
        r.fail_at = Now() + (connecting ? std::max(options_.failure_grace, options_.rendezvous_failure_grace)
                                        : options_.failure_grace);
      }
    }
  }
  Schedule();
}

void CoordinatorCore::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  RetryUnsaved(now);
  const absl::Duration lost_after = options_.heartbeat_interval * options_.lost_after_missed;
  for (const std::string& id : registry_.Silent(now, lost_after)) {
    WorkerChannel* ch = registry_.Find(id)->channel;
    LoseWorker(id, absl::StrCat("no heartbeat for ", absl::FormatDuration(lost_after)));
    ch->Close(absl::UnavailableError("heartbeats stopped"));
  }
  UpdateStalls(now);
  // A copy: failing a job changes active_.
  for (const std::string& id : std::vector<std::string>(active_.begin(), active_.end())) {
    JobRecord& r = jobs_.at(id);
    if (JobOf(r).state() == v1::JOB_STATE_RUNNING && !r.reported_failure.empty() && now >= r.fail_at) {
      FailJob(r, BlameLink(r), "", /*retryable=*/true);
    } else if (JobOf(r).state() == v1::JOB_STATE_RESTARTING && now >= r.restart_by) {
      scheduler_.Remove(id);
      FailForGood(r, absl::StrCat("not restarted within [job] restart_timeout (",
                                  absl::FormatDuration(absl::Seconds(r.config.restart.restart_timeout)),
                                  "): ", JobOf(r).message()));
    }
  }
  if (now - last_retire_ >= absl::Seconds(1)) {
    RetireEndedJobs(now);
    last_retire_ = now;
  }
  rendezvous_.ExpireWaits(now);
  Schedule();
}

std::vector<v1::WorkerInfo> CoordinatorCore::ListWorkers() const {
  absl::MutexLock lock(&mu_);
  return registry_.List(Now());
}

absl::StatusOr<v1::Ownership> CoordinatorCore::GetOwnership(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  const JobConfig& c = it->second.config;
  const int world = it->second.stored.job.workers();
  const int g = ShardGroupSize(c, world);
  auto layouts = model::TrainableOwnershipMap(c.model, c.lora, g);
  if (!layouts.ok()) return layouts.status();
  v1::Ownership o;
  o.set_job_id(id);
  o.set_strategy(StrategyName(c.parallelism.strategy));
  o.set_world_size(world);
  o.set_shard_group_size(g);
  for (const ShardLayout& l : *layouts) {
    v1::UnitShards* u = o.add_units();
    u->set_unit(l.unit);
    u->set_numel(l.numel);
    u->set_padded(l.padded_numel);
    u->set_shard(l.shard_numel);
    u->set_group_size(l.group_size);
  }
  return o;
}

absl::StatusOr<int> CoordinatorCore::Watch(const std::string& id, JobCallback cb) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  const int h = next_watch_++;
  cb(it->second.stored.job);
  watchers_[h] = {id, std::move(cb)};
  return h;
}

void CoordinatorCore::Unwatch(int handle) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(handle);
}

}  // namespace shardline
