#include "worker/comm/link_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"

namespace shardline::comm {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A listening socket on `ip` (any port), or -1; `*published` is "ip:port"
// ("[ip]:port" for IPv6).
int Listen(const std::string& ip, std::string* published) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (inet_pton(AF_INET, ip.c_str(), &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr) == 1) {
    ss.ss_family = AF_INET;
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, ip.c_str(), &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr) == 1) {
    ss.ss_family = AF_INET6;
    len = sizeof(sockaddr_in6);
  } else {
    return -1;
  }
  const int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    close(fd);
    return -1;
  }
  const int port = ss.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port)
                                           : ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  *published = ss.ss_family == AF_INET ? absl::StrCat(ip, ":", port) : absl::StrCat("[", ip, "]:", port);
  return fd;
}

// A non-blocking connect to "ip:port" / "[ip]:port" under way: the socket,
// or -1 with `*err` set where it failed at once.
int StartConnect(const std::string& address, int* err) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) {
    *err = EDESTADDRREQ;
    return -1;
  }
  sockaddr_storage ss{};
  socklen_t len = 0;
  const int p = std::atoi(port.c_str());
  if (inet_pton(AF_INET, host.c_str(), &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr) == 1) {
    ss.ss_family = AF_INET;
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(p);
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr) == 1) {
    ss.ss_family = AF_INET6;
    reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(p);
    len = sizeof(sockaddr_in6);
  } else {
    *err = EDESTADDRREQ;
    return -1;
  }
  const int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
    *err = errno;
    close(fd);
    return -1;
  }
  return fd;
}

// Whether a failed connect's errno means the link drops or cannot route
// packets (a refusal is an answer from the peer's host).
bool NoRoute(int err) { return err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH; }

}  // namespace

std::unique_ptr<LinkProbe> LinkProbe::Start(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                            const LinkProbeOptions& options) {
  std::string mine;
  const int listener = Listen(options.bind_address, &mine);
  if (listener < 0) return nullptr;
  std::unique_ptr<LinkProbe> probe(new LinkProbe(store, rank, size, options, listener));
  try {
    store->set(absl::StrCat("addr/", rank), Bytes(mine));
  } catch (const std::exception&) {
    return nullptr;
  }
  return probe;
}

LinkProbe::LinkProbe(c10::intrusive_ptr<c10d::Store> store, int rank, int size, LinkProbeOptions options,
                     int listener)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)), listener_(listener) {
  accepter_ = std::thread([this] {
    while (!stop_.load()) {
      pollfd p{listener_, POLLIN, 0};
      if (poll(&p, 1, 50) == 1) {
        const int c = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          close(c);
        } else if (errno != EAGAIN && errno != EINTR) {
          absl::SleepFor(absl::Milliseconds(50));  // out of descriptors: no spinning on the pending one
        }
      }
    }
  });
}

LinkProbe::~LinkProbe() {
  stop_.store(true);
  accepter_.join();
  close(listener_);
}

std::vector<UnreachablePeer> LinkProbe::Unreachable() {
  std::vector<UnreachablePeer> unreachable;
  struct Attempt {
    int rank;
    std::string address;
    int fd;
  };
  std::vector<Attempt> in_flight;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (!addresses_.count(p)) {
      try {
        const std::string key = absl::StrCat("addr/", p);
        if (!store_->check({key})) continue;
        const std::vector<uint8_t> v = store_->get(key);
        addresses_[p].assign(v.begin(), v.end());
      } catch (const std::exception&) {
        continue;
      }
    }
    const std::string& address = addresses_[p];
    int err = 0;
    const int fd = StartConnect(address, &err);
    if (fd >= 0) {
      in_flight.push_back({p, address, fd});
    } else if (NoRoute(err)) {
      unreachable.push_back({p, address, std::strerror(err)});
    }
  }
  const absl::Time until = absl::Now() + options_.connect_timeout;
  while (!in_flight.empty()) {
    std::vector<pollfd> fds;
    for (const Attempt& a : in_flight) fds.push_back({a.fd, POLLOUT, 0});
    const int wait_ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(until - absl::Now())));
    poll(fds.data(), fds.size(), std::min(wait_ms, 50));
    const bool late = absl::Now() >= until;
    std::vector<Attempt> still;
    for (size_t i = 0; i < in_flight.size(); ++i) {
      const Attempt& a = in_flight[i];
      if (fds[i].revents == 0 && !late) {
        still.push_back(a);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (fds[i].revents == 0) {
        unreachable.push_back({a.rank, a.address, "timed out"});
      } else if (getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0 && NoRoute(err)) {
        unreachable.push_back({a.rank, a.address, std::strerror(err)});
      }
      close(a.fd);
    }
    in_flight = std::move(still);
  }
  std::sort(unreachable.begin(), unreachable.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return unreachable;
}

}  // namespace shardline::comm
