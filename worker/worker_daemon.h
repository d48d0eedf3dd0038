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

class JobRunner;  // worker/run/job_runner.h
class WorkerMetrics;   // worker/worker_metrics.h

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:50051";
  std::string device = "cpu";
  std::string token;
  std::string host;  // defaults to the machine's hostname
  std::string collective_address = "127.0.0.1";  // worker/run/collective_address.h; registered
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
  // Runs the assignment with a JobRunner whose saves are reported to the
  // coordinator.
  absl::Status TrainJob(const v1::Assignment& a);
  bool Write(const v1::WorkerMessage& m);
  // One line of the job's log: on stderr, and to the coordinator's tail of
  // the job's logs (shardctl logs).
  void Log(const v1::Assignment& a, const std::string& text);
  void HeartbeatLoop();
  void AddAuth(grpc::ClientContext* ctx) const;

  const WorkerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::atomic<bool> stopping_{false};
  // A cancel or `shardctl ckpt save` that came before the job's runner was
  // built; passed on to it.
  std::atomic<bool> cancel_{false};
  std::atomic<bool> save_requested_{false};

  absl::Mutex write_mu_;
  grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  grpc::ClientContext* session_ctx_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  absl::Duration heartbeat_ ABSL_GUARDED_BY(write_mu_) = absl::Seconds(1);

  absl::Mutex job_mu_;
  std::thread job_thread_ ABSL_GUARDED_BY(job_mu_);
  std::string job_id_ ABSL_GUARDED_BY(job_mu_);  // the job running now, if any
  int job_rank_ ABSL_GUARDED_BY(job_mu_) = 0;     // its rank and credential: a new
  std::string job_credential_ ABSL_GUARDED_BY(job_mu_);  // session's proof that it runs it
  JobRunner* runner_ ABSL_GUARDED_BY(job_mu_) = nullptr;  // the running job's, once built
  std::atomic<int64_t> step_{0};
};

}  // namespace shardline
