#include "server/coordinator_metrics.h"

#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/state/job_state.h"

namespace shardline {

using metrics::ExponentialBuckets;

namespace {

const char* CodeName(grpc::StatusCode c) {
  static const char* const kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                       "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                       "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

// "/shardline.v1.Coordinator/SubmitJob" -> {"shardline.v1.Coordinator", "SubmitJob"}
std::pair<std::string, std::string> SplitMethod(const std::string& full) {
  const auto slash = full.rfind('/');
  if (full.empty() || full[0] != '/' || slash == 0 || slash == std::string::npos) return {"", full};
  return {full.substr(1, slash - 1), full.substr(slash + 1)};
}

// grpc's peer "ipv4:10.0.0.5:41234" / "ipv6:[::1]:41234" -> "10.0.0.5" / "[::1]".
std::string PeerHost(const std::string& peer) {
  const auto colon = peer.find(':');
  const auto last = peer.rfind(':');
  if (colon == std::string::npos || last == colon) return "";
  return peer.substr(colon + 1, last - colon - 1);
}

}  // namespace

class CoordinatorMetrics::Interceptor : public grpc::experimental::Interceptor {
 public:
  Interceptor(CoordinatorMetrics* m, const char* method) : m_(m), method_(SplitMethod(method ? method : "")) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const metrics::Labels l = {{"service", method_.first},
                                 {"method", method_.second},
                                 {"code", CodeName(methods->GetSendStatus().error_code())}};
      m_->rpcs_.Add(l).Increment();
      m_->rpc_seconds_.Add(l).Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  CoordinatorMetrics* const m_;
  const std::pair<std::string, std::string> method_;
  const absl::Time start_ = absl::Now();
};

class CoordinatorMetrics::InterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit InterceptorFactory(CoordinatorMetrics* m) : m_(m) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new Interceptor(m_, info->method());
  }

 private:
  CoordinatorMetrics* const m_;
};

// The gauges computed from the core's state, built at every scrape.
class CoordinatorMetrics::StateCollector : public prometheus::Collectable {
 public:
  explicit StateCollector(const CoordinatorCore* core) : core_(core) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const CoordinatorCore* const core_;
};

std::vector<prometheus::MetricFamily> CoordinatorMetrics::StateCollector::Collect() const {
  using metrics::AddGauge;
  using metrics::GaugeFamily;
  auto workers_f = GaugeFamily("shardline_coordinator_workers", "Connected workers by state (idle, busy).");
  auto heartbeat_age = GaugeFamily("shardline_coordinator_worker_heartbeat_age_seconds",
                                   "Seconds since each connected worker's last heartbeat.");
  std::map<std::string, int> workers = {{"idle", 0}, {"busy", 0}};
  for (const v1::WorkerInfo& w : core_->ListWorkers()) {
    workers[absl::AsciiStrToLower(WorkerStateName(w.state()))] += 1;
    AddGauge(&heartbeat_age, {{"host", w.host()}, {"device", w.device()}}, w.heartbeat_age_seconds());
  }
  for (const auto& [state, n] : workers) AddGauge(&workers_f, {{"state", state}}, n);

  auto goodput = GaugeFamily("shardline_job_goodput_ratio",
                             "Share of an unfinished job's wall time since its first start spent on steps that "
                             "were kept (not computed again after a restart).");
  auto jobs_f = GaugeFamily("shardline_coordinator_jobs", "Jobs by state.");
  auto queue = GaugeFamily("shardline_coordinator_queue_length", "Jobs waiting for workers.");
  auto lag_steps = GaugeFamily("shardline_rank_lag_steps", "Steps a rank is behind its job's fastest rank.");
  auto lag_collectives =
      GaugeFamily("shardline_rank_lag_collectives", "Collectives a rank is behind its job's fastest rank.");
  auto since_progress = GaugeFamily("shardline_rank_seconds_since_progress",
                                    "Seconds since a rank last completed a step or a collective.");
  auto rank_stalled = GaugeFamily("shardline_rank_stalled", "1 if the rank is named as the cause of its job's stall.");
  auto rank_slow_link = GaugeFamily("shardline_rank_slow_link",
                                    "1 if the rank is named as its job's straggler: its link sends at a third of the "
                                    "median rank's speed or less (measured at each rendezvous).");
  auto job_stalled =
      GaugeFamily("shardline_job_stalled", "1 if no rank of the running job made progress for the stall threshold.");
  std::map<std::string, int> jobs = {{"pending", 0}, {"running", 0}, {"restarting", 0}, {"succeeded", 0},
                                     {"failed", 0}, {"cancelled", 0}};
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (const v1::Job& j : core_->ListJobs()) {
    jobs[absl::AsciiStrToLower(JobStateName(j.state()))] += 1;
    if (j.state() == v1::JOB_STATE_RESTARTING || j.state() == v1::JOB_STATE_RUNNING) {
      AddGauge(&goodput, {{"job_id", j.id()}}, JobGoodput(j, now_ms));
    }
    if (j.state() != v1::JOB_STATE_RUNNING) continue;
    AddGauge(&job_stalled, {{"job_id", j.id()}}, j.stalled().empty() ? 0 : 1);
    for (const v1::RankStatus& r : j.ranks()) {
      const metrics::Labels l = {{"job_id", j.id()}, {"rank", absl::StrCat(r.rank())}};
      AddGauge(&lag_steps, l, static_cast<double>(r.lag_steps()));
      AddGauge(&lag_collectives, l, static_cast<double>(r.lag_collectives()));
      AddGauge(&since_progress, l, r.seconds_since_progress());
      AddGauge(&rank_stalled, l, r.stalled() ? 1 : 0);
      AddGauge(&rank_slow_link, l, r.slow_link() ? 1 : 0);
    }
  }
  for (const auto& [state, n] : jobs) AddGauge(&jobs_f, {{"state", state}}, n);
  AddGauge(&queue, {}, jobs["pending"]);
  std::vector<prometheus::MetricFamily> out;
  for (auto* f : {&workers_f, &heartbeat_age, &goodput, &jobs_f, &queue, &lag_steps, &lag_collectives,
                  &since_progress, &rank_stalled, &rank_slow_link, &job_stalled}) {
    out.push_back(std::move(*f));
  }
  return out;
}

