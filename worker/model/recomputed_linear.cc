#include "worker/model/recomputed_linear.h"

#include <array>

#include <torch/csrc/autograd/custom_function.h>

namespace shardline {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [..., n] as [tokens, n], as at::linear flattens its input for addmm / mm.
at::Tensor Rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// A custom function's tensor arguments must be defined (autograd records
// each one's metadata): an absent one travels as an empty tensor.
at::Tensor Present(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t : at::empty({0}, like.options());
}
at::Tensor Absent(const at::Tensor& t) { return t.numel() > 0 ? t : at::Tensor(); }

// The projection: {g w^T + bias} and, where lora_a is defined, g lora_a^T.
variable_list Project(const at::Tensor& g, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& lora_a) {
  variable_list out{at::linear(g, w, bias)};
  if (lora_a.defined()) out.push_back(at::linear(g, lora_a));
  return out;
}

// The projection's part of backward, by autograd's formulas: for y = g W^T
// (+ bias) on g's rows, dW = dy^T g, dbias = the sum of dy's rows, and
// dg = dy W, plus the adapter's dt lora_a where g also fed it (autograd sums
// a tensor's gradients from its consumers). The node's inputs at `first`,
// first + 1 and first + 2 are the projection's weight, bias and lora_a; the
// gradients of those that need one are written to `grads`. Returns dg shaped
// as g, or undefined when `want_dg` is false.
at::Tensor ProjectBackward(AutogradContext* ctx, const at::Tensor& g, const at::Tensor& w, const at::Tensor& lora_a,
                           const variable_list& grad_out, size_t first, bool want_dg, variable_list* grads) {
  const at::Tensor g_rows = Rows(g), dy = Rows(grad_out[0]);
  const bool adapted = lora_a.defined() && grad_out.size() > 1 && grad_out[1].defined();
  const at::Tensor dt = adapted ? Rows(grad_out[1]) : at::Tensor();
  if (ctx->needs_input_grad(first)) (*grads)[first] = dy.t().mm(g_rows);
  if (ctx->needs_input_grad(first + 1)) (*grads)[first + 1] = dy.sum(0);
  if (adapted && ctx->needs_input_grad(first + 2)) (*grads)[first + 2] = dt.t().mm(g_rows);
  if (!want_dg) return at::Tensor();
  at::Tensor dg = dy.mm(w);
  if (adapted) dg = dg + dt.mm(lora_a);
  return dg.view(g.sizes());
}

// BlockWeights::Linear's adapter term on the node's outputs.
at::Tensor AddAdapter(const variable_list& out, const BlockWeights& w, size_t i) {
  if (out.size() == 1) return out[0];
  return out[0] + at::linear(out[1], w.lora[i].b) * w.lora_scaling;
}

at::Tensor AdapterA(const BlockWeights& w, size_t i) {
  return i < w.lora.size() && w.lora[i].a.defined() ? w.lora[i].a : at::Tensor();
}

// The activation and, for SwiGLU, silu(a) (its backward multiplies by it).
struct Activated {
  at::Tensor out, silu;
};

Activated Activate(MlpActivation act, const at::Tensor& a, const at::Tensor& b) {
  if (act == MlpActivation::kGeluTanh) return {at::gelu(a, "tanh"), at::Tensor()};
  at::Tensor s = at::silu(a);
  return {s * b, s};
}

// Inputs: a, b, w, bias, lora_a (b, bias and lora_a may be Present's empty
// tensors), act.
struct ActivationLinearFn : public torch::autograd::Function<ActivationLinearFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b_arg, const at::Tensor& w,
                               const at::Tensor& bias_arg, const at::Tensor& lora_a_arg, int64_t act) {
    const at::Tensor b = Absent(b_arg), lora_a = Absent(lora_a_arg);
    ctx->saved_data["act"] = act;
    ctx->save_for_backward({a, b, w, lora_a});
    return Project(Activate(static_cast<MlpActivation>(act), a, b).out, w, Absent(bias_arg), lora_a);
  }

  // Then gelu_backward, or mul's and silu_backward, as autograd.
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &w = saved[2], &lora_a = saved[3];
    const auto act = static_cast<MlpActivation>(ctx->saved_data["act"].toInt());
    const Activated g = Activate(act, a, b);
    variable_list grads(6);
    const bool want_dg = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    const at::Tensor dg = ProjectBackward(ctx, g.out, w, lora_a, grad_out, 2, want_dg, &grads);
    if (!want_dg) return grads;
    if (act == MlpActivation::kGeluTanh) {
      grads[0] = at::gelu_backward(dg, a, "tanh");
    } else {
      if (ctx->needs_input_grad(0)) grads[0] = at::silu_backward(dg * b, a);
      if (ctx->needs_input_grad(1)) grads[1] = dg * g.silu;
    }
    return grads;
  }
};

