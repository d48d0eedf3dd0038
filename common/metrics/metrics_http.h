// MetricsServer: serves collectables at GET /metrics in Prometheus' text
// format (prometheus-cpp's serializer) over libmicrohttpd, plus any extra
// read-only JSON endpoints a program registers (the coordinator's Prometheus
// service discovery).
//
// Every page also carries ProcessCollector's shardline_build_info and
// process_* metrics (common/metrics/metrics_process.h).
//
// Contract: Start binds `listen` ("HOST:PORT"; PORT 0 picks a free port, see
// port()) or returns an error naming the address. With bearer tokens set,
// every request must carry "Authorization: Bearer <one of them>" (Prometheus'
// `authorization` scrape setting) or is answered 401. Pages and handlers run
// on the server's one polling thread, so everything they read must be
// thread-safe; SetBearerTokens may be called at any time. Connections cost
// no thread: idle ones close after 10 s, and at most 1024 (or an eighth of
// the descriptor limit) are open at once, 8 from one address, so idle or
// slow clients can neither hold a scrape up nor take the process's
// descriptors. Every response closes its connection. The server stops, and waits for the request in progress, when
// destroyed.
#pragma once

#include <prometheus/collectable.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

struct MHD_Daemon;

namespace shardline::metrics {

class MetricsServer {
 public:
  using JsonHandler = std::function<std::string()>;
  // `pages`: what /metrics shows, in order (kept alive by the server).
  // `extra`: path -> body of an application/json response.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> pages,
      std::map<std::string, JsonHandler> extra = {}, std::vector<std::string> bearer_tokens = {});
  ~MetricsServer();
  int port() const { return port_; }
  // Empty: no authentication.
  void SetBearerTokens(std::vector<std::string> tokens) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an Authorization header (null if absent) may read.
  bool Allowed(const char* authorization) const ABSL_LOCKS_EXCLUDED(mu_);
  // The JSON endpoint at `path`, or null.
  const JsonHandler* Extra(const std::string& path) const;
  // What GET /metrics answers: every page's families, in the text format.
  std::string Page() const;

 private:
  MetricsServer() = default;
  MHD_Daemon* daemon_ = nullptr;
  std::vector<std::shared_ptr<prometheus::Collectable>> pages_;
  std::map<std::string, JsonHandler> extra_;
  int port_ = 0;
  mutable absl::Mutex mu_;
  std::vector<std::string> bearer_tokens_ ABSL_GUARDED_BY(mu_);
};

// The address the programs' --metrics-listen HOST:PORT or --metrics-port P
// (all interfaces) flags ask for; empty for neither or P < 0 (not served).
std::string MetricsListenAddress(const std::string& listen_flag, int port_flag);

}  // namespace shardline::metrics
