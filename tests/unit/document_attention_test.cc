// DocumentAttention: each packed document's causal attention alone equals
// attention over the whole sequence under the mask that keeps a query to its
// own document's earlier keys (what the engine computed before, and what
// transformers' packed-sequence mask means), forward and backward.
#include "worker/model/document_attention.h"

#include <gtest/gtest.h>

#include <cmath>

namespace shardline {
namespace {

// The reference: SDPA over [T, T] with a boolean mask of same-document and causal.
at::Tensor MaskedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& positions) {
  const int64_t T = positions.size(1);
  const at::Tensor document = positions.eq(0).cumsum(1);
  const at::Tensor same = document.unsqueeze(2).eq(document.unsqueeze(1));
  const at::Tensor causal = at::ones({T, T}, at::kBool).tril();
  return at::scaled_dot_product_attention(q, k, v, same.logical_and(causal).unsqueeze(1));
}

// Positions of sequences packed from documents of the given lengths.
at::Tensor Positions(const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<at::Tensor> rows;
  for (const auto& seq : lengths) {
    std::vector<at::Tensor> parts;
    for (int64_t n : seq) parts.push_back(at::arange(n, at::kLong));
    rows.push_back(at::cat(parts));
  }
  return at::stack(rows);
}

TEST(DocumentSpans, StartWhereAPositionIsZero) {
  const DocumentSpans d = DocumentSpans::FromPositions(Positions({{3, 5}, {8}, {1, 1, 6}}));
  ASSERT_EQ(d.spans.size(), 3u);
  EXPECT_EQ(d.spans[0], (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 5}}));
  EXPECT_EQ(d.spans[1], (std::vector<std::pair<int64_t, int64_t>>{{0, 8}}));
  EXPECT_EQ(d.spans[2], (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 1}, {2, 6}}));
}

// Each output row is a convex combination of at most T value rows (|v| of a
// few units for randn): computing the same softmax over the same keys in
// another order of fp32 sums differs by at most ~T u max|v| = 32 x 6e-8 x 5
// ~ 1e-5 at T = 32. Backward's sums are of the same length and size, times
// the incoming gradient's (also randn): 2e-5 for each. Far below what a key
// from another document would change (O(0.1) per element).
TEST(DocumentAttention, EqualsTheMaskedAttentionForwardAndBackward) {
  at::manual_seed(0);
  const at::Tensor positions = Positions({{5, 9, 2, 16}, {32}, {7, 7, 7, 11}});
  const int64_t B = 3, H = 2, T = 32, D = 8;
  auto leaf = [&] { return at::randn({B, H, T, D}).requires_grad_(true); };
  at::Tensor q = leaf(), k = leaf(), v = leaf();
  const at::Tensor dy = at::randn({B, H, T, D});
  const at::Tensor got = DocumentAttention(q, k, v, DocumentSpans::FromPositions(positions));
  got.backward(dy);
  const at::Tensor gq = q.grad().clone(), gk = k.grad().clone(), gv = v.grad().clone();
  for (auto* t : {&q, &k, &v}) t->mutable_grad().reset();
  const at::Tensor want = MaskedAttention(q, k, v, positions);
  want.backward(dy);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
  EXPECT_LE((gq - q.grad()).abs().max().item<double>(), 2e-5);
  EXPECT_LE((gk - k.grad()).abs().max().item<double>(), 2e-5);
  EXPECT_LE((gv - v.grad()).abs().max().item<double>(), 2e-5);
  // Plain causal attention over the whole sequence is not it (the test can fail).
  const at::Tensor whole = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true);
  EXPECT_GT((whole - want).abs().max().item<double>(), 1e-2);
}

TEST(DocumentAttention, AOneDocumentSequenceIsCausalAttention) {
  at::manual_seed(1);
  const at::Tensor q = at::randn({2, 2, 16, 4}), k = at::randn({2, 2, 16, 4}), v = at::randn({2, 2, 16, 4});
  const at::Tensor got = DocumentAttention(q, k, v, DocumentSpans::FromPositions(Positions({{16}, {16}})), 0.3);
  const at::Tensor want = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true, 0.3);
  EXPECT_TRUE(at::allclose(got, want, 0, 1e-6));
}

}  // namespace
}  // namespace shardline
