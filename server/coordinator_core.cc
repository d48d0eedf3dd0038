#include "server/coordinator_core.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_manifest.h"
#include "common/job_state.h"
#include "common/model_shapes.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "common/weight_source.h"

namespace shardline {

namespace {


bool IsIpLiteral(const std::string& text) {
  unsigned char buf[16];
  return inet_pton(AF_INET, text.c_str(), buf) == 1 || inet_pton(AF_INET6, text.c_str(), buf) == 1;
}

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
    : store_(store), options_(options) {}

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
    if (row.job_read && !v1::JobState_IsValid(r.stored.job.state())) {
      problem = absl::StrCat(store_->path(), ": the row of ", Quoted(row.id), " (seq ", row.seq, "): its state ",
                             static_cast<int>(r.stored.job.state()), " is not a job state");
    }
    if (problem.empty()) {
      auto cfg = ParseJobSpec(r.stored.spec_toml, r.stored.job.name(), r.stored.base_dir);
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
    // A record written before JobState holds the state's name.
    if (j.state() == v1::JOB_STATE_UNSPECIFIED) {
      absl::StatusOr<v1::JobState> legacy = ParseJobState(j.legacy_state());
      j.set_state(legacy.ok() ? *legacy : v1::JOB_STATE_FAILED);
      if (!legacy.ok()) j.set_message(absl::StrCat("the state record is unreadable: ", legacy.status().message()));
      j.clear_legacy_state();
      Persist(it->second);
    }
    if (ckpts->size() != listed && j.state() != v1::JOB_STATE_RUNNING) Persist(it->second);
    if (j.state() == v1::JOB_STATE_RUNNING || j.state() == v1::JOB_STATE_RESTARTING) active_.insert(id);
    if (j.state() == v1::JOB_STATE_RUNNING) {
      // Its ranks are told to stop as they reconnect; it starts again once they are back.
      FailJob(it->second, "the coordinator restarted while the job was running", "", /*retryable=*/true);
    } else if (j.state() == v1::JOB_STATE_RESTARTING) {
      Restart(it->second, j.message());  // a repeat: restarts its clocks and queues it
    } else if (j.state() == v1::JOB_STATE_PENDING) {
      queue_.push_back({id});
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
  std::string cause(s.message().substr(0, kMaxUnsavedNoteBytes - kUnsavedNoteSize - 1));
  std::replace(cause.begin(), cause.end(), ']', ')');
  absl::StrAppend(JobOf(r).mutable_message(), kUnsavedNote, cause, "]");
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
  return put;
}

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
  if (info.host().empty() || info.device().empty()) {
    return absl::InvalidArgumentError("register: a worker must name its host and device");
  }
  // Every string of a worker is listed to every user (`shardctl workers`,
  // `status`, job messages): bounded and printable where it enters, so no
  // worker can write to a user's terminal or grow a listing past a message.
  absl::Status text = CheckWorkerText("host", info.host(), kMaxHostBytes);
  if (text.ok()) text = CheckWorkerText("device", info.device(), kMaxDeviceBytes);
  if (text.ok()) text = CheckWorkerText("job_id", info.job_id(), kMaxDeviceBytes);
  if (text.ok() && info.capabilities_size() > kMaxCapabilities) {
    text = absl::InvalidArgumentError(absl::StrCat("register: more than ", kMaxCapabilities, " capabilities"));
  }
  for (const std::string& c : info.capabilities()) {
    if (text.ok()) text = CheckWorkerText("capability", c, kMaxDeviceBytes);
  }
  if (!text.ok()) return text;
  // Shown to every user and dialled by peers: an IP literal or nothing.
  if (!info.collective_address().empty() && !IsIpLiteral(info.collective_address())) {
    return absl::InvalidArgumentError(absl::StrCat("register: collective_address ", Quoted(info.collective_address()),
                                                   " is not an IP address"));
  }
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrFormat("w-%d", next_worker_++);
  const std::string running = info.job_id();
  const bool proven = !running.empty() && ClaimHolds(running, info.rank(), info.claim_credential());
  info.clear_claim_credential();
  info.set_worker_id(id);
  info.set_state(v1::WORKER_STATE_IDLE);
  info.clear_job_id();
  info.set_rank(0);
  ++registry_version_;
  WorkerRecord& w = workers_[id];
  w.info = info;
  w.channel = channel;
  w.last_heartbeat = Now();
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

absl::Status CoordinatorCore::CheckWorkerText(const char* field, const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes && IsPrintable(text)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("register: ", field, " ", Quoted(text), ": at most ", max_bytes,
                                                 " bytes of printable text"));
}

std::string CoordinatorCore::WorkerKey(const v1::WorkerInfo& w) { return absl::StrCat(w.host(), "/", w.device()); }

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
  auto end = [&](int rank) {
    auto w = workers_.find(j.worker_ids(rank));
    return w == workers_.end() ? std::make_pair(std::string("?"), std::string())
                               : std::make_pair(w->second.info.host(), WorkerKey(w->second.info));
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
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  const v1::WorkerInfo info = it->second.info;
  workers_.erase(it);
  ++registry_version_;
  if (options_.events.worker_lost) options_.events.worker_lost();
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
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.last_heartbeat = Now();
  const v1::WorkerInfo& w = it->second.info;
  if (w.state() != v1::WORKER_STATE_BUSY) return;
  auto j = jobs_.find(w.job_id());
  if (j != jobs_.end() && JobOf(j->second).state() == v1::JOB_STATE_RUNNING) {
    RecordProgress(j->second, w.rank(), hb.step(), hb.last_collective_seq());
  }
}

void CoordinatorCore::RevokeStoreAccess(const JobRecord& r) {
  for (const auto& [rank, credential] : r.credentials) credential_jobs_.erase(credential);
}

void CoordinatorCore::DropStore(const JobRecord& r) {
  // An attempt's rendezvous keys are of no use to the next one (whose keys
  // would collide with them), nor are its ranks' credentials.
  RevokeStoreAccess(r);
  const std::string prefix = r.stored.job.id() + "/";
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.rfind(prefix, 0) == 0;) it = EraseKv(it);
  // Its ranks still in rendezvous stop now, not at their wait's deadline
  // (a restart waits for them).
  std::vector<Waiter> keep;
  for (Waiter& w : waiters_) {
    if (!w.keys.empty() && w.keys[0].rfind(prefix, 0) == 0) {
      EndWait(w, absl::AbortedError(absl::StrCat("store: ", r.stored.job.id(), "'s attempt ended")), {});
    } else {
      keep.push_back(std::move(w));
    }
  }
  waiters_ = std::move(keep);
}

CoordinatorCore::JobRecord* CoordinatorCore::RankOfSession(const std::string& worker_id, const std::string& job_id,
                                                           int rank, const char* what) {
  auto w = workers_.find(worker_id);
  auto it = jobs_.find(job_id);
  // The session must hold that rank of the running attempt: a worker that
  // reconnects still running an earlier attempt holds none.
  if (w != workers_.end() && it != jobs_.end() && JobOf(it->second).state() == v1::JOB_STATE_RUNNING &&
      w->second.info.state() == v1::WORKER_STATE_BUSY && w->second.info.job_id() == job_id &&
      w->second.info.rank() == rank && rank >= 0 && rank < JobOf(it->second).worker_ids_size() &&
      JobOf(it->second).worker_ids(rank) == worker_id) {
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
  auto w = workers_.find(id);
  if (w != workers_.end()) w->second.last_heartbeat = Now();
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
  auto w = workers_.find(id);
  auto job = jobs_.find(f.job_id());
  const bool job_ended = job == jobs_.end() || JobOf(job->second).state() != v1::JOB_STATE_RUNNING;
  // The session is free again once its own rank ended, or its job did, or
  // the earlier attempt it was stopping (rank -1: it reconnected still
  // running it), or the job it claimed without proof.
  const bool stopped_old = w != workers_.end() && w->second.info.job_id() == f.job_id() &&
                           (job_ended || w->second.info.rank() < 0);
  const bool unproven = w != workers_.end() && !w->second.unproven_claim.empty() &&
                        w->second.unproven_claim == f.job_id();
  if (w != workers_.end() && (held || unproven || stopped_old)) {
    w->second.info.set_state(v1::WORKER_STATE_IDLE);
    w->second.info.clear_job_id();
    w->second.info.set_rank(0);
    w->second.unproven_claim.clear();
    if (job_ended) RemoveSavesOfEndedJob(f.job_id());
  }
  if (held) {
    JobRecord& r = *held;
    const std::string host = w != workers_.end() ? w->second.info.host() : "?";
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
        r.fail_at = Now() + options_.failure_grace;
      }
    }
  }
  Schedule();
}

