#include "worker/model/gpt.h"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>

#include "absl/strings/str_cat.h"

namespace shardline::gpt {

namespace {
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void InitUnit(const ModelConfig& m, const ShardLayout& layout, uint64_t seed, at::Tensor flat) {
  flat.zero_();
  for (const auto& slot : layout.params) {
    const std::string& name = slot.spec.name;
    at::Tensor w = flat.narrow(0, slot.offset, slot.spec.numel());
    if (EndsWith(name, "ln_1.weight") || EndsWith(name, "ln_2.weight") || EndsWith(name, "ln_f.weight")) {
      w.fill_(1.0);
    } else if (slot.spec.shape.size() >= 2) {
      // Each tensor has its own stream, seeded by (seed, name): the values do
      // not depend on which other units exist or on the order of init.
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ (Fnv1a(name) * 0x9E3779B97F4A7C15ull));
      const double std = EndsWith(name, "c_proj.weight") ? 0.02 / std::sqrt(2.0 * m.n_layer) : 0.02;
      w.normal_(0.0, std, gen);
    }  // biases stay zero
  }
}

at::Tensor EmbedForward(const at::Tensor& idx, const Weights& w) {
  const int64_t T = idx.size(1);
  at::Tensor pos = at::arange(T, idx.options());
  return at::embedding(w[0], idx) + at::embedding(w[1], pos);
}

at::Tensor BlockForward(const at::Tensor& x, const Weights& w, int n_head) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const int64_t hs = C / n_head;
  at::Tensor h = at::layer_norm(x, {C}, w[0], w[1], 1e-5);
  at::Tensor qkv = at::linear(h, w[2], w[3]);
  auto parts = qkv.split(C, 2);
  auto heads = [&](const at::Tensor& t) { return t.view({B, T, n_head, hs}).transpose(1, 2); };
  at::Tensor y = at::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                                  /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  y = y.transpose(1, 2).contiguous().view({B, T, C});
  at::Tensor x1 = x + at::linear(y, w[4], w[5]);
  h = at::layer_norm(x1, {C}, w[6], w[7], 1e-5);
  h = at::gelu(at::linear(h, w[8], w[9]), "tanh");
  return x1 + at::linear(h, w[10], w[11]);
}

at::Tensor HeadLogits(const at::Tensor& x, const Weights& w, const at::Tensor& wte) {
  const int64_t C = x.size(2);
  return at::linear(at::layer_norm(x, {C}, w[0], w[1], 1e-5), wte);
}

at::Tensor HeadLoss(const at::Tensor& x, const Weights& w, const at::Tensor& wte, const at::Tensor& targets,
                    double loss_scale) {
  at::Tensor logits = HeadLogits(x, w, wte);
  const int64_t V = logits.size(2);
  at::Tensor ce = at::cross_entropy_loss(logits.reshape({-1, V}).to(at::kFloat), targets.reshape({-1}),
                                         /*weight=*/{}, at::Reduction::Sum);
  return ce * loss_scale;
}

double FlopsPerToken(const ModelConfig& m) {
  const double n = static_cast<double>(NumParams(m) - int64_t{m.block_size} * m.n_embd);
  return 6.0 * n + 12.0 * m.n_layer * m.n_head * (m.n_embd / m.n_head) * m.block_size;
}

}  // namespace shardline::gpt
