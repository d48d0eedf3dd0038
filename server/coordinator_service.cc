#include "common/state/job_state.h"
#include "server/coordinator_service.h"

#include "common/base/file_util.h"


#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/base/accepted_token.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/rpc/grpc_status.h"

namespace shardline {
namespace {

// One worker's session: reads its messages into the core, and is the core's
// WorkerChannel for assignments and commands (writes are queued, one in
// flight at a time, as the callback API requires).
class SessionReactor : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>,
                       public WorkerChannel {
 public:
  SessionReactor(CoordinatorCore* core, const absl::Status& auth, std::string peer)
      : core_(core), peer_(std::move(peer)) {
    if (!auth.ok()) {
      Close(auth);
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Gone("session closed");
      Close(absl::OkStatus());
      return;
    }
    absl::Status s = Handle(in_);
    if (!s.ok()) {
      Close(s);
      return;
    }
    StartRead(&in_);
  }

  void Send(const v1::CoordinatorMessage& msg) override {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    out_.push_back(msg);
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    out_.pop_front();
    if (ok && !finishing_ && !out_.empty()) {
      StartWrite(&out_.front());
      return;
    }
    writing_ = false;
    if (finishing_ && !finished_) {
      finished_ = true;
      Finish(final_);
    }
  }

  void Close(const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    finishing_ = true;
    final_ = ToGrpcStatus(why);
    if (!writing_) {
      finished_ = true;
      Finish(final_);
    }
  }

  void OnDone() override {
    Gone("session ended");
    delete this;
  }

 private:
  absl::Status Handle(const v1::WorkerMessage& m) {
    if (m.has_register_()) {
      if (!id_.empty()) return absl::FailedPreconditionError("this session already registered");
      v1::WorkerInfo info = m.register_();
      info.set_peer_address(peer_);
      auto reg = core_->RegisterWorker(std::move(info), this);
      if (!reg.ok()) return reg.status();
      id_ = reg->worker_id();
      return absl::OkStatus();
    }
    if (id_.empty()) return absl::FailedPreconditionError("a worker must register first");
    if (m.has_heartbeat()) core_->OnHeartbeat(id_, m.heartbeat());
    if (m.has_progress()) core_->OnProgress(id_, m.progress());
    if (m.has_finished()) core_->OnFinished(id_, m.finished());
    if (m.has_connected()) core_->OnConnected(id_, m.connected());
    if (m.has_log()) core_->OnLog(id_, m.log());
    return absl::OkStatus();
  }
  void Gone(const std::string& why) {
    if (gone_ || id_.empty()) return;
    gone_ = true;
    core_->WorkerGone(id_, why);
  }

  CoordinatorCore* const core_;
  const std::string peer_;  // grpc's "ipv4:1.2.3.4:port" form
  v1::WorkerMessage in_;
  std::string id_;  // touched only by the read path and OnDone, which never overlap
  bool gone_ = false;
  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
};

// Streams a job's snapshots, always the newest pending one, until it ends.
class WatchReactor : public grpc::ServerWriteReactor<v1::Job> {
 public:
  WatchReactor(CoordinatorCore* core, const std::string& id, const absl::Status& auth) : core_(core) {
    if (!auth.ok()) {
      FinishOnce(ToGrpcStatus(auth));
      return;
    }
    auto h = core_->Watch(id, [this](const v1::Job& j) { Push(j); });
    if (!h.ok()) {
      FinishOnce(ToGrpcStatus(h.status()));
      return;
    }
    absl::MutexLock lock(&mu_);
    handle_ = *h;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    if (IsFinalJobState(current_.state())) return FinishLocked(grpc::Status::OK);
    if (has_pending_) {
      has_pending_ = false;
      current_ = pending_;
      writing_ = true;
      StartWrite(&current_);
    } else if (finish_pending_) {
      FinishLocked(final_);
    }
  }
  void OnCancel() override { FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")); }
  void OnDone() override {
    int h;
    {
      absl::MutexLock lock(&mu_);
      h = handle_;
    }
    if (h) core_->Unwatch(h);
    delete this;
  }

 private:
  void Push(const v1::Job& j) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (writing_) {
      pending_ = j;
      has_pending_ = true;
      return;
    }
    current_ = j;
    writing_ = true;
    StartWrite(&current_);
  }
  void FinishOnce(const grpc::Status& s) {
    absl::MutexLock lock(&mu_);
    if (writing_) {
      finish_pending_ = true;
      final_ = s;
      return;
    }
    FinishLocked(s);
  }
  void FinishLocked(const grpc::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(s);
  }

