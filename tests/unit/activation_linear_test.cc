// The MLP's activation and projection as one node, against autograd through
// the composed ops (gelu or silu * up, then BlockWeights::Linear): the same
// output and gradients bit for bit, with and without bias and LoRA, in fp32
// and bf16; and the bytes it keeps for backward, which are the point.
#include "worker/model/activation_linear.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "worker/device/tensor_memory.h"

namespace shardline {
namespace {

constexpr int64_t kB = 2, kT = 17, kI = 96, kOut = 40, kRank = 4;

// The leaves of one MLP projection; frozen ones do not require a gradient.
struct Leaves {
  at::Tensor a, b, w, bias, lora_a, lora_b;
};

Leaves MakeLeaves(at::ScalarType dtype, bool swiglu, bool bias, bool lora, bool base_trains) {
  auto leaf = [dtype](std::vector<int64_t> shape, bool trains) {
    return (at::randn(shape) * 0.5).to(dtype).requires_grad_(trains);
  };
  Leaves l;
  l.a = leaf({kB, kT, kI}, true);
  if (swiglu) l.b = leaf({kB, kT, kI}, true);
  l.w = leaf({kOut, kI}, base_trains);
  if (bias) l.bias = leaf({kOut}, base_trains);
  if (lora) {
    l.lora_a = leaf({kRank, kI}, true);
    l.lora_b = leaf({kOut, kRank}, true);
  }
  return l;
}

BlockWeights WeightsOf(const Leaves& l) {
  BlockWeights w(Weights{l.w});
  if (l.lora_a.defined()) {
    w.lora = {LoraPair{l.lora_a, l.lora_b}};
    w.lora_scaling = 2.0;
  }
  return w;
}

at::Tensor Composed(MlpActivation act, const Leaves& l) {
  const at::Tensor g = act == MlpActivation::kGeluTanh ? at::gelu(l.a, "tanh") : at::silu(l.a) * l.b;
  return WeightsOf(l).Linear(g, 0, l.bias);
}

at::Tensor Fused(MlpActivation act, const Leaves& l) {
  return ActivationLinear(act, l.a, l.b, WeightsOf(l), 0, l.bias);
}

// The output and every leaf's gradient (undefined where it has none) after
// backward of a fixed random cotangent.
std::vector<at::Tensor> Run(MlpActivation act, const Leaves& l, bool fused) {
  const at::Tensor y = fused ? Fused(act, l) : Composed(act, l);
  at::manual_seed(99);
  y.backward(at::randn(y.sizes()).to(y.scalar_type()));
  std::vector<at::Tensor> out{y.detach()};
  for (const at::Tensor* t : {&l.a, &l.b, &l.w, &l.bias, &l.lora_a, &l.lora_b}) {
    out.push_back(t->defined() ? t->grad() : at::Tensor());
    if (t->defined() && t->grad().defined()) t->mutable_grad() = at::Tensor();
  }
  return out;
}

void ExpectBitForBit(MlpActivation act, const Leaves& l) {
  const std::vector<at::Tensor> want = Run(act, l, /*fused=*/false), got = Run(act, l, /*fused=*/true);
  const char* names[] = {"output", "a", "b", "weight", "bias", "lora_A", "lora_B"};
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(names[i]);
    ASSERT_EQ(got[i].defined(), want[i].defined());
    if (!want[i].defined()) continue;
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type());
    EXPECT_EQ(got[i].sizes(), want[i].sizes());
    EXPECT_TRUE(at::equal(got[i], want[i])) << "max |diff| " << (got[i] - want[i]).abs().max().item<double>();
  }
}

class ActivationLinearDtype : public testing::TestWithParam<at::ScalarType> {};

TEST_P(ActivationLinearDtype, GeluWithBiasIsAutogradsBitForBit) {
  at::manual_seed(1);
  ExpectBitForBit(MlpActivation::kGeluTanh, MakeLeaves(GetParam(), false, /*bias=*/true, false, true));
}

TEST_P(ActivationLinearDtype, SwigluIsAutogradsBitForBit) {
  at::manual_seed(2);
  ExpectBitForBit(MlpActivation::kSwiGlu, MakeLeaves(GetParam(), true, false, false, true));
}

// LoRA's usual case: the base frozen, the adapter training. The activation's
// gradient is the sum of the base's and the adapter's terms.
TEST_P(ActivationLinearDtype, AdaptedOverAFrozenBaseIsAutogradsBitForBit) {
  at::manual_seed(3);
  ExpectBitForBit(MlpActivation::kSwiGlu, MakeLeaves(GetParam(), true, false, /*lora=*/true,
                                                     /*base_trains=*/false));
  ExpectBitForBit(MlpActivation::kGeluTanh, MakeLeaves(GetParam(), false, true, true, false));
}

TEST_P(ActivationLinearDtype, AdaptedAndTrainingTheBaseIsAutogradsBitForBit) {
  at::manual_seed(4);
  ExpectBitForBit(MlpActivation::kGeluTanh, MakeLeaves(GetParam(), false, true, true, true));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ActivationLinearDtype, testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// The bytes forward leaves for backward, by TensorMemory's count: the
// composed ops keep the activation's output (GELU), or silu(gate) and the
// product (SwiGLU), beside the projection's output; the node keeps only the
// output (its inputs are the caller's either way).
int64_t HeldAfterForward(MlpActivation act, const Leaves& l, bool fused) {
  const int64_t before = TensorMemory::current();
  const at::Tensor y = fused ? Fused(act, l) : Composed(act, l);
  return TensorMemory::current() - before;
}

TEST(ActivationLinear, KeepsNoneOfTheActivationsOutputs) {
  TensorMemory::Install();
  at::manual_seed(5);
  const int64_t act_bytes = kB * kT * kI * 2;  // one [tokens, intermediate] bf16 tensor
  const Leaves gelu = MakeLeaves(at::kBFloat16, false, true, false, true);
  EXPECT_EQ(
      HeldAfterForward(MlpActivation::kGeluTanh, gelu, false) - HeldAfterForward(MlpActivation::kGeluTanh, gelu, true),
      act_bytes);
  const Leaves swiglu = MakeLeaves(at::kBFloat16, true, false, false, true);
  EXPECT_EQ(
      HeldAfterForward(MlpActivation::kSwiGlu, swiglu, false) - HeldAfterForward(MlpActivation::kSwiGlu, swiglu, true),
      2 * act_bytes);
}

// Under no-grad (evaluation) it is the plain forward, with no graph.
TEST(ActivationLinear, UnderNoGradIsThePlainForward) {
  at::manual_seed(6);
  const Leaves l = MakeLeaves(at::kFloat, true, false, true, true);
  const at::Tensor want = Composed(MlpActivation::kSwiGlu, l).detach();
  at::NoGradGuard no_grad;
  const at::Tensor got = Fused(MlpActivation::kSwiGlu, l);
  EXPECT_FALSE(got.requires_grad());
  EXPECT_TRUE(at::equal(got, want));
}

}  // namespace
}  // namespace shardline
