// MetricsServer: serves a Registry at GET /metrics over HTTP (civetweb, as
// prometheus-cpp does), plus any extra read-only JSON endpoints a program
// registers (the coordinator's Prometheus service discovery).
//
// Contract: Start binds `listen` ("HOST:PORT"; PORT 0 picks a free port, see
// port()) or returns an error naming the address. Handlers run on civetweb's
// threads, so everything they read must be thread-safe (Registry is). The
// server stops, and waits for its requests to finish, when destroyed.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

struct mg_context;

namespace shardline::metrics {

class MetricsServer {
 public:
  using JsonHandler = std::function<std::string()>;
  // `extra`: path -> body of an application/json response.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen, const Registry* registry,
                                                              std::map<std::string, JsonHandler> extra = {});
  ~MetricsServer();
  int port() const { return port_; }
  struct Route;  // one path's content type and body

 private:
  MetricsServer() = default;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  std::map<std::string, std::unique_ptr<Route>> routes_;
};

// "HOST:PORT" for a port flag: "0.0.0.0:PORT".
std::string ListenAddressForPort(int port);

}  // namespace shardline::metrics
