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
//    collectives, seconds since progress, stalled (job_id and rank labels;
//    the series of a job vanish when it ends).
//
// Counters and histograms live in a prometheus-cpp registry; the gauges read
// from the core are built afresh at each scrape by a Collectable of their own
// (so workers and jobs that are gone leave no stale series behind).
//
// Thread-safe: hooks run under the core's lock, the interceptor on gRPC's
// threads, scrapes on the HTTP server's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "common/metrics/metrics.h"
#include "server/coordinator_core.h"

namespace shardline {

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();
  // The hooks to put in CoordinatorOptions::events.
  CoreEvents Events();
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcInterceptor();
  // What /metrics shows (MetricsServer::Start's pages): the registry, then
  // the gauges read from `core` at every scrape; `core` must outlive every
  // scrape.
  std::vector<std::shared_ptr<prometheus::Collectable>> Pages(const CoordinatorCore* core) const;

 private:
  class Interceptor;
  class InterceptorFactory;
  class StateCollector;

  const std::shared_ptr<metrics::Registry> registry_ = std::make_shared<metrics::Registry>();
  metrics::Family<metrics::Counter>& workers_lost_;
  metrics::Family<metrics::Counter>& refused_;
  metrics::Family<metrics::Counter>& restarts_;
  metrics::Family<metrics::Histogram>& restart_lost_;
  metrics::Family<metrics::Histogram>& rendezvous_;
  metrics::Family<metrics::Histogram>& commit_;
  metrics::Family<metrics::Counter>& commit_failures_;
  metrics::Family<metrics::Counter>& rpcs_;
  metrics::Family<metrics::Histogram>& rpc_seconds_;
};

// Prometheus http_sd_configs JSON: one target group per worker that serves
// metrics, at the address its session came from and its metrics port.
std::string WorkerScrapeTargets(const std::vector<v1::WorkerInfo>& workers);

}  // namespace shardline
