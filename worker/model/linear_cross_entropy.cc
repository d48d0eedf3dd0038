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
      // [n, V] fp32: the log-softmax, then in place the softmax and dL/dlogits;
      // every pass over it is vectorized (no [n, V] operand is broadcast). Two
      // statements, so that the compute-dtype logits die before the
      // log-softmax allocates: two fp32 [n, V] tensors at the peak, not 2.5.
      at::Tensor g = at::linear(xs, w).to(at::kFloat);
      g = at::_log_softmax(g, 1, /*half_to_float=*/false);
      const at::Tensor picked = g.gather(1, picked_index).squeeze(1);
      loss.sub_(at::where(valid, picked, at::zeros_like(picked)).sum());
      if (!grad_x && !grad_w) continue;
      // dL/dlogits = (softmax - onehot(t)) * scale on counted rows. An ignored
      // row's is zero: its row of dx is zeroed and its row of x left out of dW
      // ([n, C], V/C times smaller than [n, V]), which adds exact zeros where
      // autograd multiplies by them.
      g.exp_().scatter_add_(1, picked_index, at::full({n, 1}, -1.0, g.options())).mul_(scale);
      const at::Tensor gc = g.to(x.scalar_type());
      const at::Tensor counted = valid.unsqueeze(1).to(x.scalar_type());
      if (grad_x) dx.narrow(0, r0, n).copy_(at::mm(gc, w).mul_(counted));
      if (grad_w) dw.add_(at::mm(gc.t(), xs * counted));
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
