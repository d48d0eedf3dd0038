#include "common/metrics_http.h"

#include <civetweb.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/accepted_token.h"

namespace shardline::metrics {

struct MetricsServer::Route {
  const MetricsServer* server;
  std::string content_type;
  std::function<std::string()> body;
};

namespace {

int Serve(mg_connection* conn, void* cbdata) {
  const auto* route = static_cast<const MetricsServer::Route*>(cbdata);
  if (!route->server->Allowed(mg_get_header(conn, "Authorization"))) {
    static constexpr char kBody[] = "401 unauthorized: this endpoint takes \"Authorization: Bearer <token>\"\n";
    mg_printf(conn,
              "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Type: text/plain\r\n"
              "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
              sizeof(kBody) - 1, kBody);
    return 401;
  }
  const std::string body = route->body();
  mg_send_http_ok(conn, route->content_type.c_str(), static_cast<long long>(body.size()));
  mg_write(conn, body.data(), body.size());
  return 200;
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

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                     const Registry* registry,
                                                                     std::map<std::string, JsonHandler> extra,
                                                                     std::vector<std::string> bearer_tokens) {
  static std::once_flag init;
  std::call_once(init, [] { mg_init_library(0); });
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->SetBearerTokens(std::move(bearer_tokens));
  // Two threads: a scrape is small and Prometheus scrapes one target serially.
  const char* options[] = {"listening_ports", listen.c_str(), "num_threads", "2", "request_timeout_ms", "10000",
                           nullptr};
  mg_callbacks callbacks{};
  mg_init_data init_data{};
  init_data.callbacks = &callbacks;
  init_data.configuration_options = options;
  char why[256] = {0};
  unsigned code = 0;
  mg_error_data error{&code, why, sizeof(why)};
  server->ctx_ = mg_start2(&init_data, &error);
  if (!server->ctx_) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", listen, ": ", why));
  }
  mg_server_port ports[4];
  const int n = mg_get_server_ports(server->ctx_, 4, ports);
  if (n < 1) return absl::UnavailableError(absl::StrCat("metrics: no port bound for ", listen));
  server->port_ = ports[0].port;
  auto metrics = std::make_unique<Route>(
      Route{server.get(), "text/plain; version=0.0.4; charset=utf-8", [registry] { return registry->Serialize(); }});
  server->routes_["/metrics"] = std::move(metrics);
  for (auto& [path, handler] : extra) {
    server->routes_[path] = std::make_unique<Route>(Route{server.get(), "application/json", std::move(handler)});
  }
  for (auto& [path, route] : server->routes_) {
    // "$" makes the match exact: /metrics must not also serve /metricsfoo.
    mg_set_request_handler(server->ctx_, (path + "$").c_str(), Serve, route.get());
  }
  return server;
}

MetricsServer::~MetricsServer() {
  if (ctx_) mg_stop(ctx_);
}

}  // namespace shardline::metrics
