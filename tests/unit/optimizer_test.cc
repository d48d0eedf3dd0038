// The schedule, the clipping factor, which shard elements are decayed, and
// AdamW's update in fp32 and in bf16 state against torch.optim.AdamW.
#include "worker/engine/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/unit/recorded_data.h"

namespace shardline {
namespace {

TEST(Schedule, WarmupThenCosineToMinLr) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(LearningRate(o, 0, 14), 1.0 / 5);
  EXPECT_DOUBLE_EQ(LearningRate(o, 3, 14), 4.0 / 5);
  EXPECT_DOUBLE_EQ(LearningRate(o, 4, 14), 1.0);                                  // cos(0)
  EXPECT_NEAR(LearningRate(o, 9, 14), 0.1 + 0.5 * (1 + std::cos(M_PI * 0.5)) * 0.9, 1e-15);
  EXPECT_NEAR(LearningRate(o, 14, 14), 0.1, 1e-15);
}

TEST(Clip, MatchesClipGradNorm) {
  auto coef = [](double norm, double max_norm) {
    const at::Tensor c = ClipCoefficient(at::scalar_tensor(norm, at::kDouble), max_norm);
    EXPECT_EQ(c.scalar_type(), at::kFloat);
    return c.item<float>();
  };
  EXPECT_EQ(coef(0.5, 1.0), 1.0f);
  // Bit for bit what torch's fp32 arithmetic gives.
  EXPECT_EQ(coef(4.0, 1.0), 1.0f / (4.0f + 1e-6f));
  EXPECT_EQ(coef(100.0, 0.0), 1.0f);  // clipping off
}

TEST(Decay, OnlyTensorsOfTwoOrMoreDimensionsAcrossShardBoundaries) {
  // [w: 2x3 decay][b: 4 no decay][v: 3x1 decay] = 6 + 4 + 3 = 13, padded to 15 at G = 3.
  auto l = MakeShardLayout("u", {{"w", {2, 3}, true}, {"b", {4}, false}, {"v", {3, 1}, true}}, 3);
  ASSERT_TRUE(l.ok());
  auto r0 = DecayRanges(*l, 0);  // shard [0, 5): w[0..5)
  ASSERT_EQ(r0.size(), 1u);
  EXPECT_EQ(r0[0].begin, 0);
  EXPECT_EQ(r0[0].end, 5);
  auto r1 = DecayRanges(*l, 1);  // shard [5, 10): w[5], b[0..4)
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r1[0].end, 1);
  auto r2 = DecayRanges(*l, 2);  // shard [10, 15): v[0..3) at 0..3, then padding
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_EQ(r2[0].begin, 0);
  EXPECT_EQ(r2[0].end, 3);
}

TEST(AdamW, DecayedAndUndecayedElementsFollowTorch) {
  // One element of each kind, step 1, against torch.optim.AdamW by hand.
  at::Tensor p = at::tensor({1.0f, 1.0f}), m = at::zeros({2}), v = at::zeros({2});
  at::Tensor g = at::tensor({0.5f, 0.5f});
  AdamWStep s;
  s.lr = 0.1;
  s.beta1 = 0.9;
  s.beta2 = 0.95;
  s.eps = 1e-8;
  s.weight_decay = 0.1;
  AdamWUpdate(s, {{0, 1}}, p, m, v, g, at::scalar_tensor(1.0f));
  // Bias-corrected m/sqrt(v) is g/|g| = 1 on step 1, so the step is -lr.
  EXPECT_NEAR(p[0].item<float>(), 1.0f * (1 - 0.1f * 0.1f) - 0.1f, 1e-6);
  EXPECT_NEAR(p[1].item<float>(), 1.0f - 0.1f, 1e-6);
  EXPECT_NEAR(m[0].item<float>(), 0.05f, 1e-7);
  EXPECT_NEAR(v[0].item<float>(), 0.05f * 0.25f, 1e-8);
}

TEST(AdamW, AVectorizedShardUpdatesBitForBitAsElementByElement) {
  // The engine's update loop is vectorized (worker/CMakeLists.txt's flags);
  // one-element calls run its scalar remainder. Every lane must round as the
  // scalar code does: no reassociation, no contraction into FMA. 4099 elements
  // (not a multiple of any vector width), decayed and not, bf16 and fp32
  // gradients, three steps so that the moments are not their first values.
  const int64_t n = 4099, decayed = 2500;
  for (const at::ScalarType grad_type : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(7);
    at::Tensor p = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
    at::Tensor p1 = p.clone(), m1 = m.clone(), v1 = v.clone();
    for (int64_t step = 1; step <= 3; ++step) {
      const at::Tensor g = (at::randn({n}) * 1e-2).to(grad_type);
      const at::Tensor clip = at::scalar_tensor(0.75f);
      const AdamWStep s = RecordedAdamWStep(step);
      AdamWUpdate(s, {{0, decayed}}, p, m, v, g, clip);
      for (int64_t i = 0; i < n; ++i) {
        const std::vector<DecayRange> decay = i < decayed ? std::vector<DecayRange>{{0, 1}} : std::vector<DecayRange>{};
        AdamWUpdate(s, decay, p1.narrow(0, i, 1), m1.narrow(0, i, 1), v1.narrow(0, i, 1), g.narrow(0, i, 1), clip);
      }
    }
    EXPECT_TRUE(at::equal(p, p1)) << at::toString(grad_type);
    EXPECT_TRUE(at::equal(m, m1)) << at::toString(grad_type);
    EXPECT_TRUE(at::equal(v, v1)) << at::toString(grad_type);
  }
}

// bf16 state: torch.optim.AdamW over bf16 parameters (no fp32 master),
// recorded by tests/unit/data/make_adamw_bf16.py: five steps, two of them
// clipped, 600 decayed elements and 427 not. Bitwise: the update is torch's
// own op sequence, so nothing but the ops' rounding enters, and that is the
// same on both sides.
TEST(AdamW, Bf16StateEqualsTorchsAdamWOnBf16ParametersBitwise) {
  const RecordedFile file("adamw_bf16.safetensors");
  auto read = [&](const std::string& name) { return file.Floats(name); };
  at::Tensor p = read("p0").to(at::kBFloat16);  // exact: the file's values are bf16
  at::Tensor m = at::zeros_like(p), v = at::zeros_like(p);
  for (int64_t step = 1; step <= 5; ++step) {
    const std::string k = std::to_string(step);
    const AdamWStep s = RecordedAdamWStep(step);
    AdamWUpdate(s, {{0, 600}}, p, m, v, read("g" + k).to(at::kBFloat16), read("clip" + k).reshape({}));
    EXPECT_TRUE(at::equal(p.to(at::kFloat), read("p" + k))) << "params after step " << step;
    EXPECT_TRUE(at::equal(m.to(at::kFloat), read("m" + k))) << "exp_avg after step " << step;
    EXPECT_TRUE(at::equal(v.to(at::kFloat), read("v" + k))) << "exp_avg_sq after step " << step;
  }
  EXPECT_EQ(p.scalar_type(), at::kBFloat16);
}

}  // namespace
}  // namespace shardline
