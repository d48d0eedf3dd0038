#include "worker/engine/optimizer.h"

#include <cmath>

#include <ATen/Parallel.h>

namespace shardline {

double LearningRate(const OptimizerConfig& o, int64_t s, int64_t total) {
  if (s < o.warmup_steps) return o.lr * static_cast<double>(s + 1) / (o.warmup_steps + 1);
  const double span = static_cast<double>(std::max<int64_t>(total - o.warmup_steps, 1));
  const double ratio = std::min(1.0, static_cast<double>(s - o.warmup_steps) / span);
  return o.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (o.lr - o.min_lr);
}

double ClipCoefficient(double total_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  // torch computes this in fp32.
  const float coef = static_cast<float>(max_norm) / (static_cast<float>(total_norm) + 1e-6f);
  return std::min(coef, 1.0f);
}

std::vector<DecayRange> DecayRanges(const ShardLayout& layout, int shard_rank) {
  std::vector<DecayRange> out;
  for (const ShardPiece& p : layout.PiecesOf(shard_rank)) {
    if (!layout.params[p.param_index].spec.decay) continue;
    out.push_back({p.shard_begin, p.shard_begin + (p.param_end - p.param_begin)});
  }
  return out;
}

namespace {

template <typename G>
void UpdateRange(const AdamWStep& s, bool decay, int64_t begin, int64_t end, float* p, float* m, float* v,
                 const G* g) {
  const float b1 = static_cast<float>(s.beta1), b2 = static_cast<float>(s.beta2);
  const float decay_mul = decay ? 1.0f - static_cast<float>(s.lr * s.weight_decay) : 1.0f;
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(s.eps);
  const float scale = static_cast<float>(s.grad_scale);
  for (int64_t i = begin; i < end; ++i) {
    const float gi = static_cast<float>(g[i]) * scale;
    p[i] *= decay_mul;
    m[i] += (1.0f - b1) * (gi - m[i]);  // torch's lerp for weights < 0.5
    v[i] = v[i] * b2 + (1.0f - b2) * gi * gi;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] += -step_size * (m[i] / denom);
  }
}

template <typename G>
void UpdateShard(const AdamWStep& s, const std::vector<DecayRange>& decay, float* p, float* m, float* v,
                 const G* g, int64_t n) {
  // Walk the shard as alternating no-decay / decay runs.
  auto run = [&](int64_t b, int64_t e, bool d) {
    at::parallel_for(b, e, 1 << 15, [&](int64_t lo, int64_t hi) { UpdateRange(s, d, lo, hi, p, m, v, g); });
  };
  int64_t pos = 0;
  for (const DecayRange& r : decay) {
    if (r.begin > pos) run(pos, r.begin, false);
    run(r.begin, r.end, true);
    pos = r.end;
  }
  if (pos < n) run(pos, n, false);
}

}  // namespace

void AdamWUpdate(const AdamWStep& s, const std::vector<DecayRange>& decay, at::Tensor param, at::Tensor exp_avg,
                 at::Tensor exp_avg_sq, const at::Tensor& grad) {
  float* p = param.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  const int64_t n = param.numel();
  if (grad.scalar_type() == at::kBFloat16) {
    UpdateShard(s, decay, p, m, v, grad.data_ptr<at::BFloat16>(), n);
  } else {
    UpdateShard(s, decay, p, m, v, grad.data_ptr<float>(), n);
  }
}

}  // namespace shardline
