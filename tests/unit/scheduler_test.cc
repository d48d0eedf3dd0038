// Scheduler alone: queue order, a job that waits for idle workers holds the
// queue, a job with too few workers registered is passed over until the
// registry changes, and placement prefers CUDA and the largest world.
#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace shardline {
namespace {

using Outcome = Scheduler::StartOutcome;

TEST(Scheduler, RestartsGoFirstAndAJobIsQueuedOnce) {
  Scheduler s;
  s.Enqueue("job-1");
  s.Enqueue("job-2");
  s.Enqueue("job-3");
  s.EnqueueFront("job-2");
  EXPECT_EQ(s.Queued(), (std::vector<std::string>{"job-2", "job-1", "job-3"}));
  s.EnqueueFront("job-4");
  s.Remove("job-1");
  s.Remove("job-9");
  EXPECT_EQ(s.Queued(), (std::vector<std::string>{"job-4", "job-2", "job-3"}));
}

TEST(Scheduler, AJobWaitingForIdleWorkersHoldsTheQueue) {
  Scheduler s;
  for (const char* id : {"job-1", "job-2", "job-3"}) s.Enqueue(id);
  std::vector<std::string> looked;
  std::map<std::string, Outcome> outcome = {
      {"job-1", Outcome::kStarted}, {"job-2", Outcome::kWaitsForIdle}, {"job-3", Outcome::kStarted}};
  s.Run(1, [&](const std::string& id) {
    looked.push_back(id);
    return outcome[id];
  });
  EXPECT_EQ(looked, (std::vector<std::string>{"job-1", "job-2"}));
  EXPECT_EQ(s.Queued(), (std::vector<std::string>{"job-2", "job-3"}));
  EXPECT_EQ(s.start_attempts(), 2);
}

TEST(Scheduler, AJobWithTooFewRegisteredIsPassedOverUntilTheRegistryChanges) {
  Scheduler s;
  s.Enqueue("big");
  s.Enqueue("small");
  std::vector<std::string> looked;
  auto run = [&](uint64_t version, Outcome big, Outcome small) {
    looked.clear();
    s.Run(version, [&](const std::string& id) {
      looked.push_back(id);
      return id == "big" ? big : small;
    });
  };
  run(5, Outcome::kTooFewRegistered, Outcome::kWaitsForIdle);
  EXPECT_EQ(looked, (std::vector<std::string>{"big", "small"}));  // small may pass it
  run(5, Outcome::kTooFewRegistered, Outcome::kWaitsForIdle);
  EXPECT_EQ(looked, (std::vector<std::string>{"small"}));  // big not looked at again
  run(6, Outcome::kStarted, Outcome::kWaitsForIdle);
  EXPECT_EQ(looked, (std::vector<std::string>{"big", "small"}));
  EXPECT_EQ(s.Queued(), (std::vector<std::string>{"small"}));
  EXPECT_EQ(s.start_attempts(), 5);
}

TEST(Scheduler, PlacementPrefersCudaThenTheLargestWorldTheConfigAllows) {
  std::vector<WorkerRecord> cuda(3), cpu(4);
  auto census = [&](int n_cuda, int n_cpu) {
    WorkerRegistry::Census c;
    for (int i = 0; i < n_cuda; ++i) c.idle_by_kind["cuda"].push_back(&cuda[i]);
    for (int i = 0; i < n_cpu; ++i) c.idle_by_kind["cpu"].push_back(&cpu[i]);
    return c;
  };
  // Even world sizes only (as a batch of 2 per rank would).
  std::vector<std::pair<int, int>> asked;
  auto even = [&](int lo, int hi) {
    asked.emplace_back(lo, hi);
    for (int w = hi; w >= lo; --w) {
      if (w % 2 == 0) return w;
    }
    return 0;
  };
  WorkerRegistry::Census both = census(3, 4);
  Scheduler::Placement p = Scheduler::Place(both, 2, 4, even);
  EXPECT_EQ(p.world, 2);  // 3 CUDA idle: the largest even world is 2
  ASSERT_EQ(p.workers.size(), 3u);
  EXPECT_EQ(p.workers[0], &cuda[0]);
  EXPECT_EQ(asked, (std::vector<std::pair<int, int>>{{2, 3}}));
  // Asking for 4 at least: CUDA cannot, CPU can.
  asked.clear();
  WorkerRegistry::Census again = census(3, 4);
  p = Scheduler::Place(again, 4, 4, even);
  EXPECT_EQ(p.world, 4);
  EXPECT_EQ(p.workers[0], &cpu[0]);
  EXPECT_EQ(asked, (std::vector<std::pair<int, int>>{{4, 3}, {4, 4}}));
  // Fits nowhere: nothing is moved out of the census (the caller's message counts it).
  WorkerRegistry::Census few = census(1, 1);
  p = Scheduler::Place(few, 2, 2, even);
  EXPECT_EQ(p.world, 0);
  EXPECT_TRUE(p.workers.empty());
  EXPECT_EQ(few.idle_by_kind["cuda"].size(), 1u);
  EXPECT_EQ(few.idle_by_kind["cpu"].size(), 1u);
}

}  // namespace
}  // namespace shardline
