// Timeline: what one rank did when, as a trace in Chrome's trace event format
// (ui.perfetto.dev, chrome://tracing), to see where a step's time goes
// before changing the schedule. Three lanes:
//   step        the step thread: each unit's forward and backward, the
//               optimizer, and every wait on a collective (exposed
//               communication) as "wait <op>"
//   shard       every collective of the shard group, from the moment its
//   replicate   backend started it until it finished ("<op> #<seq>")
// A wait whose collective started late on its lane waited for a link busy
// with earlier ops; one whose collective started early was too slow to hide
// behind the compute it was issued before.
//
// Times are the wall clock (microseconds since the Unix epoch), so the
// files of ranks on one machine, or on hosts whose clocks agree, merge into
// one view by concatenating their "traceEvents"; each rank is a process
// ("rank N") there.
//
// Bounded: at most `max_spans` spans are kept, later ones only counted; the
// file records how many were dropped.
// Thread-safe: spans come from the step thread and the communicators'.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace shardline {

class Timeline {
 public:
  enum class Lane { kStep = 0, kShard, kReplicate };

  explicit Timeline(int rank, size_t max_spans = size_t{1} << 18) : rank_(rank), max_spans_(max_spans) {}

  void Add(Lane lane, std::string name, absl::Time start, absl::Time end);

  // Records every collective of one communicator on `lane` (from the
  // seconds its backend reports, ending now), then tells `next`, if any.
  std::shared_ptr<comm::CollectiveObserver> Observer(Lane lane,
                                                     std::shared_ptr<comm::CollectiveObserver> next = nullptr);

  // The spans so far as a JSON trace, written atomically to `path`.
  absl::Status Write(const std::string& path) const;

  // A span of the step lane, "<what> <detail>", from construction to
  // destruction; nothing where `timeline` is null (tracing off costs a test).
  class Scope {
   public:
    Scope(Timeline* timeline, absl::string_view what, absl::string_view detail = "")
        : timeline_(timeline),
          name_(timeline ? absl::StrCat(what, detail.empty() ? "" : " ", detail) : std::string()),
          start_(timeline ? absl::Now() : absl::Time()) {}
    ~Scope() {
      if (timeline_) timeline_->Add(Lane::kStep, std::move(name_), start_, absl::Now());
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timeline* const timeline_;
    std::string name_;
    const absl::Time start_;
  };

 private:
  struct Span {
    Lane lane;
    std::string name;
    int64_t start_us, duration_us;
  };
  class CollectiveSpans;

  const int rank_;
  const size_t max_spans_;
  mutable absl::Mutex mu_;
  std::vector<Span> spans_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline
