// The fused head and loss against autograd through linear -> fp32 ->
// cross_entropy_loss: the loss and both gradients, ignored rows, chunks and
// no-grad evaluation.
#include "worker/model/linear_cross_entropy.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

namespace shardline {
namespace {

struct Grads {
  at::Tensor loss, dx, dw;
};

constexpr int64_t kRows = 10, kC = 16, kV = 37;
constexpr double kScale = 1.0 / 7;

// Rows 2 and 7 are ignored (-100), as masked targets are.
at::Tensor Targets() {
  at::Tensor t = at::randint(0, kV, {kRows}, at::TensorOptions().dtype(at::kLong));
  t[2] = -100;
  t[7] = -100;
  return t;
}

Grads HeadGrads(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& t, bool fused, int64_t chunk_rows = 0) {
  at::Tensor x = x0.detach().clone().requires_grad_(true);
  at::Tensor w = w0.detach().clone().requires_grad_(true);
  at::Tensor loss = fused ? LinearCrossEntropy(x, w, t, kScale, chunk_rows)
                          : at::cross_entropy_loss(at::linear(x, w).to(at::kFloat), t, {}, at::Reduction::Sum) * kScale;
  loss.backward();
  return {loss.detach(), x.grad(), w.grad()};
}

// fp32: the same log-softmax kernel, and dL/dlogits within an ulp of
// autograd's ((exp(logp) - onehot) * scale against exp(logp) * scale - scale *
// onehot); what a chunk boundary changes is the order of dW's fp32 sum over
// rows, whose error is bounded by ~rows * 2^-24 times the sum of its terms'
// magnitudes, not the result's (terms of either sign cancel: an element of
// 6e-4 came out 1 ulp of 0.5 off). |softmax - onehot| <= 1, so the terms of
// dW[v, c] are at most scale * |x[r, c]|: 1e-5 of scale * sum_r |x[r, c]| holds
// the reordering with margin. The loss and dx are relative 1e-5. A wrong term
// (a missed ignore, the onehot at the wrong column, a lost scale) is off by
// O(1) relative and O(scale * |x|) absolute.
TEST(LinearCrossEntropy, EqualsAutogradThroughCrossEntropyInFp32) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({kRows, kC}), w = at::randn({kV, kC}) * 0.5, t = Targets();
  const Grads want = HeadGrads(x, w, t, /*fused=*/false);
  const at::Tensor dw_tolerance = (x.abs().sum(0) * (kScale * 1e-5)).unsqueeze(0) + 1e-5 * want.dw.abs();
  for (int64_t chunk : {0, 1, 3, 10}) {
    SCOPED_TRACE(chunk);
    const Grads got = HeadGrads(x, w, t, /*fused=*/true, chunk);
    EXPECT_EQ(got.loss.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(got.loss, want.loss, 1e-5, 0));
    EXPECT_TRUE(at::allclose(got.dx, want.dx, 1e-5, 1e-8));
    EXPECT_TRUE(((got.dw - want.dw).abs() <= dw_tolerance).all().item<bool>());
    EXPECT_EQ(got.dx[2].abs().max().item<float>(), 0.0f) << "an ignored row has no gradient";
  }
}

// bf16 operands: the logits are rounded to bf16 before the fp32 softmax, and
// dL/dlogits to bf16 before the gradient matmuls, as autograd does; in one
// chunk the arithmetic is the same, so what differs is at most one bf16
// rounding (unit roundoff 2^-8) of each result.
TEST(LinearCrossEntropy, EqualsAutogradInBf16) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({kRows, kC}).to(at::kBFloat16), w = (at::randn({kV, kC}) * 0.5).to(at::kBFloat16);
  const at::Tensor t = Targets();
  const Grads want = HeadGrads(x, w, t, /*fused=*/false), got = HeadGrads(x, w, t, /*fused=*/true);
  EXPECT_EQ(got.dx.scalar_type(), at::kBFloat16);
  EXPECT_EQ(got.dw.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(got.loss, want.loss, 1e-5, 0));
  const double u = 1.0 / 256;
  EXPECT_TRUE(at::allclose(got.dx.to(at::kFloat), want.dx.to(at::kFloat), u, 1e-6));
  EXPECT_TRUE(at::allclose(got.dw.to(at::kFloat), want.dw.to(at::kFloat), u, 1e-6));
}

TEST(LinearCrossEntropy, UnderNoGradComputesTheLossAlone) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({kRows, kC}).requires_grad_(true), w = at::randn({kV, kC}), t = Targets();
  const at::Tensor want = at::cross_entropy_loss(at::linear(x, w), t, {}, at::Reduction::Sum) * kScale;
  at::NoGradGuard no_grad;
  const at::Tensor got = LinearCrossEntropy(x, w, t, kScale, 4);
  EXPECT_FALSE(got.requires_grad());
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 0));
}

// A frozen head (LoRA's base) gets no gradient; the hidden state still does.
TEST(LinearCrossEntropy, AFrozenWeightGetsNoGradient) {
  at::manual_seed(6);
  at::Tensor x = at::randn({kRows, kC}).requires_grad_(true);
  const at::Tensor w = at::randn({kV, kC}), t = Targets();
  LinearCrossEntropy(x, w, t, kScale).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
}

}  // namespace
}  // namespace shardline
