// CommWaiter: how the engine's step thread waits on collectives. Every wait
// is bounded by the job's collective timeout, and the host time spent
// waiting is added up: that is the step's exposed communication (a device
// wait on NCCL costs the host nothing; the GPU's idle time shows in the
// step time instead).
// Not thread-safe: the step thread's own.
#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace shardline {

class CommWaiter {
 public:
  explicit CommWaiter(absl::Duration timeout) : timeout_(timeout) {}

  // The host waits for the op (its result is read on the host next).
  absl::Status OnHost(comm::Work& w) { return Timed([&] { return w.Wait(timeout_); }); }
  // The compute stream waits for the op; the host only where the backend
  // completes on the host.
  absl::Status OnDevice(comm::Work& w) { return Timed([&] { return w.WaitOnDevice(timeout_); }); }

  absl::Duration timeout() const { return timeout_; }
  double exposed_seconds() const { return exposed_seconds_; }
  void ResetExposed() { exposed_seconds_ = 0; }

 private:
  template <typename F>
  absl::Status Timed(F wait) {
    const absl::Time t0 = absl::Now();
    absl::Status s = wait();
    exposed_seconds_ += absl::ToDoubleSeconds(absl::Now() - t0);
    return s;
  }

  const absl::Duration timeout_;
  double exposed_seconds_ = 0;
};

}  // namespace shardline
