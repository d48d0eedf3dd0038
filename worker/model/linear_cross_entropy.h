// The language-model head and its loss in one step, without the logits.
//
// sum_r ce(x_r W^T, t_r) * scale over the rows r whose target is not -100
// (at::cross_entropy_loss's ignore_index), computed in row chunks whose
// logits live only while the chunk is processed. The logits are [rows, V]:
// 8 x 1024 tokens of GPT-2's 50304 words are 0.8 GiB in bf16 and 1.6 GiB in
// fp32, and an autograd graph through at::cross_entropy_loss keeps both plus
// the fp32 log-softmax, then builds another fp32 tensor of that size in
// backward. Here a chunk computes its fp32 log-softmax once (one fused
// kernel, as autograd's cross_entropy_loss does), turns it in place into the
// gradient of the loss w.r.t. its logits ((softmax - onehot) * scale, rounded
// to the compute dtype as autograd would; ignored rows count zero) and at once
// into the gradients of x and W, which are all that backward needs: memory is
// one chunk's logits plus dL/dx ([rows, C]) and dL/dW ([V, C], fp32), and no
// arithmetic is added (the head's three matmuls move from backward to forward).
//
// Numerics: the loss and the gradients are the terms autograd computes
// through linear -> to(fp32) -> cross_entropy_loss, summed in another order
// only where a chunk boundary splits a sum (dL/dW over rows, accumulated in
// fp32 across chunks, and the loss). With one chunk (rows <= chunk_rows) each
// term is autograd's within an ulp: (exp(logp) - onehot) * scale here,
// exp(logp) * scale - scale * onehot in log-softmax's backward.
//
// Cost per chunk on a GPU: the logits' cast to fp32, the log-softmax, exp,
// the onehot (n elements), the scale and the cast back, each one vectorized
// pass over [n, V]; the ignored rows are masked in [n, C] tensors.
//
// Threads: none of its own; runs on the caller's (the compute) stream.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace shardline {

// x [rows, C] and w [V, C] in the compute dtype, targets [rows] int64 (-100:
// ignored). Differentiable in x and w where they require a gradient; the
// gradients are computed in the forward call only if one does (an evaluation
// under no-grad pays for the loss alone). `chunk_rows` <= 0 picks chunks of at
// most 2^26 logits (256 MiB in fp32). Backward scales those gradients in
// place, so its graph may run backward once only (retain_graph would see
// them scaled twice).
at::Tensor LinearCrossEntropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets, double scale,
                              int64_t chunk_rows = 0);

}  // namespace shardline
