#include "worker/comm/timeline.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"

namespace shardline {

namespace {
const char* LaneName(Timeline::Lane lane) {
  switch (lane) {
    case Timeline::Lane::kStep: return "step";
    case Timeline::Lane::kShard: return "shard";
    case Timeline::Lane::kReplicate: return "replicate";
  }
  return "?";
}
}  // namespace

void Timeline::Add(Lane lane, std::string name, absl::Time start, absl::Time end) {
  absl::MutexLock lock(&mu_);
  if (spans_.size() >= max_spans_) {
    ++dropped_;
    return;
  }
  const int64_t start_us = absl::ToUnixMicros(start);
  spans_.push_back({lane, std::move(name), start_us, std::max<int64_t>(0, absl::ToUnixMicros(end) - start_us)});
}

class Timeline::CollectiveSpans : public comm::CollectiveObserver {
 public:
  CollectiveSpans(Timeline* timeline, Lane lane, std::shared_ptr<comm::CollectiveObserver> next)
      : timeline_(timeline), lane_(lane), next_(std::move(next)) {}
  void OnCollective(comm::Op op, int64_t bytes_sent, double seconds, int64_t seq, bool ok) override {
    const absl::Time end = absl::Now();
    timeline_->Add(lane_, absl::StrCat(comm::OpName(op), " #", seq, ok ? "" : " (failed)"),
                   end - absl::Seconds(seconds), end);
    if (next_) next_->OnCollective(op, bytes_sent, seconds, seq, ok);
  }

 private:
  Timeline* const timeline_;
  const Lane lane_;
  const std::shared_ptr<comm::CollectiveObserver> next_;
};

std::shared_ptr<comm::CollectiveObserver> Timeline::Observer(Lane lane,
                                                             std::shared_ptr<comm::CollectiveObserver> next) {
  return std::make_shared<CollectiveSpans>(this, lane, std::move(next));
}

absl::Status Timeline::Write(const std::string& path) const {
  using Json = nlohmann::ordered_json;
  Json events = Json::array();
  const std::string process = absl::StrCat("rank ", rank_);
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", process}}}});
  for (Lane lane : {Lane::kStep, Lane::kShard, Lane::kReplicate}) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", static_cast<int>(lane)},
                      {"args", {{"name", LaneName(lane)}}}});
  }
  absl::MutexLock lock(&mu_);
  for (const Span& s : spans_) {
    events.push_back({{"name", s.name}, {"ph", "X"}, {"pid", rank_}, {"tid", static_cast<int>(s.lane)},
                      {"ts", s.start_us}, {"dur", s.duration_us}});
  }
  const Json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"},
                      {"otherData", {{"rank", rank_}, {"dropped_spans", dropped_}}}};
  return WriteFileAtomically(path, trace.dump() + "\n");
}

}  // namespace shardline
