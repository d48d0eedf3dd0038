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

// The cotangents of a node's outputs, as rows: the projection's (dy) and,
// where the node has one, its adapter's first product's (dt).
struct RowCotangents {
  at::Tensor dy, dt;
};

RowCotangents RowsOf(const variable_list& grad_out, const at::Tensor& lora_a) {
  const bool adapted = lora_a.defined() && grad_out.size() > 1 && grad_out[1].defined();
  return {Rows(grad_out[0]), adapted ? Rows(grad_out[1]) : at::Tensor()};
}

// The projection's part of backward, by autograd's formulas: for y = g W^T
// (+ bias) on g's rows, dW = dy^T g, dbias = the sum of dy's rows, and
// dg = dy W, plus the adapter's dt lora_a where g also fed it (autograd sums
// a tensor's gradients from its consumers). The node's inputs at `first`,
// first + 1 and first + 2 are the projection's weight, bias and lora_a.

// Whether a weight gradient (dW, dA) reads g: where none does (a frozen,
// unadapted projection under LoRA), backward need not compute the op again.
bool NeedsInput(AutogradContext* ctx, size_t first, const RowCotangents& c) {
  return ctx->needs_input_grad(first) || (c.dt.defined() && ctx->needs_input_grad(first + 2));
}

// dW, dbias and dA, those that need one, into `grads`; g may be undefined
// where NeedsInput is false.
void WeightGrads(AutogradContext* ctx, const at::Tensor& g, const RowCotangents& c, size_t first,
                 variable_list* grads) {
  if (ctx->needs_input_grad(first)) (*grads)[first] = c.dy.t().mm(Rows(g));
  if (ctx->needs_input_grad(first + 1)) (*grads)[first + 1] = c.dy.sum(0);
  if (c.dt.defined() && ctx->needs_input_grad(first + 2)) (*grads)[first + 2] = c.dt.t().mm(Rows(g));
}

// dg, shaped as g (`sizes`).
at::Tensor InputGrad(const RowCotangents& c, const at::Tensor& w, const at::Tensor& lora_a, at::IntArrayRef sizes) {
  at::Tensor dg = c.dy.mm(w);
  if (c.dt.defined()) dg = dg + c.dt.mm(lora_a);
  return dg.view(sizes);
}

// BlockWeights::Linear's adapter term on the node's outputs.
at::Tensor AddAdapter(const variable_list& out, const BlockWeights& w, size_t i) {
  if (out.size() == 1) return out[0];
  return out[0] + at::linear(out[1], w.lora[i].b) * w.lora_scaling;
}

at::Tensor AdapterA(const BlockWeights& w, size_t i) {
  return i < w.lora.size() && w.lora[i].a.defined() ? w.lora[i].a : at::Tensor();
}

at::Tensor Activation(MlpActivation act, const at::Tensor& a, const at::Tensor& b) {
  return act == MlpActivation::kGeluTanh ? at::gelu(a, "tanh") : at::silu(a) * b;
}

// Inputs: a, b, w, bias, lora_a (b, bias and lora_a may be Present's empty
// tensors), act.
struct ActivationLinearFn : public torch::autograd::Function<ActivationLinearFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b_arg, const at::Tensor& w,
                               const at::Tensor& bias_arg, const at::Tensor& lora_a_arg, int64_t act) {
    const at::Tensor b = Absent(b_arg), lora_a = Absent(lora_a_arg);
    ctx->saved_data["act"] = act;
    ctx->save_for_backward({a, b, w, lora_a});
    return Project(Activation(static_cast<MlpActivation>(act), a, b), w, Absent(bias_arg), lora_a);
  }

  // The activation again where a weight gradient reads it (SwiGLU's silu(a)
  // also where b's gradient does), then gelu_backward, or mul's and
  // silu_backward, as autograd.
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &w = saved[2], &lora_a = saved[3];
    const auto act = static_cast<MlpActivation>(ctx->saved_data["act"].toInt());
    const RowCotangents c = RowsOf(grad_out, lora_a);
    const bool need_out = NeedsInput(ctx, 2, c);
    const bool swiglu = act == MlpActivation::kSwiGlu;
    const at::Tensor silu = swiglu && (need_out || ctx->needs_input_grad(1)) ? at::silu(a) : at::Tensor();
    variable_list grads(6);
    WeightGrads(ctx, need_out ? (swiglu ? silu * b : at::gelu(a, "tanh")) : at::Tensor(), c, 2, &grads);
    if (!ctx->needs_input_grad(0) && !ctx->needs_input_grad(1)) return grads;
    const at::Tensor dg = InputGrad(c, w, lora_a, a.sizes());
    if (!swiglu) {
      grads[0] = at::gelu_backward(dg, a, "tanh");
    } else {
      if (ctx->needs_input_grad(0)) grads[0] = at::silu_backward(dg * b, a);
      if (ctx->needs_input_grad(1)) grads[1] = dg * silu;
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

  // The norm's output again by the same kernel (bit for bit forward's) where a
  // weight gradient reads it, then native_layer_norm_backward with forward's
  // statistics, as autograd.
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &norm_weight = saved[1], &norm_bias = saved[2], &mean = saved[3],
                     &rstd = saved[4], &w = saved[5], &lora_a = saved[6];
    const double eps = ctx->saved_data["eps"].toDouble();
    const int64_t C = x.size(-1);
    const RowCotangents c = RowsOf(grad_out, lora_a);
    variable_list grads(7);
    const at::Tensor h =
        NeedsInput(ctx, 3, c) ? std::get<0>(at::native_layer_norm(x, {C}, norm_weight, norm_bias, eps)) : at::Tensor();
    WeightGrads(ctx, h, c, 3, &grads);
    const std::array<bool, 3> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)};
    if (!mask[0] && !mask[1] && !mask[2]) return grads;
    auto [dx, dnorm_weight, dnorm_bias] = at::native_layer_norm_backward(InputGrad(c, w, lora_a, x.sizes()), x, {C},
                                                                         mean, rstd, norm_weight, norm_bias, mask);
    grads[0] = dx;
    grads[1] = dnorm_weight;
    grads[2] = dnorm_bias;
    return grads;
  }
};

}  // namespace

at::Tensor ActivationLinear(MlpActivation act, const at::Tensor& a, const at::Tensor& b, const BlockWeights& w,
                            size_t i, const at::Tensor& bias, bool recompute) {
  if (!recompute) return w.Linear(Activation(act, a, b), i, bias);
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
