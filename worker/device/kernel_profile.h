// KernelProfile: LibTorch's Kineto profiler (what torch.profiler runs) over a
// window of training steps, written as a Chrome trace: the ATen ops the host
// ran and, on CUDA, every kernel, copy and fill the device ran (CUPTI), with
// their times. bench/profile_summary.py reads it (GPU busy and idle time per
// step, kernel time by kind, the largest kernels), and so does
// chrome://tracing or Perfetto.
//
// Usage: AfterStep(s) once after each step s (the job's step numbers, so a
// resumed job counts from its checkpoint's step), Finish() after the last;
// the profile covers steps [first, last) and is written when step last-1 ends,
// or at Finish() if the job ended inside the window. The first step of a
// window opens after the step before it, so first >= 1: step 0 warms up
// LibTorch's caches and kernels and is never the one to profile.
// Threading: every call on the step thread (Kineto's host-side recording is
// per thread; the device's activity is recorded whatever thread launched it).
// Errors: a window that is empty or starts before step 1 is refused by Parse;
// a trace that cannot be written is returned by AfterStep or Finish, naming
// the file.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline {

class KernelProfile {
 public:
  // `window` is "FIRST:LAST" (steps FIRST..LAST-1, as a Python slice), FIRST >= 1.
  static absl::StatusOr<KernelProfile> Parse(std::string path, const std::string& window, bool cuda);

  // Starts recording after step first-1; stops and writes after step last-1.
  absl::Status AfterStep(int64_t step);
  // Stops and writes a window the job ended inside; nothing otherwise.
  absl::Status Finish();

 private:
  KernelProfile(std::string path, int64_t first, int64_t last, bool cuda)
      : path_(std::move(path)), first_(first), last_(last), cuda_(cuda) {}
  void Start();
  absl::Status Stop();

  std::string path_;
  int64_t first_, last_;
  bool cuda_;
  bool recording_ = false;
};

}  // namespace shardline
