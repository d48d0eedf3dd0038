// strategy = "auto": the planner's fastest strategy that fits the attempt's
// workers, the least memory when none does, and a reason that says which
// bandwidth it assumed.
#include "common/plan/strategy_choice.h"

#include <gtest/gtest.h>

#include "common/plan/plan.h"
#include "common/spec/job_spec.h"

namespace shardline {
namespace {

JobConfig Llama1B() {
  JobConfig c;
  c.model.family = "llama";
  c.model.n_layer = 16;
  c.model.n_embd = 2048;
  c.model.n_head = 32;
  c.model.n_kv_head = 8;
  c.model.intermediate_size = 8192;
  c.model.vocab_size = 32000;
  c.model.block_size = 256;
  c.train.batch_size = 8;
  c.train.micro_batch_size = 1;
  c.precision.param_dtype = DType::kBFloat16;
  c.memory.activation_checkpointing = true;
  c.parallelism.auto_strategy = true;
  return c;
}

TEST(StrategyChoice, TakesTheFastestThatFitsTheSmallestWorker) {
  const JobConfig c = Llama1B();
  AttemptCluster a;
  a.world = 4;
  a.hosts = 1;
  a.device_kind = "cuda";
  a.min_memory_bytes = int64_t{80} << 30;
  absl::StatusOr<StrategyChoice> roomy = ChooseStrategy(c, a);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_NE(roomy->why.find("the fastest that fits"), std::string::npos) << roomy->why;
  EXPECT_NE(roomy->why.find("assumed until measured"), std::string::npos) << roomy->why;
  // It is the planner's fastest fitting candidate.
  PlanInput in;
  in.model = c.model;
  in.batch_size = 8;
  in.micro_batch_size = 1;
  in.param_dtype = DType::kBFloat16;
  in.cluster.workers = 4;
  in.cluster.gpus_per_node = 4;
  in.cluster.device_memory_bytes = 80.0 * (1 << 30);
  const Plan plan = *MakePlan(in);
  double fastest = 1e300;
  for (const StrategyPlan& p : plan.strategies) {
    if (!IsHybrid(p.strategy) && p.fits_checkpointed) fastest = std::min(fastest, p.step_s_checkpointed);
  }
  for (const StrategyPlan& p : plan.strategies) {
    if (p.strategy == roomy->strategy) EXPECT_DOUBLE_EQ(p.step_s_checkpointed, fastest);
  }
  // 16 bytes a parameter do not fit 8 GB: a sharding strategy is picked.
  a.min_memory_bytes = int64_t{8} << 30;
  a.measured_bus_bandwidth = 20e9;
  absl::StatusOr<StrategyChoice> tight = ChooseStrategy(c, a);
  ASSERT_TRUE(tight.ok());
  EXPECT_NE(tight->strategy, Strategy::kNoShard);
  EXPECT_NE(tight->strategy, Strategy::kZero1);
  EXPECT_NE(tight->why.find("20 GB/s measured"), std::string::npos) << tight->why;
  // Nothing fits 1 GB: the strategy of least memory, said plainly.
  a.min_memory_bytes = int64_t{1} << 30;
  absl::StatusOr<StrategyChoice> none = ChooseStrategy(c, a);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->strategy, Strategy::kFullShard);
  EXPECT_NE(none->why.find("none is predicted to fit"), std::string::npos) << none->why;
}

TEST(StrategyChoice, TheJobFileSaysAuto) {
  absl::StatusOr<JobConfig> c = ResolveJobSpec(R"(
[model]
n_layer = 1
n_head = 2
n_embd = 8
vocab_size = 16
block_size = 4
[parallelism]
strategy = "auto"
)", "auto.toml", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->parallelism.auto_strategy);
  EXPECT_FALSE(ResolveJobSpec("[model]\nn_layer = 1\n[parallelism]\nstrategy = \"automatic\"\n", "x.toml", "").ok());
}

}  // namespace
}  // namespace shardline
