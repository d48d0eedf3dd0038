// AdamW over one flat shard, with torch.optim.AdamW's semantics and update
// order (decoupled weight decay first, lerp for the first moment, bias
// corrections, eps added after the bias-corrected sqrt), fused into a single
// pass over the shard. Clipping enters as a scale on the gradient.
//
// AdamWState holds one shard's moments privately: Update steps them, and
// checkpoints reach them through exp_avg() / exp_avg_sq() and Load. Dense
// moments are DenseAdamWState's; 8-bit ones AdamW8BitState's (adamw_8bit.h).
//
// LearningRate: [optimizer] schedule at 0-based step s of total_steps
// (LrSchedule in common/job/job_config.h; the default is docs/design.md's linear
// warmup, then cosine decay to min_lr).
#pragma once

#include <cstdint>
#include <string>
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

// The AdamW state of one flat shard: Adam's two moments over the range of
// the shard this rank updates, in one of the [optimizer] moments dtypes.
// The moments change only through Update and Load (a checkpoint's values);
// nobody can replace them. Not thread-safe: owned by a FlatParam, driven by
// the engine's step thread.
class AdamWState {
 public:
  virtual ~AdamWState() = default;
  // One AdamW step of `param` (the master shard) from `grad` times
  // `clip_coef` (an fp32 scalar on the same device).
  virtual void Update(const AdamWStep& s, const at::Tensor& param, const at::Tensor& grad,
                      const at::Tensor& clip_coef) = 0;
  // The moments' values, the range's length, for checkpoints: the live
  // tensors where they are dense, fp32 copies where they are quantized.
  virtual at::Tensor exp_avg() const = 0;
  virtual at::Tensor exp_avg_sq() const = 0;
  // Sets the moments to these values (fp32 or their dtype, the range's
  // length, on the state's device): a checkpoint's, rounded or quantized
  // into the state's representation.
  virtual void Load(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) = 0;
  // Where the moments are not their values (8-bit codes and their blocks'
  // scales): that representation, by name, on the host, for a checkpoint
  // that a resume over the same range reads back exactly. None for dense
  // moments.
  using Encoded = std::vector<std::pair<std::string, at::Tensor>>;
  virtual Encoded Encode() const { return {}; }
  // Sets the moments from Encode()'s tensors of a state over the same range
  // (after Load of its values); false, changing nothing, where a name,
  // dtype or length differs.
  virtual bool LoadEncoded(const Encoded& encoded) {
    (void)encoded;
    return false;
  }
};

// Dense moments (fp32, or bf16 beside a bf16 master): AdamWUpdate.
class DenseAdamWState final : public AdamWState {
 public:
  // `exp_avg` and `exp_avg_sq`: the shard's zeroed moments, allocated (and
  // counted) by the owner; `decay`: DecayRanges of the shard.
  DenseAdamWState(at::Tensor exp_avg, at::Tensor exp_avg_sq, std::vector<DecayRange> decay)
      : exp_avg_(std::move(exp_avg)), exp_avg_sq_(std::move(exp_avg_sq)), decay_(std::move(decay)) {}

  void Update(const AdamWStep& s, const at::Tensor& param, const at::Tensor& grad,
              const at::Tensor& clip_coef) override {
    AdamWUpdate(s, decay_, param, exp_avg_, exp_avg_sq_, grad, clip_coef);
  }
  at::Tensor exp_avg() const override { return exp_avg_; }
  at::Tensor exp_avg_sq() const override { return exp_avg_sq_; }
  const std::vector<DecayRange>& decay() const { return decay_; }
  void Load(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) override {
    exp_avg_.copy_(exp_avg);
    exp_avg_sq_.copy_(exp_avg_sq);
  }

 private:
  const at::Tensor exp_avg_, exp_avg_sq_;
  const std::vector<DecayRange> decay_;
};

}  // namespace shardline
