// Unit: its two FlatParams go through the unshard life cycle together (base
// first), which of them trains, how a block's adapters map onto the base
// weights they target, and the activation forward keeps for backward. And a
// FlatParam's optimizer state: AdamW on its shard from its gradient, the
// moments reachable only as checkpoints read and load them.
#include "worker/engine/unit.h"

#include <gtest/gtest.h>

#include "worker/device/device.h"

namespace shardline {
namespace {

// A group of one whose all-gather copies at once; records the gathered
// buffers' sizes in call order.
class LoggingGroup : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void Abort(const absl::Status&) override {}
  std::shared_ptr<comm::Work> AllGather(at::Tensor out, at::Tensor in) override {
    gathered.push_back(out.numel());
    out.copy_(in);
    return comm::CompletedWork();
  }
  std::shared_ptr<comm::Work> ReduceScatter(at::Tensor, at::Tensor) override { return nullptr; }
  std::shared_ptr<comm::Work> AllReduce(at::Tensor) override { return nullptr; }
  std::shared_ptr<comm::Work> Broadcast(at::Tensor, int) override { return nullptr; }
  std::shared_ptr<comm::Work> Barrier() override { return nullptr; }
  comm::CommStats Stats() const override { return {}; }
  absl::Status status() const override { return absl::OkStatus(); }
  std::vector<int64_t> gathered;
};

struct UnitFixture {
  std::shared_ptr<const Device> device = *Device::Open("cpu");
  MemoryLedger ledger;

