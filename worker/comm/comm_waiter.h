// CommWaiter: how the engine's step thread waits on collectives. Every wait
// is bounded by the job's collective timeout, and the host time spent
// waiting is added up per kind of op: that is the step's exposed
// communication (a device wait on NCCL costs the host nothing; the GPU's idle
// time shows in the step time instead).
// Not thread-safe: the step thread's own.
#pragma once

#include <array>
#include <numeric>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/timeline.h"

namespace shardline {

class CommWaiter {
 public:
  explicit CommWaiter(absl::Duration timeout) : timeout_(timeout) {}

  // The host waits for `w`, an op of kind `op` (its result is read on the
  // host next).
  absl::Status OnHost(comm::Work& w, comm::Op op) { return Timed(op, [&] { return w.Wait(timeout_); }); }
  // The compute stream waits for the op; the host only where the backend
  // completes on the host.
  absl::Status OnDevice(comm::Work& w, comm::Op op) { return Timed(op, [&] { return w.WaitOnDevice(timeout_); }); }

  absl::Duration timeout() const { return timeout_; }
  // Since ResetExposed: the host's waits on ops of kind `op`, and on all.
  double exposed_seconds(comm::Op op) const { return exposed_[static_cast<int>(op)]; }
  double exposed_seconds() const { return std::accumulate(exposed_.begin(), exposed_.end(), 0.0); }
  void ResetExposed() { exposed_.fill(0); }
  // Where set (it must outlive this waiter), every wait is a span of its
  // step lane.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

 private:
  template <typename F>
  absl::Status Timed(comm::Op op, F wait) {
    const absl::Time t0 = absl::Now();
    absl::Status s = wait();
    const absl::Time t1 = absl::Now();
    exposed_[static_cast<int>(op)] += absl::ToDoubleSeconds(t1 - t0);
    if (timeline_) timeline_->Add(Timeline::Lane::kStep, absl::StrCat("wait ", comm::OpName(op)), t0, t1);
    return s;
  }

  const absl::Duration timeout_;
  std::array<double, comm::kNumOps> exposed_{};
  Timeline* timeline_ = nullptr;
};

}  // namespace shardline
