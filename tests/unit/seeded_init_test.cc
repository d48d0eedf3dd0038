// SeededUnitValues: a unit's seeded values produced in ranges equal, bitwise,
// one normal_ / uniform_ call over each whole parameter from its (seed, name)
// generator, whatever the ranges asked for and their order.
#include "worker/model/seeded_init.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>

namespace shardline {
namespace {

constexpr uint64_t kSeed = 1234;
constexpr int64_t kPiece = SeededUnitValues::kPiece;

// The generator's seed as the engine has always drawn it: a checkpoint's
// seed and names give the same initial values in every version.
at::Generator Reference(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return at::make_generator<at::CPUGeneratorImpl>(kSeed ^ (h * 0x9E3779B97F4A7C15ull));
}

ParamInit InitOf(const ParamSpec& p) {
  if (p.name == "norm.weight") return {ParamInit::Kind::kOnes};
  if (p.name == "bias") return {};
  if (p.name == "a.lora_A.weight") return {ParamInit::Kind::kUniform, 0.5};
  return {ParamInit::Kind::kNormal, 0.02};
}

// Parameters whose lengths reach every case of the pieces: under 16 (ATen's
// serial normal), a multiple of 16, a tail under 16 after whole pieces
// (merged into the last piece), a tail of 16 or more, ones and zeros.
ShardLayout Layout() {
  std::vector<ParamSpec> params = {
      {"tiny.weight", {3, 5}, true},           {"norm.weight", {7}, false},
      {"even.weight", {4, 16}, true},          {"long.weight", {2, kPiece + 7}, true},
      {"bias", {9}, false},                    {"tail.weight", {1, kPiece + 40}, true},
      {"a.lora_A.weight", {3, kPiece / 2 + 1}, true},
  };
  auto layout = MakeShardLayout("unit", params, 2);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

at::Tensor Whole(const ShardLayout& layout) {
  at::Tensor flat = at::zeros({layout.padded_numel}, at::kFloat);
  for (const ParamSlot& slot : layout.params) {
    at::Tensor w = flat.narrow(0, slot.offset, slot.spec.numel());
    const ParamInit init = InitOf(slot.spec);
    if (init.kind == ParamInit::Kind::kOnes) w.fill_(1.0);
    if (init.kind == ParamInit::Kind::kNormal) w.normal_(0.0, init.scale, Reference(slot.spec.name));
    if (init.kind == ParamInit::Kind::kUniform) w.uniform_(-init.scale, init.scale, Reference(slot.spec.name));
  }
  return flat;
}

TEST(SeededUnitValues, RangesEqualOneCallOverEachWholeParameter) {
  const ShardLayout layout = Layout();
  const at::Tensor expected = Whole(layout);
  // Pieces of odd lengths that cut parameters anywhere, in order.
  for (const int64_t step : {int64_t{1} << 20, int64_t{999'983}, layout.padded_numel}) {
    SeededUnitValues values(layout, kSeed, InitOf);
    at::Tensor got = at::full({layout.padded_numel}, -7.0f);
    for (int64_t b = 0; b < layout.padded_numel; b += step) {
      const int64_t n = std::min(step, layout.padded_numel - b);
      values.Fill(b, got.narrow(0, b, n));
    }
    EXPECT_TRUE(at::equal(got, expected)) << "step " << step << ": max diff "
                                          << (got - expected).abs().max().item<float>();
  }
}

TEST(SeededUnitValues, AShardAloneAndRangesOutOfOrderAgree) {
  const ShardLayout layout = Layout();
  const at::Tensor expected = Whole(layout);
  // Rank 1's shard only, as a sharded FlatParam asks for it.
  SeededUnitValues shard(layout, kSeed, InitOf);
  const int64_t begin = layout.ShardOffset(1), n = layout.shard_numel;
  at::Tensor got = at::empty({n}, at::kFloat);
  shard.Fill(begin, got);
  EXPECT_TRUE(at::equal(got, expected.narrow(0, begin, n)));
  // Backwards: every parameter's generator starts again.
  SeededUnitValues back(layout, kSeed, InitOf);
  at::Tensor all = at::empty({layout.padded_numel}, at::kFloat);
  for (int64_t e = layout.padded_numel; e > 0;) {
    const int64_t b = std::max<int64_t>(0, e - 3'000'017);
    back.Fill(b, all.narrow(0, b, e - b));
    e = b;
  }
  EXPECT_TRUE(at::equal(all, expected));
}

TEST(SeededUnitValues, AdaptersStartAsPeft) {
  const ParamInit a = AdapterInitOf({"h.0.attn.q.lora_A.weight", {16, 64}, true});
  EXPECT_EQ(a.kind, ParamInit::Kind::kUniform);
  EXPECT_DOUBLE_EQ(a.scale, 1.0 / 8.0);
  EXPECT_EQ(AdapterInitOf({"h.0.attn.q.lora_B.weight", {64, 16}, true}).kind, ParamInit::Kind::kZero);
}

}  // namespace
}  // namespace shardline
