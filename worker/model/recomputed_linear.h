// A projection and the cheap op before it, as one autograd node that keeps
// that op's inputs for backward and not its output: the op runs again in
// backward.
//
// Through the composed ops, autograd keeps the op's output for the
// projection's weight gradient, beside what the op's own derivative keeps:
//   - GPT-2's gelu(fc) keeps fc and gelu(fc); Llama's silu(gate) * up keeps
//     gate, up, silu(gate) and the product. Each is [tokens, intermediate]:
//     for GPT-2 a quarter of a block's saved activations, for SwiGLU half of
//     the MLP's (ActivationLinear).
//   - GPT-2's layer norms keep their input and statistics, and the projection
//     after each keeps the normalized [tokens, width] (LayerNormLinear).
// Each node keeps only the inputs and computes the op again in backward: one
// pass over [tokens, intermediate] (two for SwiGLU) or a layer norm over
// [tokens, width], beside the projection's three matmuls over the same rows.
//
// Numerics: forward and backward run the ops and formulas autograd runs
// through them (linear as addmm or mm on the tokens flattened, and their
// backward formulas; gelu_backward; mul's and silu_backward;
// native_layer_norm and native_layer_norm_backward), in the same dtypes, so
// the results are bit for bit autograd's (recomputed_linear_test checks fp32
// and bf16, with and without bias and LoRA).
//
// LoRA: where the projection is adapted, the node also returns the adapter's
// first product op(...) A^T, so that what follows it (x B^T * scaling, added
// to the base output) is ordinary autograd on a [tokens, rank] tensor and
// the op's output is kept by no one.
//
// Threads: none of their own; they run on the caller's (the compute) stream.
#pragma once

#include <cstddef>

#include <ATen/ATen.h>

#include "worker/model/family.h"

namespace shardline {

enum class MlpActivation {
  kGeluTanh,  // GPT-2: gelu(a, "tanh"); b unused
  kSwiGlu,    // Llama, Qwen: silu(a) * b
};

// w.Linear(act(a, b), i, bias), as BlockWeights::Linear computes it (its
// adapter's term included), differentiable in a, b and every weight that
// requires a gradient. `recompute` false: through the composed ops ([memory]
// recompute_cheap_ops = false), which keep the activation's output.
at::Tensor ActivationLinear(MlpActivation act, const at::Tensor& a, const at::Tensor& b, const BlockWeights& w,
                            size_t i, const at::Tensor& bias, bool recompute);

// w.Linear(at::layer_norm(x, {C}, norm_weight, norm_bias, eps), i, bias),
// differentiable in x, the norm's weight and bias and every weight that
// requires a gradient. The norm's weight and bias are defined. `recompute`
// as ActivationLinear's.
at::Tensor LayerNormLinear(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& norm_bias,
                           double eps, const BlockWeights& w, size_t i, const at::Tensor& bias, bool recompute);

}  // namespace shardline
