// LinkProbe: which peers of a group this rank cannot open a TCP connection
// to, asked once its rendezvous failed. Gloo's full-mesh connect names no
// peer when it times out, so a link cut between two hosts would fail every
// attempt without either end being left out; the probe finds the link.
//
// Each rank starts a probe as it begins the group's rendezvous: it listens
// on its collective address and publishes that under `addr/R` in the store
// (one store write a rank: O(N) a group). A rank whose rendezvous is slow,
// or failed, calls Unreachable(), which connects to every peer that
// published, all at once; peers still inside the rendezvous are listening. A refused connection is an answer from the peer's host (its
// rendezvous succeeded and its probe stopped); only a connection that times
// out or finds no route blames the peer. A peer that never published (it
// never began) is not blamed.
//
// Contract: Start never blocks but for one store write; Unreachable blocks
// for at most options.connect_timeout plus a store check a peer not yet
// seen (each peer's address is read once). Store errors blame no one. The
// destructor stops listening. Not thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/time/time.h"

namespace shardline::comm {

struct LinkProbeOptions {
  std::string bind_address;  // the rank's collective address (an IP)
  // One lost SYN is retransmitted after 1 s: 2 s still tells a lost packet
  // from a link that drops them all.
  absl::Duration connect_timeout = absl::Seconds(2);
};

struct UnreachablePeer {
  int rank = -1;        // group rank
  std::string address;  // what it published
  std::string why;      // "timed out", "No route to host", ...
};

class LinkProbe {
 public:
  // `store` holds the probe's keys only (a PrefixStore of the group's name)
  // and must outlive the probe. Null where the rank cannot listen on its
  // address or publish it (the probe then blames no one).
  static std::unique_ptr<LinkProbe> Start(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                          const LinkProbeOptions& options);
  ~LinkProbe();
  LinkProbe(const LinkProbe&) = delete;
  LinkProbe& operator=(const LinkProbe&) = delete;

  std::vector<UnreachablePeer> Unreachable();

 private:
  LinkProbe(c10::intrusive_ptr<c10d::Store> store, int rank, int size, LinkProbeOptions options, int listener);
  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_, size_;
  const LinkProbeOptions options_;
  const int listener_;
  std::map<int, std::string> addresses_;  // the peers' published ones, by group rank
  std::atomic<bool> stop_{false};
  std::thread accepter_;  // accepts and closes, until destroyed
};

}  // namespace shardline::comm
