// shardline-coordinator --listen ADDR --state-dir DIR
//                       [--token-file F (--worker-token-file F | --shared-token)]
//                       [--tls-cert F --tls-key F] [--heartbeat-ms N]
//                       [--lost-after-missed N] [--stall-after SECONDS]
//                       [--keep-finished-jobs N] [--keep-finished-hours H]
//                       [--metrics-port P | --metrics-listen HOST:PORT] [--metrics-token-file F]
//                       [--log-format text|json]
//
// Logs one line on stderr per event an operator acts on (EventLog): start
// and stop, each job submitted and each change of a job's state (with the
// attempt and the reason: a restart, a cancel, a failure), each worker that
// joins or is lost, each checkpoint committed or not, token reloads. As
// text, or as one JSON object per line for log collectors.
//
// Token files hold one accepted token per line: --token-file the users',
// --worker-token-file the workers', --metrics-token-file the scrapers'.
// --token-file needs --worker-token-file, or --shared-token to say that one
// file serves both roles (then a user token can open worker sessions and a
// worker's token can submit and cancel). SIGHUP reads them again
// (rotation: add the new token, SIGHUP, move the clients, remove the old
// one, SIGHUP); a file that no longer reads keeps the tokens in force.
//
// It serves Prometheus /metrics and /sd/workers (the workers' /metrics
// targets, for Prometheus' http_sd_configs) over HTTP, by default on port
// 9400 of every interface (taken: any free port, printed); --metrics-port -1
// turns that off.
// Serves the Coordinator service, grpc.health.v1 and server reflection.
// Prints "listening on HOST:PORT" once it accepts connections (with port 0 the
// chosen port). SIGINT/SIGTERM stop it cleanly; state survives kill -9.
// One coordinator per --state-dir: a second one exits 1 at once naming the
// lock file and the pid that holds it (StateStore); so does one whose
// coordinator.db exists but holds no state (emptied), rather than starting
// as new.
#include <malloc.h>
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
#include "common/base/build_info.h"
#include "common/base/file_util.h"
#include "common/metrics/metrics_http.h"
#include "server/coordinator_core.h"
#include "server/coordinator_metrics.h"
#include "server/coordinator_service.h"
#include "server/event_log.h"

namespace {

int Fail(const absl::Status& s) {
  std::cerr << "shardline-coordinator: " << s.message() << std::endl;
  return 1;
}

// The token files named by the flags; empty paths, no tokens.
struct TokenFiles {
  std::string user, worker, metrics;

