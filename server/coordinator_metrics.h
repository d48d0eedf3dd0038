// CoordinatorMetrics: what the coordinator exports at /metrics, and the
// Prometheus service-discovery document listing its workers' /metrics.
//
//  - workers by state, workers lost, jobs by state, queue length, heartbeat
//    age per worker (labelled by host and device, stable across reconnects);
//  - rendezvous and checkpoint-commit durations, restarts per job and the
//    seconds each restart cost (CoreEvents hooks); each unfinished job's
//    goodput (JobGoodput);
//  - RPC counts and latency by service, method and code (a server
//    interceptor, so every RPC is counted, refused ones included);
//  - per rank of each running job: lag behind the fastest rank in steps and
//    collectives, seconds since progress, stalled (job and rank labels; the
//    series of a job vanish when it ends).
//
// Thread-safe: hooks run under the core's lock, the interceptor on gRPC's
// threads, scrapes on the HTTP server's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "common/metrics.h"
#include "server/coordinator_core.h"

namespace shardline {

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();
  // The hooks to put in CoordinatorOptions::events.
  CoreEvents Events();
  // Reads the core's workers and jobs at every scrape; `core` must outlive
  // every scrape.
  void CollectFrom(const CoordinatorCore* core);
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcInterceptor();
  const metrics::Registry& registry() const { return registry_; }

 private:
  class Interceptor;
  class InterceptorFactory;
  void Collect(const CoordinatorCore* core);

  metrics::Registry registry_;
  metrics::Family<metrics::Gauge>& workers_;
  metrics::Family<metrics::Counter>& workers_lost_;
  metrics::Family<metrics::Counter>& refused_;
  metrics::Family<metrics::Counter>& restarts_;
  metrics::Family<metrics::Histogram>& restart_lost_;
  metrics::Family<metrics::Gauge>& goodput_;
  metrics::Family<metrics::Gauge>& jobs_;
  metrics::Family<metrics::Gauge>& queue_;
  metrics::Family<metrics::Gauge>& heartbeat_age_;
  metrics::Family<metrics::Histogram>& rendezvous_;
  metrics::Family<metrics::Histogram>& commit_;
  metrics::Family<metrics::Counter>& commit_failures_;
  metrics::Family<metrics::Counter>& rpcs_;
  metrics::Family<metrics::Histogram>& rpc_seconds_;
  metrics::Family<metrics::Gauge>& lag_steps_;
  metrics::Family<metrics::Gauge>& lag_collectives_;
  metrics::Family<metrics::Gauge>& since_progress_;
  metrics::Family<metrics::Gauge>& rank_stalled_;
  metrics::Family<metrics::Gauge>& job_stalled_;
};

// Prometheus http_sd_configs JSON: one target group per worker that serves
// metrics, at the address its session came from and its metrics port.
std::string WorkerScrapeTargets(const std::vector<v1::WorkerInfo>& workers);

}  // namespace shardline
