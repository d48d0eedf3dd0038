// CoordinatorService: the gRPC (callback API) adapter over CoordinatorCore.
// It authenticates, converts messages, and maps absl::Status to grpc::Status
// (common/grpc_status.h); the behaviour lives in the core.
//
// Authentication: with a token configured, every Coordinator RPC must carry
// "authorization: Bearer <token>" or is refused with UNAUTHENTICATED. The
// standard health and reflection services stay open for probes.
#pragma once

#include <string>

#include "server/coordinator_core.h"
#include "shardline/v1/shardline.grpc.pb.h"

namespace shardline {

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  CoordinatorService(CoordinatorCore* core, std::string token) : core_(core), token_(std::move(token)) {}

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

 private:
  absl::Status Authorize(grpc::CallbackServerContext* ctx) const;
  // Finishes a unary call with `s` (after authorization was checked).
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s);

  CoordinatorCore* const core_;
  const std::string token_;
};

}  // namespace shardline
