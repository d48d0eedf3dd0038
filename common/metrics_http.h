// MetricsServer: serves a Registry at GET /metrics over HTTP (civetweb, as
// prometheus-cpp does), plus any extra read-only JSON endpoints a program
// registers (the coordinator's Prometheus service discovery).
//
// Contract: Start binds `listen` ("HOST:PORT"; PORT 0 picks a free port, see
// port()) or returns an error naming the address. With bearer tokens set,
// every request must carry "Authorization: Bearer <one of them>" (Prometheus'
// `authorization` scrape setting) or is answered 401. Handlers run on
// civetweb's threads, so everything they read must be thread-safe (Registry
// is); SetBearerTokens may be called at any time. The server stops, and
// waits for its requests to finish, when destroyed.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

struct mg_context;

namespace shardline::metrics {

class MetricsServer {
 public:
  using JsonHandler = std::function<std::string()>;
  // `extra`: path -> body of an application/json response.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen, const Registry* registry,
                                                              std::map<std::string, JsonHandler> extra = {},
                                                              std::vector<std::string> bearer_tokens = {});
  ~MetricsServer();
  int port() const { return port_; }
  // Empty: no authentication.
  void SetBearerTokens(std::vector<std::string> tokens) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an Authorization header (null if absent) may read.
  bool Allowed(const char* authorization) const ABSL_LOCKS_EXCLUDED(mu_);
  struct Route;  // one path's content type and body

 private:
  MetricsServer() = default;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  std::map<std::string, std::unique_ptr<Route>> routes_;
  mutable absl::Mutex mu_;
  std::vector<std::string> bearer_tokens_ ABSL_GUARDED_BY(mu_);
};

// The address the programs' --metrics-listen HOST:PORT or --metrics-port P
// (all interfaces) flags ask for; empty for neither (metrics not served).
std::string MetricsListenAddress(const std::string& listen_flag, int port_flag);

}  // namespace shardline::metrics
