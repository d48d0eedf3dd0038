#include "worker/model/gpt.h"

#include <cmath>

#include "absl/strings/match.h"
#include "worker/model/recomputed_linear.h"

namespace shardline {

ParamInit GptFamily::InitOf(const ParamSpec& p) const {
  const std::string& name = p.name;
  if (absl::EndsWith(name, "ln_1.weight") || absl::EndsWith(name, "ln_2.weight") || absl::EndsWith(name, "ln_f.weight")) {
    return {ParamInit::Kind::kOnes};
  }
  if (p.shape.size() < 2) return {};  // biases stay zero
  return {ParamInit::Kind::kNormal, absl::EndsWith(name, "c_proj.weight") ? 0.02 / std::sqrt(2.0 * m_.n_layer) : 0.02};
}

at::Tensor GptFamily::Embed(const at::Tensor& idx, const Weights& w, const Packing& packing) const {
  const at::Tensor pos = packing.packed() ? packing.positions : at::arange(idx.size(1), idx.options());
  return at::embedding(w[0], idx) + at::embedding(w[1], pos);
}

at::Tensor GptFamily::Block(const at::Tensor& x, const BlockWeights& w, const Packing& packing) const {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const int n_head = m_.n_head;
  const int64_t hs = C / n_head;
  at::Tensor qkv = LayerNormLinear(x, w[0], w[1], 1e-5, w, 2, w[3], recompute_);
  auto parts = qkv.split(C, 2);
  auto heads = [&](const at::Tensor& t) { return t.view({B, T, n_head, hs}).transpose(1, 2); };
  at::Tensor y = CausalAttention(heads(parts[0]), heads(parts[1]), heads(parts[2]), packing);
  y = y.transpose(1, 2).contiguous().view({B, T, C});
  at::Tensor x1 = x + w.Linear(y, 4, w[5]);
  const at::Tensor fc = LayerNormLinear(x1, w[6], w[7], 1e-5, w, 8, w[9], recompute_);
  return x1 + ActivationLinear(MlpActivation::kGeluTanh, fc, at::Tensor(), w, 10, w[11], recompute_);
}

at::Tensor GptFamily::HeadHidden(const at::Tensor& x, const Weights& w) const {
  return at::layer_norm(x, {x.size(2)}, w[0], w[1], 1e-5);
}

const at::Tensor& GptFamily::HeadWeight(const Weights& /*head*/, const Weights& embed) const { return embed[0]; }

}  // namespace shardline
