#include "worker/worker_metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/base/process_memory.h"
#include "absl/strings/str_cat.h"
#include "common/job/device_spec.h"
#include "common/model/model_shapes.h"

namespace shardline {

using metrics::ExponentialBuckets;

class WorkerMetrics::Observer : public comm::CollectiveObserver {
 public:
  Observer(WorkerMetrics* m, bool shard_group) : m_(m), shard_group_(shard_group) {}
  void OnCollective(comm::Op op, int64_t bytes, double seconds, int64_t seq, bool ok) override {
    m_->OnCollective(op, bytes, seconds, seq, ok, shard_group_);
  }

 private:
  WorkerMetrics* const m_;
  const bool shard_group_;
};

WorkerMetrics::WorkerMetrics()
    : step_seconds_(registry_->AddHistogram("shardline_step_duration_seconds", "Wall time of one training step.",
                                           ExponentialBuckets(0.01, 2, 16))),
      exposed_comm_seconds_(registry_->AddHistogram(
          "shardline_step_exposed_comm_seconds",
          "Per step, time the step thread waited on collectives (communication not hidden behind compute).",
          ExponentialBuckets(0.001, 2, 18))),
      step_split_(registry_->AddGauge(
          "shardline_step_time_split_seconds",
          "Where the last step's time went, by part: compute, all_gather, reduce_scatter and all_reduce "
          "(waits on collectives not hidden behind compute), optimizer; the parts sum to the step.")),
      tokens_(registry_->AddCounter("shardline_tokens_total", "Tokens this rank processed (its share of each batch).")),
      step_(registry_->AddGauge("shardline_step", "Steps this rank completed.")),
      loss_(registry_->AddGauge("shardline_loss", "Mean loss of the last step's global batch (NaN or Inf if not finite).")),
      val_loss_(registry_->AddGauge("shardline_val_loss",
                                   "Mean loss over the validation batches at the latest evaluation.")),
      nonfinite_loss_(registry_->AddCounter("shardline_loss_nonfinite_steps_total", "Steps whose loss was NaN or Inf.")),
      lr_(registry_->AddGauge("shardline_learning_rate", "Learning rate of the last step.")),
      epoch_(registry_->AddGauge("shardline_epoch",
                                 "Passes over the training data so far (1.5: it wrapped once); absent for synthetic data.")),
      grad_norm_(registry_->AddGauge("shardline_grad_norm", "Global gradient norm of the last step, before clipping.")),
      mfu_(registry_->AddGauge("shardline_mfu_ratio",
                              "Model FLOPs utilisation of the last step: (6N + 12*L*H*Q*T) x tokens/s per device "
                              "over the device's peak FLOP/s.")),
      flops_per_token_(registry_->AddGauge("shardline_model_flops_per_token",
                                          "Training FLOPs per token, 6N + 12*L*H*Q*T.")),
      peak_flops_(registry_->AddGauge("shardline_device_peak_flops", "The device peak FLOP/s MFU is measured against.")),
      collective_seconds_(registry_->AddHistogram("shardline_collective_duration_seconds",
                                                 "Duration of one collective, from start on the backend to finish.",
                                                 ExponentialBuckets(1e-5, 2, 24))),
      collective_bytes_(registry_->AddCounter("shardline_collective_sent_bytes_total",
                                             "Bytes this rank sent in collectives.")),
      collective_failures_(registry_->AddCounter("shardline_collective_failures_total", "Collectives that failed.")),
      last_seq_gauge_(registry_->AddGauge("shardline_last_collective_seq",
                                         "Sequence number of the last collective this rank completed (shard group).")),
      memory_(registry_->AddGauge("shardline_memory_bytes",
                                 "Memory by kind: params, grads, master, optimizer as held at the last step's peak; "
                                 "activation_peak; step_peak (all tracked kinds together); tensor_peak (every tensor "
                                 "byte, measured by the device's allocator); reserved_peak (what that allocator "
                                 "held, the CUDA caching allocator's reserve included); process_rss.")),
      ckpt_seconds_(registry_->AddHistogram("shardline_checkpoint_save_duration_seconds",
                                           "Time to write, fsync, hash and report this rank's checkpoint shard.",
                                           ExponentialBuckets(0.01, 2, 16))),
      ckpt_bytes_(registry_->AddCounter("shardline_checkpoint_saved_bytes_total", "Checkpoint bytes this rank wrote.")),
      ckpt_failures_(registry_->AddCounter("shardline_checkpoint_failures_total",
                                          "Checkpoint saves of this rank that failed.")) {
  job_families_ = {&step_seconds_,       &exposed_comm_seconds_, &step_split_,     &tokens_,         &step_,
                   &loss_,               &val_loss_,             &nonfinite_loss_,       &lr_,             &epoch_,
                   &grad_norm_,
                   &mfu_,                &flops_per_token_,      &peak_flops_,     &collective_seconds_,
                   &collective_bytes_,   &collective_failures_,  &last_seq_gauge_, &memory_,
                   &ckpt_seconds_,       &ckpt_bytes_,           &ckpt_failures_};
  // The RSS is read at scrape time, so an idle or stuck rank still reports it.
  registry_->AddCollector([this] {
    if (!has_job_) return;
    auto l = JobLabels();
    l["kind"] = "process_rss";
    memory_.Add(l).Set(static_cast<double>(ProcessRssBytes()));
  });
}

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Start(const std::string& listen,
                                                                    std::vector<std::string> bearer_tokens) {
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics());
  if (!listen.empty()) {
    auto server = metrics::MetricsServer::Start(listen, {m->registry_}, {}, std::move(bearer_tokens));
    if (!server.ok()) return server.status();
    m->server_ = std::move(*server);
  }
  return m;
}

