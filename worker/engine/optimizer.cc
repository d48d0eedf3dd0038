#include "worker/engine/optimizer.h"

#include <cmath>

#include <ATen/Parallel.h>

namespace shardline {

namespace {

// Each in the arithmetic of its counterpart (job_config.h names them), so
// that the oracle test can ask for equality to rounding: doubles, divisions
// in the same order.
double Cosine(const OptimizerConfig& o, int64_t s, int64_t total) {
  if (s < o.warmup_steps) return o.lr * static_cast<double>(s + 1) / (o.warmup_steps + 1);
  const double span = static_cast<double>(std::max<int64_t>(total - o.warmup_steps, 1));
  const double ratio = std::min(1.0, static_cast<double>(s - o.warmup_steps) / span);
  return o.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (o.lr - o.min_lr);
}

// transformers' warmup: s / max(1, W), from 0.
double Warmup(const OptimizerConfig& o, int64_t s) {
  return static_cast<double>(s) / static_cast<double>(std::max(1, o.warmup_steps));
}

double Linear(const OptimizerConfig& o, int64_t s, int64_t total) {
  if (s < o.warmup_steps) return o.lr * Warmup(o, s);
  const double f = std::max(0.0, static_cast<double>(total - s) /
                                     static_cast<double>(std::max<int64_t>(1, total - o.warmup_steps)));
  return o.min_lr + (o.lr - o.min_lr) * f;
}

double Wsd(const OptimizerConfig& o, int64_t s, int64_t total) {
  const double min_ratio = o.lr > 0 ? o.min_lr / o.lr : 0.0;
  const int64_t stable = total - o.warmup_steps - o.decay_steps;
  double f;
  if (s < o.warmup_steps) {
    f = std::max(0.0, Warmup(o, s) * (1.0 - min_ratio) + min_ratio);
  } else if (s < o.warmup_steps + stable) {
    f = 1.0;
  } else if (s < total) {
    const double progress = static_cast<double>(s - o.warmup_steps - stable) /
                            static_cast<double>(std::max(1, o.decay_steps));
    f = std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * 0.5 * 2.0 * progress)) * (1.0 - min_ratio) + min_ratio);
  } else {
    f = min_ratio;
  }
  return o.lr * f;
}

}  // namespace

double LearningRate(const OptimizerConfig& o, int64_t s, int64_t total) {
  switch (o.schedule) {
    case LrSchedule::kCosine: return Cosine(o, s, total);
    case LrSchedule::kLinear: return Linear(o, s, total);
    case LrSchedule::kConstant: return s < o.warmup_steps ? o.lr * Warmup(o, s) : o.lr;
    case LrSchedule::kWsd: return Wsd(o, s, total);
  }
  return o.lr;
}

at::Tensor ClipCoefficient(const at::Tensor& total_norm, double max_norm) {
  const at::Tensor norm = total_norm.to(at::kFloat);
  if (max_norm <= 0) return at::ones_like(norm);
  // torch computes this in fp32: max_norm / (norm + 1e-6), clamped to 1.
  return at::full_like(norm, static_cast<float>(max_norm)).div_(norm + 1e-6f).clamp_max_(1.0f);
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
void UpdateRange(const AdamWStep& s, float scale, bool decay, int64_t begin, int64_t end, float* p, float* m,
                 float* v, const G* g) {
  const float b1 = static_cast<float>(s.beta1), b2 = static_cast<float>(s.beta2);
  const float decay_mul = decay ? 1.0f - static_cast<float>(s.lr * s.weight_decay) : 1.0f;
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(s.eps);
  for (int64_t i = begin; i < end; ++i) {
    const float gi = static_cast<float>(g[i]) * scale;
    p[i] *= decay_mul;
    m[i] += (1.0f - b1) * (gi - m[i]);  // torch's lerp for weights < 0.5
    v[i] = v[i] * b2 + (1.0f - b2) * gi * gi;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] += -step_size * (m[i] / denom);
  }
}

// Calls run(begin, end, decay) for each non-empty run of a shard of `n`
// elements, alternating between no-decay and decay ranges in order.
template <typename Run>
void ForEachDecayRun(const std::vector<DecayRange>& decay, int64_t n, Run run) {
  int64_t pos = 0;
  for (const DecayRange& r : decay) {
    if (r.begin > pos) run(pos, r.begin, false);
    if (r.end > r.begin) run(r.begin, r.end, true);
    pos = r.end;
  }
  if (pos < n) run(pos, n, false);
}

template <typename G>
void UpdateShard(const AdamWStep& s, float scale, const std::vector<DecayRange>& decay, float* p, float* m,
                 float* v, const G* g, int64_t n) {
  ForEachDecayRun(decay, n, [&](int64_t b, int64_t e, bool d) {
    at::parallel_for(b, e, 1 << 15, [&](int64_t lo, int64_t hi) { UpdateRange(s, scale, d, lo, hi, p, m, v, g); });
  });
}

