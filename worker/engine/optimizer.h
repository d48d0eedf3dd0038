// AdamW over one flat shard, with torch.optim.AdamW's semantics and update
// order (decoupled weight decay first, lerp for the first moment, bias
// corrections, eps added after the bias-corrected sqrt), fused into a single
// pass over the shard. Clipping enters as a scale on the gradient.
//
// AdamWState holds one shard's moments privately: Update steps them, and
// checkpoints reach them through exp_avg() / exp_avg_sq().
//
// LearningRate: [optimizer] schedule at 0-based step s of total_steps
// (LrSchedule in common/job/job_config.h; the default is docs/design.md's linear
// warmup, then cosine decay to min_lr).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "common/job/job_config.h"
#include "common/model/shard_layout.h"

namespace shardline {

double LearningRate(const OptimizerConfig& o, int64_t step, int64_t total_steps);

// torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6)),
// in fp32 as torch computes it; 1 when clipping is off (max_norm == 0).
// `total_norm` is a scalar tensor; the result is an fp32 scalar on its device.
at::Tensor ClipCoefficient(const at::Tensor& total_norm, double max_norm);

// [begin, end) ranges of a shard whose elements get weight decay.
struct DecayRange {
  int64_t begin, end;
};
std::vector<DecayRange> DecayRanges(const ShardLayout& layout, int shard_rank);

struct AdamWStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;          // 1-based, as torch counts
};

// Updates param, exp_avg, exp_avg_sq (same length, one device, all fp32 or
// all bf16) in place from grad (fp32 or bf16) times `clip_coef` (an fp32
// scalar on the same device). fp32 state: one fused pass (on CUDA an fp32
// grad is scaled in place, as clip_grad_norm_ does). bf16 state (no fp32
// master): torch.optim.AdamW's own sequence of bf16 ops, equal to it
// bitwise (tests/unit/data/make_adamw_bf16.py), the grad left as it is.
void AdamWUpdate(const AdamWStep& s, const std::vector<DecayRange>& decay, at::Tensor param,
                 at::Tensor exp_avg, at::Tensor exp_avg_sq, const at::Tensor& grad, const at::Tensor& clip_coef);

// The AdamW state of one flat shard: its first and second moments (fp32,
// the shard's length) and the ranges of it that get weight decay. The
// moments change only through Update and a checkpoint load (a copy into the
// tensors exp_avg() / exp_avg_sq() return); nobody can replace them.
// Not thread-safe: owned by a FlatParam, driven by the engine's step thread.
class AdamWState {
 public:
  // `exp_avg` and `exp_avg_sq`: the shard's zeroed moments, allocated (and
  // counted) by the owner; `decay`: DecayRanges of the shard.
  AdamWState(at::Tensor exp_avg, at::Tensor exp_avg_sq, std::vector<DecayRange> decay)
      : exp_avg_(std::move(exp_avg)), exp_avg_sq_(std::move(exp_avg_sq)), decay_(std::move(decay)) {}

  // One AdamW step of `param` (the fp32 master shard) from `grad` times
  // `clip_coef` (AdamWUpdate).
  void Update(const AdamWStep& s, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& clip_coef) {
    AdamWUpdate(s, decay_, param, exp_avg_, exp_avg_sq_, grad, clip_coef);
  }

  // The live moments, for checkpoints: saving reads them, loading copies
  // into them (in place; the tensors themselves are never replaced).
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  const std::vector<DecayRange>& decay() const { return decay_; }

 private:
  const at::Tensor exp_avg_, exp_avg_sq_;
  const std::vector<DecayRange> decay_;
};

}  // namespace shardline
