#include "worker/engine/step_result.h"

#include <cmath>
#include <string>

#include "absl/strings/str_format.h"

namespace shardline {

absl::Status NonFiniteSteps::Check(const StepResult& r) {
  if (r.skipped && skipped_ < max_skips_) {
    ++skipped_;
    return absl::OkStatus();
  }
  if (!r.skipped && std::isfinite(r.loss) && std::isfinite(r.grad_norm)) return absl::OkStatus();
  std::string skips;
  if (max_skips_ > 0) skips = absl::StrFormat(" after %d skipped steps ([train] max_nonfinite_skips = %d)", skipped_, max_skips_);
  return absl::InvalidArgumentError(absl::StrFormat(
      "step %d: the loss is %g and the gradient norm %g%s: training diverged (lower [optimizer] lr, or check the data)",
      r.step + 1, r.loss, r.grad_norm, skips));
}

}  // namespace shardline