  CoordinatorCore* const core_;
  absl::Mutex mu_;
  int handle_ ABSL_GUARDED_BY(mu_) = 0;
  v1::Job current_ ABSL_GUARDED_BY(mu_), pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false, has_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false, finish_pending_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
};

// The call's bearer token ("authorization: Bearer <token>"); empty if none.
absl::string_view BearerOf(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return {};
  absl::string_view header(it->second.data(), it->second.size());
  return absl::ConsumePrefix(&header, "Bearer ") ? header : absl::string_view();
}

// Job.owner of a token: its SHA-256 in hex (the record never holds a token).
std::string OwnerHash(absl::string_view token) { return Sha256Hex(token); }

absl::Time WaitDeadline(grpc::CallbackServerContext* ctx, int64_t timeout_ms) {
  absl::Time d = absl::Now() + absl::Milliseconds(timeout_ms > 0 ? timeout_ms : 0);
  const absl::Time client = absl::FromChrono(ctx->deadline());
  return std::min(d, client);
}

}  // namespace

void CoordinatorService::SetTokens(AcceptedTokens tokens) {
  absl::MutexLock lock(&tokens_mu_);
  tokens_ = std::move(tokens);
  HashOwners();
}

void CoordinatorService::HashOwners() {
  owner_hashes_.clear();
  for (const std::string& t : tokens_.user) owner_hashes_.push_back(OwnerHash(t));
}

absl::Status CoordinatorService::Authorize(grpc::CallbackServerContext* ctx, Role role, const char* method) const {
  absl::MutexLock lock(&tokens_mu_);
  if (tokens_.user.empty() && tokens_.worker.empty()) return absl::OkStatus();
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return absl::UnauthenticatedError("missing token (authorization: Bearer <token>)");
  absl::string_view header(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&header, "Bearer ")) return absl::UnauthenticatedError("wrong token");
  // Without worker tokens, the user tokens serve both roles.
  const std::vector<std::string>& workers = tokens_.worker.empty() ? tokens_.user : tokens_.worker;
  const bool user = TokenAccepted(header, tokens_.user), worker = TokenAccepted(header, workers);
  if (role == Role::kUser ? user : worker) return absl::OkStatus();
  if (!user && !worker) return absl::UnauthenticatedError("wrong token");
  core_->CountRefused("role");
  return absl::PermissionDeniedError(absl::StrCat("a ", role == Role::kUser ? "worker" : "user", " token may not call ",
                                                  method, " (it takes a ", role == Role::kUser ? "user" : "worker",
                                                  " token)"));
}

std::string CoordinatorService::OwnerOf(const grpc::CallbackServerContext* ctx) const {
  absl::MutexLock lock(&tokens_mu_);
  if (tokens_.user.empty() && tokens_.worker.empty()) return "";
  return OwnerHash(BearerOf(ctx));
}

bool CoordinatorService::OwnedByAnother(const std::string& caller, const std::string& owner) const {
  if (owner.empty()) return false;  // submitted without authentication
  if (caller.empty() || caller == owner) return false;
  // A job whose token was rotated out would otherwise belong to nobody.
  absl::MutexLock lock(&tokens_mu_);
  return std::find(owner_hashes_.begin(), owner_hashes_.end(), owner) != owner_hashes_.end();
}

