// transformers' LlamaRMSNorm as one autograd node that keeps its input and
// the per-row rsqrt, and computes the rest again in backward.
//
//   weight * (x.to(fp32) * rsqrt(mean(x.to(fp32)^2, -1) + eps)).to(x.dtype)
//
// Through the composed ops autograd keeps, beside x, the fp32 copy of x
// (pow's and mul's input, 4 bytes an element) and the normalized x in the
// compute dtype (the weight's multiply's input, 2 bytes in bf16): 6 bytes an
// element of every norm, three times what its output costs, twice a Llama
// block. This node keeps x, the weight and the rsqrt ([rows, 1] fp32) only.
// Backward casts and multiplies again (two passes over [rows, C]).
//
// Numerics: forward is the composed ops'. Backward runs autograd's formulas
// for each op in the same order and dtypes (mul's, with broadcasting reduced
// by at::sum_to; rsqrt's -0.5 * grad * result^3; mean's expand and divide;
// pow's grad * 2x; the casts), so x's and the weight's gradients are bit for
// bit autograd's where x feeds only the norm (rms_norm_test, fp32 and bf16).
// Where x also feeds something else (the residual), autograd sums x's
// gradient terms in its own order; in bf16 that is the same sum (the norm's
// two terms meet in fp32 before the cast), in fp32, where x.to(fp32) is x
// itself, three terms may be summed in another order: within one fp32
// rounding of the sum.
//
// Threads: none of its own; runs on the caller's (the compute) stream.
#pragma once

#include <ATen/ATen.h>

namespace shardline {

// x [..., C] in the compute dtype, weight [C]; differentiable in both.
// `recompute` false: through the composed ops ([memory] recompute_cheap_ops
// = false), which keep the fp32 copy and the normalized rows.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps, bool recompute);

}  // namespace shardline
