// shardline-coordinator --listen ADDR --state-dir DIR [--token-file F]
//                       [--tls-cert F --tls-key F] [--heartbeat-ms N]
//
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
#include "server/coordinator_core.h"
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
  int heartbeat_ms = 1000;
  app.add_option("--listen", listen, "address to serve on (host:port)");
  app.add_option("--state-dir", state_dir, "directory for the state database")->required();
  app.add_option("--token-file", token_file, "file holding the bearer token every RPC must carry");
  app.add_option("--tls-cert", tls_cert, "PEM certificate (with --tls-key: serve TLS)");
  app.add_option("--tls-key", tls_key, "PEM private key");
  app.add_option("--heartbeat-ms", heartbeat_ms, "worker heartbeat interval; 3 missed = lost");
  CLI11_PARSE(app, argc, argv);

  std::string token;
  if (!token_file.empty()) {
    auto t = shardline::ReadFileToString(token_file, "token file");
    if (!t.ok()) return Fail(t.status());
    token = std::string(absl::StripAsciiWhitespace(*t));
    if (token.empty()) return Fail(absl::InvalidArgumentError(token_file + ": token file is empty"));
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
  shardline::CoordinatorCore core(store->get(), options);
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
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail(absl::UnavailableError(absl::StrCat("cannot listen on ", listen)));
  const std::string host = listen.substr(0, listen.rfind(':'));
  std::cout << "listening on " << host << ":" << port << std::endl;

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
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