absl::Status CoordinatorService::CheckOwner(const grpc::CallbackServerContext* ctx, const std::string& job_id,
                                            const char* verb) const {
  absl::StatusOr<std::string> owner = core_->OwnerOfJob(job_id);
  if (!owner.ok()) return owner.status();
  if (!OwnedByAnother(OwnerOf(ctx), *owner)) return absl::OkStatus();
  core_->CountRefused("owner");
  return absl::PermissionDeniedError(absl::StrCat("job ", job_id, " belongs to another user: only the token that "
                                                  "submitted it may ", verb));
}

grpc::ServerUnaryReactor* CoordinatorService::Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  auto* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(s));
  return r;
}

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* CoordinatorService::WorkerSession(
    grpc::CallbackServerContext* ctx) {
  return new SessionReactor(core_, Authorize(ctx, Role::kWorker, "WorkerSession"), ctx->peer());
}

grpc::ServerWriteReactor<v1::Job>* CoordinatorService::WatchJob(grpc::CallbackServerContext* ctx,
                                                                const v1::WatchJobRequest* req) {
  absl::Status allowed = Authorize(ctx, Role::kUser, "WatchJob");
  if (allowed.ok()) allowed = CheckOwner(ctx, req->job_id(), "watch it");
  return new WatchReactor(core_, req->job_id(), allowed);
}

#define SL_AUTHORIZE(ctx, role)                                     \
  do {                                                              \
    absl::Status _auth = Authorize(ctx, Role::role, __func__);      \
    if (!_auth.ok()) return Done((ctx), _auth);                     \
  } while (0)

namespace {
// A rank's job-scoped credential (Assignment.credential), if the call carries one.
std::string CredentialOf(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("x-shardline-credential");
  return it == md.end() ? "" : std::string(it->second.data(), it->second.size());
}
}  // namespace

