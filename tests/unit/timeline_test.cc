// Timeline: the step lane's scopes and waits and the communicators' lanes
// end up in the file as Chrome trace events, on the wall clock; a collective
// span ends when it is reported and lasts the seconds its backend measured;
// the observer passes every collective on; past the cap spans are counted,
// not kept.
#include "worker/comm/timeline.h"

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "worker/comm/comm_waiter.h"

namespace shardline {
namespace {

using Json = nlohmann::json;

Json Load(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

// The complete ("X") events of a trace, by name.
std::map<std::string, Json> Spans(const Json& trace) {
  std::map<std::string, Json> out;
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") out[e["name"].get<std::string>()] = e;
  }
  return out;
}

class CountingObserver : public comm::CollectiveObserver {
 public:
  void OnCollective(comm::Op op, int64_t bytes, double, int64_t seq, bool ok) override {
    calls.push_back({op, bytes, seq, ok});
  }
  struct Call {
    comm::Op op;
    int64_t bytes, seq;
    bool ok;
  };
  std::vector<Call> calls;
};

TEST(TimelineTest, LanesSpansAndObserverChain) {
  Timeline timeline(3);
  const absl::Time before = absl::Now();
  {
    const Timeline::Scope step(&timeline, "step", "1");
    const Timeline::Scope forward(&timeline, "forward", "transformer.h.0");
  }
  auto next = std::make_shared<CountingObserver>();
  const auto observer = timeline.Observer(Timeline::Lane::kShard, next);
  observer->OnCollective(comm::Op::kAllGather, 4096, 0.25, 7, true);
  timeline.Observer(Timeline::Lane::kReplicate)->OnCollective(comm::Op::kAllReduce, 8, 0.001, 2, false);
  CommWaiter waiter(absl::Seconds(1));
  waiter.set_timeline(&timeline);
  ASSERT_TRUE(waiter.OnHost(*comm::CompletedWork(), comm::Op::kReduceScatter).ok());
  const absl::Time after = absl::Now();

  ASSERT_EQ(next->calls.size(), 1u);  // passed on as it came
  EXPECT_EQ(next->calls[0].op, comm::Op::kAllGather);
  EXPECT_EQ(next->calls[0].bytes, 4096);
  EXPECT_EQ(next->calls[0].seq, 7);

  const std::string path = ::testing::TempDir() + "/timeline-test.json";
  ASSERT_TRUE(timeline.Write(path).ok());
  const Json trace = Load(path);
  EXPECT_EQ(trace["otherData"]["dropped_spans"], 0);
  const auto spans = Spans(trace);
  ASSERT_EQ(spans.size(), 5u) << trace.dump();
  for (const auto& [name, e] : spans) EXPECT_EQ(e["pid"], 3) << name;
  EXPECT_EQ(spans.at("step 1")["tid"], 0);
  EXPECT_EQ(spans.at("forward transformer.h.0")["tid"], 0);
  EXPECT_EQ(spans.at("wait reduce_scatter")["tid"], 0);
  EXPECT_EQ(spans.at("all_gather #7")["tid"], 1);
  EXPECT_EQ(spans.at("all_reduce #2 (failed)")["tid"], 2);
  // The collective's span lasts what the backend measured, ending when
  // reported; everything lies on the wall clock between before and after.
  EXPECT_EQ(spans.at("all_gather #7")["dur"], 250000);
  for (const auto& [name, e] : spans) {
    const int64_t end = e["ts"].get<int64_t>() + e["dur"].get<int64_t>();
    EXPECT_LE(end, absl::ToUnixMicros(after)) << name;
    // (A collective's span starts its measured seconds before its report.)
    if (e["tid"] == 0) EXPECT_GE(e["ts"].get<int64_t>(), absl::ToUnixMicros(before)) << name;
  }
  // The step's scope encloses the forward's (scopes nest on the lane).
  const Json& step = spans.at("step 1");
  const Json& forward = spans.at("forward transformer.h.0");
  EXPECT_LE(step["ts"].get<int64_t>(), forward["ts"].get<int64_t>());
  EXPECT_GE(step["ts"].get<int64_t>() + step["dur"].get<int64_t>(),
            forward["ts"].get<int64_t>() + forward["dur"].get<int64_t>());
  // The lanes are named for the viewer.
  std::set<std::string> names;
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] == "M") names.insert(e["args"]["name"].get<std::string>());
  }
  EXPECT_EQ(names, (std::set<std::string>{"rank 3", "step", "shard", "replicate"}));
}

TEST(TimelineTest, CapCountsWhatItDrops) {
  Timeline timeline(0, /*max_spans=*/2);
  for (int i = 0; i < 5; ++i) timeline.Add(Timeline::Lane::kStep, "s", absl::Now(), absl::Now());
  const std::string path = ::testing::TempDir() + "/timeline-cap.json";
  ASSERT_TRUE(timeline.Write(path).ok());
  const Json trace = Load(path);
  EXPECT_EQ(trace["otherData"]["dropped_spans"], 3);
  int kept = 0;
  for (const Json& e : trace["traceEvents"]) kept += e["ph"] == "X";
  EXPECT_EQ(kept, 2);
}

TEST(TimelineTest, NullTimelineRecordsNothing) {
  const Timeline::Scope scope(nullptr, "forward", "x");  // (no timeline: no-op)
  CommWaiter waiter(absl::Seconds(1));
  EXPECT_TRUE(waiter.OnDevice(*comm::CompletedWork(), comm::Op::kAllGather).ok());
}

TEST(TimelineTest, UnwritablePathIsAnError) {
  Timeline timeline(0);
  EXPECT_FALSE(timeline.Write("/nonexistent-dir/trace.json").ok());
}

}  // namespace
}  // namespace shardline
