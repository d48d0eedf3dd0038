// shardline-worker --coordinator ADDR --device cpu|cuda:N [--token-file F]
//                  [--tls-ca F] [--host NAME] [--listen-address IP | --interface NAME] [--threads N]
//                  [--metrics-port P | --metrics-listen HOST:PORT] [--metrics-token-file F]
// One worker daemon per device. --token-file holds a worker token (the
// coordinator's --worker-token-file). SIGINT/SIGTERM stop it.
#include <signal.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/build_info.h"
#include "common/base/file_util.h"
#include "common/base/quoted.h"
#include "common/job/device_spec.h"
#include "worker/device/device.h"
#include "worker/run/collective_address.h"
#include "worker/worker_daemon.h"
#include "worker/worker_metrics.h"

namespace {

// The flags that are not WorkerOptions fields as they are.
struct Flags {
  std::string token_file, tls_ca, metrics_listen, metrics_token_file, listen_address, interface;
  double timeout_s = 30;
  int metrics_port = 0;  // any free port: several workers share a host; /sd/workers lists it
};

void AddFlags(CLI::App& app, shardline::WorkerOptions& o, Flags& f) {
  app.set_version_flag("--version",
                       std::string("shardline-worker ") + shardline::kVersion + " (" + shardline::kRevision + ")");
  app.add_option("--coordinator", o.coordinator, "coordinator address (host:port)");
  app.add_option("--device", o.device, "cpu or cuda:N");
  app.add_option("--token-file", f.token_file, "file holding a worker token of the coordinator");
  app.add_option("--tls-ca", f.tls_ca, "PEM root certificate: connect with TLS");
  app.add_option("--host", o.host,
                 "host to register: where hybrid shard groups live (default: this machine's name; in Kubernetes, "
                 "the node's)");
  auto* listen_flag = app.add_option("--listen-address", f.listen_address,
                                     "IP address to bind collectives to, which peers must reach (default: the local "
                                     "address of the route to the coordinator)");
  app.add_option("--interface", f.interface, "bind collectives to this interface's address (as NCCL_SOCKET_IFNAME)")
      ->excludes(listen_flag);
  app.add_option("--threads", o.threads, "intra-op threads for training")->check(CLI::Range(1, 1024));
  app.add_option("--collective-timeout", f.timeout_s, "deadline of every collective and rendezvous, seconds")
      ->check(CLI::Range(0.1, 86400.0));
  auto* port_flag = app.add_option("--metrics-port", f.metrics_port,
                                   "serve Prometheus /metrics on this port of every interface (default 0: any free "
                                   "port, reported to the coordinator's /sd/workers; -1: off)")
                        ->check(CLI::Range(-1, 65535));
  app.add_option("--metrics-listen", f.metrics_listen, "serve Prometheus /metrics on HOST:PORT")->excludes(port_flag);
  app.add_option("--metrics-token-file", f.metrics_token_file,
                 "scrapes must carry a bearer token of this file (one per line)");
  app.add_option("--peak-flops", o.peak_flops, "one device's peak FLOP/s for MFU (default: per device kind)")
      ->check(CLI::Range(0.0, 1e18));
}

// What a misconfigured daemon is refused for at start (exit 2): its host,
// its device, the address its collectives bind to.
absl::Status CheckConfiguration(shardline::WorkerOptions& o, const Flags& f) {
  // The coordinator refuses a registration whose host is not this (it is
  // listed to every user): say so here, once, rather than retry forever.
  if (o.host.size() > 255 || !shardline::IsPrintable(o.host)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host ", shardline::Quoted(o.host), ": at most 255 bytes of printable text"));
  }
  if (absl::Status spec = shardline::ParseDeviceSpec(o.device).status(); !spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--device: ", spec.message()));
  }
  // First, before any other ATen call (device.h says why): a daemon that
  // cannot use its device refuses to start, as an operator expects, rather
  // than registering and failing every job it is given.
  if (absl::Status s = shardline::PrepareDevice(o.device); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--device: ", s.message()));
  }
  // Before any thread starts: ExportCollectiveInterface sets the environment.
  auto address = shardline::ChooseCollectiveAddress(f.listen_address, f.interface, o.coordinator);
  if (!address.ok()) return address.status();
  shardline::ExportCollectiveInterface(*address);
  o.collective_address = address->address;
  o.collective_timeout = absl::Seconds(f.timeout_s);
  return absl::OkStatus();
}

// The files the daemon reads at start (exit 1): its token, the CA, the
// metrics tokens.
absl::Status ReadCredentials(shardline::WorkerOptions& o, const Flags& f,
                             std::vector<std::string>* metrics_tokens) {
  if (!f.token_file.empty()) {
    auto t = shardline::ReadTokenFile(f.token_file);
    if (!t.ok()) return t.status();
    o.token = *t;
  }
  if (!f.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    auto ca = shardline::ReadFileToString(f.tls_ca, "CA certificate");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    o.credentials = grpc::SslCredentials(ssl);
  }
  if (!f.metrics_token_file.empty()) {
    auto t = shardline::ReadAcceptedTokens(f.metrics_token_file);
    if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat("--metrics-token-file: ", t.status().message()));
    *metrics_tokens = *std::move(t);
  }
  return absl::OkStatus();
}

// Runs the daemon until SIGINT or SIGTERM; the exit status.
int Serve(shardline::WorkerOptions o, const sigset_t& stop) {
  shardline::WorkerDaemon daemon(o);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop, &sig);
    daemon.Stop();
  });
  waiter.detach();
  const absl::Status stopped = daemon.Run();
  if (!stopped.ok()) std::cerr << "shardline-worker: stopped: " << stopped.message() << std::endl;
  // A job blocked in a collective with a peer that is gone would otherwise
  // hold the process until the collective's deadline: stopping is bounded.
  if (!daemon.WaitForJob(absl::Seconds(5))) {
    std::cerr << "shardline-worker: the running job did not stop within 5s; exiting without it" << std::endl;
    std::_Exit(1);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardline-worker: a Shardline worker daemon"};
  shardline::WorkerOptions o;
  Flags f;
  AddFlags(app, o, f);
  CLI11_PARSE(app, argc, argv);
  if (absl::Status s = CheckConfiguration(o, f); !s.ok()) {
    std::cerr << "shardline-worker: " << s.message() << std::endl;
    return 2;
  }
  std::vector<std::string> metrics_tokens;
  if (absl::Status s = ReadCredentials(o, f, &metrics_tokens); !s.ok()) {
    std::cerr << "shardline-worker: " << s.message() << std::endl;
    return 1;
  }
  // Block the stop signals before any thread starts (the metrics server's,
  // gRPC's), so that only the waiter takes them and the worker stops its
  // job rather than dying of the default action.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  const std::string listen = shardline::metrics::MetricsListenAddress(f.metrics_listen, f.metrics_port);
  auto metrics = shardline::WorkerMetrics::Start(listen, std::move(metrics_tokens));
  if (!metrics.ok()) {
    std::cerr << "shardline-worker: metrics: " << metrics.status().message() << std::endl;
    return 1;
  }
  o.metrics = std::move(*metrics);
  if (!listen.empty()) std::cerr << "shardline-worker: metrics on port " << o.metrics->port() << std::endl;
  return Serve(std::move(o), stop);
}