// Every store call: the bearer token, then the rank's credential for its job's keys.
#define SL_AUTHORIZE_STORE(ctx, keys)                                       \
  do {                                                                      \
    SL_AUTHORIZE(ctx, kWorker);                                             \
    absl::Status _store = core_->AuthorizeStore(CredentialOf(ctx), keys);   \
    if (!_store.ok()) return Done((ctx), _store);                           \
  } while (0)

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* ctx,
                                                        const v1::SubmitJobRequest* req,
                                                        v1::SubmitJobResponse* resp) {
  SL_AUTHORIZE(ctx, kUser);
  // A resume reads the weights of the job whose checkpoint it names and
  // writes beside them: that job's owner's call. (A step directory that is
  // no job's, a copy, is read with the workers' permissions.) The path is
  // resolved once, here: the check, the job's record and its workers all
  // use the real path, which the core and the workers check again is still
  // its own (a link swapped in later leads nowhere else).
  v1::SubmitJobRequest resolved = *req;
  if (!req->resume_from().empty() && req->resume_from().size() <= CoordinatorCore::kMaxPathBytes) {
    absl::StatusOr<std::string> real = RealPath(req->resume_from(), "resume_from");
    if (!real.ok()) return Done(ctx, real.status());
    resolved.set_resume_from(*real);
    absl::StatusOr<std::string> from = core_->JobOfCheckpoint(*real);
    if (from.ok() && !from->empty()) {
      if (absl::Status mine = CheckOwner(ctx, *from, "resume from its checkpoints"); !mine.ok()) {
        return Done(ctx, mine);
      }
    }
  }
  auto id = core_->Submit(resolved, OwnerOf(ctx));
  if (!id.ok()) return Done(ctx, id.status());
  resp->set_job_id(*id);
  if (absl::StatusOr<v1::Job> job = core_->GetJob(*id); job.ok()) resp->set_steps(job->steps());
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                                     v1::Job* resp) {
  SL_AUTHORIZE(ctx, kUser);
  if (absl::Status mine = CheckOwner(ctx, req->job_id(), "read its spec and status"); !mine.ok()) {
    return Done(ctx, mine);
  }
  auto j = core_->GetJob(req->job_id(), req->history());
  if (j.ok()) *resp = *j;
  return Done(ctx, j.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* ctx,
                                                       const v1::ListJobsRequest* req, v1::ListJobsResponse* resp) {
  SL_AUTHORIZE(ctx, kUser);
  // Pages bound every response, however many jobs there are; the token is
  // the index of the page's first job in the oldest-first list.
  const int size = req->page_size() == 0 ? 100 : req->page_size();
  if (size < 1 || size > 1000) return Done(ctx, absl::InvalidArgumentError("page_size must be in [1, 1000]"));
  uint64_t first = 0;
  if (!req->page_token().empty() && !absl::SimpleAtoi(req->page_token(), &first)) {
    return Done(ctx, absl::InvalidArgumentError("page_token: not a token this coordinator gave"));
  }
  size_t total = 0;
  std::vector<v1::Job> jobs = core_->ListJobs(first, static_cast<size_t>(size), &total);
  const std::string caller = OwnerOf(ctx);  // once: a SHA-256 of the token
  for (v1::Job& job : jobs) {
    v1::Job* j = resp->add_jobs();
    *j = std::move(job);
    // Everyone sees the queue (as squeue shows every job); another user's
    // job without where its files are.
    if (OwnedByAnother(caller, j->owner())) {
      j->clear_base_dir();
      j->clear_resume_from();
      j->clear_checkpoint_root();
      j->clear_checkpoints();
    }
  }
  // No sum that can wrap: a token near 2^64 is past the end, an empty page.
  if (first < total && static_cast<uint64_t>(size) < total - first) {
    resp->set_next_page_token(std::to_string(first + size));
  }
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* ctx,
                                                        const v1::CancelJobRequest* req, v1::Job* resp) {
  SL_AUTHORIZE(ctx, kUser);
  if (absl::Status mine = CheckOwner(ctx, req->job_id(), "cancel it"); !mine.ok()) return Done(ctx, mine);
  auto j = core_->Cancel(req->job_id());
  if (j.ok()) *resp = *j;
  return Done(ctx, j.status());
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                        const v1::DeleteJobRequest* req, v1::DeleteJobResponse* resp) {
  SL_AUTHORIZE(ctx, kUser);
  if (absl::Status mine = CheckOwner(ctx, req->job_id(), "delete it"); !mine.ok()) return Done(ctx, mine);
  absl::StatusOr<int> removed = core_->Delete(req->job_id(), req->checkpoints());
  if (removed.ok()) resp->set_removed_checkpoints(*removed);
  return Done(ctx, removed.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* ctx,
                                                          const v1::ListWorkersRequest*,
                                                          v1::ListWorkersResponse* resp) {
  SL_AUTHORIZE(ctx, kUser);
  for (auto& w : core_->ListWorkers()) *resp->add_workers() = std::move(w);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::GetOwnership(grpc::CallbackServerContext* ctx,
                                                           const v1::GetOwnershipRequest* req, v1::Ownership* resp) {
  SL_AUTHORIZE(ctx, kUser);
  if (absl::Status mine = CheckOwner(ctx, req->job_id(), "read its shards"); !mine.ok()) return Done(ctx, mine);
  auto o = core_->GetOwnership(req->job_id());
  if (o.ok()) *resp = *o;
  return Done(ctx, o.status());
}

grpc::ServerUnaryReactor* CoordinatorService::StoreSet(grpc::CallbackServerContext* ctx,
                                                       const v1::StoreSetRequest* req, v1::StoreSetResponse*) {
  SL_AUTHORIZE_STORE(ctx, {req->key()});
  return Done(ctx, core_->StoreSet(req->key(), req->value()));
}

grpc::ServerUnaryReactor* CoordinatorService::StoreGet(grpc::CallbackServerContext* ctx,
                                                       const v1::StoreGetRequest* req, v1::StoreGetResponse* resp) {
  SL_AUTHORIZE_STORE(ctx, {req->key()});
  auto* r = ctx->DefaultReactor();
  core_->StoreWait({req->key()}, WaitDeadline(ctx, req->timeout_ms()),
                   [r, resp](const absl::Status& s, const std::vector<std::string>& values) {
                     if (s.ok()) resp->set_value(values[0]);
                     r->Finish(ToGrpcStatus(s));
                   },
                   [ctx] { return ctx->IsCancelled(); });
  return r;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreAdd(grpc::CallbackServerContext* ctx,
                                                       const v1::StoreAddRequest* req, v1::StoreAddResponse* resp) {
  SL_AUTHORIZE_STORE(ctx, {req->key()});
  absl::StatusOr<int64_t> v = core_->StoreAdd(req->key(), req->delta());
  if (v.ok()) resp->set_value(*v);
  return Done(ctx, v.status());
}

grpc::ServerUnaryReactor* CoordinatorService::StoreWait(grpc::CallbackServerContext* ctx,
                                                        const v1::StoreWaitRequest* req, v1::StoreWaitResponse*) {
  SL_AUTHORIZE_STORE(ctx, std::vector<std::string>(req->keys().begin(), req->keys().end()));
  auto* r = ctx->DefaultReactor();
  core_->StoreWait({req->keys().begin(), req->keys().end()}, WaitDeadline(ctx, req->timeout_ms()),
                   [r](const absl::Status& s, const std::vector<std::string>&) { r->Finish(ToGrpcStatus(s)); },
                   [ctx] { return ctx->IsCancelled(); });
  return r;
}

grpc::ServerUnaryReactor* CoordinatorService::StoreCheck(grpc::CallbackServerContext* ctx,
                                                         const v1::StoreCheckRequest* req,
                                                         v1::StoreCheckResponse* resp) {
  SL_AUTHORIZE_STORE(ctx, std::vector<std::string>(req->keys().begin(), req->keys().end()));
  resp->set_ready(core_->StoreCheck({req->keys().begin(), req->keys().end()}));
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::StoreDelete(grpc::CallbackServerContext* ctx,
                                                          const v1::StoreDeleteRequest* req,
                                                          v1::StoreDeleteResponse* resp) {
  SL_AUTHORIZE_STORE(ctx, {req->key()});
  resp->set_deleted(core_->StoreDelete(req->key()));
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::ReportCheckpoint(grpc::CallbackServerContext* ctx,
                                                               const v1::CheckpointReport* req,
                                                               v1::CheckpointReportResponse*) {
  SL_AUTHORIZE(ctx, kWorker);
  // The core refuses (and counts) a report without the rank's credential of
  // the running attempt, then any file but that rank's own of that attempt.
  return Done(ctx, core_->ReportCheckpoint(*req, CredentialOf(ctx)));
}

grpc::ServerUnaryReactor* CoordinatorService::CheckpointNow(grpc::CallbackServerContext* ctx,
                                                            const v1::CheckpointNowRequest* req,
                                                            v1::CheckpointNowResponse*) {
  SL_AUTHORIZE(ctx, kUser);
  // A save costs the owner's job time and disk: the owner's call, as cancel is.
  if (absl::Status mine = CheckOwner(ctx, req->job_id(), "checkpoint it"); !mine.ok()) return Done(ctx, mine);
  return Done(ctx, core_->CheckpointNow(req->job_id()));
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(grpc::CallbackServerContext* ctx,
                                                              const v1::ListCheckpointsRequest* req,
                                                              v1::ListCheckpointsResponse* resp) {
  SL_AUTHORIZE(ctx, kUser);
  if (absl::Status mine = CheckOwner(ctx, req->job_id(), "list its checkpoints"); !mine.ok()) return Done(ctx, mine);
  auto list = core_->ListCheckpoints(req->job_id());
  if (list.ok()) {
    for (auto& c : *list) *resp->add_checkpoints() = std::move(c);
  }
  return Done(ctx, list.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetLogs(grpc::CallbackServerContext* ctx, const v1::GetLogsRequest* req,
                                                      v1::GetLogsResponse* resp) {
  SL_AUTHORIZE(ctx, kUser);
  if (absl::Status mine = CheckOwner(ctx, req->job_id(), "read its logs"); !mine.ok()) return Done(ctx, mine);
  auto logs = core_->GetLogs(req->job_id(), req->rank(), req->after_seq());
  if (logs.ok()) *resp = *std::move(logs);
  return Done(ctx, logs.status());
}

}  // namespace shardline
