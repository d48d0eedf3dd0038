// CollectiveAddress: the address a worker binds its collective traffic to
// (Gloo's TCP pairs, NCCL's bootstrap and socket transport), so that peers on
// other hosts can reach it (docs/design.md, "Hosts and addresses").
//
// Chosen once at start, in this order:
//   --listen-address ADDR   that address (an IP literal of this machine);
//   --interface NAME        the first IPv4 address of that interface (else
//                           its first IPv6 one), as GLOO_SOCKET_IFNAME and
//                           NCCL_SOCKET_IFNAME mean it;
//   neither                 the local address of the route to the
//                           coordinator: the route known to work. It is a
//                           loopback address only if the coordinator's is.
// Whatever is chosen must be bindable here, or the worker refuses to start,
// naming it. The interface that holds the address is what NCCL's bootstrap
// is told to use (NCCL_SOCKET_IFNAME), unless the environment says already.
//
// Errors: InvalidArgument for a malformed flag; FailedPrecondition for an
// address or interface this machine does not have, or cannot bind; each
// names the flag and the value (escaped). Thread-compatible: plain functions
// over the machine's interfaces.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace shardline {

struct CollectiveAddress {
  std::string address;    // IP literal, bound by Gloo and NCCL
  std::string interface;  // the interface holding it ("" where none is found, e.g. 0.0.0.0)
};

// `listen_address` and `interface` are the flags ("" when absent; both set is
// an error); `coordinator` is "host:port" (a name, an IPv4 literal or
// "[IPv6]:port"), used only when neither flag is set.
absl::StatusOr<CollectiveAddress> ChooseCollectiveAddress(const std::string& listen_address,
                                                          const std::string& interface,
                                                          const std::string& coordinator);

// Sets NCCL_SOCKET_IFNAME (exact match, "=NAME") and GLOO_SOCKET_IFNAME to
// `a.interface` where the environment has not set them and an interface is
// known. Call before any thread starts (setenv is not thread-safe).
void ExportCollectiveInterface(const CollectiveAddress& a);

}  // namespace shardline
