// CoordinatorService: the gRPC (callback API) adapter over CoordinatorCore.
// It authenticates, converts messages, and maps absl::Status to grpc::Status
// (common/rpc/grpc_status.h); the behaviour lives in the core.
//
// Authentication and roles: with tokens configured, every Coordinator RPC
// must carry "authorization: Bearer <token>" or is refused with
// UNAUTHENTICATED. A user token submits, reads, cancels and deletes jobs and
// asks for checkpoints; a worker token opens worker sessions, uses the
// rendezvous store and reports checkpoints. A token of the other role is
// refused with PERMISSION_DENIED (counted as refused "role"). The standard
// health and reflection services stay open for probes.
//
// Ownership: a job records the SHA-256 of the user token that submitted it
// (Job.owner); only that token cancels or deletes it (PERMISSION_DENIED,
// counted as refused "owner"). A job submitted without authentication, or
// whose owner's token is no longer accepted (rotated out), any user may.
//
// Thread-safe; SetTokens may be called at any time (SIGHUP).
#pragma once

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator_core.h"
#include "shardline/v1/shardline.grpc.pb.h"

namespace shardline {

enum class Role { kUser, kWorker };

struct AcceptedTokens {
  std::vector<std::string> user;    // empty, with `worker` empty: no authentication
  std::vector<std::string> worker;  // empty: the user tokens serve workers too
};

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  CoordinatorService(CoordinatorCore* core, AcceptedTokens tokens) : core_(core), tokens_(std::move(tokens)) {
    absl::MutexLock lock(&tokens_mu_);
    HashOwners();
  }
  // The tokens accepted from now on (a rotation); calls already authorized
  // and open worker sessions are not affected.
  void SetTokens(AcceptedTokens tokens) ABSL_LOCKS_EXCLUDED(tokens_mu_);

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* WorkerSession(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx, const v1::SubmitJobRequest* req,
                                      v1::SubmitJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx, const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override;
  grpc::ServerWriteReactor<v1::Job>* WatchJob(grpc::CallbackServerContext* ctx,
                                              const v1::WatchJobRequest* req) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx, const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;
  grpc::ServerUnaryReactor* GetOwnership(grpc::CallbackServerContext* ctx, const v1::GetOwnershipRequest* req,
                                         v1::Ownership* resp) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* ctx, const v1::StoreSetRequest* req,
                                     v1::StoreSetResponse* resp) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* ctx, const v1::StoreGetRequest* req,
                                     v1::StoreGetResponse* resp) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* ctx, const v1::StoreAddRequest* req,
                                     v1::StoreAddResponse* resp) override;
  grpc::ServerUnaryReactor* StoreWait(grpc::CallbackServerContext* ctx, const v1::StoreWaitRequest* req,
                                      v1::StoreWaitResponse* resp) override;
  grpc::ServerUnaryReactor* StoreCheck(grpc::CallbackServerContext* ctx, const v1::StoreCheckRequest* req,
                                       v1::StoreCheckResponse* resp) override;
  grpc::ServerUnaryReactor* StoreDelete(grpc::CallbackServerContext* ctx, const v1::StoreDeleteRequest* req,
                                        v1::StoreDeleteResponse* resp) override;
  grpc::ServerUnaryReactor* ReportCheckpoint(grpc::CallbackServerContext* ctx, const v1::CheckpointReport* req,
                                             v1::CheckpointReportResponse* resp) override;
  grpc::ServerUnaryReactor* CheckpointNow(grpc::CallbackServerContext* ctx, const v1::CheckpointNowRequest* req,
                                          v1::CheckpointNowResponse* resp) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* req,
                                            v1::ListCheckpointsResponse* resp) override;
  grpc::ServerUnaryReactor* GetLogs(grpc::CallbackServerContext* ctx, const v1::GetLogsRequest* req,
                                    v1::GetLogsResponse* resp) override;

 private:
  // OK if the call's bearer token is one of `role`'s; `method` names the
  // call in the refusal.
  absl::Status Authorize(grpc::CallbackServerContext* ctx, Role role, const char* method) const
      ABSL_LOCKS_EXCLUDED(tokens_mu_);
  // The Job.owner of a submit by this call: empty without authentication.
  std::string OwnerOf(const grpc::CallbackServerContext* ctx) const ABSL_LOCKS_EXCLUDED(tokens_mu_);
  // Ownership: a job submitted with a user token belongs to that token. Only
  // it may cancel, delete, checkpoint, read (spec, status, logs, checkpoint
  // list, shards), watch or resume the job; every user token lists every
  // job, another user's without its paths. A job submitted without
  // authentication, or whose owner's token was rotated out, is anyone's.
  // Whether `owner` (a Job.owner) is another user than `caller` (OwnerOf
  // the call).
  bool OwnedByAnother(const std::string& caller, const std::string& owner) const
      ABSL_LOCKS_EXCLUDED(tokens_mu_);
  // OK if this call may `verb` job `job_id`; PermissionDenied (counted as
  // "owner") if it is another user's; NotFound if there is no such job.
  absl::Status CheckOwner(const grpc::CallbackServerContext* ctx, const std::string& job_id, const char* verb) const
      ABSL_LOCKS_EXCLUDED(tokens_mu_);
  void HashOwners() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tokens_mu_);
  // Finishes a unary call with `s` (after authorization was checked).
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s);

  CoordinatorCore* const core_;
  mutable absl::Mutex tokens_mu_;
  AcceptedTokens tokens_ ABSL_GUARDED_BY(tokens_mu_);
  // OwnerHash of each accepted user token: the owners a job can have now.
  std::vector<std::string> owner_hashes_ ABSL_GUARDED_BY(tokens_mu_);
};

}  // namespace shardline
