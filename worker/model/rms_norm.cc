#include "worker/model/rms_norm.h"

#include <ATen/ExpandUtils.h>
#include <torch/csrc/autograd/custom_function.h>

namespace shardline {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor Rsqrt(const at::Tensor& x32, double eps) { return at::rsqrt(x32.pow(2).mean({-1}, /*keepdim=*/true) + eps); }

// x.to(fp32) * rsqrt, in the compute dtype.
at::Tensor Normalized(const at::Tensor& x32, const at::Tensor& rsqrt, at::ScalarType dtype) {
  return (x32 * rsqrt).to(dtype);
}

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const at::Tensor x32 = x.to(at::kFloat);
    const at::Tensor rsqrt = Rsqrt(x32, eps);
    ctx->save_for_backward({x, weight, rsqrt});
    return weight * Normalized(x32, rsqrt, x.scalar_type());
  }

  // Each op's backward formula as autograd's derivatives.yaml has it, from
  // the output back.
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rsqrt = saved[2];
    const at::Tensor& dy = grad_out[0];
    const at::Tensor x32 = x.to(at::kFloat);
    variable_list grads(3);
    // weight * n: mul's, with the broadcast weight's gradient summed to [C].
    if (ctx->needs_input_grad(1)) grads[1] = at::sum_to(dy * Normalized(x32, rsqrt, x.scalar_type()), weight.sizes());
    if (!ctx->needs_input_grad(0)) return grads;
    const at::Tensor dn = (dy * weight).to(at::kFloat);  // (n's cast back)
    // x32 * rsqrt: mul's, both ways (rsqrt's summed to [rows, 1]).
    const at::Tensor dx32_scaled = dn * rsqrt;
    const at::Tensor drsqrt = at::sum_to(dn * x32, rsqrt.sizes());
    // rsqrt(v + eps): -0.5 * grad * result^3; the + eps passes it on.
    const at::Tensor dvar = -0.5 * drsqrt * rsqrt.pow(3);
    // mean over the last dim, kept: expanded, then divided by its size.
    const at::Tensor dsquare = dvar.expand(x32.sizes()) / x32.size(-1);
    // pow(x32, 2): grad * (2 * x32^1); x32^1 is a copy, 2 * it exact.
    const at::Tensor dx32_square = dsquare * (2.0 * x32);
    grads[0] = (dx32_scaled + dx32_square).to(x.scalar_type());
    return grads;
  }
};

}  // namespace

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps, bool recompute) {
  if (recompute) return RmsNormFn::apply(x, weight, eps);
  const at::Tensor x32 = x.to(at::kFloat);
  return weight * Normalized(x32, Rsqrt(x32, eps), x.scalar_type());
}

}  // namespace shardline
