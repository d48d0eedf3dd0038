// The RMS norm node against autograd through transformers' composed ops:
// the same output and gradients bit for bit in fp32 and bf16, a frozen
// weight, a 4-D input (Qwen's per-head q and k norms); and the bytes it
// keeps for backward.
#include "worker/model/rms_norm.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "worker/device/tensor_memory.h"

namespace shardline {
namespace rms_norm_test {  // (one unity translation unit with other tests)
namespace {

constexpr double kEps = 1e-6;

// transformers' LlamaRMSNorm: in fp32, cast back, then scaled.
at::Tensor Composed(const at::Tensor& x, const at::Tensor& weight) {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean({-1}, /*keepdim=*/true) + kEps);
  return weight * h.to(x.scalar_type());
}

struct Result {
  at::Tensor y, dx, dweight;
};

// fused: RmsNorm, recomputing or not; else the test's own composition.
Result Run(const at::Tensor& x0, const at::Tensor& w0, bool weight_trains, bool fused, bool recompute = true) {
  const at::Tensor x = x0.detach().clone().requires_grad_(true);
  const at::Tensor w = w0.detach().clone().requires_grad_(weight_trains);
  const at::Tensor y = fused ? RmsNorm(x, w, kEps, recompute) : Composed(x, w);
  at::manual_seed(99);
  y.backward(at::randn(y.sizes()).to(y.scalar_type()));
  return {y.detach(), x.grad(), w.grad()};
}

void ExpectBitForBit(std::vector<int64_t> shape, at::ScalarType dtype, bool weight_trains) {
  const at::Tensor x = (at::randn(shape) * 3).to(dtype);
  const at::Tensor w = (1 + 0.1 * at::randn({shape.back()})).to(dtype);
  const Result want = Run(x, w, weight_trains, false), got = Run(x, w, weight_trains, true);
  const Result kept = Run(x, w, weight_trains, true, /*recompute=*/false);
  EXPECT_TRUE(at::equal(kept.y, want.y) && at::equal(kept.dx, want.dx)) << "recompute = false";
  EXPECT_EQ(got.y.scalar_type(), dtype);
  EXPECT_TRUE(at::equal(got.y, want.y));
  EXPECT_TRUE(at::equal(got.dx, want.dx)) << "max |diff| " << (got.dx - want.dx).abs().max().item<double>();
  ASSERT_EQ(got.dweight.defined(), weight_trains);
  ASSERT_EQ(want.dweight.defined(), weight_trains);
  if (weight_trains) EXPECT_TRUE(at::equal(got.dweight, want.dweight));
}

class RmsNormDtype : public testing::TestWithParam<at::ScalarType> {};

TEST_P(RmsNormDtype, IsAutogradsBitForBit) {
  at::manual_seed(1);
  ExpectBitForBit({3, 11, 64}, GetParam(), /*weight_trains=*/true);
}

TEST_P(RmsNormDtype, AFrozenWeightGetsNoGradient) {
  at::manual_seed(2);
  ExpectBitForBit({3, 11, 64}, GetParam(), /*weight_trains=*/false);
}

TEST_P(RmsNormDtype, PerHeadOnFourDimensions) {
  at::manual_seed(3);
  ExpectBitForBit({2, 7, 4, 32}, GetParam(), /*weight_trains=*/true);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RmsNormDtype, testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// The bytes forward leaves for backward beyond x and the output: autograd
// keeps the fp32 copy of x and the normalized x in bf16 beside the rsqrt
// ([rows, 1] fp32); the node keeps the rsqrt alone.
TEST(RmsNorm, KeepsOnlyTheRsqrt) {
  TensorMemory::Install();
  at::manual_seed(4);
  const int64_t rows = 3 * 11, C = 64;
  const at::Tensor x = at::randn({3, 11, C}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor w = at::ones({C}, at::kBFloat16).requires_grad_(true);
  auto held = [&](bool fused, bool recompute = true) {
    const int64_t before = TensorMemory::current();
    const at::Tensor y = fused ? RmsNorm(x, w, kEps, recompute) : Composed(x, w);
    return TensorMemory::current() - before - y.nbytes();
  };
  const int64_t rsqrt = rows * 4;
  EXPECT_EQ(held(false), rows * C * (4 + 2) + rsqrt);
  EXPECT_EQ(held(true), rsqrt);
  EXPECT_EQ(held(true, /*recompute=*/false), held(false));
}

TEST(RmsNorm, UnderNoGradIsThePlainForward) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({4, 32}).to(at::kBFloat16), w = at::randn({32}).to(at::kBFloat16);
  const at::Tensor want = Composed(x, w);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(RmsNorm(x, w, kEps, /*recompute=*/true), want));
}

}  // namespace
}  // namespace rms_norm_test
}  // namespace shardline
