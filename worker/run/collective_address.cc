#include "worker/run/collective_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/host_port.h"
#include "common/base/quoted.h"

namespace shardline {
namespace {

// A file descriptor closed on scope exit.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  const int fd_;
};

// The text of an IPv4 or IPv6 socket address ("" for other families).
std::string IpText(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

bool IsLinkLocal6(const sockaddr* sa) {
  return sa->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
}

// Every interface with an IP address, and the addresses, in getifaddrs order.
struct InterfaceAddress {
  std::string interface, address;
  int family;
};
std::vector<InterfaceAddress> Interfaces() {
  std::vector<InterfaceAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_name == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if ((family != AF_INET && family != AF_INET6) || IsLinkLocal6(i->ifa_addr)) continue;
    out.push_back({i->ifa_name, IpText(i->ifa_addr), family});
  }
  freeifaddrs(list);
  return out;
}

std::string InterfaceHolding(const std::string& ip) {
  for (const InterfaceAddress& i : Interfaces()) {
    if (i.address == ip) return i.interface;
  }
  return "";
}

absl::StatusOr<std::string> AddressOfInterface(const std::string& name) {
  std::string v6;
  std::set<std::string> names;
  for (const InterfaceAddress& i : Interfaces()) {
    names.insert(i.interface);
    if (i.interface != name) continue;
    if (i.family == AF_INET) return i.address;
    if (v6.empty()) v6 = i.address;
  }
  if (!v6.empty()) return v6;
  return absl::FailedPreconditionError(absl::StrCat("--interface ", Quoted(name),
                                                    ": no interface of that name with an IP address (this machine has ",
                                                    Shown(absl::StrJoin(names, ", "), 200), ")"));
}

// Binds a TCP socket to `ip`, any port, and lets it go: what Gloo and NCCL
// will do with it.
absl::StatusOr<std::string> LocalAddressToward(const std::string& coordinator);

// Peers connect to the address a worker registers: it must name one host.
// The unspecified address (0.0.0.0, ::) and multicast ones name none, and
// a loopback address is this machine to every peer: it is refused unless
// the coordinator's own address is a loopback one (a cluster on one machine).
absl::Status CheckConnectable(const std::string& what, const std::string& ip, const std::string& coordinator) {
  in_addr v4;
  in6_addr v6;
  bool unspecified = false, multicast = false, loopback = false;
  if (::inet_pton(AF_INET, ip.c_str(), &v4) == 1) {
    const uint32_t a = ntohl(v4.s_addr);
    unspecified = a == 0;
    multicast = (a >> 28) == 0xE;
    loopback = (a >> 24) == 127;
  } else if (::inet_pton(AF_INET6, ip.c_str(), &v6) == 1) {
    unspecified = IN6_IS_ADDR_UNSPECIFIED(&v6);
    multicast = IN6_IS_ADDR_MULTICAST(&v6);
    loopback = IN6_IS_ADDR_LOOPBACK(&v6);
  } else {
    return absl::OkStatus();  // CheckBindable names what is not an address
  }
  if (unspecified || multicast) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Quoted(ip), ": ", unspecified ? "the unspecified" : "a multicast",
                                                   " address, which peers cannot connect to; give one of this "
                                                   "machine's own addresses"));
  }
  if (!loopback || coordinator.empty()) return absl::OkStatus();
  // The coordinator is on this machine where the route to it is a loopback
  // one (a name that resolves to 127.0.1.1 counts); unknown: not refused.
  absl::StatusOr<std::string> toward = LocalAddressToward(coordinator);
  bool coordinator_local = !toward.ok();
  if (toward.ok()) {
    in_addr t4;
    in6_addr t6;
    coordinator_local = (::inet_pton(AF_INET, toward->c_str(), &t4) == 1 && (ntohl(t4.s_addr) >> 24) == 127) ||
                        (::inet_pton(AF_INET6, toward->c_str(), &t6) == 1 && IN6_IS_ADDR_LOOPBACK(&t6));
  }
  if (!coordinator_local) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Quoted(ip), ": a loopback address, which peers on other "
                                                   "hosts cannot reach (the coordinator is at ", Quoted(coordinator),
                                                   "); give this machine's address on their network"));
  }
  return absl::OkStatus();
}

absl::Status CheckBindable(const std::string& what, const std::string& ip) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    len = sizeof(*v6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Quoted(ip), ": not an IPv4 or IPv6 address"));
  }
  Socket s(socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd() < 0 || bind(s.fd(), reinterpret_cast<const sockaddr*>(&ss), len) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", Quoted(ip), ": cannot bind it here (", std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

// The source address the kernel picks for packets to the coordinator: a UDP
// socket's connect() routes without sending anything.
absl::StatusOr<std::string> LocalAddressToward(const std::string& coordinator) {
  std::string target = coordinator;
  for (const char* scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (target.rfind(scheme, 0) == 0) target = target.substr(std::strlen(scheme));
  }
  std::string host, port;
  SplitHostPort(target, &host, &port);  // both stay empty where it does not split: refused below
  auto fail = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat("the coordinator ", Quoted(coordinator),
                                                      ": no local address routes to it (", why,
                                                      "); give --listen-address or --interface"));
  };
  if (host.empty() || port.empty()) return fail("expected host:port");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) return fail(gai_strerror(e));
  std::string why = "no address";
  std::string local;
  for (addrinfo* a = found; a != nullptr && local.empty(); a = a->ai_next) {
    Socket s(socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (s.fd() < 0 || connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0 ||
        getsockname(s.fd(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      why = std::strerror(errno);
      continue;
    }
    local = IpText(reinterpret_cast<const sockaddr*>(&ss));
  }
  freeaddrinfo(found);
  if (local.empty()) return fail(why);
  return local;
}

}  // namespace

absl::StatusOr<CollectiveAddress> ChooseCollectiveAddress(const std::string& listen_address,
                                                          const std::string& interface,
                                                          const std::string& coordinator) {
  CollectiveAddress a;
  std::string what;
  if (!listen_address.empty() && !interface.empty()) {
    return absl::InvalidArgumentError("--listen-address and --interface: give one of them");
  }
  if (!listen_address.empty()) {
    what = "--listen-address";
    a.address = listen_address;
  } else if (!interface.empty()) {
    what = "--interface " + Quoted(interface) + ": its address";
    auto found = AddressOfInterface(interface);
    if (!found.ok()) return found.status();
    a.address = *found;
  } else {
    what = "the address routing to the coordinator";
    auto found = LocalAddressToward(coordinator);
    if (!found.ok()) return found.status();
    a.address = *found;
  }
  if (absl::Status s = CheckConnectable(what, a.address, coordinator); !s.ok()) return s;
  if (absl::Status s = CheckBindable(what, a.address); !s.ok()) return s;
  a.interface = interface.empty() ? InterfaceHolding(a.address) : interface;
  return a;
}

void ExportCollectiveInterface(const CollectiveAddress& a) {
  if (a.interface.empty()) return;
  // "=" asks NCCL for this exact name, not every interface it prefixes.
  if (std::getenv("NCCL_SOCKET_IFNAME") == nullptr) setenv("NCCL_SOCKET_IFNAME", ("=" + a.interface).c_str(), 1);
  if (std::getenv("GLOO_SOCKET_IFNAME") == nullptr) setenv("GLOO_SOCKET_IFNAME", a.interface.c_str(), 1);
}

}  // namespace shardline
