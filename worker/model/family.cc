#include "worker/model/family.h"

#include "worker/model/gpt.h"
#include "worker/model/linear_cross_entropy.h"
#include "worker/model/llama.h"

namespace shardline {

Packing Packing::FromPositions(const at::Tensor& host_positions, const at::Tensor& positions) {
  return {positions, DocumentSpans::FromPositions(host_positions)};
}

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Packing& packing,
                           std::optional<double> scale) {
  if (packing.packed()) return DocumentAttention(q, k, v, packing.documents, scale);
  return at::scaled_dot_product_attention(q, k, v, std::nullopt, /*dropout_p=*/0.0, /*is_causal=*/true, scale);
}

at::Tensor ModelFamily::HeadLogits(const at::Tensor& x, const Weights& head, const Weights& embed) const {
  return at::linear(HeadHidden(x, head), HeadWeight(head, embed));
}

at::Tensor ModelFamily::HeadLoss(const at::Tensor& x, const Weights& head, const Weights& embed,
                                 const at::Tensor& targets, double loss_scale) const {
  const at::Tensor h = HeadHidden(x, head);
  return LinearCrossEntropy(h.reshape({-1, h.size(-1)}), HeadWeight(head, embed), targets.reshape({-1}), loss_scale);
}

at::Tensor BlockWeights::Linear(const at::Tensor& x, size_t i, const at::Tensor& bias) const {
  at::Tensor y = at::linear(x, base[i], bias);
  if (i < lora.size() && lora[i].a.defined()) y = y + at::linear(at::linear(x, lora[i].a), lora[i].b) * lora_scaling;
  return y;
}

std::unique_ptr<ModelFamily> MakeModelFamily(const ModelConfig& m, bool recompute_cheap_ops) {
  if (m.is_llama()) return std::make_unique<LlamaFamily>(m, recompute_cheap_ops);
  return std::make_unique<GptFamily>(m, recompute_cheap_ops);
}

}  // namespace shardline
