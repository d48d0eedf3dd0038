#include "worker/model/activation_linear.h"

#include <torch/csrc/autograd/custom_function.h>

namespace shardline {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The activation and, for SwiGLU, silu(a) (its backward multiplies by it).
struct Activated {
  at::Tensor out, silu;
};

Activated Activate(MlpActivation act, const at::Tensor& a, const at::Tensor& b) {
  if (act == MlpActivation::kGeluTanh) return {at::gelu(a, "tanh"), at::Tensor()};
  at::Tensor s = at::silu(a);
  return {s * b, s};
}

// [..., n] as [tokens, n], as at::linear flattens its input for addmm / mm.
at::Tensor Rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// A custom function's tensor arguments must be defined (autograd records
// each one's metadata): an absent one travels as an empty tensor.
at::Tensor Present(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t : at::empty({0}, like.options());
}
at::Tensor Absent(const at::Tensor& t) { return t.numel() > 0 ? t : at::Tensor(); }

struct ActivationLinearFn : public torch::autograd::Function<ActivationLinearFn> {
  // Returns {act(a, b) w^T + bias} and, where lora_a is present, also
  // act(a, b) lora_a^T. (b, bias and lora_a may be Present's empty tensors.)
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b_arg, const at::Tensor& w,
                               const at::Tensor& bias_arg, const at::Tensor& lora_a_arg, int64_t act) {
    const at::Tensor b = Absent(b_arg), bias = Absent(bias_arg), lora_a = Absent(lora_a_arg);
    ctx->saved_data["act"] = act;
    ctx->save_for_backward({a, b, w, lora_a});
    const at::Tensor g = Activate(static_cast<MlpActivation>(act), a, b).out;
    variable_list out{at::linear(g, w, bias)};
    if (lora_a.defined()) out.push_back(at::linear(g, lora_a));
    return out;
  }

  // autograd's formulas: for y = x W^T (+ bias) on x's rows, dx = dy W,
  // dW = dy^T x, dbias = the sum of dy's rows; where x feeds two projections
  // (base and adapter) its gradient is the sum of both; then gelu_backward,
  // or mul's and silu_backward.
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &w = saved[2], &lora_a = saved[3];
    const auto act = static_cast<MlpActivation>(ctx->saved_data["act"].toInt());
    const Activated g = Activate(act, a, b);
    const at::Tensor g_rows = Rows(g.out);
    const at::Tensor dy = Rows(grad_out[0]);
    const bool adapted = lora_a.defined() && grad_out.size() > 1 && grad_out[1].defined();
    const at::Tensor dt = adapted ? Rows(grad_out[1]) : at::Tensor();
    variable_list grads(6);
    if (ctx->needs_input_grad(2)) grads[2] = dy.t().mm(g_rows);
    if (ctx->needs_input_grad(3)) grads[3] = dy.sum(0);
    if (adapted && ctx->needs_input_grad(4)) grads[4] = dt.t().mm(g_rows);
    if (!ctx->needs_input_grad(0) && !ctx->needs_input_grad(1)) return grads;
    at::Tensor dg = dy.mm(w);
    if (adapted) dg = dg + dt.mm(lora_a);
    dg = dg.view(g.out.sizes());
    if (act == MlpActivation::kGeluTanh) {
      grads[0] = at::gelu_backward(dg, a, "tanh");
    } else {
      if (ctx->needs_input_grad(0)) grads[0] = at::silu_backward(dg * b, a);
      if (ctx->needs_input_grad(1)) grads[1] = dg * g.silu;
    }
    return grads;
  }
};

}  // namespace

at::Tensor ActivationLinear(MlpActivation act, const at::Tensor& a, const at::Tensor& b, const BlockWeights& w,
                            size_t i, const at::Tensor& bias) {
  const bool adapted = i < w.lora.size() && w.lora[i].a.defined();
  const at::Tensor lora_a = adapted ? w.lora[i].a : at::Tensor();
  const variable_list out =
      ActivationLinearFn::apply(a, Present(act == MlpActivation::kSwiGlu ? b : at::Tensor(), a), w[i], Present(bias, a),
                                Present(lora_a, a), static_cast<int64_t>(act));
  if (!adapted) return out[0];
  return out[0] + at::linear(out[1], w.lora[i].b) * w.lora_scaling;
}

}  // namespace shardline