void CoordinatorCore::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  const absl::Duration lost_after = options_.heartbeat_interval * options_.lost_after_missed;
  std::vector<std::string> silent;
  for (auto& [id, w] : workers_) {
    if (now - w.last_heartbeat > lost_after) silent.push_back(id);
  }
  for (const std::string& id : silent) {
    WorkerChannel* ch = workers_.at(id).channel;
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
      Dequeue(id);
      FailForGood(r, absl::StrCat("not restarted within [job] restart_timeout (",
                                  absl::FormatDuration(absl::Seconds(r.config.restart.restart_timeout)),
                                  "): ", JobOf(r).message()));
    }
  }
  if (now - last_retire_ >= absl::Seconds(1)) {
    RetireEndedJobs(now);
    last_retire_ = now;
  }
  std::vector<Waiter> keep;
  for (Waiter& w : waiters_) {
    if (now >= w.deadline) {
      EndWait(w, absl::DeadlineExceededError(absl::StrCat("store wait for ", w.keys.empty() ? "" : w.keys[0],
                                                          " timed out")),
              {});
    } else if (w.cancelled && w.cancelled()) {
      EndWait(w, absl::CancelledError("store wait: the caller cancelled"), {});
    } else {
      keep.push_back(std::move(w));
    }
  }
  waiters_ = std::move(keep);
  Schedule();
}

