// LinkProbe (worker/comm/link_probe.h) between ranks over a HashStore on
// loopback: ranks that reach each other blame no one; a peer whose host
// drops connection attempts is named; a peer that refuses (a reachable
// host) or that never published (it never began) is not.
#include "worker/comm/link_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>


#include <torch/csrc/distributed/c10d/HashStore.hpp>

namespace shardline::comm {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

LinkProbeOptions Loopback() {
  LinkProbeOptions o;
  o.bind_address = "127.0.0.1";
  return o;
}

int PortOf(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

TEST(LinkProbe, RanksThatReachEachOtherBlameNoOne) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<LinkProbe>> probes;
  for (int r = 0; r < 3; ++r) {
    probes.push_back(LinkProbe::Start(store, r, 3, Loopback()));
    ASSERT_NE(probes.back(), nullptr) << r;
  }
  for (int r = 0; r < 3; ++r) {
    const std::vector<UnreachablePeer> found = probes[r]->Unreachable();
    EXPECT_TRUE(found.empty()) << "rank " << r << " blamed rank " << found[0].rank << ": " << found[0].why;
  }
  // A peer whose probe stopped (its rendezvous succeeded) refuses: not blamed.
  probes[2].reset();
  EXPECT_TRUE(probes[0]->Unreachable().empty());
}

// Rank 1 stands for a host that drops every SYN: a listener whose accept
// queue is full (backlog 0 holds one connection; Linux drops the SYNs past
// it, so connects to it time out), as a cut link does. Rank 2 refuses (a
// closed port: its host answered). Rank 3 never publishes.
TEST(LinkProbe, APeerThatDropsConnectionsIsNamedAndOnlyIt) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int full = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(full, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(full, 0), 0);
  a.sin_port = htons(PortOf(full));
  std::vector<int> fillers;
  for (int i = 0; i < 2; ++i) {
    const int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    fillers.push_back(c);
  }
  absl::SleepFor(absl::Milliseconds(100));  // their handshakes fill the queue
  store->set("addr/1", Bytes("127.0.0.1:" + std::to_string(PortOf(full))));
  const int closed = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_port = 0;
  ASSERT_EQ(bind(closed, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  store->set("addr/2", Bytes("127.0.0.1:" + std::to_string(PortOf(closed))));  // bound, not listening

  std::unique_ptr<LinkProbe> probe = LinkProbe::Start(store, 0, 4, Loopback());
  ASSERT_NE(probe, nullptr);
  EXPECT_TRUE(store->check({"addr/0"}));
  const absl::Time t0 = absl::Now();
  const std::vector<UnreachablePeer> cut = probe->Unreachable();
  const absl::Duration took = absl::Now() - t0;
  ASSERT_EQ(cut.size(), 1u);
  EXPECT_EQ(cut[0].rank, 1);
  EXPECT_EQ(cut[0].why, "timed out");
  EXPECT_EQ(cut[0].address, "127.0.0.1:" + std::to_string(PortOf(full)));
  // The contract's bound: the connect timeout (2 s), plus store reads.
  EXPECT_LT(took, absl::Seconds(4)) << took;
  for (int fd : fillers) close(fd);
  close(full);
  close(closed);
}

}  // namespace
}  // namespace shardline::comm
