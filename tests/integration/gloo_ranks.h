// OnRanks: a Gloo group of `n` ranks on `n` threads of one process, over
// loopback through an in-memory store, for the tests of what runs over a
// Communicator.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "worker/comm/gloo_communicator.h"

namespace shardline::comm {

// Runs fn(rank, communicator) on `n` threads, one Gloo rank each.
inline void OnRanks(int n, const GlooOptions& o, const std::function<void(int, Communicator&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = CreateGlooCommunicator(store, "g/", r, n, o);
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c);
    });
  }
  for (auto& t : threads) t.join();
}

// Runs fn(shard_rank, replica, shard, replicas) on g x r threads: shard
// groups of g ranks, and replicate groups of the r ranks with the same place
// in each (worker/comm/groups.h's split of a world).
inline void OnRankGroups(int g, int r, const GlooOptions& o,
                         const std::function<void(int, int, Communicator&, Communicator&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int w = 0; w < g * r; ++w) {
    threads.emplace_back([&, w] {
      const int s = w % g, k = w / g;
      auto shard = CreateGlooCommunicator(store, "s" + std::to_string(k) + "/", s, g, o);
      ASSERT_TRUE(shard.ok()) << shard.status();
      auto replicas = CreateGlooCommunicator(store, "r" + std::to_string(s) + "/", k, r, o);
      ASSERT_TRUE(replicas.ok()) << replicas.status();
      fn(s, k, **shard, **replicas);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace shardline::comm
