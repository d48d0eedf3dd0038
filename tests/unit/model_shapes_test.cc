#include "common/model_shapes.h"

#include <gtest/gtest.h>

namespace shardline::gpt {
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

TEST(ModelShapes, TrainingFlopsPerTokenIsPalmsFormula) {
  // nanoGPT's estimate_mfu for GPT-2 124M: N excludes wpe (1024*768), then
  // 6N + 12*L*H*Q*T = 6*123653376 + 12*12*12*64*1024.
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(Gpt2Small()), 6.0 * 123653376 + 12.0 * 12 * 12 * 64 * 1024);
}

}  // namespace
}  // namespace shardline::gpt