CoordinatorMetrics::CoordinatorMetrics()
    : workers_lost_(registry_->AddCounter("shardline_coordinator_workers_lost_total",
                                          "Workers lost: session dropped or heartbeats stopped.")),
      refused_(registry_->AddCounter("shardline_coordinator_refused_total",
                                     "Messages and calls refused because the sender does not hold the rank it named "
                                     "(what: progress, finished, connected, checkpoint_report, store, role, owner).")),
      restarts_(registry_->AddCounter("shardline_job_restarts_total",
                                      "Times a job went RESTARTING after a lost rank or a retryable error.")),
      restart_lost_(registry_->AddHistogram("shardline_job_restart_lost_seconds",
                                            "What each restart cost: the seconds of the last attempt's steps computed "
                                            "again, plus the seconds until the next attempt started.",
                                            ExponentialBuckets(0.5, 2, 14))),
      rendezvous_(registry_->AddHistogram("shardline_coordinator_rendezvous_duration_seconds",
                                          "From a job's start until every rank's communicators connected.",
                                          ExponentialBuckets(0.01, 2, 16))),
      commit_(registry_->AddHistogram("shardline_coordinator_checkpoint_commit_duration_seconds",
                                      "Writing a checkpoint's manifest once every rank reported.",
                                      ExponentialBuckets(0.0005, 2, 16))),
      commit_failures_(registry_->AddCounter("shardline_coordinator_checkpoint_commit_failures_total",
                                             "Checkpoint commits that failed.")),
      rpcs_(registry_->AddCounter("shardline_coordinator_rpcs_total", "RPCs served, by service, method and code.")),
      rpc_seconds_(registry_->AddHistogram("shardline_coordinator_rpc_duration_seconds",
                                           "RPC latency (for streams, their lifetime) by service, method and code.",
                                           ExponentialBuckets(1e-5, 4, 14))) {
  workers_lost_.Add({});
  commit_failures_.Add({});
}

CoreEvents CoordinatorMetrics::Events() {
  CoreEvents e;
  e.rendezvous_done = [this](absl::Duration d) { rendezvous_.Add({}).Observe(absl::ToDoubleSeconds(d)); };
  e.checkpoint_committed = [this](absl::Duration d, bool ok) {
    if (ok) commit_.Add({}).Observe(absl::ToDoubleSeconds(d));
    else commit_failures_.Add({}).Increment();
  };
  e.worker_lost = [this] { workers_lost_.Add({}).Increment(); };
  e.refused = [this](const char* what) { refused_.Add({{"what", what}}).Increment(); };
  e.job_restarting = [this](const std::string& job) { restarts_.Add({{"job_id", job}}).Increment(); };
  e.job_restarted = [this](double lost) { restart_lost_.Add({}).Observe(lost); };
  return e;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> CoordinatorMetrics::RpcInterceptor() {
  return std::make_unique<InterceptorFactory>(this);
}

std::vector<std::shared_ptr<prometheus::Collectable>> CoordinatorMetrics::Pages(const CoordinatorCore* core) const {
  return {registry_, std::make_shared<StateCollector>(core)};
}

std::string WorkerScrapeTargets(const std::vector<v1::WorkerInfo>& workers) {
  nlohmann::json groups = nlohmann::json::array();
  for (const v1::WorkerInfo& w : workers) {
    const std::string host = PeerHost(w.peer_address());
    if (w.metrics_port() <= 0 || host.empty()) continue;
    groups.push_back({{"targets", {absl::StrCat(host, ":", w.metrics_port())}},
                      {"labels", {{"shardline_host", w.host()}, {"shardline_device", w.device()}}}});
  }
  return groups.dump();
}

}  // namespace shardline