// Inputs: x, norm_weight, norm_bias, w, bias, lora_a (bias and lora_a may be
// Present's empty tensors), eps. Keeps x and the norm's statistics.
struct LayerNormLinearFn : public torch::autograd::Function<LayerNormLinearFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& norm_weight,
                               const at::Tensor& norm_bias, const at::Tensor& w, const at::Tensor& bias_arg,
                               const at::Tensor& lora_a_arg, double eps) {
    const at::Tensor lora_a = Absent(lora_a_arg);
    auto [h, mean, rstd] = at::native_layer_norm(x, {x.size(-1)}, norm_weight, norm_bias, eps);
    ctx->saved_data["eps"] = eps;
    ctx->save_for_backward({x, norm_weight, norm_bias, mean, rstd, w, lora_a});
    return Project(h, w, Absent(bias_arg), lora_a);
  }

  // The norm's output again by the same kernel (bit for bit forward's), then
  // native_layer_norm_backward with forward's statistics, as autograd.
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &norm_weight = saved[1], &norm_bias = saved[2], &mean = saved[3],
                     &rstd = saved[4], &w = saved[5], &lora_a = saved[6];
    const double eps = ctx->saved_data["eps"].toDouble();
    const int64_t C = x.size(-1);
    const at::Tensor h = std::get<0>(at::native_layer_norm(x, {C}, norm_weight, norm_bias, eps));
    variable_list grads(7);
    const std::array<bool, 3> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)};
    const bool want_dh = mask[0] || mask[1] || mask[2];
    const at::Tensor dh = ProjectBackward(ctx, h, w, lora_a, grad_out, 3, want_dh, &grads);
    if (!want_dh) return grads;
    auto [dx, dnorm_weight, dnorm_bias] =
        at::native_layer_norm_backward(dh, x, {C}, mean, rstd, norm_weight, norm_bias, mask);
    grads[0] = dx;
    grads[1] = dnorm_weight;
    grads[2] = dnorm_bias;
    return grads;
  }
};

}  // namespace

at::Tensor ActivationLinear(MlpActivation act, const at::Tensor& a, const at::Tensor& b, const BlockWeights& w,
                            size_t i, const at::Tensor& bias, bool recompute) {
  if (!recompute) return w.Linear(Activate(act, a, b).out, i, bias);
  const at::Tensor b_arg = act == MlpActivation::kSwiGlu ? b : at::Tensor();
  return AddAdapter(ActivationLinearFn::apply(a, Present(b_arg, a), w[i], Present(bias, a),
                                              Present(AdapterA(w, i), a), static_cast<int64_t>(act)),
                    w, i);
}

at::Tensor LayerNormLinear(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& norm_bias,
                           double eps, const BlockWeights& w, size_t i, const at::Tensor& bias, bool recompute) {
  if (!recompute) return w.Linear(at::layer_norm(x, {x.size(-1)}, norm_weight, norm_bias, eps), i, bias);
  return AddAdapter(
      LayerNormLinearFn::apply(x, norm_weight, norm_bias, w[i], Present(bias, x), Present(AdapterA(w, i), x), eps), w,
      i);
}

}  // namespace shardline
