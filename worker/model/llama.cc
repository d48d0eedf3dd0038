#include "worker/model/llama.h"

#include <cmath>

#include "absl/strings/match.h"
#include "worker/model/recomputed_linear.h"
#include "worker/model/rms_norm.h"

namespace shardline {

namespace {

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// transformers' _compute_default_rope_parameters and, for "llama3",
// _compute_llama3_parameters, in the same fp32 operations.
at::Tensor InvFreq(const ModelConfig& m) {
  const int64_t D = m.head_dim();
  at::Tensor exponent = at::arange(0, D, 2, at::kLong).to(at::kFloat) / static_cast<double>(D);
  at::Tensor inv = 1.0 / at::pow(m.rope_theta, exponent);
  if (m.rope_scaling != "llama3") return inv;
  const double factor = m.rope_scaling_factor, low = m.rope_low_freq_factor, high = m.rope_high_freq_factor;
  const double old_len = m.rope_original_max_position;
  const double low_wavelen = old_len / low, high_wavelen = old_len / high;
  at::Tensor wavelen = 2 * M_PI / inv;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv / factor, inv);
  at::Tensor smooth = (old_len / wavelen - low) / (high - low);
  at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

}  // namespace

LlamaFamily::LlamaFamily(const ModelConfig& m, bool recompute_cheap_ops)
    : m_(m), recompute_(recompute_cheap_ops), inv_freq_(InvFreq(m)) {}

ParamInit LlamaFamily::InitOf(const ParamSpec& p) const {
  // input_layernorm, post_attention_layernorm, q_norm, k_norm, model.norm
  if (absl::EndsWith(p.name, "norm.weight")) return {ParamInit::Kind::kOnes};
  if (p.shape.size() < 2) return {};  // biases stay zero
  return {ParamInit::Kind::kNormal, 0.02};
}

at::Tensor LlamaFamily::Embed(const at::Tensor& idx, const Weights& w, const Packing& /*packing*/) const {
  return at::embedding(w[0], idx);
}

std::pair<at::Tensor, at::Tensor> LlamaFamily::Rotary(int64_t T, const Packing& packing, at::ScalarType dtype,
                                                      at::Device device) const {
  // transformers: position_ids times inv_freq in fp32, one product each.
  at::Tensor freqs;
  if (packing.packed()) {  // [B, 1, T, D/2], on the positions' device
    const at::Tensor& p = packing.positions;
    freqs = (p.to(at::kFloat).unsqueeze(-1) * inv_freq_.to(p.device())).unsqueeze(1);
  } else {
    freqs = at::outer(at::arange(T, at::kFloat), inv_freq_);  // [T, D/2]
  }
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(device, dtype), emb.sin().to(device, dtype)};
}

at::Tensor LlamaFamily::Block(const at::Tensor& x, const BlockWeights& w, const Packing& packing) const {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t H = m_.n_head, KV = m_.kv_heads(), D = m_.head_dim();
  const double eps = m_.rms_norm_eps;
  // Indices into w in model::UnitParams order (projections go through
  // w.Linear, which adds their adapters).
  size_t i = 0;
  const at::Tensor& in_norm = w[i++];
  struct Projection {
    size_t weight;
    at::Tensor bias;
  };
  auto projection = [&]() {
    Projection p{i++, at::Tensor()};
    if (m_.qkv_bias) p.bias = w[i++];
    return p;
  };
  const Projection q_proj = projection(), k_proj = projection(), v_proj = projection();
  const size_t o_proj = i++;
  at::Tensor q_norm, k_norm;
  if (m_.qk_norm) {
    q_norm = w[i++];
    k_norm = w[i++];
  }
  const at::Tensor& post_norm = w[i++];
  const size_t gate = i++, up = i++, down = i++;

  at::Tensor h = RmsNorm(x, in_norm, eps, recompute_);
  at::Tensor q = w.Linear(h, q_proj.weight, q_proj.bias).view({B, T, H, D});
  at::Tensor k = w.Linear(h, k_proj.weight, k_proj.bias).view({B, T, KV, D});
  at::Tensor v = w.Linear(h, v_proj.weight, v_proj.bias).view({B, T, KV, D});
  if (m_.qk_norm) {
    q = RmsNorm(q, q_norm, eps, recompute_);
    k = RmsNorm(k, k_norm, eps, recompute_);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  const auto [cos, sin] = Rotary(T, packing, x.scalar_type(), x.device());
  q = q * cos + RotateHalf(q) * sin;
  k = k * cos + RotateHalf(k) * sin;
  if (KV != H) {  // transformers' repeat_kv: each key/value head serves H / KV consecutive query heads
    k = k.repeat_interleave(H / KV, 1);
    v = v.repeat_interleave(H / KV, 1);
  }
  at::Tensor y = CausalAttention(q, k, v, packing, /*scale=*/1.0 / std::sqrt(static_cast<double>(D)));
  y = y.transpose(1, 2).reshape({B, T, H * D});
  at::Tensor x1 = x + w.Linear(y, o_proj);
  h = RmsNorm(x1, post_norm, eps, recompute_);
  return x1 + ActivationLinear(MlpActivation::kSwiGlu, w.Linear(h, gate), w.Linear(h, up), w, down, {}, recompute_);
}

at::Tensor LlamaFamily::HeadHidden(const at::Tensor& x, const Weights& head) const {
  return RmsNorm(x, head[0], m_.rms_norm_eps, recompute_);
}

const at::Tensor& LlamaFamily::HeadWeight(const Weights& head, const Weights& embed) const {
  return m_.tied() ? embed[0] : head[1];
}

}  // namespace shardline