metrics::Labels WorkerMetrics::JobLabels() const {
  absl::MutexLock lock(&labels_mu_);
  return {{"job_id", job_}, {"rank", absl::StrCat(rank_)}};
}

void WorkerMetrics::BeginJob(const std::string& job, int rank, int world, const ModelConfig& model,
                             const LoraConfig& lora, double peak_flops) {
  has_job_ = false;
  for (auto* f : job_families_) f->Clear();
  {
    absl::MutexLock lock(&labels_mu_);
    job_ = job;
    rank_ = rank;
  }
  world_ = world;
  flops_per_token_value_ = model::TrainingFlopsPerToken(model, lora);
  peak_flops_value_ = peak_flops > 0 ? peak_flops : 1;
  last_seq_ = 0;
  const auto l = JobLabels();
  flops_per_token_.Add(l).Set(flops_per_token_value_);
  peak_flops_.Add(l).Set(peak_flops_value_);
  step_.Add(l).Set(0);
  last_seq_gauge_.Add(l).Set(0);
  tokens_.Add(l);
  nonfinite_loss_.Add(l);
  ckpt_failures_.Add(l);
  has_job_ = true;
}

std::shared_ptr<comm::CollectiveObserver> WorkerMetrics::ObserverFor(bool shard_group) {
  return std::make_shared<Observer>(this, shard_group);
}

void WorkerMetrics::OnCollective(comm::Op op, int64_t bytes, double seconds, int64_t seq, bool ok,
                                 bool shard_group) {
  const metrics::Labels job = JobLabels();
  metrics::Labels l = job;
  l["op"] = comm::OpName(op);
  if (!ok) {
    collective_failures_.Add(l).Increment();
    return;
  }
  collective_seconds_.Add(l).Observe(seconds);
  collective_bytes_.Add(l).Increment(static_cast<double>(bytes));
  if (shard_group) {
    last_seq_ = seq;
    last_seq_gauge_.Add(job).Set(static_cast<double>(seq));
  }
}

void WorkerMetrics::OnStep(const StepResult& r, const MemoryReport& m) {
  const auto l = JobLabels();
  step_seconds_.Add(l).Observe(r.seconds);
  exposed_comm_seconds_.Add(l).Observe(r.exposed_comm_seconds);
  // (Differences of sums of the same waits: clamped at 0 against rounding.)
  const double all_reduce =
      std::max(0.0, r.exposed_comm_seconds - r.exposed_all_gather_seconds - r.exposed_reduce_scatter_seconds);
  const std::pair<const char*, double> parts[] = {
      {"compute", std::max(0.0, r.seconds - r.exposed_comm_seconds - r.optimizer_seconds)},
      {"all_gather", r.exposed_all_gather_seconds},
      {"reduce_scatter", r.exposed_reduce_scatter_seconds},
      {"all_reduce", all_reduce},
      {"optimizer", r.optimizer_seconds}};
  for (const auto& [part, seconds] : parts) {
    auto k = l;
    k["part"] = part;
    step_split_.Add(k).Set(seconds);
  }
  const double my_tokens = static_cast<double>(r.tokens) / world_;
  tokens_.Add(l).Increment(my_tokens);
  step_.Add(l).Set(static_cast<double>(r.step + 1));
  loss_.Add(l).Set(r.loss);
  if (!std::isnan(r.val_loss)) val_loss_.Add(l).Set(r.val_loss);
  if (!std::isfinite(r.loss)) nonfinite_loss_.Add(l).Increment();
  lr_.Add(l).Set(r.lr);
  if (!std::isnan(r.epoch)) epoch_.Add(l).Set(r.epoch);
  grad_norm_.Add(l).Set(r.grad_norm);
  if (r.seconds > 0) mfu_.Add(l).Set(flops_per_token_value_ * my_tokens / r.seconds / peak_flops_value_);
  auto set = [&](const char* kind, int64_t bytes) {
    auto k = l;
    k["kind"] = kind;
    memory_.Add(k).Set(static_cast<double>(bytes));
  };
  set("params", m.peak_by_kind[static_cast<int>(MemKind::kParams)]);
  set("grads", m.peak_by_kind[static_cast<int>(MemKind::kGrads)]);
  set("master", m.peak_by_kind[static_cast<int>(MemKind::kMaster)]);
  set("optimizer", m.peak_by_kind[static_cast<int>(MemKind::kOptimizer)]);
  set("activation_peak", m.activation_peak_bytes);
  set("step_peak", m.peak_bytes);
  set("tensor_peak", m.tensor_peak_bytes);
  set("reserved_peak", m.reserved_peak_bytes);
  set("process_rss", ProcessRssBytes());
}

void WorkerMetrics::OnCheckpoint(double seconds, int64_t bytes, bool ok) {
  const auto l = JobLabels();
  if (!ok) {
    ckpt_failures_.Add(l).Increment();
    return;
  }
  ckpt_seconds_.Add(l).Observe(seconds);
  ckpt_bytes_.Add(l).Increment(static_cast<double>(bytes));
}

double DefaultPeakFlops(const std::string& device, int threads) {
  if (DeviceKindName(device) == "cuda") return 989e12;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  double mhz = 0;
  bool avx512 = false;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) mhz = std::max(mhz, std::atof(line.c_str() + colon + 1));
    } else if (line.rfind("flags", 0) == 0) {
      avx512 = avx512 || line.find(" avx512f") != std::string::npos;
    }
  }
  if (mhz <= 0) mhz = 2000;  // unknown clock: a conservative guess
  return std::max(1, threads) * (avx512 ? 64.0 : 32.0) * mhz * 1e6;
}

}  // namespace shardline