// ---- jobs ----------------------------------------------------------------------

absl::StatusOr<JobConfig> CoordinatorCore::ParseAndValidate(const v1::SubmitJobRequest& req, int* workers) const {
  const std::string source = req.source().empty() ? "job" : req.source();
  auto cfg = ParseJobSpec(req.spec_toml(), source, req.base_dir());
  if (!cfg.ok()) return cfg.status();
  *workers = req.workers() > 0 ? req.workers() : cfg->workers;
  absl::Status s = ValidateJobConfig(*cfg, *workers, source);
  if (!s.ok()) return s;
  if (!req.resume_from().empty()) {
    auto m = ReadManifest(req.resume_from());
    if (!m.ok()) return m.status();
    absl::Status same = CheckSameTraining(*m, *cfg, req.resume_from());
    if (!same.ok()) return same;
  }
  s = CheckJobFiles(*cfg, req.base_dir(), source);
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
  auto cfg = ParseAndValidate(req, &workers);
  if (!cfg.ok()) return cfg.status();
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat("the queue already holds ", queue_.size(),
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
  j.set_strategy(StrategyName(cfg->parallelism.strategy));
  j.set_created_unix_ms(NowMs());
  j.set_message(absl::StrFormat("waiting for %d idle workers", workers));
  j.set_base_dir(req.base_dir());
  j.set_resume_from(req.resume_from());
  j.set_owner(owner);
  j.set_base_digest(cfg->lora.base_digest);
  j.set_checkpoint_root(root + "/" + id);
  // A job the coordinator cannot record is not taken: it would be gone at
  // the next start, and its checkpoints could never be committed.
  if (absl::Status saved = PersistOrError(r); !saved.ok()) {
    return absl::Status(saved.code(), absl::StrCat("job not accepted: the coordinator could not save its state: ",
                                                   saved.message()));
  }
  jobs_.emplace(id, std::move(r));
  queue_.push_back({id});
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
    Dequeue(id);
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
  for (const auto& [wid, w] : workers_) {
    if (w.info.job_id() == id) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, ": rank ", w.info.rank(), " on ", w.info.host(), " is still stopping; try again"));
    }
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
    r.ckpt_reports.clear();
    RemoveInterruptedSaves(r, INT64_MAX);
    ::unlink((JobOf(r).checkpoint_root() + "/history.jsonl").c_str());  // rank 0's per-step record
    ::rmdir(JobOf(r).checkpoint_root().c_str());  // only if nothing else is left in it
  }
  for (auto w = watchers_.begin(); w != watchers_.end();) {
    w = w->second.first == id ? watchers_.erase(w) : std::next(w);
  }
  log_bytes_ -= r.log_bytes;
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

std::vector<v1::WorkerInfo> CoordinatorCore::ListWorkers() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  const absl::Time now = Now();
  for (const auto& [id, w] : workers_) {
    out.push_back(w.info);
    out.back().set_heartbeat_age_seconds(absl::ToDoubleSeconds(now - w.last_heartbeat));
  }
  return out;
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
