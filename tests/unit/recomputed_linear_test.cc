// A projection and the op before it as one node (GELU, SwiGLU, layer norm),
// against autograd through the composed ops (the op, then
// BlockWeights::Linear): the same output and gradients bit for bit, with and
// without bias and LoRA, in fp32 and bf16; and the bytes each keeps for
// backward, which are the point.
#include "worker/model/recomputed_linear.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "worker/device/tensor_memory.h"

namespace shardline {
namespace recomputed_linear_test {  // (one unity translation unit with other tests)
namespace {

constexpr int64_t kB = 2, kT = 17, kIn = 96, kOut = 40, kRank = 4;
constexpr double kEps = 1e-5;

enum class Op { kGelu, kSwiGlu, kLayerNorm };

// The leaves of one op and projection; frozen ones do not require a
// gradient. a is the op's input (x for the norm), b SwiGLU's second.
struct Leaves {
  Op op;
  at::Tensor a, b, norm_weight, norm_bias, w, bias, lora_a, lora_b;
};

struct Shape {
  bool bias = false, lora = false, base_trains = true;
};

Leaves MakeLeaves(Op op, at::ScalarType dtype, Shape s) {
  auto leaf = [dtype](std::vector<int64_t> shape, bool trains) {
    return (at::randn(shape) * 0.5).to(dtype).requires_grad_(trains);
  };
  Leaves l{op};
  l.a = leaf({kB, kT, kIn}, true);
  if (op == Op::kSwiGlu) l.b = leaf({kB, kT, kIn}, true);
  if (op == Op::kLayerNorm) {
    l.norm_weight = (1 + leaf({kIn}, false)).detach().requires_grad_(s.base_trains);
    l.norm_bias = leaf({kIn}, s.base_trains);
  }
  l.w = leaf({kOut, kIn}, s.base_trains);
  if (s.bias) l.bias = leaf({kOut}, s.base_trains);
  if (s.lora) {
    l.lora_a = leaf({kRank, kIn}, true);
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

at::Tensor Composed(const Leaves& l) {
  at::Tensor g;
  if (l.op == Op::kGelu) g = at::gelu(l.a, "tanh");
  if (l.op == Op::kSwiGlu) g = at::silu(l.a) * l.b;
  if (l.op == Op::kLayerNorm) g = at::layer_norm(l.a, {kIn}, l.norm_weight, l.norm_bias, kEps);
  return WeightsOf(l).Linear(g, 0, l.bias);
}

// The function under test; `recompute` false is [memory]
// recompute_cheap_ops = false, the composed ops.
at::Tensor Fused(const Leaves& l, bool recompute = true) {
  if (l.op == Op::kLayerNorm) {
    return LayerNormLinear(l.a, l.norm_weight, l.norm_bias, kEps, WeightsOf(l), 0, l.bias, recompute);
  }
  const MlpActivation act = l.op == Op::kGelu ? MlpActivation::kGeluTanh : MlpActivation::kSwiGlu;
  return ActivationLinear(act, l.a, l.b, WeightsOf(l), 0, l.bias, recompute);
}

// The output and every leaf's gradient (undefined where it has none) after
// backward of a fixed random cotangent.
std::vector<at::Tensor> Run(const Leaves& l, bool fused, bool recompute = true) {
  const at::Tensor y = fused ? Fused(l, recompute) : Composed(l);
  at::manual_seed(99);
  y.backward(at::randn(y.sizes()).to(y.scalar_type()));
  std::vector<at::Tensor> out{y.detach()};
  for (const at::Tensor* t : {&l.a, &l.b, &l.norm_weight, &l.norm_bias, &l.w, &l.bias, &l.lora_a, &l.lora_b}) {
    out.push_back(t->defined() ? t->grad() : at::Tensor());
    if (t->defined() && t->grad().defined()) t->mutable_grad() = at::Tensor();
  }
  return out;
}

void ExpectBitForBit(Op op, at::ScalarType dtype, Shape s) {
  const Leaves l = MakeLeaves(op, dtype, s);
  const std::vector<at::Tensor> want = Run(l, /*fused=*/false), got = Run(l, /*fused=*/true),
                                kept = Run(l, /*fused=*/true, /*recompute=*/false);
  const char* names[] = {"output", "a", "b", "norm_weight", "norm_bias", "weight", "bias", "lora_A", "lora_B"};
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(names[i]);
    ASSERT_EQ(kept[i].defined(), want[i].defined());
    if (want[i].defined()) EXPECT_TRUE(at::equal(kept[i], want[i])) << "recompute = false";
    ASSERT_EQ(got[i].defined(), want[i].defined());
    if (!want[i].defined()) continue;
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type());
    EXPECT_EQ(got[i].sizes(), want[i].sizes());
    EXPECT_TRUE(at::equal(got[i], want[i])) << "max |diff| " << (got[i] - want[i]).abs().max().item<double>();
  }
}

class RecomputedLinear : public testing::TestWithParam<at::ScalarType> {};

TEST_P(RecomputedLinear, GeluWithBiasIsAutogradsBitForBit) {
  at::manual_seed(1);
  ExpectBitForBit(Op::kGelu, GetParam(), {.bias = true});
}

TEST_P(RecomputedLinear, SwigluIsAutogradsBitForBit) {
  at::manual_seed(2);
  ExpectBitForBit(Op::kSwiGlu, GetParam(), {});
}

TEST_P(RecomputedLinear, LayerNormWithBiasIsAutogradsBitForBit) {
  at::manual_seed(3);
  ExpectBitForBit(Op::kLayerNorm, GetParam(), {.bias = true});
}

// LoRA's usual case: the base frozen, the adapter training. The op output's
// gradient is the sum of the base's and the adapter's terms.
TEST_P(RecomputedLinear, AdaptedOverAFrozenBaseIsAutogradsBitForBit) {
  at::manual_seed(4);
  for (Op op : {Op::kGelu, Op::kSwiGlu, Op::kLayerNorm}) {
    SCOPED_TRACE(static_cast<int>(op));
    ExpectBitForBit(op, GetParam(), {.bias = op != Op::kSwiGlu, .lora = true, .base_trains = false});
  }
}

// LoRA's projections it does not target: frozen and unadapted, so no weight
// gradient reads the op's output and backward does not compute it again;
// the op's input still gets its gradient.
TEST_P(RecomputedLinear, AFrozenUnadaptedProjectionIsAutogradsBitForBit) {
  at::manual_seed(6);
  for (Op op : {Op::kGelu, Op::kSwiGlu, Op::kLayerNorm}) {
    SCOPED_TRACE(static_cast<int>(op));
    ExpectBitForBit(op, GetParam(), {.bias = op != Op::kSwiGlu, .base_trains = false});
  }
}

TEST_P(RecomputedLinear, AdaptedAndTrainingTheBaseIsAutogradsBitForBit) {
  at::manual_seed(5);
  ExpectBitForBit(Op::kGelu, GetParam(), {.bias = true, .lora = true});
  ExpectBitForBit(Op::kLayerNorm, GetParam(), {.bias = true, .lora = true});
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RecomputedLinear, testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// The bytes forward leaves for backward, by TensorMemory's count, beyond the
// inputs (the caller's either way) and the output.
int64_t HeldAfterForward(const Leaves& l, bool fused, bool recompute = true) {
  const int64_t before = TensorMemory::current();
  const at::Tensor y = fused ? Fused(l, recompute) : Composed(l);
  return TensorMemory::current() - before - y.nbytes();
}

// What autograd keeps of the op's output: gelu(a), or silu(a) and the
// product, or the normalized x. Each node keeps none of it; the norm's node
// keeps its statistics (mean and rstd, [tokens, 1] each: bf16 on the CPU,
// fp32 on CUDA), as autograd does.
TEST(RecomputedLinear, KeepsNoneOfTheOpsOutputs) {
  TensorMemory::Install();
  at::manual_seed(6);
  const int64_t out_bytes = kB * kT * kIn * 2;  // one [tokens, in] bf16 tensor
  const Leaves gelu = MakeLeaves(Op::kGelu, at::kBFloat16, {.bias = true});
  EXPECT_EQ(HeldAfterForward(gelu, false), out_bytes);
  EXPECT_EQ(HeldAfterForward(gelu, true), 0);
  EXPECT_EQ(HeldAfterForward(gelu, true, /*recompute=*/false), out_bytes);
  const Leaves swiglu = MakeLeaves(Op::kSwiGlu, at::kBFloat16, {});
  EXPECT_EQ(HeldAfterForward(swiglu, false), 2 * out_bytes);
  EXPECT_EQ(HeldAfterForward(swiglu, true), 0);
  const Leaves norm = MakeLeaves(Op::kLayerNorm, at::kBFloat16, {.bias = true});
  const auto [normed, mean, rstd] =
      at::native_layer_norm(norm.a.detach(), {kIn}, norm.norm_weight.detach(), norm.norm_bias.detach(), kEps);
  const int64_t stats = mean.nbytes() + rstd.nbytes();
  EXPECT_EQ(HeldAfterForward(norm, false), out_bytes + stats);
  EXPECT_EQ(HeldAfterForward(norm, true), stats);
}

// Under no-grad (evaluation) each is the plain forward, with no graph.
TEST(RecomputedLinear, UnderNoGradIsThePlainForward) {
  at::manual_seed(7);
  for (Op op : {Op::kGelu, Op::kSwiGlu, Op::kLayerNorm}) {
    const Leaves l = MakeLeaves(op, at::kFloat, {.bias = true, .lora = true});
    const at::Tensor want = Composed(l).detach();
    at::NoGradGuard no_grad;
    const at::Tensor got = Fused(l);
    EXPECT_FALSE(got.requires_grad());
    EXPECT_TRUE(at::equal(got, want));
  }
}

}  // namespace
}  // namespace recomputed_linear_test
}  // namespace shardline
