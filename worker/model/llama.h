// The Llama decoder as transformers' modelling code computes it (the pinned
// version, tests/deps.sh): Llama 2/3 (with Llama 3's rope scaling), Mistral
// without a sliding window, Qwen2 (q/k/v biases) and Qwen3 (RMSNorm over each
// head of q and k). Units and names are common/model/model_shapes.h.
//
// Numerics, as LlamaForCausalLM: RMSNorm in fp32 then cast back and scaled
// (x * rsqrt(mean(x^2) + eps)); rotary embeddings over the whole head, cos and
// sin computed in fp32 from inv_freq = theta^(-2i/D) (Llama 3: scaled by
// frequency band) and cast to the compute dtype, rotate_half pairing i with
// i + D/2; grouped-query attention with each key/value head serving
// n_head / n_kv_head consecutive query heads; causal softmax attention scaled
// by 1/sqrt(D); SwiGLU MLP down(silu(gate(x)) * up(x)); no biases but the
// optional q/k/v ones; final RMSNorm; lm_head (or the token embedding when
// tied). Initialisation: N(0, 0.02) for every matrix, ones for norms, zero
// biases (transformers' initializer_range default).
#pragma once

#include "worker/model/family.h"

namespace shardline {

class LlamaFamily : public ModelFamily {
 public:
  // recompute_cheap_ops: [memory]'s (recomputed_linear.h, rms_norm.h).
  LlamaFamily(const ModelConfig& m, bool recompute_cheap_ops);
  ParamInit InitOf(const ParamSpec& p) const override;
  at::Tensor Embed(const at::Tensor& idx, const Weights& embed, const Packing& packing) const override;
  at::Tensor Block(const at::Tensor& x, const BlockWeights& block, const Packing& packing) const override;
  at::Tensor HeadHidden(const at::Tensor& x, const Weights& head) const override;
  const at::Tensor& HeadWeight(const Weights& head, const Weights& embed) const override;

 private:
  // cos and sin [T, D] for positions 0..T-1, in `dtype` on `device`.
  std::pair<at::Tensor, at::Tensor> Rotary(int64_t T, const Packing& packing, at::ScalarType dtype,
                                           at::Device device) const;

  const ModelConfig m_;
  const bool recompute_;
  at::Tensor inv_freq_;  // fp32 [D/2], on the host
};

}  // namespace shardline
