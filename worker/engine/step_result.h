// StepResult: what one training step reports (the engine's Step), and
// NonFiniteSteps: the rule that decides whether a run may go on after it.
#pragma once

#include <cstdint>
#include <limits>

#include "absl/status/status.h"

namespace shardline {

struct StepResult {
  int64_t step = 0;
  double loss = 0;        // mean cross-entropy over the global batch
  double grad_norm = 0;   // before clipping
  double lr = 0;
  // Passes over the training data once this step is done (EpochAt); NaN for
  // synthetic data.
  double epoch = 0;
  int64_t tokens = 0;     // tokens of the global batch
  double seconds = 0;
  double exposed_comm_seconds = 0;  // time the step thread waited on collectives
  // Where the step's time went: its waits on all-gathers (parameters) and on
  // reduce-scatters (gradients), apart from the rest of exposed_comm_seconds
  // (all-reduces: the replicas' gradients under hybrid, the norm, the loss),
  // and the host's time in the optimizer's update (on a GPU, the time to
  // queue it). Compute is seconds less these.
  double exposed_all_gather_seconds = 0;
  double exposed_reduce_scatter_seconds = 0;
  double optimizer_seconds = 0;
  // CPU seconds over the step (common/base/cpu_time.h): every thread of the
  // process, and the step thread alone. Where ranks share cores, the rest
  // (the collectives' transport) is taken from some rank's compute.
  double cpu_seconds = 0;
  double step_thread_cpu_seconds = 0;
  // Mean loss over [train] eval_batches of the validation stream, after this
  // step's update; NaN where the step ran no evaluation.
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  double eval_seconds = 0;  // not part of `seconds`
  // The gradient norm was not finite and [train] max_nonfinite_skips allowed
  // skipping: the step made no update.
  bool skipped = false;
  // Some rank voted to save after this step (Step's vote_save): the same on
  // every rank.
  bool save = false;
};

// Counts the non-finite steps of one run against [train] max_nonfinite_skips:
// OK for a finite step and for a skipped one within the limit; otherwise an
// InvalidArgument naming the step, so that a diverged job fails rather than
// ends SUCCEEDED with NaN weights.
class NonFiniteSteps {
 public:
  explicit NonFiniteSteps(int max_skips) : max_skips_(max_skips) {}
  absl::Status Check(const StepResult& r);
  int skipped() const { return skipped_; }

 private:
  const int max_skips_;
  int skipped_ = 0;
};

}  // namespace shardline
