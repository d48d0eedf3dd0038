// WorkerMetrics: what one worker exports at /metrics (docs/design.md "Metrics").
//
// Every series carries the labels job_id and rank of the job the worker runs
// (or ran last): BeginJob drops the previous job's series, so a long-lived
// worker's cardinality stays bounded by one job. Besides those, the only
// labels are op (five collectives) and kind (eight memory kinds).
//
// Threads: OnStep and OnCheckpoint come from the job and save threads, the
// collective observer from the communicators' threads, scrapes from the HTTP
// server's; all of it is safe to call concurrently. BeginJob must not race a
// running job (the daemon runs one job at a time).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/job/job_config.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"
#include "worker/comm/communicator.h"
#include "worker/engine/engine.h"

namespace shardline {

class WorkerMetrics {
 public:
  // Serves /metrics on `listen` ("HOST:PORT", port 0 = any free port), to
  // requests bearing one of `bearer_tokens` if any; with an empty `listen`
  // the metrics are kept but not served.
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Start(const std::string& listen,
                                                              std::vector<std::string> bearer_tokens = {});
  int port() const { return server_ ? server_->port() : 0; }

  // A new job's series; `peak_flops` is one device's peak (for MFU).
  void BeginJob(const std::string& job, int rank, int world, const ModelConfig& model, const LoraConfig& lora,
                double peak_flops);
  // Observes one communicator; `shard_group`'s sequence numbers are the
  // ones heartbeats report (the replicate group runs its own sequence).
  std::shared_ptr<comm::CollectiveObserver> ObserverFor(bool shard_group);
  void OnStep(const StepResult& r, const MemoryReport& m);
  void OnCheckpoint(double seconds, int64_t bytes, bool ok);
  int64_t last_collective_seq() const { return last_seq_.load(); }

 private:
  class Observer;
  WorkerMetrics();
  metrics::Labels JobLabels() const;
  void OnCollective(comm::Op op, int64_t bytes, double seconds, int64_t seq, bool ok, bool shard_group);

  const std::shared_ptr<metrics::Registry> registry_ = std::make_shared<metrics::Registry>();
  std::unique_ptr<metrics::MetricsServer> server_;
  metrics::Family<metrics::Histogram>& step_seconds_;
  metrics::Family<metrics::Histogram>& exposed_comm_seconds_;
  metrics::Family<metrics::Gauge>& step_split_;
  metrics::Family<metrics::Counter>& tokens_;
  metrics::Family<metrics::Gauge>& step_;
  metrics::Family<metrics::Gauge>& loss_;
  metrics::Family<metrics::Gauge>& val_loss_;
  metrics::Family<metrics::Counter>& nonfinite_loss_;
  metrics::Family<metrics::Gauge>& lr_;
  metrics::Family<metrics::Gauge>& epoch_;
  metrics::Family<metrics::Gauge>& grad_norm_;
  metrics::Family<metrics::Gauge>& mfu_;
  metrics::Family<metrics::Gauge>& flops_per_token_;
  metrics::Family<metrics::Gauge>& peak_flops_;
  metrics::Family<metrics::Histogram>& collective_seconds_;
  metrics::Family<metrics::Counter>& collective_bytes_;
  metrics::Family<metrics::Counter>& collective_failures_;
  metrics::Family<metrics::Gauge>& last_seq_gauge_;
  metrics::Family<metrics::Gauge>& memory_;
  metrics::Family<metrics::Histogram>& ckpt_seconds_;
  metrics::Family<metrics::Counter>& ckpt_bytes_;
  metrics::Family<metrics::Counter>& ckpt_failures_;
  std::vector<metrics::FamilyBase*> job_families_;

  // Set by BeginJob before the job's threads start; read by all of them.
  std::atomic<bool> has_job_{false};
  mutable absl::Mutex labels_mu_;  // scrapes read the labels while a job begins
  std::string job_ ABSL_GUARDED_BY(labels_mu_);
  int rank_ ABSL_GUARDED_BY(labels_mu_) = 0;
  int world_ = 1;
  double flops_per_token_value_ = 0, peak_flops_value_ = 1;
  std::atomic<int64_t> last_seq_{0};
};

// One device's peak FLOP/s when --peak-flops is not given. cuda: 989e12
// (H100/H200 dense bf16). cpu: threads x FLOP per cycle (32 fp32 with AVX2
// FMA, 64 with AVX-512) x the clock /proc/cpuinfo reports.
double DefaultPeakFlops(const std::string& device, int threads);

}  // namespace shardline