  absl::StatusOr<shardline::AcceptedTokens> ReadRpcTokens() const {
    if (!worker.empty() && user.empty()) {
      return absl::InvalidArgumentError("--worker-token-file needs --token-file (the users' tokens)");
    }
    shardline::AcceptedTokens t;
    for (auto [path, out] : {std::pair{&user, &t.user}, std::pair{&worker, &t.worker}}) {
      if (path->empty()) continue;
      auto read = shardline::ReadAcceptedTokens(*path);
      if (!read.ok()) return read.status();
      *out = *std::move(read);
    }
    return t;
  }
  absl::StatusOr<std::vector<std::string>> ReadMetricsTokens() const {
    if (metrics.empty()) return std::vector<std::string>{};
    return shardline::ReadAcceptedTokens(metrics);
  }
};

// Every flag, as the parse fills them.
struct Flags {
  std::string listen = "127.0.0.1:50051", state_dir, tls_cert, tls_key, metrics_listen;
  TokenFiles tokens;
  bool shared_token = false;
  int heartbeat_ms = 1000, lost_after_missed = 3, metrics_port = 9400, keep_finished_jobs = 1000;
  double stall_after_s = 10, keep_finished_hours = 0, restart_settle_s = 3;
  bool metrics_port_given = false;
  std::string log_format = "text";
};

void AddFlags(CLI::App& app, Flags& f) {
  app.set_version_flag("--version",
                       std::string("shardline-coordinator ") + shardline::kVersion + " (" + shardline::kRevision + ")");
  app.add_option("--listen", f.listen, "address to serve on (host:port)");
  app.add_option("--state-dir", f.state_dir, "directory for the state database")->required();
  app.add_option("--token-file", f.tokens.user, "file of the users' bearer tokens, one per line");
  auto* worker_tokens =
      app.add_option("--worker-token-file", f.tokens.worker, "file of the workers' bearer tokens, one per line");
  app.add_flag("--shared-token", f.shared_token,
               "the --token-file tokens serve workers too (no roles: for a single-user development cluster)")
      ->excludes(worker_tokens);
  app.add_option("--metrics-token-file", f.tokens.metrics,
                 "scrapes of /metrics and /sd/workers must carry a bearer token of this file");
  app.add_option("--tls-cert", f.tls_cert, "PEM certificate (with --tls-key: serve TLS)");
  app.add_option("--tls-key", f.tls_key, "PEM private key");
  app.add_option("--heartbeat-ms", f.heartbeat_ms, "worker heartbeat interval")->check(CLI::Range(10, 3600000));
  app.add_option("--lost-after-missed", f.lost_after_missed, "heartbeats missed before a worker is lost")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--stall-after", f.stall_after_s, "seconds without progress before a running job is stalled")
      ->check(CLI::PositiveNumber);
  app.add_option("--restart-settle", f.restart_settle_s,
                 "seconds a restarting job waits for all its workers before it settles for fewer (min_workers)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--keep-finished-jobs", f.keep_finished_jobs,
                 "ended jobs kept in the record, the oldest forgotten first (their checkpoints stay)")
      ->check(CLI::Range(1, 10000000));
  app.add_option("--keep-finished-hours", f.keep_finished_hours,
                 "forget ended jobs this many hours after they ended (0: at any age)")
      ->check(CLI::Range(0.0, 1e6));
  auto* port_flag = app.add_option("--metrics-port", f.metrics_port,
                                   "serve Prometheus /metrics and /sd/workers on this port of every interface "
                                   "(default 9400, any free port if it is taken; 0: any free port; -1: off)")
                        ->check(CLI::Range(-1, 65535));
  app.add_option("--metrics-listen", f.metrics_listen, "serve Prometheus /metrics on HOST:PORT")->excludes(port_flag);
  app.add_option("--log-format", f.log_format,
                 "the log on stderr, one line per job state change, worker joined or lost, checkpoint: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  port_flag->each([&f](const std::string&) { f.metrics_port_given = true; });
}

// The RPC tokens by role, checked against the flags that name them.
absl::StatusOr<shardline::AcceptedTokens> RpcTokens(const Flags& f) {
  if (f.shared_token && f.tokens.user.empty()) {
    return absl::InvalidArgumentError("--shared-token needs --token-file (the tokens it shares)");
  }
  if (!f.tokens.user.empty() && f.tokens.worker.empty()) {
    if (!f.shared_token) {
      return absl::InvalidArgumentError(
          "--token-file needs --worker-token-file (the workers' tokens), or --shared-token to let the user tokens "
          "serve workers too");
    }
    std::cerr << "shardline-coordinator: --shared-token: the user tokens serve workers too (no roles)" << std::endl;
  }
  return f.tokens.ReadRpcTokens();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const Flags& f) {
  if (f.tls_cert.empty() && f.tls_key.empty()) return grpc::InsecureServerCredentials();
  if (f.tls_cert.empty() || f.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
  }
  absl::StatusOr<std::string> cert = shardline::ReadFileToString(f.tls_cert, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = shardline::ReadFileToString(f.tls_key, "private key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

shardline::CoordinatorOptions CoreOptions(const Flags& f) {
  shardline::CoordinatorOptions options;
  options.heartbeat_interval = absl::Milliseconds(f.heartbeat_ms);
  options.lost_after_missed = f.lost_after_missed;
  options.stall_after = absl::Seconds(f.stall_after_s);
  options.restart_settle = absl::Seconds(f.restart_settle_s);
  options.keep_finished_jobs = f.keep_finished_jobs;
  options.keep_finished_for = absl::Hours(f.keep_finished_hours);
  return options;
}

// /metrics and /sd/workers, or none with --metrics-port -1. The default port
// taken (another coordinator on this host): any free one, printed, rather
// than no metrics at all.
absl::StatusOr<std::unique_ptr<shardline::metrics::MetricsServer>> StartMetrics(
    const Flags& f, shardline::CoordinatorMetrics& metrics, shardline::CoordinatorCore& core,
    std::vector<std::string> scrape_tokens) {
  const std::string addr = shardline::metrics::MetricsListenAddress(f.metrics_listen, f.metrics_port);
  if (addr.empty()) return nullptr;
  auto start = [&](const std::string& a) {
    return shardline::metrics::MetricsServer::Start(
        a, metrics.Pages(&core),
        {{"/sd/workers", [&core] { return shardline::WorkerScrapeTargets(core.ListWorkers()); }}}, scrape_tokens);
  };
  auto m = start(addr);
  if (!m.ok() && !f.metrics_port_given && f.metrics_listen.empty()) {
    std::cerr << "shardline-coordinator: " << m.status().message() << "; metrics on any free port" << std::endl;
    m = start("0.0.0.0:0");
  }
  return m;
}

std::unique_ptr<grpc::Server> StartServer(const Flags& f, std::shared_ptr<grpc::ServerCredentials> creds,
                                          shardline::CoordinatorService* service,
                                          shardline::CoordinatorMetrics& metrics, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(f.listen, creds, port);
  // Workers ping every 5 s to notice a cut link (worker_daemon.cc): allowed,
  // also on an idle session, without counting strikes against them.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 4000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.RegisterService(service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(metrics.RpcInterceptor());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  return builder.BuildAndStart();
}

// Waits for SIGINT or SIGTERM (the signal's number); a SIGHUP reads the
// token files again, keeping those in force if one no longer reads.
int WaitForStop(const sigset_t& signals, const Flags& f, shardline::CoordinatorService& service,
                shardline::metrics::MetricsServer* metrics_server, shardline::EventLog& log) {
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    absl::StatusOr<shardline::AcceptedTokens> rpc = f.tokens.ReadRpcTokens();
    absl::StatusOr<std::vector<std::string>> scrape = f.tokens.ReadMetricsTokens();
    if (!rpc.ok() || !scrape.ok()) {
      log.Emit("tokens_kept", {{"signal", "SIGHUP"},
                               {"error", std::string((!rpc.ok() ? rpc.status() : scrape.status()).message())}});
      continue;
    }
    service.SetTokens(*std::move(rpc));
    if (metrics_server) metrics_server->SetBearerTokens(*std::move(scrape));
    log.Emit("tokens_reloaded", {{"signal", "SIGHUP"}});
  }
  return sig;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardline-coordinator: the Shardline control plane"};
  Flags f;
  AddFlags(app, f);
  CLI11_PARSE(app, argc, argv);

  // One malloc arena for all of gRPC's threads: with one per thread, a
  // burst of calls leaves memory freed in many arenas, and the RSS then
  // follows how calls fell on threads rather than what the coordinator
  // holds. A control plane's call rate does not need more.
  mallopt(M_ARENA_MAX, 1);
  // Block the stop and reload signals in every thread, before any thread
  // starts (the metrics server's, gRPC's: a thread that left them unblocked
  // would take a SIGHUP's default action and end the process); this one
  // waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<shardline::AcceptedTokens> tokens = RpcTokens(f);
  if (!tokens.ok()) return Fail(tokens.status());
  absl::StatusOr<std::vector<std::string>> metrics_tokens = f.tokens.ReadMetricsTokens();
  if (!metrics_tokens.ok()) return Fail(metrics_tokens.status());
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = ServerCredentials(f);
  if (!creds.ok()) return Fail(creds.status());
  auto store = shardline::StateStore::Open(f.state_dir);
  if (!store.ok()) return Fail(store.status());
  shardline::LogFormat log_format = shardline::LogFormat::kText;
  shardline::ParseLogFormat(f.log_format, &log_format);  // the flag's check admits only the two
  shardline::EventLog event_log(log_format, stderr);  // outlives the core, which writes to it
  shardline::CoordinatorOptions options = CoreOptions(f);
  shardline::CoordinatorMetrics metrics;
  options.events = metrics.Events();
  options.events.log = [&event_log](std::string_view event, nlohmann::ordered_json fields) {
    event_log.Emit(event, std::move(fields));
  };
  shardline::CoordinatorCore core(store->get(), options);
  auto metrics_server = StartMetrics(f, metrics, core, *std::move(metrics_tokens));
  if (!metrics_server.ok()) return Fail(metrics_server.status());
  // Rows of the state database that do not read are named here and kept;
  // the other jobs serve (CoordinatorCore::Recover).
  std::vector<std::string> unreadable;
  if (absl::Status s = core.Recover(&unreadable); !s.ok()) return Fail(s);
  for (const std::string& line : unreadable) event_log.Emit("state_row_unreadable", {{"detail", line}});
  shardline::CoordinatorService service(&core, *std::move(tokens));
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartServer(f, *creds, &service, metrics, &port);
  if (!server || port == 0) return Fail(absl::UnavailableError(absl::StrCat("cannot listen on ", f.listen)));
  const std::string host = f.listen.substr(0, f.listen.rfind(':'));
  std::cout << "listening on " << host << ":" << port << std::endl;
  event_log.Emit("coordinator_started", {{"listen", absl::StrCat(host, ":", port)},
                                         {"state_dir", f.state_dir},
                                         {"version", shardline::kVersion}});
  if (*metrics_server) std::cout << "metrics on port " << (*metrics_server)->port() << std::endl;

  std::atomic<bool> running{true};
  std::thread ticker([&] {
    for (int tick = 0; running; ++tick) {
      core.Tick(absl::Now());
      // What a burst of calls freed (store values, abandoned waits) goes
      // back to the system rather than staying in malloc's free lists.
      if (tick % 10 == 0) malloc_trim(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const int sig = WaitForStop(signals, f, service, metrics_server->get(), event_log);
  event_log.Emit("coordinator_stopping", {{"signal", sig}});
  running = false;
  ticker.join();
  // Pending store waits are answered first: the server's shutdown waits for
  // every call to finish, and a wait would otherwise hold it to its timeout.
  core.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  metrics_server->reset();  // scrapes read the core: stop them before it goes
  return 0;
}
