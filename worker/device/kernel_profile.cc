#include "worker/device/kernel_profile.h"

#include <exception>
#include <set>
#include <utility>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardline {
namespace {
namespace prof = torch::profiler::impl;
}  // namespace

absl::StatusOr<KernelProfile> KernelProfile::Parse(std::string path, const std::string& window, bool cuda) {
  std::pair<std::string, std::string> parts = absl::StrSplit(window, absl::MaxSplits(':', 1));
  int64_t first = 0, last = 0;
  if (!absl::SimpleAtoi(parts.first, &first) || !absl::SimpleAtoi(parts.second, &last) || first < 1 ||
      last <= first) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile-steps ", window, ": expected FIRST:LAST with 1 <= FIRST < LAST (steps FIRST..LAST-1; step 0 warms up)"));
  }
  return KernelProfile(std::move(path), first, last, cuda);
}

void KernelProfile::Start() {
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (cuda_) activities.insert(prof::ActivityType::CUDA);
  // With the ops' input shapes and dtypes, which tell one copy from another.
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  recording_ = true;
}

absl::Status KernelProfile::AfterStep(int64_t step) {
  if (!recording_) {
    if (step + 1 == first_) Start();
    return absl::OkStatus();
  }
  return step + 1 < last_ ? absl::OkStatus() : Stop();
}

absl::Status KernelProfile::Finish() { return recording_ ? Stop() : absl::OkStatus(); }

absl::Status KernelProfile::Stop() {
  recording_ = false;
  try {
    torch::autograd::profiler::disableProfiler()->save(path_);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("--profile ", path_, ": ", std::string(e.what()).substr(0, 300)));
  }
  return absl::OkStatus();
}

}  // namespace shardline
