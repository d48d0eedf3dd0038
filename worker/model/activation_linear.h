// A block's MLP activation and the projection that reads it, as one autograd
// node that keeps the activation's inputs and not its output.
//
// Through the composed ops, autograd keeps for backward the activation's
// input (its own derivative needs it) and its output (the projection's weight
// gradient needs that): GPT-2's gelu(fc) keeps fc and gelu(fc), Llama's
// silu(gate) * up keeps gate, up, silu(gate) and the product. Each is
// [tokens, intermediate]: for GPT-2 a quarter of a block's saved activations,
// and for SwiGLU half of them. This node keeps the inputs alone and computes
// the activation again in backward: one pointwise pass over them (two for
// SwiGLU), against the projection's three matmuls over the same tensor.
//
// Numerics: forward and backward run the ops and formulas autograd runs
// through linear (addmm or mm on the tokens flattened, and their backward
// formulas), gelu or silu and mul, in the same dtypes, so the results are
// bit for bit autograd's (activation_linear_test checks fp32 and bf16).
//
// LoRA: where the projection is adapted, the node also returns the adapter's
// first product act(...) A^T, so that what follows it (x B^T * scaling,
// added to the base output) is ordinary autograd on a [tokens, rank] tensor
// and the [tokens, intermediate] activation is kept by no one.
//
// Threads: none of its own; runs on the caller's (the compute) stream.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

#include "worker/model/family.h"

namespace shardline {

enum class MlpActivation {
  kGeluTanh,  // GPT-2: gelu(a, "tanh"); b unused
  kSwiGlu,    // Llama, Qwen: silu(a) * b
};

// w.Linear(act(a, b), i, bias), as BlockWeights::Linear computes it (its
// adapter's term included), differentiable in a, b and every weight that
// requires a gradient.
at::Tensor ActivationLinear(MlpActivation act, const at::Tensor& a, const at::Tensor& b, const BlockWeights& w,
                            size_t i, const at::Tensor& bias = {});

}  // namespace shardline
