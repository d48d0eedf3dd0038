#include "common/metrics/metrics_http.h"

#include <CivetServer.h>
#include <civetweb.h>
#include <prometheus/exposer.h>

#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/accepted_token.h"
#include "common/metrics/metrics_process.h"

namespace shardline::metrics {
namespace {

// prometheus-cpp's Exposer serves /metrics only, its RegisterAuth speaks
// HTTP Basic (Prometheus' `authorization` setting sends a Bearer token), and
// its CivetServer is private. What it does take is civetweb callbacks: the
// begin_request callback sees every request first, so it answers 401 to a
// request without an accepted token and serves the JSON endpoints
// (/sd/workers) itself, on the same port; anything else goes on to the
// Exposer's handlers. The callback is a plain function: it finds its server
// by the port the request came in on (servers are registered under kServersMu
// before their first request can be looked up).
absl::Mutex kServersMu(absl::kConstInit);
std::map<int, const MetricsServer*>& Servers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kServersMu) {
  static auto* servers = new std::map<int, const MetricsServer*>();
  return *servers;
}

void Respond(mg_connection* conn, int code, const char* reason, const char* extra_headers, const char* type,
             const std::string& body) {
  mg_printf(conn, "HTTP/1.1 %d %s\r\n%sContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", code,
            reason, extra_headers, type, body.size());
  mg_write(conn, body.data(), body.size());
}

int BeginRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  const MetricsServer* server = nullptr;
  {
    absl::MutexLock lock(&kServersMu);
    auto it = Servers().find(info->server_port);
    if (it != Servers().end()) server = it->second;
  }
  if (!server) {
    Respond(conn, 503, "Service Unavailable", "", "text/plain", "503 metrics server starting or stopping\n");
    return 503;
  }
  if (!server->Allowed(mg_get_header(conn, "Authorization"))) {
    Respond(conn, 401, "Unauthorized", "WWW-Authenticate: Bearer\r\n", "text/plain",
            "401 unauthorized: this endpoint takes \"Authorization: Bearer <token>\"\n");
    return 401;
  }
  const std::string path = info->local_uri ? info->local_uri : "";
  if (const MetricsServer::JsonHandler* json = server->Extra(path)) {
    Respond(conn, 200, "OK", "", "application/json", (*json)());
    return 200;
  }
  if (path != "/metrics") {  // civetweb's handlers match by prefix: /metricsx too
    Respond(conn, 404, "Not Found", "", "text/plain", "404 not found: this server has /metrics\n");
    return 404;
  }
  return 0;  // the Exposer's /metrics
}

}  // namespace

std::string MetricsListenAddress(const std::string& listen_flag, int port_flag) {
  if (!listen_flag.empty()) return listen_flag;
  return port_flag >= 0 ? absl::StrCat("0.0.0.0:", port_flag) : "";
}

void MetricsServer::SetBearerTokens(std::vector<std::string> tokens) {
  absl::MutexLock lock(&mu_);
  bearer_tokens_ = std::move(tokens);
}

bool MetricsServer::Allowed(const char* authorization) const {
  absl::MutexLock lock(&mu_);
  if (bearer_tokens_.empty()) return true;
  absl::string_view header = authorization ? authorization : "";
  if (!absl::ConsumePrefix(&header, "Bearer ")) return false;
  return TokenAccepted(header, bearer_tokens_);
}

const MetricsServer::JsonHandler* MetricsServer::Extra(const std::string& path) const {
  auto it = extra_.find(path);
  return it == extra_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> pages,
    std::map<std::string, JsonHandler> extra, std::vector<std::string> bearer_tokens) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->SetBearerTokens(std::move(bearer_tokens));
  server->extra_ = std::move(extra);
  server->pages_ = std::move(pages);
  server->pages_.push_back(std::make_shared<ProcessCollector>());
  static const CivetCallbacks* const callbacks = [] {
    auto* c = new CivetCallbacks();
    c->begin_request = BeginRequest;
    return c;
  }();
  {
    absl::MutexLock lock(&kServersMu);  // held until the ports are registered
    try {
      // Two threads: a scrape is small and Prometheus scrapes one target serially.
      server->exposer_ = std::make_unique<prometheus::Exposer>(
          std::vector<std::string>{"listening_ports", listen, "num_threads", "2", "request_timeout_ms", "10000"},
          callbacks);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", listen, ": ", e.what()));
    }
    server->ports_ = server->exposer_->GetListeningPorts();
    if (server->ports_.empty()) return absl::UnavailableError(absl::StrCat("metrics: no port bound for ", listen));
    server->port_ = server->ports_[0];
    for (const auto& page : server->pages_) server->exposer_->RegisterCollectable(page);
    for (int p : server->ports_) Servers()[p] = server.get();
  }
  return server;
}

MetricsServer::~MetricsServer() {
  exposer_.reset();  // stops civetweb and waits for its requests
  absl::MutexLock lock(&kServersMu);
  for (int p : ports_) {
    auto it = Servers().find(p);
    if (it != Servers().end() && it->second == this) Servers().erase(it);
  }
}

}  // namespace shardline::metrics
