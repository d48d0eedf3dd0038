// GPT-2 as nanoGPT's model.py defines it (docs/design.md's numerics contract).
//
// Units and their parameters are common/model/model_shapes.h. The lm_head is tied
// to wte, so the head reads the embed unit's wte view.
//
// Numerics: pre-LayerNorm blocks with biases (eps 1e-5), fused c_attn (q, k, v
// in that order), causal scaled-dot-product attention, 4x MLP with the tanh
// GELU, no dropout. Initialisation as nanoGPT's: N(0, 0.02), residual
// projections N(0, 0.02/sqrt(2 n_layer)), zero biases, unit LayerNorm weights.
#pragma once

#include "worker/model/family.h"

namespace shardline {

class GptFamily : public ModelFamily {
 public:
  // recompute_cheap_ops: [memory]'s (recomputed_linear.h).
  GptFamily(const ModelConfig& m, bool recompute_cheap_ops) : m_(m), recompute_(recompute_cheap_ops) {}
  ParamInit InitOf(const ParamSpec& p) const override;
  at::Tensor Embed(const at::Tensor& idx, const Weights& embed, const Packing& packing) const override;
  at::Tensor Block(const at::Tensor& x, const BlockWeights& block, const Packing& packing) const override;
  at::Tensor HeadHidden(const at::Tensor& x, const Weights& head) const override;
  const at::Tensor& HeadWeight(const Weights& head, const Weights& embed) const override;

 private:
  const ModelConfig m_;
  const bool recompute_;
};

}  // namespace shardline
