#include "worker/model/linear_cross_entropy.h"

#include <algorithm>

#include <torch/csrc/autograd/custom_function.h>

namespace shardline {
namespace {

constexpr int64_t kIgnoreIndex = -100;     // at::cross_entropy_loss's default
constexpr int64_t kChunkLogits = 1 << 26;  // 256 MiB of fp32 logits per chunk

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearCrossEntropyFn : public torch::autograd::Function<LinearCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& targets, double scale, int64_t chunk_rows, bool grad_x, bool grad_w) {
    ctx->saved_data["w_dtype"] = w.scalar_type();
    const int64_t rows = x.size(0);
    at::Tensor loss = at::zeros({}, x.options().dtype(at::kFloat));
    at::Tensor dx = grad_x ? at::empty_like(x) : at::Tensor();
    at::Tensor dw = grad_w ? at::zeros(w.sizes(), w.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - r0);
      const at::Tensor xs = x.narrow(0, r0, n);
      const at::Tensor ts = targets.narrow(0, r0, n);
      const at::Tensor valid = ts.ne(kIgnoreIndex);
      const at::Tensor picked_index = at::where(valid, ts, at::zeros_like(ts)).unsqueeze(1);
      at::Tensor logits = at::linear(xs, w).to(at::kFloat);  // [n, V]
      const at::Tensor lse = at::logsumexp(logits, {1});
      const at::Tensor picked = logits.gather(1, picked_index).squeeze(1);
      loss.add_(at::where(valid, lse - picked, at::zeros_like(lse)).sum());
      if (!grad_x && !grad_w) continue;
      // dL/dlogits = (softmax - onehot(t)) * scale on counted rows, 0 on ignored ones.
      at::Tensor g = logits.sub_(lse.unsqueeze(1)).exp_();
      g.scatter_add_(1, picked_index, at::full({n, 1}, -1.0, g.options()));
      g.mul_((valid.to(at::kFloat) * scale).unsqueeze(1));
      const at::Tensor gc = g.to(x.scalar_type());
      if (grad_x) dx.narrow(0, r0, n).copy_(at::mm(gc, w));
      if (grad_w) dw.add_(at::mm(gc.t(), xs));
    }
    ctx->save_for_backward({dx, dw});
    return loss.mul_(scale);
  }

  // Scales the gradients forward computed in place: a second [V, C] fp32
  // table at the head's peak otherwise. So the graph must not be retained
  // for a second backward (the engine runs each once).
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& g = grad_out[0];
    at::Tensor dx = saved[0].defined() ? saved[0].mul_(g.to(saved[0].scalar_type())) : at::Tensor();
    at::Tensor dw;
    if (saved[1].defined()) dw = saved[1].mul_(g).to(ctx->saved_data["w_dtype"].toScalarType());
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor LinearCrossEntropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets, double scale,
                              int64_t chunk_rows) {
  const int64_t V = std::max<int64_t>(1, w.size(0));
  if (chunk_rows <= 0) chunk_rows = std::max<int64_t>(1, kChunkLogits / V);
  // Asked here rather than by ctx->needs_input_grad, which has no edges to
  // ask under no-grad.
  const bool track = at::GradMode::is_enabled();
  return LinearCrossEntropyFn::apply(x, w, targets, scale, chunk_rows, track && x.requires_grad(),
                                     track && w.requires_grad());
}

}  // namespace shardline