// The device path: the shard is cut into its decay and no-decay runs and
// each group goes through torch's fused AdamW kernel in one launch. The
// clipping is the kernel's grad_scale (it divides each gradient by it as it
// reads it, and writes the quotient back), so clipping costs no pass of its
// own over the gradient: a separate mul_ by the 0-dim coefficient was 2.4 ms
// of a 350M GPT-2's 82 ms step on an H200 (bench/results/gpu_compare_h200.md).
// g / (1 / c) differs from g * c by at most ~1.5 ulp.
void FusedUpdate(const AdamWStep& s, const std::vector<DecayRange>& decay, at::Tensor param, at::Tensor exp_avg,
                 at::Tensor exp_avg_sq, const at::Tensor& grad, const at::Tensor& clip_coef) {
  at::Tensor g = grad.scalar_type() == at::kFloat ? grad : grad.to(at::kFloat);
  const at::Tensor grad_scale = clip_coef.to(at::kFloat).reciprocal();
  std::vector<at::Tensor> params[2], grads[2], ms[2], vs[2], steps[2];
  ForEachDecayRun(decay, param.numel(), [&](int64_t b, int64_t e, bool d) {
    params[d].push_back(param.narrow(0, b, e - b));
    grads[d].push_back(g.narrow(0, b, e - b));
    ms[d].push_back(exp_avg.narrow(0, b, e - b));
    vs[d].push_back(exp_avg_sq.narrow(0, b, e - b));
    // The kernel reads the step count (torch increments it before the call).
    steps[d].push_back(at::full({}, static_cast<double>(s.step), param.options()));
  });
  for (int d = 0; d < 2; ++d) {
    if (params[d].empty()) continue;
    at::_fused_adamw_(params[d], grads[d], ms[d], vs[d], /*max_exp_avg_sqs=*/{}, steps[d], s.lr, s.beta1, s.beta2,
                      d ? s.weight_decay : 0.0, s.eps, /*amsgrad=*/false, /*maximize=*/false, grad_scale);
  }
}

// State in bf16 (no fp32 master: what torch.optim.AdamW holds for a model
// loaded in bfloat16): torch's own op sequence, that of its single-tensor
// path, on each decay and no-decay run of the shard. Each op rounds to bf16
// as torch's do (its lerp contracts into an FMA on vectorized CPUs, which a
// hand-written loop would have to match machine by machine), so the update
// equals torch's single-tensor path (its default on the CPU) bitwise. On
// CUDA torch defaults to its foreach path, whose division by the bias
// correction may round differently by one ulp. `clip_coef` is 0-dim. The
// gradient is clipped as clip_grad_norm_ clips a bf16 gradient: multiplied
// by the fp32 coefficient, rounded to bf16 (a copy: the gradient buffer
// itself is left as it is).
void TorchOpsUpdate(const AdamWStep& s, const std::vector<DecayRange>& decay, at::Tensor param, at::Tensor exp_avg,
                    at::Tensor exp_avg_sq, const at::Tensor& grad, const at::Tensor& clip_coef) {
  // A number as Python passes one to an op (a wrapped 0-dim double): the
  // kernel reads it in its opmath type (fp32). C++'s Scalar overloads of
  // mul_, div and add_ round it to the tensor's dtype first (0.95 becomes
  // 0.9492 in bf16), which torch's Python calls never do.
  auto number = [](double x) {
    at::Tensor t = at::scalar_tensor(x, at::kDouble);
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  };
  const at::Tensor g = grad.to(param.scalar_type()).mul(clip_coef);
  // Python's floats: beta ** step, lr / bias_correction1, bias_correction2 ** 0.5.
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  const double step_size = s.lr / bc1, bc2_sqrt = std::pow(bc2, 0.5);
  ForEachDecayRun(decay, param.numel(), [&](int64_t b, int64_t e, bool d) {
    at::Tensor p = param.narrow(0, b, e - b), m = exp_avg.narrow(0, b, e - b), v = exp_avg_sq.narrow(0, b, e - b);
    const at::Tensor gi = g.narrow(0, b, e - b);
    if (d && s.weight_decay != 0) p.mul_(number(1.0 - s.lr * s.weight_decay));
    m.lerp_(gi, 1.0 - s.beta1);  // its weight is read in opmath
    v.mul_(number(s.beta2)).addcmul_(gi, gi, 1.0 - s.beta2);
    const at::Tensor denom = v.sqrt().div_(number(bc2_sqrt)).add_(number(s.eps));
    p.addcdiv_(m, denom, -step_size);
  });
}

}  // namespace

void AdamWUpdate(const AdamWStep& s, const std::vector<DecayRange>& decay, at::Tensor param, at::Tensor exp_avg,
                 at::Tensor exp_avg_sq, const at::Tensor& grad, const at::Tensor& clip_coef) {
  if (param.scalar_type() != at::kFloat) return TorchOpsUpdate(s, decay, param, exp_avg, exp_avg_sq, grad, clip_coef);
  if (!param.is_cpu()) return FusedUpdate(s, decay, param, exp_avg, exp_avg_sq, grad, clip_coef);
  const float scale = clip_coef.item<float>();
  float* p = param.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  const int64_t n = param.numel();
  if (grad.scalar_type() == at::kBFloat16) {
    UpdateShard(s, scale, decay, p, m, v, grad.data_ptr<at::BFloat16>(), n);
  } else {
    UpdateShard(s, scale, decay, p, m, v, grad.data_ptr<float>(), n);
  }
}

}  // namespace shardline
