// shardline-coordinator --listen ADDR --state-dir DIR [--token-file F]
//                       [--tls-cert F --tls-key F] [--heartbeat-ms N]
//                       [--lost-after-missed N] [--stall-after SECONDS] [--metrics-port P]
//
// With --metrics-port it also serves Prometheus /metrics and /sd/workers (the
// workers' /metrics targets, for Prometheus' http_sd_configs) over HTTP.
// Serves the Coordinator service, grpc.health.v1 and server reflection.
// Prints "listening on HOST:PORT" once it accepts connections (with port 0 the
// chosen port). SIGINT/SIGTERM stop it cleanly; state survives kill -9.
#include <signal.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/metrics_http.h"
#include "server/coordinator_core.h"
#include "server/coordinator_metrics.h"
#include "server/coordinator_service.h"

namespace {

int Fail(const absl::Status& s) {
  std::cerr << "shardline-coordinator: " << s.message() << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardline-coordinator: the Shardline control plane"};
  std::string listen = "127.0.0.1:50051", state_dir, token_file, tls_cert, tls_key;
  int heartbeat_ms = 1000, lost_after_missed = 3, metrics_port = -1;
  double stall_after_s = 10;
  app.add_option("--listen", listen, "address to serve on (host:port)");
  app.add_option("--state-dir", state_dir, "directory for the state database")->required();
  app.add_option("--token-file", token_file, "file holding the bearer token every RPC must carry");
  app.add_option("--tls-cert", tls_cert, "PEM certificate (with --tls-key: serve TLS)");
  app.add_option("--tls-key", tls_key, "PEM private key");
  app.add_option("--heartbeat-ms", heartbeat_ms, "worker heartbeat interval")->check(CLI::Range(10, 3600000));
  app.add_option("--lost-after-missed", lost_after_missed, "heartbeats missed before a worker is lost")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--stall-after", stall_after_s, "seconds without progress before a running job is stalled")
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-port", metrics_port, "serve Prometheus /metrics on this port (0: any free port)")
      ->check(CLI::Range(-1, 65535));
  CLI11_PARSE(app, argc, argv);

  std::string token;
  if (!token_file.empty()) {
    auto t = shardline::ReadTokenFile(token_file);
    if (!t.ok()) return Fail(t.status());
    token = *t;
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!tls_cert.empty() || !tls_key.empty()) {
    if (tls_cert.empty() || tls_key.empty()) {
      return Fail(absl::InvalidArgumentError("--tls-cert and --tls-key must be given together"));
    }
    auto cert = shardline::ReadFileToString(tls_cert, "certificate");
    if (!cert.ok()) return Fail(cert.status());
    auto key = shardline::ReadFileToString(tls_key, "private key");
    if (!key.ok()) return Fail(key.status());
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(ssl);
  }
  auto store = shardline::StateStore::Open(state_dir);
  if (!store.ok()) return Fail(store.status());
  shardline::CoordinatorOptions options;
  options.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  options.lost_after_missed = lost_after_missed;
  options.stall_after = absl::Seconds(stall_after_s);
  shardline::CoordinatorMetrics metrics;
  options.events = metrics.Events();
  shardline::CoordinatorCore core(store->get(), options);
  metrics.CollectFrom(&core);
  std::unique_ptr<shardline::metrics::MetricsServer> metrics_server;
  if (metrics_port >= 0) {
    auto m = shardline::metrics::MetricsServer::Start(
        shardline::metrics::ListenAddressForPort(metrics_port), &metrics.registry(),
        {{"/sd/workers", [&core] { return shardline::WorkerScrapeTargets(core.ListWorkers()); }}});
    if (!m.ok()) return Fail(absl::UnavailableError(absl::StrCat("--metrics-port: ", m.status().message())));
    metrics_server = std::move(*m);
  }
  if (absl::Status s = core.Recover(); !s.ok()) return Fail(s);
  shardline::CoordinatorService service(&core, token);

  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, creds, &port);
  builder.RegisterService(&service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(metrics.RpcInterceptor());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail(absl::UnavailableError(absl::StrCat("cannot listen on ", listen)));
  const std::string host = listen.substr(0, listen.rfind(':'));
  std::cout << "listening on " << host << ":" << port << std::endl;
  if (metrics_server) std::cout << "metrics on port " << metrics_server->port() << std::endl;

  std::atomic<bool> running{true};
  std::thread ticker([&] {
    while (running) {
      core.Tick(absl::Now());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  int sig = 0;
  sigwait(&stop, &sig);
  std::cerr << "shardline-coordinator: stopping on signal " << sig << std::endl;
  running = false;
  ticker.join();
  // Pending store waits are answered first: the server's shutdown waits for
  // every call to finish, and a wait would otherwise hold it to its timeout.
  core.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  metrics_server.reset();  // scrapes read the core: stop them before it goes
  return 0;
}
