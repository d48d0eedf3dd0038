#include "common/model/model_shapes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace shardline::model {
namespace {

ModelConfig Gpt2Small() {
  ModelConfig m;
  m.n_layer = 12;
  m.n_head = 12;
  m.n_embd = 768;
  m.vocab_size = 50257;
  m.block_size = 1024;
  return m;
}

TEST(ModelShapes, Gpt2SmallHasItsPublishedParameterCount) {
  EXPECT_EQ(NumParams(Gpt2Small()), 124439808);  // GPT-2 124M, lm_head tied to wte
}

// A GPT-2 124M block: two layer norms (2 x 2 x 768), c_attn (768 x 2304 +
// 2304), the attention's c_proj (768 x 768 + 768), c_fc (768 x 3072 + 3072)
// and the MLP's c_proj (3072 x 768 + 768); twelve of them and the embeddings
// (50257 x 768 + 1024 x 768) and ln_f (2 x 768) make the published count.
TEST(ModelShapes, BlockParamsIsOneBlocksWeights) {
  EXPECT_EQ(BlockParams(Gpt2Small()), 7087872.0);
  EXPECT_EQ(12 * BlockParams(Gpt2Small()) + (50257 + 1024) * 768 + 2 * 768, NumParams(Gpt2Small()));
}

TEST(ModelShapes, TrainingFlopsPerTokenIsPalmsFormula) {
  // nanoGPT's estimate_mfu for GPT-2 124M: N excludes wpe (1024*768), then
  // 6N + 12*L*H*Q*T = 6*123653376 + 12*12*12*64*1024.
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(Gpt2Small()), 6.0 * 123653376 + 12.0 * 12 * 12 * 64 * 1024);
}

TEST(ModelShapes, Llama32OneBHasItsPublishedParameterCount) {
  ModelConfig m;
  m.family = "llama";
  m.n_layer = 16;
  m.n_head = 32;
  m.n_kv_head = 8;
  m.n_embd = 2048;
  m.intermediate_size = 8192;
  m.vocab_size = 128256;
  m.tie_word_embeddings = true;
  EXPECT_EQ(NumParams(m), 1235814400);  // meta-llama/Llama-3.2-1B
  EXPECT_EQ(UnitName(m, 1), "layers.0");
  const auto layer = UnitParams(m, 1);
  EXPECT_EQ(layer[2].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(layer[2].shape, (std::vector<int64_t>{512, 2048}));  // 8 kv heads of 64
  EXPECT_EQ(UnitParams(m, HeadUnit(m)).size(), 1u);              // tied: no lm_head
  m.tie_word_embeddings = false;
  m.qkv_bias = true;
  m.qk_norm = true;
  EXPECT_EQ(UnitParams(m, HeadUnit(m)).back().name, "lm_head.weight");
  EXPECT_EQ(UnitParams(m, 1).size(), 14u);  // 2 norms, q/k/v with biases (6), o, q/k norms, 3 MLP
}

TEST(ModelShapes, TheParameterCountNeverOverflows) {
  ModelConfig m;
  m.family = "llama";
  m.n_layer = 10000;
  m.n_head = 65536;
  m.n_embd = 1 << 20;
  m.head_dim_override = 65536;
  m.intermediate_size = 1;
  // About 1.8e20: saturated in int64, the magnitude in double.
  EXPECT_EQ(NumParams(m), std::numeric_limits<int64_t>::max());
  EXPECT_NEAR(ApproxNumParams(m), 10000 * std::ldexp(1.0, 54), 1e17);
  // Counted in closed form: 2^31 - 1 layers take no time (workers once spun here).
  ModelConfig deep = Gpt2Small();
  deep.n_layer = std::numeric_limits<int>::max();
  const int64_t block = 12 * 768 * 768 + 13 * 768;
  const int64_t rest = 50257 * 768 + 1024 * 768 + 2 * 768;
  EXPECT_EQ(NumParams(deep), int64_t{deep.n_layer} * block + rest);
  EXPECT_EQ(NumParams(Gpt2Small()), 12 * block + rest);
}

// The one rule the engine and the planner share: a unit whose shard the
// sparse embedding trains (all-reduced whole, never reduce-scattered) keeps
// a replicated optimizer; every other unit of an HSDP job with the key and
// more than one replica keeps pieces.
TEST(ModelShapes, OptimizerPiecesSkipOnlyTheUnitsTheSparseEmbeddingTrains) {
  const ModelConfig m = Gpt2Small();
  ParallelismConfig p;
  p.strategy = Strategy::kHybridShard;
  p.shard_optimizer_across_replicas = true;
  for (int u = 0; u < NumUnits(m); ++u) EXPECT_TRUE(OptimizerInPieces(p, m, 2, 2, u)) << u;
  p.sparse_embedding = true;
  EXPECT_FALSE(OptimizerInPieces(p, m, 2, 2, 0));
  EXPECT_FALSE(OptimizerInPieces(p, m, 2, 2, HeadUnit(m)));
  EXPECT_TRUE(OptimizerInPieces(p, m, 2, 2, 1));
  EXPECT_TRUE(OptimizerInPieces(p, m, 2, 2, m.n_layer));
  // A shard group of one looks the table up whole: nothing is sparse.
  EXPECT_TRUE(OptimizerInPieces(p, m, 1, 4, 0));
  // One replica, another strategy, or the key off: no pieces.
  EXPECT_FALSE(OptimizerInPieces(p, m, 4, 1, 1));
  p.strategy = Strategy::kHybridShardZero2;
  EXPECT_FALSE(OptimizerInPieces(p, m, 2, 2, 1));
  p.strategy = Strategy::kHybridShard;
  p.shard_optimizer_across_replicas = false;
  EXPECT_FALSE(OptimizerInPieces(p, m, 2, 2, 1));
}

}  // namespace
}  // namespace shardline::model