  // A block of two projections, sharded (not persistent); frozen or not.
  std::unique_ptr<FlatParam> Base(bool trainable) {
    auto layout = MakeShardLayout("h.0", {{"q", {2, 2}, true}, {"v", {2, 2}, true}, {"b", {2}, false}}, 1);
    EXPECT_TRUE(layout.ok());
    FlatParamOptions o;
    o.persistent_params = false;
    o.persistent_grads = false;
    o.trainable = trainable;
    return *FlatParam::Create(*layout, 0, o, *device, &ledger, FlatParam::ValuesOf(at::arange(10, at::kFloat)));
  }
  // Rank-1 adapters of "v" (base index 1): lora_A [1, 2], lora_B [2, 1].
  std::unique_ptr<FlatParam> Adapters() {
    auto layout = MakeShardLayout("h.0.lora", {{"v.lora_A", {1, 2}, true}, {"v.lora_B", {2, 1}, true}}, 1);
    EXPECT_TRUE(layout.ok());
    FlatParamOptions o;
    o.persistent_params = false;
    o.persistent_grads = false;
    return *FlatParam::Create(*layout, 0, o, *device, &ledger, FlatParam::ValuesOf(at::full({4}, 2.0f)));
  }
  Unit LoraUnit() {
    model::LoraTarget v;
    v.base_index = 1;
    return Unit(Base(/*trainable=*/false), Adapters(), {v}, /*lora_scaling=*/0.5);
  }
};

TEST(Unit, UnshardWaitReshardMoveBothFlatParamsBaseFirst) {
  UnitFixture f;
  Unit unit = f.LoraUnit();
  LoggingGroup group;
  CommWaiter waiter(absl::Seconds(1));
  const int64_t at_rest = f.ledger.current(MemKind::kParams);
  EXPECT_FALSE(unit.gathering());
  unit.Unshard(group);
  EXPECT_TRUE(unit.gathering());
  EXPECT_EQ(group.gathered, (std::vector<int64_t>{10, 4}));  // the base, then the adapters
  unit.Unshard(group);  // in flight: no second gather
  EXPECT_EQ(group.gathered.size(), 2u);
  ASSERT_TRUE(unit.Wait(waiter).ok());
  EXPECT_FALSE(unit.gathering());
  EXPECT_EQ(unit.base().state(), UnshardState::kUnsharded);
  EXPECT_EQ(unit.adapters()->state(), UnshardState::kUnsharded);
  EXPECT_EQ(f.ledger.current(MemKind::kParams), at_rest + (10 + 4) * 4);
  ASSERT_TRUE(unit.Reshard().ok());
  ASSERT_TRUE(unit.Reshard().ok());  // repeated: no-op
  EXPECT_EQ(unit.base().state(), UnshardState::kSharded);
  EXPECT_EQ(unit.adapters()->state(), UnshardState::kSharded);
  EXPECT_EQ(f.ledger.current(MemKind::kParams), at_rest);
}

TEST(Unit, WaitWithoutUnshardIsAnError) {
  UnitFixture f;
  Unit unit = f.LoraUnit();
  CommWaiter waiter(absl::Seconds(1));
  EXPECT_EQ(unit.Wait(waiter).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Unit, WhatTrains) {
  UnitFixture f;
  Unit plain(f.Base(/*trainable=*/true), nullptr, {}, 0);
  EXPECT_EQ(plain.trainable(), &plain.base());
  Unit frozen(f.Base(/*trainable=*/false), nullptr, {}, 0);  // LoRA leaves it alone
  EXPECT_EQ(frozen.trainable(), nullptr);
  Unit lora = f.LoraUnit();
  EXPECT_EQ(lora.trainable(), lora.adapters());
  EXPECT_EQ(lora.name(), "h.0");
}

TEST(Unit, BlockWeightsPutAdaptersOnTheirTargets) {
  UnitFixture f;
  Unit unit = f.LoraUnit();
  LoggingGroup group;
  CommWaiter waiter(absl::Seconds(1));
  unit.Unshard(group);
  ASSERT_TRUE(unit.Wait(waiter).ok());
  const BlockWeights w = unit.block_weights();
  ASSERT_EQ(w.base.size(), 3u);
  ASSERT_EQ(w.lora.size(), 3u);
  EXPECT_FALSE(w.lora[0].a.defined());
  EXPECT_TRUE(w.lora[1].a.is_same(unit.adapters()->weights()[0]));
  EXPECT_TRUE(w.lora[1].b.is_same(unit.adapters()->weights()[1]));
  EXPECT_DOUBLE_EQ(w.lora_scaling, 0.5);
  Unit plain(f.Base(/*trainable=*/true), nullptr, {}, 0);
  EXPECT_TRUE(plain.block_weights().lora.empty());
}

TEST(Unit, ActivationIsKeptUntilTaken) {
  UnitFixture f;
  Unit unit = f.LoraUnit();
  unit.Keep({at::ones({2}), at::Tensor(), at::zeros({3})});
  const Unit::Activation a = unit.Take();
  EXPECT_EQ(a.output.numel(), 3);
  EXPECT_FALSE(unit.Take().output.defined());
}

TEST(FlatParamOptimizer, StepUpdatesMasterAndMomentsAndPublishes) {
  UnitFixture f;
  std::unique_ptr<FlatParam> p = f.Base(/*trainable=*/true);
  ASSERT_NE(p->optimizer(), nullptr);
  EXPECT_EQ(f.Base(/*trainable=*/false)->optimizer(), nullptr);
  const auto& opt = dynamic_cast<const DenseAdamWState&>(*p->optimizer());
  EXPECT_EQ(opt.exp_avg().numel(), 10);
  EXPECT_TRUE(opt.exp_avg().equal(at::zeros({10})));
  EXPECT_EQ(f.ledger.current(MemKind::kOptimizer), 2 * 10 * 4);
  ASSERT_EQ(opt.decay().size(), 2u);  // q and v; b is not decayed
  EXPECT_EQ(opt.decay()[0].begin, 0);
  EXPECT_EQ(opt.decay()[1].end, 8);

  p->grad_shard().fill_(0.5f);
  AdamWStep s;
  s.lr = 0.1;
  s.weight_decay = 0.1;
  at::Tensor want = p->master().clone(), m = at::zeros({10}), v = at::zeros({10});
  AdamWUpdate(s, opt.decay(), want, m, v, p->grad_shard(), at::scalar_tensor(1.0f));
  p->OptimizerStep(s, at::scalar_tensor(1.0f));
  EXPECT_TRUE(p->master().equal(want));
  EXPECT_TRUE(opt.exp_avg().equal(m));
  EXPECT_TRUE(opt.exp_avg_sq().equal(v));

  // Published: the next gather brings the updated values.
  LoggingGroup group;
  CommWaiter waiter(absl::Seconds(1));
  p->Unshard(group);
  ASSERT_TRUE(p->WaitForUnshard(waiter).ok());
  EXPECT_TRUE(p->unsharded().equal(want));

  // A checkpoint's values load into the live master and moments.
  ASSERT_TRUE(p->LoadState(at::full({10}, 2.0f), at::full({10}, 3.0f), at::full({10}, 4.0f)).ok());
  EXPECT_TRUE(p->master().equal(at::full({10}, 2.0f)));
  EXPECT_TRUE(opt.exp_avg().equal(at::full({10}, 3.0f)));
  EXPECT_TRUE(opt.exp_avg_sq().equal(at::full({10}, 4.0f)));
}

}  // namespace
}  // namespace shardline
