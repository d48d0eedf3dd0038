// VocabParallelHead over G Gloo ranks against LinearCrossEntropy in one
// process on every rank's tokens at once: the loss, dL/dh of each rank's
// tokens and the table's gradient, whose shards put together must be the
// whole table's. The shapes cut rows between shards (a row across up to
// four shards, and shards holding no whole row), ignore targets, and split
// the logits into chunks (computed again for the gradient); over the world
// (shard groups x replicas), each shard's parts cut rows too.
#include "worker/engine/vocab_parallel_head.h"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "gloo_ranks.h"
#include "worker/model/linear_cross_entropy.h"

namespace shardline {
namespace {

struct Shape {
  // wte [vocab, width], then wpe [positions, width], in one flat unit (the
  // tied table); with positions 0, a norm [width] then lm_head [vocab,
  // width] (the untied head unit, the table second).
  int64_t vocab, width, positions;
  int group;
  int64_t chunk_rows;  // 0: one chunk
  int replicas = 1;    // > 1: the head over the world of group x replicas ranks
  int table() const { return positions > 0 ? 0 : 1; }
};

constexpr int64_t kTokens = 6;  // per rank
constexpr double kScale = 1.0 / 17;

ShardLayout LayoutOf(const Shape& s) {
  auto layout = s.positions > 0 ? MakeShardLayout("embed",
                                                  {{"transformer.wte.weight", {s.vocab, s.width}, true},
                                                   {"transformer.wpe.weight", {s.positions, s.width}, true}},
                                                  s.group)
                                : MakeShardLayout("head",
                                                  {{"model.norm.weight", {s.width}, false},
                                                   {"lm_head.weight", {s.vocab, s.width}, true}},
                                                  s.group);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

class VocabParallelHeadTest : public ::testing::TestWithParam<Shape> {};

// fp32 throughout: every value is a sum of the same terms as one process's,
// in another order (logsumexp and dL/dh over the vocabulary in G parts, a
// cut row's logit in up to three, the rows' gradients over G x 6 tokens at
// once), each within a few ulp (2^-24) of the other, on sums of at most 37
// terms of size O(1): relative 1e-5 holds that with a wide margin, while a
// wrong term (a target on the wrong rank, a cut row counted twice or not at
// all, a lost scale or ignore) is off by O(1e-2) or more.
TEST_P(VocabParallelHeadTest, EqualsTheFusedLossInOneProcess) {
  const Shape s = GetParam();
  const ShardLayout layout = LayoutOf(s);
  const int g = s.group * s.replicas;  // ranks, each at its position in the head's order
  at::manual_seed(11);
  const at::Tensor flat = at::randn({layout.padded_numel}) * 0.5;
  const int64_t offset = layout.params[s.table()].offset, numel = s.vocab * s.width;
  const at::Tensor table = flat.narrow(0, offset, numel).view({s.vocab, s.width});
  const at::Tensor hidden = at::randn({g * kTokens, s.width});
  at::Tensor targets = at::randint(0, s.vocab, {g * kTokens}, at::TensorOptions().dtype(at::kLong));
  targets[1] = -100;
  targets[g * kTokens - 2] = -100;

  at::Tensor x = hidden.clone().requires_grad_(true), w = table.clone().requires_grad_(true);
  const at::Tensor want_loss = LinearCrossEntropy(x, w, targets, kScale);
  want_loss.backward();

  std::vector<VocabParallelHead::Result> got(g), evaluated(g);
  std::vector<std::vector<int>> issued(g);  // each call's `most`
  std::vector<std::vector<int64_t>> cuts(g);
  std::vector<int64_t> part_at(g);  // where each position's part lies in the flat unit
  comm::OnRankGroups(s.group, s.replicas, comm::GlooOptions{},
                     [&](int shard_rank, int replica, comm::Communicator& c, comm::Communicator& replicas) {
    const int r = shard_rank * s.replicas + replica;
    const VocabParallelHead head(layout, s.table(), shard_rank, s.replicas, replica);
    cuts[r] = head.cut_rows();
    part_at[r] = layout.ShardOffset(shard_rank) + head.part_begin();
    CommWaiter waiter(absl::Seconds(30));
    const at::Tensor part = flat.narrow(0, part_at[r], head.part_numel());
    const at::Tensor h = hidden.narrow(0, r * kTokens, kTokens), t = targets.narrow(0, r * kTokens, kTokens);
    VocabParallelHead::Want want{true, true, at::kFloat, s.chunk_rows};
    // The caller's own collectives at `issue` (the engine's prefetch): on
    // the head's communicator, between its exchanges, in the same order on
    // every rank; each gathers every rank's position, checked after.
    std::vector<std::pair<at::Tensor, std::shared_ptr<comm::Work>>> own;
    auto issue = [&](int most) {
      issued[r].push_back(most);
      const at::Tensor out = at::empty({c.size()});
      own.emplace_back(out, c.AllGather(out, at::full({1}, static_cast<float>(shard_rank))));
    };
    auto result = head.Run(c, &replicas, waiter, h, t, part, kScale, want, issue);
    ASSERT_TRUE(result.ok()) << result.status();
    for (auto& [out, work] : own) {
      ASSERT_TRUE(waiter.OnDevice(*work, comm::Op::kAllGather).ok());
      EXPECT_TRUE(at::equal(out, at::arange(c.size()).to(at::kFloat))) << "the caller's gather between the head's";
    }
    got[r] = *result;
    auto loss_only =
        head.Run(c, &replicas, waiter, h, t, part, kScale, VocabParallelHead::Want{}, issue);
    ASSERT_TRUE(loss_only.ok()) << loss_only.status();
    evaluated[r] = *loss_only;
  });

  at::Tensor loss = at::zeros({}), eval_loss = at::zeros({});
  const at::Tensor grad = at::zeros({layout.padded_numel});
  for (int r = 0; r < g; ++r) {
    SCOPED_TRACE(r);
    EXPECT_EQ(cuts[r], cuts[0]) << "every rank lists the same cut rows";
    // One collective before the statistics compute, the rest after their
    // exchange is issued; in training only.
    EXPECT_EQ(issued[r], (std::vector<int>{1, std::numeric_limits<int>::max()}));
    loss += got[r].loss;
    eval_loss += evaluated[r].loss;
    EXPECT_FALSE(evaluated[r].grad_hidden.defined());
    EXPECT_FALSE(evaluated[r].grad_table.defined());
    ASSERT_EQ(got[r].grad_hidden.sizes(), (at::IntArrayRef{kTokens, s.width}));
    EXPECT_TRUE(at::allclose(got[r].grad_hidden, x.grad().narrow(0, r * kTokens, kTokens), 1e-5, 1e-7));
    grad.narrow(0, part_at[r], got[r].grad_table.numel()).copy_(got[r].grad_table);
  }
  EXPECT_TRUE(at::allclose(loss, want_loss, 1e-5, 0)) << loss.item<float>() << " vs " << want_loss.item<float>();
  EXPECT_TRUE(at::allclose(eval_loss, want_loss, 1e-5, 0));
  EXPECT_TRUE(at::allclose(grad.narrow(0, offset, numel).view({s.vocab, s.width}), w.grad(), 1e-5, 1e-7));
  grad.narrow(0, offset, numel).zero_();
  EXPECT_EQ(grad.abs().max().item<float>(), 0) << "nothing outside the table";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, VocabParallelHeadTest,
    ::testing::Values(Shape{13, 5, 4, 3, 0},    // 85 elements, shards of 29: rows 5 and 11 cut
                      Shape{37, 16, 4, 2, 0},   // row 20 cut in half
                      Shape{37, 16, 4, 2, 5},   // the same in chunks of 5 tokens
                      Shape{13, 6, 5, 4, 0},    // row 4 cut, the last shard all wpe
                      Shape{3, 16, 1, 8, 0},    // shards of 8: every row cut in two, no whole rows anywhere
                      Shape{2, 16, 1, 8, 2},    // shards of 6: row 0 across three shards, row 1 four
                      Shape{13, 5, 0, 3, 0},    // norm then lm_head, 70 elements, shards of 24: rows 3 and 8 cut
                      Shape{37, 16, 0, 4, 7},    // norm then lm_head in chunks of 7: rows 8 and 27 cut
                      Shape{13, 5, 4, 2, 0, 2},  // over 2 x 2: parts of 22, 21, 22, 21: rows 4 and 8 cut
                      Shape{37, 16, 4, 2, 5, 3},  // over 2 x 3, in chunks: parts of 110, 110, 108
                      Shape{13, 5, 0, 2, 0, 2}));  // norm then lm_head over 2 x 2

// The cut rows are where the shards' ends fall inside the table's rows.
TEST(VocabParallelHead, CutRowsAreTheRowsAShardEndFallsInside) {
  EXPECT_EQ(VocabParallelHead(LayoutOf({13, 5, 4, 3, 0}), 0, 0).cut_rows(), (std::vector<int64_t>{5, 11}));
  EXPECT_EQ(VocabParallelHead(LayoutOf({13, 6, 5, 4, 0}), 0, 2).cut_rows(), (std::vector<int64_t>{4}));
  EXPECT_EQ(VocabParallelHead(LayoutOf({2, 12, 1, 4, 0}), 0, 1).cut_rows(), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(VocabParallelHead(LayoutOf({8, 4, 2, 2, 0}), 0, 0).cut_rows().empty());
  EXPECT_EQ(VocabParallelHead(LayoutOf({13, 5, 0, 3, 0}), 1, 0).cut_rows(), (std::vector<int64_t>{3, 8}));
}

}  // namespace
}  // namespace shardline
