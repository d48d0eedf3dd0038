// WorkerDaemon: one worker's life. It keeps a session with the coordinator
// (reconnecting with capped exponential backoff), heartbeats, runs the job it
// is assigned with the Engine on a job thread, streams per-step progress,
// stops within one step on cancel, and reports back so it returns to idle.
//
// Threads: the session thread reads commands; a heartbeat thread; at most one
// job thread. Writes to the session stream are serialised by one mutex.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardline/v1/shardline.grpc.pb.h"

namespace shardline {

struct ShardSnapshot;  // worker/checkpoint/checkpoint.h
class WorkerMetrics;   // worker/worker_metrics.h

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:50051";
  std::string device = "cpu";
  std::string token;
  std::string host;  // defaults to the machine's hostname
  int threads = 1;   // intra-op threads for the engine
  absl::Duration collective_timeout = absl::Seconds(30);
  double peak_flops = 0;  // one device's peak FLOP/s for MFU; 0 = DefaultPeakFlops
  // Where the worker's metrics go (served or not); required.
  std::shared_ptr<WorkerMetrics> metrics;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

class WorkerDaemon {
 public:
  explicit WorkerDaemon(WorkerOptions options);
  ~WorkerDaemon();
  // Runs sessions until Stop(); returns the reason it stopped.
  absl::Status Run();
  void Stop();
  // After Stop: waits up to `timeout` for a running job to wind down (it
  // stops at the next step, or when a collective with a stopped peer fails).
  bool WaitForJob(absl::Duration timeout);

 private:
  absl::Status RunSession();
  void HandleCommand(const v1::CoordinatorMessage& m);
  void RunJob(v1::Assignment a);
  absl::Status TrainJob(const v1::Assignment& a);
  // Writes this rank's shards for `step` and reports them to the coordinator.
  // With [checkpoint] async the shards are copied here and written by a
  // background thread (one save in flight at most; the next waits for it).
  absl::Status SaveAndReport(const class Engine& engine, const v1::Assignment& a, int64_t step, bool async);
  absl::Status WaitForSave();
  // Writes the shards of `snap` and reports them; returns the bytes written.
  absl::StatusOr<int64_t> WriteAndReport(const ShardSnapshot& snap, const v1::Assignment& a, int64_t step);
  bool Write(const v1::WorkerMessage& m);
  void HeartbeatLoop();
  void AddAuth(grpc::ClientContext* ctx) const;

  const WorkerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> cancel_{false};
  std::atomic<bool> save_requested_{false};  // `shardctl ckpt save`: after this step

  absl::Mutex write_mu_;
  grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  grpc::ClientContext* session_ctx_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  absl::Duration heartbeat_ ABSL_GUARDED_BY(write_mu_) = absl::Seconds(1);

  absl::Mutex job_mu_;
  std::thread job_thread_ ABSL_GUARDED_BY(job_mu_);
  std::string job_id_ ABSL_GUARDED_BY(job_mu_);  // the job running now, if any
  std::atomic<int64_t> step_{0};
  std::thread save_thread_;       // the async save in flight (job thread only)
  absl::Status save_status_;      // its outcome, read after joining
  std::atomic<bool> save_done_{false};  // the save thread has set save_status_
};

}  // namespace shardline
