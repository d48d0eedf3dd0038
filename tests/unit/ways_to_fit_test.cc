// WaysToFit on the seeds' case: Qwen3-4B on two 24 GB GPUs, where full
// fine-tuning with fp32 state fits no strategy.
#include "common/plan/ways_to_fit.h"

#include <gtest/gtest.h>

namespace shardline {
namespace {

PlanInput Qwen3FourBOnTwo24GB() {
  PlanInput in;
  ModelConfig& m = in.model;
  m.family = "llama";
  m.n_layer = 36;
  m.n_embd = 2560;
  m.n_head = 32;
  m.n_kv_head = 8;
  m.head_dim_override = 128;
  m.intermediate_size = 9728;
  m.vocab_size = 151936;
  m.block_size = 512;
  m.tie_word_embeddings = true;
  m.qk_norm = true;
  in.batch_size = 2;
  in.micro_batch_size = 1;
  in.cluster.workers = 2;
  in.cluster.gpus_per_node = 2;
  in.cluster.device_memory_bytes = 24e9;
  return in;
}

const FitOption& Named(const WaysToFit& w, const std::string& prefix) {
  for (const FitOption& o : w.options) {
    if (o.name.rfind(prefix, 0) == 0) return o;
  }
  static FitOption none;
  ADD_FAILURE() << "no option " << prefix;
  return none;
}

TEST(WaysToFit, TheSeedsThreeRunsSideBySide) {
  const PlanInput in = Qwen3FourBOnTwo24GB();
  ASSERT_TRUE(MakePlan(in).ok());
  ASSERT_TRUE(MakePlan(in)->recommended.empty());  // fp32 state: 16 bytes a parameter, 32 GiB a rank sharded
  const WaysToFit w = FindWaysToFit(in);

  // bf16 weights, gradients and moments (8 bytes a parameter, 15 GiB a rank
  // sharded over two): full_shard fits, with checkpointing, at sequence 512
  // (at 1024 its activations and the allocator's reserve pass 24 GB).
  const FitOption& bf16 = Named(w, "bf16 state");
  EXPECT_EQ(bf16.strategy, "full_shard");
  EXPECT_LE(bf16.peak_bytes, 24e9 / (1 + 1.0 / 8));  // the caching allocator's reserve beside it
  EXPECT_GE(bf16.peak_bytes, 8 * 4.02e9 / 2);
  // 8-bit moments keep an fp32 master and fp32 gradients: 10 bytes a
  // parameter, 20 GB a rank before activations: none fits.
  EXPECT_TRUE(Named(w, "8-bit moments").strategy.empty());
  EXPECT_GT(Named(w, "8-bit moments").peak_bytes, 24e9);
  // QLoRA on one GPU: the base at about 0.52 bytes a matrix weight.
  const FitOption& qlora = Named(w, "QLoRA (NF4 base), one worker");
  EXPECT_EQ(qlora.workers, 1);
  EXPECT_EQ(qlora.strategy, "no_shard");
  EXPECT_LT(qlora.peak_bytes, Named(w, "LoRA r16").peak_bytes);
  EXPECT_EQ(qlora.flags, "--lora-rank 16 --lora-targets all-linear --lora-base-dtype nf4 --workers 1");
  // Offload is named, not planned.
  EXPECT_EQ(Named(w, "CPU offload").unsupported, "not supported yet");

  // The fewest workers: each strategy fits there and not at one fewer.
  for (const auto& [strategy, world] : w.smallest_world) {
    if (strategy != Strategy::kFullShard && strategy != Strategy::kShardGradOp) continue;
    ASSERT_GT(world, 2) << StrategyName(strategy);
    for (int n : {world - 1, world}) {
      PlanInput at = in;
      at.cluster.workers = n;
      at.batch_size = n;  // one sequence a rank, as here
      bool fits = false;
      for (const StrategyPlan& sp : MakePlan(at)->strategies) {
        if (sp.strategy == strategy) fits = sp.fits || sp.fits_checkpointed;
      }
      EXPECT_EQ(fits, n == world) << StrategyName(strategy) << " at " << n;
    }
  }
}

TEST(WaysToFit, OptionsAlreadyTakenAreNotOffered) {
  PlanInput in = Qwen3FourBOnTwo24GB();
  in.cluster.device_memory_bytes = 2e9;  // nothing fits, not even QLoRA
  in.lora.enabled = true;
  in.lora.rank = 8;
  in.lora.target_modules = {"q_proj", "v_proj"};
  in.lora.base_dtype = LoraBaseDType::kNf4;
  const WaysToFit w = FindWaysToFit(in);
  ASSERT_EQ(w.options.size(), 1u);  // LoRA, QLoRA and the state's dtypes are the job's already
  EXPECT_EQ(w.options[0].name, "CPU offload");
}

}  // namespace
}  // namespace shardline
