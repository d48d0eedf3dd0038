#include "common/metrics/metrics_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/accepted_token.h"
#include "common/base/host_port.h"
#include "common/metrics/metrics_process.h"

namespace shardline::metrics {
namespace {

// libmicrohttpd in its epoll mode: one thread polls every connection, so a
// connection that sends nothing, or a header a byte a second, costs a file
// descriptor and no thread (a thread-per-connection server stalls every
// scrape behind as many of them as it has threads). Idle connections close
// after kIdleSeconds. Descriptors are the process's (a worker's sockets and
// data files need them too): at most an eighth of the soft RLIMIT_NOFILE,
// and kMaxConnections, are open at once, and kMaxPerAddress from one
// address; new ones past either are closed at once, so a flood from one
// address leaves Prometheus' own connection (it uses one) served. A scrape
// is a few kilobytes built in the polling thread.
constexpr unsigned kIdleSeconds = 10;
constexpr unsigned kMaxConnections = 1024;
constexpr unsigned kMaxPerAddress = 8;

unsigned ConnectionLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return kMaxConnections;
  return static_cast<unsigned>(std::max<rlim_t>(kMaxPerAddress, std::min<rlim_t>(kMaxConnections, r.rlim_cur / 8)));
}

MHD_Result Respond(MHD_Connection* conn, unsigned code, const char* type, const std::string& body,
                   const char* header = nullptr, const char* value = nullptr) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()),
                                                    MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;  // out of memory: MHD closes the connection
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (header != nullptr) MHD_add_response_header(r, header, value);
  const MHD_Result queued = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return queued;
}

// "HOST:PORT" or "[V6]:PORT" as a socket address (numeric hosts, or names
// getaddrinfo resolves), or an error naming `listen`.
absl::StatusOr<std::pair<sockaddr_storage, socklen_t>> ListenSockaddr(const std::string& listen) {
  std::string host, port;
  if (!SplitHostPort(listen, &host, &port) || port.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: listen address \"", listen, "\": expected HOST:PORT or [IPV6]:PORT"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: listen address \"", listen, "\": ", gai_strerror(e)));
  }
  std::pair<sockaddr_storage, socklen_t> a{};
  std::memcpy(&a.first, found->ai_addr, found->ai_addrlen);
  a.second = found->ai_addrlen;
  freeaddrinfo(found);
  return a;
}

int PortOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

// libmicrohttpd's request callback; `cls` is the server.
MHD_Result Handle(void* cls, MHD_Connection* conn, const char* url, const char* method, const char* /*version*/,
                  const char* /*upload_data*/, size_t* upload_data_size, void** /*con_cls*/) {
  const auto* server = static_cast<const MetricsServer*>(cls);
  // Answered at the first call, before any body is read: MHD then closes
  // the connection after the response (no keep-alive; Prometheus opens
  // another for its next scrape).
  (void)upload_data_size;
  if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 && std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    return Respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "405 method not allowed: this server takes GET\n",
                   MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  }
  if (!server->Allowed(MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION))) {
    return Respond(conn, MHD_HTTP_UNAUTHORIZED, "text/plain",
                   "401 unauthorized: this endpoint takes \"Authorization: Bearer <token>\"\n",
                   MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  }
  const std::string path = url ? url : "";
  if (const MetricsServer::JsonHandler* json = server->Extra(path)) return Respond(conn, MHD_HTTP_OK, "application/json", (*json)());
  if (path != "/metrics") {
    return Respond(conn, MHD_HTTP_NOT_FOUND, "text/plain", "404 not found: this server has /metrics\n");
  }
  return Respond(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", server->Page());
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

std::string MetricsServer::Page() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& page : pages_) {
    std::vector<prometheus::MetricFamily> f = page->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()), std::make_move_iterator(f.end()));
  }
  return Serialize(families);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> pages,
    std::map<std::string, JsonHandler> extra, std::vector<std::string> bearer_tokens) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->SetBearerTokens(std::move(bearer_tokens));
  server->extra_ = std::move(extra);
  server->pages_ = std::move(pages);
  server->pages_.push_back(std::make_shared<ProcessCollector>());

  auto addr = ListenSockaddr(listen);
  if (!addr.ok()) return addr.status();
  const int fd = socket(addr->first.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(fd, reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", listen, ": ", why));
  }
  server->port_ = PortOf(fd);
  struct stat ours {};
  fstat(fd, &ours);
  server->daemon_ = MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ITC, 0, nullptr, nullptr, &Handle, server.get(),
      MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT, kIdleSeconds, MHD_OPTION_CONNECTION_LIMIT,
      ConnectionLimit(), MHD_OPTION_PER_IP_CONNECTION_LIMIT, kMaxPerAddress, MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    // Some of MHD's failures close the socket and some do not: it is closed
    // here only if the descriptor still is that socket (another thread may
    // have been given the number since).
    struct stat now {};
    if (fstat(fd, &now) == 0 && now.st_dev == ours.st_dev && now.st_ino == ours.st_ino) close(fd);
    return absl::UnavailableError(absl::StrCat("metrics: cannot start the HTTP server on ", listen));
  }
  // From here MHD owns the socket: MHD_stop_daemon closes it.
  return server;
}

MetricsServer::~MetricsServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);  // waits for its thread, closes every connection
}

}  // namespace shardline::metrics
